//! Requests on a group this node leads (writes, learners, voters, removals), retried while
//! its leadership settles.

use std::collections::BTreeSet;
use std::time::Instant;

use futures_lite::future;
use openraft::error::{ClientWriteError, ForwardReason, ForwardToLeader, RaftError};
use openraft::{BasicNode, ChangeMembers};

use super::config::RETRY_PAUSE;
use super::request::Forward;
use crate::types::{Command, TypeConfig};
use futureq_core::refusal::WriteError;
use openraft_rt::watch::WatchReceiver as _;

/// Whether a ForwardToLeader refusal is transient on a node that leads (or may lead soon).
pub(super) fn settling(f: &ForwardToLeader<TypeConfig>, me: u64) -> bool {
    f.reason == ForwardReason::LeaseExpired || f.leader_id.is_none() || f.leader_id == Some(me)
}

pub(super) fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> WriteError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => WriteError::NotLeader {
            leader: f.leader_id,
        },
        // A membership change Raft refused was not proposed.
        RaftError::APIError(e @ ClientWriteError::ChangeMembershipError(_)) => {
            WriteError::not_taken(e.to_string())
        }
        // Raft stopped (fatal) while it may have held the write.
        other => WriteError::failed(other.to_string()),
    }
}

/// Runs `op` until it succeeds, fails for good, or `deadline` passes; transient leadership
/// refusals are retried.
pub(super) async fn with_retry<F, Fut, T>(
    me: u64,
    deadline: Instant,
    mut op: F,
) -> Result<T, WriteError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<
        Output = Result<T, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>,
    >,
{
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WriteError::Timeout);
        }
        let attempt = async { Some(op().await) };
        let timer = async {
            glommio::timer::sleep(left).await;
            None
        };
        match future::or(attempt, timer).await {
            None => return Err(WriteError::Timeout),
            Some(Ok(v)) => return Ok(v),
            Some(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))))
                if settling(&f, me) =>
            {
                tracing::debug!(target: "raft", reason = ?f.reason, leader = ?f.leader_id, "write refused while leadership settles; retrying");
                glommio::timer::sleep(RETRY_PAUSE).await;
            }
            Some(Err(e)) => return Err(write_error(e)),
        }
    }
}

/// Applies a membership request on `raft`, which must lead its group.
pub(super) async fn change<SM>(
    raft: &openraft::Raft<TypeConfig, SM>,
    me: u64,
    req: &Forward,
    deadline: Instant,
) -> Result<(), WriteError>
where
    SM: openraft::storage::RaftStateMachine<TypeConfig>,
{
    match req {
        Forward::Write(c) => {
            let c = bytes::Bytes::copy_from_slice(c);
            with_retry(me, deadline, || raft.client_write(Command(c.clone())))
                .await
                .map(drop)
        }
        Forward::Delete(_) => Err(WriteError::not_taken(
            "event deletes go through Node::write_event",
        )),
        Forward::AddLearner(id, addr) => {
            let node = BasicNode { addr: addr.clone() };
            with_retry(me, deadline, || raft.add_learner(*id, node.clone(), false))
                .await
                .map(drop)
        }
        Forward::AddVoter(id) => with_retry(me, deadline, || {
            raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([*id])), true)
        })
        .await
        .map(drop),
        Forward::Remove(id) => {
            let voter = raft
                .metrics()
                .borrow_watched()
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == *id);
            if voter {
                with_retry(me, deadline, || {
                    raft.change_membership(
                        ChangeMembers::RemoveVoters(BTreeSet::from([*id])),
                        false,
                    )
                })
                .await
                .map(drop)
            } else {
                with_retry(me, deadline, || {
                    raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([*id])), false)
                })
                .await
                .map(drop)
            }
        }
    }
}
