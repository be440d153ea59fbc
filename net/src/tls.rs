//! TLS for both planes: certificates, keys and CAs read from PEM files into rustls
//! configurations (the ring provider, TLS 1.3 and 1.2, ALPN), swapped whole on a reload while
//! the connections already open go on with the configuration they started with.
//!
//! # Invariants
//! - A configuration is built completely (every file read, the key matching its certificate,
//!   the verifier built) before it replaces the one in use: a reload that fails anywhere
//!   leaves the old configuration serving.
//! - A client certificate is accepted only when it chains to one of the configured CAs and is
//!   valid now (rustls' WebPKI verifier); the names a connection carries come from such a
//!   certificate only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

/// The ALPN protocol of gRPC (HTTP/2 over TLS).
pub const ALPN_H2: &[u8] = b"h2";

/// Whether a TLS server asks clients for a certificate (`clientAuth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    None,
    /// A client may present a certificate; one that does must present a valid one.
    Optional,
    /// Every client must present a valid certificate.
    Require,
}

impl ClientAuth {
    /// Parses the configuration's spelling (`none`, `optional`, `require`).
    #[must_use]
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "none" => Some(ClientAuth::None),
            "optional" => Some(ClientAuth::Optional),
            "require" => Some(ClientAuth::Require),
            _ => None,
        }
    }
}

/// A TLS configuration that cannot be built; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file cannot be read or parsed.
    #[error("{}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate file holds no certificate.
    #[error("{}: no certificate in the file", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A key file holds no private key.
    #[error("{}: no private key in the file", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// A CA file holds a certificate that cannot be a trust anchor.
    #[error("{}: not a usable CA certificate: {source}", path.display())]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// A certificate cannot be parsed (its names and expiry are read from it).
    #[error("{}: the certificate cannot be parsed", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The certificate and key do not make a usable pair (or the key type is not supported).
    #[error("{} with {}: {source}", cert.display(), key.display())]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// The client-certificate verifier cannot be built from the CAs.
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// A certificate the cluster's nodes must be able to verify does not verify.
    #[error("{}: {why}", cert.display())]
    NotForCluster {
        /// The certificate file.
        cert: PathBuf,
        /// For which name, under which CA, and why not.
        why: String,
    },
    /// `serverName` is not a DNS name.
    #[error("serverName {0:?} is not a valid DNS name")]
    ServerName(String),
    /// rustls refused the protocol versions or provider (not expected with the defaults).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The files of a TLS server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    /// The certificate chain (PEM), the server's own certificate first.
    pub cert: PathBuf,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CAs a client certificate is verified against (PEM, each file may hold several).
    pub cas: Vec<PathBuf>,
    /// The cluster CA (`cluster.tls.caFile`): a node certificate it signed (one that carries
    /// a [`NODE_URI_PREFIX`] URI) is accepted too, as a node of the cluster.
    pub cluster_ca: Option<PathBuf>,
    /// Whether clients are asked for a certificate.
    pub client_auth: ClientAuth,
}

/// When a certificate stops being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertExpiry {
    /// The certificate's file.
    pub path: PathBuf,
    /// Its `notAfter`, in seconds since the Unix epoch.
    pub not_after_unix: i64,
}

/// The ring provider (the design's choice: no aws-lc build). rustls deprecates it for lacking
/// post-quantum key exchange; X25519 and the NIST curves remain.
/// Built once: the client-certificate verifier asks for it at every handshake.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// The certificates in a PEM file, at least one.
///
/// # Errors
/// [`TlsError::Pem`] or [`TlsError::NoCertificate`].
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            path: path.to_owned(),
        },
        source => TlsError::Pem {
            path: path.to_owned(),
            source,
        },
    })
}

/// A root store of every certificate in `paths`.
///
/// # Errors
/// A file that cannot be read, holds no certificate or holds one that is no trust anchor.
pub fn read_roots(paths: &[PathBuf]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for path in paths {
        for cert in read_certs(path)? {
            roots.add(cert).map_err(|source| TlsError::BadCa {
                path: path.clone(),
                source,
            })?;
        }
    }
    Ok(roots)
}

/// The expiry of the first (own) certificate of `certs`, read from `path`.
fn expiry_of(path: &Path, certs: &[CertificateDer<'_>]) -> Result<CertExpiry, TlsError> {
    let bad = || TlsError::BadCertificate {
        path: path.to_owned(),
    };
    let first = certs.first().ok_or_else(bad)?;
    let (_, cert) = x509_parser::parse_x509_certificate(first).map_err(|_| bad())?;
    Ok(CertExpiry {
        path: path.to_owned(),
        not_after_unix: cert.validity().not_after.timestamp(),
    })
}

/// The names a certificate vouches for: its subjectAltName DNS names and URIs, in order.
/// An unparsable certificate has none.
#[must_use]
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(s) | GeneralName::URI(s) => Some((*s).to_owned()),
            _ => None,
        })
        .collect()
}

