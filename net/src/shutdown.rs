//! A shutdown signal shared by every core: triggered once, awaited anywhere.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use event_listener::Event;

/// Cloneable, thread-safe, one-shot shutdown signal.
#[derive(Clone, Default)]
pub struct Shutdown(Arc<Inner>);

#[derive(Default)]
struct Inner {
    flag: AtomicBool,
    event: Event,
}

impl Shutdown {
    /// A signal not yet triggered.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Triggers the signal and wakes every waiter. Idempotent.
    pub fn trigger(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        self.0.event.notify(usize::MAX);
    }

    /// True once triggered.
    #[must_use]
    pub fn is_triggered(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst)
    }

    /// Resolves once the signal is triggered.
    pub async fn wait(&self) {
        loop {
            if self.is_triggered() {
                return;
            }
            let l = self.0.event.listen();
            if self.is_triggered() {
                return;
            }
            l.await;
        }
    }
}
