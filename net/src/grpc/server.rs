//! The gRPC server: h2 over a glommio TCP stream, one task per request.
//!
//! Each connection's `accept()` loop drives the whole HTTP/2 connection (frames, pings,
//! flushes); each request runs as its own task on the same executor. A handler gets the
//! request's [`Call`] (path, headers, [`Inbound`] messages) and an [`Outbound`] to write
//! messages, and returns the final [`Status`]; the server writes it as trailers (or as a
//! Trailers-Only response when nothing was sent) and enforces `grpc-timeout`.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::future;
use glommio::net::{TcpListener, TcpStream};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::compat::FuturesAsyncReadCompatExt;

use super::codec::{check_len, encode_into, FrameDecoder};
use super::status::{percent_encode, Code, Status};
use crate::shutdown::Shutdown;
use crate::tls::{PeerIdentity, ReloadableServer};
use futureq_core::refusal::Reason;

/// Server limits (from `api.grpc.*`).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest message accepted from a client.
    pub max_recv_message_len: usize,
    /// Largest message sent to a client.
    pub max_send_message_len: usize,
    /// Streams served at once per connection. HTTP/2's SETTINGS advertise twice as many
    /// (see [`advertised_streams`]), so a client that opens more is never queued silently by its
    /// own HTTP/2 layer: each stream past this limit is answered at once with
    /// RESOURCE_EXHAUSTED naming it.
    pub max_concurrent_streams: u32,
    /// Initial per-stream receive window.
    pub stream_window: u32,
    /// Initial connection receive window.
    pub connection_window: u32,
    /// How often an idle-or-not connection is pinged; `None` disables keepalive pings.
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed as dead
    /// (`api.grpc.keepaliveTimeout`). Its streams then end, releasing their deliveries.
    pub keepalive_timeout: Duration,
    /// How long a new connection may take for its TLS handshake (when TLS is on) and its
    /// HTTP/2 preface together before it is closed (a connection that sends nothing holds no
    /// task beyond it; one silent after its preface is dropped by the keepalive pings).
    pub handshake_timeout: Duration,
    /// The cluster's mutual TLS: a client certificate that chains to its CA marks the caller
    /// as a node of the cluster ([`PeerIdentity::cluster_member`]).
    pub cluster_tls: Option<std::sync::Arc<crate::tls::PeerTls>>,
}

/// The SETTINGS_MAX_CONCURRENT_STREAMS advertised for a served limit of `served` streams:
/// twice as many, so that a stream past the limit reaches the server and is refused with a
/// status instead of waiting in the client's queue (refused streams end at once, so the
/// slack is never held for long).
#[must_use]
pub fn advertised_streams(served: u32) -> u32 {
    served.saturating_mul(2)
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_recv_message_len: 4 << 20,
            max_send_message_len: 4 << 20,
            max_concurrent_streams: 1024,
            stream_window: 1 << 20,
            connection_window: 4 << 20,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            cluster_tls: None,
        }
    }
}

/// A request as the handler sees it.
pub struct Call {
    /// `/package.Service/Method`.
    pub path: String,
    /// Request headers.
    pub headers: HeaderMap,
    /// The request's message stream.
    pub inbound: Inbound,
    /// What the connection's TLS session established about the client (shared by the
    /// connection's calls).
    pub peer: Rc<PeerIdentity>,
}

/// A boxed, single-threaded handler future.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Status> + 'a>>;

/// Serves one request: reads `call.inbound`, writes to the [`Outbound`], returns the status.
pub type Handler = Rc<dyn for<'a> Fn(Call, &'a mut Outbound) -> HandlerFuture<'a>>;

/// Reads length-prefixed messages from the request body, releasing flow-control capacity
/// as bytes are consumed.
pub struct Inbound {
    body: RecvStream,
    decoder: FrameDecoder,
    eos: bool,
}

