//! When an apply commits the store durably.
//!
//! Applies commit redb without fsync; redb writes those transactions' pages only at a durable
//! commit (holding them in its cache, within its size, until then), and the log keeps their
//! entries (a crash replays them) until that commit has written the pages and fsynced. That commit's writes and fsync share the disk with the log's group commits:
//! the log flushes that meet it wait behind it. Frequent durable commits put many short waits
//! into the 99th percentile of acknowledgement latency, rare ones put fewer, longer waits
//! further out. Measured at 68f5810, standalone, QUORUM at 1 message/request, 8 streams × 4,
//! 5 s runs, 4 alternating rounds (`futureq-bench publish --batch 1 --streams 8 --window 4`):
//! every 1 s p99 1.69–2.51 ms, p99.9 5.8–10.0 ms; every 50 ms p99 2.26–2.95 ms, p99.9
//! 3.5–13.9 ms; the write-ahead-log build before the one write path (2681a0d, checkpoints
//! every 250 ms) p99 1.57–3.05 ms, p99.9 7.7–9.5 ms. The byte bound keeps the replay after a crash,
//! the file's growth (pages freed since the last durable commit are not reused before the
//! next) and the size of one durable commit bounded under heavy load.

use std::time::{Duration, Instant};

/// Longest time between the journal's durable commits while applies come (it also commits
/// once when it goes idle with volatile applies). The Raft state machine uses its own, shorter
/// interval with the same [`DurableApplies`].
pub const JOURNAL_DURABLE_APPLY_INTERVAL: Duration = Duration::from_secs(1);
/// Most bytes of log entries applied without a durable commit: the next apply is durable.
pub const DURABLE_APPLY_BYTES: usize = 32 << 20;

/// Tracks the applies since the last durable commit.
///
/// An apply is durable when `interval` has passed since the last durable commit, or when
/// [`DURABLE_APPLY_BYTES`] of entries were applied since (the overshoot is at most one apply
/// transaction).
#[derive(Debug, Clone, Copy)]
pub struct DurableApplies {
    interval: Duration,
    last: Instant,
    volatile_bytes: usize,
}

impl DurableApplies {
    /// Nothing volatile yet; the first durable commit is due `interval` from now.
    #[must_use]
    pub fn new(interval: Duration) -> Self {
        DurableApplies {
            interval,
            last: Instant::now(),
            volatile_bytes: 0,
        }
    }

    /// Whether the next apply commits durably.
    #[must_use]
    pub fn due(&self) -> bool {
        self.last.elapsed() >= self.interval || self.volatile_bytes >= DURABLE_APPLY_BYTES
    }

    /// Whether something was applied since the last durable commit.
    #[must_use]
    pub fn volatile(&self) -> bool {
        self.volatile_bytes > 0
    }

    /// Time until the interval runs out (zero when it has).
    #[must_use]
    pub fn until_due(&self) -> Duration {
        self.interval.saturating_sub(self.last.elapsed())
    }

    /// An apply of `bytes` of entries committed, durably or not.
    pub fn applied(&mut self, bytes: usize, durable: bool) {
        if durable {
            self.made_durable();
        } else {
            self.volatile_bytes = self.volatile_bytes.saturating_add(bytes);
        }
    }

    /// A durable commit made everything applied so far durable.
    pub fn made_durable(&mut self) {
        self.last = Instant::now();
        self.volatile_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_after_the_interval_or_the_byte_bound() {
        let mut d = DurableApplies::new(Duration::from_secs(3600));
        assert!(!d.due() && !d.volatile());
        d.applied(DURABLE_APPLY_BYTES - 1, false);
        assert!(!d.due() && d.volatile());
        d.applied(1, false);
        assert!(d.due(), "the byte bound");
        d.applied(10, true);
        assert!(!d.due() && !d.volatile());

        let mut d = DurableApplies::new(Duration::ZERO);
        assert!(d.due(), "the interval");
        assert_eq!(d.until_due(), Duration::ZERO);
        d.applied(1, false);
        d.made_durable();
        assert!(!d.volatile());
    }
}
