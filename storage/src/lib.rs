//! futureq-storage: the durable message store on redb, and the threads that own it.
//!
//! Layout:
//! - [`store`]: the synchronous store: schema, the apply of log entries (publishes, deletes,
//!   group registrations), expiry lookups, due-range scans, snapshots.
//! - [`snapshot`]: the snapshot stream, read piece by piece from one read transaction.
//! - [`service`]: the store's reader and admin threads with an async, channel-based API, so that no
//!   redb read ever runs on an executor's reactor.
//! - [`log`]: the segmented log on io_uring (record format, group commit, recovery, the
//!   persist hook): the Raft log, and the journal's.
//! - [`durability`]: when an apply commits the store durably (shared by the journal and the
//!   Raft state machine).
//! - [`journal`]: the standalone write path: commands appended to the log, applied into the
//!   store with the replicas' apply.
//! - `error`: the crate error type, `StoreError`.
//! - `store_faults` (feature `fault-injection`): ENOSPC injected under redb.
//!
//! # Invariants
//! - Event ids never regress among stored messages: the highest id applied is persisted
//!   (`last-id`) in the same transaction as the messages that carry it, and ids start above
//!   it after a restart. An id handed to a write that was never applied (lost before its
//!   fsync, refused) may be handed out again after a crash: no stored message carries it.
//! - A batch is atomic: all of its messages, index entries and expiry entries commit in one
//!   transaction, or none do.
//! - A write acknowledged as durable is in an fsynced log entry (the Raft log or the
//!   journal); the store's applied index says which entries it holds, and a log is never
//!   purged past the store's durable applied index.
//! - Index and expiry entries exist exactly as long as their message.

pub mod durability;
pub mod error;
#[cfg(feature = "glommio")]
pub mod journal;
pub mod log;
pub mod service;
pub mod snapshot;
pub mod store;
#[cfg(feature = "fault-injection")]
pub mod store_faults;

pub use error::StoreError;
pub use service::StoreService;
pub use snapshot::{SnapshotInfo, SnapshotReader};
pub use store::{
    ApplyOutcome, ApplyStats, Refusal, Store, StoreMode, TopicCounts, TopicRow, TopicStat,
};
