//! Configuration: built-in defaults → YAML file → `FUTUREQ_*` environment, then validation
//! into typed [`Settings`]. Unknown keys are errors; every error names its key.

use std::collections::{BTreeMap, BTreeSet};

use futureq_net::peer_link::PeerSecret;
use futureq_net::tls::{
    ClientAuth, PeerFiles, PeerTls, ReloadableServer, ServerFiles, TlsError, ALPN_H2,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futureq_core::AckLevel;
use serde::{Deserialize, Serialize};
use yaml_serde::Value;

/// A configuration error; the message names the key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err<T>(key: &str, msg: impl std::fmt::Display) -> Result<T, ConfigError> {
    Err(ConfigError(format!("{key}: {msg}")))
}

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
    const MOVED_FROM_DELIVERY: [&'static str; 6] = [
        "dispatchPollInterval",
        "prepareBatchSize",
        "prepareBatchBytes",
        "scanWorkBudget",
        "prepareTimeout",
        "prepareWorkers",
    ];

    /// Checks the original's bounds (`scan_max_keys`: `delivery.scanMaxKeys`, which must be
    /// at least `compat.prepareBatchSize`, as the original required).
    fn validate(&self, scan_max_keys: u32) -> Result<(), ConfigError> {
        dur("compat.dispatchPollInterval", &self.dispatch_poll_interval)?;
        if !(1..=64).contains(&self.prepare_batch_size) {
            return err(
                "compat.prepareBatchSize",
                format!("{} must be 1..64", self.prepare_batch_size),
            );
        }
        let pbb = size("compat.prepareBatchBytes", &self.prepare_batch_bytes)?;
        if pbb > 256 << 10 {
            return err("compat.prepareBatchBytes", "must be at most 256KiB");
        }
        if scan_max_keys < self.prepare_batch_size {
            return err(
                "delivery.scanMaxKeys",
                "must be at least compat.prepareBatchSize",
            );
        }
        if dur("compat.scanWorkBudget", &self.scan_work_budget)? > Duration::from_millis(100) {
            return err("compat.scanWorkBudget", "must be at most 100ms");
        }
        if dur("compat.prepareTimeout", &self.prepare_timeout)? > Duration::from_secs(1) {
            return err("compat.prepareTimeout", "must be at most 1s");
        }
        if self.prepare_workers == 0 {
            return err("compat.prepareWorkers", "must be at least 1");
        }
        Ok(())
    }
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

/// A duration or size in the configuration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    /// Digits only.
    #[error("{input:?} has no unit ({units})")]
    NoUnit {
        /// The value.
        input: String,
        /// The units accepted.
        units: &'static str,
    },
    /// No number before the unit.
    #[error("{input:?} is not {what} (e.g. {example})")]
    NotANumber {
        /// The value.
        input: String,
        /// "a duration" or "a size".
        what: &'static str,
        /// An example.
        example: &'static str,
    },
    /// A unit that is not accepted.
    #[error("{input:?} has unknown unit {unit:?} ({units})")]
    UnknownUnit {
        /// The value.
        input: String,
        /// Its unit.
        unit: String,
        /// The units accepted.
        units: &'static str,
    },
    /// A size of zero.
    #[error("{0:?} must be greater than zero")]
    Zero(String),
    /// A size past the address space.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

const DURATION_UNITS: &str = "ns, us, ms, s, m, h, d";
const SIZE_UNITS: &str = "B, KiB, MiB, GiB (binary), KB, MB, GB (decimal)";

/// Splits `s` into its digits and its unit.
fn number_and_unit(
    s: &str,
    units: &'static str,
    what: &'static str,
    example: &'static str,
) -> Result<(u64, String), UnitError> {
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or(UnitError::NoUnit {
            input: s.to_owned(),
            units,
        })?;
    let (num, unit) = s.split_at(split);
    let n = num.parse().map_err(|_| UnitError::NotANumber {
        input: s.to_owned(),
        what,
        example,
    })?;
    Ok((n, unit.to_owned()))
}

/// Parses a duration such as `500ms`, `5s`, `1m`, `2h`, `365d` (also `us`, `ns`).
///
/// # Errors
/// Not a non-negative integer followed by a known unit.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let s = s.trim();
    let (n, unit) = number_and_unit(s, DURATION_UNITS, "a duration", "500ms, 5s")?;
    Ok(match unit.as_str() {
        "ns" => Duration::from_nanos(n),
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "d" => Duration::from_secs(n.saturating_mul(86_400)),
        _ => {
            return Err(UnitError::UnknownUnit {
                input: s.to_owned(),
                unit,
                units: DURATION_UNITS,
            })
        }
    })
}

/// Parses a size such as `4MiB` or `4MB` (units B, KiB, MiB, GiB: binary; KB, MB, GB:
/// decimal).
///
/// # Errors
/// Not a positive integer followed by a known unit.
pub fn parse_size(s: &str) -> Result<usize, UnitError> {
    let s = s.trim();
    let (n, unit) = number_and_unit(s, SIZE_UNITS, "a size", "4MiB")?;
    let mult: u64 = match unit.as_str() {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(UnitError::UnknownUnit {
                input: s.to_owned(),
                unit,
                units: SIZE_UNITS,
            })
        }
    };
    if n == 0 {
        return Err(UnitError::Zero(s.to_owned()));
    }
    n.checked_mul(mult)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| UnitError::TooLarge(s.to_owned()))
}

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

