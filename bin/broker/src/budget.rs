//! The node's budget of publish bytes in service: read from clients and not yet through the
//! write core.
//!
//! Each stream may pipeline [`crate::api::PIPELINE_BYTES_MAX`], and nothing else bounded the
//! streams together: measured, 4 streams each 1,024 batches deep raised a leader's RSS ~130 MiB
//! above its followers', and glibc kept most of it after the load (docs/benchmarks.md, "a
//! node's memory with 10^7 pending"). Throughput needs far less: 8 streams × 4 batches of
//! 100 messages of 100 bytes, the bench's closed loop, is ~0.5 MB in service.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::metrics::Metrics;

/// Most publish bytes in service on one node (encoded batch sizes; the decoded batches take
/// a few times that in memory). A soft limit: a batch enters while less is in service, so the
/// bound is this plus one batch (`api.grpc.maxReceiveMessageSize`). Not counted: the one
/// batch each waiting stream has read and holds until it enters.
pub const IN_SERVICE_BYTES_MAX: u64 = 16 << 20;

/// The budget, shared by every executor of the node. A stream takes a batch's bytes before
/// serving it; they go back when the write core no longer holds the batch's items (its log
/// entry done, or the batch dropped), whether or not the client still reads acks, so a client that stops reading
/// cannot hold the budget of others. Admission is not first-come-first-served: a fresh batch
/// may enter ahead of a waiting one.
///
/// Invariant: a batch is admitted only while fewer than [`IN_SERVICE_BYTES_MAX`] bytes are in
/// service; the count is `Metrics::publish_bytes_in_service` (the exported gauge).
pub struct Budget {
    total: u64,
    metrics: Arc<Metrics>,
    freed: event_listener::Event,
}

/// A batch's bytes taken from the [`Budget`]; returned when dropped.
pub struct Admitted {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.budget.used().fetch_sub(self.bytes, Ordering::AcqRel);
        // Every waiter checks again; a waiter dropped meanwhile loses nothing.
        self.budget.freed.notify(usize::MAX);
    }
}

impl Budget {
    /// The node's budget of `total` bytes, counted in `metrics`.
    #[must_use]
    pub fn new(total: u64, metrics: Arc<Metrics>) -> Arc<Budget> {
        Arc::new(Budget {
            total,
            metrics,
            freed: event_listener::Event::new(),
        })
    }

    fn used(&self) -> &std::sync::atomic::AtomicU64 {
        self.metrics.publish_bytes_in_service.inner()
    }

    /// Takes `bytes` now, if less than the total is in service.
    pub fn try_admit(self: &Arc<Self>, bytes: usize) -> Option<Admitted> {
        let bytes = bytes as u64;
        self.used()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < self.total).then_some(u.saturating_add(bytes))
            })
            .ok()?;
        Some(Admitted {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// Waits until `bytes` can be taken (cancel-safe: a dropped wait holds nothing).
    pub async fn admit(self: &Arc<Self>, bytes: usize) -> Admitted {
        loop {
            if let Some(a) = self.try_admit(bytes) {
                return a;
            }
            let freed = self.freed.listen();
            if let Some(a) = self.try_admit(bytes) {
                return a;
            }
            freed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Budget;
    use crate::metrics::Metrics;

    #[test]
    fn a_batch_enters_only_below_the_total_and_a_waiter_enters_when_bytes_return() {
        let metrics = Arc::new(Metrics::default());
        let budget = Budget::new(100, Arc::clone(&metrics));
        let in_service = || metrics.publish_bytes_in_service.get();
        let a = budget.try_admit(60).expect("below the total");
        // Soft: one batch may go past the total, none after it.
        let b = budget.try_admit(60).expect("60 < 100 in service");
        assert_eq!(in_service(), 120);
        assert!(
            budget.try_admit(1).is_none(),
            "nothing enters at or past the total"
        );
        futures::executor::block_on(async {
            let waiting = budget.admit(10);
            futures::pin_mut!(waiting);
            assert!(futures::poll!(waiting.as_mut()).is_pending());
            drop(a);
            let futures::task::Poll::Ready(c) = futures::poll!(waiting.as_mut()) else {
                panic!("returned bytes wake the waiter");
            };
            assert_eq!(in_service(), 70);
            // A dropped wait holds nothing, and the next waiter is still woken.
            let d = budget.try_admit(40).expect("70 < 100");
            let mut dropped = Box::pin(budget.admit(5));
            assert!(futures::poll!(dropped.as_mut()).is_pending());
            let kept = budget.admit(5);
            futures::pin_mut!(kept);
            assert!(futures::poll!(kept.as_mut()).is_pending());
            drop(d);
            drop(dropped);
            let futures::task::Poll::Ready(e) = futures::poll!(kept.as_mut()) else {
                panic!("a dropped waiter does not take the wake-up with it");
            };
            assert_eq!(in_service(), 75);
            drop((b, c, e));
        });
        assert_eq!(in_service(), 0);
        // A batch larger than the total enters an empty budget, alone.
        let big = budget
            .try_admit(1_000)
            .expect("an empty budget admits any batch");
        assert!(budget.try_admit(1).is_none());
        drop(big);
        assert!(budget.try_admit(1).is_some());
    }
}
