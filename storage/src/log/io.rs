//! The I/O seam under the log: named, preallocated files with aligned writes.
//!
//! # Correctness
//! - `write_at` offsets and lengths are multiples of [`BLOCK`] (O_DIRECT); implementations
//!   must reject anything else.
//! - Data written is readable at once, but durable only after `sync` returns `Ok` — or, where
//!   [`LogIo::durable_writes`] says so, as soon as its `write_at` returns `Ok`.
//! - `open` preallocates with zeros: unwritten space reads as zeros.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::rc::Rc;

use super::format::BLOCK;

/// Files for the log. Implementations: [`MemLogIo`] (tests, fault injection); the io_uring
/// `DmaFile` implementation comes with the clustered broker.
pub trait LogIo {
    /// Names of the existing files.
    fn list(&self) -> impl Future<Output = io::Result<Vec<String>>>;
    /// Opens `name`, creating it preallocated to `len` zero bytes if missing.
    fn open(&self, name: &str, len: u64) -> impl Future<Output = io::Result<()>>;
    /// Deletes `name`.
    fn remove(&self, name: &str) -> impl Future<Output = io::Result<()>>;
    /// Reads up to `len` bytes at `offset` (fewer at the end of the file).
    fn read_at(
        &self,
        name: &str,
        offset: u64,
        len: usize,
    ) -> impl Future<Output = io::Result<Vec<u8>>>;
    /// Writes `data` at `offset`; both aligned to [`BLOCK`].
    fn write_at(
        &self,
        name: &str,
        offset: u64,
        data: Vec<u8>,
    ) -> impl Future<Output = io::Result<()>>;
    /// Makes everything written to `name` durable.
    fn sync(&self, name: &str) -> impl Future<Output = io::Result<()>>;
    /// Whether every `write_at` is durable when it returns `Ok` (files opened `O_DSYNC`): the
    /// log's group commit then skips its `sync`, one request and one wake-up fewer per flush.
    fn durable_writes(&self) -> bool {
        false
    }
    /// Makes this process's writes to `name` durable: nothing to do over durable writes,
    /// otherwise `sync`. (Recovery, which must also cover writes of a process that died,
    /// calls `sync` itself.)
    fn sync_writes(&self, name: &str) -> impl Future<Output = io::Result<()>> {
        async move {
            if self.durable_writes() {
                Ok(())
            } else {
                self.sync(name).await
            }
        }
    }
    /// Size of `name` in bytes.
    fn len(&self, name: &str) -> impl Future<Output = io::Result<u64>>;
}

#[derive(Default)]
struct MemFile {
    data: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Default)]
struct MemInner {
    files: BTreeMap<String, MemFile>,
    events: Vec<String>,
    syncs: usize,
    reads: usize,
    fail_syncs: bool,
    /// Writes are durable at once (see [`LogIo::durable_writes`]).
    durable_writes: bool,
    /// Writes complete after yields, the later of each four sooner ([`MemLogIo::delay_writes`]).
    delayed_writes: bool,
    writes_started: usize,
    writes_in_flight: usize,
    most_writes_in_flight: usize,
    /// Removals wait while set ([`MemLogIo::hold_removals`]).
    removals_held: bool,
    removals_waiting: usize,
}

/// Turns of the executor a held removal waits at most: a test that would wait for ever
/// fails its checks instead.
const REMOVAL_HELD_MAX: u32 = 10_000;

/// In-memory files that remember what was synced: [`MemLogIo::crash`] keeps only that.
#[derive(Clone, Default)]
pub struct MemLogIo(Rc<RefCell<MemInner>>);

/// Returns once after letting the executor run its other ready tasks.
pub(crate) async fn yield_once() {
    let mut yielded = false;
    futures::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no file {name}"))
}

impl MemLogIo {
    /// An empty file set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// What a power loss leaves: only synced bytes, as a new file set.
    #[must_use]
    pub fn crash(&self) -> MemLogIo {
        let files = self
            .0
            .borrow()
            .files
            .iter()
            .map(|(n, f)| {
                (
                    n.clone(),
                    MemFile {
                        data: f.durable.clone(),
                        durable: f.durable.clone(),
                    },
                )
            })
            .collect();
        MemLogIo(Rc::new(RefCell::new(MemInner {
            files,
            durable_writes: self.0.borrow().durable_writes,
            ..MemInner::default()
        })))
    }

    /// Empty files whose writes are durable when they return, as `O_DSYNC` files are.
    #[must_use]
    pub fn with_durable_writes() -> Self {
        let io = Self::default();
        io.0.borrow_mut().durable_writes = true;
        io
    }

    /// Makes every later `sync` fail (fault injection); with durable writes, every later
    /// write, which then leaves nothing durable.
    pub fn fail_syncs(&self, fail: bool) {
        self.0.borrow_mut().fail_syncs = fail;
    }

    /// Writes complete only after the writer yields, from one to four times, the later of
    /// each four issued sooner (out of order), as concurrent writes to a disk may.
    pub fn delay_writes(&self) {
        self.0.borrow_mut().delayed_writes = true;
    }

    /// While `held`, removals wait (a directory fsync behind seconds of the file system's
    /// dirty data), each at most a bounded number of executor turns.
    pub fn hold_removals(&self, held: bool) {
        self.0.borrow_mut().removals_held = held;
    }

    /// Removals waiting now ([`MemLogIo::hold_removals`]).
    #[must_use]
    pub fn removals_waiting(&self) -> usize {
        self.0.borrow().removals_waiting
    }