/// The host of an advertised `host:port` (brackets of an IPv6 address removed).
fn advertise_host(advertise: &str) -> String {
    let host = advertise.rsplit_once(':').map_or("", |(h, _)| h);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

/// `cluster.tls` checked: `None` when no certificate is set.
fn peer_files(t: &ClusterTls) -> Result<Option<PeerFiles>, ConfigError> {
    let set = [&t.cert_file, &t.key_file, &t.ca_file];
    if set.iter().all(|f| f.is_empty()) {
        if !t.server_name.is_empty() {
            return err("cluster.tls.certFile", "is required with serverName");
        }
        return Ok(None);
    }
    for (key, v) in [
        ("cluster.tls.certFile", &t.cert_file),
        ("cluster.tls.keyFile", &t.key_file),
        ("cluster.tls.caFile", &t.ca_file),
    ] {
        if v.is_empty() {
            return err(key, "is required: mutual TLS between nodes needs the node's certificate, its key and the cluster CA");
        }
    }
    Ok(Some(PeerFiles {
        cert: PathBuf::from(&t.cert_file),
        key: PathBuf::from(&t.key_file),
        ca: PathBuf::from(&t.ca_file),
        server_name: (!t.server_name.is_empty()).then(|| t.server_name.clone()),
    }))
}

/// `api.grpc.tls` checked and loaded: `None` when no certificate is set.
fn client_tls(
    t: &Tls,
    cluster: Option<&PeerFiles>,
) -> Result<Option<Arc<ReloadableServer>>, ConfigError> {
    let Some(client_auth) = ClientAuth::from_name(&t.client_auth) else {
        return err(
            "api.grpc.tls.clientAuth",
            format!("{:?} must be none, optional or require", t.client_auth),
        );
    };
    match (t.cert_file.is_empty(), t.key_file.is_empty()) {
        (true, true) => {
            if !t.ca_file.is_empty() || client_auth != ClientAuth::None {
                return err(
                    "api.grpc.tls.certFile",
                    "is required when api.grpc.tls.caFile or clientAuth is set",
                );
            }
            return Ok(None);
        }
        (false, true) => return err("api.grpc.tls.keyFile", "is required with certFile"),
        (true, false) => return err("api.grpc.tls.certFile", "is required with keyFile"),
        (false, false) => {}
    }
    if client_auth != ClientAuth::None && t.ca_file.is_empty() {
        return err(
            "api.grpc.tls.caFile",
            format!(
                "is required when clientAuth is {} (client certificates are verified against it)",
                t.client_auth
            ),
        );
    }
    let mut files = ServerFiles {
        cert: PathBuf::from(&t.cert_file),
        key: PathBuf::from(&t.key_file),
        cas: if t.ca_file.is_empty() {
            Vec::new()
        } else {
            vec![PathBuf::from(&t.ca_file)]
        },
        client_auth,
        cluster_ca: None,
    };
    if let Some(c) = cluster {
        // The nodes' own calls (join, leave, the cluster info) present their certificate:
        // it is asked for, and the cluster CA verifies it.
        files.cluster_ca = Some(c.ca.clone());
        if files.client_auth == ClientAuth::None {
            files.client_auth = ClientAuth::Optional;
        }
    }
    match ReloadableServer::load(files, &[ALPN_H2]) {
        Ok(r) => Ok(Some(Arc::new(r))),
        Err(e) => {
            let key = match &e {
                TlsError::NoKey { .. } | TlsError::Pair { .. } => "api.grpc.tls.keyFile",
                TlsError::BadCa { .. } | TlsError::Verifier(_) => "api.grpc.tls.caFile",
                TlsError::Pem { path, .. } if path.as_os_str() == t.key_file.as_str() => {
                    "api.grpc.tls.keyFile"
                }
                TlsError::Pem { path, .. } if path.as_os_str() == t.ca_file.as_str() => {
                    "api.grpc.tls.caFile"
                }
                _ => "api.grpc.tls.certFile",
            };
            err(key, e)
        }
    }
}

/// A `host:port` other nodes or clients can dial (no wildcard address).
fn dialable(key: &str, v: &str) -> Result<(), ConfigError> {
    let a = addr(key, v)?;
    if a.ip().is_unspecified() {
        return err(
            key,
            format!("{v:?} must not be a wildcard address (0.0.0.0 or ::)"),
        );
    }
    Ok(())
}

fn addr(key: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    match v.parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(a),
        Ok(_) => err(key, format!("{v:?}: port must be 1..65535")),
        Err(_) => err(key, format!("{v:?} is not host:port (e.g. 127.0.0.1:8443)")),
    }
}

fn dur(key: &str, v: &str) -> Result<Duration, ConfigError> {
    match parse_duration(v) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => err(key, "must be greater than zero"),
        Err(e) => err(key, e),
    }
}

fn size(key: &str, v: &str) -> Result<usize, ConfigError> {
    parse_size(v).or_else(|e| err(key, e))
}

/// The cluster's TLS files, the client plane's TLS and the principals (see
/// `Config::tls_and_auth`).
type TlsAndAuth = (
    Option<PeerFiles>,
    Option<Arc<ReloadableServer>>,
    Option<Arc<crate::auth::Auth>>,
);

