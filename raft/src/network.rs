//! openraft's network over [`futureq_net::peer_link`]: one TCP link per peer, requests
//! multiplexed by Raft group, RPCs encoded by [`crate::rpc`].
//!
//! A snapshot travels as [`KIND_SNAPSHOT_CHUNK`] frames of at most
//! [`SNAPSHOT_CHUNK_BYTES`], read from the sender's stream as they go and each acknowledged
//! before the next is sent, then one [`KIND_SNAPSHOT`] frame with the vote, the metadata and
//! the length, which installs what the receiver spooled. The receiver keeps one transfer per
//! group ([`crate::snapshot::Receiving`]): a chunk at offset 0 starts a new one, any other
//! must continue the current one exactly, or the transfer is refused.

use std::cell::RefCell;
use std::collections::HashMap;
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

use crate::codec::{decode_snapshot_meta, encode_snapshot_meta, put_part, take_part, CodecError};
use crate::rpc::{
    decode_append, decode_append_response, decode_snapshot_response, decode_vote_request,
    decode_vote_response, encode_append, encode_append_response, encode_snapshot_response,
    encode_vote_request, encode_vote_response, KIND_APPEND, KIND_PRE_VOTE, KIND_RESPONSE,
    KIND_SNAPSHOT, KIND_VOTE,
};
use crate::rpc::{
    decode_snapshot_chunk, encode_snapshot_chunk, SnapshotChunk, KIND_SNAPSHOT_CHUNK,
};
use crate::snapshot::Receiving;
use crate::state_machine::{EventSnapshot, Meta};
use crate::types::{SnapshotData, TypeConfig, Vote};

/// Largest frame on a peer link.
pub const PEER_FRAME_MAX: usize = 256 << 20;
/// Timeout of the frame that installs a snapshot (the receiver loads it into its store).
pub const SNAPSHOT_RPC_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest piece of snapshot data per frame.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// Most entry bytes one AppendEntries frame carries (openraft bounds a request by entries
/// only: 300 entries of 4 MiB batches would be a 1.2 GB frame, refused by the peer). Each
/// frame is held whole by the sender and the receiver until its entries are appended: this
/// bounds the memory of replication (a follower catching up got 32 MiB frames before issue
/// 12: a joining node's RSS rose to 470 MiB). One frame still takes at least one entry.
pub const APPEND_BYTES_MAX: usize = 4 << 20;
/// Largest snapshot a receiver spools.
pub const SNAPSHOT_BYTES_MAX: u64 = 16 << 30;
/// Answer to a chunk that was taken.
const CHUNK_TAKEN: u8 = 0;
/// Answer to a chunk that does not continue the current transfer (the sender starts over).
const CHUNK_REFUSED: u8 = 1;

/// How many leading entries fit in `max` bytes (at least one, so replication always moves).
fn entries_within(entries: &[crate::types::Entry], max: usize) -> usize {
    let mut bytes = 0usize;
    for (i, e) in entries.iter().enumerate() {
        let n = match &e.payload {
            openraft::EntryPayload::Normal(c) => c.0.len(),
            _ => 0,
        } + 64;
        if i > 0 && bytes + n > max {
            return i;
        }
        bytes += n;
    }
    entries.len()
}

fn unreachable(e: impl std::fmt::Display) -> Unreachable<TypeConfig> {
    Unreachable::from_string(e.to_string())
}

/// The client side: one [`PeerClient`] per peer address, shared by every Raft group.
#[derive(Clone)]
pub struct PeerNetwork {
    group: u8,
    timeout: Duration,
    reconnect_max: Duration,
    secret: futureq_net::peer_link::PeerSecret,
    tls: Option<std::sync::Arc<futureq_net::tls::PeerTls>>,
    bind: Option<std::net::IpAddr>,
    append_bytes_max: usize,
    clients: Rc<RefCell<HashMap<SocketAddr, Rc<PeerClient>>>>,
    /// The task queue every link's connection runs in (see [`PeerNetwork::in_current_queue`]).
    queue: Option<glommio::TaskQueueHandle>,
}

