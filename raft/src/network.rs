//! openraft's network over [`futureq_net::peer_link`]: one TCP link per peer, requests
//! multiplexed by Raft group, RPCs encoded by [`crate::rpc`].
//!
//! Snapshots travel in one frame (the link's frame limit bounds them); chunked streaming is
//! still to come.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Cursor;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futureq_net::peer::PeerFrame;
use futureq_net::peer_link::{PeerClient, PeerHandler};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{BasicNode, RaftNetworkV2};

use crate::codec::{
    decode_log_id, decode_membership, encode_log_id, encode_membership, CodecError,
};
use crate::rpc::{
    decode_append, decode_append_response, decode_snapshot_response, decode_vote_request,
    decode_vote_response, encode_append, encode_append_response, encode_snapshot_response,
    encode_vote_request, encode_vote_response, KIND_APPEND, KIND_RESPONSE, KIND_SNAPSHOT,
    KIND_VOTE,
};
use crate::state_machine::{EventSnapshot, Meta};
use crate::types::{TypeConfig, Vote};

/// Largest frame on a peer link (bounds a snapshot until chunking lands).
pub const PEER_FRAME_MAX: usize = 256 << 20;

fn unreachable(e: impl std::fmt::Display) -> Unreachable<TypeConfig> {
    Unreachable::from_string(e.to_string())
}

/// The client side: one [`PeerClient`] per peer address, shared by every Raft group.
#[derive(Clone)]
pub struct PeerNetwork {
    group: u8,
    timeout: Duration,
    clients: Rc<RefCell<HashMap<SocketAddr, Rc<PeerClient>>>>,
}

impl PeerNetwork {
    /// A network for Raft group `group` with a per-RPC timeout.
    #[must_use]
    pub fn new(group: u8, timeout: Duration) -> Self {
        PeerNetwork {
            group,
            timeout,
            clients: Rc::default(),
        }
    }
}

/// The network to one peer.
pub struct PeerConn {
    group: u8,
    timeout: Duration,
    client: Result<Rc<PeerClient>, String>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConn;

    async fn new_client(&mut self, _target: u64, node: &BasicNode) -> PeerConn {
        let client = node
            .addr
            .parse::<SocketAddr>()
            .map_err(|e| format!("bad peer address {:?}: {e}", node.addr))
            .map(|addr| {
                Rc::clone(
                    self.clients
                        .borrow_mut()
                        .entry(addr)
                        .or_insert_with(|| Rc::new(PeerClient::new(addr, PEER_FRAME_MAX))),
                )
            });
        PeerConn {
            group: self.group,
            timeout: self.timeout,
            client,
        }
    }
}

impl PeerConn {
    async fn call(&self, kind: u8, payload: Vec<u8>) -> Result<Bytes, Unreachable<TypeConfig>> {
        let client = self.client.as_ref().map_err(unreachable)?;
        let f = client
            .call(self.group, kind, Bytes::from(payload), self.timeout)
            .await
            .map_err(unreachable)?;
        if f.kind != KIND_RESPONSE {
            return Err(unreachable(format!("peer answered kind {}", f.kind)));
        }
        Ok(f.payload)
    }
}

fn encode_snapshot(vote: &Vote, meta: &Meta, data: &[u8]) -> Vec<u8> {
    let v = crate::codec::encode_vote(vote);
    let id = encode_log_id(meta.last_log_id.as_ref());
    let m = encode_membership(&meta.last_membership);
    let mut out = Vec::with_capacity(12 + v.len() + id.len() + m.len() + data.len());
    for part in [&v[..], &id[..], &m[..]] {
        out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(part);
    }
    out.extend_from_slice(data);
    out
}

fn decode_snapshot(b: &[u8]) -> Result<(Vote, Meta, Vec<u8>), CodecError> {
    let mut parts = Vec::with_capacity(3);
    let mut rest = b;
    for _ in 0..3 {
        if rest.len() < 4 {
            return Err(CodecError::truncated("snapshot transfer"));
        }
        let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if rest.len() < 4 + n {
            return Err(CodecError::truncated("snapshot transfer"));
        }
        parts.push(&rest[4..4 + n]);
        rest = &rest[4 + n..];
    }
    let vote = crate::codec::decode_vote(parts[0])?;
    let meta = Meta {
        last_log_id: decode_log_id(parts[1])?,
        last_membership: decode_membership(parts[2])?,
    };
    Ok((vote, meta, rest.to_vec()))
}

impl RaftNetworkV2<TypeConfig> for PeerConn {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = self
            .call(KIND_APPEND, encode_append(&rpc))
            .await
            .map_err(RPCError::Unreachable)?;
        decode_append_response(&b).map_err(|e| RPCError::Unreachable(unreachable(e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = self
            .call(KIND_VOTE, encode_vote_request(&rpc))
            .await
            .map_err(RPCError::Unreachable)?;
        decode_vote_response(&b).map_err(|e| RPCError::Unreachable(unreachable(e)))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: EventSnapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let payload = encode_snapshot(&vote, &snapshot.meta, snapshot.snapshot.get_ref());
        let b = self
            .call(KIND_SNAPSHOT, payload)
            .await
            .map_err(StreamingError::Unreachable)?;
        decode_snapshot_response(&b).map_err(|e| StreamingError::Unreachable(unreachable(e)))
    }
}

/// The server side: answers peer frames for the Raft groups in `groups` (group id → node).
pub fn raft_handler<SM>(groups: Rc<HashMap<u8, openraft::Raft<TypeConfig, SM>>>) -> PeerHandler
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = Cursor<Vec<u8>>>,
{
    Rc::new(move |f: PeerFrame| {
        let groups = Rc::clone(&groups);
        Box::pin(async move {
            let raft = groups.get(&f.group)?.clone();
            let out = match f.kind {
                KIND_APPEND => encode_append_response(
                    &raft
                        .append_entries(decode_append(&f.payload).ok()?)
                        .await
                        .ok()?,
                ),
                KIND_VOTE => encode_vote_response(
                    &raft
                        .vote(decode_vote_request(&f.payload).ok()?)
                        .await
                        .ok()?,
                ),
                KIND_SNAPSHOT => {
                    let (vote, meta, data) = decode_snapshot(&f.payload).ok()?;
                    let snap = Snapshot {
                        meta,
                        snapshot: Cursor::new(data),
                    };
                    encode_snapshot_response(&raft.install_full_snapshot(vote, snap).await.ok()?)
                }
                _ => return None,
            };
            Some((KIND_RESPONSE, Bytes::from(out)))
        })
    })
}