    /// The most writes that were in flight at once.
    #[must_use]
    pub fn most_writes_in_flight(&self) -> usize {
        self.0.borrow().most_writes_in_flight
    }

    /// The write of [`LogIo::write_at`], done at once.
    fn write_now(&self, name: &str, offset: u64, data: Vec<u8>) -> io::Result<()> {
        if !offset.is_multiple_of(BLOCK) || !(data.len() as u64).is_multiple_of(BLOCK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned write",
            ));
        }
        let mut inner = self.0.borrow_mut();
        if inner.durable_writes && inner.fail_syncs {
            inner.events.push(format!("write-failed {name}"));
            return Err(io::Error::other("injected O_DSYNC write failure"));
        }
        inner
            .events
            .push(format!("write {name}@{offset}+{}", data.len()));
        let f = inner.files.get_mut(name).ok_or_else(|| not_found(name))?;
        let start = usize::try_from(offset).map_err(|_| io::Error::other("offset"))?;
        if f.data.len() < start + data.len() {
            f.data.resize(start + data.len(), 0);
        }
        f.data[start..start + data.len()].copy_from_slice(&data);
        if inner.durable_writes {
            let f = inner.files.get_mut(name).ok_or_else(|| not_found(name))?;
            if f.durable.len() < start + data.len() {
                f.durable.resize(start + data.len(), 0);
            }
            f.durable[start..start + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }

    /// Successful syncs so far.
    #[must_use]
    pub fn syncs(&self) -> usize {
        self.0.borrow().syncs
    }

    /// Reads so far.
    #[must_use]
    pub fn reads(&self) -> usize {
        self.0.borrow().reads
    }

    /// Appends a marker to the event trace (tests record callbacks in the same trace).
    pub fn mark(&self, event: &str) {
        self.0.borrow_mut().events.push(event.to_owned());
    }

    /// The trace of writes, syncs and marks.
    #[must_use]
    pub fn events(&self) -> Vec<String> {
        self.0.borrow().events.clone()
    }

    /// The current bytes of a file.
    #[must_use]
    pub fn file(&self, name: &str) -> Option<Vec<u8>> {
        self.0.borrow().files.get(name).map(|f| f.data.clone())
    }

    /// Replaces a file's bytes, durably (to build damaged images).
    pub fn set_file(&self, name: &str, bytes: Vec<u8>) {
        self.0.borrow_mut().files.insert(
            name.to_owned(),
            MemFile {
                data: bytes.clone(),
                durable: bytes,
            },
        );
    }
}

impl LogIo for MemLogIo {
    async fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.0.borrow().files.keys().cloned().collect())
    }

    async fn open(&self, name: &str, len: u64) -> io::Result<()> {
        let mut inner = self.0.borrow_mut();
        inner.files.entry(name.to_owned()).or_insert_with(|| {
            let z = vec![0u8; usize::try_from(len).unwrap_or(0)];
            MemFile {
                data: z.clone(),
                durable: z,
            }
        });
        Ok(())
    }

    async fn remove(&self, name: &str) -> io::Result<()> {
        self.0.borrow_mut().removals_waiting += 1;
        for _ in 0..REMOVAL_HELD_MAX {
            if !self.0.borrow().removals_held {
                break;
            }
            yield_once().await;
        }
        let mut inner = self.0.borrow_mut();
        inner.removals_waiting -= 1;
        inner.events.push(format!("remove {name}"));
        inner
            .files
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| not_found(name))
    }

    async fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.0.borrow_mut().reads += 1;
        let inner = self.0.borrow();
        let f = inner.files.get(name).ok_or_else(|| not_found(name))?;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(f.data.len());
        let end = start.saturating_add(len).min(f.data.len());
        Ok(f.data[start..end].to_vec())
    }

    async fn write_at(&self, name: &str, offset: u64, data: Vec<u8>) -> io::Result<()> {
        let yields = {
            let mut inner = self.0.borrow_mut();
            inner.writes_in_flight += 1;
            inner.most_writes_in_flight = inner.most_writes_in_flight.max(inner.writes_in_flight);
            inner.writes_started += 1;
            if inner.delayed_writes {
                4 - inner.writes_started % 4
            } else {
                0
            }
        };
        // Counted out when done or dropped (a flush dropped while its writes yield).
        struct InFlight<'a>(&'a RefCell<MemInner>);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.borrow_mut().writes_in_flight -= 1;
            }
        }
        let _in_flight = InFlight(&self.0);
        for _ in 0..yields {
            yield_once().await;
        }
        self.write_now(name, offset, data)
    }

    async fn sync(&self, name: &str) -> io::Result<()> {
        let mut inner = self.0.borrow_mut();
        if inner.fail_syncs {
            inner.events.push(format!("sync-failed {name}"));
            return Err(io::Error::other("injected fsync failure"));
        }
        inner.events.push(format!("sync {name}"));
        inner.syncs += 1;
        let f = inner.files.get_mut(name).ok_or_else(|| not_found(name))?;
        f.durable = f.data.clone();
        Ok(())
    }

    async fn len(&self, name: &str) -> io::Result<u64> {
        let inner = self.0.borrow();
        inner
            .files
            .get(name)
            .map(|f| f.data.len() as u64)
            .ok_or_else(|| not_found(name))
    }

    fn durable_writes(&self) -> bool {
        self.0.borrow().durable_writes
    }
}
