//! gRPC status codes, the status carried in trailers, and the one table from a typed
//! [`Refusal`] to a status.
//!
//! A refusal travels as its code and message, plus a `google.rpc.Status` in the
//! `grpc-status-details-bin` trailer (the gRPC rich error model, which grpc-go, grpcio's
//! `grpc_status` and tonic read) holding one `google.rpc.ErrorInfo`: `reason` is the
//! [`Reason`]'s name, `domain` is [`ERROR_DOMAIN`], and `metadata` has `outcome` (the
//! [`Outcome`]'s name) and, when known, `leader_address`.

use std::collections::HashMap;
use std::fmt;

use base64::Engine as _;
use futureq_core::refusal::{Outcome, Reason, Refusal};

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

/// `google.rpc.ErrorInfo.domain` of futureq's refusals.
pub use futureq_core::refusal::ERROR_DOMAIN;

/// The trailer holding the `google.rpc.Status` of a refusal (base64, unpadded).
pub const DETAILS_HEADER: &str = "grpc-status-details-bin";

/// The code each refusal reason is sent with: the one place a reason becomes a code.
#[must_use]
pub fn code_of_reason(reason: Reason) -> Code {
    match reason {
        Reason::NotLeader | Reason::Standalone => Code::FailedPrecondition,
        Reason::Timeout => Code::DeadlineExceeded,
        Reason::NotApplied | Reason::Conflict => Code::Aborted,
        Reason::WriteFailed | Reason::ShuttingDown | Reason::Recovering | Reason::StreamIdle => {
            Code::Unavailable
        }
        Reason::DiskLow | Reason::Overloaded | Reason::TooLarge => Code::ResourceExhausted,
        Reason::InvalidArgument => Code::InvalidArgument,
        Reason::NotFound => Code::NotFound,
        Reason::Cancelled => Code::Cancelled,
        Reason::Unimplemented => Code::Unimplemented,
        Reason::Internal | Reason::Malformed => Code::Internal,
        Reason::Unauthenticated => Code::Unauthenticated,
        Reason::PermissionDenied => Code::PermissionDenied,
    }
}

/// A refusal's fields in a `PublishBatchAck`: `error_code`, `error_reason`, `write_outcome`.
#[must_use]
pub fn wire(r: &Refusal) -> (u32, i32, i32) {
    let reason =
        crate::pb::ErrorReason::from_str_name(&format!("ERROR_REASON_{}", r.reason.name()))
            .unwrap_or(crate::pb::ErrorReason::Unspecified);
    let outcome =
        crate::pb::WriteOutcome::from_str_name(&format!("WRITE_OUTCOME_{}", r.outcome.name()))
            .unwrap_or(crate::pb::WriteOutcome::Unspecified);
    (
        code_of_reason(r.reason) as u32,
        reason as i32,
        outcome as i32,
    )
}

/// A status: code, message, extra trailer metadata, and the refusal's reason and outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The code.
    pub code: Code,
    /// Human-readable detail (sent percent-encoded in `grpc-message`).
    pub message: String,
    /// Extra trailers, e.g. `futureq-leader-address`.
    pub metadata: Vec<(&'static str, String)>,
    /// Why, and what became of the write (sent in [`DETAILS_HEADER`]); `None` for OK and for
    /// a status read from a peer that sent none.
    pub refusal: Option<(Reason, Outcome)>,
}

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Status {
        Status {
            code: code_of_reason(r.reason),
            message: r.message,
            metadata: Vec::new(),
            refusal: Some((r.reason, r.outcome)),
        }
        .with_leader(&r.leader)
    }
}

