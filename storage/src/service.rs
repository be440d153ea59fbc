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
use crate::wal::{Wal, WalMark, WAL_BYTES};
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
    /// Durable points: write-ahead log fsyncs and durable commits (checkpoints).
    pub syncs: AtomicU64,
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
    /// A record was appended without fsync (NO_ACK) since this instant.
    unsynced_since: Option<Instant>,
}

/// Opens the log in `dir`, replays into `store` the records its last checkpoint does not
/// contain, checkpoints, and returns the log ready for appends.
fn replay(store: &Store, dir: &std::path::Path) -> Result<Logged, StoreError> {
    let mark = store.wal_mark()?;
    let mut last = mark.seq;
    let (mut wal, records) = Wal::open(dir, WAL_BYTES, mark)?;
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
    let mark = WalMark::after(last);
    store.checkpoint(mark)?;
    wal.restart(mark);
    if replayed > 0 {
        tracing::info!(target: "storage", records = replayed, "replayed the write-ahead log");
    }
    Ok(Logged {
        wal,
        next_seq: last + 1,
        last_sync: Instant::now(),
        unsynced_since: None,
    })
}

/// The writer's durability state.
struct Durability {
    /// The write-ahead log, while it works.
    logged: Option<Logged>,
    /// After the log failed: the last record number that may be in its file. Every durable
    /// commit records it as the checkpoint, so that a later start never replays those
    /// records over newer changes (the checkpoint right after the failure may have failed
    /// too).
    claimed: Option<u64>,
    /// Last durable point (a durable commit, or a checkpoint with the log).
    last_durable: Instant,
    /// Without the log: a non-durable commit was made since this instant.
    volatile_since: Option<Instant>,
}

impl Durability {
    /// When the oldest change that nothing made durable yet must be: the writer does not
    /// sleep past it, even when no more work comes (NO_ACK data stays volatile at most
    /// [`DURABLE_COMMIT_INTERVAL_MAX`]).
    fn deadline(&self) -> Option<Instant> {
        let since = match &self.logged {
            Some(l) => l.unsynced_since,
            None => self.volatile_since,
        };
        since.map(|t| t + DURABLE_COMMIT_INTERVAL_MAX)
    }

