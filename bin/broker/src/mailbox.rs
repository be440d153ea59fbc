//! Queues that one executor serves (the write core's requests, the dispatcher's hub commands),
//! counting what other threads put in them: each such message may wake the serving executor
//! from another thread, one of the per-message costs of the thread-per-core design
//! (`futureq_cross_core_messages_total`, issue 29).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

thread_local! {
    /// This thread's executor (its index in `runtime.cores`), once `core_main` set it.
    static CORE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Marks the current thread as executor `core`'s (its index in `runtime.cores`).
pub fn set_current_core(core: usize) {
    CORE.with(|c| c.set(Some(core)));
}

/// The current thread's executor (`None`: a thread of no executor).
#[must_use]
pub fn current_core() -> Option<usize> {
    CORE.with(Cell::get)
}

/// The sending half of a queue that executor `home` serves.
///
/// Invariant: `crossed` counts the messages this queue took from a thread other than
/// `home`'s executor (another executor, or a thread of no executor: the blocking pool, the
/// store's threads).
#[derive(Debug)]
pub struct Mailbox<T> {
    tx: flume::Sender<T>,
    home: usize,
    crossed: Arc<AtomicU64>,
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Mailbox {
            tx: self.tx.clone(),
            home: self.home,
            crossed: Arc::clone(&self.crossed),
        }
    }
}

impl<T> Mailbox<T> {
    /// A queue of at most `capacity` messages that executor `home` serves, counting the
    /// messages sent from other threads in `crossed`.
    #[must_use]
    pub fn bounded(
        capacity: usize,
        home: usize,
        crossed: Arc<AtomicU64>,
    ) -> (Mailbox<T>, flume::Receiver<T>) {
        let (tx, rx) = flume::bounded(capacity);
        (Mailbox { tx, home, crossed }, rx)
    }

    fn count(&self) {
        if current_core() != Some(self.home) {
            self.crossed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sends `msg`, waiting for room.
    ///
    /// # Errors
    /// The serving side is gone (the message comes back).
    pub async fn send_async(&self, msg: T) -> Result<(), flume::SendError<T>> {
        self.tx.send_async(msg).await?;
        self.count();
        Ok(())
    }

    /// Sends `msg` if there is room now.
    ///
    /// # Errors
    /// The queue is full, or the serving side is gone (the message comes back).
    pub fn try_send(&self, msg: T) -> Result<(), flume::TrySendError<T>> {
        self.tx.try_send(msg)?;
        self.count();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::{set_current_core, Mailbox};

    #[test]
    fn only_messages_from_other_threads_than_the_home_executors_are_counted() {
        let crossed = Arc::new(AtomicU64::new(0));
        let (mb, rx) = Mailbox::<u8>::bounded(8, 1, Arc::clone(&crossed));
        // A thread of no executor (as the blocking pool's).
        mb.try_send(0).unwrap();
        let other = mb.clone();
        std::thread::spawn(move || {
            set_current_core(0);
            other.try_send(1).unwrap();
        })
        .join()
        .unwrap();
        let home = mb.clone();
        std::thread::spawn(move || {
            set_current_core(1);
            home.try_send(2).unwrap();
            futures::executor::block_on(home.send_async(3)).unwrap();
        })
        .join()
        .unwrap();
        assert_eq!(
            crossed.load(Ordering::Relaxed),
            2,
            "0 and 1 crossed; 2 and 3 stayed"
        );
        assert_eq!(rx.drain().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        drop(rx);
        assert!(mb.try_send(4).is_err(), "nobody serves it");
        assert_eq!(
            crossed.load(Ordering::Relaxed),
            2,
            "a message not taken is not counted"
        );
    }
}
