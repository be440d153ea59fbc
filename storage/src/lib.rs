//! futureq-storage: the durable message store on redb, and the threads that own it.
//!
//! Layout:
//! - [`store`]: the synchronous store: schema, group-committed publishes, deletes, TTL
//!   sweeps and due-range scans.
//! - [`service`]: the store's writer and reader threads with an async, channel-based API,
//!   so that no redb call ever runs on an executor's reactor.
//! - [`log`]: the Raft log's record format and leader-persist tracker (clustering, in progress).
//! - [`wal`]: the standalone store's write-ahead log (durability without a redb fsync per
//!   group commit).
//! - `error`: the crate error type, `StoreError`.
//!
//! # Invariants
//! - Event ids never regress: the highest id handed out is persisted (`last-id`) in the same
//!   transaction as the messages that carry it, and ids start above it after a restart.
//! - A batch is atomic: all of its messages, index entries and expiry entries commit in one
//!   transaction, or none do.
//! - A durable group has been fsynced when its reply is sent: as a durable redb commit, or
//!   (standalone) as a write-ahead log record.
//! - Index and expiry entries exist exactly as long as their message.

pub mod error;
#[cfg(feature = "glommio")]
pub mod journal;
pub mod log;
pub mod service;
pub mod store;
pub mod wal;

pub use error::StoreError;
pub use service::{StoreService, WriteStats};
pub use store::{ApplyOutcome, NewMessage, Refusal, SnapshotInfo, Store, StoreMode};
