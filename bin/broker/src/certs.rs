//! Development certificates (`futureq certs dev`): a CA, a node certificate for both planes
//! and client certificates, so TLS and mutual TLS run in minutes. Not for production: the
//! CA's key is written beside its certificate.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A development certificate that cannot be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// rcgen refused the parameters (a name that is not a DNS name, IP or URI).
    #[error("cannot make the certificate: {0}")]
    Make(#[from] rcgen::Error),
    /// A file cannot be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
}

/// A certificate authority that signs development certificates.
pub struct DevCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// How long a certificate lasts.
#[derive(Debug, Clone, Copy)]
pub enum Validity {
    /// From a day ago for this many days.
    Days(i64),
    /// Expired: it ended a day ago (for tests of refusal).
    Expired,
}

fn apply(params: &mut CertificateParams, validity: Validity) {
    let now = time::OffsetDateTime::now_utc();
    let day = time::Duration::days(1);
    match validity {
        Validity::Days(n) => {
            params.not_before = now - day;
            params.not_after = now + day * i32::try_from(n).unwrap_or(i32::MAX);
        }
        Validity::Expired => {
            params.not_before = now - day * 30;
            params.not_after = now - day;
        }
    }
}

impl DevCa {
    /// A new self-signed CA named `name`, valid ten years.
    ///
    /// # Errors
    /// [`CertsError::Make`].
    pub fn new(name: &str) -> Result<Self, CertsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        apply(&mut params, Validity::Days(3650));
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(DevCa { cert, key })
    }

    /// The CA certificate, PEM.
    #[must_use]
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's private key, PEM.
    #[must_use]
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for `names` (DNS names, IP addresses or URIs, each a subjectAltName;
    /// the first is also the common name) usable by servers and clients alike.
    ///
    /// # Errors
    /// [`CertsError::Make`].
    pub fn issue(&self, names: &[String], validity: Validity) -> Result<Pem, CertsError> {
        let (uris, others): (Vec<&String>, Vec<&String>) =
            names.iter().partition(|n| n.contains("://"));
        let mut params = CertificateParams::new(others.into_iter().cloned().collect::<Vec<_>>())?;
        for uri in uris {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(uri.as_str().try_into()?));
        }
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        apply(&mut params, validity);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

fn write(path: &Path, text: &str) -> Result<(), CertsError> {
    std::fs::write(path, text).map_err(|source| CertsError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Writes `pem` as `<dir>/<stem>.pem` and `<dir>/<stem>-key.pem` (the key readable by its
/// owner only, from its creation on).
///
/// # Errors
/// [`CertsError::Write`].
pub fn write_pair(dir: &Path, stem: &str, pem: &Pem) -> Result<(), CertsError> {
    write(&dir.join(format!("{stem}.pem")), &pem.cert)?;
    write_secret(&dir.join(format!("{stem}-key.pem")), &pem.key)
}

/// Writes a private key: the file is created (or first restricted) mode 0600, then written.
fn write_secret(path: &Path, text: &str) -> Result<(), CertsError> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |source| CertsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(fail)?;
    f.write_all(text.as_bytes()).map_err(fail)
}

/// What [`write_dev`] wrote.
#[derive(Debug, Clone)]
pub struct DevFiles {
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
}

/// Writes a development CA (`ca.pem`, `ca-key.pem`), a node certificate (`node.pem`,
/// `node-key.pem`) for `hosts` plus `localhost`, `127.0.0.1` and `::1`, and one client
/// certificate per name in `clients` (`<name>.pem`, `<name>-key.pem`; the certificate's
/// subjectAltName is the name, which a principal's `certificateNames` lists).
///
/// # Errors
/// A certificate that cannot be made or a file that cannot be written.
pub fn write_dev(dir: &Path, hosts: &[String], clients: &[String]) -> Result<DevFiles, CertsError> {
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let ca = DevCa::new("futureq development CA")?;
    write(&dir.join("ca.pem"), &ca.cert_pem())?;
    write_secret(&dir.join("ca-key.pem"), &ca.key_pem())?;
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for h in hosts {
        if !names.contains(h) {
            names.push(h.clone());
        }
    }
    // Marks it a node certificate: the only kind a node takes for a peer (see
    // futureq_net::tls::NODE_URI_PREFIX).
    names.push("futureq-node://dev".to_owned());
    write_pair(dir, "node", &ca.issue(&names, Validity::Days(365))?)?;
    let mut files = vec![
        dir.join("ca.pem"),
        dir.join("ca-key.pem"),
        dir.join("node.pem"),
        dir.join("node-key.pem"),
    ];
    for c in clients {
        write_pair(
            dir,
            c,
            &ca.issue(std::slice::from_ref(c), Validity::Days(365))?,
        )?;
        files.push(dir.join(format!("{c}.pem")));
        files.push(dir.join(format!("{c}-key.pem")));
    }
    Ok(DevFiles { files })
}
