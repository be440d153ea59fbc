//! The node's budget of publish bytes in service: read from clients and not yet through the
//! write core.
//!
//! Each stream may pipeline [`crate::api::PIPELINE_BYTES_MAX`], and nothing else bounded the
//! streams together: measured, 4 streams each 1,024 batches deep raised a leader's RSS ~130 MiB
//! above its followers', and glibc kept most of it after the load (docs/benchmarks.md, "a
//! node's memory with 10^7 pending"). Throughput needs far less: 8 streams × 4 batches of
//! 100 messages of 100 bytes, the bench's closed loop, is ~0.5 MB in service.
//!
//! It also bounds how long an admitted batch is in service, in line and in its commit
//! (`publish.maxQueueDelay`; the commit's own time is not subtracted): by Little's law a batch
//! admitted behind `n` others is answered after about `n / rate`, where `rate` is the
//! batches per second the write path finishes. So at most `rate × maxQueueDelay` batches are
//! in service (never fewer than [`BATCHES_IN_SERVICE_MIN`]); a batch past that is refused
//! without waiting, OVERLOADED with a retry hint (the expected wait), instead of queueing
//! (acked seconds late under overload, measured in docs/benchmarks.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

/// Batches in service the queue-delay limit always allows, whatever the measured rate (a
/// node that was idle measures none): one stream's whole pipeline
/// (`api::producer::PIPELINE_MAX`, checked there), so a burst on one stream into an idle node
/// is never shed.
pub const BATCHES_IN_SERVICE_MIN: u64 = 1024;
/// The write path's rate is measured over windows at least this long.
pub const RATE_WINDOW: Duration = Duration::from_millis(100);
/// Shortest retry hint given: below it a client would only send into the same line again.
pub const RETRY_AFTER_MIN: Duration = Duration::from_millis(10);
/// The longest retry hint is this many times `publish.maxQueueDelay` (a stalled write path
/// measures a rate near zero, which would say "wait for ever").
pub const RETRY_AFTER_MAX_FACTOR: u32 = 10;

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
    delay: QueueDelay,
}

/// The queue-delay limit's state (see the module docs), shared by every executor: counters
/// and a window that whichever executor checks first after it ends rolls.
///
/// Invariant: `in_service` counts the [`Admitted`] batches alive; `finished` counts those
/// handed to the write path and let go (not those refused or dropped before it), and only
/// grows.
struct QueueDelay {
    max: Duration,
    epoch: Instant,
    in_service: AtomicU64,
    finished: AtomicU64,
    /// The current window's start (µs since the epoch), read without the lock: a check in
    /// the middle of a window costs one load.
    window_start_us: AtomicU64,
    /// The current window; one executor at a time ends it (the others go on meanwhile).
    window: Mutex<Window>,
    /// Batches per second finished, as of the last window's end.
    rate: AtomicU64,
}

/// Where the current rate window started.
#[derive(Default)]
struct Window {
    /// µs since the epoch.
    start_us: u64,
    /// `finished` then.
    finished: u64,
}

