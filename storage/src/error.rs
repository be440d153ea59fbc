//! Storage errors.

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb reported an error (I/O, corruption, …).
    #[error("storage engine: {0}")]
    Engine(#[from] redb::Error),
    /// A metadata value has the wrong shape.
    #[error("corrupt metadata {key}: {reason}")]
    CorruptMeta {
        /// The metadata key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A snapshot stream is malformed or does not match what was expected; nothing of it
    /// was installed.
    #[error("bad snapshot: {0}")]
    BadSnapshot(String),
    /// Writing or reading a snapshot stream failed.
    #[error("snapshot I/O: {0}")]
    SnapshotIo(#[from] std::io::Error),
    /// A store thread could not be started.
    #[error("cannot start a store thread: {0}")]
    Thread(std::io::Error),
    /// The storage threads have stopped (shutdown or a fatal error).
    #[error("storage is closed")]
    Closed,
    /// A rule the store keeps was found broken (a defect): nothing of the call was committed,
    /// and the node stops (its write path fails) rather than go on from a state it cannot
    /// trust. Returned instead of a panic: an apply runs on a blocking thread, whose panic
    /// would leave its caller waiting forever.
    #[error("a store invariant does not hold (a defect): {0}")]
    Invariant(String),
    /// Creating the data directory failed.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Engine(e.into())
            }
        }
    )*};
}

from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);
