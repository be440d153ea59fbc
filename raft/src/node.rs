//! One cluster node: the event shard and the metadata group on this (the Raft) core, their
//! logs on io_uring, the peer listener, and what the broker asks of them — proposals with the
//! three ack levels, forwarded metadata proposals, membership changes and leadership status.
//!
//! Jobs: this file starts the node and answers leadership questions; `config` holds its
//! settings, sizes and start errors; `write` the vocabulary of an event-shard write (ack
//! levels, proposals, stages); `open` opens the logs and the Raft configuration; `changes`
//! runs requests on a group this node leads, retried while leadership settles; `request` is
//! the wire format of forwarded requests; `forward` sends them to a group's leader over the
//! peer link and serves the ones forwarded here.
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
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::persisted::PersistTracker;
use futureq_core::command::Answer;
use futureq_core::metadata::Member;
pub use futureq_core::refusal::WriteError;
use futureq_net::peer_link::serve_peers;
use futureq_net::Shutdown;
use futureq_storage::Store;
use futures_lite::future;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ReadPolicy, ServerState, SnapshotPolicy};

mod changes;
mod config;
mod forward;
mod open;
mod request;
mod write;

use self::config::RETRY_PAUSE;
pub use self::config::{
    EventRaft, MetaRaft, NodeConfig, NodeError, META_SNAPSHOT_ENTRIES, PROPOSALS_MAX, RPC_TIMEOUT,
    SEGMENT_BYTES,
};
pub use self::request::{Forward, EVENT_GROUP, KIND_FORWARD, META_GROUP};
pub use self::write::{outcome_after, Ack, EventWrite, Proposal};

use self::changes::{settling, write_error};
pub use self::open::EVENT_LOG_BYTES_MAX;
use self::open::{bound_log_bytes, check_not_behind_purge, open_log, raft_config};
pub use self::open::{EVENT_LOG_CACHE_BYTES, META_LOG_CACHE_BYTES};
use crate::metadata_sm::MetaStateMachine;
use crate::network::{PeerNetwork, PEER_FRAME_MAX, SNAPSHOT_BYTES_MAX};
use crate::snapshot::Receiving;
use crate::state_machine::{EventStateMachine, OnApplied};
use crate::types::{Applied, Command, TypeConfig};

