//! One cluster node: the event shard and the metadata group on this (the Raft) core, their
//! logs on io_uring, the peer listener, and what the broker asks of them — proposals with the
//! three ack levels, forwarded metadata proposals, membership changes and leadership status.
//!
//! Everything here runs on the Raft core's glommio executor; other cores talk to it over
//! channels (see the broker). No blocking call runs on this reactor: redb calls go to the
//! blocking pool (state machine), log I/O is io_uring.
//!
//! # Invariants
//! - Only the metadata group forwards proposals to its leader; the event shard is written only
//!   on its own leader (the broker refuses clients elsewhere).
//! - A write refused with ForwardToLeader(LeaseExpired), or by a leader that does not know
//!   itself yet, is retried until the caller's deadline; every other refusal is returned.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futureq_core::command::{encode_delete, DeleteBatch};
use futureq_core::KEY_LEN;
use futureq_net::peer::PeerFrame;
use futureq_net::peer_link::{serve_peers, PeerHandler};
use futureq_net::Shutdown;
use futureq_storage::log::tracker::PersistTracker;
use futureq_storage::log::uring::DmaLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::Store;
use futures_lite::future;
use openraft::error::{ClientWriteError, ForwardReason, ForwardToLeader, RaftError};
use openraft::{BasicNode, ChangeMembers, ReadPolicy, ServerState, SnapshotPolicy};

use crate::log_store::LogStore;
use crate::metadata_sm::MetaStateMachine;
use crate::network::{raft_handler, PeerNetwork, PEER_FRAME_MAX, SNAPSHOT_RPC_TIMEOUT};
use crate::rpc::KIND_RESPONSE;
use crate::state_machine::{EventStateMachine, OnApplied};
use crate::types::{Applied, Command, TypeConfig};

/// Peer-frame group id of the metadata group.
pub const META_GROUP: u8 = 0;
/// Peer-frame group id of the event shard.
pub const EVENT_GROUP: u8 = 1;
/// Peer-frame kind of a request forwarded to a group's leader (see [`Forward`]).
pub const KIND_FORWARD: u8 = 4;
/// Snapshot policy of the metadata group (its state is tiny).
pub const META_SNAPSHOT_ENTRIES: u64 = 5;
/// Raft log segment size.
pub const SEGMENT_BYTES: u64 = 64 << 20;
// A command at the API's entry limit fits in one record of a segment (with the entry's
// openraft envelope, a few dozen bytes).
const _: () = assert!(
    (futureq_core::command::ENTRY_BYTES_MAX + futureq_storage::log::format::HEADER_LEN + 4096)
        as u64
        <= SEGMENT_BYTES - futureq_storage::log::format::BLOCK
);
/// Per-RPC timeout between peers (snapshots get `network::SNAPSHOT_RPC_TIMEOUT`).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(2);
/// Most event-shard proposals outstanding (proposed, not yet applied) on a leader.
pub const PROPOSALS_MAX: u64 = 1024;
/// Pause between retries of a write refused while leadership settles.
const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// The event shard.
pub type EventRaft = openraft::Raft<TypeConfig, EventStateMachine>;
/// The metadata group.
pub type MetaRaft = openraft::Raft<TypeConfig, MetaStateMachine>;

