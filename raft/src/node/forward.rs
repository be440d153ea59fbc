//! Requests a node sends to a group's leader over the peer link, and serves when it leads:
//! metadata proposals and membership changes (forwarded to the metadata leader), and the
//! deletes of a node that stopped leading the event shard.

use crate::snapshot::Receiving;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futureq_core::command::{encode_delete, DeleteBatch};
use futureq_core::KEY_LEN;
use futureq_net::peer::PeerFrame;
use futureq_net::peer_link::PeerHandler;

use super::changes::change;
use super::config::RPC_TIMEOUT;
use super::request::{
    decode_outcome, encode_outcome, Forward, EVENT_GROUP, KIND_FORWARD, META_GROUP,
};
use super::write::{Ack, Proposal};
use super::Node;
use crate::network::raft_handler;
use crate::rpc::KIND_RESPONSE;
use futureq_core::refusal::WriteError;
use openraft_rt::watch::WatchReceiver as _;

/// Pause between attempts of a metadata request (see [`Node::meta_request`]).
const META_RETRY_PAUSE: Duration = Duration::from_millis(100);

impl Node {
    /// Routes peer frames: Raft RPCs to their group, forwarded requests to [`Node::forwarded`].
    pub(super) fn peer_handler(&self, event: Receiving, meta: Receiving) -> PeerHandler {
        let event = raft_handler(EVENT_GROUP, self.event.clone(), event);
        let meta = raft_handler(META_GROUP, self.meta.clone(), meta);
        let node = self.clone();
        Rc::new(move |f: PeerFrame| {
            if f.kind == KIND_FORWARD {
                let node = node.clone();
                return Box::pin(async move {
                    let req = Forward::decode(&f.payload)?;
                    let out = node.forwarded(f.group, &req).await;
                    Some((KIND_RESPONSE, Bytes::from(encode_outcome(&out))))
                });
            }
            match f.group {
                EVENT_GROUP => event(f),
                META_GROUP => meta(f),
                _ => Box::pin(async { None }),
            }
        })
    }

    /// Serves a request another node forwarded here (this node must lead the group). The
    /// event shard takes only [`Forward::Delete`]: its commands are built by its leader.
    async fn forwarded(&self, group: u8, req: &Forward) -> Result<(), WriteError> {
        let deadline = Instant::now() + RPC_TIMEOUT;
        match (group, req) {
            (META_GROUP, Forward::Delete(_)) => Err(WriteError::not_taken(
                "the metadata group has no event keys to delete",
            )),
            (META_GROUP, _) => change(&self.meta, self.id, req, deadline).await,
            (EVENT_GROUP, Forward::Delete(keys)) => {
                let cmd = Bytes::from(encode_delete(&DeleteBatch { keys: keys.clone() }));
                self.write_event(
                    move || Ok(Proposal::command(cmd.clone())),
                    Ack::Quorum,
                    deadline,
                )
                .await
                .map(drop)
            }
            (EVENT_GROUP, _) => Err(WriteError::not_taken(
                "the event shard takes no forwarded writes or membership changes",
            )),
            _ => Err(WriteError::not_taken(format!("unknown group {group}"))),
        }
    }

    /// Deletes event keys through the event shard's leader when this node does not lead
    /// (an ACK taken while it led must not be lost when leadership moves).
    ///
    /// # Errors
    /// [`WriteError`]; `NotLeader { leader: None }` while no leader is known.
    pub async fn forward_delete(
        &self,
        keys: Vec<[u8; KEY_LEN]>,
        deadline: Instant,
    ) -> Result<(), WriteError> {
        let leader = self.event.metrics().borrow_watched().current_leader;
        match leader {
            Some(l) if l != self.id => {
                self.forward(EVENT_GROUP, l, &Forward::Delete(keys), deadline)
                    .await
            }
            _ => Err(WriteError::NotLeader { leader }),
        }
    }

    /// Applies a metadata request on the metadata leader, forwarding it there when this node
    /// does not lead. Its requests are idempotent (membership changes; registry writes rewrite
    /// the same value or carry an epoch the state machine refuses when stale), so while no
    /// leader is known or the leader fails or cannot be reached (it may be the very node a
    /// `LeaveCluster` removes, down until the others elect another) the request is tried
    /// again, until `deadline`.
    ///
    /// # Errors
    /// [`WriteError`]: the last attempt's error once `deadline` is near.
    pub async fn meta_request(&self, req: Forward, deadline: Instant) -> Result<(), WriteError> {
        loop {
            let r = match change(&self.meta, self.id, &req, deadline).await {
                Err(WriteError::NotLeader {
                    leader: Some(leader),
                }) if leader != self.id => self.forward(META_GROUP, leader, &req, deadline).await,
                r => r,
            };
            let again = matches!(
                r,
                Err(WriteError::NotLeader { .. } | WriteError::Failed { .. })
            );
            if !again || Instant::now() + META_RETRY_PAUSE >= deadline {
                return r;
            }
            tracing::debug!(target: "raft", error = ?r, "metadata request not done; trying again");
            glommio::timer::sleep(META_RETRY_PAUSE).await;
        }
    }

    /// Applies a membership request on the event shard (this node must lead it).
    ///
    /// # Errors
    /// [`WriteError`].
    pub async fn event_request(&self, req: Forward, deadline: Instant) -> Result<(), WriteError> {
        change(&self.event, self.id, &req, deadline).await
    }

    async fn forward(
        &self,
        group: u8,
        leader: u64,
        req: &Forward,
        deadline: Instant,
    ) -> Result<(), WriteError> {
        let addr = {
            let m = if group == EVENT_GROUP {
                self.event.metrics()
            } else {
                self.meta.metrics()
            };
            let m = m.borrow_watched();
            m.membership_config
                .membership()
                .get_node(&leader)
                .map(|n| n.addr.clone())
        };
        let Some(addr) = addr.and_then(|a| a.parse::<SocketAddr>().ok()) else {
            return Err(WriteError::NotLeader {
                leader: Some(leader),
            });
        };
        let timeout = deadline.saturating_duration_since(Instant::now());
        let reply = self
            .network
            .client(addr)
            .call(group, KIND_FORWARD, Bytes::from(req.encode()), timeout)
            .await
            .map_err(|e| WriteError::failed(format!("forwarding to node {leader}: {e}")))?;
        decode_outcome(&reply.payload)
    }
}
