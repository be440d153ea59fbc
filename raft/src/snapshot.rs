//! Snapshot data as a stream, and the spool a receiver writes a transfer into.
//!
//! # Invariants
//! - No snapshot is ever whole in memory: the event shard's is read from a store read
//!   transaction piece by piece as it is sent ([`futureq_storage::SnapshotReader`]), a
//!   receiver writes each piece to a spool file as it arrives ([`Receiving`]), and the
//!   install reads that file through a bounded buffer. (The metadata group's snapshot is a
//!   few KB and lives in memory.)
//! - A spool file lives as long as its transfer or its [`SnapshotData`]: it is removed when
//!   either is dropped (a transfer whose sender went quiet is dropped, see
//!   [`Receiving::expire`]), and leftovers of a crash are removed when the receiver starts.
//! - Pieces are read and written on blocking threads, never on the Raft core's reactor.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

/// Bytes a spooled snapshot is read through at a time.
const SPOOL_READ_BYTES: usize = 1 << 20;
/// File name prefix of spooled transfers in the receiver's directory.
const SPOOL_PREFIX: &str = "snapshot-recv-";

/// A snapshot's data, read as a stream (see the module docs).
pub struct SnapshotData {
    source: Box<dyn Read + Send>,
    /// The spool file a received snapshot is read from (removed with the data).
    _spool: Option<Arc<SpoolFile>>,
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotData")
            .field("spooled", &self._spool.as_ref().map(|s| &s.0))
            .finish_non_exhaustive()
    }
}

impl SnapshotData {
    /// Data held in memory.
    #[must_use]
    pub fn from_bytes(b: Bytes) -> Self {
        Self::from_reader(io::Cursor::new(b))
    }

    /// Data produced by a blocking reader, read off the reactor.
    #[must_use]
    pub fn from_reader(r: impl Read + Send + 'static) -> Self {
        SnapshotData {
            source: Box::new(r),
            _spool: None,
        }
    }

    /// Reads up to `max` bytes on a blocking thread; empty at the end.
    ///
    /// # Errors
    /// The source's read error.
    pub async fn next_chunk(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let mut src = std::mem::replace(&mut self.source, Box::new(io::empty()));
        let (src, out) = glommio::executor()
            .spawn_blocking(move || {
                let mut buf = vec![0u8; max];
                let mut n = 0;
                let res = loop {
                    if n == max {
                        break Ok(());
                    }
                    match src.read(&mut buf[n..]) {
                        Ok(0) => break Ok(()),
                        Ok(k) => n += k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                buf.truncate(n);
                (src, res.map(|()| buf))
            })
            .await;
        self.source = src;
        out
    }

    /// The whole data, refused beyond `limit` bytes (for the metadata group's small
    /// snapshots), read on a blocking thread.
    ///
    /// # Errors
    /// A read error, or more than `limit` bytes.
    pub async fn read_all(self, limit: u64) -> io::Result<Vec<u8>> {
        glommio::executor()
            .spawn_blocking(move || {
                let mut out = Vec::new();
                let mut r = self;
                (&mut r).take(limit + 1).read_to_end(&mut out)?;
                if out.len() as u64 > limit {
                    return Err(io::Error::other(format!(
                        "snapshot larger than {limit} bytes"
                    )));
                }
                Ok(out)
            })
            .await
    }
}

/// Blocking: use on a blocking thread.
impl Read for SnapshotData {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.source.read(buf)
    }
}

/// A spool file, removed when dropped.
struct SpoolFile(PathBuf);

impl Drop for SpoolFile {
    /// Removes the file on a thread of its own: removing a file of GBs can take a while, and
    /// openraft may drop a snapshot it refused on the Raft core's reactor.
    fn drop(&mut self) {
        let path = std::mem::take(&mut self.0);
        let remove = move || {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(target: "raft", path = %path.display(), error = %e, "removing a snapshot spool file failed");
                }
            }
        };
        if std::thread::Builder::new()
            .name("futureq-spool-rm".into())
            .spawn(remove)
            .is_err()
        {
            tracing::warn!(target: "raft", "no thread to remove a snapshot spool file; it stays until the next start");
        }
    }
}

/// A transfer being received.
struct Transfer {
    id: Vec<u8>,
    seq: u64,
    spool: Arc<SpoolFile>,
    file: Option<Arc<File>>,
    /// Bytes taken (a piece being written counts: see `busy`).
    written: u64,
    /// A piece is being written.
    busy: bool,
    /// When the last piece was written.
    last: std::time::Instant,
}

/// The receiving side of one Raft group's snapshot transfers: one transfer at a time,
/// spooled to a file in its directory.
pub struct Receiving {
    dir: PathBuf,
    group: u8,
    seq: u64,
    max_bytes: u64,
    current: Option<Transfer>,
}

