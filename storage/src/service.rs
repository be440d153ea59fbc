//! The store's threads: one writer that group-commits, one reader that serves scans.
//!
//! redb is synchronous, so it never runs on an executor. Callers on any core talk to these
//! threads over bounded channels and await a oneshot reply; the channel bounds are the
//! back-pressure that keeps memory bounded when the disk is slower than the clients.
//!
//! # Group commit
//! The writer blocks for one operation, then drains whatever else is queued (up to
//! [`GROUP_OPS_MAX`] operations / [`GROUP_BYTES_MAX`] bytes) and commits it all in one
//! transaction — one fsync for many batches, so throughput grows with concurrency.
//!
//! # Write-ahead log (standalone)
//! Started with [`StoreService::start_logged`], the writer commits each group to redb without
//! fsync and makes it durable with one record in the [`crate::wal`] (one sequential write and
//! `fdatasync`); a durable redb commit (checkpoint) follows at least every
//! [`DURABLE_COMMIT_INTERVAL_MAX`], and start-up replays what the last checkpoint missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futureq_core::hub::{ScanRequest, ScanResult};
use futureq_core::EventKey;
use futures::channel::oneshot;

use crate::store::{GroupOutcome, NewMessage, Store, StoreMode};
use crate::wal::{Wal, WAL_BYTES};
use crate::StoreError;

/// Most operations in one group commit.
pub const GROUP_OPS_MAX: usize = 4096;
/// Most payload bytes in one group commit (bounds the transaction's memory).
pub const GROUP_BYTES_MAX: usize = 64 << 20;
/// Capacity of the writer's queue (operations).
pub const WRITE_QUEUE_MAX: usize = 1024;
/// Longest run of non-durable commits: redb keeps their pages in memory until a durable
/// commit, NO_ACK data should not stay volatile for long, and (with the write-ahead log) the
/// log restarts after each durable commit.
pub const DURABLE_COMMIT_INTERVAL_MAX: Duration = Duration::from_millis(50);
/// Longest time between two checkpoints (durable redb commits) with the write-ahead log:
/// each one fsyncs everything redb wrote since the last, and the groups queued behind it wait
/// (~1–2 ms here); rarer checkpoints keep that out of the 99th percentile. Records that no
/// group waited for are still synced within [`DURABLE_COMMIT_INTERVAL_MAX`].
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);
/// Capacity of the reader's queue.
pub const READ_QUEUE_MAX: usize = 1024;

type Reply<T> = oneshot::Sender<Result<T, Arc<StoreError>>>;

enum WriteOp {
    Publish {
        items: Vec<NewMessage>,
        durable: bool,
        reply: Option<Reply<Vec<EventKey>>>,
    },
    Delete {
        keys: Vec<EventKey>,
        reply: Reply<Vec<EventKey>>,
    },
    Sweep {
        now_ms: i64,
        limit: usize,
        reply: Reply<Vec<EventKey>>,
    },
}

impl WriteOp {
    fn bytes(&self) -> usize {
        match self {
            WriteOp::Publish { items, .. } => items.iter().map(|m| m.value.len()).sum(),
            WriteOp::Delete { keys, .. } => keys.len() * 24,
            WriteOp::Sweep { .. } => 0,
        }
    }
}

struct ReadOp {
    req: ScanRequest,
    reply: Reply<ScanResult>,
}

/// Group-commit statistics.
#[derive(Debug, Default)]
pub struct WriteStats {
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Operations in those transactions.
    pub ops: AtomicU64,
    /// Failed transactions.
    pub failures: AtomicU64,
}

/// Handle to the store threads. Clone it freely; the threads stop when
/// [`StoreService::shutdown`] is called or every handle is dropped.
#[derive(Clone)]
pub struct StoreService {
    write_tx: flume::Sender<WriteOp>,
    read_tx: flume::Sender<ReadOp>,
    stats: Arc<WriteStats>,
    store: Store,
    last_id_at_open: u64,
}

/// Called by the writer after each successful commit with the smallest new key per topic.
pub type CommitHook = Box<dyn Fn(&[EventKey]) + Send>;

/// Join handles of the store threads.
pub struct StoreThreads {
    handles: Vec<JoinHandle<()>>,
}

impl StoreThreads {
    /// Waits for both threads to finish (after every [`StoreService`] is dropped).
    pub fn join(self) {
        for h in self.handles {
            let _ = h.join();
        }
    }
}

