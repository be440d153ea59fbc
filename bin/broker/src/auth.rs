//! Principals and their permissions (`api.auth.principalsFile`): who a call comes from (a
//! bearer token or a verified client certificate's name) and what it may do (publish and
//! consume on topic patterns, administer).
//!
//! # Invariants
//! - A presented token is hashed (SHA-256) and compared with every stored hash in constant
//!   time, whichever matches: the time taken does not depend on which principal, or how much
//!   of a hash, matched.
//! - A token and a certificate name identify at most one principal each (the file is refused
//!   otherwise); a presented token that matches none is refused even when the certificate
//!   would have matched (a wrong credential is never silently replaced by another).
//! - A reload that fails keeps the principals in use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use futureq_core::refusal::{Reason, Refusal};
use futureq_net::tls::PeerIdentity;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A principals file that cannot be used; the message names the entry.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a principals file.
    #[error("{}: {msg}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (with the line).
        msg: String,
    },
    /// An entry is not valid.
    #[error("{}: {what}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Which entry and why.
        what: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    principals: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    name: String,
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    certificate_names: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    consume: Vec<String>,
    #[serde(default)]
    admin: bool,
}

/// A topic pattern: a topic, `prefix*`, or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn parse(s: &str) -> Option<Self> {
        match s.strip_suffix('*') {
            Some(prefix) if !prefix.contains('*') => Some(Pattern::Prefix(prefix.to_owned())),
            Some(_) => None,
            None if s.is_empty() || s.contains('*') => None,
            None => Some(Pattern::Exact(s.to_owned())),
        }
    }

    fn matches(&self, topic: &str) -> bool {
        match self {
            Pattern::Exact(t) => t == topic,
            Pattern::Prefix(p) => topic.starts_with(p.as_str()),
        }
    }
}

/// A set of topic patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Patterns(Vec<Pattern>);

impl Patterns {
    fn matches(&self, topic: &str) -> bool {
        self.0.iter().any(|p| p.matches(topic))
    }
}

/// Someone calls are made as: a name and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The principal's name (in logs and refusals).
    pub name: String,
    publish: Patterns,
    consume: Patterns,
    admin: bool,
}

impl Principal {
    /// Whether it may publish to (and cancel or reschedule in) `topic`.
    #[must_use]
    pub fn may_publish(&self, topic: &str) -> bool {
        self.publish.matches(topic)
    }

    /// Whether it may consume from (and peek at) `topic`.
    #[must_use]
    pub fn may_consume(&self, topic: &str) -> bool {
        self.consume.matches(topic)
    }

    /// Whether it may administer the cluster.
    #[must_use]
    pub fn is_admin(&self) -> bool {
        self.admin
    }
}

