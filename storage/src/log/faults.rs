//! Disk faults injected under the log, in a running process (the nemesis run's disk class).
//!
//! [`FaultyIo`] wraps any [`LogIo`]. Writing a fault's name into its trigger file (`fsync`,
//! `enospc`, `prealloc` or `torn`) arms that fault once, for the log's segment files (`*.log`;
//! not the durable mark or the vote files): the next `sync` fails (over files whose writes are
//! durable, the next write: its `O_DSYNC` flush fails), the next write fails with ENOSPC, the
//! next segment's creation (its preallocation) fails with ENOSPC,
//! or the next write persists only its later blocks (an O_DIRECT multi-block write torn by a
//! power loss) and the process then dies at once (the crash hook). The broker uses it only
//! when built with the `fault-injection` feature.

use std::io;
use std::path::PathBuf;

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
}

impl DiskFault {
    /// The trigger file's word for it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DiskFault::FailSync => "fsync",
            DiskFault::NoSpace => "enospc",
            DiskFault::NoSpaceToPreallocate => "prealloc",
            DiskFault::TornWrite => "torn",
        }
    }

    fn parse(s: &str) -> Option<DiskFault> {
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
    FaultyIo::new(io, trigger, || std::process::abort()).with_trigger(dir.join(TRIGGER_FILE))
}

/// A [`LogIo`] that injects the fault named in its trigger file (see the module docs).
pub struct FaultyIo<I> {
    inner: I,
    /// Trigger files, each looked at in turn.
    triggers: Vec<PathBuf>,
    crash: fn(),
}

impl<I: LogIo> FaultyIo<I> {
    /// Wraps `inner`; `crash` ends the process after a torn write (`std::process::abort`).
    pub fn new(inner: I, trigger: PathBuf, crash: fn()) -> Self {
        FaultyIo {
            inner,
            triggers: vec![trigger],
            crash,
        }
    }

    /// One more trigger file that arms a fault.
    #[must_use]
    pub fn with_trigger(mut self, trigger: PathBuf) -> Self {
        self.triggers.push(trigger);
        self
    }

    /// The armed fault for an operation on `name`, if the trigger file names one (it is
    /// consumed: one shot).
    fn take(&self, name: &str, want: &[DiskFault]) -> Option<DiskFault> {
        if !name.ends_with(".log") {
            return None;
        }
        self.triggers.iter().find_map(|trigger| {
            let word = std::fs::read_to_string(trigger).ok()?;
            let fault = DiskFault::parse(&word).filter(|f| want.contains(f))?;
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
        let faults: &[DiskFault] = if self.inner.durable_writes() {
            &[
                DiskFault::NoSpace,
                DiskFault::TornWrite,
                DiskFault::FailSync,
            ]
        } else {
            &[DiskFault::NoSpace, DiskFault::TornWrite]
        };
        match self.take(name, faults) {
            None => self.inner.write_at(name, offset, data).await,
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