/// The URI subjectAltName prefix that marks a node certificate (`futureq-node://<name>`):
/// only such a certificate of the cluster CA may open a peer link or count as a node on the
/// client plane, so the cluster CA may sign other certificates without making them nodes.
pub const NODE_URI_PREFIX: &str = "futureq-node:";

/// Whether `der` carries a [`NODE_URI_PREFIX`] URI.
#[must_use]
pub fn is_node_certificate(der: &[u8]) -> bool {
    certificate_names(der)
        .iter()
        .any(|n| n.starts_with(NODE_URI_PREFIX))
}

fn webpki(roots: Arc<RootCertStore>) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    Ok(WebPkiClientVerifier::builder_with_provider(roots, provider()).build()?)
}

/// A client certificate verifier over several trust anchors: a chain is accepted when one of
/// them verifies it, and, for one marked `node`, the certificate is a node certificate.
#[derive(Debug)]
struct Verifier {
    accept: Vec<(Arc<dyn ClientCertVerifier>, bool)>,
    hints: Vec<rustls::DistinguishedName>,
    mandatory: bool,
}

impl Verifier {
    fn new(accept: Vec<(Arc<dyn ClientCertVerifier>, bool)>, mandatory: bool) -> Self {
        let hints = accept
            .iter()
            .flat_map(|(v, _)| v.root_hint_subjects().iter().cloned())
            .collect();
        Verifier {
            accept,
            hints,
            mandatory,
        }
    }
}

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let mut last = rustls::Error::General("no trust anchor configured".into());
        for (v, node) in &self.accept {
            match v.verify_client_cert(end_entity, intermediates, now) {
                Ok(ok) if !*node || is_node_certificate(end_entity) => return Ok(ok),
                Ok(_) => {
                    last = rustls::Error::InvalidCertificate(
                        rustls::CertificateError::ApplicationVerificationFailure,
                    );
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A server configuration built from `files`, with `alpn` offered, and the certificate's expiry.
///
/// # Errors
/// The first file or combination that is not usable, named.
pub fn server_config(
    files: &ServerFiles,
    alpn: &[&[u8]],
) -> Result<(Arc<rustls::ServerConfig>, CertExpiry), TlsError> {
    let certs = read_certs(&files.cert)?;
    let expiry = expiry_of(&files.cert, &certs)?;
    let key = read_key(&files.key)?;
    let builder =
        rustls::ServerConfig::builder_with_provider(provider()).with_protocol_versions(VERSIONS)?;
    let builder = match files.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let mut accept = Vec::new();
            if !files.cas.is_empty() {
                accept.push((webpki(Arc::new(read_roots(&files.cas)?))?, false));
            }
            if let Some(ca) = &files.cluster_ca {
                accept.push((
                    webpki(Arc::new(read_roots(std::slice::from_ref(ca))?))?,
                    true,
                ));
            }
            builder.with_client_cert_verifier(Arc::new(Verifier::new(
                accept,
                auth == ClientAuth::Require,
            )))
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::Pair {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok((Arc::new(config), expiry))
}

/// A TLS server configuration every core reads at each new connection, and a reload swaps.
#[derive(Debug)]
pub struct ReloadableServer {
    files: ServerFiles,
    alpn: Vec<&'static [u8]>,
    current: RwLock<(Arc<rustls::ServerConfig>, CertExpiry)>,
}

impl ReloadableServer {
    /// Builds the first configuration from `files`.
    ///
    /// # Errors
    /// As [`server_config`].
    pub fn load(files: ServerFiles, alpn: &[&'static [u8]]) -> Result<Self, TlsError> {
        let current = server_config(&files, alpn)?;
        Ok(ReloadableServer {
            files,
            alpn: alpn.to_vec(),
            current: RwLock::new(current),
        })
    }

    /// The files it reads.
    #[must_use]
    pub fn files(&self) -> &ServerFiles {
        &self.files
    }

    /// The configuration a new connection uses.
    #[must_use]
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        let guard = self.current.read().unwrap_or_else(|p| p.into_inner());
        Arc::clone(&guard.0)
    }

    /// The expiry of the certificate in use.
    #[must_use]
    pub fn expiry(&self) -> CertExpiry {
        let guard = self.current.read().unwrap_or_else(|p| p.into_inner());
        guard.1.clone()
    }

    /// Reads the files again into a configuration not yet in use (see [`Self::install`]).
    ///
    /// # Errors
    /// As [`server_config`]; the configuration in use stays.
    pub fn reread(&self) -> Result<ServerConfigured, TlsError> {
        server_config(&self.files, &self.alpn).map(ServerConfigured)
    }

    /// Puts a configuration [`Self::reread`] built in use for new connections; connections
    /// open go on with the one they started with.
    pub fn install(&self, next: ServerConfigured) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next.0;
    }
}

/// A server configuration read and checked, not yet in use.
#[derive(Debug)]
pub struct ServerConfigured((Arc<rustls::ServerConfig>, CertExpiry));

impl ServerConfigured {
    /// The expiry of its certificate.
    #[must_use]
    pub fn expiry(&self) -> &CertExpiry {
        &self.0 .1
    }
}

/// The files of mutual TLS between nodes (`cluster.tls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFiles {
    /// This node's certificate chain (PEM), presented on both ends of every link.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The cluster CA (PEM): every peer's certificate must chain to it.
    pub ca: PathBuf,
    /// The name a peer's certificate must carry when dialed (`None`: the address dialed,
    /// an IP subjectAltName).
    pub server_name: Option<String>,
}

/// The rustls configurations of the peer plane, built together from [`PeerFiles`].
#[derive(Debug)]
pub struct PeerConfigured {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    /// The same identity and roots, for this node's calls to another node's client plane.
    api_client: Arc<rustls::ClientConfig>,
    /// Accepts a node certificate of the cluster CA only.
    member: Arc<Verifier>,
    expiry: CertExpiry,
}

impl PeerConfigured {
    /// The expiry of the node's certificate.
    #[must_use]
    pub fn expiry(&self) -> &CertExpiry {
        &self.expiry
    }
}

fn client_config(
    files: &PeerFiles,
    roots: &Arc<RootCertStore>,
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)?
        .with_root_certificates(Arc::clone(roots))
        .with_client_auth_cert(certs, key)
        .map_err(|source| TlsError::Pair {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(c))
}

/// Builds the peer plane's configurations: a server that requires a certificate of the
/// cluster CA, and a client that presents the node's and verifies the peer's.
///
/// # Errors
/// The first file or combination that is not usable, named.
pub fn peer_config(files: &PeerFiles) -> Result<PeerConfigured, TlsError> {
    if let Some(n) = &files.server_name {
        rustls::pki_types::ServerName::try_from(n.as_str())
            .map_err(|_| TlsError::ServerName(n.clone()))?;
    }
    let certs = read_certs(&files.cert)?;
    let expiry = expiry_of(&files.cert, &certs)?;
    let key = read_key(&files.key)?;
    let roots = Arc::new(read_roots(std::slice::from_ref(&files.ca))?);
    let member = Arc::new(Verifier::new(
        vec![(webpki(Arc::clone(&roots))?, true)],
        true,
    ));
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)?
        .with_client_cert_verifier(Arc::clone(&member) as Arc<dyn ClientCertVerifier>)
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|source| TlsError::Pair {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    let client = client_config(files, &roots, certs.clone(), key.clone_key(), &[])?;
    let api_client = client_config(files, &roots, certs, key, &[ALPN_H2])?;
    Ok(PeerConfigured {
        server: Arc::new(server),
        client,
        api_client,
        member,
        expiry,
    })
}

/// Checks that the certificate in `cert` is what a node dialing `host` (an IP address or DNS
/// name; the cluster's `serverName` instead when it has one) accepts: it chains to the
/// cluster CA of `files` and names that host. The client plane's certificate must, since the
/// nodes call each other there.
///
/// # Errors
/// [`TlsError::NotForCluster`], or the files' own errors.
pub fn check_for_cluster(cert: &Path, files: &PeerFiles, host: &str) -> Result<(), TlsError> {
    use rustls::pki_types::ServerName;
    let chain = read_certs(cert)?;
    let roots = Arc::new(read_roots(std::slice::from_ref(&files.ca))?);
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| TlsError::Config(rustls::Error::General(e.to_string())))?;
    let name = files.server_name.as_deref().unwrap_or(host);
    let server_name =
        ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(name.to_owned()))?;
    let (end, rest) = chain.split_first().ok_or_else(|| TlsError::NoCertificate {
        path: cert.to_owned(),
    })?;
    verifier
        .verify_server_cert(
            end,
            rest,
            &server_name,
            &[],
            rustls::pki_types::UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|source| TlsError::NotForCluster {
            cert: cert.to_owned(),
            why: format!(
                "not valid for {name} under the cluster CA ({}): {source}",
                files.ca.display()
            ),
        })
}