impl Config {
    /// Checks every key and builds [`Settings`].
    ///
    /// # Errors
    /// The first invalid key, named in the message.
    #[allow(clippy::too_many_lines)]
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        if self.config_version != 1 {
            return err(
                "configVersion",
                format!("must be 1, got {}", self.config_version),
            );
        }
        let g = &self.api.grpc;
        let grpc_listen = addr("api.grpc.listen", &g.listen)?;
        if !g.advertise.is_empty() {
            let a = addr("api.grpc.advertise", &g.advertise)?;
            if a.ip().is_unspecified() {
                return err(
                    "api.grpc.advertise",
                    "must not be a wildcard address (0.0.0.0 or ::)",
                );
            }
        }
        if g.max_concurrent_streams == 0 {
            return err("api.grpc.maxConcurrentStreams", "must be greater than zero");
        }
        let max_recv_message_len = size(
            "api.grpc.maxReceiveMessageSize",
            &g.max_receive_message_size,
        )?;
        let max_send_message_len = size("api.grpc.maxSendMessageSize", &g.max_send_message_size)?;
        let keepalive_timeout = dur("api.grpc.keepaliveTimeout", &g.keepalive_timeout)?;
        let handshake_timeout = dur("api.grpc.handshakeTimeout", &g.handshake_timeout)?;
        if handshake_timeout < Duration::from_millis(100) {
            return err("api.grpc.handshakeTimeout", "must be at least 100ms");
        }
        let (peer_files, grpc_tls, auth) = self.tls_and_auth(grpc_listen)?;
        let cluster = self.cluster_checked(peer_files, auth.is_some())?;
        let (memory_storage, cache_bytes, min_free_bytes) =
            self.storage_settings(cluster.is_some())?;
        let (min_ack_level, proposal_timeout, max_delay, dedup_window, stream_idle_timeout) =
            self.publish_settings()?;
        let d = &self.delivery;
        let (tb, in_flight_timeout, delete_batch_interval, ttl_sweep_interval, read_ahead) =
            self.delivery_settings()?;
        self.compat.validate(d.scan_max_keys)?;
        let (level, log_format, metrics_listen, metrics_topics_interval) =
            self.observability_settings()?;
        Ok(Settings {
            grpc_listen,
            grpc_advertise: if g.advertise.is_empty() {
                g.listen.clone()
            } else {
                g.advertise.clone()
            },
            max_concurrent_streams: g.max_concurrent_streams,
            max_recv_message_len,
            max_send_message_len,
            keepalive_timeout,
            handshake_timeout,
            security: Arc::new(crate::security::Security::new(
                grpc_tls,
                cluster.as_ref().and_then(|c| c.tls.clone()),
                auth,
                advertise_host(&self.api.grpc.advertise),
            )),
            node_id: self.cluster.node_id,
            data_dir: PathBuf::from(&self.storage.data_dir),
            memory_storage,
            cache_bytes,
            min_free_bytes,
            min_ack_level,
            proposal_timeout,
            max_delay,
            dedup_window,
            stream_idle_timeout,
            max_attempts: d.max_attempts,
            consumer_queue_size: d.consumer_queue_size,
            time_bucket_ms: u64::try_from(tb.as_millis()).unwrap_or(u64::MAX),
            in_flight_timeout,
            delete_batch_interval,
            ttl_sweep_interval,
            read_ahead,
            scan_max_keys: d.scan_max_keys as usize,
            log_level: level.to_owned(),
            log_format,
            metrics_listen,
            metrics_topics_interval,
            cores: self.runtime.cores,
            raft_core: self.runtime.raft_core,
            cluster,
            deprecated: Vec::new(),
        })
    }

    /// `cluster.*` when enabled (with its TLS loaded), checked also when not: a clustered
    /// node with principals needs the cluster secret.
    fn cluster_checked(
        &self,
        peer_files: Option<PeerFiles>,
        principals: bool,
    ) -> Result<Option<ClusterSettings>, ConfigError> {
        let c = &self.cluster;
        if !c.join_seeds.is_empty() && !c.raft.initial_members.is_empty() {
            return err(
                "cluster.joinSeeds",
                "cluster.joinSeeds and cluster.raft.initialMembers cannot both be set",
            );
        }
        let rtt = dur("cluster.raft.rtt", &c.raft.rtt)?;
        if rtt.subsec_nanos() % 1_000_000 != 0 {
            return err("cluster.raft.rtt", "must be whole milliseconds");
        }
        if c.raft.snapshot_entries == 0 {
            return err("cluster.raft.snapshotEntries", "must be greater than zero");
        }
        if c.raft.compaction_overhead == 0 {
            return err(
                "cluster.raft.compactionOverhead",
                "must be greater than zero",
            );
        }
        let cluster = if c.enabled {
            let mut settings = self.cluster_settings(rtt)?;
            settings.tls = self.peer_tls(peer_files)?;
            Some(settings)
        } else {
            None
        };
        if cluster.as_ref().is_some_and(|c| c.secret.is_open()) && principals {
            // Joining nodes prove they belong to the cluster with its secret, not a token.
            return err(
                "cluster.secret",
                "is required with api.auth.principalsFile on a clustered node: nodes join with it",
            );
        }
        Ok(cluster)
    }

    /// `storage.*`: in memory or not, the page cache and the free-space floor.
    fn storage_settings(&self, clustered: bool) -> Result<(bool, usize, u64), ConfigError> {
        let memory_storage = match self.storage.mode.as_str() {
            "disk" => false,
            "memory" => true,
            m => return err("storage.mode", format!("{m:?} must be disk or memory")),
        };
        if memory_storage && clustered {
            // The Raft log purges entries behind snapshots of the store: a store lost at
            // exit cannot be rebuilt from it, and the node would serve an empty replica.
            return err(
                "storage.mode",
                "memory cannot be used with cluster.enabled: a clustered node needs storage.mode: disk",
            );
        }
        if !memory_storage && self.storage.data_dir.trim().is_empty() {
            return err("storage.dataDir", "is required when storage.mode is disk");
        }
        let cache_bytes = size("storage.cacheSize", &self.storage.cache_size)?;
        let min_free_bytes = size("storage.minFreeBytes", &self.storage.min_free_bytes)? as u64;
        Ok((memory_storage, cache_bytes, min_free_bytes))
    }

    /// `publish.*`: the lowest ack level, the proposal timeout, the longest delay, the dedup
    /// window and the idle timeout of a publish stream.
    fn publish_settings(
        &self,
    ) -> Result<(AckLevel, Duration, Duration, Duration, Duration), ConfigError> {
        let p = &self.publish;
        let min_ack_level = match p.min_ack_level.as_str() {
            "quorum" => AckLevel::Quorum,
            "leader" => AckLevel::Leader,
            "noAck" => AckLevel::NoAck,
            v => {
                return err(
                    "publish.minAckLevel",
                    format!("{v:?} must be quorum, leader or noAck"),
                )
            }
        };
        let proposal_timeout = dur("publish.proposalTimeout", &p.proposal_timeout)?;
        let max_delay = dur("publish.maxDelay", &p.max_delay)?;
        let dedup_window = dur("publish.dedupWindow", &p.dedup_window)?;
        if dedup_window > Duration::from_secs(7 * 86_400) {
            return err("publish.dedupWindow", "must be at most 7d");
        }
        // A retry after an unknown outcome (a timeout, a failover) must still find its id.
        if dedup_window < Duration::from_secs(60) {
            return err(
                "publish.dedupWindow",
                "must be at least 1m (a publish retried after a timeout must still find its id)",
            );
        }
        let stream_idle_timeout = dur("publish.streamIdleTimeout", &p.stream_idle_timeout)?;
        if stream_idle_timeout < Duration::from_secs(1) {
            return err("publish.streamIdleTimeout", "must be at least 1s");
        }
        Ok((
            min_ack_level,
            proposal_timeout,
            max_delay,
            dedup_window,
            stream_idle_timeout,
        ))
    }

    /// `delivery.*`'s durations: the time bucket, the in-flight timeout, the delete batch
    /// and TTL sweep intervals, the read-ahead window (and the queue and scan sizes checked).
    fn delivery_settings(
        &self,
    ) -> Result<(Duration, Duration, Duration, Duration, Duration), ConfigError> {
        let d = &self.delivery;
        if !(1..=65_536).contains(&d.consumer_queue_size) {
            return err(
                "delivery.consumerQueueSize",
                format!("{} must be 1..65536", d.consumer_queue_size),
            );
        }
        let tb = parse_duration(&d.time_bucket).or_else(|e| err("delivery.timeBucket", e))?;
        if !tb.is_zero() && tb < Duration::from_millis(1) {
            return err("delivery.timeBucket", "must be 0 or at least 1ms");
        }
        let in_flight_timeout = dur("delivery.inFlightTimeout", &d.in_flight_timeout)?;
        let delete_batch_interval = dur("delivery.deleteBatchInterval", &d.delete_batch_interval)?;
        let ttl_sweep_interval = dur("delivery.ttlSweepInterval", &d.ttl_sweep_interval)?;
        let read_ahead = parse_duration(&d.read_ahead).or_else(|e| err("delivery.readAhead", e))?;
        if read_ahead > Duration::from_secs(10) {
            return err("delivery.readAhead", "must be at most 10s");
        }
        if d.scan_max_keys < 2 {
            return err("delivery.scanMaxKeys", "must be at least 2");
        }
        Ok((
            tb,
            in_flight_timeout,
            delete_batch_interval,
            ttl_sweep_interval,
            read_ahead,
        ))
    }

    /// The TLS files of both planes and the principals: a cluster's TLS on both planes or
    /// neither, the client plane's certificate vouched for by the cluster CA, no token in
    /// clear beyond loopback.
    fn tls_and_auth(&self, grpc_listen: SocketAddr) -> Result<TlsAndAuth, ConfigError> {
        let g = &self.api.grpc;
        let peer_files = if self.cluster.enabled {
            peer_files(&self.cluster.tls)?
        } else {
            None
        };
        let client_tls_on = !g.tls.cert_file.is_empty();
        if self.cluster.enabled && peer_files.is_some() != client_tls_on {
            return err(
                if peer_files.is_some() { "api.grpc.tls.certFile" } else { "cluster.tls.certFile" },
                "a cluster's TLS is on both planes or on neither: nodes call each other's client plane (join, leave, the cluster info) with their cluster certificate, and the client plane must not carry the cluster secret in clear",
            );
        }
        let grpc_tls = client_tls(&g.tls, peer_files.as_ref())?;
        if let (Some(files), false) = (&peer_files, g.advertise.is_empty()) {
            // Nodes dial each other's client plane at its advertised address.
            let host = advertise_host(&g.advertise);
            futureq_net::tls::check_for_cluster(Path::new(&g.tls.cert_file), files, &host)
                .or_else(|e| err("api.grpc.tls.certFile", e))?;
        }
        let auth = match self.api.auth.principals_file.as_str() {
            "" => None,
            f => Some(Arc::new(
                crate::auth::Auth::load(Path::new(f))
                    .or_else(|e| err("api.auth.principalsFile", e))?,
            )),
        };
        if auth.is_some() && grpc_tls.is_none() && !grpc_listen.ip().is_loopback() {
            return err(
                "api.auth.principalsFile",
                format!("tokens would cross the network in clear: api.grpc.listen {grpc_listen} is not a loopback address and api.grpc.tls is off (set api.grpc.tls.certFile and keyFile)"),
            );
        }
        Ok((peer_files, grpc_tls, auth))
    }

    /// `cluster.tls` loaded, each failure named by the key of its file.
    fn peer_tls(&self, files: Option<PeerFiles>) -> Result<Option<Arc<PeerTls>>, ConfigError> {
        let c = &self.cluster;
        let Some(files) = files else {
            return Ok(None);
        };
        PeerTls::load(files)
            .map(|t| Some(Arc::new(t)))
            .or_else(|e| {
                let key = match &e {
                    TlsError::ServerName(_) => "cluster.tls.serverName",
                    TlsError::NoKey { .. } | TlsError::Pair { .. } => "cluster.tls.keyFile",
                    TlsError::BadCa { .. } | TlsError::Verifier(_) => "cluster.tls.caFile",
                    TlsError::Pem { path, .. } if path.as_os_str() == c.tls.key_file.as_str() => {
                        "cluster.tls.keyFile"
                    }
                    TlsError::Pem { path, .. } if path.as_os_str() == c.tls.ca_file.as_str() => {
                        "cluster.tls.caFile"
                    }
                    _ => "cluster.tls.certFile",
                };
                err(key, e)
            })
    }

    /// `observability.*`: log level and format, the metrics listener and its refresh.
    fn observability_settings(
        &self,
    ) -> Result<(&str, LogFormat, Option<SocketAddr>, Duration), ConfigError> {
        let level = self.observability.logging.level.as_str();
        if !["trace", "debug", "info", "warn", "error"].contains(&level) {
            return err(
                "observability.logging.level",
                format!("{level:?} must be trace, debug, info, warn or error"),
            );
        }
        let log_format = match self.observability.logging.format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return err(
                    "observability.logging.format",
                    format!("{other:?} must be text or json"),
                )
            }
        };
        let ml = &self.observability.metrics.listen;
        let metrics_listen = if ml.is_empty() {
            None
        } else {
            Some(addr("observability.metrics.listen", ml)?)
        };
        let metrics_topics_interval = dur(
            "observability.metrics.topicsInterval",
            &self.observability.metrics.topics_interval,
        )?;
        if metrics_topics_interval < Duration::from_millis(100) {
            // Each refresh reads every topic's row.
            return err(
                "observability.metrics.topicsInterval",
                "must be at least 100ms",
            );
        }
        Ok((level, log_format, metrics_listen, metrics_topics_interval))
    }

    /// Validates `cluster.*` for a clustered node.
    fn cluster_settings(&self, rtt: Duration) -> Result<ClusterSettings, ConfigError> {
        let c = &self.cluster;
        if self.api.grpc.advertise.is_empty() {
            return err(
                "api.grpc.advertise",
                "is required when cluster.enabled (the address clients are sent to)",
            );
        }
        if c.node_id == 0 {
            return err("cluster.nodeId", "must not be 0 when cluster.enabled");
        }
        if c.shard_id == 0 {
            return err("cluster.shardId", "must not be 0 when cluster.enabled");
        }
        let raft_listen = addr("cluster.raft.listen", &c.raft.listen)?;
        if c.raft.advertise.is_empty() {
            return err(
                "cluster.raft.advertise",
                "is required when cluster.enabled (the address peers dial)",
            );
        }
        dialable("cluster.raft.advertise", &c.raft.advertise)?;
        if c.raft.data_dir.trim().is_empty() {
            return err("cluster.raft.dataDir", "must not be empty");
        }
        for (id, a) in &c.raft.initial_members {
            if *id == 0 {
                return err("cluster.raft.initialMembers", "node ids must not be 0");
            }
            dialable("cluster.raft.initialMembers", a)?;
        }
        if !c.raft.initial_members.is_empty()
            && c.raft.initial_members.get(&c.node_id) != Some(&c.raft.advertise)
        {
            return err(
                "cluster.raft.initialMembers",
                format!(
                    "must map this node (cluster.nodeId {}) to cluster.raft.advertise {:?}",
                    c.node_id, c.raft.advertise
                ),
            );
        }
        for s in &c.join_seeds {
            dialable("cluster.joinSeeds", s)?;
        }
        let secret_key = if c.secret_file.is_empty() {
            "cluster.secret"
        } else {
            "cluster.secretFile"
        };
        let secret = match (c.secret.is_empty(), c.secret_file.is_empty()) {
            (_, true) => c.secret.clone(),
            (true, false) => {
                let text = std::fs::read_to_string(&c.secret_file).or_else(|e| {
                    err(
                        "cluster.secretFile",
                        format!("cannot read {:?}: {e}", c.secret_file),
                    )
                })?;
                let text = text.trim_end_matches(['\n', '\r']).to_owned();
                if text.is_empty() {
                    return err(
                        "cluster.secretFile",
                        format!("{:?} is empty", c.secret_file),
                    );
                }
                text
            }
            (false, false) => {
                return err(
                    "cluster.secretFile",
                    "cluster.secret and cluster.secretFile cannot both be set",
                )
            }
        };
        Ok(ClusterSettings {
            node_id: c.node_id,
            shard_id: c.shard_id,
            join_seeds: c.join_seeds.clone(),
            raft_listen,
            raft_advertise: c.raft.advertise.clone(),
            data_dir: PathBuf::from(&c.raft.data_dir),
            initial_members: c.raft.initial_members.clone(),
            rtt,
            snapshot_entries: c.raft.snapshot_entries,
            compaction_overhead: c.raft.compaction_overhead,
            secret: {
                // It travels in a gRPC header: visible ASCII only.
                if secret.len() > 1024 || !secret.bytes().all(|b| b.is_ascii_graphic()) {
                    return err(
                        secret_key,
                        "must be at most 1024 visible ASCII characters (no spaces)",
                    );
                }
                PeerSecret::new(secret.as_bytes())
            },
            tls: None, // loaded by `validate` with the client plane's
        })
    }
}

