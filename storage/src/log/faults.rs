//! Disk faults injected under the log, in a running process (the nemesis run's disk class).
//!
//! [`FaultyIo`] wraps any [`LogIo`]. Writing a fault's name into its trigger file (`fsync`,
//! `enospc`, `prealloc`, `torn`, `slow <ms>` or `block <ms>`) arms that fault once, for the
//! log's segment files (`*.log`; not the durable mark or the vote files): the next `sync` fails
//! (over files whose writes are durable, the next write: its `O_DSYNC` flush fails), the next
//! write fails with ENOSPC, the next segment's creation (its preallocation) fails with ENOSPC,
//! the next write persists only its later blocks (an O_DIRECT multi-block write torn by a
//! power loss) and the process then dies at once (the crash hook), the next write takes
//! `<ms>` longer (a stalled disk; only where a timer was given, [`FaultyIo::with_sleep`]), or
//! the next write holds its thread for `<ms>` first (a blocking call on a reactor: every task
//! of that executor stalls).
//! The broker uses it only when built with the `fault-injection` feature.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use super::format::BLOCK;
use super::io::LogIo;

/// A fault [`FaultyIo`] can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFault {
    /// The next `sync` fails (EIO).
    FailSync,
    /// The next write fails with ENOSPC.
    NoSpace,
    /// The next open (a new segment's creation and preallocation) fails with ENOSPC.
    NoSpaceToPreallocate,
    /// The next write persists only its later blocks (its first block keeps the old bytes; of
    /// a one-block write only the first half is new), then the crash hook runs. Like a power
    /// loss during an O_DIRECT write: each part holds either the old or the new bytes.
    TornWrite,
    /// The next write completes this much later (a stalled disk).
    SlowWrite(Duration),
    /// The next write first holds its thread this long (a blocking call on a reactor, as a
    /// page fault or a buffered file operation would: every task of that executor stalls).
    BlockingWrite(Duration),
}

impl DiskFault {
    /// A [`DiskFault::SlowWrite`] of any length, in a list of the faults an operation takes.
    const SLOW: DiskFault = DiskFault::SlowWrite(Duration::ZERO);
    /// A [`DiskFault::BlockingWrite`] of any length.
    const BLOCKING: DiskFault = DiskFault::BlockingWrite(Duration::ZERO);

    /// The trigger file's word for it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DiskFault::FailSync => "fsync",
            DiskFault::NoSpace => "enospc",
            DiskFault::NoSpaceToPreallocate => "prealloc",
            DiskFault::TornWrite => "torn",
            DiskFault::SlowWrite(_) => "slow",
            DiskFault::BlockingWrite(_) => "block",
        }
    }

    fn parse(s: &str) -> Option<DiskFault> {
        let ms = |rest: &str| rest.trim().parse().ok().map(Duration::from_millis);
        if let Some(rest) = s.trim().strip_prefix("slow ") {
            return ms(rest).map(DiskFault::SlowWrite);
        }
        if let Some(rest) = s.trim().strip_prefix("block ") {
            return ms(rest).map(DiskFault::BlockingWrite);
        }
        [
            DiskFault::FailSync,
            DiskFault::NoSpace,
            DiskFault::NoSpaceToPreallocate,
            DiskFault::TornWrite,
        ]
        .into_iter()
        .find(|f| f.name() == s.trim())
    }
}

/// Name of the trigger file: in the Raft data directory (both Raft logs), in
/// `storage.dataDir` (the standalone journal).
pub const TRIGGER_FILE: &str = "inject-disk-fault";

/// The io_uring files of the log in `dir` under the fault seam, armed by [`TRIGGER_FILE`] in
/// the parent directory of `dir` (every log there) or in `dir` itself (this log only); a torn
/// write aborts the process (a crash).
#[cfg(feature = "glommio")]
#[must_use]
pub fn dma_in_dir(dir: &std::path::Path) -> FaultyIo<super::uring::DmaLogIo> {
    let trigger = dir.parent().unwrap_or(dir).join(TRIGGER_FILE);
    let io = super::uring::DmaLogIo::in_dir(dir.to_path_buf());
    FaultyIo::new(io, trigger, || std::process::abort())
        .with_trigger(dir.join(TRIGGER_FILE))
        .with_sleep(|d| Box::pin(glommio::timer::sleep(d)))
}

/// A timer: a future done after the duration.
pub type Sleep = fn(Duration) -> Pin<Box<dyn Future<Output = ()>>>;

/// A [`LogIo`] that injects the fault named in its trigger file (see the module docs).
pub struct FaultyIo<I> {
    inner: I,
    /// Trigger files, each looked at in turn.
    triggers: Vec<PathBuf>,
    crash: fn(),
    /// The timer of [`DiskFault::SlowWrite`] (none: that fault is never taken).
    sleep: Option<Sleep>,
}

