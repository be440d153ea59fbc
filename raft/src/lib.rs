//! futureq-raft: replication of the event shard and the metadata group.
//!
//! This crate is the only one that will know openraft (`=0.10.0-alpha.37`, single-threaded,
//! behind a glommio `AsyncRuntime` adapter in `rt`). It is a skeleton in the standalone
//! release: the standalone broker commits straight to `futureq-storage`, and the clustered
//! broker (next milestone) will put this crate between the ingress cores and the store:
//!
//! - [`types`]: the openraft type configuration; [`codec`]: entry and vote encodings for our
//!   log and vote file.
//! - [`rt`]: the glommio runtime adapter (detached spawns, Timer-based sleep/timeout); passes
//!   openraft's runtime conformance suite.
//! - `log`: openraft's `RaftLogStorage` over `futureq-storage`'s io_uring segment log, with the
//!   leader-persist hook behind the LEADER ack level.
//! - `state`: the event-shard state machine (rkyv `StoreBatch`/`DeleteBatch` commands applied in
//!   one redb transaction with the applied log id) and the in-memory metadata group.
//! - `transport`: framed TCP between nodes, multiplexed by group id.
//!
//! # Invariants (to hold once clustering lands)
//! - Only the event-shard leader assigns event ids; replicas store them verbatim; ids never
//!   regress across restarts, snapshots and failovers.
//! - One publish batch is one log entry, applied atomically.
//! - The log is never purged past the last durably applied index.

pub mod codec;
pub mod log_store;
pub mod metadata_sm;
pub mod rt;
pub mod state_machine;
pub mod types;
