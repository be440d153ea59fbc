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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futureq_core::hub::{ScanRequest, ScanResult};
use futureq_core::EventKey;
use futures::channel::oneshot;

use crate::store::{GroupOutcome, NewMessage, Store, StoreMode};
use crate::StoreError;

/// Most operations in one group commit.
pub const GROUP_OPS_MAX: usize = 4096;
/// Most payload bytes in one group commit (bounds the transaction's memory).
pub const GROUP_BYTES_MAX: usize = 64 << 20;
/// Capacity of the writer's queue (operations).
pub const WRITE_QUEUE_MAX: usize = 1024;
/// Longest run of non-durable (NO_ACK-only) commits: redb keeps their pages in memory until a
/// durable commit, and NO_ACK data should not stay volatile for long.
pub const DURABLE_COMMIT_INTERVAL_MAX: Duration = Duration::from_millis(50);
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
    /// Opens the store and starts its threads. `on_commit` runs on the writer thread.
    ///
    /// # Errors
    /// The store cannot be opened.
    pub fn start(
        mode: &StoreMode,
        on_commit: CommitHook,
    ) -> Result<(Self, StoreThreads), StoreError> {
        let store = Store::open(mode)?;
        let last_id = store.last_id()?;
        let (write_tx, write_rx) = flume::bounded(WRITE_QUEUE_MAX);
        let (read_tx, read_rx) = flume::bounded(READ_QUEUE_MAX);
        let stats = Arc::new(WriteStats::default());
        let w = {
            let store = store.clone();
            let stats = Arc::clone(&stats);
            std::thread::Builder::new()
                .name("futureq-store-w".into())
                .spawn(move || writer(&store, &write_rx, last_id, &on_commit, &stats))
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

fn writer(
    store: &Store,
    rx: &flume::Receiver<WriteOp>,
    mut last_id: u64,
    on_commit: &CommitHook,
    stats: &WriteStats,
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
        // Non-durable commits keep their pages in memory until a durable one: bound that.
        if !durable && last_durable.elapsed() >= DURABLE_COMMIT_INTERVAL_MAX {
            durable = true;
        }
        let result = store.commit_group(&batches, &deletes, sweep, &mut last_id, durable);
        if durable && result.is_ok() {
            last_durable = Instant::now();
        }
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
    tracing::debug!(target: "storage", "writer thread stopped");
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
