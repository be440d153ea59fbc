//! Request/response links between nodes over TCP (glommio), carrying [`PeerFrame`]s: one
//! connection per peer, many requests in flight, responses matched by request id.
//!
//! - The server answers each request on its own task; responses go through one bounded
//!   writer queue per connection.
//! - The client connects lazily and reconnects after a failure with exponential backoff
//!   ([`RECONNECT_MIN`] doubling per failed attempt up to [`RECONNECT_MAX`] or the client's
//!   own cap, reset by a connection that succeeds); requests in flight on a broken
//!   connection fail at once.
//! - Every wait is bounded: queues by [`PEER_QUEUE_MAX`], calls by their timeout.
//! - A client opens each connection with a [`KIND_HELLO`] frame carrying the cluster secret;
//!   a server with a secret closes a connection whose first frame does not carry it.
//! - With [`PeerTls`] (`cluster.tls`), every link is mutual TLS first: the server requires a
//!   certificate of the cluster CA, the client verifies the server's against it; the hello
//!   (and the secret in it) goes inside the session. A link whose handshake does not finish
//!   within [`TLS_HANDSHAKE_TIMEOUT`] is closed.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::channel::oneshot;
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::net::{TcpListener, TcpStream};

use crate::peer::{PeerFrame, PeerFrameDecoder};
use crate::shutdown::Shutdown;
use crate::tls::PeerTls;

/// Frames queued for writing on one connection.
pub const PEER_QUEUE_MAX: usize = 1024;
/// Least time between two connection attempts to the same peer.
pub const RECONNECT_MIN: Duration = Duration::from_millis(50);
/// Longest wait between connection attempts to a peer that keeps refusing.
pub const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 64 << 10;
/// Requests of one connection served at once; beyond it the server stops reading the
/// connection until one finishes (a peer cannot make it spawn tasks without bound).
pub const PEER_REQUESTS_MAX: u64 = 256;
/// Longest wait for a bound outgoing connection to be established.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for a link's TLS handshake, on either end.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A link's byte stream: plain TCP or a TLS session over it.
trait Io: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin {}
impl<T: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin> Io for T {}

/// What a peer server asks of a link: the cluster secret in its hello, and mutual TLS.
#[derive(Debug, Clone, Default)]
pub struct PeerAuth {
    /// `cluster.secret` (open when empty).
    pub secret: PeerSecret,
    /// `cluster.tls` (plain TCP when `None`).
    pub tls: Option<std::sync::Arc<PeerTls>>,
}

impl From<PeerSecret> for PeerAuth {
    fn from(secret: PeerSecret) -> Self {
        PeerAuth { secret, tls: None }
    }
}

/// `fut`, or a timeout error once `limit` passed.
async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    future::or(fut, async {
        glommio::timer::sleep(limit).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "TLS handshake timed out",
        ))
    })
    .await
}

/// True at most once per 10 s in this process: a peer that keeps failing its handshake (a
/// wrong certificate, one expired on every node at once) is logged, not every 50 ms.
fn refusal_logged_long_ago() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    now >= last.saturating_add(10)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// The server end of a link's TLS handshake.
async fn tls_accept(tls: &PeerTls, stream: TcpStream) -> std::io::Result<Box<dyn Io>> {
    use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server());
    let session = bounded(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream.compat())).await?;
    Ok(Box::new(session.compat()))
}

/// The client end of a link's TLS handshake with the peer at `addr`.
async fn tls_connect(
    tls: &PeerTls,
    addr: SocketAddr,
    stream: TcpStream,
) -> std::io::Result<Box<dyn Io>> {
    use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};
    let name = tls
        .server_name(addr.ip())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let connector = tokio_rustls::TlsConnector::from(tls.client());
    let session = bounded(
        TLS_HANDSHAKE_TIMEOUT,
        connector.connect(name, stream.compat()),
    )
    .await?;
    Ok(Box::new(session.compat()))
}

