//! How the bench connects to a broker: plaintext, or TLS with a token while a secured
//! variant is measured.

use anyhow::Context;
use tonic::transport::Channel;

/// How the bench connects: plaintext, or TLS (and a token) while `futureq-bench security`
/// measures a TLS variant. Set between runs, never during one.
pub(crate) static CLIENT_SECURITY: std::sync::RwLock<Option<ClientSecurity>> =
    std::sync::RwLock::new(None);

/// TLS towards the broker and the token sent on every call.
#[derive(Clone)]
pub(crate) struct ClientSecurity {
    pub(crate) tls: tonic::transport::ClientTlsConfig,
    pub(crate) token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

pub(crate) fn client_security() -> Option<ClientSecurity> {
    CLIENT_SECURITY
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

pub(crate) fn set_client_security(s: Option<ClientSecurity>) {
    *CLIENT_SECURITY
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
}

/// `m` as a request carrying the token, if the bench has one.
pub(crate) fn authed<T>(m: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    if let Some(t) = client_security().and_then(|s| s.token) {
        r.metadata_mut().insert("authorization", t);
    }
    r
}

pub(crate) async fn connect(addr: &str) -> anyhow::Result<Channel> {
    let security = client_security();
    let addr = match (&security, addr.strip_prefix("http://")) {
        (Some(_), Some(rest)) => format!("https://{rest}"),
        _ => addr.to_owned(),
    };
    let mut e = Channel::from_shared(addr.clone())?;
    if let Some(s) = security {
        e = e.tls_config(s.tls)?;
    }
    e.connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}