impl<I: LogIo> FaultyIo<I> {
    /// Wraps `inner`; `crash` ends the process after a torn write (`std::process::abort`).
    pub fn new(inner: I, trigger: PathBuf, crash: fn()) -> Self {
        FaultyIo {
            inner,
            triggers: vec![trigger],
            crash,
            sleep: None,
        }
    }

    /// The timer a slow write waits on; without one, `slow` is not armed.
    #[must_use]
    pub fn with_sleep(mut self, sleep: Sleep) -> Self {
        self.sleep = Some(sleep);
        self
    }

    /// One more trigger file that arms a fault.
    #[must_use]
    pub fn with_trigger(mut self, trigger: PathBuf) -> Self {
        self.triggers.push(trigger);
        self
    }

    /// The armed fault for an operation on `name`, if the trigger file names one of the kinds
    /// in `want` (compared by name: a slow write of any length is one kind); it is consumed:
    /// one shot.
    fn take(&self, name: &str, want: &[DiskFault]) -> Option<DiskFault> {
        if !name.ends_with(".log") {
            return None;
        }
        self.triggers.iter().find_map(|trigger| {
            let word = std::fs::read_to_string(trigger).ok()?;
            let fault =
                DiskFault::parse(&word).filter(|f| want.iter().any(|w| w.name() == f.name()))?;
            std::fs::remove_file(trigger).ok()?;
            tracing::error!(target: "storage.log", fault = fault.name(), "injecting a disk fault");
            Some(fault)
        })
    }
}

impl<I: LogIo> LogIo for FaultyIo<I> {
    async fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list().await
    }

    async fn open(&self, name: &str, len: u64) -> io::Result<()> {
        if self
            .take(name, &[DiskFault::NoSpaceToPreallocate])
            .is_some()
        {
            return Err(io::Error::from_raw_os_error(28));
        }
        self.inner.open(name, len).await
    }

    async fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name).await
    }

    async fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.inner.read_at(name, offset, len).await
    }

    async fn write_at(&self, name: &str, offset: u64, mut data: Vec<u8>) -> io::Result<()> {
        let mut faults = vec![
            DiskFault::NoSpace,
            DiskFault::TornWrite,
            DiskFault::BLOCKING,
        ];
        if self.inner.durable_writes() {
            faults.push(DiskFault::FailSync);
        }
        if self.sleep.is_some() {
            faults.push(DiskFault::SLOW);
        }
        match self.take(name, &faults) {
            None => self.inner.write_at(name, offset, data).await,
            Some(DiskFault::SlowWrite(d)) => {
                if let Some(sleep) = self.sleep {
                    sleep(d).await;
                }
                self.inner.write_at(name, offset, data).await
            }
            Some(DiskFault::BlockingWrite(d)) => {
                std::thread::sleep(d);
                self.inner.write_at(name, offset, data).await
            }
            Some(DiskFault::NoSpace) => Err(io::Error::from_raw_os_error(28)),
            Some(DiskFault::FailSync) => {
                // An O_DSYNC write whose flush failed: its data may or may not be on disk.
                self.inner.write_at(name, offset, data).await?;
                Err(io::Error::other("injected fsync failure (O_DSYNC write)"))
            }
            Some(_) => {
                let block = usize::try_from(BLOCK).unwrap_or(usize::MAX);
                if data.len() > block {
                    let later = data.split_off(block);
                    self.inner.write_at(name, offset + BLOCK, later).await?;
                } else {
                    let mut old = self.inner.read_at(name, offset, block).await?;
                    old.resize(block, 0);
                    data[block / 2..].copy_from_slice(&old[block / 2..]);
                    self.inner.write_at(name, offset, data).await?;
                }
                self.inner.sync(name).await?;
                (self.crash)();
                Err(io::Error::other("crashed after a torn write"))
            }
        }
    }

    async fn sync(&self, name: &str) -> io::Result<()> {
        if self.take(name, &[DiskFault::FailSync]).is_some() {
            return Err(io::Error::other("injected fsync failure"));
        }
        self.inner.sync(name).await
    }

    async fn len(&self, name: &str) -> io::Result<u64> {
        self.inner.len(name).await
    }

    fn durable_writes(&self) -> bool {
        self.inner.durable_writes()
    }
}

#[cfg(test)]
mod tests {
    use futures_lite::future::block_on;

    use super::*;
    use crate::log::io::MemLogIo;

    fn armed(dir: &tempfile::TempDir, fault: &str) -> (MemLogIo, FaultyIo<MemLogIo>) {
        let mem = MemLogIo::new();
        let io = FaultyIo::new(mem.clone(), dir.path().join(TRIGGER_FILE), || {});
        std::fs::write(dir.path().join(TRIGGER_FILE), fault).unwrap();
        block_on(io.open("f.log", 4 * BLOCK)).unwrap();
        (mem, io)
    }

