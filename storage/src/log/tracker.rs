//! The leader-persist tracker behind the LEADER ack level.
//!
//! A publisher registers a waiter under the hash of its command before proposing it; after
//! every successful fsync the log notifies the hash of each persisted entry, which wakes all
//! waiters of that hash. Hashes are 64-bit with a per-process seed, so a client cannot aim
//! for collisions; two in-flight commands never share bytes because they carry distinct event
//! ids. A failed fsync notifies nothing.
//!
//! Single-threaded: it lives on the Raft core with the log.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures::channel::oneshot;

#[derive(Default)]
struct Inner {
    waiters: HashMap<u64, Vec<(u64, oneshot::Sender<()>)>>,
    next_id: u64,
}

/// Waiters keyed by command hash.
#[derive(Clone)]
pub struct PersistTracker {
    seed: u64,
    inner: Rc<RefCell<Inner>>,
}

impl PersistTracker {
    /// A tracker with a per-process random seed.
    #[must_use]
    pub fn new() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let seed =
            xxhash_rust::xxh64::xxh64(&t.as_nanos().to_le_bytes(), u64::from(std::process::id()));
        Self::with_seed(seed)
    }

    /// A tracker with a fixed seed (tests).
    #[must_use]
    pub fn with_seed(seed: u64) -> Self {
        PersistTracker {
            seed,
            inner: Rc::default(),
        }
    }

    /// The hash of a command.
    #[must_use]
    pub fn hash(&self, command: &[u8]) -> u64 {
        xxhash_rust::xxh64::xxh64(command, self.seed)
    }

    /// Registers a waiter for `command`; it resolves once an entry with the same bytes was
    /// fsynced. Dropping it cancels the registration (and only it).
    #[must_use]
    pub fn register(&self, command: &[u8]) -> PersistWaiter {
        let hash = self.hash(command);
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.borrow_mut();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.waiters.entry(hash).or_default().push((id, tx));
        PersistWaiter {
            tracker: self.clone(),
            hash,
            id,
            rx,
        }
    }

    /// Wakes every waiter of `command`'s hash (no-op without waiters).
    pub fn notify(&self, command: &[u8]) {
        let hash = self.hash(command);
        let woken = self.inner.borrow_mut().waiters.remove(&hash);
        for (_, tx) in woken.into_iter().flatten() {
            let _ = tx.send(());
        }
    }

    /// Registered waiters (for tests and metrics).
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.inner.borrow().waiters.values().map(Vec::len).sum()
    }
}

impl Default for PersistTracker {
    fn default() -> Self {
        Self::new()
    }
}

/// Resolves when the registered command was persisted.
pub struct PersistWaiter {
    tracker: PersistTracker,
    hash: u64,
    id: u64,
    rx: oneshot::Receiver<()>,
}

impl Future for PersistWaiter {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            // The sender is only dropped after sending or by cancel (which drops us first).
            Poll::Ready(Err(_)) | Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for PersistWaiter {
    fn drop(&mut self) {
        let mut inner = self.tracker.inner.borrow_mut();
        if let Some(list) = inner.waiters.get_mut(&self.hash) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                inner.waiters.remove(&self.hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn notify_wakes_every_waiter_of_the_hash_only() {
        let t = PersistTracker::with_seed(7);
        let mut a1 = t.register(b"cmd-a");
        let mut a2 = t.register(b"cmd-a");
        let mut b = t.register(b"cmd-b");
        assert!((&mut a1).now_or_never().is_none());
        t.notify(b"cmd-a");
        assert!((&mut a1).now_or_never().is_some());
        assert!((&mut a2).now_or_never().is_some());
        assert!((&mut b).now_or_never().is_none());
        assert_eq!(t.waiting(), 1);
        t.notify(b"nobody-waits");
        assert_eq!(t.waiting(), 1);
    }

    #[test]
    fn dropping_a_waiter_cancels_only_it() {
        let t = PersistTracker::with_seed(7);
        let a1 = t.register(b"x");
        let mut a2 = t.register(b"x");
        drop(a1);
        assert_eq!(t.waiting(), 1);
        t.notify(b"x");
        assert!((&mut a2).now_or_never().is_some());
        drop(a2);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn seeds_change_hashes() {
        assert_ne!(
            PersistTracker::with_seed(1).hash(b"x"),
            PersistTracker::with_seed(2).hash(b"x")
        );
    }
}