impl PeerNetwork {
    /// A network for Raft group `group` with a per-RPC timeout.
    #[must_use]
    pub fn new(group: u8, timeout: Duration) -> Self {
        PeerNetwork {
            group,
            timeout,
            reconnect_max: futureq_net::peer_link::RECONNECT_MAX,
            secret: futureq_net::peer_link::PeerSecret::default(),
            tls: None,
            bind: None,
            append_bytes_max: APPEND_BYTES_MAX,
            clients: Rc::default(),
            queue: None,
        }
    }

    /// Bounds the entry bytes of one AppendEntries frame (at least one entry always goes).
    #[must_use]
    pub fn with_append_bytes_max(mut self, max: usize) -> Self {
        self.append_bytes_max = max;
        self
    }

    /// Binds every outgoing link to `ip` (see [`PeerClient::with_bind`]).
    #[must_use]
    pub fn with_bind(mut self, ip: Option<std::net::IpAddr>) -> Self {
        self.bind = ip;
        self
    }

    /// Opens every link with the cluster secret.
    #[must_use]
    pub fn with_secret(mut self, secret: futureq_net::peer_link::PeerSecret) -> Self {
        self.secret = secret;
        self
    }

    /// Opens every link with mutual TLS.
    #[must_use]
    pub fn with_tls(mut self, tls: Option<std::sync::Arc<futureq_net::tls::PeerTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// Runs every link's writer and reader in the task queue of the caller of this (the Raft
    /// groups' queue when called at their start), whoever opens the link first.
    #[must_use]
    pub fn in_current_queue(mut self) -> Self {
        self.queue = Some(glommio::executor().current_task_queue());
        self
    }

    /// Caps the reconnect backoff of every link (keep it below the election timeout).
    #[must_use]
    pub fn with_reconnect_max(mut self, max: Duration) -> Self {
        self.reconnect_max = max;
        self
    }

    /// The same links (one connection per peer), for another group.
    #[must_use]
    pub fn for_group(&self, group: u8) -> Self {
        PeerNetwork {
            group,
            timeout: self.timeout,
            reconnect_max: self.reconnect_max,
            secret: self.secret.clone(),
            tls: self.tls.clone(),
            bind: self.bind,
            append_bytes_max: self.append_bytes_max,
            clients: Rc::clone(&self.clients),
            queue: self.queue,
        }
    }

    /// The link to `addr` (created on first use).
    #[must_use]
    pub fn client(&self, addr: SocketAddr) -> Rc<PeerClient> {
        Rc::clone(self.clients.borrow_mut().entry(addr).or_insert_with(|| {
            Rc::new(
                PeerClient::new(addr, PEER_FRAME_MAX)
                    .with_reconnect_max(self.reconnect_max)
                    .with_secret(self.secret.clone())
                    .with_tls(self.tls.clone())
                    .with_bind(self.bind)
                    .with_queue(self.queue),
            )
        }))
    }
}

/// A member's Raft address that is not an IP socket address.
#[derive(Debug, thiserror::Error)]
#[error("bad peer address {addr:?}: {cause}")]
pub struct BadPeerAddress {
    addr: String,
    cause: std::net::AddrParseError,
}

/// The network to one peer.
pub struct PeerConn {
    group: u8,
    timeout: Duration,
    append_bytes_max: usize,
    client: Result<Rc<PeerClient>, BadPeerAddress>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConn;