impl StoreService {
    /// Opens the store and starts its threads; every durable group is a durable redb
    /// commit (the replicated store: the Raft log is its write-ahead log). `on_commit` runs on
    /// the writer thread.
    ///
    /// # Errors
    /// The store cannot be opened.
    pub fn start(
        mode: &StoreMode,
        on_commit: CommitHook,
    ) -> Result<(Self, StoreThreads), StoreError> {
        Self::start_with(mode, on_commit, false)
    }

    /// Like [`StoreService::start`], with the write-ahead log for a disk store (standalone):
    /// replays what the last checkpoint missed, then makes groups durable through the log.
    ///
    /// # Errors
    /// The store or the log cannot be opened, or the replay failed.
    pub fn start_logged(
        mode: &StoreMode,
        on_commit: CommitHook,
    ) -> Result<(Self, StoreThreads), StoreError> {
        Self::start_with(mode, on_commit, true)
    }

    fn start_with(
        mode: &StoreMode,
        on_commit: CommitHook,
        logged: bool,
    ) -> Result<(Self, StoreThreads), StoreError> {
        let store = Store::open(mode)?;
        let wal = match mode {
            StoreMode::Disk(dir, _) if logged => Some(replay(&store, dir)?),
            _ => None,
        };
        let last_id = store.last_id()?;
        let (write_tx, write_rx) = flume::bounded(WRITE_QUEUE_MAX);
        let (read_tx, read_rx) = flume::bounded(READ_QUEUE_MAX);
        let stats = Arc::new(WriteStats::default());
        let w = {
            let store = store.clone();
            let stats = Arc::clone(&stats);
            std::thread::Builder::new()
                .name("futureq-store-w".into())
                .spawn(move || writer(&store, &write_rx, last_id, &on_commit, &stats, wal))
                .map_err(|e| StoreError::DataDir {
                    path: "writer thread".into(),
                    source: e,
                })?
        };
        let r = {
            let store = store.clone();
            std::thread::Builder::new()
                .name("futureq-store-r".into())
                .spawn(move || reader(&store, &read_rx))
                .map_err(|e| StoreError::DataDir {
                    path: "reader thread".into(),
                    source: e,
                })?
        };
        Ok((
            StoreService {
                write_tx,
                read_tx,
                stats,
                store,
                last_id_at_open: last_id,
            },
            StoreThreads {
                handles: vec![w, r],
            },
        ))
    }

    /// The highest event id stored when the store was opened: new ids must start above it.
    #[must_use]
    pub fn last_id_at_open(&self) -> u64 {
        self.last_id_at_open
    }

    /// Commit statistics.
    #[must_use]
    pub fn stats(&self) -> &WriteStats {
        &self.stats
    }

