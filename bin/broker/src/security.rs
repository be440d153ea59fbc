//! What the node's security rests on and SIGHUP re-reads: the client plane's TLS
//! certificates and the principals file, with the counts and expiries the metrics export.
//!
//! # Invariants
//! - A reload reads and checks every file before it puts any in use: either all of them
//!   change, or none does (a bad file keeps the whole old configuration).
//! - Connections already open keep the TLS configuration they started with; calls from the
//!   reload on are authenticated against the new principals.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futureq_net::tls::ReloadableServer;

use crate::auth::Auth;

/// A reload that failed: the first file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// `api.grpc.tls`.
    #[error("api.grpc.tls: {0}")]
    ClientTls(#[from] futureq_net::tls::TlsError),
    /// `api.auth.principalsFile`.
    #[error("api.auth.principalsFile: {0}")]
    Principals(#[from] crate::auth::AuthError),
}

/// The reloadable parts of the node's security.
#[derive(Debug, Default)]
pub struct Security {
    /// `api.grpc.tls` (present when a certificate is set).
    pub grpc_tls: Option<Arc<ReloadableServer>>,
    /// `api.auth.principalsFile` (present when set).
    pub auth: Option<Arc<Auth>>,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

impl Security {
    /// The security of these loaded parts.
    #[must_use]
    pub fn new(grpc_tls: Option<Arc<ReloadableServer>>, auth: Option<Arc<Auth>>) -> Self {
        Security {
            grpc_tls,
            auth,
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
                Some(t) => Some(t.reread()?),
                None => None,
            };
            let principals = match &self.auth {
                Some(a) => Some(a.reread()?),
                None => None,
            };
            Ok::<_, ReloadError>((tls, principals))
        })();
        match result {
            Ok((tls, principals)) => {
                let expiry = tls.as_ref().map(|t| t.expiry().not_after_unix);
                let n = principals.as_ref().map(crate::auth::Principals::len);
                if let (Some(t), Some(next)) = (&self.grpc_tls, tls) {
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

    /// `futureq_tls_reload_total{result}` and `futureq_tls_cert_expiry_seconds{plane}`.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP futureq_tls_reload_total Reloads of the certificates and principals (SIGHUP), by result.\n# TYPE futureq_tls_reload_total counter\nfutureq_tls_reload_total{{result=\"ok\"}} {}\nfutureq_tls_reload_total{{result=\"error\"}} {}",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_failed.load(Ordering::Relaxed)
        );
        if let Some(t) = &self.grpc_tls {
            let _ = writeln!(
                out,
                "# HELP futureq_tls_cert_expiry_seconds When each certificate in use stops being valid (notAfter), in seconds since the Unix epoch.\n# TYPE futureq_tls_cert_expiry_seconds gauge\nfutureq_tls_cert_expiry_seconds{{plane=\"client\"}} {}",
                t.expiry().not_after_unix
            );
        }
    }
}
