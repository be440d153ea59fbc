//! The Raft core's state besides the node, and how it tracks leadership: it confirms a new
//! term (then ids may be assigned), publishes the view the other cores read, ends a lost
//! leadership, and keeps the shard's topology in the metadata group current.
//!
//! # Invariants
//! - Ids are assigned only while this node leads a confirmed term (see `ids`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futureq_core::command::{Answer, StoreItem};
use futureq_core::metadata::{MetaCommand, MetaState, ShardTopology};
use futureq_core::AckLevel;
use futureq_net::Shutdown;
use futureq_raft::node::{Ack, Forward, Leadership, Node, Proposal, WriteError};
use futureq_storage::Store;
use futures::channel::oneshot;

use super::ids::{self, Ids};
use crate::budget::Admitted;
use crate::config::ClusterSettings;
use crate::fatal::FatalReporter;
use crate::metrics::Metrics;
use crate::replication::{Replication, Stored};

/// Deadline of one metadata proposal.
pub(super) const META_DEADLINE: Duration = Duration::from_secs(5);

/// A publish batch waiting for its group.
pub(crate) struct Pending {
    pub(crate) items: Vec<StoreItem>,
    /// The batch's bytes in the node's publish budget, held while the coalescer holds the
    /// items: in the queue (also past the deadline, until the coalescer reaches and drops
    /// it), then in its group until the group's entry is done, even when the batch was
    /// answered earlier (NO_ACK, LEADER) or left out of a retry.
    pub(crate) admitted: Admitted,
    pub(crate) level: AckLevel,
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<Result<Stored, WriteError>>,
}

/// The Raft core's state besides the node.
pub(super) struct Core {
    pub(super) node: Node,
    pub(super) cfg: ClusterSettings,
    pub(super) grpc_advertise: String,
    pub(super) cluster: Arc<Replication>,
    pub(super) store: Store,
    /// Who may assign event ids, and the next one.
    pub(super) ids: RefCell<Ids>,
    /// Publishes waiting to be proposed in a group (`coalesce`).
    pub(super) publishes: flume::Sender<Pending>,
    pub(super) publishing_topology: Cell<bool>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) fatal: FatalReporter,
}

pub(super) fn unanswered(what: &str) -> WriteError {
    tracing::error!(target: "raft", command = what, "a command was applied without its answer (a defect)");
    WriteError::unanswered(what)
}

impl Core {
    /// Proposes a command built once (a delete, a group registration, a cancel) at QUORUM,
    /// each attempt only while this node takes writes; what its apply answers.
    pub(super) async fn propose_while_leading(
        self: &Rc<Self>,
        cmd: Vec<u8>,
        deadline: Instant,
    ) -> Result<Answer, WriteError> {
        let cmd = Bytes::from(cmd);
        let core = Rc::clone(self);
        let make = move || {
            core.leading_now()?;
            Ok(Proposal::command(cmd.clone()))
        };
        self.node.write_event(make, Ack::Quorum, deadline).await
    }

    /// Assigns `n` ids for a proposal made now (see `ids`); the first.
    ///
    /// # Errors
    /// [`WriteError::NotLeader`] when this node does not take writes; [`WriteError::Refused`]
    /// (nothing proposed, safe to send again) while the ids in flight are a full window ahead
    /// of the apply.
    pub(super) fn assign(&self, n: u64) -> Result<u64, WriteError> {
        let l = self.node.leadership();
        self.ids
            .borrow_mut()
            .assign(l.leading, l.term, n, self.store.applied_last_id())
            .map_err(|r| match r {
                ids::Refused::NotReady => WriteError::NotLeader { leader: l.leader },
                ids::Refused::TooFarAhead => WriteError::Refused(format!(
                    "more than {} event ids are in entries not yet applied; the leader takes more once they are",
                    futureq_core::command::IDS_UNAPPLIED_MAX
                )),
            })
    }

