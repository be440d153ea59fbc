//! The metadata group's state machine: per-shard topology (leader, members, addresses) and
//! the node → client (gRPC) address registry. Every node holds a replica and answers
//! `GetClusterInfo` from it; clients dial the leader address it gives.
//!
//! Commands and snapshots are rkyv archives (same pinned format as [`crate::command`]) behind
//! a tag and a length:
//!
//! | tag | content |
//! |---|---|
//! | 1 | [`ShardTopology`] (UpdateTopology) |
//! | 2 | [`NodeAddr`] (RegisterNodeAddr) |
//! | 3 | [`MetaState`] (snapshot) |
//!
//! # Invariants
//! - A shard's topology only moves forward: an update whose epoch is not above the stored one
//!   is ignored (a delayed or duplicated proposal never rolls the view back).
//! - Applying the same commands in the same order gives the same state on every replica.

use std::collections::BTreeMap;

use rkyv::rancor::Error as RkyvError;
use rkyv::{Archive, Deserialize, Serialize};

use crate::envelope::frame;

/// Tag of an UpdateTopology command.
pub const TAG_UPDATE_TOPOLOGY: u8 = 1;
/// Tag of a RegisterNodeAddr command.
pub const TAG_REGISTER_NODE_ADDR: u8 = 2;
/// Tag of a metadata snapshot.
pub const TAG_SNAPSHOT: u8 = 3;

/// One member of a shard.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct Member {
    /// Node id.
    pub node_id: u64,
    /// Raft (peer) address.
    pub raft_addr: String,
    /// Voter, or a learner / observer.
    pub voter: bool,
}

/// A shard's topology as its leader last published it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct ShardTopology {
    /// Shard (Raft group) id.
    pub shard_id: u64,
    /// Current leader's node id (0 = unknown).
    pub leader_id: u64,
    /// The leader's term.
    pub term: u64,
    /// Ever-increasing version of this shard's topology.
    pub epoch: u64,
    /// Members, sorted by node id.
    pub members: Vec<Member>,
}

/// A node's client-facing address.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct NodeAddr {
    /// Node id.
    pub node_id: u64,
    /// `api.grpc.advertise` of that node.
    pub grpc_addr: String,
}

/// The replicated metadata.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaState {
    /// Topology per shard.
    pub shards: BTreeMap<u64, ShardTopology>,
    /// Client address per node.
    pub grpc_addrs: BTreeMap<u64, String>,
}

/// A metadata command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaCommand {
    /// Publish a shard's topology.
    UpdateTopology(ShardTopology),
    /// Register a node's client address.
    RegisterNodeAddr(NodeAddr),
}

/// Bytes that are not a metadata command or snapshot.
#[derive(Debug, thiserror::Error)]
#[error("invalid metadata {what}: {reason}")]
pub struct MetaDecodeError {
    what: &'static str,
    reason: String,
}

/// What a client sees of the cluster (`GetClusterInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Leader node id (0 = none known).
    pub leader_id: u64,
    /// The leader's client address, if registered.
    pub leader_addr: String,
    /// Members, by node id.
    pub nodes: Vec<NodeView>,
}

/// One member as `GetClusterInfo` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Its id.
    pub node_id: u64,
    /// Its client address (its Raft address until it registered one).
    pub address: String,
    /// Its Raft address.
    pub raft_address: String,
    /// It leads the shard.
    pub is_leader: bool,
    /// It votes (else a learner).
    pub is_voter: bool,
}

fn unframe<'b>(bytes: &'b [u8], what: &'static str) -> Result<(u8, &'b [u8]), MetaDecodeError> {
    crate::envelope::unframe(bytes).map_err(|e| MetaDecodeError {
        what,
        reason: e.to_string(),
    })
}

impl MetaCommand {
    /// Encodes the command.
    ///
    /// # Panics
    /// Only if rkyv cannot serialize plain data (it always can).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        match self {
            MetaCommand::UpdateTopology(t) => frame(TAG_UPDATE_TOPOLOGY, t, 256),
            MetaCommand::RegisterNodeAddr(a) => frame(TAG_REGISTER_NODE_ADDR, a, 64),
        }
    }

    /// Decodes and validates a command.
    ///
    /// # Errors
    /// [`MetaDecodeError`] for anything but a well-formed command.
    pub fn decode(bytes: &[u8]) -> Result<Self, MetaDecodeError> {
        let (tag, archive) = unframe(bytes, "command")?;
        let bad = |e: RkyvError| MetaDecodeError {
            what: "command",
            reason: e.to_string(),
        };
        match tag {
            TAG_UPDATE_TOPOLOGY => rkyv::from_bytes::<ShardTopology, RkyvError>(archive)
                .map(MetaCommand::UpdateTopology)
                .map_err(bad),
            TAG_REGISTER_NODE_ADDR => rkyv::from_bytes::<NodeAddr, RkyvError>(archive)
                .map(MetaCommand::RegisterNodeAddr)
                .map_err(bad),
            t => Err(MetaDecodeError {
                what: "command",
                reason: format!("unknown tag {t}"),
            }),
        }
    }
}

