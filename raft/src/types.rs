//! futureq's openraft type configuration.

use std::fmt;

/// A replicated command: the bytes of a `futureq_core::command` (event shard) or
/// `futureq_core::metadata::MetaCommand` (metadata group) envelope.
/// Shared bytes: a clone (a retried proposal) copies nothing, and an AppendEntries entry
/// decodes as a slice of the received frame. (Entries the leader replicates are read back
/// from its log, which copies them.)
#[derive(Clone, PartialEq, Eq)]
pub struct Command(pub bytes::Bytes);

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Command({} bytes)", self.0.len())
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

openraft::declare_raft_types!(
    /// Node ids are `u64`, nodes carry their Raft address (`BasicNode`), leader ids are
    /// `(term, node id)`, and the runtime is glommio.
    pub TypeConfig:
        D = Command,
        R = Applied,
        AsyncRuntime = crate::rt::GlommioRuntime,
);

/// What applying one client entry did: the response of a client write. Decided from the
/// entry and the applied state only, so every replica decides the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Applied, with what the command answers (most answer nothing).
    Done(futureq_core::command::Answer),
    /// Refused: nothing of the entry changed the state (the reason says why).
    Refused(String),
}

pub use crate::snapshot::SnapshotData;

/// A log entry of [`TypeConfig`].
pub type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
/// A vote of [`TypeConfig`].
pub type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;

/// The leader id of [`TypeConfig`]: `(term, node id)`.
pub type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;
/// Snapshot metadata of [`TypeConfig`].
pub type Meta = openraft::SnapshotMeta<LeaderId, u64, openraft::BasicNode>;
