//! What the node's security rests on and SIGHUP re-reads: the TLS certificates of both
//! planes and the principals file, with the counts and expiries the metrics export.
//!
//! # Invariants
//! - A reload reads and checks every file before it puts any in use: either all of them
//!   change, or none does (a bad file keeps the whole old configuration).
//! - Connections already open keep the TLS configuration they started with; calls from the
//!   reload on are authenticated against the new principals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futureq_net::tls::{PeerTls, ReloadableServer};

use crate::auth::Auth;

/// A reload that failed: the first file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// `api.grpc.tls`.
    #[error("api.grpc.tls: {0}")]
    ClientTls(futureq_net::tls::TlsError),
    /// `cluster.tls`.
    #[error("cluster.tls: {0}")]
    PeerTls(futureq_net::tls::TlsError),
    /// `api.auth.principalsFile`.
    #[error("api.auth.principalsFile: {0}")]
    Principals(#[from] crate::auth::AuthError),
}

/// The reloadable parts of the node's security.
#[derive(Debug, Default)]
pub struct Security {
    /// `api.grpc.tls` (present when a certificate is set).
    pub grpc_tls: Option<Arc<ReloadableServer>>,
    /// `cluster.tls` (present when set on a clustered node).
    pub peer_tls: Option<Arc<PeerTls>>,
    /// `api.auth.principalsFile` (present when set).
    pub auth: Option<Arc<Auth>>,
    /// The host nodes dial this node's client plane at (`api.grpc.advertise`): with both
    /// planes on TLS, a reloaded client-plane certificate must be valid for it under the
    /// cluster CA.
    advertise_host: String,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

impl Security {
    /// The security of these loaded parts.
    #[must_use]
    pub fn new(
        grpc_tls: Option<Arc<ReloadableServer>>,
        peer_tls: Option<Arc<PeerTls>>,
        auth: Option<Arc<Auth>>,
        advertise_host: String,
    ) -> Self {
        Security {
            grpc_tls,
            peer_tls,
            auth,
            advertise_host,
            ..Security::default()
        }
    }

    /// Re-reads every file; all are put in use, or none. Counted for the metrics and logged.
    ///
    /// # Errors
    /// The first file that cannot be used; the configuration in use stays.
    pub fn reload(&self) -> Result<(), ReloadError> {
        let result = (|| {
            let tls = match &self.grpc_tls {
                Some(t) => Some(t.reread().map_err(ReloadError::ClientTls)?),
                None => None,
            };
            let peer = match &self.peer_tls {
                Some(t) => Some(t.reread().map_err(ReloadError::PeerTls)?),
                None => None,
            };
            if let (Some(t), Some(p)) = (&self.grpc_tls, &self.peer_tls) {
                futureq_net::tls::check_for_cluster(
                    &t.files().cert,
                    p.files(),
                    &self.advertise_host,
                )
                .map_err(ReloadError::ClientTls)?;
            }
            let principals = match &self.auth {
                Some(a) => Some(a.reread()?),
                None => None,
            };
            Ok::<_, ReloadError>((tls, peer, principals))
        })();
        match result {
            Ok((tls, peer, principals)) => {
                let expiry = tls.as_ref().map(|t| t.expiry().not_after_unix);
                let n = principals.as_ref().map(crate::auth::Principals::len);
                if let (Some(t), Some(next)) = (&self.grpc_tls, tls) {
                    t.install(next);
                }
                if let (Some(t), Some(next)) = (&self.peer_tls, peer) {
                    t.install(next);
                }
                if let (Some(a), Some(next)) = (&self.auth, principals) {
                    a.install(next);
                }
                self.reloads_ok.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: "app", tls_cert_not_after_unix = ?expiry, principals = ?n, "reloaded the certificates and principals");
                Ok(())
            }
            Err(e) => {
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(target: "app", error = %e, "reload failed; the configuration in use stays");
                Err(e)
            }
        }
    }

    /// `futureq_tls_reload_total{result}` and `futureq_tls_cert_expiry_seconds{plane}`, read
    /// at each scrape.
    ///
    /// # Errors
    /// The encoder's.
    pub fn encode_metrics(
        &self,
        encoder: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::metrics::MetricType;
        let mut reloads = encoder.encode_descriptor(
            "futureq_tls_reload",
            "Reloads of the certificates and principals (SIGHUP), by result.",
            None,
            MetricType::Counter,
        )?;
        for (result, n) in [("ok", &self.reloads_ok), ("error", &self.reloads_failed)] {
            ConstCounter::new(n.load(Ordering::Relaxed))
                .encode(reloads.encode_family(&[("result", result)])?)?;
        }
        let planes = [
            ("client", self.grpc_tls.as_ref().map(|t| t.expiry())),
            ("peer", self.peer_tls.as_ref().map(|t| t.expiry())),
        ];
        if planes.iter().any(|(_, e)| e.is_some()) {
            let mut expiry = encoder.encode_descriptor(
                "futureq_tls_cert_expiry_seconds",
                "When each certificate in use stops being valid (notAfter), in seconds since the Unix epoch.",
                None,
                MetricType::Gauge,
            )?;
            for (plane, e) in planes {
                if let Some(e) = e {
                    ConstGauge::new(e.not_after_unix)
                        .encode(expiry.encode_family(&[("plane", plane)])?)?;
                }
            }
        }
        Ok(())
    }
}
