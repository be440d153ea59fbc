//! The local journal: the standalone broker's write path, over the same log and the same
//! apply as a Raft replica.
//!
//! A write is an rkyv command ([`futureq_core::command`]: `StoreBatch`, `DeleteBatch`,
//! `RegisterGroup`) appended as one entry to the segmented log ([`crate::log::Log`]: io_uring,
//! group commit, CRC, torn-tail recovery, poisoning on a failed fsync), then applied into redb
//! by [`Store::apply_entries`], the code every Raft replica applies its committed entries with.
//!
//! - **Pipelined.** The log's flusher fsyncs everything appended while the previous fsync ran;
//!   the applier applies every entry flushed so far in one redb transaction (on a blocking
//!   thread) while the next group is written. Waiters are answered once their entry is
//!   applied.
//! - **Ids in log order.** Event ids are assigned when the entry is appended, on the journal's
//!   executor: ids ascend with log indexes, as the apply requires.
//! - **Durability.** An entry is durable when its fsync returns. Applies commit redb without
//!   fsync, except when [`DurableApplies`] says one is due (and after an idle interval); the
//!   log is purged only up to the last durably applied index (whole segments, never the
//!   newest), so a crash replays the entries the store may have lost (the apply skips
//!   entries at or below its applied index).
//! - **Failure.** A failed log write or fsync poisons the log, a failed apply the journal:
//!   every waiting and later write fails, and [`Journal::failed`] says why (the broker exits,
//!   as a Raft node does, and restarts from what is durable).
//!
//! # Invariants
//! - Entries are applied in log order, each exactly once per process; an entry is applied
//!   only after the fsync that made it durable.
//! - The log is never purged past the store's durably applied index.
//! - Event ids never regress: the first id handed out is above the store's `last-id` after
//!   the replay, and each entry's ids are above the previous entry's.
//! - **A tag names one message, across crashes.** Ids are handed out at most
//!   [`futureq_core::command::IDS_UNAPPLIED_MAX`] above the store's applied `last-id`, and
//!   open reserves that many above the replayed mark ([`Store::reserve_ids`]) before the
//!   first: an id handed out for an entry a crash cut (a NO_ACK write) is never reused.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use futureq_core::command::{
    encode_cancel, encode_delete, encode_delete_group, encode_register_group, encode_store, Answer,
    Cancel, DeleteBatch, DeleteGroup, RegisterGroup, StoreBatch, StoreItem, WithId,
};
use futureq_core::{EventKey, TopicHash};
use futures::channel::oneshot;

use crate::durability::DurableApplies;
use crate::log::io::LogIo;
use crate::log::{FlushError, Log, LogConfig, LogError, LogIndex, Term};
use crate::store::{Refusal, Store};
use crate::StoreError;

/// How often a stopping journal looks whether its log started waiting for disk space.
const STOP_POLL: Duration = Duration::from_millis(100);
/// Most entries appended and not yet applied; a writer waits beyond it (NO_ACK writes would
/// otherwise outrun the disk without bound).
pub const UNAPPLIED_MAX: usize = 4096;
/// Most bytes of entries appended and not yet applied.
pub const UNAPPLIED_BYTES_MAX: usize = 128 << 20;
/// Most ids handed out above the store's applied `last-id` before a write waits. With the
/// ids of one entry (far fewer than this) the ids handed out stay within
/// [`futureq_core::command::IDS_UNAPPLIED_MAX`] of the applied mark, which the reservation at
/// open skips.
const IDS_AHEAD_MAX: u64 = futureq_core::command::IDS_UNAPPLIED_MAX / 2;
/// How often a long replay logs its progress.
const REPLAY_PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Most entries in one apply transaction; it stops taking entries once it holds
/// [`APPLY_BYTES_MAX`] bytes (a larger entry, up to `ENTRY_BYTES_MAX`, goes alone). A writer
/// that finds [`UNAPPLIED_BYTES_MAX`] unapplied waits for an apply to end, so an apply's
/// length is how long such waits last: with 64 MiB the applier took all that was flushed, each apply grew
/// behind the last (5, 11, 31, then 67 MB, 0.8 s) and a closed loop of 100 messages per request
/// waited up to 1.36 s; with 2 MiB at most 143 ms, at the same throughput (docs/benchmarks.md,
/// issue 29 fourth round).
const APPLY_ENTRIES_MAX: usize = 4096;
const APPLY_BYTES_MAX: usize = 2 << 20;
/// [`APPLY_BYTES_MAX`] at replay, where no writer waits: fewer, larger transactions (as every
/// apply had before the bound above).
const REPLAY_BYTES_MAX: usize = 64 << 20;