/// Reports keys of `file` that the defaults do not have (maps with free keys excepted).
fn unknown_keys(defaults: &Value, file: &Value, path: &str, out: &mut Vec<String>) {
    let (Value::Mapping(d), Value::Mapping(f)) = (defaults, file) else {
        return;
    };
    if d.is_empty() {
        return; // free-form map such as cluster.raft.initialMembers
    }
    for (k, v) in f {
        let name = k.as_str().map_or_else(|| format!("{k:?}"), str::to_owned);
        let full = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        match d.get(k) {
            None => out.push(full),
            Some(dv) => unknown_keys(dv, v, &full, out),
        }
    }
}

fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) if !b.is_empty() => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(bv) => merge(bv, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Applies `FUTUREQ_*` variables to every leaf of the tree (key path upper-cased, dots and
/// dashes → underscores). The shape comes from `defaults`: a map that is empty there (such as
/// `cluster.raft.initialMembers`) is one leaf, so its variable replaces the whole map, also
/// one from the file. Lists are comma-separated; maps and scalars are parsed as YAML. Every
/// variable used is added to `used`.
fn apply_env(
    defaults: &Value,
    v: &mut Value,
    path: &str,
    env: &BTreeMap<String, String>,
    used: &mut BTreeSet<String>,
) -> Result<(), ConfigError> {
    if let (Value::Mapping(d), Value::Mapping(m)) = (defaults, &mut *v) {
        if !d.is_empty() {
            for (k, dchild) in d {
                let name = k.as_str().unwrap_or_default();
                let full = if path.is_empty() {
                    name.to_owned()
                } else {
                    format!("{path}.{name}")
                };
                if let Some(child) = m.get_mut(k) {
                    apply_env(dchild, child, &full, env, used)?;
                }
            }
            return Ok(());
        }
    }
    let var = env_var_name(path);
    let Some(raw) = env.get(&var) else {
        return Ok(());
    };
    used.insert(var.clone());
    *v = match defaults {
        Value::String(_) => Value::String(raw.clone()),
        Value::Sequence(_) => Value::Sequence(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.into()))
                .collect(),
        ),
        _ => yaml_serde::from_str(raw)
            .or_else(|e| err(path, format!("environment {var}={raw:?}: {e}")))?,
    };
    Ok(())
}

