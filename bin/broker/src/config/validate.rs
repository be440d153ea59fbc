//! Every key checked and the typed [`Settings`] built from them; each error names its key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futureq_core::AckLevel;
use futureq_net::peer_link::PeerSecret;
use futureq_net::tls::{
    ClientAuth, PeerFiles, PeerTls, ReloadableServer, ServerFiles, TlsError, ALPN_H2,
};

use super::error::{err, ConfigError};
use super::schema::{ClusterTls, Compat, Config, LogFormat, Tls};
use super::settings::{ClusterSettings, Settings};
use super::units::{parse_duration, parse_size};

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
        let publish = self.publish_settings()?;
        let d = &self.delivery;
        let DeliveryTimes {
            time_bucket: tb,
            in_flight_timeout,
            delete_batch_interval,
            ttl_sweep_interval,
            read_ahead,
        } = self.delivery_settings()?;
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
            min_ack_level: publish.min_ack_level,
            proposal_timeout: publish.proposal_timeout,
            max_queue_delay: publish.max_queue_delay,
            max_delay: publish.max_delay,
            dedup_window: publish.dedup_window,
            stream_idle_timeout: publish.stream_idle_timeout,
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
    fn publish_settings(&self) -> Result<PublishSettings, ConfigError> {
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
        let max_queue_delay = dur("publish.maxQueueDelay", &p.max_queue_delay)?;
        if max_queue_delay < Duration::from_millis(1) || max_queue_delay > Duration::from_secs(60) {
            return err("publish.maxQueueDelay", "must be between 1ms and 60s");
        }
        if max_queue_delay > proposal_timeout {
            return err(
                "publish",
                format!(
                    "publish.maxQueueDelay ({}) must be at most publish.proposalTimeout ({}): lower the first or raise the second",
                    p.max_queue_delay, p.proposal_timeout
                ),
            );
        }
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
        Ok(PublishSettings {
            min_ack_level,
            proposal_timeout,
            max_queue_delay,
            max_delay,
            dedup_window,
            stream_idle_timeout,
        })
    }

    /// `delivery.*`'s durations: the time bucket, the in-flight timeout, the delete batch
    /// and TTL sweep intervals, the read-ahead window (and the queue and scan sizes checked).
    fn delivery_settings(&self) -> Result<DeliveryTimes, ConfigError> {
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
        Ok(DeliveryTimes {
            time_bucket: tb,
            in_flight_timeout,
            delete_batch_interval,
            ttl_sweep_interval,
            read_ahead,
        })
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

impl Compat {
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

/// `publish.*`, checked.
struct PublishSettings {
    min_ack_level: AckLevel,
    proposal_timeout: Duration,
    max_queue_delay: Duration,
    max_delay: Duration,
    dedup_window: Duration,
    stream_idle_timeout: Duration,
}

/// `delivery.*`'s durations, checked.
struct DeliveryTimes {
    time_bucket: Duration,
    in_flight_timeout: Duration,
    delete_batch_interval: Duration,
    ttl_sweep_interval: Duration,
    read_ahead: Duration,
}
