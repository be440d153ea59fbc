//! A minimal unary gRPC client over h2 on glommio: what a node needs to call another node's
//! API (JoinCluster when joining, LeaveCluster for `futureq leave`, the cluster info asked of
//! the leader). Plaintext, or TLS with the node's certificate when the cluster runs mutual
//! TLS ([`Dial::tls`]); no compression, one call per connection.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use bytes::Bytes;
use futures_lite::future;
use http::{HeaderMap, Request};
use tokio_util::compat::FuturesAsyncReadCompatExt;

use super::codec::{encode_message, FrameDecoder};
use super::status::{Code, Status, LEADER_ADDRESS};

/// Largest response accepted.
pub const RESPONSE_MAX: usize = 4 << 20;

fn unavailable(what: &str, e: impl std::fmt::Display) -> Status {
    Status::new(Code::Unavailable, format!("{what}: {e}"))
}

fn code_of(n: u32) -> Code {
    use Code::*;
    [
        Ok,
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    ]
    .get(n as usize)
    .copied()
    .unwrap_or(Unknown)
}

/// The status in `grpc-status` / `grpc-message`, if the headers carry one, with the
/// [`LEADER_ADDRESS`] trailer and the refusal's reason and outcome.
fn status_of(h: &HeaderMap) -> Option<Status> {
    let code = h.get("grpc-status")?.to_str().ok()?.parse::<u32>().ok()?;
    let msg = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(percent_decode)
        .unwrap_or_default();
    let mut status = Status::new(code_of(code), msg);
    status.refusal = h
        .get(super::status::DETAILS_HEADER)
        .and_then(|v| Status::parse_details(v.as_bytes()));
    Some(match h.get(LEADER_ADDRESS).and_then(|v| v.to_str().ok()) {
        Some(leader) => status.with_metadata(LEADER_ADDRESS, leader.to_owned()),
        None => status,
    })
}

/// A unary call's response message and the leader the server named in its trailers (a
/// follower's refusal answered with status OK, as membership changes are).
#[derive(Debug)]
pub struct Answer<Resp> {
    /// The response.
    pub message: Resp,
    /// The [`LEADER_ADDRESS`] trailer: present on a refusal by a node that does not lead,
    /// empty when that node knows no leader either.
    pub leader: Option<String>,
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where a call goes: `host:port`, and over TLS as a node of the cluster when `tls` is set
/// (every caller says which: there is no plaintext default that a call carrying the cluster
/// secret could fall into).
#[derive(Clone, Copy)]
pub struct Dial<'a> {
    /// `host:port` of the node's client plane.
    pub addr: &'a str,
    /// The cluster's mutual TLS: the call presents the node's certificate and verifies the
    /// server's against the cluster CA.
    pub tls: Option<&'a crate::tls::PeerTls>,
}

/// Resolves `host:port` (blocking DNS lookup for names; call off latency-critical paths).
///
/// # Errors
/// INVALID_ARGUMENT when it does not resolve.
pub fn resolve(addr: &str) -> Result<SocketAddr, Status> {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Status::new(Code::InvalidArgument, format!("cannot resolve {addr:?}")))
}

/// Calls unary method `path` (e.g. `/futureq.FutureQCluster/JoinCluster`) on `addr`.
///
/// # Errors
/// The server's status, UNAVAILABLE for connection or protocol failures, DEADLINE_EXCEEDED
/// after `timeout`.
pub async fn unary<'a, Req, Resp>(
    to: Dial<'a>,
    path: &str,
    req: &Req,
    timeout: Duration,
) -> Result<Resp, Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    unary_with_headers(to, path, req, &[], timeout).await
}

/// [`unary`] with extra request headers (lower-case names).
///
/// # Errors
/// As [`unary`].
pub async fn unary_with_headers<'a, Req, Resp>(
    to: Dial<'a>,
    path: &str,
    req: &Req,
    headers: &[(&'static str, &str)],
    timeout: Duration,
) -> Result<Resp, Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    unary_answer(to, path, req, headers, timeout)
        .await
        .map(|a| a.message)
}

