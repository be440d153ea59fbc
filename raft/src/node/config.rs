//! How a node is set up, its sizes and timeouts, its two groups' types, and why it could
//! not start.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::metadata_sm::MetaStateMachine;
use crate::state_machine::EventStateMachine;
use crate::types::TypeConfig;

/// Snapshot policy of the metadata group (its state is tiny).
pub const META_SNAPSHOT_ENTRIES: u64 = 5;
/// Raft log segment size (the one both logs use).
pub use futureq_storage::log::SEGMENT_BYTES;
/// Per-RPC timeout between peers (snapshots get `network::SNAPSHOT_RPC_TIMEOUT`).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(2);
/// Most event-shard proposals outstanding (proposed, not yet applied) on a leader.
pub const PROPOSALS_MAX: u64 = 1024;
/// Pause between retries of a write refused while leadership settles.
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// How a node is set up (from `cluster.*`).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// `cluster.nodeId`.
    pub node_id: u64,
    /// `cluster.raft.listen`.
    pub raft_listen: SocketAddr,
    /// `cluster.raft.advertise`.
    pub raft_advertise: String,
    /// `cluster.raft.dataDir`.
    pub data_dir: PathBuf,
    /// `cluster.raft.rtt`: heartbeat every rtt, election timeout 10–15 rtt (randomised).
    pub rtt: Duration,
    /// `cluster.raft.snapshotEntries`.
    pub snapshot_entries: u64,
    /// `cluster.raft.compactionOverhead`: applied entries kept behind a snapshot.
    pub compaction_overhead: u64,
    /// `cluster.secret`: peer links must open with it (empty = open).
    pub secret: futureq_net::peer_link::PeerSecret,
    /// `cluster.tls`: mutual TLS on every peer link (`None`: plain TCP).
    pub tls: Option<std::sync::Arc<futureq_net::tls::PeerTls>>,
    /// Record bytes of the event log past which it is snapshotted and purged to half
    /// ([`super::EVENT_LOG_BYTES_MAX`] by default).
    pub log_bytes_max: u64,
    /// Event-log segment size ([`SEGMENT_BYTES`] by default; it must hold the largest entry).
    pub segment_bytes: u64,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The Raft data directory or a log could not be opened.
    #[error("opening the Raft log in {path}: {cause}")]
    Log {
        /// The directory.
        path: String,
        /// The cause.
        cause: io::Error,
    },
    /// `cluster.raft.listen` could not be bound.
    #[error("cannot listen on cluster.raft.listen {addr}: {reason}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        reason: String,
    },
    /// openraft refused to start or initialize.
    #[error("raft: {0}")]
    Raft(String),
    /// The store applied less than the log purged: the entries between are in neither.
    #[error("the event store applied log index {applied}, but the Raft log was purged up to {purged}: entries {from}..={purged} are in neither, so this node cannot serve its state; remove it from the cluster (futureq leave --seed <member>), delete its Raft data ({dir}) and its store, and join it again", from = applied + 1)]
    BehindPurge {
        /// The store's applied index (0 = none).
        applied: u64,
        /// The log's purge point.
        purged: u64,
        /// The Raft data directory.
        dir: String,
    },
}

/// The event shard.
pub type EventRaft = openraft::Raft<TypeConfig, EventStateMachine>;
/// The metadata group.
pub type MetaRaft = openraft::Raft<TypeConfig, MetaStateMachine>;