/// Connects to `to` from `ip` (bind before connect). The blocking connect runs on a thread
/// of its own, bounded by `timeout`: a peer behind a firewall that drops SYNs must stall
/// neither the reactor nor the executor's blocking pool (Raft applies run there). A client
/// starts no new thread while its last one runs (`busy`), even when the attempt that started
/// it was dropped: at most one such thread per peer.
async fn connect_from(
    ip: std::net::IpAddr,
    to: SocketAddr,
    timeout: Duration,
    busy: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    use std::sync::atomic::Ordering;
    if busy.swap(true, Ordering::AcqRel) {
        return Err(std::io::Error::other(
            "an earlier connect attempt is still running",
        ));
    }
    let flag = std::sync::Arc::clone(busy);
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("futureq-peer-connect".into())
        .spawn(move || {
            let attempt = (|| {
                let domain = if to.is_ipv6() {
                    Domain::IPV6
                } else {
                    Domain::IPV4
                };
                let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
                s.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
                s.connect_timeout(&SockAddr::from(to), timeout)?;
                Ok::<_, std::io::Error>(s)
            })();
            flag.store(false, Ordering::Release);
            let _ = tx.send(attempt);
        });
    if let Err(e) = spawned {
        busy.store(false, Ordering::Release);
        return Err(e);
    }
    let socket = rx
        .await
        .map_err(|_| std::io::Error::other("connect thread ended"))??;
    Ok(TcpStream::from(socket))
}

/// Kind of the first frame a client sends on a connection: the cluster secret. Never handed
/// to the request handler.
pub const KIND_HELLO: u8 = 0xF0;
/// Largest first frame a server with a secret reads (the hello; the secret is at most 1 KiB).
const HELLO_MAX: usize = 4 << 10;

/// The shared cluster secret (`cluster.secret`); empty = links are open to anyone.
#[derive(Clone, Default)]
pub struct PeerSecret(std::sync::Arc<[u8]>);

impl std::fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_open() {
            "PeerSecret(none)"
        } else {
            "PeerSecret(..)"
        })
    }
}

impl PeerSecret {
    /// A secret (empty = none).
    #[must_use]
    pub fn new(secret: &[u8]) -> Self {
        PeerSecret(secret.into())
    }

    /// No secret: every connection is taken.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.0.is_empty()
    }

    /// The secret's bytes.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether `offered` is the secret. Both are hashed (SHA-256) and the digests compared
    /// in constant time, so neither the secret's length nor the length of a matching prefix
    /// shows in the time taken.
    #[must_use]
    pub fn matches(&self, offered: &[u8]) -> bool {
        use sha2::{Digest, Sha256};
        use subtle::ConstantTimeEq;
        let (a, b) = (Sha256::digest(offered), Sha256::digest(&self.0));
        a.as_slice().ct_eq(b.as_slice()).into()
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// No connection could be made (or one was tried too recently).
    #[error("cannot reach peer {0}: {1}")]
    Unreachable(SocketAddr, String),
    /// The connection broke before the response came.
    #[error("connection to peer {0} closed")]
    Closed(SocketAddr),
    /// No response within the timeout.
    #[error("peer {0} did not answer within {1:?}")]
    Timeout(SocketAddr, Duration),
}

/// Answers a request frame with `(kind, payload)`, or nothing.
pub type PeerHandler = Rc<dyn Fn(PeerFrame) -> Pin<Box<dyn Future<Output = Option<(u8, Bytes)>>>>>;

fn encode(frame: &PeerFrame) -> Bytes {
    let mut b = BytesMut::new();
    frame.encode(&mut b);
    b.freeze()
}

/// Spawns `work` detached in `queue`, or in the running task's queue; false when it could
/// not be spawned (a queue that is gone: our queues are never removed), and `work` will not
/// run.
fn spawn_in(
    queue: Option<glommio::TaskQueueHandle>,
    work: impl Future<Output = ()> + 'static,
) -> bool {
    let spawned = match queue {
        None => Ok(glommio::spawn_local(work)),
        Some(q) => glommio::spawn_local_into(work, q),
    };
    match spawned {
        Ok(task) => {
            drop(task.detach());
            true
        }
        Err(e) => {
            tracing::error!(target: "net.peer", error = %e, "peer link: cannot spawn into its task queue");
            false
        }
    }
}