impl Receiving {
    /// A receiver spooling into `dir` (created if missing); spool files a crash left there
    /// are removed. Transfers beyond `max_bytes` are refused.
    ///
    /// # Errors
    /// The directory cannot be created or listed.
    pub fn new(dir: &Path, group: u8, max_bytes: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let prefix = format!("{SPOOL_PREFIX}{group}-");
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                std::fs::remove_file(e.path())?;
            }
        }
        Ok(Receiving {
            dir: dir.to_path_buf(),
            group,
            seq: 0,
            max_bytes,
            current: None,
        })
    }

    /// Drops the transfer in progress when no piece came for `idle` (its sender gave up: a
    /// leader change, a crash), so that its spool file does not stay on the log's disk.
    pub fn expire(&mut self, idle: std::time::Duration) {
        if self
            .current
            .as_ref()
            .is_some_and(|t| !t.busy && t.last.elapsed() > idle)
        {
            tracing::info!(target: "raft", group = self.group, "dropping a snapshot transfer its sender abandoned");
            self.abandon();
        }
    }

    /// Drops the transfer in progress (its spool file is removed off the reactor).
    fn abandon(&mut self) {
        self.current = None;
    }
}

/// Takes one piece of a transfer: `offset` 0 starts a new one (dropping any other), any
/// other piece must continue the current one exactly. The piece is written to the spool file
/// on a blocking thread. False when it was refused (the sender starts over).
pub async fn take_piece(
    rx: &std::cell::RefCell<Receiving>,
    id: &[u8],
    offset: u64,
    data: Bytes,
) -> bool {
    let (file, spool, seq) = {
        let mut r = rx.borrow_mut();
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|e| e > r.max_bytes) {
            r.abandon();
            return false;
        }
        if offset == 0 {
            r.abandon();
            r.seq += 1;
            let path = r.dir.join(format!("{SPOOL_PREFIX}{}-{}", r.group, r.seq));
            r.current = Some(Transfer {
                id: id.to_vec(),
                seq: r.seq,
                spool: Arc::new(SpoolFile(path)),
                file: None,
                written: 0,
                busy: false,
                last: std::time::Instant::now(),
            });
        }
        let len = data.len() as u64;
        match &mut r.current {
            // The piece's range is taken before the write: a second piece for the same offset
            // (a duplicate, another sender of the same snapshot) is refused meanwhile.
            Some(t) if t.id == id && t.written == offset && !t.busy => {
                t.written += len;
                t.busy = true;
                (t.file.clone(), Arc::clone(&t.spool), t.seq)
            }
            _ => {
                r.abandon();
                return false;
            }
        }
    };
    let written = glommio::executor()
        .spawn_blocking(move || -> io::Result<Arc<File>> {
            let file = match file {
                Some(f) => f,
                None => Arc::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(true)
                        .write(true)
                        .open(&spool.0)?,
                ),
            };
            file.write_all_at(&data, offset)?;
            Ok(file)
        })
        .await;
    let mut r = rx.borrow_mut();
    match (written, &mut r.current) {
        (Ok(file), Some(t)) if t.seq == seq => {
            t.file = Some(file);
            t.busy = false;
            t.last = std::time::Instant::now();
            true
        }
        (Err(e), Some(t)) if t.seq == seq => {
            tracing::warn!(target: "raft", error = %e, "spooling a snapshot piece failed");
            r.abandon();
            false
        }
        // Another transfer replaced this one meanwhile.
        _ => false,
    }
}