/// How a node is set up (from `cluster.*`).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// `cluster.nodeId`.
    pub node_id: u64,
    /// `cluster.raft.listen`.
    pub raft_listen: SocketAddr,
    /// `cluster.raft.advertise`.
    pub raft_advertise: String,
    /// `cluster.raft.dataDir`.
    pub data_dir: PathBuf,
    /// `cluster.raft.rtt`: heartbeat every rtt, election timeout 10–15 rtt (randomised).
    pub rtt: Duration,
    /// `cluster.raft.snapshotEntries`.
    pub snapshot_entries: u64,
    /// `cluster.raft.compactionOverhead`: applied entries kept behind a snapshot.
    pub compaction_overhead: u64,
    /// `cluster.secret`: peer links must open with it (empty = open).
    pub secret: futureq_net::peer_link::PeerSecret,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The Raft data directory or a log could not be opened.
    #[error("opening the Raft log in {path}: {source}")]
    Log {
        /// The directory.
        path: String,
        /// The cause.
        source: io::Error,
    },
    /// `cluster.raft.listen` could not be bound.
    #[error("cannot listen on cluster.raft.listen {addr}: {reason}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        reason: String,
    },
    /// openraft refused to start or initialize.
    #[error("raft: {0}")]
    Raft(String),
    /// The store applied less than the log purged: the entries between are in neither.
    #[error("the event store applied log index {applied}, but the Raft log was purged up to {purged}: entries {from}..={purged} are in neither, so this node cannot serve its state; remove it from the cluster (futureq leave --seed <member>), delete its Raft data ({dir}) and its store, and join it again", from = applied + 1)]
    BehindPurge {
        /// The store's applied index (0 = none).
        applied: u64,
        /// The log's purge point.
        purged: u64,
        /// The Raft data directory.
        dir: String,
    },
}

/// Why a write or membership change did not succeed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum WriteError {
    /// This node is not the group's leader; the leader's node id if known.
    #[error("node is not the leader ({})", leader.map_or_else(|| "leader unknown".to_owned(), |id| format!("leader: node {id}")))]
    NotLeader {
        /// The leader, if known.
        leader: Option<u64>,
    },
    /// The deadline passed; the outcome is unknown.
    #[error("not committed before the deadline; outcome unknown")]
    Timeout,
    /// Raft refused the request or stopped.
    #[error("{0}")]
    Failed(String),
    /// Committed, but the state machine refused it on every replica: nothing of it applied.
    #[error("refused by the state machine: {0}")]
    Refused(String),
}

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

/// What the broker needs to know about the event shard's leadership.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    /// The current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader: Option<u64>,
    /// This node leads, and a quorum acknowledged it within the election timeout
    /// (the CheckQuorum equivalent: a leader cut off from its quorum stops serving).
    pub leading: bool,
    /// Members: (node id, raft address, voter).
    pub members: Vec<(u64, String, bool)>,
    /// Last applied log index (0 = none).
    pub applied: u64,
    /// Last log index (0 = none).
    pub last_log: u64,
    /// Highest purged log index (0 = none).
    pub purged: u64,
    /// On a leader: the members heard from within an election timeout (itself included).
    /// `None` on a follower, which does not know.
    pub alive: Option<BTreeSet<u64>>,
}

/// Where a node stands in a group's membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not a member.
    Absent,
    /// A non-voting member.
    Learner,
    /// A voter.
    Voter,
}

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
        Err(WriteError::Failed(m)) => {
            let mut v = vec![3];
            v.extend_from_slice(m.as_bytes());
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
        Some((3, m)) => Err(WriteError::Failed(String::from_utf8_lossy(m).into_owned())),
        Some((4, m)) => Err(WriteError::Refused(String::from_utf8_lossy(m).into_owned())),
        _ => Err(WriteError::Failed("malformed forwarded reply".into())),
    }
}

/// Whether a ForwardToLeader refusal is transient on a node that leads (or may lead soon).
fn settling(f: &ForwardToLeader<TypeConfig>, me: u64) -> bool {
    f.reason == ForwardReason::LeaseExpired || f.leader_id.is_none() || f.leader_id == Some(me)
}

fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> WriteError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => WriteError::NotLeader {
            leader: f.leader_id,
        },
        other => WriteError::Failed(other.to_string()),
    }
}