/// Mutual TLS between nodes: both ends of every link present a certificate the cluster CA
/// signed. Every new link takes the configurations current when it starts; a reload swaps
/// them.
#[derive(Debug)]
pub struct PeerTls {
    files: PeerFiles,
    current: RwLock<Arc<PeerConfigured>>,
}

impl PeerTls {
    /// Builds the first configurations from `files`.
    ///
    /// # Errors
    /// As [`peer_config`].
    pub fn load(files: PeerFiles) -> Result<Self, TlsError> {
        let current = RwLock::new(Arc::new(peer_config(&files)?));
        Ok(PeerTls { files, current })
    }

    /// The files it reads.
    #[must_use]
    pub fn files(&self) -> &PeerFiles {
        &self.files
    }

    fn current(&self) -> Arc<PeerConfigured> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The configuration a new incoming link uses.
    #[must_use]
    pub fn server(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.current().server)
    }

    /// The configuration a new outgoing link uses.
    #[must_use]
    pub fn client(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.current().client)
    }

    /// The configuration of this node's calls to another node's client plane (ALPN `h2`,
    /// the node's certificate as its identity, the cluster CA as roots).
    #[must_use]
    pub fn api_client(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.current().api_client)
    }

    /// The name a peer dialed at `ip` must prove.
    ///
    /// # Errors
    /// A configured `serverName` that is not a valid DNS name.
    pub fn server_name(
        &self,
        ip: std::net::IpAddr,
    ) -> Result<rustls::pki_types::ServerName<'static>, rustls::pki_types::InvalidDnsNameError>
    {
        match &self.files.server_name {
            Some(n) => rustls::pki_types::ServerName::try_from(n.clone()),
            None => Ok(rustls::pki_types::ServerName::IpAddress(ip.into())),
        }
    }

    /// Whether `certs` (a client's chain, its own first) is a node certificate of the
    /// cluster CA (see [`NODE_URI_PREFIX`]), valid now: the caller is a node of this cluster.
    #[must_use]
    pub fn is_member(&self, certs: &[CertificateDer<'_>]) -> bool {
        let Some((end, rest)) = certs.split_first() else {
            return false;
        };
        // Most clients carry no node URI: they are not verified a second time.
        if !is_node_certificate(end) {
            return false;
        }
        let now = rustls::pki_types::UnixTime::now();
        self.current()
            .member
            .verify_client_cert(end, rest, now)
            .is_ok()
    }

    /// The expiry of the node's certificate in use.
    #[must_use]
    pub fn expiry(&self) -> CertExpiry {
        self.current().expiry.clone()
    }

    /// Reads the files again into configurations not yet in use.
    ///
    /// # Errors
    /// As [`peer_config`]; the configurations in use stay.
    pub fn reread(&self) -> Result<PeerConfigured, TlsError> {
        peer_config(&self.files)
    }

    /// Puts configurations [`Self::reread`] built in use for new links.
    pub fn install(&self, next: PeerConfigured) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
    }
}