/// The variable that sets configuration key `path`.
fn env_var_name(path: &str) -> String {
    format!("FUTUREQ_{}", path.to_uppercase().replace(['.', '-'], "_"))
}

/// The command-line client's own variables (`FUTUREQ_CLI_TLS_CA`, ...): not configuration keys.
pub const CLI_ENV_PREFIX: &str = "FUTUREQ_CLI_";

/// The `FUTUREQ_*` variables of this process's environment.
#[must_use]
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("FUTUREQ_"))
        .collect()
}

/// Loads the configuration: defaults, then the file (if any), then the environment.
///
/// # Errors
/// Unreadable file, bad YAML, unknown key, wrong type, or a failed validation; the message
/// names the key.
pub fn load(
    path: Option<&std::path::Path>,
    env: &BTreeMap<String, String>,
) -> Result<(Config, Settings), ConfigError> {
    load_for(path, env, Purpose::Broker)
}

/// What a configuration is loaded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Running the broker: every file it names is read and checked.
    Broker,
    /// A command that only needs addresses (the client commands, `certs`, `token`): the
    /// broker's certificates, keys and principals file are not read (a user who may not
    /// read them can still use the configuration's addresses).
    Addresses,
}

/// [`load`] for `purpose`.
///
/// # Errors
/// As [`load`].
pub fn load_for(
    path: Option<&std::path::Path>,
    env: &BTreeMap<String, String>,
    purpose: Purpose,
) -> Result<(Config, Settings), ConfigError> {
    let defaults = yaml_serde::to_value(Config::default()).expect("defaults serialize");
    let mut tree = defaults.clone();
    let mut deprecated = Vec::new();
    let env = &compat_env(env, &mut deprecated)?;
    if let Some(p) = path {
        let text = std::fs::read_to_string(p)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", p.display())))?;
        let file: Value = yaml_serde::from_str(&text)
            .map_err(|e| ConfigError(format!("{}: {e}", p.display())))?;
        let file = if file.is_null() {
            Value::Mapping(yaml_serde::Mapping::new())
        } else {
            file
        };
        if !file.is_mapping() {
            return Err(ConfigError(format!(
                "{}: the top level must be a mapping",
                p.display()
            )));
        }
        let mut file = file;
        deprecated.extend(move_compat_keys(&mut file)?);
        let mut unknown = Vec::new();
        unknown_keys(&defaults, &file, "", &mut unknown);
        if let Some(k) = unknown.first() {
            return err(k, "unknown configuration key");
        }
        if file.get("configVersion").is_none() {
            return err(
                "configVersion",
                "is required in a configuration file (configVersion: 1)",
            );
        }
        merge(&mut tree, file);
    }
    let mut used = BTreeSet::new();
    apply_env(&defaults, &mut tree, "", env, &mut used)?;
    if let Some(var) = env
        .keys()
        .find(|k| k.starts_with("FUTUREQ_") && !k.starts_with(CLI_ENV_PREFIX) && !used.contains(*k))
    {
        return Err(ConfigError(format!(
            "environment variable {var}: no configuration key is set by it (a FUTUREQ_* variable is the key path upper-cased with dots as underscores, e.g. FUTUREQ_API_GRPC_LISTEN)"
        )));
    }
    let mut cfg: Config = serde_path_to_error::deserialize(tree)
        .map_err(|e| ConfigError(format!("{}: {}", e.path(), e.inner())))?;
    if purpose == Purpose::Addresses {
        let defaults = Config::default();
        cfg.api.grpc.tls = defaults.api.grpc.tls;
        cfg.api.auth = defaults.api.auth;
        cfg.cluster.tls = defaults.cluster.tls;
        cfg.cluster.secret = defaults.cluster.secret;
        cfg.cluster.secret_file = defaults.cluster.secret_file;
    }
    let mut settings = cfg.validate()?;
    settings.deprecated = deprecated;
    Ok((cfg, settings))
}