/// The principals of one file.
#[derive(Debug, Default)]
pub struct Principals {
    list: Vec<Arc<Principal>>,
    /// (SHA-256 of a token, index into `list`).
    tokens: Vec<([u8; 32], usize)>,
    /// (certificate name, index into `list`).
    names: Vec<(String, usize)>,
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A new random token: 32 bytes from the operating system's generator, hex.
#[must_use]
pub fn new_token() -> String {
    let mut b = [0u8; 32];
    ring_fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ring_fill(b: &mut [u8]) {
    use ring::rand::SecureRandom;
    // The system generator does not fail on Linux (getrandom); a failure would leave zeros,
    // so it is checked.
    let ok = ring::rand::SystemRandom::new().fill(b).is_ok();
    assert!(ok, "the system's random generator failed");
}

/// The SHA-256 of `token`, hex: what a principals file stores for it.
#[must_use]
pub fn token_hash_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Principals {
    /// Reads and checks a principals file.
    ///
    /// # Errors
    /// The file cannot be read or parsed, or an entry is not valid (named).
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, AuthError> {
        let file: File = yaml_serde::from_str(text).map_err(|e| AuthError::Parse {
            path: path.to_owned(),
            msg: e.to_string(),
        })?;
        let invalid = |what: String| AuthError::Invalid {
            path: path.to_owned(),
            what,
        };
        let mut out = Principals::default();
        for (i, e) in file.principals.into_iter().enumerate() {
            let at = format!("principals[{i}] ({:?})", e.name);
            if e.name.is_empty() || e.name.len() > 256 {
                return Err(invalid(format!("{at}: name must be 1..256 bytes")));
            }
            if out.list.iter().any(|p| p.name == e.name) {
                return Err(invalid(format!("{at}: a second principal of that name")));
            }
            if e.tokens.is_empty() && e.certificate_names.is_empty() {
                return Err(invalid(format!(
                    "{at}: no credential (tokens or certificateNames)"
                )));
            }
            for t in &e.tokens {
                let Some(h) = hex32(t) else {
                    return Err(invalid(format!(
                        "{at}: tokens must be SHA-256 hashes, 64 hex digits (`futureq token hash`), got {} characters",
                        t.len()
                    )));
                };
                if out.tokens.iter().any(|(o, _)| *o == h) {
                    return Err(invalid(format!(
                        "{at}: a token hash listed twice (each token identifies one principal)"
                    )));
                }
                out.tokens.push((h, i));
            }
            for n in &e.certificate_names {
                if n.is_empty() {
                    return Err(invalid(format!("{at}: an empty certificate name")));
                }
                if out.names.iter().any(|(o, _)| o == n) {
                    return Err(invalid(format!(
                        "{at}: certificate name {n:?} listed twice (each identifies one principal)"
                    )));
                }
                out.names.push((n.clone(), i));
            }
            let patterns = |key: &str, list: &[String]| {
                list.iter()
                    .map(|p| {
                        Pattern::parse(p).ok_or_else(|| {
                            invalid(format!(
                                "{at}: {key} pattern {p:?} is not a topic, `prefix*` or `*`"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Patterns)
            };
            out.list.push(Arc::new(Principal {
                publish: patterns("publish", &e.publish)?,
                consume: patterns("consume", &e.consume)?,
                admin: e.admin,
                name: e.name,
            }));
        }
        Ok(out)
    }

    /// The number of principals.
    #[must_use]
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when the file lists none (every call is refused).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn by_token(&self, token: &str) -> Option<Arc<Principal>> {
        let h: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = usize::MAX;
        for (stored, i) in &self.tokens {
            // Every entry is compared; the match is selected without a branch on the bytes.
            let eq = stored.ct_eq(&h).unwrap_u8() as usize; // 0 or 1
            found = found * (1 - eq) + i * eq;
        }
        self.list.get(found).cloned()
    }

    fn by_names(&self, names: &[String]) -> Option<Arc<Principal>> {
        names.iter().find_map(|n| {
            self.names
                .iter()
                .find(|(o, _)| o == n)
                .and_then(|(_, i)| self.list.get(*i).cloned())
        })
    }

    /// Who a call with these `authorization` header and connection identity comes from.
    ///
    /// # Errors
    /// UNAUTHENTICATED: no credential, a malformed header, a token that matches no principal,
    /// or a certificate whose names match none.
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        peer: &PeerIdentity,
    ) -> Result<Arc<Principal>, Refusal> {
        if let Some(value) = authorization {
            let token = std::str::from_utf8(value)
                .ok()
                .and_then(|v| {
                    let (scheme, rest) = v.split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
                })
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    Refusal::new(
                        Reason::Unauthenticated,
                        "the authorization metadata must be `Bearer <token>`",
                    )
                })?;
            return self.by_token(token).ok_or_else(|| {
                Refusal::new(Reason::Unauthenticated, "the bearer token is not valid")
            });
        }
        if !peer.cert_names.is_empty() {
            return self.by_names(&peer.cert_names).ok_or_else(|| {
                Refusal::new(
                    Reason::Unauthenticated,
                    format!(
                        "the client certificate's names ({}) belong to no principal",
                        peer.cert_names.join(", ")
                    ),
                )
            });
        }
        Err(Refusal::new(
            Reason::Unauthenticated,
            "no credential: send `authorization: Bearer <token>` metadata or a client certificate",
        ))
    }
}

/// What a call may do: everything (no principals file) or what its principal may.
#[derive(Debug, Clone)]
pub enum Access {
    /// Authentication is off.
    Open,
    /// The call's principal.
    As(Arc<Principal>),
}

fn denied(who: &Principal, what: String) -> Refusal {
    Refusal::new(
        Reason::PermissionDenied,
        format!("principal {:?} may not {what}", who.name),
    )
}

impl Access {
    /// Whether `topic` may be published to.
    ///
    /// # Errors
    /// PERMISSION_DENIED naming the topic.
    pub fn publish(&self, topic: &str) -> Result<(), Refusal> {
        match self {
            Access::As(p) if !p.may_publish(topic) => {
                Err(denied(p, format!("publish to topic {topic:?}")))
            }
            _ => Ok(()),
        }
    }

    /// Whether the dead letters of a message published to `topic` may go to their topic
    /// (`named`, or the default `<topic>.dlq`), checked as [`Access::publish`]; the name is
    /// built only when a principal's rules must see it (this runs for every message).
    ///
    /// # Errors
    /// PERMISSION_DENIED naming the dead-letter topic.
    pub fn publish_dead_letters(&self, topic: &str, named: &str) -> Result<(), Refusal> {
        match self {
            Access::As(_) => self.publish(&futureq_core::message::dead_letter_topic(topic, named)),
            _ => Ok(()),
        }
    }

    /// Whether `topic` may be consumed from or peeked at.
    ///
    /// # Errors
    /// PERMISSION_DENIED naming the topic.
    pub fn consume(&self, topic: &str) -> Result<(), Refusal> {
        match self {
            Access::As(p) if !p.may_consume(topic) => {
                Err(denied(p, format!("consume from topic {topic:?}")))
            }
            _ => Ok(()),
        }
    }

    /// Whether the call may administer (`what` names the operation).
    ///
    /// # Errors
    /// PERMISSION_DENIED.
    pub fn admin(&self, what: &str) -> Result<(), Refusal> {
        match self {
            Access::As(p) if !p.is_admin() => Err(denied(p, format!("{what} (admin only)"))),
            _ => Ok(()),
        }
    }

    /// Whether `topic`'s stats may be read (it may be published to or consumed from).
    ///
    /// # Errors
    /// PERMISSION_DENIED naming the topic.
    pub fn see(&self, topic: &str) -> Result<(), Refusal> {
        match self {
            Access::As(p) if !self.sees(topic) => {
                Err(denied(p, format!("read the stats of topic {topic:?}")))
            }
            _ => Ok(()),
        }
    }

    /// Whether `topic` is visible in listings (may be published or consumed).
    #[must_use]
    pub fn sees(&self, topic: &str) -> bool {
        match self {
            Access::Open => true,
            Access::As(p) => p.may_publish(topic) || p.may_consume(topic) || p.admin,
        }
    }
}

/// The principals in use, swapped whole by a reload.
#[derive(Debug)]
pub struct Auth {
    path: PathBuf,
    current: RwLock<Arc<Principals>>,
    /// Incremented by every [`Auth::install`]: streams opened before see it changed.
    generation: std::sync::atomic::AtomicU64,
    /// Notified by every [`Auth::install`].
    changed: event_listener::Event,
}

impl Auth {
    /// Loads `path`.
    ///
    /// # Errors
    /// As [`Principals::load`].
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        Ok(Auth {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(Principals::load(path)?)),
            generation: std::sync::atomic::AtomicU64::new(0),
            changed: event_listener::Event::new(),
        })
    }

    /// The principals in use.
    #[must_use]
    pub fn principals(&self) -> Arc<Principals> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Reads the file again into principals not yet in use (see [`Self::install`]).
    ///
    /// # Errors
    /// As [`Principals::load`]; the principals in use stay.
    pub fn reread(&self) -> Result<Principals, AuthError> {
        Principals::load(&self.path)
    }

    /// Puts `next` in use for calls from now on.
    pub fn install(&self, next: Principals) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.changed.notify(usize::MAX);
    }

    /// How many times the principals were replaced.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A listener notified by the next [`Auth::install`] (listen, then compare
    /// [`Auth::generation`], then wait: no replacement is missed).
    #[must_use]
    pub fn listen(&self) -> event_listener::EventListener {
        self.changed.listen()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Principals, AuthError> {
        Principals::parse(Path::new("principals.yaml"), text)
    }

    fn file(tokens: &[&str]) -> String {
        let t: Vec<String> = tokens.iter().map(|t| token_hash_hex(t)).collect();
        format!(
            "principals:\n  - name: orders\n    tokens: [{}]\n    publish: [orders, \"billing.*\"]\n    consume: [\"orders*\"]\n  - name: ops\n    tokens: [{}]\n    certificateNames: [ops.example.com]\n    admin: true\n    consume: [\"*\"]\n",
            t[0], t[1]
        )
    }

    fn open() -> PeerIdentity {
        PeerIdentity::default()
    }

    #[test]
    fn tokens_and_names_identify_principals() {
        let p = parse(&file(&["secret-a", "secret-b"])).expect("valid");
        assert_eq!(p.len(), 2);
        let a = p
            .authenticate(Some(b"Bearer secret-a"), &open())
            .expect("a");
        assert_eq!(a.name, "orders");
        let b = p
            .authenticate(Some(b"bearer  secret-b"), &open())
            .expect("b");
        assert_eq!(b.name, "ops");
        let cert = PeerIdentity {
            tls: true,
            cert_names: vec!["x".into(), "ops.example.com".into()],
            cluster_member: false,
        };
        assert_eq!(p.authenticate(None, &cert).expect("cert").name, "ops");
        for bad in [
            &b"Bearer nope"[..],
            b"Basic secret-a",
            b"Bearer ",
            b"secret-a",
            b"\xff",
        ] {
            let r = p.authenticate(Some(bad), &cert).expect_err("refused");
            assert_eq!(r.reason, Reason::Unauthenticated, "{bad:?}");
        }
        let r = p.authenticate(None, &open()).expect_err("no credential");
        assert_eq!(r.reason, Reason::Unauthenticated);
        let stranger = PeerIdentity {
            tls: true,
            cert_names: vec!["stranger".into()],
            cluster_member: false,
        };
        assert!(p
            .authenticate(None, &stranger)
            .expect_err("unknown name")
            .message
            .contains("stranger"));
    }

    #[test]
    fn patterns_grant_what_they_name() {
        let p = parse(&file(&["a", "b"])).expect("valid");
        let orders = Access::As(p.authenticate(Some(b"Bearer a"), &open()).expect("a"));
        assert!(orders.publish("orders").is_ok());
        assert!(orders.publish("orders2").is_err());
        assert!(orders.publish("billing.eu").is_ok());
        assert!(orders.publish("billing").is_err());
        assert!(orders.consume("orders-dlq").is_ok());
        assert!(orders.consume("billing.eu").is_err());
        let r = orders.admin("join a node").expect_err("not admin");
        assert_eq!(r.reason, Reason::PermissionDenied);
        assert!(r.message.contains("orders"), "{}", r.message);
        assert!(orders.sees("billing.x") && !orders.sees("other"));
        let ops = Access::As(p.authenticate(Some(b"Bearer b"), &open()).expect("b"));
        assert!(ops.admin("x").is_ok() && ops.consume("anything").is_ok());
        assert!(ops.publish("anything").is_err());
        assert!(Access::Open.publish("x").is_ok() && Access::Open.admin("x").is_ok());
    }

    #[test]
    fn bad_files_are_refused_naming_the_entry() {
        let h = token_hash_hex("t");
        for (text, needle) in [
            ("principals: [{name: a}]".to_owned(), "no credential"),
            (
                "principals: [{name: a, tokens: [abc]}]".to_owned(),
                "64 hex digits",
            ),
            (
                format!("principals: [{{name: a, tokens: [{h}]}}, {{name: b, tokens: [{h}]}}]"),
                "twice",
            ),
            (
                format!(
                    "principals: [{{name: a, tokens: [{h}]}}, {{name: a, certificateNames: [x]}}]"
                ),
                "second principal",
            ),
            (
                format!("principals: [{{name: a, tokens: [{h}], publish: [\"a*b\"]}}]"),
                "pattern",
            ),
            (
                format!("principals: [{{name: a, tokens: [{h}], publsh: [x]}}]"),
                "publsh",
            ),
            ("nothing: 1".to_owned(), "principals"),
        ] {
            let e = parse(&text).expect_err(&text).to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        assert!(Pattern::parse("*").is_some_and(|p| p.matches("")));
        assert!(Pattern::parse("").is_none());
    }
}
