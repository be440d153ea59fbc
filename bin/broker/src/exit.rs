//! How the broker ends: why it did not start or stopped ([`ServerError`], its exit status),
//! and what the executors report to [`crate::run`]'s thread (started, write path failed,
//! stopped). The write paths report their failure through [`crate::fatal::FatalReporter`],
//! which [`crate::run`] builds on [`Exit::Failed`].

use std::path::PathBuf;

use futureq_storage::StoreError;

use crate::runtime::RuntimeError;
use crate::{cluster, local};

/// Why the broker did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// `runtime.raftCore` names no executor.
    #[error("runtime.raftCore {raft_core} is not one of the {cores} executors (0..{})", cores - 1)]
    RaftCore {
        /// The configured core.
        raft_core: u32,
        /// Executors.
        cores: usize,
    },
    /// The process cannot host the executors.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A cluster node was pointed at a standalone broker's store.
    #[error("storage.dataDir {} holds a standalone broker's store ({} exists): a cluster node starts from its own store; give it another storage.dataDir, or start this one without cluster.enabled", dir.display(), journal.display())]
    StandaloneStore {
        /// `storage.dataDir`.
        dir: PathBuf,
        /// The journal's directory in it.
        journal: PathBuf,
    },
    /// The data directory holds the write-ahead log of a futureq before the journal.
    #[error("{} was written by an older futureq, whose standalone write-ahead log this version does not read: start that version once and stop it cleanly (SIGTERM: it checkpoints, leaving nothing to replay), then delete the file", path.display())]
    OldWal {
        /// The file.
        path: PathBuf,
    },
    /// The store did not open.
    #[error("opening the store ({place})")]
    Storage {
        /// Its directory, or "memory".
        place: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// An executor thread did not start.
    #[error("starting executor {core} on CPU {cpu}: {reason}")]
    Executor {
        /// The executor.
        core: usize,
        /// Its CPU.
        cpu: usize,
        /// Why.
        reason: String,
    },
    /// The descriptors for server reflection do not match the routed services (a build defect).
    #[error("the API descriptors compiled into this binary are damaged: {0}")]
    Reflection(#[from] futureq_net::reflection::ReflectionError),
    /// An executor ended before it reported, or before the shutdown (a panic).
    #[error("an executor stopped unexpectedly (during start-up, or a panic while serving)")]
    ExecutorLost,
    /// The disk-space thread did not start.
    #[error("starting the disk-space thread: {0}")]
    Thread(std::io::Error),
    /// A listener could not be opened.
    #[error("cannot listen on {key} {addr}: {reason}")]
    Listen {
        /// The configuration key.
        key: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        reason: String,
    },
    /// The standalone write path did not open.
    #[error("storage")]
    Journal(#[source] local::OpenError),
    /// The Raft node did not start.
    #[error("cluster")]
    Cluster(#[source] cluster::StartError),
    /// The write path's log failed a write or an fsync while serving: nothing since the last
    /// good fsync may be assumed durable, and no write can be taken any more.
    #[error("{what} failed ({reason}); the broker stopped so that a restart recovers from its durable state")]
    WritePathFailed {
        /// "the journal" or "a Raft group" (its log or its state machine).
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// Exit status of a broker whose write path failed ([`ServerError::WritePathFailed`]):
/// EX_IOERR.
pub const EXIT_WRITE_PATH_FAILED: i32 = 74;

impl ServerError {
    /// The process exit status this error calls for: [`EXIT_WRITE_PATH_FAILED`] for a
    /// failed write path, 1 otherwise.
    #[must_use]
    pub fn exit_status(&self) -> i32 {
        match self {
            ServerError::WritePathFailed { .. } => EXIT_WRITE_PATH_FAILED,
            _ => 1,
        }
    }
}

/// What an executor tells [`crate::run`]'s thread: whether it started, that the write path failed,
/// that it stopped.
pub(crate) enum Exit {
    /// The executor's start-up finished (serving) or failed.
    Ready(Result<(), ServerError>),
    /// The write path failed: [`crate::run`] returns at once.
    Failed(ServerError),
    /// The executor stopped (also after a panic).
    Stopped,
}

/// Reports an executor's start-up outcome to [`crate::run`]'s thread.
pub(crate) struct Ready(pub(crate) std::sync::mpsc::Sender<Exit>);

impl Ready {
    pub(crate) fn send(&self, outcome: Result<(), ServerError>) {
        let _ = self.0.send(Exit::Ready(outcome));
    }
}

/// Tells [`crate::run`]'s thread that an executor stopped, also when it panicked.
pub(crate) struct StoppedGuard(pub(crate) std::sync::mpsc::Sender<Exit>);

impl Drop for StoppedGuard {
    fn drop(&mut self) {
        let _ = self.0.send(Exit::Stopped);
    }
}
