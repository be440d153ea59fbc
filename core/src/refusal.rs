//! Why a request was refused, typed from where it is decided to the wire.
//!
//! A [`Refusal`] carries a [`Reason`] (what went wrong: the API edge maps each reason to one
//! gRPC status code, in one table) and an [`Outcome`] (whether the refused request's write may
//! have happened: what a client needs to know before sending it again). A client decides on
//! these two, never on the message, which is for people.
//!
//! The write path's own error, [`WriteError`], is typed the same way: whoever fails a write
//! says what became of it, and [`WriteError::refusal`] keeps that to the wire.
//!
//! # Invariants
//! - A refusal whose outcome is [`Outcome::NotStored`] stored nothing: sending the same request
//!   again cannot store it twice. Every place that builds one guarantees it (nothing was handed
//!   to a log, or the state machine refused the whole command on every replica).
//! - A reason's wire name ([`Reason::name`]) never changes meaning; new reasons get new names.

use std::fmt;
use std::time::Duration;

/// What became of a refused request's write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Nothing of it was stored: sending it again is safe.
    NotStored,
    /// It may have been stored (a deadline passed, the write path failed or stopped while it
    /// held the request): sending it again may store it twice, unless it carries a dedup id.
    Unknown,
    /// It was stored; only its answer is missing or partial. Do not send it again.
    Stored,
}

impl Outcome {
    /// The wire name (`NOT_STORED`, `UNKNOWN`, `STORED`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::NotStored => "NOT_STORED",
            Outcome::Unknown => "UNKNOWN",
            Outcome::Stored => "STORED",
        }
    }

    /// The outcome a wire name names.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Outcome> {
        [Outcome::NotStored, Outcome::Unknown, Outcome::Stored]
            .into_iter()
            .find(|o| o.name() == name)
    }

    /// Whether sending the request again cannot store it twice.
    #[must_use]
    pub const fn retry_is_safe(self) -> bool {
        matches!(self, Outcome::NotStored)
    }
}

/// Why a request was refused. The API edge maps each to one gRPC status code; clients match
/// the reason (sent as `google.rpc.ErrorInfo.reason`, and in `PublishBatchAck.error_reason`).
///
/// Not `non_exhaustive`: the table that maps reasons to codes must name each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// This node does not take writes; the leader's address goes with it when known.
    NotLeader,
    /// A deadline passed (the outcome says whether the write may have happened).
    Timeout,
    /// The state machine refused the command on every replica; nothing of it applied.
    NotApplied,
    /// A concurrent change got in the way (a group deleted while subscribing); send it again.
    Conflict,
    /// The write path (the journal standalone, replication in a cluster) failed.
    WriteFailed,
    /// The server is stopping.
    ShuttingDown,
    /// The server is replaying its journal; state read now would be partial.
    Recovering,
    /// The data disk is below `storage.minFreeBytes`.
    DiskLow,
    /// A limit on concurrent work or streams was reached; try again later.
    Overloaded,
    /// A request or message over a size limit.
    TooLarge,
    /// The call needs a cluster and this broker is standalone.
    Standalone,
    /// The request is malformed or out of range.
    InvalidArgument,
    /// The request broke the gRPC framing (a message cut short, compression never
    /// negotiated).
    Malformed,
    /// What the request names does not exist (a deleted group, an unknown service).
    NotFound,
    /// The stream had nothing to do for too long.
    StreamIdle,
    /// The client cancelled or went away.
    Cancelled,
    /// The server has no such method.
    Unimplemented,
    /// A defect on the server (logged there).
    Internal,
    /// No valid credential was presented.
    Unauthenticated,
    /// The credential is valid but does not allow this.
    PermissionDenied,
}