    /// The underlying store, for synchronous reads off the reactor (tests, tools).
    #[must_use]
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Stores one batch atomically and returns its keys once committed (fsynced when
    /// `durable`). Ids must be fresh: above [`StoreService::last_id_at_open`] and unique.
    ///
    /// # Errors
    /// The commit failed (nothing of the batch is stored) or the store is closed.
    pub async fn publish(
        &self,
        items: Vec<NewMessage>,
        durable: bool,
    ) -> Result<Vec<EventKey>, Arc<StoreError>> {
        request(&self.write_tx, |reply| WriteOp::Publish {
            items,
            durable,
            reply: Some(reply),
        })
        .await
    }

    /// Queues one batch without waiting for its commit (NO_ACK).
    ///
    /// # Errors
    /// The store is closed.
    pub async fn publish_no_wait(&self, items: Vec<NewMessage>) -> Result<(), Arc<StoreError>> {
        self.write_tx
            .send_async(WriteOp::Publish {
                items,
                durable: false,
                reply: None,
            })
            .await
            .map_err(|_| Arc::new(StoreError::Closed))
    }

    /// Deletes messages (and their index and expiry entries) durably; returns those that
    /// existed.
    ///
    /// # Errors
    /// The commit failed or the store is closed.
    pub async fn delete(&self, keys: Vec<EventKey>) -> Result<Vec<EventKey>, Arc<StoreError>> {
        request(&self.write_tx, |reply| WriteOp::Delete { keys, reply }).await
    }

    /// Deletes up to `limit` messages whose TTL passed at `now_ms`; returns their keys.
    ///
    /// # Errors
    /// The commit failed or the store is closed.
    pub async fn sweep_expired(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<EventKey>, Arc<StoreError>> {
        request(&self.write_tx, |reply| WriteOp::Sweep {
            now_ms,
            limit,
            reply,
        })
        .await
    }

    /// Reads a due range.
    ///
    /// # Errors
    /// A storage error or the store is closed.
    pub async fn scan(&self, req: ScanRequest) -> Result<ScanResult, Arc<StoreError>> {
        request(&self.read_tx, |reply| ReadOp { req, reply }).await
    }
}

/// Sends `make(reply)` to a store thread and awaits the reply.
async fn request<Op, T>(
    tx: &flume::Sender<Op>,
    make: impl FnOnce(Reply<T>) -> Op,
) -> Result<T, Arc<StoreError>> {
    let (reply, rx) = oneshot::channel();
    tx.send_async(make(reply))
        .await
        .map_err(|_| Arc::new(StoreError::Closed))?;
    rx.await.map_err(|_| Arc::new(StoreError::Closed))?
}

/// The write-ahead log, the number of its next record, and when it was last synced.
struct Logged {
    wal: Wal,
    next_seq: u64,
    last_sync: Instant,
}

/// Opens the log in `dir`, replays into `store` the records its last checkpoint does not
/// contain, checkpoints, and returns the log ready for appends.
fn replay(store: &Store, dir: &std::path::Path) -> Result<Logged, StoreError> {
    let (mut wal, records) = Wal::open(dir, WAL_BYTES)?;
    let mut last = store.wal_seq()?;
    let mut last_id = store.last_id()?;
    let mut replayed = 0usize;
    for (seq, rec) in records {
        if seq <= last {
            continue; // from before the last checkpoint
        }
        if seq != last + 1 {
            return Err(StoreError::Wal(format!(
                "the write-ahead log continues at record {seq} but the database holds records up to {last}"
            )));
        }
        let deletes = rec.deletes;
        store.commit_group(&[&rec.puts], &deletes, None, &mut last_id, false, None)?;
        last = seq;
        replayed += 1;
    }
    store.checkpoint(last)?;
    wal.restart();
    if replayed > 0 {
        tracing::info!(target: "storage", records = replayed, "replayed the write-ahead log");
    }
    Ok(Logged {
        wal,
        next_seq: last + 1,
        last_sync: Instant::now(),
    })
}

fn writer(
    store: &Store,
    rx: &flume::Receiver<WriteOp>,
    mut last_id: u64,
    on_commit: &CommitHook,
    stats: &WriteStats,
    mut logged: Option<Logged>,
) {
    let mut last_durable = Instant::now();
    while let Ok(first) = rx.recv() {
        let mut bytes = first.bytes();
        let mut group = vec![first];
        while group.len() < GROUP_OPS_MAX && bytes < GROUP_BYTES_MAX {
            match rx.try_recv() {
                Ok(op) => {
                    bytes += op.bytes();
                    group.push(op);
                }
                Err(_) => break,
            }
        }
        let mut batches: Vec<&[NewMessage]> = Vec::new();
        let mut deletes = Vec::new();
        let mut sweep: Option<(i64, usize)> = None;
        let mut durable = false;
        for op in &group {
            match op {
                WriteOp::Publish {
                    items, durable: d, ..
                } => {
                    batches.push(items);
                    durable |= *d;
                }
                WriteOp::Delete { keys, .. } => {
                    deletes.extend_from_slice(keys);
                    durable = true;
                }
                WriteOp::Sweep { now_ms, limit, .. } => {
                    sweep = Some((*now_ms, *limit));
                    durable = true;
                }
            }
        }
        let g = Group {
            batches: &batches,
            deletes: &deletes,
            sweep,
            durable,
        };
        let result = match logged.as_mut() {
            Some(l) => {
                let (result, log_ok) = commit_logged(store, l, &g, &mut last_id, &mut last_durable);
                if !log_ok {
                    logged = None;
                }
                result
            }
            None => {
                // Non-durable commits keep their pages in memory until a durable one: bound that.
                let durable = durable || last_durable.elapsed() >= DURABLE_COMMIT_INTERVAL_MAX;
                let r = store.commit_group(&batches, &deletes, sweep, &mut last_id, durable, None);
                if durable && r.is_ok() {
                    last_durable = Instant::now();
                }
                r
            }
        };
        stats.ops.fetch_add(group.len() as u64, Ordering::Relaxed);
        match result {
            Ok(out) => {
                stats.commits.fetch_add(1, Ordering::Relaxed);
                let mins = out.min_key_per_topic();
                if !mins.is_empty() {
                    on_commit(&mins);
                }
                answer(group, Ok(out));
            }
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(target: "storage", error = %e, ops = group.len(), "group commit failed");
                answer(group, Err(Arc::new(e)));
            }
        }
    }
    // A clean stop checkpoints, so that the next start has nothing to replay.
    if let Some(l) = logged {
        if let Err(e) = store.checkpoint(l.next_seq - 1) {
            tracing::error!(target: "storage", error = %e, "final checkpoint failed; the next start replays the write-ahead log");
        }
    }
    tracing::debug!(target: "storage", "writer thread stopped");
}

/// One group's operations, as the writer collected them.
struct Group<'a> {
    batches: &'a [&'a [NewMessage]],
    deletes: &'a [EventKey],
    sweep: Option<(i64, usize)>,
    /// Some operation waits for durability (QUORUM/LEADER publish, delete, sweep).
    durable: bool,
}

