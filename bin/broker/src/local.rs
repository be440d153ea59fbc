//! The standalone write core: the local journal ([`futureq_storage::journal`]) serves the
//! same write requests ([`WriteReq`]) the Raft core serves in a cluster, with the same replies:
//! one write path (rkyv commands on the io_uring log, applied by the replicas' apply code)
//! whatever the mode.

use std::path::PathBuf;
use std::time::Instant;

use futureq_core::command::StoreItem;
use futureq_core::refusal::WriteError;
use futureq_core::{AckLevel, EventKey, TopicHash};
use futureq_net::Shutdown;
use futureq_storage::journal::{Journal, JournalConfig, JournalError, OnApplied, Wait};
use futureq_storage::log::io::{LogIo, MemLogIo};
use futureq_storage::log::LogConfig;
use futureq_storage::Store;
use futures_lite::future;

use crate::fatal::FatalReporter;
use crate::replication::{
    group_known, serve_requests, MembershipError, MembershipOp, Stored, WriteCore, WriteReq,
};

/// Directory of the journal's log under `storage.dataDir`.
pub const JOURNAL_DIR: &str = "journal";
/// How long after shutdown the journal waits for the dispatcher's last deletes at most.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

const CONFIG: JournalConfig = JournalConfig {
    log: LogConfig {
        segment_bytes: futureq_storage::log::SEGMENT_BYTES,
        // The journal holds each entry until its apply; only a replay reads the log.
        cache_bytes: 0,
    },
    durable_interval: futureq_storage::durability::JOURNAL_DURABLE_APPLY_INTERVAL,
};

/// Why the standalone write path did not open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The store is a cluster node's.
    #[error("storage.dataDir holds the store of a cluster node (a Raft membership is recorded in it): start it with cluster.enabled, or give this standalone broker another storage.dataDir")]
    ClusterStore,
    /// The store could not be read.
    #[error("reading the store")]
    Store(#[source] futureq_storage::StoreError),
    /// The journal's directory could not be made.
    #[error("creating {}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The journal did not open.
    #[error("opening the journal ({place})")]
    Journal {
        /// Its directory, or "memory".
        place: String,
        /// Why.
        #[source]
        source: futureq_storage::journal::OpenError,
    },
    /// The journal's task ended before it reported.
    #[error("the journal stopped while opening")]
    Stopped,
}

/// Opens the journal beside the store (replaying what the store has not applied) and serves
/// `rx` until `stop` fires (the dispatcher's last deletes are through); then the journal is
/// applied, made durable and emptied. Reports the open's outcome on `ready` first. A failed
/// journal (a log write or fsync, an apply) is reported to `fatal`, as a failed Raft log is:
/// the broker stops, and a restart recovers from what is durable.
pub async fn serve(
    data_dir: Option<PathBuf>,
    store: Store,
    on_applied: OnApplied,
    rx: flume::Receiver<WriteReq>,
    (stop, shutdown): (Shutdown, Shutdown),
    fatal: FatalReporter,
    ready: impl FnOnce(Result<(), OpenError>),
) {
    // The journal stops after the dispatcher's last deletes; a dispatcher that never ran (a
    // failed start-up on its core) must not keep the process up: shutdown plus a grace.
    let stop = async move {
        let grace = async {
            shutdown.wait().await;
            glommio::timer::sleep(STOP_GRACE).await;
        };
        future::or(stop.wait(), grace).await;
    };
    // A cluster node's store (its entries came from a Raft log) is not a standalone one. Its
    // membership is durable in the store from the node's first durable apply on: the first
    // apply at least `futureq_raft::state_machine::RAFT_DURABLE_APPLY_INTERVAL` (50 ms) after
    // its start, a snapshot or a clean stop; a node killed sooner is not recognised (its Raft
    // log holds its state). Checked before the
    // journal's directory is made: a refused start leaves the directory as it was.
    let s = store.clone();
    let clustered = glommio::executor()
        .spawn_blocking(move || s.raft_meta(futureq_raft::state_machine::MEMBERSHIP))
        .await;
    match clustered {
        Ok(None) => {}
        Ok(Some(_)) => {
            ready(Err(OpenError::ClusterStore));
            return;
        }
        Err(e) => {
            ready(Err(OpenError::Store(e)));
            return;
        }
    }
    match data_dir {
        Some(dir) => {
            let dir = dir.join(JOURNAL_DIR);
            if let Err(e) = std::fs::create_dir_all(&dir) {
                ready(Err(OpenError::CreateDir { dir, source: e }));
                return;
            }
            let io = disk_io(&dir);
            let place = dir.display().to_string();
            run(io, &place, store, on_applied, rx, stop, fatal, ready).await;
        }
        // storage.mode: memory keeps nothing across restarts: the log lives in memory too.
        None => {
            let io = MemLogIo::new();
            run(io, "memory", store, on_applied, rx, stop, fatal, ready).await;
        }
    }
}

/// The journal's files: io_uring, with the disk-fault seam in fault-injection builds (the
/// trigger file in `storage.dataDir`, beside the journal's directory).
#[cfg(not(feature = "fault-injection"))]
fn disk_io(dir: &std::path::Path) -> futureq_storage::log::uring::DmaLogIo {
    futureq_storage::log::uring::DmaLogIo::in_dir(dir.to_path_buf())
}