impl Reason {
    /// Every reason, for the wire tables and their tests.
    pub const ALL: [Reason; 20] = [
        Reason::NotLeader,
        Reason::Timeout,
        Reason::NotApplied,
        Reason::Conflict,
        Reason::WriteFailed,
        Reason::ShuttingDown,
        Reason::Recovering,
        Reason::DiskLow,
        Reason::Overloaded,
        Reason::TooLarge,
        Reason::Standalone,
        Reason::InvalidArgument,
        Reason::Malformed,
        Reason::NotFound,
        Reason::StreamIdle,
        Reason::Cancelled,
        Reason::Unimplemented,
        Reason::Internal,
        Reason::Unauthenticated,
        Reason::PermissionDenied,
    ];

    /// The wire name (`google.rpc.ErrorInfo.reason`; `ERROR_REASON_<name>` in the proto enum).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Reason::NotLeader => "NOT_LEADER",
            Reason::Timeout => "TIMEOUT",
            Reason::NotApplied => "NOT_APPLIED",
            Reason::Conflict => "CONFLICT",
            Reason::WriteFailed => "WRITE_FAILED",
            Reason::ShuttingDown => "SHUTTING_DOWN",
            Reason::Recovering => "RECOVERING",
            Reason::DiskLow => "DISK_LOW",
            Reason::Overloaded => "OVERLOADED",
            Reason::TooLarge => "TOO_LARGE",
            Reason::Standalone => "STANDALONE",
            Reason::InvalidArgument => "INVALID_ARGUMENT",
            Reason::Malformed => "MALFORMED",
            Reason::NotFound => "NOT_FOUND",
            Reason::StreamIdle => "STREAM_IDLE",
            Reason::Cancelled => "CANCELLED",
            Reason::Unimplemented => "UNIMPLEMENTED",
            Reason::Internal => "INTERNAL",
            Reason::Unauthenticated => "UNAUTHENTICATED",
            Reason::PermissionDenied => "PERMISSION_DENIED",
        }
    }

    /// The reason a wire name names.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The outcome a refusal for this reason has unless its maker knows better: a request
    /// refused before it reached the write path stored nothing.
    #[must_use]
    pub const fn default_outcome(self) -> Outcome {
        match self {
            Reason::Timeout | Reason::WriteFailed | Reason::Internal => Outcome::Unknown,
            _ => Outcome::NotStored,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A refused request, as the client is told: why, what became of its write, a message for
/// people, and the leader's client address when the reason is [`Reason::NotLeader`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: Reason,
    /// Whether its write may have happened.
    pub outcome: Outcome,
    /// For people; never matched by a client.
    pub message: String,
    /// The leader's client address ("" = unknown or not applicable).
    pub leader: String,
    /// For [`Reason::Overloaded`]: how long the server expects the work ahead to take, so a
    /// client knows when sending again is worth it (`None` = no estimate).
    pub retry_after: Option<Duration>,
}

impl Refusal {
    /// A refusal with the reason's default outcome.
    pub fn new(reason: Reason, message: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            outcome: reason.default_outcome(),
            message: message.into(),
            leader: String::new(),
            retry_after: None,
        }
    }

    /// [`Reason::Overloaded`] with a retry hint: nothing stored.
    pub fn overloaded(message: impl Into<String>, retry_after: Duration) -> Refusal {
        Refusal {
            retry_after: Some(retry_after),
            ..Refusal::new(Reason::Overloaded, message)
        }
    }

    /// The same refusal with another outcome.
    #[must_use]
    pub fn with_outcome(mut self, outcome: Outcome) -> Refusal {
        self.outcome = outcome;
        self
    }

    /// The same refusal naming the leader's client address ("" = unknown).
    #[must_use]
    pub fn with_leader(mut self, addr: &str) -> Refusal {
        addr.clone_into(&mut self.leader);
        self
    }

    /// [`Reason::InvalidArgument`]: nothing stored.
    pub fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(Reason::InvalidArgument, message)
    }

    /// [`Reason::NotLeader`] naming `leader` ("" = unknown): nothing stored.
    #[must_use]
    pub fn not_leader(leader: &str) -> Refusal {
        Refusal::new(Reason::NotLeader, "node is not the cluster leader").with_leader(leader)
    }

    /// [`Reason::ShuttingDown`] before the request reached the write path: nothing stored.
    #[must_use]
    pub fn shutting_down() -> Refusal {
        Refusal::new(Reason::ShuttingDown, "server is shutting down")
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.reason,
            self.outcome.name(),
            self.message
        )
    }
}

