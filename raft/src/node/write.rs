//! The vocabulary of an event-shard write: how long it waits ([`Ack`]), one attempt
//! ([`Proposal`]) and its stages ([`EventWrite`]).

use futureq_core::command::Answer;
use futureq_core::refusal::WriteError;

use crate::persisted::PersistKey;

/// How long a write waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// Committed by a majority and applied here.
    Quorum,
    /// Fsynced in the leader's own log (the leader-persist tracker fired).
    Leader,
    /// Handed to Raft.
    Submitted,
}

/// The stages of one event-shard write ([`super::Node::propose_event`]), each reported at most
/// once, in this order; a stage the write ended before is never reported (its sender is
/// dropped).
pub struct EventWrite {
    /// The command was handed to Raft (its first attempt).
    pub submitted: futures::channel::oneshot::Receiver<()>,
    /// The entry is fsynced in this leader's log (asked for, and the proposal had a key).
    pub persisted: Option<futures::channel::oneshot::Receiver<()>>,
    /// The outcome: applied (or refused by the state machine) after its commit, or why not.
    pub done: futures::channel::oneshot::Receiver<Result<Answer, WriteError>>,
}

impl EventWrite {
    /// Waits until the write reached `ack` (a LEADER ack without a persisted stage waits for
    /// the outcome), or ended before.
    ///
    /// # Errors
    /// How the write ended, when it ended before reaching `ack`.
    pub async fn until(self, ack: Ack) -> Result<Answer, WriteError> {
        let stage = match ack {
            Ack::Quorum => None,
            Ack::Leader => self.persisted,
            Ack::Submitted => Some(self.submitted),
        };
        outcome_after(stage, self.done).await
    }
}

/// Ok when `stage` fires; else (no stage, or its sender dropped) the write's outcome.
pub async fn outcome_after(
    stage: Option<futures::channel::oneshot::Receiver<()>>,
    done: futures::channel::oneshot::Receiver<Result<Answer, WriteError>>,
) -> Result<Answer, WriteError> {
    if let Some(stage) = stage {
        if stage.await.is_ok() {
            return Ok(Answer::None);
        }
    }
    done.await
        .unwrap_or_else(|_| Err(WriteError::failed("raft stopped")))
}

/// One attempt of an event-shard write, built by [`super::Node::write_event`]'s `make`.
#[derive(Debug, Clone)]
pub struct Proposal {
    pub(super) command: bytes::Bytes,
    pub(super) persist: Option<PersistKey>,
}

impl Proposal {
    /// A command no LEADER ack waits for by key (it answers at commit).
    #[must_use]
    pub fn command(command: bytes::Bytes) -> Self {
        Proposal {
            command,
            persist: None,
        }
    }

    /// A store command proposed by this node as the leader of `term` (the caller checked
    /// that it leads `term`, in the same read of the leadership it assigned the ids in): its
    /// LEADER ack waits for the entry of `term` whose first event id the command carries,
    /// read from the bytes themselves. A batch without items has no key.
    #[must_use]
    pub fn store(command: bytes::Bytes, term: u64) -> Self {
        let persist = futureq_core::command::first_event_id(&command)
            .map(|first_id| PersistKey { term, first_id });
        Proposal { command, persist }
    }
}