    pub(super) fn leading_now(&self) -> Result<Leadership, WriteError> {
        let l = self.node.leadership();
        if self.ids.borrow().ready(l.leading, l.term) {
            Ok(l)
        } else {
            Err(WriteError::NotLeader { leader: l.leader })
        }
    }

    /// Brings this node's leadership in line with Raft: confirms a new term (then ids may be
    /// assigned), publishes the view, ends a lost leadership, and keeps the topology in the
    /// metadata group current.
    pub(super) async fn tick(self: &Rc<Self>) {
        if let Some(e) = self.node.fatal() {
            // A failed fsync leaves the page cache's state unknown (nothing may be assumed
            // durable); serving on with a stopped Raft core would answer nothing. The broker
            // stops: a restart recovers from what is durable.
            self.fatal.fail("a Raft group", &e);
            return;
        }
        let l = self.node.leadership();
        if self.ids.borrow_mut().start_confirming(l.leading, l.term) {
            let core = Rc::clone(self);
            glommio::spawn_local(async move { core.confirm().await }).detach();
        }
        let leading = self.ids.borrow().ready(l.leading, l.term);
        let lease = leading && l.lease;
        // Raft still names this node while its leadership ran out (no quorum heard within
        // the bound; after a pause, until it hears the new term): no leader is known then.
        // Naming itself would send clients back to a node that refuses them.
        let leader = l.leader.filter(|id| *id != self.node.id || l.leading);
        let meta = self.node.meta_sm.state();
        // Unknown ("") until the leader's client address is registered: clients and
        // followers then look again, rather than dial its Raft address, which takes none.
        let leader_addr = leader
            .and_then(|id| meta.client_addr(id))
            .unwrap_or_default()
            .to_owned();
        let info = meta.cluster_view(self.cfg.shard_id);
        let m = &self.metrics;
        m.raft.term.store(l.term, Ordering::Relaxed);
        m.raft
            .is_leader
            .store(u64::from(leading), Ordering::Relaxed);
        m.raft.applied_index.store(l.applied, Ordering::Relaxed);
        m.raft.last_log_index.store(l.last_log, Ordering::Relaxed);
        m.raft.purged_index.store(l.purged, Ordering::Relaxed);
        m.raft
            .refused_entries
            .store(self.node.refused_entries(), Ordering::Relaxed);
        self.cluster.update(|v| {
            if v.leading != leading {
                m.raft.leader_changes.fetch_add(1, Ordering::Relaxed);
            }
            if !leading && v.leader_id != leader {
                match leader {
                    Some(id) => tracing::info!(target: "raft", term = l.term, leader = id, address = %leader_addr, "event-shard leader changed"),
                    None => tracing::info!(target: "raft", term = l.term, "event-shard leader unknown (an election is on, or this node's leadership ran out)"),
                }
            }
            if v.leading && !leading {
                tracing::warn!(target: "raft", term = l.term, "no longer the event-shard leader: consumers disconnected");
                v.lost.trigger();
                v.lost = Shutdown::new();
            } else if !v.leading && leading {
                tracing::info!(target: "raft", term = l.term, "leading the event shard");
            }
            if v.lease && !lease && leading {
                m.raft.lease_lapses.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(target: "raft", term = l.term, "no quorum heard for an election timeout: deliveries held, clients kept (the followers answer late, or this node is cut off)");
            } else if !v.lease && lease && v.leading {
                tracing::info!(target: "raft", term = l.term, "a quorum is heard again: deliveries go on");
            }
            v.set_lease(lease);
            v.lease_until = l.lease_until;
            v.leading = leading;
            v.leading_until = l.leading_until;
            v.leader_id = leader;
            v.leader_addr = leader_addr;
            v.term = l.term;
            v.info = info;
            v.alive = if leading { l.alive.clone() } else { None };
        });
        if leading && !self.publishing_topology.get() {
            self.publish_topology(&l, &meta);
        }
    }

