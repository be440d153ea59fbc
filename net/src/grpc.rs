//! gRPC over HTTP/2: framing, status codes and the server.

pub mod client;
pub mod codec;
pub mod server;
pub mod status;

pub use codec::{encode_into, encode_message, FrameDecoder};
pub use server::{serve, Call, Handler, Inbound, Outbound, ServerConfig};
pub use status::{Code, Status, LEADER_ADDRESS};