/// What a connection's TLS session established about the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Whether the connection is over TLS.
    pub tls: bool,
    /// The verified client certificate's names (subjectAltName DNS and URI); empty without one.
    pub cert_names: Vec<String>,
    /// The client certificate chains to the cluster CA: the caller is a node of this cluster.
    pub cluster_member: bool,
}

impl PeerIdentity {
    /// The identity of a TLS session whose verified chain is `certs` (the client's first);
    /// `cluster` tells whether a chain is one of this cluster's nodes.
    #[must_use]
    pub fn of_tls(certs: Option<&[CertificateDer<'_>]>, cluster: Option<&PeerTls>) -> Self {
        let cluster_member = match (certs, cluster) {
            (Some(c), Some(t)) => t.is_member(c),
            _ => false,
        };
        PeerIdentity {
            tls: true,
            // A node is no principal: its certificate's names identify nobody.
            cert_names: if cluster_member {
                Vec::new()
            } else {
                certs
                    .and_then(|c| c.first())
                    .map(|c| certificate_names(c))
                    .unwrap_or_default()
            },
            cluster_member,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_auth_names() {
        assert_eq!(ClientAuth::from_name("none"), Some(ClientAuth::None));
        assert_eq!(
            ClientAuth::from_name("optional"),
            Some(ClientAuth::Optional)
        );
        assert_eq!(ClientAuth::from_name("require"), Some(ClientAuth::Require));
        assert_eq!(ClientAuth::from_name("required"), None);
    }

    #[test]
    fn garbage_has_no_names() {
        assert!(certificate_names(b"not a certificate").is_empty());
        assert!(certificate_names(&[]).is_empty());
    }
}