impl Status {
    /// A status with a code and a message and no typed reason: statuses read from the wire,
    /// and failures of a response already under way. A refusal is built from a [`Refusal`].
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
            metadata: Vec::new(),
            refusal: None,
        }
    }

    /// A refusal for `reason` with its default outcome.
    pub fn refused(reason: Reason, message: impl Into<String>) -> Self {
        Refusal::new(reason, message).into()
    }

    /// [`Reason::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Refusal::invalid(message).into()
    }

    /// [`Reason::ShuttingDown`], nothing stored.
    #[must_use]
    pub fn shutting_down() -> Self {
        Refusal::shutting_down().into()
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

    /// The [`DETAILS_HEADER`] value: a `google.rpc.Status` with one `ErrorInfo`.
    #[must_use]
    pub fn details(&self) -> Option<String> {
        let (reason, outcome) = self.refusal?;
        let mut metadata = HashMap::from([("outcome".to_owned(), outcome.name().to_owned())]);
        if let Some(leader) = self.leader() {
            metadata.insert("leader_address".to_owned(), leader.to_owned());
        }
        let info = ErrorInfo {
            reason: reason.name().to_owned(),
            domain: ERROR_DOMAIN.to_owned(),
            metadata,
        };
        let status = RpcStatus {
            code: self.code as i32,
            message: self.message.clone(),
            details: vec![prost_types::Any {
                type_url: ERROR_INFO_TYPE.to_owned(),
                value: prost::Message::encode_to_vec(&info),
            }],
        };
        Some(
            base64::engine::general_purpose::STANDARD_NO_PAD
                .encode(prost::Message::encode_to_vec(&status)),
        )
    }

    /// Reads a [`DETAILS_HEADER`] value (padded or not): the reason and outcome of its first
    /// futureq `ErrorInfo`. `None` for anything else, never a panic (the bytes come from a
    /// peer).
    #[must_use]
    pub fn parse_details(value: &[u8]) -> Option<(Reason, Outcome)> {
        let trimmed = value
            .strip_suffix(b"==")
            .or_else(|| value.strip_suffix(b"="))
            .unwrap_or(value);
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(trimmed)
            .ok()?;
        let status: RpcStatus = prost::Message::decode(bytes.as_slice()).ok()?;
        status.details.iter().find_map(|any| {
            if any.type_url != ERROR_INFO_TYPE {
                return None;
            }
            let info: ErrorInfo = prost::Message::decode(any.value.as_slice()).ok()?;
            futureq_core::refusal::of_error_info(
                &info.domain,
                &info.reason,
                info.metadata.get("outcome").map(String::as_str),
            )
        })
    }
}

/// The type URL of `google.rpc.ErrorInfo` in an `Any`.
const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// `google.rpc.Status` (field numbers of the published message).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google.rpc.ErrorInfo` (field numbers of the published message).
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(map = "string, string", tag = "3")]
    metadata: HashMap<String, String>,
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
    fn every_reason_has_a_code_and_its_details_read_back() {
        for reason in Reason::ALL {
            let code = code_of_reason(reason);
            assert_ne!(code, Code::Ok, "{reason}");
            for outcome in [Outcome::NotStored, Outcome::Unknown, Outcome::Stored] {
                let s = Status::from(
                    Refusal::new(reason, "why")
                        .with_outcome(outcome)
                        .with_leader("h:1"),
                );
                assert_eq!(s.code, code);
                let d = s.details().expect("a refusal has details");
                assert_eq!(Status::parse_details(d.as_bytes()), Some((reason, outcome)));
                // Padded base64, as some encoders send it, reads the same.
                let padded = base64::engine::general_purpose::STANDARD.encode(
                    base64::engine::general_purpose::STANDARD_NO_PAD
                        .decode(&d)
                        .unwrap(),
                );
                assert_eq!(
                    Status::parse_details(padded.as_bytes()),
                    Some((reason, outcome))
                );
            }
        }
        for reason in Reason::ALL {
            for outcome in [Outcome::NotStored, Outcome::Unknown, Outcome::Stored] {
                let (code, r, o) = wire(&Refusal::new(reason, "").with_outcome(outcome));
                assert_eq!(code, code_of_reason(reason) as u32);
                assert_ne!(r, 0, "{reason} has no ErrorReason value in futureq.proto");
                assert_ne!(
                    o, 0,
                    "{outcome:?} has no WriteOutcome value in futureq.proto"
                );
            }
        }
        let s = Status::from(Refusal::not_leader("10.0.0.2:9000"));
        assert_eq!(s.leader(), Some("10.0.0.2:9000"));
        assert_eq!(Status::ok().details(), None);
    }

    proptest::proptest! {
        #[test]
        fn details_from_a_peer_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = Status::parse_details(&bytes);
            let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&bytes);
            let _ = Status::parse_details(encoded.as_bytes());
        }
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("a b"), "a b");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }
}