impl Inbound {
    /// The next raw message, or `None` after the client half-closed.
    ///
    /// Cancel-safe: bytes already received stay buffered if the future is dropped.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED (too large), INTERNAL (compressed or truncated), CANCELLED (reset).
    pub async fn next_raw(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if let Some(m) = self.decoder.decode()? {
                return Ok(Some(m));
            }
            if self.eos {
                if self.decoder.has_partial() {
                    return Err(Status::refused(
                        Reason::Malformed,
                        "request ended inside a message",
                    ));
                }
                return Ok(None);
            }
            let chunk = self.body.data().await;
            self.take(chunk)?;
        }
    }

    /// Takes what the body gave: a chunk into the decoder (its flow-control window back to
    /// the client), or the end of the stream.
    fn take(&mut self, chunk: Option<Result<Bytes, h2::Error>>) -> Result<(), Status> {
        match chunk {
            Some(Ok(chunk)) => {
                let _ = self.body.flow_control().release_capacity(chunk.len());
                self.decoder.push(&chunk);
            }
            Some(Err(e)) => {
                return Err(Status::refused(
                    Reason::Cancelled,
                    format!("request stream: {e}"),
                ));
            }
            None => self.eos = true,
        }
        Ok(())
    }

    /// The next message decoded as `M`.
    ///
    /// # Errors
    /// As [`Inbound::next_raw`], plus INVALID_ARGUMENT when the bytes are not an `M`.
    pub async fn next<M: prost::Message + Default>(&mut self) -> Result<Option<M>, Status> {
        self.next_raw().await?.map(decode_as).transpose()
    }

    /// The next message if it is all here already: in the bytes buffered, or in the DATA
    /// frames h2 received for this stream and not handed out yet. Never waits: `None` when
    /// the next message is not complete yet, or the client half-closed (then
    /// [`Inbound::next`] says so). One read of a stream can hold thousands of small messages
    /// (ACKs): taken together, they cost one wake-up.
    ///
    /// # Errors
    /// As [`Inbound::next`].
    pub async fn next_ready<M: prost::Message + Default>(&mut self) -> Result<Option<M>, Status> {
        loop {
            if let Some(m) = self.decoder.decode()? {
                return decode_as(m).map(Some);
            }
            if self.eos {
                return Ok(None);
            }
            match futures_lite::future::poll_once(self.body.data()).await {
                None => return Ok(None),
                Some(chunk) => self.take(chunk)?,
            }
        }
    }
}

/// Decodes one message as `M`.
fn decode_as<M: prost::Message + Default>(b: Bytes) -> Result<M, Status> {
    M::decode(b).map_err(|e| {
        Status::invalid(format!(
            "cannot decode {}: {e}",
            std::any::type_name::<M>()
                .rsplit("::")
                .next()
                .unwrap_or("message")
        ))
    })
}

enum OutState {
    Idle(SendResponse<Bytes>),
    Streaming(SendStream<Bytes>),
    Done,
}

/// Writes response messages with send flow control: `send` waits for window capacity, so
/// a client that does not read pushes back instead of filling memory.
pub struct Outbound {
    state: OutState,
    max_len: usize,
}

fn grpc_response(status: Option<&Status>) -> Response<()> {
    let mut r = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("static response parts are valid");
    if let Some(s) = status {
        add_status(r.headers_mut(), s);
    }
    r
}

fn add_status(h: &mut HeaderMap, s: &Status) {
    h.insert("grpc-status", HeaderValue::from(s.code as u32));
    if !s.message.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&s.message)) {
            h.insert("grpc-message", v);
        }
    }
    for (k, v) in &s.metadata {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(*k, v);
        }
    }
    if let Some(d) = s.details().and_then(|d| HeaderValue::from_str(&d).ok()) {
        h.insert(super::status::DETAILS_HEADER, d);
    }
}

impl Outbound {
    fn stream(&mut self) -> Result<&mut SendStream<Bytes>, Status> {
        if let OutState::Idle(_) = self.state {
            let OutState::Idle(mut respond) = std::mem::replace(&mut self.state, OutState::Done)
            else {
                unreachable!("checked above")
            };
            let s = respond
                .send_response(grpc_response(None), false)
                .map_err(|e| Status::new(Code::Cancelled, format!("send headers: {e}")))?;
            self.state = OutState::Streaming(s);
        }
        match &mut self.state {
            OutState::Streaming(s) => Ok(s),
            _ => Err(Status::new(Code::Cancelled, "response already finished")),
        }
    }