impl QueueDelay {
    fn micros(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    /// Ends the current window if it is [`RATE_WINDOW`] old, taking its rate. The rate falls
    /// by at most half at each window's end (one window of a stalled fsync does not shed a
    /// steady load at once; a stall that lasts brings the limit down within a few windows). A
    /// window over twice that long with nothing in service saw no batch: the node was idle,
    /// and the rate is unknown again (0), not the few batches that trickled out over it.
    fn roll(&self, now: Instant) {
        let now_us = self.micros(now);
        let start = self.window_start_us.load(Ordering::Acquire);
        if u128::from(now_us.saturating_sub(start)) < RATE_WINDOW.as_micros() {
            return;
        }
        let mut w = match self.window.try_lock() {
            Ok(w) => w,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Another executor is ending this window.
            Err(TryLockError::WouldBlock) => return,
        };
        let elapsed = now_us.saturating_sub(w.start_us);
        if u128::from(elapsed) < RATE_WINDOW.as_micros() {
            return;
        }
        let finished = self.finished.load(Ordering::Acquire);
        let idle = u128::from(elapsed) > 2 * RATE_WINDOW.as_micros()
            && self.in_service.load(Ordering::Acquire) == 0;
        let per_s = if idle {
            0
        } else {
            let measured = finished
                .saturating_sub(w.finished)
                .saturating_mul(1_000_000)
                / elapsed;
            measured.max(self.rate.load(Ordering::Acquire) / 2)
        };
        self.rate.store(per_s, Ordering::Release);
        *w = Window {
            start_us: now_us,
            finished,
        };
        self.window_start_us.store(now_us, Ordering::Release);
    }

    /// `Err(expected wait)` when another batch would wait longer than `max` (see the module
    /// docs).
    fn check(&self, now: Instant) -> Result<(), Duration> {
        self.roll(now);
        let rate = self.rate.load(Ordering::Acquire);
        let limit = u64::try_from(u128::from(rate) * self.max.as_micros() / 1_000_000)
            .unwrap_or(u64::MAX)
            .max(BATCHES_IN_SERVICE_MIN);
        let n = self.in_service.load(Ordering::Acquire);
        if n < limit {
            return Ok(());
        }
        Err(self.expected_wait(n, rate))
    }

    /// How long `n` batches in service take at `rate` (`max` with no rate measured), within
    /// [`RETRY_AFTER_MIN`] or `max` (whichever is longer) and [`RETRY_AFTER_MAX_FACTOR`] ×
    /// `max`. A refused batch's wait is at least `max` anyway (that is why it was refused).
    fn expected_wait(&self, n: u64, rate: u64) -> Duration {
        let wait = n
            .saturating_mul(1_000_000)
            .checked_div(rate)
            .map_or(self.max, Duration::from_micros);
        wait.min(self.max.saturating_mul(RETRY_AFTER_MAX_FACTOR))
            .max(self.max.max(RETRY_AFTER_MIN))
    }
}

/// A batch's bytes taken from the [`Budget`]; returned when dropped.
pub struct Admitted {
    budget: Arc<Budget>,
    bytes: u64,
    /// Whether letting it go counts as a batch the write path finished: only once it was
    /// handed to it (a batch refused or dropped before says nothing of its rate).
    finished: bool,
}

impl Admitted {
    /// The batch goes to the write path now: letting it go will count it as finished.
    pub fn handed_over(&mut self) {
        self.finished = true;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let delay = &self.budget.delay;
        delay.in_service.fetch_sub(1, Ordering::AcqRel);
        if self.finished {
            delay.finished.fetch_add(1, Ordering::AcqRel);
        }
        self.budget.used().fetch_sub(self.bytes, Ordering::AcqRel);
        // Every waiter checks again; a waiter dropped meanwhile loses nothing.
        self.budget.freed.notify(usize::MAX);
    }
}

impl Budget {
    /// The node's budget of `total` bytes, counted in `metrics`, letting no admitted batch
    /// wait in line much longer than `max_queue_delay`.
    #[must_use]
    pub fn new(total: u64, max_queue_delay: Duration, metrics: Arc<Metrics>) -> Arc<Budget> {
        Arc::new(Budget {
            total,
            metrics,
            freed: event_listener::Event::new(),
            delay: QueueDelay {
                max: max_queue_delay,
                epoch: Instant::now(),
                in_service: AtomicU64::new(0),
                finished: AtomicU64::new(0),
                window_start_us: AtomicU64::new(0),
                window: Mutex::default(),
                rate: AtomicU64::new(0),
            },
        })
    }

    /// `Err(expected wait)` when a batch read at `now` would wait in line longer than
    /// `publish.maxQueueDelay`: refuse it (OVERLOADED) with that as the retry hint.
    pub fn queue_delay_check(&self, now: Instant) -> Result<(), Duration> {
        self.delay.check(now)
    }