/// Spawns the task that writes queued frames to `w` (in `queue`, see [`spawn_in`]); returns
/// the queue. If it cannot be spawned, sends fail at once (the connection is closed).
fn spawn_writer(
    queue: Option<glommio::TaskQueueHandle>,
    mut w: impl futures_lite::AsyncWrite + Unpin + 'static,
    on_error: impl FnOnce() + 'static,
) -> LocalSender<Bytes> {
    let (tx, rx) = local_channel::new_bounded::<Bytes>(PEER_QUEUE_MAX);
    spawn_in(queue, async move {
        while let Some(b) = rx.recv().await {
            if w.write_all(&b).await.is_err() || w.flush().await.is_err() {
                break;
            }
        }
        on_error();
    });
    tx
}

/// Reads frames from `r` until EOF, an error, a malformed frame, or `on_frame` resolving to
/// false, awaiting `on_frame` for each (while it waits, nothing more is read: back-pressure).
async fn read_frames<F: Future<Output = bool>>(
    mut r: impl futures_lite::AsyncRead + Unpin,
    max_first: usize,
    max_frame: usize,
    mut on_frame: impl FnMut(PeerFrame) -> F,
) {
    let mut dec = PeerFrameDecoder::new(max_first);
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        dec.push(&buf[..n]);
        loop {
            match dec.decode() {
                Ok(Some(f)) => {
                    dec.set_max_len(max_frame);
                    if !on_frame(f).await {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(target: "net.peer", error = %e, "closing peer connection on a bad frame");
                    return;
                }
            }
        }
    }
}

/// Serves peer requests on `listener` until `shutdown`; with a secret, only on connections
/// that open with it; with TLS, only on links whose certificate the cluster CA signed.
pub async fn serve_peers(
    listener: TcpListener,
    handler: PeerHandler,
    max_frame: usize,
    auth: impl Into<PeerAuth>,
    shutdown: Shutdown,
) {
    let auth = auth.into();
    crate::listener::accept_until(&listener, &shutdown, "net.peer", |stream| {
        glommio::spawn_local(serve_conn(
            stream,
            Rc::clone(&handler),
            max_frame,
            auth.clone(),
        ))
        .detach();
    })
    .await;
}

async fn serve_conn(stream: TcpStream, handler: PeerHandler, max_frame: usize, auth: PeerAuth) {
    let _ = stream.set_nodelay(true);
    let peer = stream.peer_addr().ok();
    let io: Box<dyn Io> = match &auth.tls {
        None => Box::new(stream),
        Some(tls) => match tls_accept(tls, stream).await {
            Ok(s) => s,
            Err(e) => {
                if refusal_logged_long_ago() {
                    tracing::warn!(target: "net.peer", ?peer, error = %e, "peer link refused: TLS handshake failed (more such refusals within 10 s are logged at debug)");
                } else {
                    tracing::debug!(target: "net.peer", ?peer, error = %e, "peer link refused: TLS handshake failed");
                }
                return;
            }
        },
    };
    let secret = auth.secret;
    let (r, w) = futures_lite::io::split(io);
    let tx = Rc::new(spawn_writer(None, w, || {}));
    // None until the first frame: then whether the connection may go on.
    let admitted: Rc<Cell<Option<bool>>> = Rc::default();
    let permits = Rc::new(glommio::sync::Semaphore::new(PEER_REQUESTS_MAX));
    // Until the hello is checked, only a small first frame is buffered.
    let max_first = if secret.is_open() {
        max_frame
    } else {
        HELLO_MAX
    };
    read_frames(r, max_first, max_frame, |frame| {
        let (handler, tx, secret) = (Rc::clone(&handler), Rc::clone(&tx), secret.clone());
        let (admitted, permits) = (Rc::clone(&admitted), Rc::clone(&permits));
        async move {
            if admitted.get().is_none() {
                let ok = secret.is_open()
                    || (frame.kind == KIND_HELLO && secret.matches(&frame.payload));
                if !ok {
                    tracing::warn!(target: "net.peer", ?peer, "peer connection without the cluster secret refused");
                }
                admitted.set(Some(ok));
            }
            if admitted.get() == Some(false) {
                return false;
            }
            if frame.kind == KIND_HELLO {
                return true;
            }
            let Ok(permit) = permits.acquire_static_permit(1).await else {
                return false;
            };
            glommio::spawn_local(async move {
                let (group, request_id) = (frame.group, frame.request_id);
                if let Some((kind, payload)) = handler(frame).await {
                    let _ = tx
                        .send(encode(&PeerFrame {
                            group,
                            kind,
                            request_id,
                            payload,
                        }))
                        .await;
                }
                drop(permit);
            })
            .detach();
            true
        }
    })
    .await;
}

