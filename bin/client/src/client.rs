//! The client: its configuration, leader discovery, and the unary calls (cancel, reschedule,
//! stats, peek, groups, cluster info), retried as the refusal says. Publishers and consumers
//! are made in their own modules.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::pb::future_q_admin_client::FutureQAdminClient;
use crate::pb::future_q_cluster_client::FutureQClusterClient;
use crate::pb::future_q_producer_client::FutureQProducerClient;
use crate::refusal;
use crate::{pb, Error, Reason, Tag};

/// TLS towards the brokers (`api.grpc.tls` on their side).
#[derive(Debug, Clone, Default)]
pub struct TlsConfig {
    /// CA certificates (PEM) the brokers' certificates are verified against; `None`: the
    /// system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// This client's certificate and key (PEM), for brokers that ask for one
    /// (`clientAuth: optional | require`).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the broker's certificate must carry, when not the host dialed.
    pub server_name: Option<String>,
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// TLS towards the brokers (`None`: plaintext).
    pub tls: Option<TlsConfig>,
    /// A bearer token sent on every call, streams included (`authorization: Bearer <token>`).
    pub token: Option<String>,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// How long one request may take.
    pub request_timeout: Duration,
    /// How long the client keeps looking for a leader (and retrying what is safe to retry)
    /// before it reports an error.
    pub retry_for: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            tls: None,
            token: None,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            retry_for: Duration::from_secs(15),
        }
    }
}

/// A client of one futureq cluster (or standalone broker). Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ClientConfig,
    /// Adds the token to every call.
    auth: Auth,
    /// Seeds first, then every node address learned from `GetClusterInfo`.
    known: Mutex<Vec<String>>,
    /// The leader's address and a channel to it, once found.
    leader: Mutex<Option<(String, Channel)>>,
}

/// Pause between rounds of looking for a leader.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How often an idle connection is pinged, and how long a ping may go unanswered.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