    /// The wait the batches in service are expected to take (the retry hint of a batch that
    /// found no room in the bytes budget).
    #[must_use]
    pub fn expected_wait(&self) -> Duration {
        let d = &self.delay;
        d.expected_wait(
            d.in_service.load(Ordering::Acquire),
            d.rate.load(Ordering::Acquire),
        )
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
        self.delay.in_service.fetch_add(1, Ordering::AcqRel);
        Some(Admitted {
            budget: Arc::clone(self),
            bytes,
            finished: false,
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
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    use super::{
        Budget, BATCHES_IN_SERVICE_MIN, RATE_WINDOW, RETRY_AFTER_MAX_FACTOR, RETRY_AFTER_MIN,
    };
    use crate::metrics::Metrics;

    #[test]
    fn past_the_rate_times_the_queue_delay_a_batch_is_refused_with_the_expected_wait() {
        let max = Duration::from_millis(250);
        let budget = Budget::new(u64::MAX, max, Arc::default());
        let t0 = budget.delay.epoch;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A batch handed to the write path.
        let handed = || {
            let mut a = budget.try_admit(10).unwrap();
            a.handed_over();
            a
        };
        // No rate measured yet: the floor.
        let mut held: Vec<_> = (0..BATCHES_IN_SERVICE_MIN)
            .map(|_| {
                assert!(budget.queue_delay_check(at(1)).is_ok());
                handed()
            })
            .collect();
        assert_eq!(
            budget.queue_delay_check(at(2)),
            Err(max),
            "at the floor with no rate: refused, the hint is the delay bound"
        );
        // 1,000 batches finish in the first window (10,000/s): the limit is 2,500.
        for _ in 0..1_000 {
            drop(handed());
        }
        let w1 = u64::try_from(RATE_WINDOW.as_millis()).unwrap();
        assert!(budget.queue_delay_check(at(w1)).is_ok(), "1,024 < 2,500");
        held.extend((BATCHES_IN_SERVICE_MIN..2_500).map(|_| handed()));
        assert_eq!(
            budget.queue_delay_check(at(w1 + 1)),
            Err(Duration::from_millis(250)),
            "2,500 in service at 10,000/s: a new batch would wait 250 ms"
        );
        // The next window finishes 500 (5,000/s): the limit halves, the wait doubles.
        held.drain(..500);
        assert_eq!(
            budget.queue_delay_check(at(2 * w1)),
            Err(Duration::from_millis(400)),
            "2,000 in service at 5,000/s"
        );
        held.drain(..800);
        assert!(
            budget.queue_delay_check(at(2 * w1 + 1)).is_ok(),
            "1,200 < 1,250"
        );
        assert_eq!(BATCHES_IN_SERVICE_MIN, 1_024, "the numbers below assume it");
        assert!(
            budget.queue_delay_check(at(3 * w1)).is_ok(),
            "800 finished: 8,000/s"
        );
        // A stalled write path (2 finished in a window, 20/s): the rate falls by half per
        // window, and the hint is bounded.
        held.drain(..2);
        assert_eq!(
            budget.queue_delay_check(at(4 * w1)),
            Err(Duration::from_micros(299_500)),
            "1,198 in service at 4,000/s (half the last rate, not 20/s)"
        );
        for k in 5..8 {
            assert!(budget.queue_delay_check(at(k * w1)).is_err());
        }
        assert_eq!(budget.delay.rate.load(Ordering::Acquire), 8_000 / 16);
        assert_eq!(
            budget.queue_delay_check(at(8 * w1)),
            Err(max * RETRY_AFTER_MAX_FACTOR),
            "1,198 at 250/s: about 5 s, said as the longest hint"
        );
        // Streams waiting, no batch read for 9.2 s: the long window is measured (1,197
        // finished in it: 130/s), not taken for idleness.
        held.truncate(1);
        assert!(budget.queue_delay_check(at(10_000)).is_ok());
        assert_eq!(budget.delay.rate.load(Ordering::Acquire), 130);
        // An idle spell (nothing in service, no batch read for a minute) measures no rate:
        // the floor again, and the hint is the bound.
        held.clear();
        assert!(budget.queue_delay_check(at(70_000)).is_ok());
        assert_eq!(budget.delay.rate.load(Ordering::Acquire), 0);
        held.extend((0..BATCHES_IN_SERVICE_MIN).map(|_| budget.try_admit(10).unwrap()));
        assert_eq!(budget.queue_delay_check(at(70_001)), Err(max));
        // Batches refused or dropped before the write path say nothing of its rate.
        held.clear();
        assert!(budget.queue_delay_check(at(70_000 + w1)).is_ok());
        assert_eq!(
            budget.delay.rate.load(Ordering::Acquire),
            0,
            "none finished"
        );
        // A short bound's hint is never below the minimum.
        let short = Budget::new(u64::MAX, Duration::from_millis(1), Arc::default());
        assert_eq!(short.delay.expected_wait(1, 1_000_000), RETRY_AFTER_MIN);
        drop(held);
        assert_eq!(budget.delay.in_service.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_batch_enters_only_below_the_total_and_a_waiter_enters_when_bytes_return() {
        let metrics = Arc::new(Metrics::default());
        let budget = Budget::new(100, Duration::from_millis(250), Arc::clone(&metrics));
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