    /// Commits this node's leadership of the shard (term, members) to the metadata group
    /// when the stored topology says otherwise; one update at a time.
    fn publish_topology(self: &Rc<Self>, l: &Leadership, meta: &MetaState) {
        let members = l.members.clone();
        let stored = meta.shards.get(&self.cfg.shard_id);
        if stored.is_some_and(|t| t.term > l.term) {
            // A later term's leader published it: this node's leadership is over (it has not
            // heard yet). The apply refuses an earlier term's topology; none is proposed.
            return;
        }
        let current = stored.is_some_and(|t| {
            t.leader_id == self.node.id && t.term == l.term && t.members == members
        });
        if current {
            return;
        }
        let epoch = stored.map_or(0, |t| t.epoch + 1).max(l.term << 32);
        let topo = ShardTopology {
            shard_id: self.cfg.shard_id,
            leader_id: self.node.id,
            term: l.term,
            epoch,
            members,
        };
        self.publishing_topology.set(true);
        let core = Rc::clone(self);
        glommio::spawn_local(async move {
            let cmd = MetaCommand::UpdateTopology(topo).encode();
            if let Err(e) = core
                .node
                .meta_request(Forward::Write(cmd), Instant::now() + META_DEADLINE)
                .await
            {
                tracing::debug!(target: "raft", error = %e, "topology update not committed; will retry");
                glommio::timer::sleep(Duration::from_millis(200)).await;
            }
            core.publishing_topology.set(false);
        })
        .detach();
    }

    /// Confirms a fresh leadership: waits until everything up to this term's first entry is
    /// applied, then raises the id counter above the store's high-water mark.
    pub(super) async fn confirm(self: Rc<Self>) {
        let outcome = match self.node.confirm_leadership().await {
            Ok(term) => {
                let store = self.store.clone();
                match glommio::executor()
                    .spawn_blocking(move || store.last_id())
                    .await
                {
                    Ok(last) => self
                        .reserve_ids(term, last)
                        .await
                        .map(|floor| (term, floor)),
                    Err(e) => {
                        tracing::error!(target: "raft", error = %e, "cannot read the id high-water mark; not taking writes");
                        None
                    }
                }
            }
            Err(e) => {
                tracing::debug!(target: "raft", error = %e, "leadership not confirmed");
                None
            }
        };
        let mut ids = self.ids.borrow_mut();
        ids.confirmed(outcome);
        if let Some((term, _)) = outcome {
            tracing::info!(target: "raft", term, next_id = ids.next(), "leadership confirmed; taking writes");
        }
    }
}

impl Core {
    /// Commits a reservation of the ids up to `last + IDS_UNAPPLIED_MAX` in `term` (see
    /// `ids`): the floor, once applied here, or `None` (logged) when it did not commit.
    pub(super) async fn reserve_ids(&self, term: u64, last: u64) -> Option<u64> {
        use futureq_core::command::{ReserveIds, IDS_UNAPPLIED_MAX};
        let floor = last.saturating_add(IDS_UNAPPLIED_MAX);
        let cmd = Bytes::from(ReserveIds { floor }.encode());
        let node = self.node.clone();
        let make = move || {
            let l = node.leadership();
            if l.leading && l.term == term {
                Ok(Proposal::command(cmd.clone()))
            } else {
                Err(WriteError::NotLeader { leader: l.leader })
            }
        };
        let deadline =
            Instant::now() + self.cfg.rtt.saturating_mul(100).max(Duration::from_secs(5));
        match self.node.write_event(make, Ack::Quorum, deadline).await {
            Ok(_) if self.store.applied_last_id() >= floor => Some(floor),
            Ok(_) => {
                tracing::error!(target: "raft", floor, "an id reservation was committed but not applied (a defect); not taking writes");
                None
            }
            Err(e) => {
                tracing::debug!(target: "raft", error = %e, "id reservation not committed; leadership not confirmed");
                None
            }
        }
    }
}