    async fn new_client(&mut self, _target: u64, node: &BasicNode) -> PeerConn {
        let client = node
            .addr
            .parse::<SocketAddr>()
            .map_err(|cause| BadPeerAddress {
                addr: node.addr.clone(),
                cause,
            })
            .map(|addr| self.client(addr));
        PeerConn {
            group: self.group,
            timeout: self.timeout,
            append_bytes_max: self.append_bytes_max,
            client,
        }
    }
}

/// How long the frame that ends a transfer of `total` bytes may take: the receiver installs
/// the snapshot before it answers (a joining node took a 533 MB snapshot, sent and installed,
/// in 11.8 s here: 45 MB/s; 20 MB/s assumed).
fn install_timeout(total: u64) -> Duration {
    SNAPSHOT_RPC_TIMEOUT + Duration::from_secs(total / (20 << 20))
}

impl PeerConn {
    /// A vote or pre-vote request (`kind`) and its answer.
    async fn ask_vote(
        &self,
        kind: u8,
        rpc: &VoteRequest<TypeConfig>,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let b = self
            .call(kind, encode_vote_request(rpc))
            .await
            .map_err(RPCError::Unreachable)?;
        decode_vote_response(&b).map_err(|e| RPCError::Unreachable(unreachable(e)))
    }

    /// A request and its answer, within the peer timeout (a snapshot chunk, which the
    /// receiver writes to disk first: [`SNAPSHOT_RPC_TIMEOUT`]).
    async fn call(&self, kind: u8, payload: Vec<u8>) -> Result<Bytes, Unreachable<TypeConfig>> {
        let timeout = if kind == KIND_SNAPSHOT_CHUNK {
            SNAPSHOT_RPC_TIMEOUT
        } else {
            self.timeout
        };
        self.call_within(kind, payload, timeout).await
    }

    async fn call_within(
        &self,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, Unreachable<TypeConfig>> {
        let client = self.client.as_ref().map_err(unreachable)?;
        let f = client
            .call(self.group, kind, Bytes::from(payload), timeout)
            .await
            .map_err(unreachable)?;
        if f.kind != KIND_RESPONSE {
            return Err(unreachable(format!("peer answered kind {}", f.kind)));
        }
        Ok(f.payload)
    }
}

/// The end of a snapshot transfer: the vote (length-prefixed), the snapshot's metadata, then
/// the data's length (u64 LE).
fn encode_snapshot(vote: &Vote, meta: &Meta, total: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    put_part(&mut out, &crate::codec::encode_vote(vote));
    out.extend_from_slice(&encode_snapshot_meta(meta, &total.to_le_bytes()));
    out
}

fn decode_snapshot(b: &[u8]) -> Result<(Vote, Meta, u64), CodecError> {
    let mut rest = b;
    let vote = crate::codec::decode_vote(take_part(&mut rest, "snapshot transfer")?)?;
    let (meta, total) = decode_snapshot_meta(rest)?;
    let total =
        <[u8; 8]>::try_from(total).map_err(|_| CodecError::truncated("snapshot transfer"))?;
    Ok((vote, meta, u64::from_le_bytes(total)))
}

impl RaftNetworkV2<TypeConfig> for PeerConn {
    type SnapshotData = SnapshotData;