    /// Makes everything committed so far durable (the idle deadline passed). A failed log
    /// fsync ends the log, as in [`commit_logged`]: its unsynced pages may be gone, so the
    /// writer claims its records and goes on with durable commits.
    fn make_durable(&mut self, store: &Store, last_id: &mut u64, stats: &WriteStats) {
        if let Some(l) = self.logged.as_mut() {
            match l.wal.sync() {
                Ok(()) => {
                    l.last_sync = Instant::now();
                    l.unsynced_since = None;
                    stats.syncs.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(e) => {
                    tracing::error!(target: "storage", error = %e, "write-ahead log fsync failed; committing durably to the database from now on");
                    self.claimed = Some(l.next_seq - 1);
                    self.logged = None;
                    // The database holds every group already (non-durably): make it durable.
                    self.volatile_since = Some(Instant::now());
                }
            }
        }
        let claim = self.claimed.map(WalMark::after);
        match store.commit_group(&[], &[], None, last_id, true, claim) {
            Ok(_) => {
                self.last_durable = Instant::now();
                self.volatile_since = None;
                stats.syncs.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::error!(target: "storage", error = %e, "making idle changes durable failed; retrying");
                // Retry one interval later, not at once: do not spin on a failing disk.
                self.volatile_since = Some(Instant::now());
            }
        }
    }
}

fn writer(
    store: &Store,
    rx: &flume::Receiver<WriteOp>,
    mut last_id: u64,
    on_commit: &CommitHook,
    stats: &WriteStats,
    logged: Option<Logged>,
) {
    let mut d = Durability {
        logged,
        claimed: None,
        last_durable: Instant::now(),
        volatile_since: None,
    };
    loop {
        let first = match d.deadline() {
            Some(at) => match rx.recv_deadline(at) {
                Ok(op) => op,
                Err(flume::RecvTimeoutError::Timeout) => {
                    d.make_durable(store, &mut last_id, stats);
                    continue;
                }
                Err(flume::RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(op) => op,
                Err(_) => break,
            },
        };
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
        let result = match d.logged.as_mut() {
            Some(l) => {
                let (result, log_ok) =
                    commit_logged(store, l, &g, &mut last_id, &mut d.last_durable, stats);
                if !log_ok {
                    d.claimed = Some(l.next_seq - 1);
                    d.logged = None;
                }
                result
            }
            None => commit_unlogged(store, &mut d, &g, &mut last_id, stats),
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
    let last = d.logged.map(|l| l.next_seq - 1).or(d.claimed);
    if let Some(seq) = last {
        if let Err(e) = store.checkpoint(WalMark::after(seq)) {
            tracing::error!(target: "storage", error = %e, "final checkpoint failed; the next start replays the write-ahead log");
        }
    }
    tracing::debug!(target: "storage", "writer thread stopped");
}

/// Commits `g` without the write-ahead log (it failed): durably when the group waits for
/// durability or the last durable commit is [`DURABLE_COMMIT_INTERVAL_MAX`] old, recording the
/// claimed log position with every durable commit.
fn commit_unlogged(
    store: &Store,
    d: &mut Durability,
    g: &Group<'_>,
    last_id: &mut u64,
    stats: &WriteStats,
) -> Result<GroupOutcome, StoreError> {
    // Non-durable commits keep their pages in memory until a durable one: bound that.
    let durable = g.durable || d.last_durable.elapsed() >= DURABLE_COMMIT_INTERVAL_MAX;
    let checkpoint = if durable {
        d.claimed.map(WalMark::after)
    } else {
        None
    };
    let r = store.commit_group(g.batches, g.deletes, g.sweep, last_id, durable, checkpoint);
    if r.is_ok() {
        if durable {
            d.last_durable = Instant::now();
            d.volatile_since = None;
            stats.syncs.fetch_add(1, Ordering::Relaxed);
        } else if d.volatile_since.is_none() {
            d.volatile_since = Some(Instant::now());
        }
    }
    r
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
/// false when the log failed (the group was then made durable by a checkpoint instead) or a
/// checkpoint failed: the writer goes on without the log. A failed checkpoint may still have
/// reached the disk with its new cycle id, and records appended in the old cycle would then be
/// invisible to the next start: never append after one.
fn commit_logged(
    store: &Store,
    l: &mut Logged,
    g: &Group<'_>,
    last_id: &mut u64,
    last_durable: &mut Instant,
    stats: &WriteStats,
) -> (Result<GroupOutcome, StoreError>, bool) {
    let due = last_durable.elapsed() >= CHECKPOINT_INTERVAL || l.wal.used() > l.wal.capacity() / 2;
    let checkpoint = |store: &Store, l: &mut Logged, last_durable: &mut Instant| {
        let mark = WalMark::after(l.next_seq - 1);
        store.checkpoint(mark).map(|()| {
            l.wal.restart(mark);
            l.unsynced_since = None;
            *last_durable = Instant::now();
            stats.syncs.fetch_add(1, Ordering::Relaxed);
        })
    };
    if due {
        let mark = WalMark::after(l.next_seq - 1);
        let r = store.commit_group(g.batches, g.deletes, g.sweep, last_id, true, Some(mark));
        let ok = r.is_ok();
        if ok {
            l.wal.restart(mark);
            l.unsynced_since = None;
            *last_durable = Instant::now();
            stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        return (r, ok);
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
                l.unsynced_since = None;
                stats.syncs.fetch_add(1, Ordering::Relaxed);
            } else if fits && l.unsynced_since.is_none() {
                l.unsynced_since = Some(Instant::now());
            }
            Ok(fits)
        });
    match logged {
        Ok(true) => {
            l.next_seq += 1;
            (Ok(out), true)
        }
        // Too big for what is left of the log: make it durable in redb instead.
        Ok(false) => {
            let r = checkpoint(store, l, last_durable);
            let ok = r.is_ok();
            (r.map(|()| out), ok)
        }
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
    use std::os::unix::fs::FileExt;

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
            let mark = WalMark::after(1);
            store.checkpoint(mark).unwrap();
            let (mut wal, _) = Wal::open(dir.path(), WAL_BYTES, mark).unwrap();
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
            let mark = WalMark::after(0);
            store.checkpoint(mark).unwrap();
            let (mut wal, _) = Wal::open(dir.path(), WAL_BYTES, mark).unwrap();
            assert!(wal.append(5, &WalRecord::default()).unwrap());
            wal.sync().unwrap();
        }
        let err = replay(&store, dir.path()).err().expect("a gap is refused");
        assert!(err.to_string().contains("continues at record 5"), "{err}");
    }

    /// Appends records 1..=4 to a fresh log of `store` in `dir`, each fsynced when
    /// `synced(seq)`, and flips a byte of record 2's body (bit rot, or a torn write).
    fn log_with_bad_record_2(store: &Store, dir: &std::path::Path, synced: fn(u64) -> bool) {
        let mark = WalMark::after(0);
        store.checkpoint(mark).unwrap();
        let (mut wal, _) = Wal::open(dir, WAL_BYTES, mark).unwrap();
        let mut start_of_2 = 0;
        for seq in 1..=4 {
            if seq == 2 {
                start_of_2 = wal.used();
            }
            let rec = WalRecord {
                puts: vec![put(seq)],
                deletes: vec![],
            };
            assert!(wal.append(seq, &rec).unwrap());
            if synced(seq) {
                wal.sync().unwrap();
            }
        }
        wal.sync().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(crate::wal::WAL_FILE))
            .unwrap();
        // Past the 32-byte header, inside the message's key.
        let at = start_of_2 + 38;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    }

    /// Issue 10.8: a record that was fsynced (acknowledged) and no longer reads back, with
    /// durable records after it, is corruption: refused, never truncated silently (the acked
    /// records 2..=4 were dropped without a word).
    #[test]
    fn a_durable_record_that_does_not_read_back_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        log_with_bad_record_2(&store, dir.path(), |_| true);
        let err = replay(&store, dir.path())
            .err()
            .expect("mid-log corruption is refused");
        let text = err.to_string();
        assert!(
            text.contains("corrupt") && text.contains("record 2"),
            "{text}"
        );
        assert!(store.get(&put(1).key).unwrap().is_none(), "nothing applied");
    }

    /// A record torn by a crash before its fsync ends the replay, even when a later record
    /// (also never fsynced before it was written) reached the disk whole: nothing of either
    /// was acknowledged as durable.
    #[test]
    fn a_torn_record_that_was_never_synced_ends_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        log_with_bad_record_2(&store, dir.path(), |seq| seq == 1);
        let l = replay(&store, dir.path()).unwrap();
        assert_eq!(l.next_seq, 2);
        assert!(store.get(&put(1).key).unwrap().is_some());
        assert!(store.get(&put(3).key).unwrap().is_none());
    }