/// Runs `op` until it succeeds, fails for good, or `deadline` passes; transient leadership
/// refusals are retried.
async fn with_retry<F, Fut, T>(me: u64, deadline: Instant, mut op: F) -> Result<T, WriteError>
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
async fn change<SM>(
    raft: &openraft::Raft<TypeConfig, SM>,
    me: u64,
    req: &Forward,
    deadline: Instant,
) -> Result<(), WriteError>
where
    SM: openraft::storage::RaftStateMachine<TypeConfig>,
{
    match req {
        Forward::Write(c) => with_retry(me, deadline, || raft.client_write(Command(c.clone())))
            .await
            .map(drop),
        Forward::Delete(_) => Err(WriteError::Failed(
            "event deletes go through Node::write_event".into(),
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

use openraft_rt::watch::WatchReceiver as _;

/// Changes of the event shard's metrics (see [`Node::watch_event`]).
pub struct EventWatch(
    openraft::type_config::alias::WatchReceiverOf<TypeConfig, openraft::RaftMetrics<TypeConfig>>,
);

impl EventWatch {
    /// Resolves at the next change, or after `max` at the latest.
    pub async fn changed(&mut self, max: Duration) {
        let changed = async {
            if self.0.changed().await.is_err() {
                // The node stopped: nothing will change any more.
                future::pending::<()>().await;
            }
        };
        future::or(changed, glommio::timer::sleep(max)).await;
        drop(self.0.borrow_and_update());
    }
}

/// Pause between attempts of a metadata request (see [`Node::meta_request`]).
const META_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A running node (both groups). Cheap to clone.
#[derive(Clone)]
pub struct Node {
    /// This node's id.
    pub id: u64,
    /// The event shard.
    pub event: EventRaft,
    /// The metadata group.
    pub meta: MetaRaft,
    /// The metadata replica (what `GetClusterInfo` answers from).
    pub meta_sm: MetaStateMachine,
    /// The leader-persist tracker of the event shard's log (LEADER acks).
    pub tracker: PersistTracker,
    network: PeerNetwork,
    stop: Shutdown,
    election_timeout: Duration,
    proposals: Rc<glommio::sync::Semaphore>,
    event_sm: EventStateMachine,
}

fn raft_config(
    cluster: &str,
    rtt: Duration,
    policy: SnapshotPolicy,
    keep: u64,
) -> Result<Arc<openraft::Config>, NodeError> {
    let rtt_ms = u64::try_from(rtt.as_millis()).unwrap_or(u64::MAX).max(1);
    let c = openraft::Config {
        cluster_name: cluster.into(),
        heartbeat_interval: rtt_ms,
        election_timeout_min: 10 * rtt_ms,
        // openraft's leader lease is election_timeout_max: followers refuse votes until it
        // ran out, so a narrow range shortens failover (a candidate that times out early
        // is refused and tries again one timeout later).
        election_timeout_max: 15 * rtt_ms,
        snapshot_policy: policy,
        max_in_snapshot_log_to_keep: keep,
        // Purge as soon as a snapshot covers entries (snapshots are already the batching).
        purge_batch_size: 1,
        install_snapshot_timeout: u64::try_from(SNAPSHOT_RPC_TIMEOUT.as_millis()).unwrap_or(60_000),
        // A leader that restarts must not lead its old term again: entries it had sent to
        // followers but not yet fsynced itself are gone from its log, and new entries of the
        // same term would reuse their (term, index) — followers that hold the old ones take
        // the new ones for them, and acked messages are lost (found by the disk-fault test).
        // It rejoins as a follower; leading again takes an election in a higher term.
        enable_leader_restore: Some(false),
        ..Default::default()
    };
    c.validate()
        .map(Arc::new)
        .map_err(|e| NodeError::Raft(e.to_string()))
}

/// The files under the Raft logs: io_uring, with the disk-fault seam in fault-injection
/// builds.
#[cfg(not(feature = "fault-injection"))]
type DiskIo = DmaLogIo;
#[cfg(feature = "fault-injection")]
type DiskIo = futureq_storage::log::faults::FaultyIo<DmaLogIo>;

fn disk_io(dir: &std::path::Path) -> DiskIo {
    #[cfg(feature = "fault-injection")]
    {
        // The Raft data directory (the parent of the event and metadata log directories).
        let trigger = dir
            .parent()
            .unwrap_or(dir)
            .join(futureq_storage::log::faults::TRIGGER_FILE);
        futureq_storage::log::faults::FaultyIo::new(
            DmaLogIo::in_dir(dir.to_path_buf()),
            trigger,
            || std::process::abort(),
        )
    }
    #[cfg(not(feature = "fault-injection"))]
    DmaLogIo::in_dir(dir.to_path_buf())
}

async fn open_log(
    dir: PathBuf,
    hook: futureq_storage::log::segmented::PersistHook,
) -> Result<LogStore<DiskIo>, NodeError> {
    let err = |source| NodeError::Log {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(err)?;
    let d = dir.clone();
    LogStore::open(
        move || disk_io(&d),
        LogConfig {
            segment_bytes: SEGMENT_BYTES,
            cache_bytes: futureq_storage::log::segmented::DEFAULT_CACHE_BYTES,
        },
        hook,
    )
    .await
    .map_err(err)
}

/// Refuses a store that applied less than the log purged (see [`NodeError::BehindPurge`]):
/// openraft would apply the entries after the purge point over the gap and serve a replica
/// that silently lacks messages.
async fn check_not_behind_purge(
    log: &mut LogStore<DiskIo>,
    store: &Store,
    dir: &std::path::Path,
) -> Result<(), NodeError> {
    use openraft::storage::RaftLogStorage as _;
    let err = |source| NodeError::Log {
        path: dir.display().to_string(),
        source,
    };
    let purged = log
        .get_log_state()
        .await
        .map_err(err)?
        .last_purged_log_id
        .map_or(0, |l| l.index);
    let s = store.clone();
    let applied = glommio::executor()
        .spawn_blocking(move || s.applied())
        .await
        .map_err(|e| err(io::Error::other(e.to_string())))?
        .map_or(0, |(i, _)| i);
    if purged > 0 && applied < purged {
        return Err(NodeError::BehindPurge {
            applied,
            purged,
            dir: dir.display().to_string(),
        });
    }
    Ok(())
}

impl Node {
    /// Opens both logs, starts both groups and the peer listener. The groups are not
    /// initialized: see [`Node::bootstrap`] and the join flow.
    ///
    /// # Errors
    /// [`NodeError`].
    pub async fn start(
        cfg: &NodeConfig,
        store: Store,
        on_applied: OnApplied,
    ) -> Result<Node, NodeError> {
        let tracker = PersistTracker::new();
        let t = tracker.clone();
        let hook: futureq_storage::log::segmented::PersistHook = Box::new(move |payload| {
            if let Ok(e) = crate::codec::decode_entry(payload) {
                if let openraft::EntryPayload::Normal(c) = &e.payload {
                    t.notify(&c.0);
                }
            }
        });
        let mut event_log = open_log(cfg.data_dir.join("event"), hook).await?;
        check_not_behind_purge(&mut event_log, &store, &cfg.data_dir).await?;
        let meta_log = open_log(cfg.data_dir.join("meta"), Box::new(|_| {})).await?;
        let event_cfg = raft_config(
            "futureq-event",
            cfg.rtt,
            SnapshotPolicy::LogsSinceLast(cfg.snapshot_entries),
            cfg.compaction_overhead,
        )?;
        let meta_cfg = raft_config(
            "futureq-meta",
            cfg.rtt,
            SnapshotPolicy::LogsSinceLast(META_SNAPSHOT_ENTRIES),
            META_SNAPSHOT_ENTRIES,
        )?;
        let election_timeout = Duration::from_millis(event_cfg.election_timeout_min);
        // A restarted peer must hear from the leader well within its election timeout
        // (10 rtt): retry links to a down peer at least every 2 rtt.
        let network = PeerNetwork::new(EVENT_GROUP, RPC_TIMEOUT)
            .with_reconnect_max(cfg.rtt * 2)
            .with_secret(cfg.secret.clone())
            .with_bind(Some(cfg.raft_listen.ip()));
        let event_sm = EventStateMachine::new(store, on_applied);
        let event = EventRaft::new(
            cfg.node_id,
            event_cfg,
            network.clone(),
            event_log,
            event_sm.clone(),
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        let meta_dir = cfg.data_dir.join("meta");
        let meta_sm =
            MetaStateMachine::open(meta_dir.clone()).map_err(|source| NodeError::Log {
                path: meta_dir.display().to_string(),
                source,
            })?;
        let meta = MetaRaft::new(
            cfg.node_id,
            meta_cfg,
            network.for_group(META_GROUP),
            meta_log,
            meta_sm.clone(),
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        let listener =
            glommio::net::TcpListener::bind(cfg.raft_listen).map_err(|e| NodeError::Listen {
                addr: cfg.raft_listen,
                reason: e.to_string(),
            })?;
        let node = Node {
            id: cfg.node_id,
            event,
            meta,
            meta_sm,
            tracker,
            network,
            stop: Shutdown::new(),
            election_timeout,
            proposals: Rc::new(glommio::sync::Semaphore::new(PROPOSALS_MAX)),
            event_sm,
        };
        glommio::spawn_local(serve_peers(
            listener,
            node.peer_handler(),
            PEER_FRAME_MAX,
            cfg.secret.clone(),
            node.stop.clone(),
        ))
        .detach();
        Ok(node)
    }

    /// Routes peer frames: Raft RPCs to their group, forwarded requests to [`Node::forwarded`].
    fn peer_handler(&self) -> PeerHandler {
        let event = raft_handler(EVENT_GROUP, self.event.clone());
        let meta = raft_handler(META_GROUP, self.meta.clone());
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
            (META_GROUP, Forward::Delete(_)) => Err(WriteError::Failed(
                "the metadata group has no event keys to delete".into(),
            )),
            (META_GROUP, _) => change(&self.meta, self.id, req, deadline).await,
            (EVENT_GROUP, Forward::Delete(keys)) => {
                let cmd = encode_delete(&DeleteBatch { keys: keys.clone() });
                self.write_event(move || Ok(cmd.clone()), Ack::Quorum, deadline)
                    .await
            }
            (EVENT_GROUP, _) => Err(WriteError::Failed(
                "the event shard takes no forwarded writes or membership changes".into(),
            )),
            _ => Err(WriteError::Failed(format!("unknown group {group}"))),
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

    /// Whether either group has state on disk (a restart: no bootstrap, no join).
    pub async fn has_state(&self) -> bool {
        self.event.is_initialized().await.unwrap_or(false)
            || self.meta.is_initialized().await.unwrap_or(false)
    }

    /// Initializes both groups with `members` (node id → raft address) unless they already
    /// have state. Every bootstrap member may call it with the same members.
    ///
    /// # Errors
    /// openraft refused for another reason than existing state.
    pub async fn bootstrap(&self, members: &BTreeMap<u64, String>) -> Result<(), NodeError> {
        let nodes: BTreeMap<u64, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        for (name, r) in [
            ("event shard", self.event.initialize(nodes.clone()).await),
            ("metadata group", self.meta.initialize(nodes.clone()).await),
        ] {
            match r {
                Ok(()) => {
                    tracing::info!(target: "raft", group = name, members = ?members.keys().collect::<Vec<_>>(), "bootstrapped")
                }
                Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => {
                    tracing::debug!(target: "raft", group = name, "already initialized");
                }
                Err(e) => return Err(NodeError::Raft(format!("initializing the {name}: {e}"))),
            }
        }
        Ok(())
    }

    /// Proposes an event-shard command on this node (the leader) and waits as `ack` says,
    /// until `deadline`.
    ///
    /// `make` builds the command at the moment of proposal: it is called right before each
    /// attempt is handed to Raft, with no await in between, so whatever it assigns (event
    /// ids) follows log order on this leader; it refuses (e.g. leadership not confirmed in
    /// the current term) by returning an error, which ends the write. A refusal by Raft while
    /// leadership settles calls it again.
    ///
    /// At most [`PROPOSALS_MAX`] proposals are outstanding (proposed, not yet applied), whatever
    /// their ack level: LEADER and NO_ACK acks return before the commit, and without this
    /// bound a fast producer would pile up entries faster than followers take them (the
    /// leader then misses heartbeats and loses leadership).
    ///
    /// # Errors
    /// [`WriteError`]; [`WriteError::Refused`] when the state machine refused the committed
    /// entry (nothing of it applied).
    pub async fn write_event(
        &self,
        mut make: impl FnMut() -> Result<Vec<u8>, WriteError> + 'static,
        ack: Ack,
        deadline: Instant,
    ) -> Result<(), WriteError> {
        let permit = {
            let acquire = async { Some(Rc::clone(&self.proposals).acquire_static_permit(1).await) };
            let timer = async {
                glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
                None
            };
            match future::or(acquire, timer).await {
                Some(Ok(p)) => p,
                Some(Err(e)) => return Err(WriteError::Failed(e.to_string())),
                None => return Err(WriteError::Timeout),
            }
        };
        let (done_tx, done_rx) = futures::channel::oneshot::channel();
        let (raft, me, tracker) = (self.event.clone(), self.id, self.tracker.clone());
        glommio::spawn_local(async move {
            let reply = std::cell::Cell::new(Some(done_tx));
            let answer = |r: Result<(), WriteError>| {
                if let Some(tx) = reply.take() {
                    let _ = tx.send(r);
                }
            };
            let r = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(WriteError::Timeout);
                }
                let cmd = match make() {
                    Ok(c) => c,
                    Err(e) => break Err(e),
                };
                // Registered before the proposal, so a fast fsync cannot be missed.
                let persisted = (ack == Ack::Leader).then(|| tracker.register(&cmd));
                let write = raft.client_write(Command(cmd));
                if ack == Ack::Submitted {
                    answer(Ok(()));
                }
                let attempt = async { Some(write.await) };
                let early = async {
                    if let Some(p) = persisted {
                        p.await;
                        answer(Ok(()));
                    }
                    glommio::timer::sleep(left).await;
                    None
                };
                match future::or(attempt, early).await {
                    None => break Err(WriteError::Timeout),
                    Some(Ok(resp)) => match resp.data {
                        Applied::Done => break Ok(()),
                        Applied::Refused(why) => break Err(WriteError::Refused(why)),
                    },
                    Some(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))))
                        if settling(&f, me) =>
                    {
                        tracing::debug!(target: "raft", reason = ?f.reason, leader = ?f.leader_id, "write refused while leadership settles; retrying");
                        glommio::timer::sleep(RETRY_PAUSE).await;
                    }
                    Some(Err(e)) => break Err(write_error(e)),
                }
            };
            drop(permit);
            answer(r);
        })
        .detach();
        done_rx
            .await
            .unwrap_or_else(|_| Err(WriteError::Failed("raft stopped".into())))
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
            let again = matches!(r, Err(WriteError::NotLeader { .. } | WriteError::Failed(_)));
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
            .map_err(|e| WriteError::Failed(format!("forwarding to node {leader}: {e}")))?;
        decode_outcome(&reply.payload)
    }

    /// The event shard's leadership as of now.
    #[must_use]
    pub fn leadership(&self) -> Leadership {
        let m = self.event.metrics();
        let m = m.borrow_watched();
        let quorum_fresh = m.last_quorum_acked.as_ref().is_some_and(|t| {
            use openraft_rt::Instant as _;
            t.elapsed() < self.election_timeout
        });
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone(), voters.contains(id)))
            .collect();
        let alive = m.heartbeat.as_ref().map(|beats| {
            use openraft_rt::Instant as _;
            beats
                .iter()
                .filter(|(_, at)| {
                    at.as_ref()
                        .is_some_and(|t| t.elapsed() < self.election_timeout)
                })
                .map(|(id, _)| *id)
                .chain([self.id])
                .collect()
        });
        Leadership {
            term: m.current_term,
            leader: m.current_leader,
            leading: m.state == ServerState::Leader
                && m.current_leader == Some(self.id)
                && (quorum_fresh || voters.len() <= 1),
            members,
            applied: m.last_applied.as_ref().map_or(0, |l| l.index),
            last_log: m.last_log_index.unwrap_or(0),
            purged: m.purged.as_ref().map_or(0, |l| l.index),
            alive,
        }
    }

    /// Why a Raft group of this node stopped for good (its log failed a write or an fsync, or
    /// its state machine failed or panicked), if one did: the node can only restart from what
    /// is durable. A group stopped by [`Node::shutdown`] does not count.
    #[must_use]
    pub fn fatal(&self) -> Option<String> {
        let failed = |r: &Result<(), openraft::error::Fatal<TypeConfig>>| match r {
            Err(e) if !matches!(e, openraft::error::Fatal::Stopped) => Some(e.to_string()),
            _ => None,
        };
        failed(&self.event.metrics().borrow_watched().running_state)
            .map(|e| format!("event shard: {e}"))
            .or_else(|| {
                failed(&self.meta.metrics().borrow_watched().running_state)
                    .map(|e| format!("metadata group: {e}"))
            })
    }

    /// Committed event-shard entries this replica's state machine refused since start.
    #[must_use]
    pub fn refused_entries(&self) -> u64 {
        self.event_sm.refused_entries()
    }

    /// Where `node` stands in each group's membership as this node knows it:
    /// `(event shard, metadata group)`.
    #[must_use]
    pub fn standing(&self, node: u64) -> (Standing, Standing) {
        fn of<SM: openraft::storage::RaftStateMachine<TypeConfig>>(
            raft: &openraft::Raft<TypeConfig, SM>,
            node: u64,
        ) -> Standing {
            let m = raft.metrics();
            let m = m.borrow_watched();
            let membership = m.membership_config.membership();
            if membership.voter_ids().any(|v| v == node) {
                Standing::Voter
            } else if membership.get_node(&node).is_some() {
                Standing::Learner
            } else {
                Standing::Absent
            }
        }
        (of(&self.event, node), of(&self.meta, node))
    }

    /// The event shard's last log index (0 for an empty log).
    #[must_use]
    pub fn event_last_log_index(&self) -> u64 {
        self.event
            .metrics()
            .borrow_watched()
            .last_log_index
            .unwrap_or(0)
    }

    /// How far this leader has replicated its event-shard log to `node` (0 if unknown).
    #[must_use]
    pub fn matched_index(&self, node: u64) -> u64 {
        self.event
            .metrics()
            .borrow_watched()
            .replication
            .as_ref()
            .and_then(|r| r.get(&node).cloned().flatten())
            .map_or(0, |id| id.index)
    }

    /// A watch on the event shard's metrics (leader, term, membership, progress).
    #[must_use]
    pub fn watch_event(&self) -> EventWatch {
        let mut rx = self.event.metrics();
        // A clone of openraft's receiver inherits its seen version: mark the current value
        // seen so that `changed` waits for a real change.
        drop(rx.borrow_and_update());
        EventWatch(rx)
    }

    /// Waits until this leader has applied every entry of its log up to its first entry of
    /// the current term (so the store's id high-water mark covers every earlier leader's
    /// ids). Returns the term it verified.
    ///
    /// # Errors
    /// Leadership was lost meanwhile.
    pub async fn confirm_leadership(&self) -> Result<u64, WriteError> {
        let term = self.event.metrics().borrow_watched().current_term;
        self.event
            .ensure_linearizable(ReadPolicy::ReadIndex)
            .await
            .map_err(|e| WriteError::Failed(e.to_string()))?;
        Ok(term)
    }

    /// Stops the peer listener and both groups.
    pub async fn shutdown(&self) {
        self.stop.trigger();
        let _ = self.event.shutdown().await;
        let _ = self.meta.shutdown().await;
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
            Err(WriteError::Failed("boom".into())),
            Err(WriteError::Refused("stale ids".into())),
        ] {
            assert_eq!(decode_outcome(&encode_outcome(&r)), r);
        }
        assert!(decode_outcome(&[]).is_err());
        assert!(decode_outcome(&[1, 0]).is_err());
    }
}
