//! The validated settings the broker runs on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futureq_core::AckLevel;
use futureq_net::peer_link::PeerSecret;
use futureq_net::tls::PeerTls;

use super::schema::LogFormat;

/// Validated settings the broker runs on.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Settings {
    pub grpc_listen: SocketAddr,
    pub grpc_advertise: String,
    pub max_concurrent_streams: u32,
    pub max_recv_message_len: usize,
    pub max_send_message_len: usize,
    pub keepalive_timeout: Duration,
    /// How long a new connection may take for its TLS and HTTP/2 handshakes.
    pub handshake_timeout: Duration,
    /// `api.grpc.tls` and `api.auth.principalsFile`, loaded; SIGHUP reloads them.
    pub security: Arc<crate::security::Security>,
    pub node_id: u64,
    pub data_dir: PathBuf,
    pub memory_storage: bool,
    pub cache_bytes: usize,
    /// Below this many free bytes on a data directory's disk, publishes are refused.
    pub min_free_bytes: u64,
    pub min_ack_level: AckLevel,
    pub proposal_timeout: Duration,
    /// Longest an admitted publish batch should be in service (in line and in its commit);
    /// batches past it are refused
    /// (OVERLOADED, with a retry hint), and so is one that waits this long for the bytes
    /// budget ([`crate::budget`]).
    pub max_queue_delay: Duration,
    pub max_delay: Duration,
    /// How long a dedup id is remembered after its message was stored.
    pub dedup_window: Duration,
    /// A PublishStream with nothing outstanding and no batch for this long is ended
    /// (UNAVAILABLE), and so is one whose client reads no ack for this long.
    pub stream_idle_timeout: Duration,
    /// Deliveries per recipient before a message is dead-lettered (0 = unlimited), for
    /// messages that do not set their own.
    pub max_attempts: u32,
    pub consumer_queue_size: u32,
    pub time_bucket_ms: u64,
    pub in_flight_timeout: Duration,
    pub delete_batch_interval: Duration,
    pub ttl_sweep_interval: Duration,
    pub read_ahead: Duration,
    pub scan_max_keys: usize,
    pub log_level: String,
    pub log_format: LogFormat,
    pub metrics_listen: Option<SocketAddr>,
    pub metrics_topics_interval: Duration,
    pub cores: u32,
    /// The write core (`None`: the last executor).
    pub raft_core: Option<u32>,
    /// Present when `cluster.enabled`.
    pub cluster: Option<ClusterSettings>,
    /// Keys given under an old name (logged as warnings at start).
    pub deprecated: Vec<String>,
}

impl Settings {
    /// What a publish (and a reschedule) is checked against.
    #[must_use]
    pub fn publish_limits(&self) -> futureq_core::publish::PublishLimits {
        futureq_core::publish::PublishLimits {
            max_delay_ms: i64::try_from(self.max_delay.as_millis()).unwrap_or(i64::MAX),
            min_ack_level: self.min_ack_level,
        }
    }
}

/// Validated `cluster.*` settings.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct ClusterSettings {
    pub node_id: u64,
    pub shard_id: u64,
    pub join_seeds: Vec<String>,
    pub raft_listen: SocketAddr,
    pub raft_advertise: String,
    pub data_dir: PathBuf,
    pub initial_members: BTreeMap<u64, String>,
    pub rtt: Duration,
    pub snapshot_entries: u64,
    pub compaction_overhead: u64,
    /// `cluster.secret` or the contents of `cluster.secretFile` (empty = none).
    pub secret: PeerSecret,
    /// `cluster.tls`, loaded: mutual TLS on every peer link and between nodes' client planes.
    pub tls: Option<Arc<PeerTls>>,
}