    #[test]
    fn each_fault_fires_once_when_armed() {
        let dir = tempfile::tempdir().unwrap();
        let b = usize::try_from(BLOCK).unwrap();
        let (_, io) = armed(&dir, "fsync\n");
        block_on(io.write_at("f.log", 0, vec![1; b])).unwrap();
        assert!(block_on(io.sync("f.log")).is_err());
        assert!(block_on(io.sync("f.log")).is_ok(), "one shot");

        let (_, io) = armed(&dir, "enospc");
        let e = block_on(io.write_at("f.log", 0, vec![1; b])).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28));
        assert!(block_on(io.write_at("f.log", 0, vec![1; b])).is_ok());

        std::fs::write(dir.path().join(TRIGGER_FILE), "prealloc").unwrap();
        let e = block_on(io.open("g.log", 4 * BLOCK)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        block_on(io.open("g.log", 4 * BLOCK)).unwrap();

        let (mem, io) = armed(&dir, "torn");
        assert!(block_on(io.write_at("f.log", 0, vec![7; 2 * b])).is_err());
        let durable = mem.crash().file("f.log").unwrap();
        assert!(
            durable[..b].iter().all(|x| *x == 0),
            "first block not written"
        );
        assert!(
            durable[b..2 * b].iter().all(|x| *x == 7),
            "later block durable"
        );

        let (mem, io) = armed(&dir, "torn");
        mem.set_file("f.log", vec![5; b]);
        assert!(block_on(io.write_at("f.log", 0, vec![7; b])).is_err());
        let durable = mem.crash().file("f.log").unwrap();
        assert!(durable[..b / 2].iter().all(|x| *x == 7), "new half");
        assert!(durable[b / 2..b].iter().all(|x| *x == 5), "old half kept");
    }

    /// The durations the test timer was asked for.
    static SLEPT: std::sync::Mutex<Vec<Duration>> = std::sync::Mutex::new(Vec::new());

    #[test]
    fn a_slow_write_waits_once_on_the_timer_and_is_not_armed_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let b = usize::try_from(BLOCK).unwrap();
        let (_, io) = armed(&dir, "slow 1500\n");
        block_on(io.write_at("f.log", 0, vec![1; b])).unwrap();
        assert!(
            dir.path().join(TRIGGER_FILE).exists(),
            "no timer: the fault stays armed, untaken"
        );
        let (mem, io) = armed(&dir, "slow 1500\n");
        let io = io.with_sleep(|d| {
            SLEPT.lock().unwrap().push(d);
            Box::pin(std::future::ready(()))
        });
        block_on(io.write_at("f.log", 0, vec![3; b])).unwrap();
        block_on(io.write_at("f.log", 0, vec![4; b])).unwrap();
        assert_eq!(
            *SLEPT.lock().unwrap(),
            [Duration::from_millis(1500)],
            "one shot"
        );
        assert_eq!(mem.file("f.log").unwrap()[..b], vec![4; b][..], "written");
        assert_eq!(DiskFault::parse("slow x"), None);
    }

    #[test]
    fn a_blocking_write_holds_its_thread_once() {
        let dir = tempfile::tempdir().unwrap();
        let b = usize::try_from(BLOCK).unwrap();
        let (mem, io) = armed(&dir, "block 150\n");
        let t = std::time::Instant::now();
        block_on(io.write_at("f.log", 0, vec![5; b])).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(150), "held");
        let t = std::time::Instant::now();
        block_on(io.write_at("f.log", 0, vec![6; b])).unwrap();
        assert!(t.elapsed() < Duration::from_millis(150), "one shot");
        assert_eq!(mem.file("f.log").unwrap()[..b], vec![6; b][..], "written");
        assert_eq!(DiskFault::parse("block x"), None);
    }

    #[test]
    fn over_durable_writes_an_fsync_fault_fails_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let b = usize::try_from(BLOCK).unwrap();
        let mem = MemLogIo::with_durable_writes();
        let io = FaultyIo::new(mem, dir.path().join(TRIGGER_FILE), || {});
        std::fs::write(dir.path().join(TRIGGER_FILE), "fsync").unwrap();
        block_on(io.open("f.log", 4 * BLOCK)).unwrap();
        assert!(io.durable_writes());
        assert!(block_on(io.write_at("f.log", 0, vec![1; b])).is_err());
        assert!(
            block_on(io.write_at("f.log", 0, vec![1; b])).is_ok(),
            "one shot"
        );
    }

    #[test]
    fn only_segment_files_take_a_fault() {
        let dir = tempfile::tempdir().unwrap();
        let (_, io) = armed(&dir, "fsync");
        block_on(io.open("durable.mark", BLOCK)).unwrap();
        block_on(io.sync("durable.mark")).unwrap();
        assert!(block_on(io.sync("f.log")).is_err());
    }

    #[test]
    fn nothing_is_injected_without_a_trigger_or_for_an_unknown_word() {
        let dir = tempfile::tempdir().unwrap();
        let (_, io) = armed(&dir, "bogus");
        block_on(io.write_at("f.log", 0, vec![1; usize::try_from(BLOCK).unwrap()])).unwrap();
        block_on(io.sync("f.log")).unwrap();
        assert!(dir.path().join(TRIGGER_FILE).exists(), "left alone");
    }
}