/// Moves the compatibility keys a file names under `delivery` (where the original broker and
/// earlier versions had them) to `compat`; one warning per key.
///
/// # Errors
/// A key set in both places.
fn move_compat_keys(file: &mut Value) -> Result<Vec<String>, ConfigError> {
    let mut moved = Vec::new();
    let Some(Value::Mapping(delivery)) = file.get_mut("delivery") else {
        return Ok(moved);
    };
    let mut taken = Vec::new();
    for name in Compat::MOVED_FROM_DELIVERY {
        if let Some(v) = delivery.remove(name) {
            taken.push((name, v));
        }
    }
    if taken.is_empty() {
        return Ok(moved);
    }
    let Value::Mapping(top) = file else {
        return Ok(moved);
    };
    let compat = top
        .entry(Value::String("compat".into()))
        .or_insert_with(|| Value::Mapping(yaml_serde::Mapping::new()));
    let Value::Mapping(compat) = compat else {
        return err("compat", "must be a mapping");
    };
    for (name, v) in taken {
        if compat.contains_key(name) {
            return err(
                &format!("delivery.{name}"),
                format!(
                    "is set twice: here (its old place) and as compat.{name}; keep compat.{name}"
                ),
            );
        }
        compat.insert(Value::String(name.into()), v);
        moved.push(format!(
            "delivery.{name} is deprecated: it is read as compat.{name}"
        ));
    }
    Ok(moved)
}