/// Commits `g` with the write-ahead log: a checkpoint (durable redb commit, log restarted)
/// when one is due, else a non-durable redb commit plus one log record, fsynced when the group
/// waits for durability (or the last sync is [`DURABLE_COMMIT_INTERVAL_MAX`] old). The flag is
/// false when the log failed: the group was then made durable by a checkpoint instead, and the
/// writer goes on without the log.
fn commit_logged(
    store: &Store,
    l: &mut Logged,
    g: &Group<'_>,
    last_id: &mut u64,
    last_durable: &mut Instant,
) -> (Result<GroupOutcome, StoreError>, bool) {
    let due = last_durable.elapsed() >= CHECKPOINT_INTERVAL || l.wal.used() > l.wal.capacity() / 2;
    let checkpoint = |store: &Store, l: &mut Logged, last_durable: &mut Instant| {
        store.checkpoint(l.next_seq - 1).map(|()| {
            l.wal.restart();
            *last_durable = Instant::now();
        })
    };
    if due {
        let r = store.commit_group(
            g.batches,
            g.deletes,
            g.sweep,
            last_id,
            true,
            Some(l.next_seq - 1),
        );
        if r.is_ok() {
            l.wal.restart();
            *last_durable = Instant::now();
        }
        return (r, true);
    }
    let out = match store.commit_group(g.batches, g.deletes, g.sweep, last_id, false, None) {
        Ok(out) => out,
        Err(e) => return (Err(e), true),
    };
    let removed: [&[EventKey]; 2] = [&out.deleted, &out.expired];
    let logged = l
        .wal
        .append_parts(l.next_seq, g.batches, &removed)
        .and_then(|fits| {
            if fits && (g.durable || l.last_sync.elapsed() >= DURABLE_COMMIT_INTERVAL_MAX) {
                l.wal.sync()?;
                l.last_sync = Instant::now();
            }
            Ok(fits)
        });
    match logged {
        Ok(true) => {
            l.next_seq += 1;
            (Ok(out), true)
        }
        // Too big for what is left of the log: make it durable in redb instead.
        Ok(false) => (checkpoint(store, l, last_durable).map(|()| out), true),
        Err(e) => {
            tracing::error!(target: "storage", error = %e, "write-ahead log failed; committing durably to the database from now on");
            // The failed record may be on disk: the checkpoint claims its number, so that a
            // later start never replays it over newer changes.
            l.next_seq += 1;
            (checkpoint(store, l, last_durable).map(|()| out), false)
        }
    }
}

