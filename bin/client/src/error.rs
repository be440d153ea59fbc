//! What went wrong, as the client's callers decide by it: typed, with the server's reason and
//! what became of the write.

use std::time::Duration;

use crate::{refusal, Outcome, Reason};

/// What went wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No seed or known node answered with a leader within [`crate::ClientConfig::retry_for`].
    #[error("no futureq leader found at {addresses} within {waited:?}{}", if last.is_empty() { String::new() } else { format!(" (last: {last})") })]
    NoLeader {
        /// The addresses tried.
        addresses: String,
        /// How long the client tried.
        waited: Duration,
        /// The last failure seen ("" when every node answered without naming a leader).
        last: String,
    },
    /// An address that is not `host:port`.
    #[error("invalid server address {0:?}: {1}")]
    Address(String, String),
    /// The server answered with an error status.
    #[error("{}: {message}", code.description())]
    Status {
        /// The gRPC status code.
        code: tonic::Code,
        /// The server's message, for people (decide on `reason` and `outcome`).
        message: String,
        /// Why the server refused (`None`: a transport failure, or a server older than
        /// typed refusals).
        reason: Option<Reason>,
        /// Whether the refused write may have happened (`None` as for `reason`).
        outcome: Option<Outcome>,
    },
    /// A write's outcome is unknown (the connection was lost or the server timed out before
    /// answering, and the message has no dedup id to retry it safely): it may be stored.
    #[error("outcome unknown (the message may be stored): {0}")]
    OutcomeUnknown(String),
    /// A request argument the client refuses before sending.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The publisher or consumer was closed.
    #[error("closed")]
    Closed,
}

impl Error {
    pub(crate) fn status(s: &tonic::Status) -> Error {
        let typed = refusal::of_status(s);
        Error::Status {
            code: s.code(),
            message: s.message().to_owned(),
            reason: typed.map(|t| t.0),
            outcome: typed.map(|t| t.1),
        }
    }

    /// Why the server refused, when it said (see [`Reason`]).
    #[must_use]
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Error::Status { reason, .. } => *reason,
            _ => None,
        }
    }

    /// Whether the refused write may have happened: [`Outcome::Unknown`] for
    /// [`Error::OutcomeUnknown`], the server's word for a status, `None` otherwise.
    #[must_use]
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Error::Status { outcome, .. } => *outcome,
            Error::OutcomeUnknown(_) => Some(Outcome::Unknown),
            _ => None,
        }
    }
}