/// [`unary_with_headers`], with the leader the server named in its trailers.
///
/// # Errors
/// As [`unary`]; a refusal's status carries the leader too ([`Status::leader`]).
pub async fn unary_answer<'a, Req, Resp>(
    to: Dial<'a>,
    path: &str,
    req: &Req,
    headers: &[(&'static str, &str)],
    timeout: Duration,
) -> Result<Answer<Resp>, Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let addr = to.addr;
    let call = call(to, path, encode_message(req), headers);
    let deadline = async {
        glommio::timer::sleep(timeout).await;
        Err(Status::new(
            Code::DeadlineExceeded,
            format!("{path} on {addr}: no answer within {timeout:?}"),
        ))
    };
    let (bytes, leader) = future::or(call, deadline).await?;
    let message = Resp::decode(bytes)
        .map_err(|e| Status::new(Code::Internal, format!("bad response: {e}")))?;
    Ok(Answer { message, leader })
}

async fn call(
    to: Dial<'_>,
    path: &str,
    body: Bytes,
    headers: &[(&'static str, &str)],
) -> Result<(Bytes, Option<String>), Status> {
    let addr = to.addr;
    let sock = resolve(addr)?;
    let stream = glommio::net::TcpStream::connect(sock)
        .await
        .map_err(|e| unavailable(&format!("connecting to {addr}"), e))?;
    let _ = stream.set_nodelay(true);
    let Some(tls) = to.tls else {
        return exchange(stream.compat(), "http", addr, path, body, headers).await;
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = match (host.parse::<std::net::IpAddr>(), tls.server_name(sock.ip())) {
        (_, Ok(rustls::pki_types::ServerName::DnsName(n))) => {
            rustls::pki_types::ServerName::DnsName(n)
        }
        (Ok(ip), _) => rustls::pki_types::ServerName::IpAddress(ip.into()),
        (Err(_), _) => rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| Status::new(Code::InvalidArgument, format!("{addr}: {e}")))?,
    };
    let session = tokio_rustls::TlsConnector::from(tls.api_client())
        .connect(name, stream.compat())
        .await
        .map_err(|e| unavailable(&format!("TLS with {addr}"), e))?;
    exchange(session, "https", addr, path, body, headers).await
}

async fn exchange<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static>(
    io: T,
    scheme: &str,
    addr: &str,
    path: &str,
    body: Bytes,
    headers: &[(&'static str, &str)],
) -> Result<(Bytes, Option<String>), Status> {
    let (mut client, conn) = h2::client::handshake(io)
        .await
        .map_err(|e| unavailable("HTTP/2 handshake", e))?;
    let driver = glommio::spawn_local(async move {
        let _ = conn.await;
    });
    let mut request = Request::post(format!("{scheme}://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request
        .body(())
        .map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
    let (response, mut send) = client
        .send_request(request, false)
        .map_err(|e| unavailable("sending the request", e))?;
    send.send_data(body, true)
        .map_err(|e| unavailable("sending the request", e))?;
    let response = response
        .await
        .map_err(|e| unavailable("reading the response", e))?;
    let (parts, mut recv) = response.into_parts();
    let out = async {
        if let Some(s) = status_of(&parts.headers) {
            // Trailers-Only: no message.
            return Err(s);
        }
        let mut frames = FrameDecoder::new(RESPONSE_MAX);
        let mut message = None;
        while let Some(chunk) = recv.data().await {
            let chunk = chunk.map_err(|e| unavailable("reading the response", e))?;
            let _ = recv.flow_control().release_capacity(chunk.len());
            frames.push(&chunk);
            if message.is_none() {
                message = frames.decode()?;
            }
        }
        let trailers = recv
            .trailers()
            .await
            .map_err(|e| unavailable("reading the trailers", e))?
            .unwrap_or_default();
        match status_of(&trailers) {
            Some(s) if s.code == Code::Ok => match message {
                Some(m) => Ok((m, s.leader().map(str::to_owned))),
                None => Err(Status::new(Code::Internal, "OK without a response message")),
            },
            Some(s) => Err(s),
            None => Err(Status::new(Code::Internal, "response without grpc-status")),
        }
    }
    .await;
    drop(driver);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_and_codes() {
        assert_eq!(percent_decode("a%20b%25c"), "a b%c");
        assert_eq!(percent_decode("bad%2"), "bad%2");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%é1"), "%é1");
        assert_eq!(code_of(9), Code::FailedPrecondition);
        assert_eq!(code_of(99), Code::Unknown);
    }
}
