//! What the client does with a refusal, decided on its type: the [`Reason`] and [`Outcome`]
//! the server sends (`google.rpc.ErrorInfo` in a status's details, the typed fields of a
//! `PublishBatchAck`), never on the message text.

use futureq_core::refusal::{Outcome, Reason};
use tonic_types::StatusExt as _;

use crate::pb;

/// The reason and outcome a status carries in its details (`None`: a transport failure, or a
/// server older than typed refusals). For callers of the generated stubs ([`crate::pb`]).
pub fn of_status(s: &tonic::Status) -> Option<(Reason, Outcome)> {
    let info = s.get_details_error_info()?;
    futureq_core::refusal::of_error_info(
        &info.domain,
        &info.reason,
        info.metadata.get("outcome").map(String::as_str),
    )
}

/// The reason and outcome of a refused batch's ack (`None` from a server older than them).
pub fn of_ack(ack: &pb::PublishBatchAck) -> Option<(Reason, Outcome)> {
    let reason = pb::ErrorReason::try_from(ack.error_reason).ok()?;
    let reason = Reason::from_name(reason.as_str_name().strip_prefix("ERROR_REASON_")?)?;
    // UNSPECIFIED (0): an older server, which sent no outcome; a number this version does not
    // know: a newer server's outcome, taken as unknown.
    let outcome = match pb::WriteOutcome::try_from(ack.write_outcome) {
        Ok(pb::WriteOutcome::Unspecified) => None,
        Ok(o) => Some(o.as_str_name().strip_prefix("WRITE_OUTCOME_").unwrap_or("")),
        Err(_) => Some("?"),
    };
    Some((reason, futureq_core::refusal::outcome_or(reason, outcome)))
}

/// What to do after a refused call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send it to the leader named (`None`: not known yet; ask again shortly).
    Leader(Option<String>),
    /// Send it again after a pause; `elsewhere`: the node may be going away, look for the
    /// leader again first.
    Again {
        /// Look for the leader again.
        elsewhere: bool,
    },
    /// Report it.
    Fail,
}

/// What to do after `s`; `safe`: the call changes nothing when sent twice (a read, or a write
/// the server made idempotent), so an unknown outcome may be retried too.
pub(crate) fn next_step(s: &tonic::Status, safe: bool) -> Next {
    let resend = |outcome: Outcome| safe || outcome.retry_is_safe();
    match of_status(s) {
        Some((Reason::NotLeader, _)) => Next::Leader(leader_named(s)),
        Some((
            Reason::ShuttingDown | Reason::Recovering | Reason::WriteFailed | Reason::Timeout,
            o,
        )) if resend(o) => Next::Again { elsewhere: true },
        Some((Reason::Overloaded | Reason::Conflict | Reason::NotApplied, o)) if resend(o) => {
            Next::Again { elsewhere: false }
        }
        Some(_) => Next::Fail,
        // No typed refusal: a transport failure (the node went away, an h2 reset), or a
        // server from before typed refusals, whose follower still names the leader.
        None => match s.code() {
            tonic::Code::FailedPrecondition if leader_named(s).is_some() => {
                Next::Leader(leader_named(s))
            }
            tonic::Code::Unavailable | tonic::Code::Unknown if safe => {
                Next::Again { elsewhere: true }
            }
            _ => Next::Fail,
        },
    }
}

/// The response header naming the leader on a follower's FAILED_PRECONDITION.
pub const LEADER_HEADER: &str = "futureq-leader-address";

/// The leader a follower's refusal names (the `futureq-leader-address` header), if any.
pub(crate) fn leader_named(s: &tonic::Status) -> Option<String> {
    s.metadata()
        .get(LEADER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, reason: Reason, outcome: Outcome) -> tonic::Status {
        tonic::Status::with_error_details(
            code,
            "for people",
            tonic_types::ErrorDetails::with_error_info(
                reason.name(),
                futureq_core::refusal::ERROR_DOMAIN,
                [("outcome".to_owned(), outcome.name().to_owned())],
            ),
        )
    }

    #[test]
    fn decisions_follow_the_type_not_the_text() {
        use tonic::Code;
        let s = status(
            Code::FailedPrecondition,
            Reason::NotLeader,
            Outcome::NotStored,
        );
        assert_eq!(of_status(&s), Some((Reason::NotLeader, Outcome::NotStored)));
        assert_eq!(next_step(&s, false), Next::Leader(None));
        // A timeout whose write may have happened is not sent again unless it is safe.
        let s = status(Code::DeadlineExceeded, Reason::Timeout, Outcome::Unknown);
        assert_eq!(next_step(&s, false), Next::Fail);
        assert_eq!(next_step(&s, true), Next::Again { elsewhere: true });
        let s = status(Code::Unavailable, Reason::WriteFailed, Outcome::NotStored);
        assert_eq!(next_step(&s, false), Next::Again { elsewhere: true });
        let s = status(Code::Aborted, Reason::Conflict, Outcome::NotStored);
        assert_eq!(next_step(&s, false), Next::Again { elsewhere: false });
        let s = status(
            Code::InvalidArgument,
            Reason::InvalidArgument,
            Outcome::NotStored,
        );
        assert_eq!(next_step(&s, true), Next::Fail);
        // Text saying "not the cluster leader" with no type is not followed.
        let s = tonic::Status::failed_precondition("node is not the cluster leader");
        assert_eq!(next_step(&s, true), Next::Fail);
        // A transport failure of a safe call is retried elsewhere.
        assert_eq!(
            next_step(&tonic::Status::unavailable("connection reset"), true),
            Next::Again { elsewhere: true }
        );
        // Another domain's ErrorInfo is not ours.
        let s = tonic::Status::with_error_details(
            Code::Unavailable,
            "",
            tonic_types::ErrorDetails::with_error_info("NOT_LEADER", "example.com", []),
        );
        assert_eq!(of_status(&s), None);
    }

    #[test]
    fn ack_fields_read_back() {
        let ack = pb::PublishBatchAck {
            error_reason: pb::ErrorReason::DiskLow as i32,
            write_outcome: pb::WriteOutcome::NotStored as i32,
            ..Default::default()
        };
        assert_eq!(of_ack(&ack), Some((Reason::DiskLow, Outcome::NotStored)));
        assert_eq!(of_ack(&pb::PublishBatchAck::default()), None);
    }
}
