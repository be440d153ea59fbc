//! The data disk's free space and the floor below which publishes are refused
//! (`storage.minFreeBytes`).
//!
//! A thread of its own reads the free space of every data directory (`statvfs`, never on a
//! reactor) every [`CHECK_INTERVAL`]. While the smallest is below the floor, publishes are
//! refused RESOURCE_EXHAUSTED (nothing stored) and everything else goes on: deliveries, ACKs
//! (deletes), Cancel, Reschedule, dead letters, stats and cluster traffic use the room the
//! floor keeps. Publishes are taken again by themselves once the space is back above the
//! floor. Each transition is logged, and `futureq_disk_free_bytes` / `futureq_disk_low` show
//! the state.
//!
//! # Invariants
//! - Only publishes are refused for the disk: a write that frees space (a delete) or that the
//!   cluster needs (replication, snapshots) never is.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futureq_net::Shutdown;

/// How often the free space is read.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// The disk's state as every core reads it.
#[derive(Debug)]
pub struct DiskSpace {
    min_free: u64,
    free: AtomicU64,
    low: AtomicBool,
}

impl DiskSpace {
    /// Nothing read yet: taken as room enough.
    #[must_use]
    pub fn new(min_free: u64) -> Self {
        DiskSpace {
            min_free,
            free: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
        }
    }

    /// Whether publishes are refused for the disk.
    #[must_use]
    pub fn low(&self) -> bool {
        self.low.load(Ordering::Acquire)
    }

    /// The free bytes of the fullest data directory, as last read (`u64::MAX` before).
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// `storage.minFreeBytes`.
    #[must_use]
    pub fn min_free(&self) -> u64 {
        self.min_free
    }

    /// Takes a reading; whether it changed `low` (then it is logged).
    fn update(&self, free: u64) -> bool {
        self.free.store(free, Ordering::Relaxed);
        let low = free < self.min_free;
        self.low.swap(low, Ordering::AcqRel) != low
    }

    /// The refusal a publish gets while the disk is low.
    #[must_use]
    pub fn refusal(&self) -> String {
        format!(
            "the data disk has {} bytes free, below storage.minFreeBytes ({} bytes): publishes are refused until space returns (nothing of this batch was stored; deliveries, ACKs and cancels go on)",
            self.free_bytes(),
            self.min_free
        )
    }
}

/// The free bytes of the file system holding `dir` (for an unprivileged process).
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    // A directory not created yet (the Raft data directory before the groups start) will be
    // on its nearest existing ancestor's file system.
    let here = std::path::Path::new(".");
    for at in dir.ancestors() {
        let at = if at.as_os_str().is_empty() { here } else { at };
        match rustix::fs::statvfs(at) {
            Ok(s) => return Ok(s.f_bavail.saturating_mul(s.f_frsize)),
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(std::io::ErrorKind::NotFound.into())
}

/// Reads the free space of `dirs` until `shutdown`, on a thread of its own.
///
/// # Errors
/// The thread could not be started.
pub fn watch(
    space: Arc<DiskSpace>,
    dirs: Vec<PathBuf>,
    shutdown: Shutdown,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("futureq-disk".into())
        .spawn(move || {
            let mut failed_logged = false;
            while !shutdown.is_triggered() {
                let mut free = u64::MAX;
                for d in &dirs {
                    match free_bytes(d) {
                        Ok(f) => free = free.min(f),
                        Err(e) if !failed_logged => {
                            failed_logged = true;
                            tracing::warn!(target: "storage", dir = %d.display(), error = %e, "cannot read the data disk's free space");
                        }
                        Err(_) => {}
                    }
                }
                if free != u64::MAX && space.update(free) {
                    if space.low() {
                        tracing::warn!(target: "storage", free_bytes = free, min_free_bytes = space.min_free, "the data disk is below storage.minFreeBytes: refusing publishes (deliveries, ACKs and cancels go on)");
                    } else {
                        tracing::info!(target: "storage", free_bytes = free, min_free_bytes = space.min_free, "the data disk has room again: taking publishes");
                    }
                }
                std::thread::sleep(CHECK_INTERVAL);
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_switches_both_ways_and_reports_transitions_once() {
        let d = DiskSpace::new(100);
        assert!(!d.low(), "nothing read yet");
        assert!(!d.update(500));
        assert!(d.update(99), "below the floor");
        assert!(d.low());
        assert!(!d.update(50), "still low: no second transition");
        assert!(d.refusal().contains("50 bytes free"));
        assert!(d.update(100), "at the floor: room again");
        assert!(!d.low());
    }

    #[test]
    fn free_space_is_read_from_the_file_system() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        // Not created yet (was a warning at every cluster start): its file system's.
        assert!(free_bytes(&dir.path().join("missing").join("too")).unwrap() > 0);
        assert!(free_bytes(std::path::Path::new("relative-and-missing")).unwrap() > 0);
    }
}
