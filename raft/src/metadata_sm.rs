//! The metadata group's openraft state machine: the in-memory [`MetaState`] (topology and
//! address registry), rebuilt from the log or a snapshot at start. Its state is tiny, so
//! snapshots are taken often and are a plain copy.
//!
//! An undecodable command is logged and skipped (the group must not stop on one bad
//! proposal); every replica skips it alike.

use std::cell::RefCell;
use std::io::{self, Cursor};
use std::rc::Rc;

use futureq_core::metadata::{MetaCommand, MetaState};
use futures::StreamExt;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, StoredMembership};

use crate::codec::{RaftLogId, RaftMembership};
use crate::state_machine::{CurrentSnapshot, EventSnapshot, Meta};
use crate::types::TypeConfig;

#[derive(Default)]
struct Inner {
    state: MetaState,
    applied: Option<RaftLogId>,
    membership: RaftMembership,
}

/// The metadata state machine (cheap to clone; clones share the state).
#[derive(Clone, Default)]
pub struct MetaStateMachine(Rc<RefCell<Inner>>, CurrentSnapshot);

impl MetaStateMachine {
    /// A copy of the current metadata (what `GetClusterInfo` answers from).
    #[must_use]
    pub fn state(&self) -> MetaState {
        self.0.borrow().state.clone()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for MetaStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> Result<EventSnapshot, io::Error> {
        let inner = self.0.borrow();
        let meta = Meta {
            last_log_id: inner.applied,
            last_membership: inner.membership.clone(),
        };
        let data = inner.state.snapshot();
        Ok(self.1.set(meta, data))
    }
}

impl RaftStateMachine<TypeConfig> for MetaStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<RaftLogId>, RaftMembership), io::Error> {
        let inner = self.0.borrow();
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            {
                let mut inner = self.0.borrow_mut();
                inner.applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Normal(c) => match MetaCommand::decode(&c.0) {
                        Ok(cmd) => {
                            inner.state.apply(cmd);
                        }
                        Err(e) => {
                            tracing::warn!(target: "raft.metadata", index = entry.log_id.index, error = %e, "skipping undecodable metadata command");
                        }
                    },
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m)
                    }
                    EntryPayload::Blank => {}
                }
            }
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Self::SnapshotData,
    ) -> Result<(), io::Error> {
        let data = snapshot.into_inner();
        let state = MetaState::restore(&data).map_err(|e| io::Error::other(e.to_string()))?;
        let mut inner = self.0.borrow_mut();
        inner.state = state;
        inner.applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        self.1.set(meta.clone(), data);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<EventSnapshot>, io::Error> {
        Ok(self.1.get())
    }
}
