//! Requests a node sends to a group's leader over the peer link, and serves when it leads:
//! metadata proposals and membership changes (forwarded to the metadata leader), and the
//! deletes of a node that stopped leading the event shard.

use crate::snapshot::Receiving;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futureq_core::command::{encode_delete, DeleteBatch};
use futureq_core::refusal::Outcome;
use futureq_core::KEY_LEN;
use futureq_net::peer::PeerFrame;
use futureq_net::peer_link::PeerHandler;

use super::changes::change;
use super::{Ack, Node, Proposal, WriteError, EVENT_GROUP, KIND_FORWARD, META_GROUP, RPC_TIMEOUT};
use crate::network::raft_handler;
use crate::rpc::KIND_RESPONSE;
use openraft_rt::watch::WatchReceiver as _;

/// Pause between attempts of a metadata request (see [`Node::meta_request`]).
const META_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A request forwarded to a group's leader over the peer link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// `client_write(command)`.
    Write(Vec<u8>),
    /// Add a learner (non-blocking).
    AddLearner(u64, String),
    /// Promote a learner to voter.
    AddVoter(u64),
    /// Remove a node (voter or learner) from the group.
    Remove(u64),
    /// Delete these event keys (ACKs and TTL expiry of a node that stopped leading): the
    /// only request the event shard takes over the peer port. The leader builds the delete
    /// command itself, so a peer frame can never commit bytes of its own choosing.
    Delete(Vec<[u8; KEY_LEN]>),
}

impl Forward {
    /// Encodes the request (op byte, then its fields, little-endian).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Forward::Write(c) => {
                out.push(1);
                out.extend_from_slice(c);
            }
            Forward::AddLearner(id, addr) => {
                out.push(2);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(addr.as_bytes());
            }
            Forward::AddVoter(id) => {
                out.push(3);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Forward::Remove(id) => {
                out.push(4);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Forward::Delete(keys) => {
                out.push(5);
                for k in keys {
                    out.extend_from_slice(k);
                }
            }
        }
        out
    }

    /// Decodes a forwarded request; `None` for anything malformed.
    #[must_use]
    pub fn decode(b: &[u8]) -> Option<Forward> {
        let (&op, rest) = b.split_first()?;
        let id = || {
            rest.get(..8)
                .map(|x| u64::from_le_bytes(x.try_into().unwrap_or([0; 8])))
        };
        match op {
            1 => Some(Forward::Write(rest.to_vec())),
            2 => Some(Forward::AddLearner(
                id()?,
                String::from_utf8(rest.get(8..)?.to_vec()).ok()?,
            )),
            3 if rest.len() == 8 => Some(Forward::AddVoter(id()?)),
            4 if rest.len() == 8 => Some(Forward::Remove(id()?)),
            5 if !rest.is_empty() && rest.len() % KEY_LEN == 0 => Some(Forward::Delete(
                rest.chunks_exact(KEY_LEN)
                    .map(|k| {
                        let mut key = [0u8; KEY_LEN];
                        key.copy_from_slice(k);
                        key
                    })
                    .collect(),
            )),
            _ => None,
        }
    }
}

fn encode_outcome(r: &Result<(), WriteError>) -> Vec<u8> {
    match r {
        Ok(()) => vec![0],
        Err(WriteError::NotLeader { leader }) => {
            let mut v = vec![1];
            v.extend_from_slice(&leader.unwrap_or(0).to_le_bytes());
            v
        }
        Err(WriteError::Timeout) => vec![2],
        Err(WriteError::Failed { outcome, cause }) => {
            // 3: outcome unknown (what every version reads); 5 and 6 name the others.
            let mut v = vec![match outcome {
                Outcome::Unknown => 3,
                Outcome::NotStored => 5,
                Outcome::Stored => 6,
            }];
            v.extend_from_slice(cause.as_bytes());
            v
        }
        Err(WriteError::Refused(m)) => {
            let mut v = vec![4];
            v.extend_from_slice(m.as_bytes());
            v
        }
    }
}

fn decode_outcome(b: &[u8]) -> Result<(), WriteError> {
    match b.split_first() {
        Some((0, _)) => Ok(()),
        Some((1, rest)) if rest.len() == 8 => {
            let id = u64::from_le_bytes(rest.try_into().unwrap_or([0; 8]));
            Err(WriteError::NotLeader {
                leader: (id != 0).then_some(id),
            })
        }
        Some((2, _)) => Err(WriteError::Timeout),
        Some((4, m)) => Err(WriteError::Refused(String::from_utf8_lossy(m).into_owned())),
        Some((code @ (3 | 5 | 6), m)) => Err(WriteError::Failed {
            outcome: match code {
                5 => Outcome::NotStored,
                6 => Outcome::Stored,
                _ => Outcome::Unknown,
            },
            cause: String::from_utf8_lossy(m).into_owned(),
        }),
        _ => Err(WriteError::failed("malformed forwarded reply")),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_round_trips_and_rejects_garbage() {
        for f in [
            Forward::Write(vec![1, 2, 3]),
            Forward::Write(vec![]),
            Forward::AddLearner(7, "127.0.0.1:5000".into()),
            Forward::AddVoter(u64::MAX),
            Forward::Remove(3),
            Forward::Delete(vec![[7; KEY_LEN], [9; KEY_LEN]]),
        ] {
            assert_eq!(Forward::decode(&f.encode()), Some(f));
        }
        for bad in [
            &[][..],
            &[0],
            &[2, 1],
            &[3, 1, 2],
            &[4; 10],
            &[9, 0],
            &[5],
            &[5; 24],
        ] {
            assert_eq!(Forward::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn outcomes_round_trip() {
        for r in [
            Ok(()),
            Err(WriteError::NotLeader { leader: Some(3) }),
            Err(WriteError::NotLeader { leader: None }),
            Err(WriteError::Timeout),
            Err(WriteError::failed("boom")),
            Err(WriteError::not_taken("not taken")),
            Err(WriteError::Failed {
                outcome: Outcome::Stored,
                cause: "stored".into(),
            }),
            Err(WriteError::Refused("stale ids".into())),
        ] {
            assert_eq!(decode_outcome(&encode_outcome(&r)), r);
        }
        assert!(decode_outcome(&[]).is_err());
        assert!(decode_outcome(&[1, 0]).is_err());
    }
}