impl MetaState {
    /// The client (gRPC) address `node` registered, if it did. There is no other address to
    /// fall back on: its Raft address takes no client.
    #[must_use]
    pub fn client_addr(&self, node: u64) -> Option<&str> {
        self.grpc_addrs.get(&node).map(String::as_str)
    }

    /// Applies a command; returns whether the state changed.
    pub fn apply(&mut self, cmd: MetaCommand) -> bool {
        match cmd {
            MetaCommand::UpdateTopology(mut t) => {
                // A leader of an earlier term that has not heard of the later one proposes
                // the stored epoch + 1: its term, not only the epoch, must move forward.
                if self
                    .shards
                    .get(&t.shard_id)
                    .is_some_and(|old| old.epoch >= t.epoch || old.term > t.term)
                {
                    return false;
                }
                t.members.sort_by_key(|m| m.node_id);
                self.shards.insert(t.shard_id, t);
                true
            }
            MetaCommand::RegisterNodeAddr(a) => {
                self.grpc_addrs
                    .insert(a.node_id, a.grpc_addr.clone())
                    .as_deref()
                    != Some(a.grpc_addr.as_str())
            }
        }
    }

    /// The highest topology epoch of any shard.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.shards.values().map(|t| t.epoch).max().unwrap_or(0)
    }

    /// What `GetClusterInfo` answers for `shard_id`: voters and learners with their client
    /// addresses ("" until a node registered one: its Raft address takes no client, and is
    /// given apart); `None` before the shard's topology is known.
    #[must_use]
    pub fn cluster_view(&self, shard_id: u64) -> Option<ClusterView> {
        let t = self.shards.get(&shard_id)?;
        let addr = |id: u64| self.client_addr(id).unwrap_or_default().to_owned();
        let leader_addr = t
            .members
            .iter()
            .find(|m| m.node_id == t.leader_id)
            .map(|m| addr(m.node_id))
            .unwrap_or_default();
        Some(ClusterView {
            leader_id: t.leader_id,
            leader_addr,
            nodes: t
                .members
                .iter()
                .map(|m| NodeView {
                    node_id: m.node_id,
                    address: addr(m.node_id),
                    raft_address: m.raft_addr.clone(),
                    is_leader: m.node_id == t.leader_id,
                    is_voter: m.voter,
                })
                .collect(),
        })
    }

    /// Encodes a snapshot of the whole state.
    ///
    /// # Panics
    /// Only if rkyv cannot serialize plain data (it always can).
    #[must_use]
    pub fn snapshot(&self) -> Vec<u8> {
        frame(TAG_SNAPSHOT, self, 1024)
    }

    /// Restores a state from a snapshot (replaces everything).
    ///
    /// # Errors
    /// [`MetaDecodeError`] for anything but a well-formed snapshot.
    pub fn restore(bytes: &[u8]) -> Result<Self, MetaDecodeError> {
        let (tag, archive) = unframe(bytes, "snapshot")?;
        if tag != TAG_SNAPSHOT {
            return Err(MetaDecodeError {
                what: "snapshot",
                reason: format!("tag {tag}"),
            });
        }
        rkyv::from_bytes::<MetaState, RkyvError>(archive).map_err(|e| MetaDecodeError {
            what: "snapshot",
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A leader of an earlier term that has not heard of the later one proposes the stored
    /// epoch + 1; it used to replace the later term's topology.
    #[test]
    fn a_topology_of_an_earlier_term_never_replaces_a_later_one() {
        let mut s = MetaState::default();
        let mut later = topo(5 << 32, 2);
        later.term = 5;
        assert!(s.apply(MetaCommand::UpdateTopology(later)));
        let mut stale = topo((5 << 32) + 1, 1);
        stale.term = 4;
        assert!(!s.apply(MetaCommand::UpdateTopology(stale)));
        assert_eq!(s.cluster_view(1).unwrap().leader_id, 2);
    }

    #[test]
    fn a_node_is_reached_by_the_client_address_it_registered_or_none() {
        let mut st = MetaState::default();
        assert_eq!(st.client_addr(2), None);
        st.apply(MetaCommand::RegisterNodeAddr(NodeAddr {
            node_id: 2,
            grpc_addr: "10.0.0.2:9000".into(),
        }));
        assert_eq!(st.client_addr(2), Some("10.0.0.2:9000"));
        assert_eq!(st.client_addr(3), None);
    }

    fn topo(epoch: u64, leader: u64) -> ShardTopology {
        ShardTopology {
            shard_id: 1,
            leader_id: leader,
            term: epoch,
            epoch,
            members: vec![
                Member {
                    node_id: 3,
                    raft_addr: "127.0.0.3:50005".into(),
                    voter: false,
                },
                Member {
                    node_id: 1,
                    raft_addr: "127.0.0.1:50005".into(),
                    voter: true,
                },
                Member {
                    node_id: 2,
                    raft_addr: "127.0.0.2:50005".into(),
                    voter: true,
                },
            ],
        }
    }

    #[test]
    fn topology_only_moves_forward_and_views_use_client_addresses_only() {
        let mut s = MetaState::default();
        assert!(
            s.cluster_view(1).is_none(),
            "unknown before the first topology"
        );
        assert!(s.apply(MetaCommand::UpdateTopology(topo(2, 1))));
        assert!(
            !s.apply(MetaCommand::UpdateTopology(topo(1, 2))),
            "stale epoch ignored"
        );
        assert!(
            !s.apply(MetaCommand::UpdateTopology(topo(2, 2))),
            "same epoch ignored"
        );
        assert!(s.apply(MetaCommand::RegisterNodeAddr(NodeAddr {
            node_id: 1,
            grpc_addr: "10.0.0.1:8443".into()
        })));
        assert!(!s.apply(MetaCommand::RegisterNodeAddr(NodeAddr {
            node_id: 1,
            grpc_addr: "10.0.0.1:8443".into()
        })));
        let v = s.cluster_view(1).unwrap();
        assert_eq!((v.leader_id, v.leader_addr.as_str()), (1, "10.0.0.1:8443"));
        assert_eq!(
            v.nodes.iter().map(|n| n.node_id).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "sorted by id"
        );
        assert_eq!(
            v.nodes[1],
            NodeView {
                node_id: 2,
                address: String::new(),
                raft_address: "127.0.0.2:50005".into(),
                is_leader: false,
                is_voter: true
            },
            "raft address until registered"
        );
        assert!(!v.nodes[2].is_voter, "node 3 is a learner");
        assert!(s.apply(MetaCommand::UpdateTopology(topo(3, 2))));
        assert_eq!(s.cluster_view(1).unwrap().leader_id, 2);
        assert_eq!(s.epoch(), 3);
    }

    #[test]
    fn snapshot_round_trip_and_bad_bytes() {
        let mut s = MetaState::default();
        s.apply(MetaCommand::UpdateTopology(topo(5, 2)));
        s.apply(MetaCommand::RegisterNodeAddr(NodeAddr {
            node_id: 2,
            grpc_addr: "h:1".into(),
        }));
        let snap = s.snapshot();
        assert_eq!(MetaState::restore(&snap).unwrap(), s);
        assert!(MetaState::restore(&snap[..snap.len() - 1]).is_err());
        assert!(MetaState::restore(
            &MetaCommand::RegisterNodeAddr(NodeAddr {
                node_id: 1,
                grpc_addr: String::new()
            })
            .encode()
        )
        .is_err());
    }

    proptest! {
        #[test]
        fn commands_round_trip(id: u64, addr in ".{0,30}", epoch: u64, leader: u64) {
            let a = MetaCommand::RegisterNodeAddr(NodeAddr { node_id: id, grpc_addr: addr });
            prop_assert_eq!(MetaCommand::decode(&a.encode()).unwrap(), a);
            let t = MetaCommand::UpdateTopology(ShardTopology { epoch, leader_id: leader, ..topo(0, 0) });
            prop_assert_eq!(MetaCommand::decode(&t.encode()).unwrap(), t);
        }

        #[test]
        fn replicas_converge(epochs in proptest::collection::vec((1u64..20, 1u64..4), 0..30)) {
            let cmds: Vec<MetaCommand> = epochs.iter().map(|(e, l)| MetaCommand::UpdateTopology(topo(*e, *l))).collect();
            let (mut a, mut b) = (MetaState::default(), MetaState::default());
            for c in &cmds { a.apply(c.clone()); }
            // A replica restored from a snapshot mid-way, then fed the rest, ends the same.
            let mid = cmds.len() / 2;
            for c in &cmds[..mid] { b.apply(c.clone()); }
            let mut b = MetaState::restore(&b.snapshot()).unwrap();
            for c in &cmds[mid..] { b.apply(c.clone()); }
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.epoch(), epochs.iter().map(|(e, _)| *e).max().unwrap_or(0));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = MetaCommand::decode(&b);
            let _ = MetaState::restore(&b);
        }
    }
}
