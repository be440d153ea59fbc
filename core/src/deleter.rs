//! The queue of acknowledged keys waiting for their batched delete.
//!
//! Keys are flushed as one storage transaction per `delivery.deleteBatchInterval`. A failed
//! flush puts its keys back in front, so nothing acknowledged is ever forgotten; while a key
//! is queued or being flushed the hub never delivers it again.

use crate::key::EventKey;

/// Most keys waiting for deletion before new ACKs and expiries are refused (an ACK refused
/// leaves the message in flight; it is redelivered after its timeout): memory stays bounded
/// while storage is down.
///
/// The delete of an ACK already accepted is never refused ([`DeleteQueue::push_accepted`]):
/// the queue can exceed this bound by the in-memory entries and parked records that hold an
/// accepted ACK, themselves bounded by the hub's entry caps and `PARKED_MAX`.
pub const DELETE_PENDING_MAX: usize = 65_536;

/// Pending deletes; at most one batch is being flushed at a time.
#[derive(Debug, Default)]
pub struct DeleteQueue {
    queued: Vec<EventKey>,
    flushing: Vec<EventKey>,
    all: crate::fast::FastSet<EventKey>,
}

/// Most keys one flush deletes (one storage transaction or replicated command of ~1.5 MiB):
/// the queue can hold more (see [`DELETE_PENDING_MAX`]).
pub const DELETE_BATCH_MAX: usize = DELETE_PENDING_MAX;

/// The queue holds [`DELETE_PENDING_MAX`] keys already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("delete queue full ({DELETE_PENDING_MAX} keys pending)")]
pub struct DeleteQueueFull;

impl DeleteQueue {
    /// Queues `key` for deletion; a key already pending is accepted once.
    ///
    /// # Errors
    /// [`DeleteQueueFull`] when the bound is reached.
    pub fn push(&mut self, key: EventKey) -> Result<(), DeleteQueueFull> {
        if self.all.contains(&key) {
            return Ok(());
        }
        if self.all.len() >= DELETE_PENDING_MAX {
            return Err(DeleteQueueFull);
        }
        self.all.insert(key);
        self.queued.push(key);
        Ok(())
    }

    /// Queues the delete of a message whose ACK was already accepted: never refused, since
    /// dropping it would bring the acked message back (see [`DELETE_PENDING_MAX`]).
    pub fn push_accepted(&mut self, key: EventKey) {
        if self.all.insert(key) {
            self.queued.push(key);
        }
    }

    /// True when `key` is queued or being flushed.
    #[must_use]
    pub fn contains(&self, key: &EventKey) -> bool {
        self.all.contains(key)
    }

    /// The keys queued or being flushed, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &EventKey> + '_ {
        self.all.iter()
    }

    /// Keys queued or being flushed.
    #[must_use]
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// True when nothing is pending.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// True while a batch is out for flushing.
    #[must_use]
    pub fn is_flushing(&self) -> bool {
        !self.flushing.is_empty()
    }

    /// Starts a flush: returns the first [`DELETE_BATCH_MAX`] keys queued, or `None` when
    /// nothing is queued or a flush is already running.
    pub fn take_batch(&mut self) -> Option<Vec<EventKey>> {
        if self.is_flushing() || self.queued.is_empty() {
            return None;
        }
        let rest = self
            .queued
            .split_off(self.queued.len().min(DELETE_BATCH_MAX));
        self.flushing = std::mem::replace(&mut self.queued, rest);
        Some(self.flushing.clone())
    }

    /// Ends the running flush. On failure its keys go back in front of the queue.
    pub fn finish_batch(&mut self, committed: bool) {
        let batch = std::mem::take(&mut self.flushing);
        if committed {
            for k in &batch {
                self.all.remove(k);
            }
        } else {
            let later = std::mem::replace(&mut self.queued, batch);
            self.queued.extend(later);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Bucket, EventId, TopicHash};

    fn k(i: u64) -> EventKey {
        EventKey::new(TopicHash(1), Bucket(1), EventId(i))
    }

    #[test]
    fn dedupes_and_flushes_once_at_a_time() {
        let mut q = DeleteQueue::default();
        q.push(k(1)).unwrap();
        q.push(k(1)).unwrap();
        q.push(k(2)).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q.take_batch(), Some(vec![k(1), k(2)]));
        assert!(q.take_batch().is_none(), "one flush at a time");
        q.push(k(3)).unwrap();
        assert!(q.contains(&k(1)) && q.contains(&k(3)));
        q.finish_batch(true);
        assert!(!q.contains(&k(1)));
        assert_eq!(q.take_batch(), Some(vec![k(3)]));
    }

    #[test]
    fn failed_flush_loses_nothing_and_keeps_order() {
        let mut q = DeleteQueue::default();
        q.push(k(1)).unwrap();
        q.push(k(2)).unwrap();
        let _ = q.take_batch();
        q.push(k(3)).unwrap();
        q.finish_batch(false);
        assert_eq!(q.take_batch(), Some(vec![k(1), k(2), k(3)]));
        q.finish_batch(true);
        assert!(q.is_empty());
    }

    #[test]
    fn bounded() {
        let mut q = DeleteQueue::default();
        for i in 0..DELETE_PENDING_MAX as u64 {
            q.push(k(i)).unwrap();
        }
        assert_eq!(q.push(k(u64::MAX)), Err(DeleteQueueFull));
        // A key already pending is still accepted.
        assert!(q.push(k(0)).is_ok());
        // An accepted ACK's delete goes past the bound; a flush takes at most a batch.
        q.push_accepted(k(u64::MAX));
        assert_eq!(q.len(), DELETE_PENDING_MAX + 1);
        let first = q.take_batch().unwrap();
        assert_eq!(first.len(), DELETE_BATCH_MAX);
        q.finish_batch(true);
        assert_eq!(q.take_batch(), Some(vec![k(u64::MAX)]));
    }
}
