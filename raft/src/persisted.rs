//! The leader-persist tracker behind the LEADER ack level.
//!
//! A publisher registers a waiter under the [`PersistKey`] of its store command (the term it
//! proposes in and the batch's first event id) before proposing it; after every successful
//! fsync the log's persist hook hands each persisted entry to [`PersistTracker::persisted`],
//! which reads the key at fixed offsets (no decode, no hash of the entry) and wakes the
//! waiters of that key. A failed fsync notifies nothing.
//!
//! # Invariants
//! - A key names one proposal: only the leader of a term writes entries of that term, and a
//!   leader's ids ascend for the life of its process (`Ids` in the broker), so within a
//!   process no two store entries of one term share a first event id. A waiter registered
//!   under a term its entry did not get (leadership moved in between) is never woken; the
//!   write then answers at commit, as for QUORUM.
//!
//! Single-threaded: it lives on the Raft core with the log.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures::channel::oneshot;

/// What a LEADER-ack waiter waits for: the store entry of `term` whose first event id is
/// `first_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PersistKey {
    /// The term the entry is proposed in.
    pub term: u64,
    /// The batch's first event id.
    pub first_id: u64,
}

#[derive(Default)]
struct Inner {
    waiters: HashMap<PersistKey, Vec<(u64, oneshot::Sender<()>)>>,
    next_id: u64,
}

/// Waiters keyed by [`PersistKey`].
#[derive(Clone, Default)]
pub struct PersistTracker {
    inner: Rc<RefCell<Inner>>,
}

impl PersistTracker {
    /// Registers a waiter for `key`; it resolves once an entry with that key was fsynced.
    /// Dropping it cancels the registration (and only it).
    #[must_use]
    pub fn register(&self, key: PersistKey) -> PersistWaiter {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.borrow_mut();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.waiters.entry(key).or_default().push((id, tx));
        PersistWaiter {
            tracker: self.clone(),
            key,
            id,
            rx,
        }
    }

    /// Wakes every waiter of `key` (no-op without waiters).
    pub fn notify(&self, key: PersistKey) {
        let woken = self.inner.borrow_mut().waiters.remove(&key);
        for (_, tx) in woken.into_iter().flatten() {
            let _ = tx.send(());
        }
    }

    /// The persist hook's half: `entry` is an encoded log entry ([`crate::codec`]) that was
    /// just fsynced. Cheap for every entry: returns at once without waiters, and reads only
    /// fixed offsets otherwise.
    pub fn persisted(&self, entry: &[u8]) {
        if self.inner.borrow().waiters.is_empty() {
            return;
        }
        if let Some((term, command)) = crate::codec::normal_entry_command(entry) {
            if let Some(first_id) = futureq_core::command::first_event_id(command) {
                self.notify(PersistKey { term, first_id });
            }
        }
    }

    /// Registered waiters (for tests and metrics).
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.inner.borrow().waiters.values().map(Vec::len).sum()
    }
}

/// Resolves when the registered entry was persisted.
pub struct PersistWaiter {
    tracker: PersistTracker,
    key: PersistKey,
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
        if let Some(list) = inner.waiters.get_mut(&self.key) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                inner.waiters.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode_entry;
    use crate::types::{Command, Entry, LeaderId};
    use futureq_core::command::{encode_delete, encode_store, DeleteBatch, StoreBatch, StoreItem};
    use futures::FutureExt;
    use openraft::{EntryPayload, LogId};

    fn key(term: u64, first_id: u64) -> PersistKey {
        PersistKey { term, first_id }
    }

    fn entry(term: u64, command: Vec<u8>) -> Vec<u8> {
        encode_entry(&Entry {
            log_id: LogId {
                leader_id: LeaderId { term, node_id: 1 },
                index: 9,
            },
            payload: EntryPayload::Normal(Command(command.into())),
        })
    }

    fn store(first_id: u64) -> Vec<u8> {
        let item = |event_id| StoreItem {
            event_id,
            bucket: 3,
            topic_hash: 4,
            expires_at_ms: 0,
            index_keys: vec![],
            message: b"m".to_vec(),
        };
        encode_store(&StoreBatch {
            items: vec![item(first_id), item(first_id + 1)],
        })
    }

    #[test]
    fn notify_wakes_every_waiter_of_the_key_only() {
        let t = PersistTracker::default();
        let mut a1 = t.register(key(2, 10));
        let mut a2 = t.register(key(2, 10));
        let mut b = t.register(key(2, 12));
        assert!((&mut a1).now_or_never().is_none());
        t.notify(key(2, 10));
        assert!((&mut a1).now_or_never().is_some());
        assert!((&mut a2).now_or_never().is_some());
        assert!((&mut b).now_or_never().is_none());
        assert_eq!(t.waiting(), 1);
        t.notify(key(3, 99));
        assert_eq!(t.waiting(), 1);
    }

    #[test]
    fn dropping_a_waiter_cancels_only_it() {
        let t = PersistTracker::default();
        let a1 = t.register(key(1, 5));
        let mut a2 = t.register(key(1, 5));
        drop(a1);
        assert_eq!(t.waiting(), 1);
        t.notify(key(1, 5));
        assert!((&mut a2).now_or_never().is_some());
        drop(a2);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn a_persisted_entry_wakes_the_waiter_of_its_term_and_first_id() {
        let t = PersistTracker::default();
        let mut mine = t.register(key(4, 100));
        let mut same_id_older_term = t.register(key(3, 100));
        let mut later_batch = t.register(key(4, 102));
        // Other entries: a delete, the same ids under another term, a later id in the batch.
        t.persisted(&entry(
            4,
            encode_delete(&DeleteBatch {
                keys: vec![[1; 24]],
            }),
        ));
        t.persisted(&entry(5, store(100)));
        t.persisted(&entry(4, store(101)));
        assert!((&mut mine).now_or_never().is_none());
        t.persisted(&entry(4, store(100)));
        assert!((&mut mine).now_or_never().is_some());
        assert!((&mut same_id_older_term).now_or_never().is_none());
        assert!((&mut later_batch).now_or_never().is_none());
        // Damaged bytes (cut, or a bit flipped anywhere) do not panic, and an entry nobody
        // waits for wakes nobody.
        let e = entry(4, store(200));
        for cut in 0..e.len() {
            t.persisted(&e[..cut]);
        }
        for at in 0..e.len() {
            for bit in 0..8 {
                let mut d = e.clone();
                d[at] ^= 1 << bit;
                t.persisted(&d);
            }
        }
        assert_eq!(t.waiting(), 2);
    }
}