/// Journal configuration.
#[derive(Debug, Clone, Copy)]
pub struct JournalConfig {
    /// The log's segments and read cache.
    pub log: LogConfig,
    /// Longest run of non-durable applies
    /// ([`crate::durability::JOURNAL_DURABLE_APPLY_INTERVAL`]).
    pub durable_interval: Duration,
}

/// Why a journal write failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The journal failed earlier (a log write or fsync, or an apply); nothing more is
    /// written until the process restarts from what is durable.
    #[error("the journal failed ({reason}); restart the broker")]
    Failed {
        /// What failed.
        reason: Rc<str>,
    },
    /// The log refused the append (an entry larger than a segment); nothing was stored and
    /// the journal goes on.
    #[error("write not appended ({reason}); nothing of it was stored")]
    NotAppended {
        /// Why.
        reason: Rc<str>,
    },
    /// The apply refused the entry (it changed nothing).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The journal stopped before the write was appended: nothing of it was stored (a write
    /// appended before the stop is flushed and applied by the stop).
    #[error("the journal is stopped")]
    Stopped,
    /// The journal stopped after the write was appended and before its outcome was known (a
    /// flush abandoned by a failure, a stop cut short): it may have been stored, and a
    /// restart replays it if its fsync reached the disk.
    #[error("the journal stopped before the write's outcome was known; it may have been stored")]
    Abandoned,
    /// The apply did not answer a command that has an answer (a defect).
    #[error("the apply did not answer the command")]
    Unanswered,
}

/// Why the journal could not open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The log could not be opened or read (I/O, or damage to durable entries).
    #[error("journal log: {0}")]
    Log(#[from] LogError),
    /// The store could not be read or the replay could not be applied.
    #[error("journal replay: {0}")]
    Store(#[from] StoreError),
    /// The log starts after the store's applied index: entries in between are gone.
    #[error("the journal starts at entry {first} but the store has applied only up to {applied}: entries in between are missing")]
    Gap {
        /// First entry in the log.
        first: u64,
        /// The store's applied index.
        applied: u64,
    },
    /// An entry inside the log's bounds could not be read.
    #[error("journal entry {index} is missing inside the log")]
    Missing {
        /// The entry.
        index: u64,
    },
}

/// How long a write waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until it is appended (lost if the process dies before its fsync).
    Appended,
    /// Until the fsync that made it durable (its apply follows; a crash replays it).
    Durable,
    /// Until it is durable and applied to the store.
    Applied,
}

/// Sees what each apply changed: the smallest stored key per topic, and the deleted keys.
pub type OnApplied = Box<dyn Fn(&[EventKey], &[EventKey])>;

type Waiter = oneshot::Sender<Result<Answer, JournalError>>;

/// An entry appended and not yet applied.
struct Pending {
    index: u64,
    bytes: Vec<u8>,
    waiter: Option<Waiter>,
}

struct State {
    next_index: u64,
    next_id: u64,
    /// Highest index whose fsync returned.
    flushed: u64,
    /// Entries appended, not applied, in index order.
    queue: VecDeque<Pending>,
    queue_bytes: usize,
    failed: Option<Rc<str>>,
    stopped: bool,
}