type Pending = Rc<RefCell<HashMap<u64, oneshot::Sender<PeerFrame>>>>;

struct Conn {
    tx: LocalSender<Bytes>,
    pending: Pending,
    alive: Rc<Cell<bool>>,
}

/// A client of one peer.
pub struct PeerClient {
    addr: SocketAddr,
    max_frame: usize,
    conn: RefCell<Option<Rc<Conn>>>,
    last_attempt: Cell<Option<Instant>>,
    /// Connection attempts that failed since the last one that succeeded.
    failures: Cell<u32>,
    /// Longest wait between two attempts ([`RECONNECT_MAX`] unless set lower).
    reconnect_max: Duration,
    next_id: Cell<u64>,
    /// A connection attempt is running: other callers wait for it instead of failing.
    connecting: Cell<bool>,
    connect_done: event_listener::Event,
    secret: PeerSecret,
    /// Local address outgoing connections bind to (`None`: the kernel picks).
    bind: Option<std::net::IpAddr>,
    /// A bound connect's thread is running (at most one per peer).
    connect_thread: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Mutual TLS on every link (`None`: plain TCP).
    tls: Option<std::sync::Arc<PeerTls>>,
    /// The task queue a connection's writer and reader run in (`None`: the queue of the
    /// caller that opens it).
    queue: Option<glommio::TaskQueueHandle>,
}

/// Ends a connection attempt when dropped: others waiting for it look again.
struct AttemptGuard<'a>(&'a PeerClient);

impl Drop for AttemptGuard<'_> {
    fn drop(&mut self) {
        self.0.connecting.set(false);
        self.0.connect_done.notify(usize::MAX);
    }
}

impl PeerClient {
    /// A client of the peer at `addr` (connects on first use).
    #[must_use]
    pub fn new(addr: SocketAddr, max_frame: usize) -> Self {
        PeerClient {
            addr,
            max_frame,
            conn: RefCell::new(None),
            last_attempt: Cell::new(None),
            failures: Cell::new(0),
            reconnect_max: RECONNECT_MAX,
            next_id: Cell::new(1),
            connecting: Cell::new(false),
            connect_done: event_listener::Event::new(),
            secret: PeerSecret::default(),
            bind: None,
            queue: None,
            connect_thread: std::sync::Arc::default(),
            tls: None,
        }
    }