    /// A checkpoint that falls due in a group commit starts a cycle the database records:
    /// the next start reads the records appended after it.
    #[test]
    fn records_after_a_due_checkpoint_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        let mut l = replay(&store, dir.path()).unwrap();
        let stats = WriteStats::default();
        let mut last_id = 0;
        let mut last_durable = Instant::now().checked_sub(CHECKPOINT_INTERVAL * 2).unwrap();
        for id in [1, 2] {
            let batch = [put(id)];
            let g = Group {
                batches: &[&batch],
                deletes: &[],
                sweep: None,
                durable: true,
            };
            let (r, ok) =
                commit_logged(&store, &mut l, &g, &mut last_id, &mut last_durable, &stats);
            assert!(ok && r.is_ok());
        }
        assert_eq!(
            store.wal_mark().unwrap().seq,
            0,
            "group 1 was the checkpoint"
        );
        drop(l);
        let (_, found) = Wal::open(dir.path(), WAL_BYTES, store.wal_mark().unwrap()).unwrap();
        assert_eq!(found.len(), 1, "group 2 is in the checkpoint's cycle");
        assert_eq!(found[0].1.puts, vec![put(2)]);
    }

    /// A database from before cycle ids replays its log in the old format once; the
    /// checkpoint after it starts a cycle, and the next start has nothing to replay.
    #[test]
    fn a_log_from_before_cycle_ids_is_replayed_then_checkpointed() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        let old = crate::wal::unversioned_log(&[
            (
                1,
                WalRecord {
                    puts: vec![put(1)],
                    deletes: vec![],
                },
            ),
            (
                2,
                WalRecord {
                    puts: vec![put(2)],
                    deletes: vec![],
                },
            ),
        ]);
        std::fs::write(dir.path().join(crate::wal::WAL_FILE), old).unwrap();
        let l = replay(&store, dir.path()).unwrap();
        assert_eq!(l.next_seq, 3);
        assert!(store.get(&put(2).key).unwrap().is_some());
        let mark = store.wal_mark().unwrap();
        assert!(mark.seq == 2 && mark.cycle != 0, "{mark:?}");
        drop(l);
        let l = replay(&store, dir.path()).unwrap();
        assert_eq!(l.next_seq, 3);
        assert_ne!(store.wal_mark().unwrap().cycle, 0);
    }

    /// Issue 10.8: the log failed and the checkpoint that should have claimed its records
    /// failed too; later durable commits (an ACK's delete) must still keep a restart from
    /// replaying those records over them (it resurrected the ACKed message).
    #[test]
    fn after_a_double_fault_a_restart_never_resurrects_acked_messages() {
        let dir = tempfile::tempdir().unwrap();
        let store = disk(dir.path());
        let mut l = replay(&store, dir.path()).unwrap();
        let (mut last_id, mut last_durable) = (0, Instant::now());
        let stats = WriteStats::default();
        let batch = [put(1)];
        let g = Group {
            batches: &[&batch],
            deletes: &[],
            sweep: None,
            durable: true,
        };
        let (r, ok) = commit_logged(&store, &mut l, &g, &mut last_id, &mut last_durable, &stats);
        assert!(ok && r.is_ok());
        assert_eq!(store.wal_seq().unwrap(), 0, "record 1 is in the log only");
        // The log fails now, and so does the checkpoint claiming it: the writer goes on
        // without the log, claiming record 1.
        let mut d = Durability {
            logged: None,
            claimed: Some(l.next_seq - 1),
            last_durable: Instant::now(),
            volatile_since: None,
        };
        drop(l);
        let ack = [put(1).key];
        let del = Group {
            batches: &[],
            deletes: &ack,
            sweep: None,
            durable: true,
        };
        commit_unlogged(&store, &mut d, &del, &mut last_id, &stats).unwrap();
        assert!(store.get(&put(1).key).unwrap().is_none());
        // A restart replays what the database does not contain: nothing.
        replay(&store, dir.path()).unwrap();
        assert!(
            store.get(&put(1).key).unwrap().is_none(),
            "the ACKed message came back"
        );
    }

    /// Issue 10.8: a NO_ACK group's log record is fsynced within
    /// DURABLE_COMMIT_INTERVAL_MAX even when no other work follows.
    #[test]
    fn no_ack_records_become_durable_while_the_store_is_idle() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, threads) = StoreService::start_logged(
            &StoreMode::Disk(dir.path().to_owned(), 1 << 20),
            Box::new(|_| {}),
        )
        .unwrap();
        futures::executor::block_on(svc.publish(vec![put(1)], true)).unwrap();
        let synced = svc.stats().syncs.load(Ordering::Relaxed);
        futures::executor::block_on(svc.publish(vec![put(2)], false)).unwrap();
        std::thread::sleep(DURABLE_COMMIT_INTERVAL_MAX * 4);
        assert!(
            svc.stats().syncs.load(Ordering::Relaxed) > synced,
            "the NO_ACK record stayed volatile while the store was idle"
        );
        drop(svc);
        threads.join();
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
        let stats = WriteStats::default();
        let (r, ok) = commit_logged(&store, &mut l, &g, &mut last_id, &mut last_durable, &stats);
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