    /// Sends the entries that fit in `append_bytes_max` (at least one); when that is a
    /// prefix, a full success is reported as a partial one up to the last entry sent, and
    /// openraft sends the rest next.
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let keep = entries_within(&rpc.entries, self.append_bytes_max);
        let partial = keep < rpc.entries.len();
        rpc.entries.truncate(keep);
        let last_sent = rpc.entries.last().map(|e| e.log_id);
        let b = self
            .call(KIND_APPEND, encode_append(&rpc))
            .await
            .map_err(RPCError::Unreachable)?;
        match decode_append_response(&b).map_err(|e| RPCError::Unreachable(unreachable(e)))? {
            AppendEntriesResponse::Success if partial => {
                Ok(AppendEntriesResponse::PartialSuccess(last_sent))
            }
            other => Ok(other),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.ask_vote(KIND_VOTE, &rpc).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.ask_vote(KIND_PRE_VOTE, &rpc).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        mut snapshot: EventSnapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let id = &transfer_id(&snapshot.meta);
        let mut offset = 0u64;
        // At least one chunk, so that an empty snapshot also starts a transfer.
        loop {
            let piece = snapshot
                .snapshot
                .next_chunk(SNAPSHOT_CHUNK_BYTES)
                .await
                .map_err(|e| {
                    StreamingError::Unreachable(unreachable(format!("reading the snapshot: {e}")))
                })?;
            if piece.is_empty() && offset > 0 {
                break;
            }
            let chunk = encode_snapshot_chunk(&SnapshotChunk {
                snapshot_id: id,
                offset,
                data: &piece,
            });
            let answer = self
                .call(KIND_SNAPSHOT_CHUNK, chunk)
                .await
                .map_err(StreamingError::Unreachable)?;
            if answer.as_ref() != [CHUNK_TAKEN] {
                return Err(StreamingError::Unreachable(unreachable(format!(
                    "peer refused snapshot chunk at byte {offset}"
                ))));
            }
            offset += piece.len() as u64;
            if piece.len() < SNAPSHOT_CHUNK_BYTES {
                break;
            }
        }
        let end = encode_snapshot(&vote, &snapshot.meta, offset);
        let b = self
            .call_within(KIND_SNAPSHOT, end, install_timeout(offset))
            .await
            .map_err(StreamingError::Unreachable)?;
        decode_snapshot_response(&b).map_err(|e| StreamingError::Unreachable(unreachable(e)))
    }
}

/// Names a transfer: the encoded metadata (last log id and membership).
fn transfer_id(meta: &Meta) -> Vec<u8> {
    encode_snapshot_meta(meta, &[])
}

/// The server side of one Raft group: answers the peer frames addressed to group `group`,
/// spooling snapshot transfers with `receiving`. A node with several groups routes frames by
/// group id to one of these each.
pub fn raft_handler<SM>(
    group: u8,
    raft: openraft::Raft<TypeConfig, SM>,
    receiving: Receiving,
) -> PeerHandler
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    let transfer = Rc::new(RefCell::new(receiving));
    // A transfer whose sender went quiet is dropped (with its spool file).
    let weak = Rc::downgrade(&transfer);
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(SNAPSHOT_RPC_TIMEOUT / 2).await;
            let Some(t) = weak.upgrade() else { return };
            // Twice the sender's chunk timeout: a slow sender is not cut off.
            t.borrow_mut().expire(2 * SNAPSHOT_RPC_TIMEOUT);
        }
    })
    .detach();
    Rc::new(move |f: PeerFrame| {
        let raft = raft.clone();
        let transfer = Rc::clone(&transfer);
        Box::pin(async move {
            if f.group != group {
                return None;
            }
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
                KIND_PRE_VOTE => encode_vote_response(
                    &raft
                        .pre_vote(decode_vote_request(&f.payload).ok()?)
                        .await
                        .ok()?,
                ),
                KIND_SNAPSHOT_CHUNK => {
                    let taken = match decode_snapshot_chunk(&f.payload) {
                        Ok(c) => {
                            let data = f.payload.slice_ref(c.data);
                            crate::snapshot::take_piece(&transfer, c.snapshot_id, c.offset, data)
                                .await
                        }
                        Err(_) => false,
                    };
                    vec![if taken { CHUNK_TAKEN } else { CHUNK_REFUSED }]
                }
                KIND_SNAPSHOT => {
                    let (vote, meta, total) = decode_snapshot(&f.payload).ok()?;
                    let data =
                        crate::snapshot::finish(&transfer, &transfer_id(&meta), total).await?;
                    let snap = Snapshot {
                        meta,
                        snapshot: data,
                    };
                    encode_snapshot_response(&raft.install_full_snapshot(vote, snap).await.ok()?)
                }
                _ => return None,
            };
            Some((KIND_RESPONSE, Bytes::from(out)))
        })
    })
}