struct Inner<I: LogIo> {
    log: Log<I>,
    store: Store,
    on_applied: OnApplied,
    durable_interval: Duration,
    st: RefCell<State>,
    /// Notified when entries were flushed or applied, or the journal failed or stopped.
    changed: event_listener::Event,
    /// Number of applies, for tests and metrics.
    applies: Cell<u64>,
}

/// The journal (cheap to clone; single-threaded: it lives on one executor).
pub struct Journal<I: LogIo + 'static>(Rc<Inner<I>>);

impl<I: LogIo + 'static> Clone for Journal<I> {
    fn clone(&self) -> Self {
        Journal(Rc::clone(&self.0))
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    glommio::executor().spawn_blocking(f).await
}

/// Applies entries `(index, term, command)` in one transaction, off the reactor.
async fn apply(
    store: &Store,
    entries: Vec<(u64, u64, Vec<u8>)>,
    durable: bool,
) -> Result<crate::ApplyOutcome, StoreError> {
    let store = store.clone();
    blocking(move || {
        let refs: Vec<(u64, u64, &[u8])> = entries
            .iter()
            .map(|(i, t, c)| (*i, *t, c.as_slice()))
            .collect();
        store.apply_entries(&refs, &[], durable)
    })
    .await
}

impl<I: LogIo + 'static> Journal<I> {
    /// Opens the log (recovering a torn tail, refusing damage to durable entries), replays
    /// into `store` the entries it has not applied, makes the store durable and purges the
    /// log behind it. Runs on the executor that will run [`Journal::run`].
    ///
    /// # Errors
    /// See [`OpenError`].
    pub async fn open(
        io: I,
        cfg: JournalConfig,
        store: Store,
        on_applied: OnApplied,
    ) -> Result<Self, OpenError> {
        // What the store applied durably (a crash loses its non-durable commits) is purged
        // from the log: segments a failed removal left below a gap are dropped first.
        // Synced first, so that what it says it applied is on disk, not only in redb's cache.
        let s = store.clone();
        let applied = blocking(move || {
            s.sync()?;
            s.applied()
        })
        .await?
        .map_or(0, |(i, _)| i);
        let log = Log::open_purged(io, cfg.log, None, Some(LogIndex(applied))).await?;
        let mut replayed = 0u64;
        let started = std::time::Instant::now();
        let mut logged = started;
        if let Some((LogIndex(first), LogIndex(last))) = log.bounds() {
            if first > applied + 1 {
                return Err(OpenError::Gap { first, applied });
            }
            let mut index = first.max(applied + 1);
            let total = (last + 1).saturating_sub(index);
            if total > 0 {
                tracing::info!(target: "storage", entries = total, "replaying the journal (the API answers reads once it is done)");
            }
            while index <= last {
                let mut chunk: Vec<(u64, u64, Vec<u8>)> = Vec::new();
                let mut bytes = 0;
                while index <= last && chunk.len() < APPLY_ENTRIES_MAX && bytes < REPLAY_BYTES_MAX {
                    let rec = log
                        .read(LogIndex(index))
                        .await?
                        .ok_or(OpenError::Missing { index })?;
                    bytes += rec.payload.len();
                    chunk.push((rec.index.0, rec.term.0, rec.payload));
                    index += 1;
                }
                let n = chunk.len() as u64;
                let out = apply(&store, chunk, false).await?;
                // Readers (a dispatcher) start once the journal is open; they hear of the
                // replayed keys all the same.
                if !out.published.is_empty() || !out.deleted.is_empty() {
                    on_applied(&out.published, &out.deleted);
                }
                replayed += n;
                if logged.elapsed() >= REPLAY_PROGRESS_EVERY {
                    logged = std::time::Instant::now();
                    tracing::info!(target: "storage", replayed, of = total, "replaying the journal");
                }
            }
        }
        let s = store.clone();
        // Ids above the replayed mark are reserved before any is handed out: the writes
        // this journal answered before a crash without making them durable (NO_ACK) used
        // ids up to IDS_UNAPPLIED_MAX above it, and none of them may name a second message.
        let (applied, last_id) = blocking(move || {
            s.sync()?;
            Ok::<_, StoreError>((s.applied()?.map_or(0, |(i, _)| i), s.reserve_ids()?))
        })
        .await?;
        let log_last = log.bounds().map(|(_, LogIndex(l))| l);
        let last = log_last.map_or(0, |l| l).max(applied);
        if log_last.is_some_and(|l| l < applied) {
            // The store applied past the log (its entries came from elsewhere, such as a
            // Raft log): the next entry follows the store, so nothing of the log may stay.
            log.purge(LogIndex(last)).await?;
        } else {
            purge_behind(&log, last).await?;
        }
        if replayed > 0 {
            tracing::info!(target: "storage", entries = replayed, ms = started.elapsed().as_millis() as u64, "replayed the journal");
        }
        Ok(Journal(Rc::new(Inner {
            log,
            store,
            on_applied,
            durable_interval: cfg.durable_interval,
            st: RefCell::new(State {
                next_index: last + 1,
                next_id: last_id + 1,
                flushed: last,
                queue: VecDeque::new(),
                queue_bytes: 0,
                failed: None,
                stopped: false,
            }),
            changed: event_listener::Event::new(),
            applies: Cell::new(0),
        })))
    }

    /// Why the journal failed, if it did (it then writes nothing more).
    #[must_use]
    pub fn failed(&self) -> Option<Rc<str>> {
        self.0.st.borrow().failed.clone()
    }

    /// Applies done since open (each one redb transaction).
    #[must_use]
    pub fn applies(&self) -> u64 {
        self.0.applies.get()
    }

    /// Stores one batch; ids are assigned here, consecutive from the returned first id.
    /// A batch's ids ascend above every earlier entry's, so the apply never refuses it: a
    /// batch acknowledged at [`Wait::Durable`] is stored by the apply that follows (or by the
    /// replay after a crash).
    ///
    /// # Errors
    /// See [`JournalError`]; nothing of the batch is stored then.
    pub async fn publish(&self, items: Vec<StoreItem>, wait: Wait) -> Result<u64, JournalError> {
        self.store_batch(items, wait).await.map(|(first, _)| first)
    }

    /// Stores one batch like [`Journal::publish`] and waits for its apply: the first id and
    /// what the apply answered (the items a dedup id matched, which it did not store).
    ///
    /// # Errors
    /// See [`JournalError`]; nothing of the batch is stored then.
    pub async fn publish_applied(
        &self,
        items: Vec<StoreItem>,
    ) -> Result<(u64, Answer), JournalError> {
        self.store_batch(items, Wait::Applied).await
    }

    async fn store_batch(
        &self,
        items: Vec<StoreItem>,
        wait: Wait,
    ) -> Result<(u64, Answer), JournalError> {
        let mut batch = StoreBatch { items };
        let mut first = 0;
        let answer = self
            .submit(
                |next_id| {
                    first = *next_id;
                    for it in &mut batch.items {
                        it.event_id = *next_id;
                        *next_id += 1;
                    }
                    encode_store(&batch)
                },
                wait,
            )
            .await?;
        Ok((first, answer))
    }

    /// Deletes keys (with their index and expiry rows) durably; deleting a missing key is a
    /// no-op.
    ///
    /// # Errors
    /// See [`JournalError`].
    pub async fn delete(&self, keys: &[EventKey]) -> Result<(), JournalError> {
        let cmd = encode_delete(&DeleteBatch {
            keys: keys.iter().map(|k| k.0).collect(),
        });
        self.submit(|_| cmd, Wait::Applied).await.map(drop)
    }

    /// Removes a consumer group from the durable registry: whether it was registered.
    ///
    /// # Errors
    /// See [`JournalError`].
    pub async fn delete_group(
        &self,
        topic_hash: TopicHash,
        group: String,
    ) -> Result<bool, JournalError> {
        let cmd = encode_delete_group(&DeleteGroup {
            topic_hash: topic_hash.0,
            group,
        });
        match self.submit(|_| cmd, Wait::Applied).await? {
            Answer::GroupDeleted(found) => Ok(found),
            _ => Err(JournalError::Unanswered),
        }
    }

    /// Cancels stored messages (with their index and expiry rows) durably: per key, in
    /// order, whether it was stored.
    ///
    /// # Errors
    /// See [`JournalError`].
    pub async fn cancel(&self, keys: &[EventKey]) -> Result<Vec<bool>, JournalError> {
        let cmd = encode_cancel(&Cancel {
            keys: keys.iter().map(|k| k.0).collect(),
        });
        match self.submit(|_| cmd, Wait::Applied).await? {
            Answer::Cancelled(v) => Ok(v),
            _ => Err(JournalError::Unanswered),
        }
    }

    /// Applies a command that takes one event id ([`WithId`]: a reschedule, a dead letter)
    /// durably, its id assigned here: the key it stored, or `None` when its message was not
    /// stored (or, for a reschedule, had expired).
    ///
    /// # Errors
    /// See [`JournalError`].
    pub async fn with_id(&self, mut cmd: WithId) -> Result<Option<EventKey>, JournalError> {
        let make = |next_id: &mut u64| {
            let bytes = cmd.encode(*next_id);
            *next_id += 1;
            bytes
        };
        let answer = self.submit(make, Wait::Applied).await?;
        cmd.stored_key(&answer).ok_or(JournalError::Unanswered)
    }

    /// Adds a consumer group to the durable registry (a no-op when it is there).
    ///
    /// # Errors
    /// See [`JournalError`].
    pub async fn register_group(
        &self,
        topic_hash: TopicHash,
        group: String,
    ) -> Result<(), JournalError> {
        let cmd = encode_register_group(&RegisterGroup {
            topic_hash: topic_hash.0,
            group,
        });
        self.submit(|_| cmd, Wait::Applied).await.map(drop)
    }

    fn check(&self) -> Result<(), JournalError> {
        let st = self.0.st.borrow();
        if let Some(reason) = &st.failed {
            return Err(JournalError::Failed {
                reason: Rc::clone(reason),
            });
        }
        if st.stopped {
            return Err(JournalError::Stopped);
        }
        Ok(())
    }

    /// Waits until the journal takes another entry: fewer than its bounds of unapplied
    /// entries, bytes and ids ahead of the store.
    ///
    /// # Errors
    /// The journal failed or stopped.
    async fn room(&self) -> Result<(), JournalError> {
        loop {
            self.check()?;
            let listener = {
                let st = self.0.st.borrow();
                let ids_ahead = st.next_id.saturating_sub(self.0.store.applied_last_id());
                if st.queue.len() < UNAPPLIED_MAX
                    && st.queue_bytes < UNAPPLIED_BYTES_MAX
                    && ids_ahead < IDS_AHEAD_MAX
                {
                    return Ok(());
                }
                self.0.changed.listen()
            };
            listener.await;
        }
    }

    /// The log's callback for the entry at `index`: records it flushed (durable) and answers
    /// a `Wait::Durable` writer; a failed flush fails the journal and every writer.
    fn on_flushed(
        &self,
        index: u64,
        durable_tx: Option<oneshot::Sender<Result<Answer, JournalError>>>,
    ) -> crate::log::segmented::Flushed {
        let weak = Rc::downgrade(&self.0);
        Box::new(move |r: Result<(), FlushError>| {
            let Some(inner) = weak.upgrade() else { return };
            let out = {
                let mut st = inner.st.borrow_mut();
                match r {
                    Ok(()) => {
                        st.flushed = st.flushed.max(index);
                        Ok(Answer::None)
                    }
                    Err(e) => {
                        if st.failed.is_none() {
                            tracing::error!(target: "storage", error = %e, "journal write failed");
                            st.failed = Some(e.to_string().into());
                        }
                        Err(JournalError::Failed {
                            reason: st.failed.clone().unwrap_or_else(|| "".into()),
                        })
                    }
                }
            };
            if let Some(tx) = durable_tx {
                let _ = tx.send(out);
            }
            inner.changed.notify(usize::MAX);
        })
    }

    /// Appends the command `make` encodes (given the next event id to assign, which it
    /// advances past the ids it used) and waits as `wait` says.
    async fn submit(
        &self,
        make: impl FnOnce(&mut u64) -> Vec<u8>,
        wait: Wait,
    ) -> Result<Answer, JournalError> {
        self.room().await?;
        // No await from here to the append: ids and indexes are taken in log order.
        let (index, bytes, first_id) = {
            let mut st = self.0.st.borrow_mut();
            let first_id = st.next_id;
            let bytes = make(&mut st.next_id);
            // Event ids never regress (module docs): every id handed out is above the
            // store's `last-id` and above the previous entry's.
            assert!(
                st.next_id >= first_id && first_id > self.0.store.applied_last_id(),
                "journal ids regress: {first_id}..{} against last-id {}",
                st.next_id,
                self.0.store.applied_last_id()
            );
            (st.next_index, bytes, first_id)
        };
        let (durable_tx, durable_rx) = match wait {
            Wait::Durable => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let done = self.on_flushed(index, durable_tx);
        if let Err(e) = self.0.log.append(
            vec![(Term::JOURNAL, LogIndex(index), bytes.as_slice())],
            done,
        ) {
            // Nothing was written: its ids were never handed out, and are given back (no
            // await since they were taken), so failed appends cannot use up the window.
            self.0.st.borrow_mut().next_id = first_id;
            return Err(match e {
                LogError::Poisoned => {
                    self.fail(&e.to_string());
                    self.check().err().unwrap_or(JournalError::Stopped)
                }
                // A command larger than a segment, or a gap: this write fails, the journal
                // goes on.
                other => JournalError::NotAppended {
                    reason: other.to_string().into(),
                },
            });
        }
        let (tx, rx) = match wait {
            Wait::Applied => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            Wait::Durable => (None, durable_rx),
            Wait::Appended => (None, None),
        };
        {
            let mut st = self.0.st.borrow_mut();
            st.next_index = index + 1;
            st.queue_bytes += bytes.len();
            st.queue.push_back(Pending {
                index,
                bytes,
                waiter: tx,
            });
        }
        match rx {
            Some(rx) => rx.await.unwrap_or(Err(JournalError::Abandoned)),
            None => Ok(Answer::None),
        }
    }

    /// Marks the journal failed and fails every waiter.
    fn fail(&self, reason: &str) {
        {
            let mut st = self.0.st.borrow_mut();
            if st.failed.is_none() {
                tracing::error!(target: "storage", error = reason, "the journal failed");
                st.failed = Some(reason.into());
            }
        }
        let reason: Rc<str> = self.failed().unwrap_or_else(|| reason.into());
        self.drain(&JournalError::Failed { reason });
    }

    /// Answers every write still queued with `err` (none of them was applied).
    fn drain(&self, err: &JournalError) {
        let waiters: Vec<Waiter> = {
            let mut st = self.0.st.borrow_mut();
            st.queue_bytes = 0;
            st.queue.drain(..).filter_map(|p| p.waiter).collect()
        };
        for w in waiters {
            let _ = w.send(Err(err.clone()));
        }
        self.0.changed.notify(usize::MAX);
    }

    /// Runs the log's flusher and the applier until `stop` resolves: then no more writes
    /// are taken, what was appended is flushed and applied, the store is made durable and the
    /// log purged (a clean stop leaves nothing for the next start to apply). Returns early when the journal
    /// fails.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        let (flusher_stop, flusher_stopped) = oneshot::channel::<()>();
        let stopping = Cell::new(false);
        let stop_marks = event_listener::Event::new();
        // Beside the flusher: a durable mark left behind by a burst that went idle is saved
        // within MARK_INTERVAL. A save is never cancelled halfway (a torn mark write racing a
        // later one could leave a stale mark): the loop only stops between saves.
        let marks = async {
            loop {
                let l = stop_marks.listen();
                if stopping.get() {
                    return;
                }
                futures::future::select(
                    std::pin::pin!(glommio::timer::sleep(crate::log::segmented::MARK_INTERVAL)),
                    l,
                )
                .await;
                if stopping.get() {
                    return;
                }
                if self.0.log.mark_lags() {
                    if let Err(e) = self.0.log.save_mark().await {
                        tracing::warn!(target: "storage", error = %e, "saving the journal's durable mark failed");
                    }
                }
            }
        };
        // Stopped only once every appended entry was applied (so flushed): never in the
        // middle of a flush.
        let flusher = self.0.log.run_flusher(
            async {
                let _ = flusher_stopped.await;
            },
            glommio::timer::sleep,
        );
        let applier = async {
            self.apply_until(stop).await;
            drop(flusher_stop);
            stopping.set(true);
            stop_marks.notify(usize::MAX);
        };
        futures::join!(applier, flusher, marks);
        if self.0.st.borrow().failed.is_none() {
            self.make_durable().await;
        }
        self.fail_rest();
    }

    /// The applier: applies flushed entries as they come (durably as [`DurableApplies`] says:
    /// every `durable_interval` or [`crate::durability::DURABLE_APPLY_BYTES`]; and once when
    /// idle with volatile applies, the interval run out) until `stop` resolved and the queue
    /// is empty, or the journal failed.
    async fn apply_until(&self, stop: impl std::future::Future<Output = ()>) {
        let mut applies = DurableApplies::new(self.0.durable_interval);
        let mut stop = std::pin::pin!(futures::FutureExt::fuse(stop));
        loop {
            let listener = self.0.changed.listen();
            let (failed, ready, empty, stopped) = {
                let st = self.0.st.borrow();
                (
                    st.failed.clone(),
                    st.queue.front().is_some_and(|p| p.index <= st.flushed),
                    st.queue.is_empty(),
                    st.stopped,
                )
            };
            if let Some(reason) = failed {
                self.fail(&reason);
                return;
            }
            if ready {
                let durable = applies.due();
                let Some(bytes) = self.apply_flushed(durable).await else {
                    return;
                };
                applies.applied(bytes, durable);
                continue;
            }
            if stopped {
                // Entries waiting for disk space are not waited for (their writers get
                // "outcome unknown"; none was acked as durable).
                if empty || self.0.log.waiting_for_space() {
                    return;
                }
                futures::future::select(
                    std::pin::pin!(listener),
                    std::pin::pin!(glommio::timer::sleep(STOP_POLL)),
                )
                .await;
                continue;
            }
            let idle = async {
                if applies.volatile() {
                    glommio::timer::sleep(applies.until_due()).await;
                } else {
                    futures::future::pending::<()>().await;
                }
            };
            futures::select_biased! {
                () = futures::FutureExt::fuse(listener) => {}
                () = futures::FutureExt::fuse(idle) => {
                    if self.make_durable().await {
                        applies.made_durable();
                    }
                }
                () = stop => {
                    // No write is taken from now on; what is queued is flushed and applied.
                    self.0.st.borrow_mut().stopped = true;
                    self.0.changed.notify(usize::MAX);
                }
            }
        }
    }

    /// Fails every write still queued when the journal stops (appended, not applied: the
    /// outcome is unknown).
    fn fail_rest(&self) {
        self.0.st.borrow_mut().stopped = true;
        self.drain(&JournalError::Abandoned);
    }

    /// Applies every flushed entry (bounded per transaction) and answers their waiters.
    /// The bytes of entries applied; `None` when the apply failed (the journal is failed
    /// then).
    async fn apply_flushed(&self, durable: bool) -> Option<usize> {
        let (taken, bytes): (Vec<Pending>, usize) = {
            let mut st = self.0.st.borrow_mut();
            let mut taken = Vec::new();
            let mut bytes = 0;
            while taken.len() < APPLY_ENTRIES_MAX && bytes < APPLY_BYTES_MAX {
                match st.queue.front() {
                    Some(p) if p.index <= st.flushed => {}
                    _ => break,
                }
                let p = st.queue.pop_front().expect("checked");
                bytes += p.bytes.len();
                taken.push(p);
            }
            (taken, bytes)
        };
        if taken.is_empty() {
            return Some(0);
        }
        let mut entries = Vec::with_capacity(taken.len());
        let mut waiters = Vec::with_capacity(taken.len());
        for p in taken {
            waiters.push((p.index, p.waiter));
            entries.push((p.index, Term::JOURNAL.0, p.bytes));
        }
        let last = entries.last().map_or(0, |e| e.0);
        let out = apply(&self.0.store, entries, durable).await;
        {
            let mut st = self.0.st.borrow_mut();
            st.queue_bytes = st.queue_bytes.saturating_sub(bytes);
        }
        self.0.applies.set(self.0.applies.get() + 1);
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                let reason = format!("applying entries up to {last} failed: {e}");
                let err = JournalError::Failed {
                    reason: reason.as_str().into(),
                };
                self.fail(&reason);
                for (_, w) in waiters {
                    if let Some(w) = w {
                        let _ = w.send(Err(err.clone()));
                    }
                }
                return None;
            }
        };
        if !out.published.is_empty() || !out.deleted.is_empty() {
            (self.0.on_applied)(&out.published, &out.deleted);
        }
        for (index, why) in &out.refused {
            // Never expected: the journal assigns ids in log order and encodes every command.
            tracing::error!(target: "storage", index, reason = %why, "journal entry refused by the apply");
        }
        for (index, w) in waiters {
            let Some(w) = w else { continue };
            let _ = w.send(
                out.outcome(index)
                    .map_err(|r| JournalError::Refused(r.clone())),
            );
        }
        self.0.changed.notify(usize::MAX);
        if durable {
            self.purge(last).await;
        }
        Some(bytes)
    }

    /// One durable commit (everything applied so far survives a crash), then the log is
    /// purged up to the applied index. False when the commit failed: the journal is failed
    /// then (nothing is lost: the log is purged only behind a durable commit, and the restart
    /// replays it). It used to retry at once, forever, while redb refused every commit after
    /// a failed write.
    async fn make_durable(&self) -> bool {
        let store = self.0.store.clone();
        match blocking(move || {
            store.sync()?;
            store.applied()
        })
        .await
        {
            Ok(applied) => {
                if let Some((index, _)) = applied {
                    self.purge(index).await;
                }
                true
            }
            Err(e) => {
                // redb refuses every operation after a failed write until it is opened again
                // (a full disk, an I/O error): retrying cannot succeed, and the journal could
                // never be purged. Fail it: the broker stops and its restart replays the log.
                self.fail(&format!("making applied entries durable failed: {e}"));
                false
            }
        }
    }

    async fn purge(&self, upto: u64) {
        if let Err(e) = purge_behind(&self.0.log, upto).await {
            // The entries stay in the log and are skipped by the next start's replay (a
            // segment left behind below one that went is dropped by its open).
            tracing::warn!(target: "storage", error = %e, upto, "purging the journal failed");
        }
    }
}

/// Purges the log up to `upto`, keeping its newest segment: emptying the log would delete the
/// segment being written, and the next write would have to create (and zero-fill) a new one.
/// The entries left behind are at or below the store's applied index: a replay skips them.
async fn purge_behind<I: LogIo>(log: &Log<I>, upto: u64) -> Result<(), LogError> {
    match log.bounds() {
        Some((_, LogIndex(last))) => log.purge(LogIndex(upto.min(last.saturating_sub(1)))).await,
        None => Ok(()),
    }
}