fn answer(group: Vec<WriteOp>, result: Result<GroupOutcome, Arc<StoreError>>) {
    let mut out = match result {
        Ok(o) => o,
        Err(e) => {
            for op in group {
                let _ = match op {
                    WriteOp::Publish { reply: Some(r), .. } => r.send(Err(Arc::clone(&e))),
                    WriteOp::Publish { reply: None, .. } => Ok(()),
                    WriteOp::Delete { reply, .. } | WriteOp::Sweep { reply, .. } => {
                        reply.send(Err(Arc::clone(&e)))
                    }
                };
            }
            return;
        }
    };
    let mut published = std::mem::take(&mut out.published).into_iter();
    let mut deleted = Some(std::mem::take(&mut out.deleted));
    let mut expired = Some(std::mem::take(&mut out.expired));
    for op in group {
        match op {
            WriteOp::Publish { reply, .. } => {
                let keys = published.next().unwrap_or_default();
                if let Some(r) = reply {
                    let _ = r.send(Ok(keys));
                }
            }
            // Every delete op of the group shares one answer: the keys deleted in the group.
            WriteOp::Delete { reply, .. } => {
                let _ = reply.send(Ok(deleted.take().unwrap_or_default()));
            }
            WriteOp::Sweep { reply, .. } => {
                let _ = reply.send(Ok(expired.take().unwrap_or_default()));
            }
        }
    }
}

fn reader(store: &Store, rx: &flume::Receiver<ReadOp>) {
    while let Ok(op) = rx.recv() {
        let _ = op.reply.send(store.scan(&op.req).map_err(Arc::new));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::WalRecord;
    use bytes::Bytes;

    fn put(id: u64) -> NewMessage {
        NewMessage {
            key: EventKey::new(7, 1, id),
            expires_at_ms: None,
            index_keys: vec![],
            value: Bytes::from(vec![1, 2, 3]),
        }
    }

    fn disk(dir: &std::path::Path) -> Store {
        Store::open(&StoreMode::Disk(dir.to_owned(), 1 << 20)).unwrap()
    }

    #[test]
    fn replay_applies_exactly_the_records_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        {
            // The database holds records up to 1 (a checkpoint); the log has 1..=3, as after
            // a crash between two checkpoints.
            store.checkpoint(1).unwrap();
            let (mut wal, _) = Wal::open(dir.path(), WAL_BYTES).unwrap();
            for (seq, id) in [(1, 1), (2, 2), (3, 3)] {
                let rec = WalRecord {
                    puts: vec![put(id)],
                    deletes: if seq == 3 {
                        vec![EventKey::new(7, 1, 2)]
                    } else {
                        vec![]
                    },
                };
                assert!(wal.append(seq, &rec).unwrap());
            }
            wal.sync().unwrap();
        }
        let l = replay(&store, dir.path()).unwrap();
        assert_eq!(l.next_seq, 4);
        assert_eq!(store.wal_seq().unwrap(), 3);
        // Record 1 was already in the database (and is not applied again); 2 put id 2 and
        // 3 deleted it again and put id 3.
        assert!(store.get(&put(1).key).unwrap().is_none());
        assert!(store.get(&put(2).key).unwrap().is_none());
        assert!(store.get(&put(3).key).unwrap().is_some());
        assert_eq!(store.last_id().unwrap(), 3);
        assert_eq!(l.wal.used(), 0, "appends start over at offset 0");
    }

    #[test]
    fn replay_refuses_a_log_that_skips_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        {
            let (mut wal, _) = Wal::open(dir.path(), WAL_BYTES).unwrap();
            assert!(wal.append(5, &WalRecord::default()).unwrap());
            wal.sync().unwrap();
        }
        let err = replay(&store, dir.path()).err().expect("a gap is refused");
        assert!(err.to_string().contains("continues at record 5"), "{err}");
    }

    #[test]
    fn logged_groups_survive_without_a_final_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        let mut l = replay(&store, dir.path()).unwrap();
        let (mut last_id, mut last_durable) = (0, Instant::now());
        let batch = [put(10), put(11)];
        let g = Group {
            batches: &[&batch],
            deletes: &[],
            sweep: None,
            durable: true,
        };
        let (r, ok) = commit_logged(&store, &mut l, &g, &mut last_id, &mut last_durable);
        assert!(ok && r.is_ok());
        assert_eq!(l.next_seq, 2, "one record appended, no checkpoint");
        assert_eq!(store.wal_seq().unwrap(), 0);
        // The record replays onto the checkpointed state: a new process would find both.
        drop(l);
        let l = replay(&store, dir.path()).unwrap();
        assert_eq!(l.next_seq, 2);
        assert_eq!(store.wal_seq().unwrap(), 1);
        assert!(store.get(&put(11).key).unwrap().is_some());
    }
}
