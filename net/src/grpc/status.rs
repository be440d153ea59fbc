//! gRPC status codes and the status carried in trailers.

use std::fmt;

/// gRPC status codes (stable wire numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl fmt::Display for Code {
    /// The canonical name (`FAILED_PRECONDITION`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Code::*;
        f.write_str(match self {
            Ok => "OK",
            Cancelled => "CANCELLED",
            Unknown => "UNKNOWN",
            InvalidArgument => "INVALID_ARGUMENT",
            DeadlineExceeded => "DEADLINE_EXCEEDED",
            NotFound => "NOT_FOUND",
            AlreadyExists => "ALREADY_EXISTS",
            PermissionDenied => "PERMISSION_DENIED",
            ResourceExhausted => "RESOURCE_EXHAUSTED",
            FailedPrecondition => "FAILED_PRECONDITION",
            Aborted => "ABORTED",
            OutOfRange => "OUT_OF_RANGE",
            Unimplemented => "UNIMPLEMENTED",
            Internal => "INTERNAL",
            Unavailable => "UNAVAILABLE",
            DataLoss => "DATA_LOSS",
            Unauthenticated => "UNAUTHENTICATED",
        })
    }
}

/// Trailer naming the leader's client address on a refusal by a node that does not lead:
/// subscribe refusals and membership changes carry it (a membership refusal carries it empty
/// while no leader is known); publish acks name the leader in `leader_address`. Clients
/// follow it, never parsing messages.
pub const LEADER_ADDRESS: &str = "futureq-leader-address";

/// A status: code, message, and extra trailer metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The code.
    pub code: Code,
    /// Human-readable detail (sent percent-encoded in `grpc-message`).
    pub message: String,
    /// Extra trailers, e.g. `futureq-leader-address`.
    pub metadata: Vec<(&'static str, String)>,
}

impl Status {
    /// A status with a message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
            metadata: Vec::new(),
        }
    }

    /// OK.
    #[must_use]
    pub fn ok() -> Self {
        Status::new(Code::Ok, "")
    }

    /// Adds a trailer.
    #[must_use]
    pub fn with_metadata(mut self, key: &'static str, value: String) -> Self {
        self.metadata.push((key, value));
        self
    }

    /// Adds the [`LEADER_ADDRESS`] trailer, unless `addr` is empty (leader unknown).
    #[must_use]
    pub fn with_leader(self, addr: &str) -> Self {
        if addr.is_empty() {
            self
        } else {
            self.with_metadata(LEADER_ADDRESS, addr.to_owned())
        }
    }

    /// The [`LEADER_ADDRESS`] trailer, if any.
    #[must_use]
    pub fn leader(&self) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| *k == LEADER_ADDRESS)
            .map(|(_, v)| v.as_str())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

/// Percent-encodes a `grpc-message` value as the gRPC HTTP/2 spec requires.
#[must_use]
pub fn percent_encode(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for b in msg.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("a b"), "a b");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }
}
