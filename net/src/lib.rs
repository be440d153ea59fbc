//! futureq-net: the network edge. gRPC over h2 on glommio sockets, the protobuf types of the
//! API, and the HTTP/1 listener for metrics and health probes. Knows nothing about storage or
//! Raft: requests are handed to a [`grpc::Handler`] supplied by the binary.
//!
//! Layout:
//! - [`pb`]: prost types of `package futureq` and `grpc.health.v1` (built with protox).
//! - [`grpc`]: framing codec, status codes, and the h2 server (flow control both ways,
//!   Trailers-Only errors, `grpc-timeout`, bounded message sizes).
//! - [`http`]: a minimal HTTP/1.1 server for `/metrics` and `/healthz`.
//! - [`peer`]: framing of the Raft transport between nodes; [`peer_link`]: request/response
//!   links over TCP carrying those frames (clustering, in progress).
//! - [`shutdown`]: a cross-thread shutdown signal every listener and stream watches.
//! - `listener`: the accept loop both servers share.
//! - [`tls`]: rustls configurations from PEM files, reloadable; the identity a TLS client proved.
//!
//! # Invariants
//! - Received bytes are released to the peer's flow-control window as they are consumed,
//!   and nothing is sent without send capacity: a slow peer pushes back, memory stays bounded.
//! - Every response ends with a `grpc-status`; errors before any message use Trailers-Only.

pub mod grpc;
pub mod http;
mod listener;
pub mod peer;
pub mod peer_link;
pub mod reflection;
pub mod shutdown;
pub mod tls;

/// Protobuf types of the API.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/futureq.rs"));

    /// `grpc.health.v1`.
    pub mod health {
        include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
    }

    /// `grpc.reflection.v1` (v1alpha has the same messages, so the same bytes on the wire).
    pub mod reflection {
        include!(concat!(env!("OUT_DIR"), "/grpc.reflection.v1.rs"));
    }
}

pub use shutdown::Shutdown;