/// The environment with `FUTUREQ_DELIVERY_<KEY>` of a compatibility key renamed to
/// `FUTUREQ_COMPAT_<KEY>` (one warning each).
///
/// # Errors
/// Both names set.
fn compat_env(
    env: &BTreeMap<String, String>,
    deprecated: &mut Vec<String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = env.clone();
    for name in Compat::MOVED_FROM_DELIVERY {
        let old = format!("FUTUREQ_DELIVERY_{}", name.to_uppercase());
        if let Some(v) = out.remove(&old) {
            let new = format!("FUTUREQ_COMPAT_{}", name.to_uppercase());
            if out.contains_key(&new) {
                return Err(ConfigError(format!(
                    "environment variables {old} and {new} are both set (the first is the old name of the second): keep {new}"
                )));
            }
            deprecated.push(format!(
                "environment variable {old} is deprecated: it is read as {new}"
            ));
            out.insert(new, v);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn env_of(vars: &[(&str, &str)]) -> BTreeMap<String, String> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn load_str(yaml: &str, env: &BTreeMap<String, String>) -> Result<Settings, ConfigError> {
        load_both(yaml, env).map(|(_, s)| s)
    }

    fn load_both(
        yaml: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<(Config, Settings), ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, yaml).unwrap();
        load(Some(&p), env)
    }

    #[test]
    fn example_file_equals_the_defaults() {
        let text = include_str!("../../../config.example.yaml");
        let example: Value = yaml_serde::from_str(text).unwrap();
        assert_eq!(example, yaml_serde::to_value(Config::default()).unwrap());
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn cluster_settings_are_checked() {
        let base = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 2\n  raft:\n    advertise: 127.0.0.2:50005\n";
        let ok = load_str(
            &format!(
                "{base}    initialMembers: {{1: \"127.0.0.1:50005\", 2: \"127.0.0.2:50005\"}}\n"
            ),
            &no_env(),
        )
        .unwrap();
        let c = ok.cluster.unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!(c.initial_members.len(), 2);
        assert_eq!(c.rtt, Duration::from_millis(20));
        for (yaml, fragment) in [
            ("configVersion: 1\ncluster:\n  enabled: true\n  raft:\n    advertise: 127.0.0.2:1\n", "api.grpc.advertise"),
            (&format!("{base}    initialMembers: {{1: \"127.0.0.1:50005\"}}\n"), "must map this node"),
            (&format!("{base}    initialMembers: {{0: \"127.0.0.1:50005\"}}\n"), "must not be 0"),
            (&format!("{base}    initialMembers: {{2: \"0.0.0.0:50005\"}}\n"), "wildcard"),
            (&base.replace("127.0.0.2:50005", "0.0.0.0:50005"), "cluster.raft.advertise"),
            (&base.replace("nodeId: 2", "nodeId: 0"), "nodeId"),
            (&format!("{base}  joinSeeds: [nohost]\n").replace("  raft:\n    advertise: 127.0.0.2:50005\n  joinSeeds", "  joinSeeds").replace("]\n", "]\n  raft:\n    advertise: 127.0.0.2:50005\n"), "cluster.joinSeeds"),
        ] {
            let e = load_str(yaml, &no_env()).unwrap_err().to_string();
            assert!(e.contains(fragment), "{yaml}: {e}");
        }
    }

    #[test]
    fn defaults_without_a_file() {
        let (_, s) = load(None, &no_env()).unwrap();
        assert_eq!(s.grpc_listen.to_string(), "127.0.0.1:8443");
        assert_eq!(s.metrics_listen.unwrap().to_string(), "127.0.0.1:9090");
        assert_eq!(s.max_recv_message_len, 4 << 20);
        assert_eq!(s.consumer_queue_size, 1024);
        assert_eq!(s.in_flight_timeout, Duration::from_secs(5));
        assert_eq!(s.max_delay, Duration::from_secs(365 * 86_400));
        assert!(!s.memory_storage);
    }

    #[test]
    fn the_write_core_is_the_last_executor_unless_named() {
        let (_, s) = load(None, &no_env()).unwrap();
        assert_eq!(s.raft_core, None);
        let s = load_str("configVersion: 1\nruntime:\n  raftCore: 0\n", &no_env()).unwrap();
        assert_eq!(s.raft_core, Some(0));
        let env = env_of(&[("FUTUREQ_RUNTIME_RAFTCORE", "1")]);
        assert_eq!(load(None, &env).unwrap().1.raft_core, Some(1));
        let err = load_str("configVersion: 1\nruntime:\n  raftCore: -1\n", &no_env());
        assert!(err.unwrap_err().to_string().contains("runtime"));
    }

    #[test]
    fn file_then_env_override() {
        let env = env_of(&[
            ("FUTUREQ_API_GRPC_LISTEN", "127.0.0.1:7000"),
            ("FUTUREQ_OBSERVABILITY_METRICS_LISTEN", ""),
            ("FUTUREQ_DELIVERY_CONSUMERQUEUESIZE", "7"),
        ]);
        let s = load_str("configVersion: 1\napi:\n  grpc:\n    listen: 127.0.0.1:6000\nstorage:\n  mode: memory\n", &env).unwrap();
        assert_eq!(s.grpc_listen.to_string(), "127.0.0.1:7000");
        assert_eq!(
            s.metrics_listen, None,
            "an empty env value disables metrics"
        );
        assert_eq!(s.consumer_queue_size, 7);
        assert!(s.memory_storage);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("configVersion: 2\n", "configVersion"),
            ("api: {}\n", "configVersion"),
            ("configVersion: 1\nserver: {}\n", "server"),
            ("configVersion: 1\napi:\n  grpc:\n    bogus: 1\n", "api.grpc.bogus"),
            ("configVersion: 1\napi:\n  grpc:\n    maxSendMessageSize: 0B\n", "maxSendMessageSize"),
            ("configVersion: 1\napi:\n  grpc:\n    listen: nowhere\n", "api.grpc.listen"),
            ("configVersion: 1\napi:\n  grpc:\n    advertise: 0.0.0.0:1\n", "api.grpc.advertise"),
            ("configVersion: 1\ndelivery:\n  consumerQueueSize: 0\n", "consumerQueueSize"),
            ("configVersion: 1\ndelivery:\n  consumerQueueSize: many\n", "consumerQueueSize"),
            ("configVersion: 1\ndelivery:\n  inFlightTimeout: 0s\n", "delivery.inFlightTimeout"),
            ("configVersion: 1\ncompat:\n  prepareBatchSize: 65\n", "compat.prepareBatchSize"),
            ("configVersion: 1\ncompat:\n  prepareWorkers: 0\n", "compat.prepareWorkers"),
            ("configVersion: 1\ndelivery:\n  scanMaxKeys: 32\n", "at least compat.prepareBatchSize"),
            ("configVersion: 1\ndelivery:\n  prepareBatchSize: 8\ncompat:\n  prepareBatchSize: 8\n", "delivery.prepareBatchSize: is set twice"),
            ("configVersion: 1\nstorage:\n  mode: tape\n", "storage.mode"),
            ("configVersion: 1\npublish:\n  minAckLevel: maybe\n", "publish.minAckLevel"),
            ("configVersion: 1\npublish:\n  maxDelay: 5 parsecs\n", "publish.maxDelay"),
            ("configVersion: 1\npublish:\n  dedupWindow: 5s\n", "publish.dedupWindow"),
            ("configVersion: 1\nobservability:\n  metrics:\n    topicsInterval: 10ms\n", "topicsInterval: must be at least 100ms"),
            ("configVersion: 1\ncluster:\n  joinSeeds: [a:1]\n  raft:\n    initialMembers: {1: b:2}\n", "cannot both be set"),
        ];
        for (yaml, want) in cases {
            let e = load_str(yaml, &no_env()).unwrap_err().to_string();
            assert!(e.contains(want), "{yaml:?}: {e:?} should mention {want}");
        }
        let env = env_of(&[("FUTUREQ_CLUSTER_NODEID", "abc")]);
        let e = load_str("configVersion: 1\n", &env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodeId"), "{e}");
    }

    /// Compatibility keys under their old place (`delivery`, in a file or the environment)
    /// are read as `compat.*`, with a warning each.
    #[test]
    fn compat_keys_are_read_from_their_old_place() {
        let (cfg, s) = load_both(
            "configVersion: 1\ndelivery:\n  prepareBatchSize: 8\n  scanMaxKeys: 16\n",
            &no_env(),
        )
        .unwrap();
        assert_eq!(cfg.compat.prepare_batch_size, 8);
        assert_eq!(s.deprecated.len(), 1, "{:?}", s.deprecated);
        assert!(s.deprecated[0].contains("compat.prepareBatchSize"));
        let env = env_of(&[("FUTUREQ_DELIVERY_PREPAREWORKERS", "3")]);
        let (cfg, s) = load_both("configVersion: 1\n", &env).unwrap();
        assert_eq!(cfg.compat.prepare_workers, 3);
        assert!(s.deprecated[0].contains("FUTUREQ_COMPAT_PREPAREWORKERS"));
        let both = env_of(&[
            ("FUTUREQ_DELIVERY_PREPAREWORKERS", "3"),
            ("FUTUREQ_COMPAT_PREPAREWORKERS", "4"),
        ]);
        let e = load_str("configVersion: 1\n", &both)
            .unwrap_err()
            .to_string();
        assert!(e.contains("both set"), "{e}");
        assert!(load_str("configVersion: 1\n", &no_env())
            .unwrap()
            .deprecated
            .is_empty());
    }

    /// Issue 10.9: the cluster secret, inline or from a file, never both.
    #[test]
    fn cluster_secret_inline_or_from_a_file() {
        let base = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\"}\n";
        let open = load_str(base, &no_env()).unwrap().cluster.unwrap();
        assert!(open.secret.is_open());
        let inline = load_str(
            &base.replace("  nodeId: 1\n", "  nodeId: 1\n  secret: s3cret\n"),
            &no_env(),
        )
        .unwrap()
        .cluster
        .unwrap();
        assert!(inline.secret.matches(b"s3cret"));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("secret");
        std::fs::write(&f, "from-file\n").unwrap();
        let with_file = base.replace(
            "  nodeId: 1\n",
            &format!("  nodeId: 1\n  secretFile: {}\n", f.display()),
        );
        let c = load_str(&with_file, &no_env()).unwrap().cluster.unwrap();
        assert!(c.secret.matches(b"from-file"));
        let both = with_file.replace("  nodeId: 1\n", "  nodeId: 1\n  secret: x\n");
        let e = load_str(&both, &no_env()).unwrap_err().to_string();
        assert!(e.contains("cannot both be set"), "{e}");
        let missing = base.replace(
            "  nodeId: 1\n",
            "  nodeId: 1\n  secretFile: /nonexistent/s\n",
        );
        let e = load_str(&missing, &no_env()).unwrap_err().to_string();
        assert!(e.starts_with("cluster.secretFile:"), "{e}");
    }

    /// The YAML reading users rely on (guards the YAML crate, see the workspace Cargo.toml):
    /// YAML 1.2 scalars (`no` is a string, not false), a number where a string is expected is
    /// refused naming the key, and a duplicate key is refused naming it.
    #[test]
    fn yaml_scalars_and_duplicate_keys() {
        let base = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\"}\n";
        let with = |secret: &str| {
            base.replace(
                "  nodeId: 1\n",
                &format!("  nodeId: 1\n  secret: {secret}\n"),
            )
        };
        let c = load_str(&with("no"), &no_env()).unwrap().cluster.unwrap();
        assert!(c.secret.matches(b"no"));
        let e = load_str(&with("12345"), &no_env()).unwrap_err().to_string();
        assert!(e.starts_with("cluster.secret:"), "{e}");
        let e = load_str("configVersion: 1\ndelivery: {}\ndelivery: {}\n", &no_env())
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate") && e.contains("\"delivery\""), "{e}");
    }

    /// Issue 10.3: a memory store cannot back a Raft replica.
    #[test]
    fn memory_storage_is_refused_with_clustering() {
        let yaml = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\nstorage:\n  mode: memory\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\"}\n";
        let e = load_str(yaml, &no_env()).unwrap_err().to_string();
        assert!(e.starts_with("storage.mode:"), "{e}");
        assert!(load_str(&yaml.replace("mode: memory", "mode: disk"), &no_env()).is_ok());
    }

    /// Issue 10.13: a mistyped variable is refused, naming it; a whole-map variable replaces
    /// the file's map.
    #[test]
    fn environment_variables_are_checked_and_maps_replaced_whole() {
        let e = load_str(
            "configVersion: 1\n",
            &env_of(&[("FUTUREQ_API_GRPC_LISTN", "127.0.0.1:1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("FUTUREQ_API_GRPC_LISTN"), "{e}");
        // A section is not a leaf.
        let e = load_str("configVersion: 1\n", &env_of(&[("FUTUREQ_API", "x")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("FUTUREQ_API:") || e.contains("FUTUREQ_API "),
            "{e}"
        );
        let yaml = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\", 2: \"127.0.0.2:50005\"}\n";
        let s = load_str(
            yaml,
            &env_of(&[
                ("FUTUREQ_CLUSTER_RAFT_INITIALMEMBERS", "{}"),
                ("FUTUREQ_CLUSTER_JOINSEEDS", "127.0.0.9:1"),
            ]),
        )
        .unwrap();
        let c = s.cluster.unwrap();
        assert!(c.initial_members.is_empty(), "{:?}", c.initial_members);
        assert_eq!(c.join_seeds, vec!["127.0.0.9:1".to_owned()]);
        let s = load_str(
            yaml,
            &env_of(&[(
                "FUTUREQ_CLUSTER_RAFT_INITIALMEMBERS",
                "{1: \"127.0.0.1:50005\"}",
            )]),
        )
        .unwrap();
        assert_eq!(s.cluster.unwrap().initial_members.len(), 1);
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5y").is_err());
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("100KiB"), Ok(100 << 10));
        assert!(parse_size("0B").is_err());
        assert_eq!(parse_size("4MB"), Ok(4_000_000));
        assert_eq!(parse_size("64KB"), Ok(64_000));
        assert!(parse_size("4mb").is_err());
    }
}