    /// Opens every link with mutual TLS (see [`PeerTls`]).
    #[must_use]
    pub fn with_tls(mut self, tls: Option<std::sync::Arc<PeerTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// Runs every connection's writer and reader in task queue `queue` of this executor,
    /// whichever caller opens the connection (the Raft groups' queue: a link first opened by
    /// a forwarded client write must not carry heartbeats at the clients' priority).
    #[must_use]
    pub fn with_queue(mut self, queue: Option<glommio::TaskQueueHandle>) -> Self {
        self.queue = queue;
        self
    }

    /// Binds outgoing connections to `ip` (the host of `cluster.raft.listen`), so that a
    /// peer sees this node's own address as the source: firewall rules between node
    /// addresses (and multi-homed hosts) then apply to both directions of a link.
    #[must_use]
    pub fn with_bind(mut self, ip: Option<std::net::IpAddr>) -> Self {
        self.bind = ip.filter(|ip| !ip.is_unspecified());
        self
    }

    /// Opens every connection with `secret` (see [`KIND_HELLO`]).
    #[must_use]
    pub fn with_secret(mut self, secret: PeerSecret) -> Self {
        self.secret = secret;
        self
    }

    /// Caps the wait between connection attempts at `max` (at least [`RECONNECT_MIN`]):
    /// Raft sets it below the election timeout, so that a peer that comes back hears from
    /// the leader before it times out and disrupts the group with an election.
    #[must_use]
    pub fn with_reconnect_max(mut self, max: Duration) -> Self {
        self.reconnect_max = max.clamp(RECONNECT_MIN, RECONNECT_MAX);
        self
    }

    /// The wait before the next connection attempt: [`RECONNECT_MIN`], doubled per failed
    /// attempt beyond the first, at most the client's cap.
    fn backoff(&self) -> Duration {
        let doublings = self.failures.get().saturating_sub(1).min(16);
        (RECONNECT_MIN * 2u32.pow(doublings)).min(self.reconnect_max)
    }

    /// The live connection to the peer, or a new one: waits for an attempt in progress; a
    /// new attempt only after the backoff since the last.
    async fn connection(&self) -> Result<Rc<Conn>, PeerError> {
        if let Some(c) = self.current().await {
            return c;
        }
        if self
            .last_attempt
            .get()
            .is_some_and(|t| t.elapsed() < self.backoff())
        {
            return Err(PeerError::Unreachable(
                self.addr,
                "reconnecting too soon".into(),
            ));
        }
        self.last_attempt.set(Some(Instant::now()));
        self.connecting.set(true);
        // Ends the attempt however this future ends: also when the caller drops it (an
        // openraft RPC timeout), which left `connecting` set and the peer unreachable.
        let _attempt = AttemptGuard(self);
        let io = match self.dial().await {
            Ok(io) => io,
            Err(e) => {
                self.failures.set(self.failures.get().saturating_add(1));
                return Err(e);
            }
        };
        self.failures.set(0);
        let c = self.open(io).await?;
        *self.conn.borrow_mut() = Some(Rc::clone(&c));
        Ok(c)
    }

    /// The live connection, or the outcome of the attempt in progress; `None` when neither
    /// (a new attempt may start).
    async fn current(&self) -> Option<Result<Rc<Conn>, PeerError>> {
        loop {
            if let Some(c) = self.conn.borrow().as_ref().filter(|c| c.alive.get()) {
                return Some(Ok(Rc::clone(c)));
            }
            if !self.connecting.get() {
                return None;
            }
            let l = self.connect_done.listen();
            if self.connecting.get() {
                l.await;
            }
            if self.conn.borrow().as_ref().is_none_or(|c| !c.alive.get()) {
                return Some(Err(PeerError::Unreachable(
                    self.addr,
                    "connection attempt failed".into(),
                )));
            }
        }
    }

    /// A TCP connection to the peer (from the bound address, if any), with TLS when set.
    async fn dial(&self) -> Result<Box<dyn Io>, PeerError> {
        let connected = match self.bind {
            None => TcpStream::connect(self.addr)
                .await
                .map_err(std::io::Error::from),
            Some(ip) => connect_from(ip, self.addr, CONNECT_TIMEOUT, &self.connect_thread).await,
        };
        let stream = connected.map_err(|e| PeerError::Unreachable(self.addr, e.to_string()))?;
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => Ok(Box::new(stream)),
            Some(tls) => tls_connect(tls, self.addr, stream).await.map_err(|e| {
                tracing::debug!(target: "net.peer", peer = %self.addr, error = %e, "peer link: TLS handshake failed");
                PeerError::Unreachable(self.addr, format!("TLS: {e}"))
            }),
        }
    }