/// What the broker needs to know about the event shard's leadership.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    /// The current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader: Option<u64>,
    /// This node leads `term` and a quorum acknowledged an RPC it sent within the longest
    /// election timeout less two heartbeats (13 rtt): it takes clients and writes (a write
    /// commits only with a quorum). That quorum's members grant no vote until the longest
    /// election timeout after they received it (openraft's leader lease), so no other node
    /// can lead before this one stops (the two heartbeats cover clock reads and scheduling;
    /// other cores read `leading_until`, not this flag). A leader cut off from its quorum
    /// stops serving, the CheckQuorum equivalent.
    pub leading: bool,
    /// `leading`, and a quorum acknowledged it within one election timeout (the lease): it
    /// may deliver. Before a follower's election timer can run out no other node leads; past
    /// it one may, and a deposed leader must not hand out what the new one will deliver.
    /// `leading` without the lease is a lapse in the same term: the followers answer late
    /// (openraft answers even a heartbeat only once the write before it is flushed, so a
    /// stalled disk on the followers silences them), or this node is cut off.
    pub lease: bool,
    /// While `leading`: when it ends unless a quorum acknowledges a later RPC (`None`: one
    /// voter, no quorum to hear). Other threads compare it with their own clock, so a Raft
    /// core that stops running cannot stretch its leadership by not looking again.
    pub leading_until: Option<Instant>,
    /// While `lease`: when it ends, as `leading_until`.
    pub lease_until: Option<Instant>,
    /// Members of the event shard.
    pub members: Vec<Member>,
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
    /// How long a leader serves with no quorum heard: the longest election timeout less two
    /// heartbeats (see [`Leadership::leading`]).
    serve_quiet_max: Duration,
    proposals: Rc<glommio::sync::Semaphore>,
    event_sm: EventStateMachine,
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
        let tracker = PersistTracker::default();
        let (event_log, meta_log) = open_logs(cfg, &store, &tracker).await?;
        let (event_cfg, meta_cfg) = group_configs(cfg)?;
        let election_timeout = Duration::from_millis(event_cfg.election_timeout_min);
        // Two heartbeats short of it: a margin for clock reads and scheduling (other cores
        // compare `leading_until` with their own clocks).
        let serve_quiet_max = Duration::from_millis(
            event_cfg
                .election_timeout_max
                .saturating_sub(2 * event_cfg.heartbeat_interval),
        );
        // A restarted peer must hear from the leader well within its election timeout
        // (10 rtt): retry links to a down peer at least every 2 rtt.
        let network = PeerNetwork::new(EVENT_GROUP, RPC_TIMEOUT)
            .with_reconnect_max(cfg.rtt * 2)
            .with_secret(cfg.secret.clone())
            .with_tls(cfg.tls.clone())
            .with_bind(Some(cfg.raft_listen.ip()))
            .in_current_queue();
        let event_sm = EventStateMachine::new(store, on_applied);
        let bounded_log = event_log.clone();
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
        let meta_sm = MetaStateMachine::open(meta_dir.clone()).map_err(|cause| NodeError::Log {
            path: meta_dir.display().to_string(),
            cause,
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
        let node = Node {
            id: cfg.node_id,
            event,
            meta,
            meta_sm,
            tracker,
            network,
            stop: Shutdown::new(),
            election_timeout,
            serve_quiet_max,
            proposals: Rc::new(glommio::sync::Semaphore::new(PROPOSALS_MAX)),
            event_sm,
        };
        node.serve_peer_port(cfg)?;
        glommio::spawn_local(bound_log_bytes(
            node.event.clone(),
            bounded_log,
            cfg.log_bytes_max,
            node.stop.clone(),
        ))
        .detach();
        Ok(node)
    }

    /// Listens on `cluster.raft.listen` for the peers' links: Raft RPCs to their group,
    /// forwarded requests to this node.
    fn serve_peer_port(&self, cfg: &NodeConfig) -> Result<(), NodeError> {
        let listener =
            glommio::net::TcpListener::bind(cfg.raft_listen).map_err(|e| NodeError::Listen {
                addr: cfg.raft_listen,
                reason: e.to_string(),
            })?;
        // Snapshot transfers are spooled beside each group's log.
        let receiving = |dir: PathBuf, group, max_bytes| {
            Receiving::new(&dir, group, max_bytes).map_err(|cause| NodeError::Log {
                path: dir.display().to_string(),
                cause,
            })
        };
        let handler = self.peer_handler(
            receiving(cfg.data_dir.join("event"), EVENT_GROUP, SNAPSHOT_BYTES_MAX)?,
            receiving(
                cfg.data_dir.join("meta"),
                META_GROUP,
                crate::metadata_sm::META_SNAPSHOT_MAX,
            )?,
        );
        glommio::spawn_local(serve_peers(
            listener,
            handler,
            PEER_FRAME_MAX,
            futureq_net::peer_link::PeerAuth {
                secret: cfg.secret.clone(),
                tls: cfg.tls.clone(),
            },
            self.stop.clone(),
        ))
        .detach();
        Ok(())
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
    /// until `deadline` (see [`Node::propose_event`]). A LEADER ack resolves when the leader's
    /// log fsynced the entry named by the proposal's [`PersistKey`], or else at commit. A
    /// NO_ACK write is not retried: its answer named the ids of its first attempt.
    ///
    /// # Errors
    /// [`WriteError`]; [`WriteError::Refused`] when the state machine refused the committed
    /// entry (nothing of it applied).
    pub async fn write_event(
        &self,
        mut make: impl FnMut() -> Result<Proposal, WriteError> + 'static,
        ack: Ack,
        deadline: Instant,
    ) -> Result<Answer, WriteError> {
        let mut attempts = 0u32;
        let make = move || {
            attempts += 1;
            if ack == Ack::Submitted && attempts > 1 {
                return Err(WriteError::NotLeader { leader: None });
            }
            make()
        };
        self.propose_event(make, ack == Ack::Leader, deadline)
            .await?
            .until(ack)
            .await
    }

    /// Proposes an event-shard command on this node (the leader) until `deadline` and
    /// returns its stages as they come: handed to Raft, fsynced in this leader's log (when
    /// `persisted` is asked for and the proposal has a [`PersistKey`]), and its outcome.
    ///
    /// `make` builds the command at the moment of proposal: it is called right before each
    /// attempt is handed to Raft, with no await in between, so whatever it assigns (event
    /// ids) follows log order on this leader; it refuses (e.g. leadership not confirmed in
    /// the current term) by returning an error, which ends the write. A refusal by Raft while
    /// leadership settles calls it again (it may then build a smaller command, or refuse).
    ///
    /// At most [`PROPOSALS_MAX`] proposals are outstanding (proposed, not yet applied), whatever
    /// their ack level: LEADER and NO_ACK acks return before the commit, and without this
    /// bound a fast producer would pile up entries faster than followers take them (the
    /// leader then misses heartbeats and loses leadership). This waits for a place.
    ///
    /// # Errors
    /// [`WriteError::Timeout`] when no place came before `deadline`.
    pub async fn propose_event(
        &self,
        mut make: impl FnMut() -> Result<Proposal, WriteError> + 'static,
        persisted: bool,
        deadline: Instant,
    ) -> Result<EventWrite, WriteError> {
        use futures::channel::oneshot;
        let permit = {
            let acquire = async { Some(Rc::clone(&self.proposals).acquire_static_permit(1).await) };
            let timer = async {
                glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
                None
            };
            match future::or(acquire, timer).await {
                Some(Ok(p)) => p,
                Some(Err(e)) => return Err(WriteError::not_taken(e.to_string())),
                None => return Err(WriteError::Timeout),
            }
        };
        let (submitted_tx, submitted) = oneshot::channel();
        let (persisted_tx, persisted_rx) = if persisted {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let (done_tx, done) = oneshot::channel();
        let (raft, me, tracker) = (self.event.clone(), self.id, self.tracker.clone());
        glommio::spawn_local(async move {
            let mut submitted_tx = Some(submitted_tx);
            let persisted_tx = std::cell::Cell::new(persisted_tx);
            let r = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(WriteError::Timeout);
                }
                let proposal = match make() {
                    Ok(p) => p,
                    Err(e) => break Err(e),
                };
                // Registered before the proposal, so a fast fsync cannot be missed.
                let persist_key = proposal.persist.filter(|_| {
                    let asked = persisted_tx.take();
                    let open = asked.is_some();
                    persisted_tx.set(asked);
                    open
                });
                let on_disk = persist_key.map(|k| tracker.register(k));
                let write = raft.client_write(Command(proposal.command));
                if let Some(tx) = submitted_tx.take() {
                    let _ = tx.send(());
                }
                let attempt = async { Some(write.await) };
                // The deadline runs whether or not the persist key ever fires (an entry cut
                // from this log, a hook that never sees it): the write and its permit are
                // never held past it.
                let early = async {
                    let persist = async {
                        if let Some(p) = on_disk {
                            p.await;
                            if let Some(tx) = persisted_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        future::pending::<()>().await;
                    };
                    future::or(persist, glommio::timer::sleep(left)).await;
                    None
                };
                match future::or(attempt, early).await {
                    None => break Err(WriteError::Timeout),
                    Some(Ok(resp)) => match resp.data {
                        Applied::Done(answer) => break Ok(answer),
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
            let _ = done_tx.send(r);
        })
        .detach();
        Ok(EventWrite {
            submitted,
            persisted: persisted_rx,
            done,
        })
    }

    /// The event shard's leadership as of now.
    #[must_use]
    pub fn leadership(&self) -> Leadership {
        let m = self.event.metrics();
        let m = m.borrow_watched();
        // Read before `quiet`, so that `now - quiet` is no later than the quorum's ack: the
        // deadlines below err early, never late.
        let now = Instant::now();
        let quiet = m.last_quorum_acked.as_ref().map(|t| {
            use openraft_rt::Instant as _;
            t.elapsed()
        });
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let leads = m.state == ServerState::Leader && m.current_leader == Some(self.id);
        let within = |bound: Duration| voters.len() <= 1 || quiet.is_some_and(|q| q < bound);
        let until = |bound: Duration| {
            (leads && voters.len() > 1)
                .then(|| quiet.map(|q| now + bound.saturating_sub(q)))
                .flatten()
        };
        let members = membership
            .nodes()
            .map(|(id, n)| Member {
                node_id: *id,
                raft_addr: n.addr.clone(),
                voter: voters.contains(id),
            })
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
            leading: leads && within(self.serve_quiet_max),
            lease: leads && within(self.election_timeout),
            leading_until: until(self.serve_quiet_max),
            lease_until: until(self.election_timeout),
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

    /// Whether both groups hold a membership (a node that joins has none until the leader's
    /// first entries reach it; one that left still has the membership without it).
    #[must_use]
    pub fn knows_membership(&self) -> bool {
        self.event
            .metrics()
            .borrow_watched()
            .membership_config
            .log_id()
            .is_some()
            && self
                .meta
                .metrics()
                .borrow_watched()
                .membership_config
                .log_id()
                .is_some()
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
            .map_err(|e| WriteError::not_taken(e.to_string()))?;
        Ok(term)
    }

    /// Stops the peer listener and both groups.
    pub async fn shutdown(&self) {
        self.stop.trigger();
        let _ = self.event.shutdown().await;
        let _ = self.meta.shutdown().await;
    }
}

/// A group's log on disk.
type GroupLog = crate::log_store::LogStore<self::open::DiskIo>;
/// A group's Raft configuration.
type RaftConfig = std::sync::Arc<openraft::Config>;

/// Opens both groups' logs; the event log's persist hook feeds `tracker` (LEADER acks), and
/// a store behind the event log's purge point refuses the start.
async fn open_logs(
    cfg: &NodeConfig,
    store: &Store,
    tracker: &PersistTracker,
) -> Result<(GroupLog, GroupLog), NodeError> {
    let t = tracker.clone();
    let hook: futureq_storage::log::segmented::PersistHook =
        Box::new(move |entry| t.persisted(entry));
    let mut event_log = open_log(
        cfg.data_dir.join("event"),
        (cfg.segment_bytes, EVENT_LOG_CACHE_BYTES),
        hook,
    )
    .await?;
    check_not_behind_purge(&mut event_log, store, &cfg.data_dir).await?;
    let meta_log = open_log(
        cfg.data_dir.join("meta"),
        (SEGMENT_BYTES, META_LOG_CACHE_BYTES),
        Box::new(|_| {}),
    )
    .await?;
    Ok((event_log, meta_log))
}

/// The Raft configurations of the event shard and of the metadata group.
fn group_configs(cfg: &NodeConfig) -> Result<(RaftConfig, RaftConfig), NodeError> {
    let event = raft_config(
        "futureq-event",
        cfg.rtt,
        SnapshotPolicy::LogsSinceLast(cfg.snapshot_entries),
        cfg.compaction_overhead,
    )?;
    let meta = raft_config(
        "futureq-meta",
        cfg.rtt,
        SnapshotPolicy::LogsSinceLast(META_SNAPSHOT_ENTRIES),
        META_SNAPSHOT_ENTRIES,
    )?;
    Ok((event, meta))
}