#[cfg(feature = "fault-injection")]
fn disk_io(
    dir: &std::path::Path,
) -> futureq_storage::log::faults::FaultyIo<futureq_storage::log::uring::DmaLogIo> {
    futureq_storage::log::faults::dma_in_dir(dir)
}

#[allow(clippy::too_many_arguments)]
async fn run<I: LogIo + 'static>(
    io: I,
    place: &str,
    store: Store,
    on_applied: OnApplied,
    rx: flume::Receiver<WriteReq>,
    stop: impl std::future::Future<Output = ()>,
    fatal: FatalReporter,
    ready: impl FnOnce(Result<(), OpenError>),
) {
    let journal = match Journal::open(io, CONFIG, store.clone(), on_applied).await {
        Ok(j) => j,
        Err(e) => {
            ready(Err(OpenError::Journal {
                place: place.to_owned(),
                source: e,
            }));
            return;
        }
    };
    ready(Ok(()));
    {
        let core = LocalCore {
            journal: journal.clone(),
            store,
        };
        // Served until the queue closes (after the journal stopped, requests get its error).
        crate::task::spawn_detached(async move { serve_requests(core, &rx).await });
    }
    journal.run(stop).await;
    if let Some(e) = journal.failed() {
        fatal.fail("the journal", &e);
    }
}

fn write_error(e: JournalError) -> WriteError {
    match e {
        JournalError::Refused(r) => WriteError::Refused(r.to_string()),
        // The entry may be in the log (its fsync may have reached the disk, a restart replays
        // it): the outcome is unknown, as after a deadline.
        JournalError::Failed { reason } => WriteError::failed(format!(
            "the journal failed ({reason}); the broker restarts from its durable state"
        )),
        e @ JournalError::NotAppended { .. } => WriteError::not_taken(e.to_string()),
        JournalError::Stopped => WriteError::not_taken("the server is shutting down"),
        JournalError::Abandoned => {
            WriteError::failed("the server stopped before the write's outcome was known")
        }
        JournalError::Unanswered => {
            tracing::error!(target: "journal", "a command was applied without its answer (a defect)");
            WriteError::unanswered("command")
        }
        // A kind added later: whether it was stored is not known here.
        other => WriteError::failed(other.to_string()),
    }
}

/// Waits for `f` until `deadline` (then the outcome is unknown: [`WriteError::Timeout`]).
async fn until<T>(
    deadline: Instant,
    f: impl std::future::Future<Output = Result<T, JournalError>>,
) -> Result<T, WriteError> {
    let timeout = async {
        glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
        Err(WriteError::Timeout)
    };
    future::or(async { f.await.map_err(write_error) }, timeout).await
}

/// The journal as the write core.
struct LocalCore<I: LogIo + 'static> {
    journal: Journal<I>,
    store: Store,
}

impl<I: LogIo + 'static> Clone for LocalCore<I> {
    fn clone(&self) -> Self {
        LocalCore {
            journal: self.journal.clone(),
            store: self.store.clone(),
        }
    }
}

impl<I: LogIo + 'static> WriteCore for LocalCore<I> {
    async fn publish(
        &self,
        items: Vec<StoreItem>,
        admitted: crate::budget::Admitted,
        level: AckLevel,
        dedup: bool,
        deadline: Instant,
    ) -> Result<Stored, WriteError> {
        // The budget's bytes go back when the journal has the entry or the wait ends (the
        // items are then in the journal's bounded queue, or dropped).
        let _admitted = admitted;
        // QUORUM and LEADER: durable in the journal (the one copy is the leader's); the
        // apply follows, and a crash before it replays the entry.
        if dedup {
            // What dedup finds is known once applied.
            let len = items.len();
            let (first, answer) = until(deadline, self.journal.publish_applied(items)).await?;
            return Ok(Stored::of(first, len, &answer));
        }
        let wait = match level {
            AckLevel::NoAck => Wait::Appended,
            AckLevel::Quorum | AckLevel::Leader => Wait::Durable,
        };
        until(deadline, self.journal.publish(items, wait))
            .await
            .map(|first_id| Stored {
                first_id,
                dups: Vec::new(),
            })
    }

    async fn delete(&self, keys: Vec<EventKey>, deadline: Instant) -> Result<(), WriteError> {
        until(deadline, self.journal.delete(&keys)).await
    }

    async fn cancel(
        &self,
        keys: Vec<EventKey>,
        deadline: Instant,
    ) -> Result<Vec<bool>, WriteError> {
        until(deadline, self.journal.cancel(&keys)).await
    }

    async fn with_id(
        &self,
        cmd: futureq_core::command::WithId,
        deadline: Instant,
    ) -> Result<Option<EventKey>, WriteError> {
        until(deadline, self.journal.with_id(cmd)).await
    }

    async fn register_group(
        &self,
        topic_hash: TopicHash,
        group: String,
        deadline: Instant,
    ) -> Result<(), WriteError> {
        if group_known(&self.store, topic_hash, &group).await? {
            return Ok(());
        }
        until(deadline, self.journal.register_group(topic_hash, group)).await
    }

    async fn delete_group(
        &self,
        topic_hash: TopicHash,
        group: String,
        deadline: Instant,
    ) -> Result<bool, WriteError> {
        until(deadline, self.journal.delete_group(topic_hash, group)).await
    }

    async fn membership(&self, _op: MembershipOp) -> Result<(), MembershipError> {
        Err(MembershipError::Standalone)
    }
}
