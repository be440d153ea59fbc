//! The configuration file's keys as written (camelCase YAML), and their built-in defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The configuration file as written (camelCase YAML).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Config {
    pub config_version: u32,
    pub api: Api,
    pub cluster: Cluster,
    pub storage: Storage,
    pub publish: Publish,
    pub delivery: Delivery,
    pub observability: Observability,
    pub runtime: Runtime,
    pub compat: Compat,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Api {
    pub grpc: Grpc,
    pub auth: Auth,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Auth {
    pub principals_file: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Tls {
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
    pub client_auth: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Grpc {
    pub listen: String,
    pub advertise: String,
    pub max_concurrent_streams: u32,
    pub max_receive_message_size: String,
    pub max_send_message_size: String,
    pub keepalive_timeout: String,
    pub handshake_timeout: String,
    pub tls: Tls,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Cluster {
    pub enabled: bool,
    pub node_id: u64,
    pub shard_id: u64,
    pub join_seeds: Vec<String>,
    pub secret: String,
    pub secret_file: String,
    pub tls: ClusterTls,
    pub raft: Raft,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ClusterTls {
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
    pub server_name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Raft {
    pub listen: String,
    pub advertise: String,
    pub data_dir: String,
    pub initial_members: BTreeMap<u64, String>,
    pub rtt: String,
    pub snapshot_entries: u64,
    pub compaction_overhead: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Storage {
    pub data_dir: String,
    pub mode: String,
    pub cache_size: String,
    pub min_free_bytes: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Publish {
    pub min_ack_level: String,
    pub proposal_timeout: String,
    pub max_queue_delay: String,
    pub max_delay: String,
    pub dedup_window: String,
    pub stream_idle_timeout: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Delivery {
    pub consumer_queue_size: u32,
    pub time_bucket: String,
    pub in_flight_timeout: String,
    pub delete_batch_interval: String,
    pub ttl_sweep_interval: String,
    pub read_ahead: String,
    pub scan_max_keys: u32,
    pub max_attempts: u32,
}

/// Delivery keys of the original broker, accepted (and validated with its bounds) so that its
/// settings carry over, unused here: the dispatcher is timer-driven and delivers from the
/// leader only. The one place such keys live; [`Compat::validate`] is their one validator.
/// Named under `delivery` (their old place) they are read here with a warning.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Compat {
    pub dispatch_poll_interval: String,
    pub prepare_batch_size: u32,
    pub prepare_batch_bytes: String,
    pub scan_work_budget: String,
    pub prepare_timeout: String,
    pub prepare_workers: u32,
}

impl Compat {
    /// Keys moved here from `delivery` (an older configuration file names them there).
    pub(super) const MOVED_FROM_DELIVERY: [&'static str; 6] = [
        "dispatchPollInterval",
        "prepareBatchSize",
        "prepareBatchBytes",
        "scanWorkBudget",
        "prepareTimeout",
        "prepareWorkers",
    ];
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Observability {
    pub logging: Logging,
    pub metrics: Metrics,
}

/// How log lines are written (`observability.logging.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colour only when stderr is a terminal.
    Text,
    /// One JSON object per line (timestamp, level, target, message, fields).
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Logging {
    pub level: String,
    /// `text` (one line per event; colour only on a terminal) or `json` (one object per line).
    pub format: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Metrics {
    pub listen: String,
    /// How often the per-topic gauges are read (the store's topic counts, the dispatcher's
    /// deliveries in flight).
    pub topics_interval: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Runtime {
    pub cores: u32,
    /// The write core; `None` (empty): the last executor, so that the write core and the
    /// dispatcher's core 0 are apart whenever there are two executors or more.
    pub raft_core: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            config_version: 1,
            api: Api {
                grpc: Grpc {
                    listen: "127.0.0.1:8443".into(),
                    advertise: String::new(),
                    max_concurrent_streams: 1024,
                    max_receive_message_size: "4MiB".into(),
                    max_send_message_size: "4MiB".into(),
                    keepalive_timeout: "5s".into(),
                    handshake_timeout: "10s".into(),
                    tls: Tls {
                        cert_file: String::new(),
                        key_file: String::new(),
                        ca_file: String::new(),
                        client_auth: "none".into(),
                    },
                },
                auth: Auth {
                    principals_file: String::new(),
                },
            },
            cluster: Cluster {
                enabled: false,
                node_id: 1,
                shard_id: 1,
                join_seeds: Vec::new(),
                secret: String::new(),
                secret_file: String::new(),
                tls: ClusterTls {
                    cert_file: String::new(),
                    key_file: String::new(),
                    ca_file: String::new(),
                    server_name: String::new(),
                },
                raft: Raft {
                    listen: "0.0.0.0:50005".into(),
                    advertise: String::new(),
                    data_dir: "./raft-data".into(),
                    initial_members: BTreeMap::new(),
                    rtt: "20ms".into(),
                    snapshot_entries: 10_000,
                    compaction_overhead: 5_000,
                },
            },
            storage: Storage {
                data_dir: "./data".into(),
                mode: "disk".into(),
                cache_size: "64MiB".into(),
                min_free_bytes: "256MiB".into(),
            },
            publish: Publish {
                min_ack_level: "quorum".into(),
                proposal_timeout: "5s".into(),
                max_queue_delay: "50ms".into(),
                max_delay: "365d".into(),
                dedup_window: "10m".into(),
                stream_idle_timeout: "5m".into(),
            },
            delivery: Delivery {
                consumer_queue_size: 1024,
                time_bucket: "1ms".into(),
                in_flight_timeout: "5s".into(),
                delete_batch_interval: "500ms".into(),
                ttl_sweep_interval: "1m".into(),
                read_ahead: "0ms".into(),
                scan_max_keys: 256,
                max_attempts: 0,
            },
            observability: Observability {
                logging: Logging {
                    level: "info".into(),
                    format: "text".into(),
                },
                metrics: Metrics {
                    listen: "127.0.0.1:9090".into(),
                    topics_interval: "10s".into(),
                },
            },
            runtime: Runtime {
                cores: 0,
                raft_core: None,
            },
            compat: Compat {
                dispatch_poll_interval: "5ms".into(),
                prepare_batch_size: 64,
                prepare_batch_bytes: "256KiB".into(),
                scan_work_budget: "5ms".into(),
                prepare_timeout: "250ms".into(),
                prepare_workers: 2,
            },
        }
    }
}