    /// Sends one message, waiting for flow-control capacity.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED when the message exceeds `maxSendMessageSize`; CANCELLED when
    /// the client went away.
    pub async fn send<M: prost::Message>(&mut self, m: &M) -> Result<(), Status> {
        self.send_all(std::slice::from_ref(m)).await
    }

    /// Sends several messages in one write (fewer DATA frames and syscalls when a stream has
    /// a backlog), waiting for flow-control capacity.
    ///
    /// # Errors
    /// As [`Outbound::send`]; nothing is sent when any message is too large.
    pub async fn send_all<M: prost::Message>(&mut self, msgs: &[M]) -> Result<(), Status> {
        let mut buf = BytesMut::new();
        for m in msgs {
            check_len(
                "response",
                m.encoded_len(),
                self.max_len,
                "api.grpc.maxSendMessageSize",
            )?;
            encode_into(&mut buf, m);
        }
        let mut data = buf.freeze();
        let s = self.stream()?;
        while !data.is_empty() {
            s.reserve_capacity(data.len());
            let cap = future::poll_fn(|cx| s.poll_capacity(cx)).await;
            match cap {
                Some(Ok(0)) => {}
                Some(Ok(n)) => {
                    let chunk = data.split_to(n.min(data.len()));
                    s.send_data(chunk, false)
                        .map_err(|e| Status::new(Code::Cancelled, format!("send: {e}")))?;
                }
                Some(Err(e)) => return Err(Status::new(Code::Cancelled, format!("send: {e}"))),
                None => return Err(Status::new(Code::Cancelled, "stream closed by the client")),
            }
        }
        Ok(())
    }

    /// Sends the response headers now (a streaming call's "subscribed" signal).
    ///
    /// # Errors
    /// CANCELLED when the client went away.
    pub fn start(&mut self) -> Result<(), Status> {
        self.stream().map(|_| ())
    }

    /// Resolves when the client resets the stream or the connection fails (never before the
    /// response started). Lets a handler that is not reading notice a gone client.
    pub async fn closed(&mut self) {
        match &mut self.state {
            OutState::Streaming(s) => {
                let _ = future::poll_fn(|cx| s.poll_reset(cx)).await;
            }
            _ => future::pending::<()>().await,
        }
    }

    /// True once headers were sent.
    #[must_use]
    pub fn started(&self) -> bool {
        matches!(self.state, OutState::Streaming(_))
    }

    /// Ends the response with `status` (trailers, or Trailers-Only if nothing was sent).
    fn finish(&mut self, status: &Status) {
        match std::mem::replace(&mut self.state, OutState::Done) {
            OutState::Idle(mut respond) => {
                let _ = respond.send_response(grpc_response(Some(status)), true);
            }
            OutState::Streaming(mut s) => {
                let mut t = HeaderMap::new();
                add_status(&mut t, status);
                let _ = s.send_trailers(t);
            }
            OutState::Done => {}
        }
    }
}

/// Parses `grpc-timeout` (`<1..8 digits><H|M|S|m|u|n>`).
#[must_use]
pub fn parse_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (num, unit) = v.split_at(v.len() - 1);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

async fn handle_request(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    handler: Handler,
    cfg: Rc<ServerConfig>,
    peer: Rc<PeerIdentity>,
) {
    let (parts, body) = req.into_parts();
    let is_grpc = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if parts.method != http::Method::POST || !is_grpc {
        let r = Response::builder()
            .status(415)
            .body(())
            .expect("static response");
        let _ = respond.send_response(r, true);
        return;
    }
    let timeout = parts
        .headers
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_timeout);
    let call = Call {
        path: parts.uri.path().to_owned(),
        headers: parts.headers,
        inbound: Inbound {
            body,
            decoder: FrameDecoder::new(cfg.max_recv_message_len),
            eos: false,
        },
        peer,
    };
    let mut out = Outbound {
        state: OutState::Idle(respond),
        max_len: cfg.max_send_message_len,
    };
    let status = {
        let fut = handler(call, &mut out);
        match timeout {
            None => fut.await,
            Some(d) => {
                future::or(fut, async move {
                    glommio::timer::Timer::new(d).await;
                    Status::refused(Reason::Timeout, "deadline (grpc-timeout) exceeded")
                })
                .await
            }
        }
    };
    out.finish(&status);
}