    /// Starts a connection's writer and reader and sends its hello (the secret: the server
    /// closes the connection if it is wrong). Replies go to their waiting requests; when the
    /// connection ends, every waiting request sees it closed.
    async fn open(&self, io: Box<dyn Io>) -> Result<Rc<Conn>, PeerError> {
        let (r, w) = futures_lite::io::split(io);
        let alive = Rc::new(Cell::new(true));
        let pending: Pending = Rc::default();
        let dead = {
            let (alive, pending) = (Rc::clone(&alive), Rc::clone(&pending));
            move || {
                alive.set(false);
                pending.borrow_mut().clear(); // callers see Closed
            }
        };
        let tx = spawn_writer(self.queue, w, dead.clone());
        let hello = encode(&PeerFrame {
            group: 0,
            kind: KIND_HELLO,
            request_id: 0,
            payload: Bytes::copy_from_slice(self.secret.bytes()),
        });
        if tx.send(hello).await.is_err() {
            return Err(PeerError::Closed(self.addr));
        }
        {
            let pending = Rc::clone(&pending);
            let max_frame = self.max_frame;
            let failed = dead.clone();
            let reading = spawn_in(self.queue, async move {
                read_frames(r, max_frame, max_frame, |f| {
                    if let Some(waiter) = pending.borrow_mut().remove(&f.request_id) {
                        let _ = waiter.send(f);
                    }
                    std::future::ready(true)
                })
                .await;
                dead();
            });
            if !reading {
                failed();
                return Err(PeerError::Closed(self.addr));
            }
        }
        Ok(Rc::new(Conn { tx, pending, alive }))
    }

    /// Sends a request and waits for its response.
    ///
    /// # Errors
    /// [`PeerError`]: unreachable peer, broken connection, or no answer within `timeout`.
    pub async fn call(
        &self,
        group: u8,
        kind: u8,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<PeerFrame, PeerError> {
        let conn = self.connection().await?;
        let request_id = self.next_id.get();
        self.next_id.set(request_id + 1);
        let (tx, rx) = oneshot::channel();
        conn.pending.borrow_mut().insert(request_id, tx);
        let sent = future::or(
            async {
                conn.tx
                    .send(encode(&PeerFrame {
                        group,
                        kind,
                        request_id,
                        payload,
                    }))
                    .await
                    .is_ok()
            },
            async {
                glommio::timer::sleep(timeout).await;
                false
            },
        )
        .await;
        if !sent {
            conn.pending.borrow_mut().remove(&request_id);
            return Err(PeerError::Closed(self.addr));
        }
        let answer = future::or(async { Some(rx.await) }, async {
            glommio::timer::sleep(timeout).await;
            None
        })
        .await;
        match answer {
            Some(Ok(f)) => Ok(f),
            Some(Err(_)) => Err(PeerError::Closed(self.addr)),
            None => {
                conn.pending.borrow_mut().remove(&request_id);
                Err(PeerError::Timeout(self.addr, timeout))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        let s = PeerSecret::new(b"abc");
        assert!(s.matches(b"abc"));
        assert!(!s.matches(b"abd") && !s.matches(b"ab") && !s.matches(b"abcd") && !s.matches(b""));
        assert!(PeerSecret::default().is_open());
        assert_eq!(format!("{s:?}"), "PeerSecret(..)", "never printed");
    }

    #[test]
    fn reconnect_backoff_doubles_per_failure_up_to_the_cap() {
        let c = PeerClient::new("127.0.0.1:1".parse().unwrap(), 1024);
        let waits: Vec<Duration> = [0, 1, 2, 3, 5, 40]
            .iter()
            .map(|&f| {
                c.failures.set(f);
                c.backoff()
            })
            .collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(waits, [ms(50), ms(50), ms(100), ms(200), ms(800), ms(1000)]);
        let capped =
            PeerClient::new("127.0.0.1:1".parse().unwrap(), 1024).with_reconnect_max(ms(120));
        capped.failures.set(40);
        assert_eq!(capped.backoff(), ms(120));
        let floor = PeerClient::new("127.0.0.1:1".parse().unwrap(), 1024).with_reconnect_max(ms(1));
        floor.failures.set(40);
        assert_eq!(floor.backoff(), RECONNECT_MIN);
    }
}
