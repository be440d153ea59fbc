//! futureq-raft: replication of the event shard and the metadata group on openraft
//! (`=0.10.0-alpha.37`, single-threaded, no tokio runtime). The only crate that knows
//! openraft. Tested with openraft's runtime and storage conformance suites, an in-process
//! 3-node cluster, and (in `bin`) clusters of real broker processes.
//!
//! - [`rt`]: openraft's `AsyncRuntime` on glommio (detached spawns, Timer-based
//!   sleep/timeout, tokio-sync channels).
//! - [`types`]: the type configuration; [`codec`]: versioned encodings of entries, votes,
//!   log ids and memberships.
//! - [`log_store`]: `RaftLogStorage` over `futureq-storage`'s segmented log (group commit via
//!   its flusher, `IOFlushed` after fsync, vote and purge marker files). Its persist hook feeds
//!   [`persisted`], the leader-persist tracker behind the LEADER ack level.
//! - [`state_machine`]: the event shard over the redb store (one transaction per apply with
//!   the applied log id and membership; snapshots streamed from one read transaction).
//! - [`snapshot`]: snapshot data as a stream, and the spool file a receiver writes a
//!   transfer into (no snapshot is ever whole in memory).
//! - [`rpc`]: encodings of the Raft RPCs; [`network`]: openraft's network over
//!   `futureq_net::peer_link` (TCP, multiplexed by group).
//! - [`metadata_sm`]: the metadata group (in-memory topology and address registry, durable
//!   snapshot file).
//! - [`node`]: one node's two groups on the Raft core: bootstrap, proposals (bounded, retried
//!   while leadership settles), leadership view, membership changes and requests forwarded
//!   to the leader.
//!
//! # Invariants
//! - Only the event-shard leader assigns event ids; replicas store them verbatim; ids never
//!   regress across restarts, snapshots and failovers.
//! - A publish batch is in one log entry (with the batches coalesced with it), applied
//!   atomically with the applied log id.
//! - No redb call runs on the Raft core's reactor (state machine calls use the blocking pool).
//! - The log is never purged past the last durably applied index.

pub mod codec;
pub mod log_store;
pub mod metadata_sm;
pub mod network;
pub mod node;
pub mod persisted;
pub mod rpc;
pub mod rt;
pub mod snapshot;
pub mod state_machine;
pub mod types;