/// Ends the transfer in progress: when it is `id` and holds exactly `total` bytes, the data
/// to install (read from its spool file); otherwise `None` and the transfer is dropped.
pub async fn finish(
    rx: &std::cell::RefCell<Receiving>,
    id: &[u8],
    total: u64,
) -> Option<SnapshotData> {
    let t = rx.borrow_mut().current.take()?;
    if t.id != id || t.written != total || t.busy {
        tracing::warn!(target: "raft", received = t.written, total, "snapshot transfer incomplete; refusing to install it");
        drop(t);
        return None;
    }
    let spool = t.spool;
    let opened = glommio::executor()
        .spawn_blocking(move || {
            let f = File::open(&spool.0)?;
            Ok::<_, io::Error>((f, spool))
        })
        .await;
    match opened {
        Ok((f, spool)) => Some(SnapshotData {
            source: Box::new(BufReader::with_capacity(SPOOL_READ_BYTES, f)),
            _spool: Some(spool),
        }),
        Err(e) => {
            tracing::warn!(target: "raft", error = %e, "opening a spooled snapshot failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    fn run<T, F>(f: impl FnOnce() -> F + Send + 'static) -> T
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + 'static,
    {
        glommio::LocalExecutorBuilder::default()
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    fn spools(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(SPOOL_PREFIX))
            .collect();
        v.sort();
        v
    }

    /// Waits (bounded) for the spool files removed off the reactor.
    async fn spools_become(dir: &Path, n: usize) -> Vec<String> {
        for _ in 0..200 {
            if spools(dir).len() == n {
                break;
            }
            glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        }
        spools(dir)
    }

    /// Issue 12: a received snapshot is written to a spool file piece by piece (never
    /// assembled in memory), read back from it, and the file lives exactly as long as its
    /// transfer or its data.
    #[test]
    fn a_transfer_is_spooled_to_a_file_that_lives_as_long_as_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        std::fs::write(d.join(format!("{SPOOL_PREFIX}7-99")), b"left by a crash").unwrap();
        std::fs::write(d.join(format!("{SPOOL_PREFIX}8-1")), b"another group's").unwrap();
        std::fs::write(d.join("segment"), b"not a spool file").unwrap();
        run(move || async move {
            let rx = RefCell::new(Receiving::new(&d, 7, 1 << 20).unwrap());
            assert_eq!(spools(&d), vec![format!("{SPOOL_PREFIX}8-1")]);
            assert!(d.join("segment").exists());
            std::fs::remove_file(d.join(format!("{SPOOL_PREFIX}8-1"))).unwrap();

            let piece = |s: &'static str| Bytes::from_static(s.as_bytes());
            assert!(take_piece(&rx, b"a", 0, piece("hello ")).await);
            let on_disk = spools(&d);
            assert_eq!(on_disk.len(), 1);
            assert_eq!(std::fs::read(d.join(&on_disk[0])).unwrap(), b"hello ");
            // A piece that does not continue the transfer exactly ends it.
            assert!(!take_piece(&rx, b"a", 3, piece("lo")).await);
            assert!(spools_become(&d, 0).await.is_empty());
            assert!(!take_piece(&rx, b"a", 6, piece("world")).await);

            // Offset 0 starts over; a wrong id or length at the end refuses the install.
            assert!(take_piece(&rx, b"a", 0, piece("hello ")).await);
            assert!(take_piece(&rx, b"a", 6, piece("world")).await);
            assert!(finish(&rx, b"a", 12).await.is_none());
            assert!(spools_become(&d, 0).await.is_empty());
            assert!(take_piece(&rx, b"a", 0, piece("hello ")).await);
            assert!(take_piece(&rx, b"a", 6, piece("world")).await);
            // A new transfer replaces one in progress.
            assert!(take_piece(&rx, b"b", 0, piece("hello ")).await);
            assert!(take_piece(&rx, b"b", 6, piece("world")).await);
            assert_eq!(spools_become(&d, 1).await.len(), 1);
            let data = finish(&rx, b"b", 11).await.expect("complete");
            assert_eq!(data.read_all(100).await.unwrap(), b"hello world");
            assert!(
                spools_become(&d, 0).await.is_empty(),
                "removed with its data"
            );

            // Nothing beyond the receiver's bound is spooled, and the transfer ends.
            let almost = Bytes::from(vec![0u8; (1 << 20) - 2]);
            assert!(take_piece(&rx, b"c", 0, almost).await);
            assert!(!take_piece(&rx, b"c", (1 << 20) - 2, piece("abc")).await);
            assert!(
                !take_piece(&rx, b"c", (1 << 20) - 2, piece("ab")).await,
                "ended"
            );
            assert!(spools_become(&d, 0).await.is_empty());
            assert!(!take_piece(&rx, b"c", 0, Bytes::from(vec![0u8; (1 << 20) + 1])).await);
            assert!(spools_become(&d, 0).await.is_empty());

            // A second piece for the same offset while the first is being written (another
            // stream of the same snapshot) ends the transfer: neither is taken, the sender
            // starts over, nothing spliced is installed.
            assert!(take_piece(&rx, b"d", 0, piece("hello ")).await);
            let (a, b) = futures::join!(
                take_piece(&rx, b"d", 6, piece("world")),
                take_piece(&rx, b"d", 6, piece("WORLD"))
            );
            assert!(!a && !b, "{a} {b}");
            assert!(finish(&rx, b"d", 11).await.is_none());
            assert!(spools_become(&d, 0).await.is_empty());

            // A transfer whose sender went quiet is dropped with its spool file.
            assert!(take_piece(&rx, b"e", 0, piece("hello ")).await);
            rx.borrow_mut().expire(std::time::Duration::from_secs(60));
            assert_eq!(spools(&d).len(), 1, "not idle long enough");
            glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
            rx.borrow_mut().expire(std::time::Duration::from_millis(10));
            assert!(spools_become(&d, 0).await.is_empty());
            assert!(!take_piece(&rx, b"e", 6, piece("world")).await);
        });
    }

    #[test]
    fn data_is_read_in_pieces_of_the_size_asked_for() {
        run(|| async {
            let mut d = SnapshotData::from_bytes(Bytes::from(vec![7u8; 2500]));
            let mut sizes = Vec::new();
            loop {
                let c = d.next_chunk(1000).await.unwrap();
                sizes.push(c.len());
                if c.is_empty() {
                    break;
                }
            }
            assert_eq!(sizes, vec![1000, 1000, 500, 0]);
            let small = SnapshotData::from_bytes(Bytes::from(vec![1u8; 10]));
            assert!(small.read_all(9).await.is_err(), "beyond the limit");
        });
    }
}