impl std::error::Error for Refusal {}

/// The outcome named (`outcome`, a name from [`Outcome::name`]) for a refusal of `reason`: the
/// reason's default when none is named, and [`Outcome::Unknown`] for a name this version does
/// not know (a newer server's outcome is never taken as "not stored": that would resend, and
/// duplicate, what it may have stored).
#[must_use]
pub fn outcome_or(reason: Reason, outcome: Option<&str>) -> Outcome {
    match outcome {
        None | Some("") => reason.default_outcome(),
        Some(name) => Outcome::from_name(name).unwrap_or(Outcome::Unknown),
    }
}

/// `google.rpc.ErrorInfo.domain` of futureq's refusals.
pub const ERROR_DOMAIN: &str = "futureq";

/// The reason and outcome an `ErrorInfo` (its `domain`, `reason` and `metadata.outcome`)
/// names when it is one of futureq's (`None`: another domain); the outcome as [`outcome_or`]
/// reads it. A reason this version does not know (a newer server's) reads as
/// [`Reason::Internal`], nothing a client retries on, and keeps the outcome it names
/// ([`Outcome::Unknown`] when none): falling back to the status code could resend a write
/// whose outcome the server said was unknown.
#[must_use]
pub fn of_error_info(
    domain: &str,
    reason: &str,
    outcome: Option<&str>,
) -> Option<(Reason, Outcome)> {
    if domain != ERROR_DOMAIN {
        return None;
    }
    Some(match Reason::from_name(reason) {
        Some(reason) => (reason, outcome_or(reason, outcome)),
        None => (
            Reason::Internal,
            outcome
                .and_then(Outcome::from_name)
                .unwrap_or(Outcome::Unknown),
        ),
    })
}

/// Why a write (or a membership change) did not succeed, as the write path knows it: each
/// variant says what became of the write ([`WriteError::outcome`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum WriteError {
    /// This node is not the group's leader (nothing was proposed); the leader's node id if
    /// known.
    #[error("node is not the leader ({})", leader.map_or_else(|| "leader unknown".to_owned(), |id| format!("leader: node {id}")))]
    NotLeader {
        /// The leader, if known.
        leader: Option<u64>,
    },
    /// The deadline passed; the outcome is unknown.
    #[error("not committed before the deadline; outcome unknown")]
    Timeout,
    /// The state machine refused the command on every replica, or the write path refused it
    /// before it was proposed: nothing of it applied.
    #[error("refused, nothing applied: {0}")]
    Refused(String),
    /// The write path failed (the journal, Raft, a forwarding link) or stopped.
    #[error("{cause}")]
    Failed {
        /// What became of the write.
        outcome: Outcome,
        /// What failed, for people.
        cause: String,
    },
}

impl WriteError {
    /// A failure of the write path after it took the write: the outcome is unknown.
    pub fn failed(cause: impl Into<String>) -> WriteError {
        WriteError::Failed {
            outcome: Outcome::Unknown,
            cause: cause.into(),
        }
    }

    /// A failure before the write path took the write: nothing was stored.
    pub fn not_taken(cause: impl Into<String>) -> WriteError {
        WriteError::Failed {
            outcome: Outcome::NotStored,
            cause: cause.into(),
        }
    }

    /// A command applied without the answer it must give (a defect): it was stored.
    #[must_use]
    pub fn unanswered(what: &str) -> WriteError {
        WriteError::Failed {
            outcome: Outcome::Stored,
            cause: format!(
                "the {what} was applied but its apply gave no answer (a defect, logged)"
            ),
        }
    }

    /// What became of the write.
    #[must_use]
    pub fn outcome(&self) -> Outcome {
        match self {
            WriteError::NotLeader { .. } | WriteError::Refused(_) => Outcome::NotStored,
            WriteError::Timeout => Outcome::Unknown,
            WriteError::Failed { outcome, .. } => *outcome,
        }
    }