impl Client {
    /// Connects to the cluster's leader through `seeds` (`host:port`, or `http://host:port`).
    ///
    /// # Errors
    /// [`Error::Address`] for a malformed seed; [`Error::NoLeader`] when none answers with a
    /// leader within [`ClientConfig::retry_for`].
    pub async fn connect(
        seeds: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Client, Error> {
        Client::connect_with(seeds, ClientConfig::default()).await
    }

    /// [`Client::connect`] with settings.
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub async fn connect_with(
        seeds: impl IntoIterator<Item = impl Into<String>>,
        cfg: ClientConfig,
    ) -> Result<Client, Error> {
        let known: Vec<String> = seeds.into_iter().map(Into::into).collect();
        if known.is_empty() {
            return Err(Error::Address(String::new(), "no seed given".into()));
        }
        for s in &known {
            endpoint(s, &cfg)?;
        }
        let auth = Auth::new(cfg.token.as_deref())?;
        let client = Client {
            inner: Arc::new(Inner {
                auth,
                cfg,
                known: Mutex::new(known),
                leader: Mutex::new(None),
            }),
        };
        client.leader().await?;
        Ok(client)
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// A channel to the leader (found again when it is not known).
    pub(crate) async fn leader(&self) -> Result<Channel, Error> {
        if let Some((_, ch)) = lock(&self.inner.leader).as_ref() {
            return Ok(ch.clone());
        }
        self.discover().await
    }

    /// Forgets the leader (it went away or stopped leading); `next` is the leader a follower
    /// named, if any.
    pub(crate) fn leader_moved(&self, next: Option<&str>) {
        *lock(&self.inner.leader) = None;
        if let Some(addr) = next.filter(|a| !a.is_empty()) {
            let mut known = lock(&self.inner.known);
            if !known.iter().any(|k| k == addr) {
                known.insert(0, addr.to_owned());
            } else {
                // Asked first next time.
                known.retain(|k| k != addr);
                known.insert(0, addr.to_owned());
            }
        }
    }

    /// Asks every known address for the leader until one names a leader that answers.
    async fn discover(&self) -> Result<Channel, Error> {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let candidates = lock(&self.inner.known).clone();
            for addr in &candidates {
                let ch = match self.channel(addr).await {
                    Ok(ch) => ch,
                    Err(e) => {
                        last = e.to_string();
                        continue;
                    }
                };
                let mut cluster = FutureQClusterClient::with_interceptor(ch.clone(), self.auth());
                let info = match cluster
                    .get_cluster_info(self.request(pb::ClusterInfoRequest {}))
                    .await
                {
                    Ok(info) => info,
                    // A credential refused here is refused by every node: say so now.
                    Err(s)
                        if matches!(
                            refusal::of_status(&s).map(|r| r.0),
                            Some(Reason::Unauthenticated | Reason::PermissionDenied)
                        ) =>
                    {
                        return Err(Error::status(&s));
                    }
                    Err(s) => {
                        // tonic's transport errors say little in their message; their
                        // source says what failed (a TLS handshake, a refused connection).
                        last = format!("{addr}: {}", with_causes(&s));
                        continue;
                    }
                };
                let info = info.into_inner();
                {
                    let mut known = lock(&self.inner.known);
                    for n in &info.nodes {
                        if !n.address.is_empty() && !known.contains(&n.address) {
                            known.push(n.address.clone());
                        }
                    }
                }
                if info.leader_address.is_empty() {
                    continue;
                }
                let leader = reachable(&info.leader_address, addr);
                let ch = if leader == *addr {
                    ch
                } else {
                    match self.channel(&leader).await {
                        Ok(ch) => ch,
                        Err(_) => continue,
                    }
                };
                tracing::debug!(target: "futureq_client", leader = %leader, "leader found");
                *lock(&self.inner.leader) = Some((leader, ch.clone()));
                return Ok(ch);
            }
            if started.elapsed() >= self.inner.cfg.retry_for {
                return Err(Error::NoLeader {
                    last,
                    addresses: candidates.join(", "),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    async fn channel(&self, addr: &str) -> Result<Channel, Error> {
        endpoint(addr, &self.inner.cfg)?
            .connect()
            .await
            .map_err(|e| Error::Address(addr.to_owned(), with_causes(&e)))
    }

    /// What adds the token to a call (give it to each generated client).
    pub(crate) fn auth(&self) -> Auth {
        self.inner.auth.clone()
    }

    /// A request with the configured timeout.
    pub(crate) fn request<T>(&self, m: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(m);
        r.set_timeout(self.inner.cfg.request_timeout);
        r
    }

    /// Runs a unary call on the leader, following a follower's redirect; when `safe` (a read,
    /// or a write refused before it acted), also retries after the leader went away.
    async fn unary<T, F, Fut>(&self, safe: bool, call: F) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        loop {
            let ch = self.leader().await?;
            let s = match call(ch).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => s,
            };
            let retry_left = started.elapsed() < self.inner.cfg.retry_for;
            match refusal::next_step(&s, safe) {
                refusal::Next::Leader(next) if retry_left => {
                    self.leader_moved(next.as_deref());
                    if next.as_deref().is_none_or(str::is_empty) {
                        // No leader known yet (an election): ask again shortly.
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
                refusal::Next::Again { elsewhere } if retry_left => {
                    if elsewhere {
                        self.leader_moved(None);
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                _ => {
                    if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown) {
                        // Not retried (it may have acted), but the next call looks again.
                        self.leader_moved(None);
                    }
                    return Err(Error::status(&s));
                }
            }
        }
    }

    /// The cluster's members, leader and liveness (standalone: the one node).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn cluster_info(&self) -> Result<pb::ClusterInfoResponse, Error> {
        self.unary(true, |ch| async move {
            FutureQClusterClient::with_interceptor(ch, self.auth())
                .get_cluster_info(self.request(pb::ClusterInfoRequest {}))
                .await
        })
        .await
    }

    /// Cancels stored messages: per tag, in order, whether it was stored. Durable before the
    /// answer; a cancelled message is never delivered again (a dead-lettered copy stored
    /// before is a message of its own, with its own tag).
    ///
    /// # Errors
    /// See [`Error`]: an INVALID_ARGUMENT status for 0 or more than 1000 tags.
    pub async fn cancel(&self, tags: &[Tag]) -> Result<Vec<bool>, Error> {
        let req = pb::CancelRequest {
            delivery_tags: tags.iter().map(|t| t.0.to_vec()).collect(),
        };
        let r = self
            .unary(false, |ch| {
                let req = req.clone();
                async move {
                    FutureQProducerClient::with_interceptor(ch, self.auth())
                        .cancel(self.request(req))
                        .await
                }
            })
            .await?;
        Ok(r.cancelled)
    }

    /// Moves a stored message to `delay` from now: its new tag, or `None` when it is not
    /// stored.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn reschedule(&self, tag: &Tag, delay: Duration) -> Result<Option<Tag>, Error> {
        let req = pb::RescheduleRequest {
            delivery_tag: tag.0.to_vec(),
            delay_ms: millis(delay)?,
        };
        let r = self
            .unary(false, |ch| {
                let req = req.clone();
                async move {
                    FutureQProducerClient::with_interceptor(ch, self.auth())
                        .reschedule(self.request(req))
                        .await
                }
            })
            .await?;
        if !r.found {
            return Ok(None);
        }
        Tag::from_slice(&r.delivery_tag)
            .map(Some)
            .map_err(|e| Error::InvalidArgument(format!("the server answered a bad tag: {e}")))
    }

    /// Per topic (or only `topic`): stored, in flight, next due time, consumers, dead letters,
    /// and its consumer groups (pending, in flight, members); sorted by topic name.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn topic_stats(&self, topic: Option<&str>) -> Result<Vec<pb::TopicStats>, Error> {
        let req = pb::TopicStatsRequest {
            topic: topic.unwrap_or_default().to_owned(),
        };
        let r = self
            .unary(true, |ch| {
                let req = req.clone();
                async move {
                    FutureQAdminClient::with_interceptor(ch, self.auth())
                        .topic_stats(self.request(req))
                        .await
                }
            })
            .await?;
        Ok(r.topics)
    }

    /// Deletes consumer group `group` of `topic` (replicated before the answer): its
    /// members' subscriptions end ([`crate::Consumer::error`] says the group was deleted), what only
    /// it still needed is deleted, and a member that subscribes again starts a new group. The
    /// answer says whether it was registered; retried like a read (deleting twice is
    /// harmless: a retry after an unknown outcome may answer `found = false`).
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn delete_group(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<pb::DeleteGroupResponse, Error> {
        let req = pb::DeleteGroupRequest {
            topic: topic.to_owned(),
            group: group.to_owned(),
        };
        self.unary(true, |ch| {
            let req = req.clone();
            async move {
                FutureQAdminClient::with_interceptor(ch, self.auth())
                    .delete_group(self.request(req))
                    .await
            }
        })
        .await
    }

    /// Up to `limit` (1..=1000) stored messages of `topic` in due order, after `after`; read
    /// only (nothing is delivered). Page on from the last tag returned.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn peek(
        &self,
        topic: &str,
        limit: u32,
        after: Option<&Tag>,
    ) -> Result<Vec<pb::QueueMessage>, Error> {
        let req = pb::PeekRequest {
            topic: topic.to_owned(),
            limit,
            after_tag: after.map(|t| t.0.to_vec()).unwrap_or_default(),
        };
        let r = self
            .unary(true, |ch| {
                let req = req.clone();
                async move {
                    FutureQAdminClient::with_interceptor(ch, self.auth())
                        .peek(self.request(req))
                        .await
                }
            })
            .await?;
        Ok(r.messages)
    }
}

/// The leader's address as this client can dial it: a broker listening on a wildcard address
/// (`0.0.0.0:8443`, standalone without `api.grpc.advertise`) names it; then it is the host
/// the client asked, at the leader's port.
fn reachable(leader: &str, asked: &str) -> String {
    let Ok(l) = leader.parse::<std::net::SocketAddr>() else {
        return leader.to_owned();
    };
    if !l.ip().is_unspecified() {
        return leader.to_owned();
    }
    let host = asked
        .split("://")
        .last()
        .unwrap_or(asked)
        .rsplit_once(':')
        .map_or(asked, |(h, _)| h);
    format!("{host}:{}", l.port())
}

/// An error and its causes on one line (tonic's transport errors say little in their own
/// message; their sources say what failed: a TLS handshake, a refused connection).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !out.contains(&c_text) {
            out.push_str(": ");
            out.push_str(&c_text);
        }
        cause = c.source();
    }
    out
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn endpoint(addr: &str, cfg: &ClientConfig) -> Result<Endpoint, Error> {
    let bad = |e: &dyn std::fmt::Display| Error::Address(addr.to_owned(), e.to_string());
    let url = match (addr.split_once("://"), &cfg.tls) {
        (Some(("http", _)), Some(_)) => {
            return Err(bad(
                &"an http:// address with TLS configured (use https:// or host:port)",
            ));
        }
        (Some(_), _) => addr.to_owned(),
        (None, None) => format!("http://{addr}"),
        (None, Some(_)) => format!("https://{addr}"),
    };
    let mut e = Endpoint::from_shared(url).map_err(|e| bad(&e))?;
    if let Some(t) = &cfg.tls {
        let mut tls = tonic::transport::ClientTlsConfig::new();
        tls = match &t.ca_pem {
            Some(ca) => tls.ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &t.identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        if let Some(name) = &t.server_name {
            tls = tls.domain_name(name.clone());
        }
        e = e.tls_config(tls).map_err(|e| bad(&e))?;
    }
    Ok(e.connect_timeout(cfg.connect_timeout)
        .tcp_nodelay(true)
        // A connection that went silent (a partition, a frozen host) fails within
        // ~15 s instead of holding streams forever.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

/// Adds `authorization: Bearer <token>` to every call it intercepts (nothing without a
/// token).
#[derive(Clone)]
pub(crate) struct Auth(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Auth {
    fn new(token: Option<&str>) -> Result<Self, Error> {
        token
            .map(|t| {
                format!("Bearer {t}").parse().map_err(|_| {
                    Error::InvalidArgument(
                        "the token must be visible ASCII (no spaces or control characters)".into(),
                    )
                })
            })
            .transpose()
            .map(Auth)
    }
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

/// A duration in whole milliseconds, as the API takes them.
pub(crate) fn millis(d: Duration) -> Result<i64, Error> {
    i64::try_from(d.as_millis()).map_err(|_| Error::InvalidArgument(format!("{d:?} is too long")))
}
