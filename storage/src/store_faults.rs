//! Disk faults injected under redb (the store), in a running process: the `fault-injection`
//! feature (tests and the nemesis build), never in production builds.
//!
//! [`FaultyBackend`] is redb's file backend with one seam: while the trigger file
//! (`inject-disk-fault` in the store's directory, the one the standalone journal's log reads
//! too) says `store-enospc`, the next write to the database file fails with ENOSPC, once (the
//! trigger is removed). redb then fails that commit whole, and refuses every later operation
//! until the database is opened again: the node stops (status 74) and replays its log on the
//! restart.

use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// The trigger file's word for the fault.
pub const STORE_NO_SPACE: &str = "store-enospc";

/// redb's file backend under the fault seam (see the module docs).
#[derive(Debug)]
pub struct FaultyBackend {
    inner: FileBackend,
    trigger: PathBuf,
}

impl FaultyBackend {
    /// The database file `path` (created if missing), armed by `trigger`.
    ///
    /// # Errors
    /// The file cannot be opened.
    pub fn create(path: &Path, trigger: PathBuf) -> Result<Self, redb::DatabaseError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(FaultyBackend {
            inner: FileBackend::new(file)?,
            trigger,
        })
    }

    /// Whether the trigger arms the fault now (it is consumed).
    fn take(&self) -> bool {
        let armed = std::fs::read_to_string(&self.trigger)
            .is_ok_and(|w| w.trim() == STORE_NO_SPACE)
            && std::fs::remove_file(&self.trigger).is_ok();
        if armed {
            tracing::error!(target: "storage", fault = STORE_NO_SPACE, "injecting a disk fault");
        }
        armed
    }
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        if self.take() {
            return Err(io::Error::from_raw_os_error(28));
        }
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