    /// The refusal a client gets: `leader` is the leader's client address ("" = unknown),
    /// `what` names the write for the message ("batch", "cancel", …) and `timeout` the
    /// deadline's setting and length for a [`WriteError::Timeout`].
    #[must_use]
    pub fn refusal(&self, what: &str, leader: &str, timeout: &str) -> Refusal {
        let outcome = self.outcome();
        match self {
            WriteError::NotLeader { .. } => Refusal::not_leader(leader),
            WriteError::Timeout => Refusal::new(
                Reason::Timeout,
                format!("{what} not committed within {timeout}; outcome unknown"),
            ),
            WriteError::Refused(why) => Refusal::new(
                Reason::NotApplied,
                format!("{what} not applied ({why}); nothing stored, safe to send again"),
            ),
            WriteError::Failed { cause, .. } => Refusal::new(
                Reason::WriteFailed,
                match outcome {
                    Outcome::NotStored => format!("{what} not stored: {cause}"),
                    Outcome::Unknown => format!("{what} may have been stored: {cause}"),
                    Outcome::Stored => format!("{what} stored: {cause}"),
                },
            ),
        }
        .with_outcome(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A newer server's outcome is never read as "not stored"; none named is the default.
    #[test]
    fn unknown_outcome_names_are_unknown() {
        assert_eq!(outcome_or(Reason::NotLeader, None), Outcome::NotStored);
        assert_eq!(outcome_or(Reason::Timeout, None), Outcome::Unknown);
        assert_eq!(
            outcome_or(Reason::NotLeader, Some("PARTLY_STORED")),
            Outcome::Unknown
        );
        assert_eq!(
            outcome_or(Reason::Timeout, Some("NOT_STORED")),
            Outcome::NotStored
        );
        assert_eq!(
            of_error_info(ERROR_DOMAIN, "NOT_LEADER", Some("SOMETHING_NEW")),
            Some((Reason::NotLeader, Outcome::Unknown))
        );
        assert_eq!(of_error_info("other", "NOT_LEADER", None), None);
        // A newer server's reason: nothing to retry on, its outcome kept.
        assert_eq!(
            of_error_info(ERROR_DOMAIN, "SOMETHING_NEW", None),
            Some((Reason::Internal, Outcome::Unknown))
        );
        assert_eq!(
            of_error_info(ERROR_DOMAIN, "SOMETHING_NEW", Some("NOT_STORED")),
            Some((Reason::Internal, Outcome::NotStored))
        );
    }

    #[test]
    fn wire_names_are_unique_and_parse_back() {
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
        for r in Reason::ALL {
            assert_eq!(Reason::from_name(r.name()), Some(r));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
        for o in [Outcome::NotStored, Outcome::Unknown, Outcome::Stored] {
            assert_eq!(Outcome::from_name(o.name()), Some(o));
        }
        assert_eq!(Reason::from_name("not_leader"), None);
    }

    #[test]
    fn each_write_error_keeps_its_outcome_to_the_wire() {
        let cases = [
            (
                WriteError::NotLeader { leader: Some(2) },
                Reason::NotLeader,
                Outcome::NotStored,
            ),
            (WriteError::Timeout, Reason::Timeout, Outcome::Unknown),
            (
                WriteError::Refused("ids".into()),
                Reason::NotApplied,
                Outcome::NotStored,
            ),
            (
                WriteError::failed("fsync"),
                Reason::WriteFailed,
                Outcome::Unknown,
            ),
            (
                WriteError::not_taken("stopped"),
                Reason::WriteFailed,
                Outcome::NotStored,
            ),
        ];
        for (e, reason, outcome) in cases {
            let r = e.refusal("batch", "10.0.0.1:9000", "publish.proposalTimeout (5s)");
            assert_eq!((r.reason, r.outcome), (reason, outcome), "{e}");
            assert_eq!(r.outcome.retry_is_safe(), outcome == Outcome::NotStored);
        }
        let r = WriteError::NotLeader { leader: None }.refusal("batch", "h:1", "");
        assert_eq!(r.leader, "h:1");
    }
}