fn is_quiet_disconnect(e: &h2::Error) -> bool {
    if e.is_go_away() || e.is_reset() {
        return true;
    }
    e.get_io().is_some_and(|io| {
        matches!(
            io.kind(),
            std::io::ErrorKind::NotConnected
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        )
    })
}

type Accepted = Option<Result<(Request<RecvStream>, SendResponse<Bytes>), h2::Error>>;

#[allow(clippy::large_enum_variant)] // one per connection loop turn, never stored
enum ConnEvent {
    Next(Accepted),
    Shutdown,
    Dead,
}

/// One request being served on a connection; counted until dropped (also when its task is).
struct StreamSlot(Rc<Cell<u32>>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

async fn serve_connection(
    stream: TcpStream,
    handler: Handler,
    cfg: Rc<ServerConfig>,
    shutdown: Shutdown,
    tls: Option<std::sync::Arc<ReloadableServer>>,
) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    let deadline = Instant::now() + cfg.handshake_timeout;
    let Some(tls) = tls else {
        let plain = Rc::new(PeerIdentity::default());
        return serve_h2(
            stream.compat(),
            peer,
            plain,
            deadline,
            handler,
            cfg,
            shutdown,
        )
        .await;
    };
    let accept = tokio_rustls::TlsAcceptor::from(tls.config()).accept(stream.compat());
    let session = match within(deadline, accept).await {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            tracing::info!(target: "net.grpc", ?peer, error = %e, "TLS handshake failed");
            return;
        }
        None => {
            tracing::info!(target: "net.grpc", ?peer, timeout_ms = cfg.handshake_timeout.as_millis() as u64, "closing connection: no TLS handshake within api.grpc.handshakeTimeout");
            return;
        }
    };
    let identity = Rc::new(PeerIdentity::of_tls(
        session.get_ref().1.peer_certificates(),
        cfg.cluster_tls.as_deref(),
    ));
    serve_h2(session, peer, identity, deadline, handler, cfg, shutdown).await;
}

/// `fut`'s output, or `None` once `deadline` passed.
async fn within<T>(deadline: Instant, fut: impl Future<Output = T>) -> Option<T> {
    future::or(async { Some(fut.await) }, async {
        glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
        None
    })
    .await
}

/// Serves the HTTP/2 connection on `io` (plain TCP or a TLS session) until it ends.
async fn serve_h2<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    peer: Option<std::net::SocketAddr>,
    identity: Rc<PeerIdentity>,
    deadline: Instant,
    handler: Handler,
    cfg: Rc<ServerConfig>,
    shutdown: Shutdown,
) {
    let Some(mut conn) = h2_handshake(io, peer, deadline, &cfg).await else {
        return;
    };
    let dead = keepalive(&mut conn, &cfg);
    let streams = Rc::new(Cell::new(0u32)); // requests being served on this connection
    let mut refused_logged = false;
    let mut closing = false;
    loop {
        let watch_dead = async {
            dead.wait().await;
            ConnEvent::Dead
        };
        let stop = async {
            if closing {
                future::pending::<()>().await;
            }
            shutdown.wait().await;
            ConnEvent::Shutdown
        };
        let accept = async { ConnEvent::Next(conn.accept().await) };
        let next = match future::or(future::or(accept, watch_dead), stop).await {
            ConnEvent::Next(n) => n,
            ConnEvent::Shutdown => {
                conn.graceful_shutdown();
                closing = true;
                continue;
            }
            ConnEvent::Dead => {
                tracing::info!(target: "net.grpc", ?peer, "closing connection: keepalive ping not answered");
                break;
            }
        };
        match next {
            Some(Ok((req, mut respond))) => {
                if streams.get() >= cfg.max_concurrent_streams {
                    refuse_stream(
                        &mut respond,
                        cfg.max_concurrent_streams,
                        peer,
                        &mut refused_logged,
                    );
                    drop(req);
                    continue;
                }
                streams.set(streams.get() + 1);
                let open = StreamSlot(Rc::clone(&streams));
                let (handler, cfg) = (Rc::clone(&handler), Rc::clone(&cfg));
                let identity = Rc::clone(&identity);
                glommio::spawn_local(async move {
                    handle_request(req, respond, handler, cfg, identity).await;
                    drop(open);
                })
                .detach();
            }
            Some(Err(e)) => {
                if !is_quiet_disconnect(&e) {
                    tracing::warn!(target: "net.grpc", ?peer, error = %e, "connection error");
                }
                break;
            }
            None => break,
        }
    }
}

/// The HTTP/2 handshake, by `deadline`; `None` (logged) when it failed or came too late.
async fn h2_handshake<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    peer: Option<std::net::SocketAddr>,
    deadline: Instant,
    cfg: &ServerConfig,
) -> Option<h2::server::Connection<T, Bytes>> {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(cfg.stream_window)
        .initial_connection_window_size(cfg.connection_window)
        .max_concurrent_streams(advertised_streams(cfg.max_concurrent_streams))
        .max_frame_size(1 << 20)
        .max_header_list_size(64 << 10);
    match within(deadline, builder.handshake::<_, Bytes>(io)).await {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            if !is_quiet_disconnect(&e) {
                tracing::debug!(target: "net.grpc", ?peer, error = %e, "HTTP/2 handshake failed");
            }
            None
        }
        None => {
            tracing::info!(target: "net.grpc", ?peer, timeout_ms = cfg.handshake_timeout.as_millis() as u64, "closing connection: no HTTP/2 handshake within the timeout");
            None
        }
    }
}

/// Keepalive: a peer that stops answering pings (half-open TCP, frozen client) is dropped.
/// The signal fires when a ping goes unanswered.
fn keepalive<T: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut h2::server::Connection<T, Bytes>,
    cfg: &ServerConfig,
) -> Shutdown {
    let dead = Shutdown::new();
    if let (Some(interval), Some(mut pings)) = (cfg.keepalive_interval, conn.ping_pong()) {
        let dead = dead.clone();
        let timeout = cfg.keepalive_timeout;
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(interval).await;
                let answered = future::or(
                    async { pings.ping(h2::Ping::opaque()).await.is_ok() },
                    async {
                        glommio::timer::sleep(timeout).await;
                        false
                    },
                )
                .await;
                if !answered {
                    dead.trigger();
                    return;
                }
            }
        })
        .detach();
    }
    dead
}

/// Refuses a stream past the connection's limit at once (Trailers-Only): the client sees why,
/// and the stream ends, so the refusal holds no slot. Logged once per connection.
fn refuse_stream(
    respond: &mut h2::server::SendResponse<Bytes>,
    limit: u32,
    peer: Option<std::net::SocketAddr>,
    logged: &mut bool,
) {
    if !*logged {
        *logged = true;
        tracing::warn!(target: "net.grpc", ?peer, limit, "a connection opened more streams than api.grpc.maxConcurrentStreams; refusing the excess with RESOURCE_EXHAUSTED");
    }
    let status = Status::refused(
        Reason::Overloaded,
        format!("this connection has {limit} streams open, the server's limit (api.grpc.maxConcurrentStreams); end some streams or open another connection"),
    );
    let _ = respond.send_response(grpc_response(Some(&status)), true);
}

/// Accepts connections on `listener` until `shutdown`, serving each on this executor, over
/// TLS when `tls` is given (each connection takes the configuration current when it arrives).
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    cfg: ServerConfig,
    shutdown: Shutdown,
    tls: Option<std::sync::Arc<ReloadableServer>>,
) {
    let cfg = Rc::new(cfg);
    crate::listener::accept_until(&listener, &shutdown, "net.grpc", |stream| {
        glommio::spawn_local(serve_connection(
            stream,
            Rc::clone(&handler),
            Rc::clone(&cfg),
            shutdown.clone(),
            tls.clone(),
        ))
        .detach();
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_timeout("123456789S"), None);
        assert_eq!(parse_timeout("S"), None);
        assert_eq!(parse_timeout("5x"), None);
    }
}
