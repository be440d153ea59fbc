//! Clustered mode: the task on the Raft core (`runtime.raftCore`) that owns this node's two
//! Raft groups, and what the other cores share with it.
//!
//! Ingress cores never touch openraft: they read the [`Replication`] view (thread-safe) and
//! send [`WriteReq`]s over a bounded channel; the Raft core answers over oneshots.
//!
//! Jobs: this file starts the node and serves the write core's requests; `core` holds the
//! Raft core's state and tracks leadership (confirming a term, publishing the view and the
//! topology); `coalesce` groups publishes into entries; `ids` decides who may assign event ids (a pure state machine);
//! `membership` joins this node through seeds and runs the leader's membership changes.
//! Writes a follower takes are forwarded to the leader by `futureq_raft::node`.
//!
//! # Invariants
//! - Event ids are assigned here only (see `ids`): ids never regress across failovers and
//!   restarts.
//! - Clients are served only while this node leads with a fresh quorum; when it stops, the
//!   [`crate::replication::View::lost`] signal of that leadership fires and every consumer stream of it ends.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futureq_core::command::StoreItem;
use futureq_core::command::{
    encode_cancel, encode_delete, encode_delete_group, encode_register_group, Answer, Cancel,
    DeleteBatch, DeleteGroup, RegisterGroup, WithId,
};
use futureq_core::metadata::{MetaCommand, NodeAddr};
use futureq_core::{AckLevel, EventKey, TopicHash};
use futureq_net::Shutdown;
use futureq_raft::node::{
    Ack, Forward, Node, NodeConfig, NodeError, Proposal, Standing, WriteError,
};
use futureq_storage::Store;
use futures_lite::future;

mod coalesce;
mod core;
mod ids;
mod membership;

pub use membership::{secret_header, JoinError, SECRET_HEADER};

use self::core::{unanswered, Core, Pending, META_DEADLINE};
use self::ids::Ids;
use self::membership::join;
use crate::config::ClusterSettings;
use crate::fatal::FatalReporter;
use crate::metrics::Metrics;
use crate::replication::{
    answer, group_known, serve_requests, MembershipError, MembershipOp, Replication, Stored,
    WriteCore, WriteReq,
};

/// How often leadership is re-checked when nothing changes (the quorum-freshness check
/// needs a clock, not an event).
const WATCH_INTERVAL: Duration = Duration::from_millis(20);
/// Pause between attempts to register this node's client address.
const REGISTER_RETRY: Duration = Duration::from_secs(2);

/// Why a cluster node did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The Raft node did not start.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// Initializing the groups failed.
    #[error("bootstrap failed: {0}")]
    Bootstrap(NodeError),
    /// Nothing says how to become a member.
    #[error(
        "a fresh cluster node needs cluster.raft.initialMembers or cluster.joinSeeds (or --join)"
    )]
    NoMembership,
    /// A Raft group of this node stopped for good while it was joining (its log or its state
    /// machine failed: a full disk, an I/O error); see [`Node::fatal`].
    #[error("{0}")]
    Failed(String),
    /// No seed added this node.
    #[error("{cause} (this node's Raft data in {} is kept: the next start asks again)", data_dir.display())]
    Join {
        /// Why.
        cause: JoinError,
        /// `cluster.raft.dataDir`.
        data_dir: std::path::PathBuf,
    },
}

/// How often a joining node looks whether its Raft groups still run.
const FATAL_POLL: Duration = Duration::from_millis(100);

/// Starts the node: opens the logs, starts both groups and the peer listener, bootstraps
/// from `cluster.raft.initialMembers` (idempotent: only groups not yet initialized) or joins
/// through `cluster.joinSeeds` (a restart with local Raft data finishes an unfinished join in
/// the background). Raft data is never wiped. Returns once the node runs; [`serve`] then
/// drives it.
///
/// # Errors
/// See [`StartError`].
pub async fn start(
    cfg: &ClusterSettings,
    grpc_advertise: &str,
    store: Store,
    on_applied: futureq_raft::state_machine::OnApplied,
) -> Result<Node, StartError> {
    let node_cfg = NodeConfig {
        node_id: cfg.node_id,
        raft_listen: cfg.raft_listen,
        raft_advertise: cfg.raft_advertise.clone(),
        data_dir: cfg.data_dir.clone(),
        rtt: cfg.rtt,
        snapshot_entries: cfg.snapshot_entries,
        compaction_overhead: cfg.compaction_overhead,
        secret: cfg.secret.clone(),
        tls: cfg.tls.clone(),
        log_bytes_max: futureq_raft::node::EVENT_LOG_BYTES_MAX,
        segment_bytes: futureq_raft::node::SEGMENT_BYTES,
    };
    if cfg.secret.is_open() {
        tracing::warn!(target: "raft", "cluster.secret is not set: anyone who reaches cluster.raft.listen or the gRPC port can join nodes, remove them or talk Raft to this node; set cluster.secret (or cluster.secretFile) on every node");
    }
    let node = Node::start(&node_cfg, store, on_applied).await?;
    // Never wipe Raft data here: once a bootstrap or join may have begun, other nodes may
    // count this one as a member (its vote and log are part of their quorums). Bootstrap and
    // join are idempotent instead, and a start with local data finishes what is missing.
    let restart = node.has_state().await;
    if restart {
        tracing::info!(target: "raft", node = cfg.node_id, "restarting with local Raft data");
    }
    if !cfg.initial_members.is_empty() {
        // Initializes the groups that are not yet (an aborted bootstrap left one behind).
        if let Err(e) = node.bootstrap(&cfg.initial_members).await {
            node.shutdown().await;
            return Err(StartError::Bootstrap(e));
        }
    } else if cfg.join_seeds.is_empty() {
        if !restart {
            node.shutdown().await;
            return Err(StartError::NoMembership);
        }
    } else if !restart {
        // The join waits for this node to catch up (minutes with a large store): a Raft group
        // that fails meanwhile (a snapshot install that filled the disk) ends the start
        // instead of leaving a node with a dead Raft core waiting out the join.
        let joined = async {
            join(cfg, grpc_advertise)
                .await
                .map_err(|cause| StartError::Join {
                    cause,
                    data_dir: cfg.data_dir.clone(),
                })
        };
        let failed = async {
            loop {
                if let Some(e) = node.fatal() {
                    return Err(StartError::Failed(e));
                }
                glommio::timer::sleep(FATAL_POLL).await;
            }
        };
        if let Err(e) = future::or(joined, failed).await {
            node.shutdown().await;
            return Err(e);
        }
    } else if !node.knows_membership()
        || matches!(
            node.standing(cfg.node_id),
            (Standing::Learner, _) | (_, Standing::Learner)
        )
    {
        // A join that did not finish (its reply was lost, or this node stopped mid-join,
        // maybe before any membership reached it: a group that failed on its first write).
        membership::finish_join(cfg, grpc_advertise, &node);
    }
    Ok(node)
}

/// Drives the node until shutdown: leadership tracking, id assignment, the metadata
/// service (address registration, topology), and the requests of the other cores. Stops the
/// node after `dispatcher_done` fires (its last deletes go through Raft) or 5 s.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    node: Node,
    cfg: ClusterSettings,
    grpc_advertise: String,
    cluster: Arc<Replication>,
    rx: flume::Receiver<WriteReq>,
    store: Store,
    shutdown: Shutdown,
    dispatcher_done: Shutdown,
    metrics: Arc<Metrics>,
    fatal: FatalReporter,
) {
    // As many as the write core's requests in service; a publish that timed out is dropped
    // when its group is formed.
    let (publishes, pending) = flume::bounded(coalesce::QUEUE_MAX);
    let core = Rc::new(Core {
        node: node.clone(),
        cfg,
        grpc_advertise,
        cluster,
        store,
        ids: RefCell::new(Ids::default()),
        publishes,
        publishing_topology: Cell::new(false),
        metrics,
        fatal,
    });
    core.metrics.raft.clustered.store(true, Ordering::Relaxed);
    glommio::spawn_local(coalesce::run(Rc::downgrade(&core), pending)).detach();
    let watcher = crate::task::spawn_owned(watch(Rc::clone(&core), shutdown.clone()));
    glommio::spawn_local(watch_stalls(Arc::clone(&core.metrics), shutdown.clone())).detach();
    glommio::spawn_local(register(Rc::clone(&core), shutdown.clone())).detach();
    let requests = serve_requests(Rc::clone(&core), &rx);
    future::or(requests, shutdown.wait()).await;
    // Serve what is still queued (the dispatcher's final delete flush) for a while.
    let drain = async {
        loop {
            let req = future::or(async { rx.recv_async().await.ok() }, async {
                dispatcher_done.wait().await;
                None
            })
            .await;
            match req {
                Some(req) => {
                    let core = Rc::clone(&core);
                    glommio::spawn_local(async move { answer(&core, req).await }).detach();
                }
                None => break,
            }
        }
    };
    future::or(drain, glommio::timer::sleep(Duration::from_secs(5))).await;
    watcher.await;
    core.cluster.update(|v| {
        v.leading = false;
        v.set_lease(false);
        // Streams ended by the stop name no leader: not this stopping node.
        v.leader_id = None;
        v.leader_addr.clear();
        v.lost.trigger();
    });
    node.shutdown().await;
    // A clean stop leaves the store durable as applied (applies commit without fsync between
    // their periodic durable commits): the next start replays nothing from the Raft log.
    let s = core.store.clone();
    match glommio::executor().spawn_blocking(move || s.sync()).await {
        Ok(()) => tracing::info!(target: "raft", "store synced"),
        Err(e) => {
            tracing::warn!(target: "raft", error = %e, "the store could not be synced at the stop; the next start replays from the Raft log")
        }
    }
    // A log that failed once the shutdown had begun (the watcher no longer looks).
    if let Some(e) = node.fatal() {
        core.fatal.fail("a Raft group", &e);
    }
    tracing::info!(target: "raft", "raft groups stopped");
}

/// Ticks checked for lateness by [`watch_stalls`].
const STALL_TICK: Duration = Duration::from_millis(10);
/// Lateness of a tick that is reported: the Raft core's reactor did not run for this long.
const STALL_REPORT: Duration = Duration::from_millis(100);

/// Warns when the Raft core's reactor was blocked (a tick ran late by [`STALL_REPORT`]):
/// heartbeats stop while it is, and followers start elections after an election timeout.
async fn watch_stalls(metrics: Arc<Metrics>, shutdown: Shutdown) {
    let ticks = async {
        loop {
            let (t, cpu) = (Instant::now(), thread_cpu());
            glommio::timer::sleep(STALL_TICK).await;
            let late = t.elapsed().saturating_sub(STALL_TICK);
            if late >= STALL_REPORT {
                // On CPU for most of it: work that held the reactor (a defect to report);
                // little: the host gave the thread no CPU (overcommitted, paused).
                let cpu_ms = thread_cpu().saturating_sub(cpu).as_millis() as u64;
                metrics.raft.reactor_stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(target: "raft", late_ms = late.as_millis() as u64, cpu_ms, "the Raft core's reactor was blocked; heartbeats were late");
            }
        }
    };
    future::or(ticks, shutdown.wait()).await;
}

/// CPU time this thread used so far.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The Raft core as the write core.
impl WriteCore for Rc<Core> {
    async fn publish(
        &self,
        items: Vec<StoreItem>,
        admitted: crate::budget::Admitted,
        level: AckLevel,
        _dedup: bool,
        deadline: Instant,
    ) -> Result<Stored, WriteError> {
        // Proposed in a group with the publishes that arrive meanwhile (`coalesce`). A batch
        // with dedup ids comes at QUORUM: its answer carries what the apply found.
        let (reply, answered) = futures::channel::oneshot::channel();
        let pending = Pending {
            items,
            admitted,
            level,
            deadline,
            reply,
        };
        let answer = async {
            self.publishes
                .send_async(pending)
                .await
                .map_err(|_| WriteError::not_taken("the write core stopped"))?;
            answered
                .await
                .unwrap_or_else(|_| Err(WriteError::failed("the write core stopped")))
        };
        let timer = async {
            glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
            Err(WriteError::Timeout)
        };
        future::or(answer, timer).await
    }

    async fn delete(&self, keys: Vec<EventKey>, deadline: Instant) -> Result<(), WriteError> {
        let keys: Vec<[u8; futureq_core::KEY_LEN]> = keys.iter().map(|k| k.0).collect();
        if self.leading_now().is_err() {
            // ACKs this node took while it led: the leader deletes them now.
            return self.node.forward_delete(keys, deadline).await;
        }
        Core::propose_while_leading(self, encode_delete(&DeleteBatch { keys }), deadline)
            .await
            .map(drop)
    }

    async fn cancel(
        &self,
        keys: Vec<EventKey>,
        deadline: Instant,
    ) -> Result<Vec<bool>, WriteError> {
        // Never forwarded: the API answers FAILED_PRECONDITION with the leader's address.
        self.leading_now()?;
        let keys = keys.iter().map(|k| k.0).collect();
        match Core::propose_while_leading(self, encode_cancel(&Cancel { keys }), deadline).await? {
            Answer::Cancelled(v) => Ok(v),
            _ => Err(unanswered("cancel")),
        }
    }

    async fn with_id(
        &self,
        cmd: WithId,
        deadline: Instant,
    ) -> Result<Option<EventKey>, WriteError> {
        // Never forwarded, like a cancel.
        self.leading_now()?;
        let core = Rc::clone(self);
        let mut proposed = cmd.clone();
        let make = move || {
            // The command's id is assigned with the proposal, like a store's: ids follow log
            // order.
            let id = core.assign(1)?;
            Ok(Proposal::command(proposed.encode(id).into()))
        };
        let answer = self.node.write_event(make, Ack::Quorum, deadline).await?;
        cmd.stored_key(&answer)
            .ok_or_else(|| unanswered("command with an event id"))
    }

    async fn register_group(
        &self,
        topic_hash: TopicHash,
        group: String,
        deadline: Instant,
    ) -> Result<(), WriteError> {
        self.leading_now()?;
        if group_known(&self.store, topic_hash, &group).await? {
            return Ok(());
        }
        let cmd = encode_register_group(&RegisterGroup {
            topic_hash: topic_hash.0,
            group,
        });
        Core::propose_while_leading(self, cmd, deadline)
            .await
            .map(drop)
    }

    async fn delete_group(
        &self,
        topic_hash: TopicHash,
        group: String,
        deadline: Instant,
    ) -> Result<bool, WriteError> {
        // Never forwarded, like a cancel.
        self.leading_now()?;
        let cmd = encode_delete_group(&DeleteGroup {
            topic_hash: topic_hash.0,
            group,
        });
        match Core::propose_while_leading(self, cmd, deadline).await? {
            Answer::GroupDeleted(found) => Ok(found),
            _ => Err(unanswered("group deletion")),
        }
    }

    async fn membership(&self, op: MembershipOp) -> Result<(), MembershipError> {
        let out = Core::membership(self, &op).await;
        match &out {
            Ok(()) => tracing::info!(target: "raft", ?op, "membership changed"),
            Err(e) => tracing::warn!(target: "raft", ?op, error = %e, "membership change failed"),
        }
        out
    }
}

async fn watch(core: Rc<Core>, shutdown: Shutdown) {
    let mut events = core.node.watch_event();
    while !shutdown.is_triggered() {
        core.tick().await;
        future::or(events.changed(WATCH_INTERVAL), shutdown.wait()).await;
    }
}

/// Registers `api.grpc.advertise` in the metadata group, retrying until it is committed.
async fn register(core: Rc<Core>, shutdown: Shutdown) {
    let id = core.node.id;
    loop {
        if core.node.meta_sm.state().grpc_addrs.get(&id) == Some(&core.grpc_advertise) {
            return;
        }
        let cmd = MetaCommand::RegisterNodeAddr(NodeAddr {
            node_id: id,
            grpc_addr: core.grpc_advertise.clone(),
        })
        .encode();
        match core
            .node
            .meta_request(Forward::Write(cmd), Instant::now() + META_DEADLINE)
            .await
        {
            Ok(()) => {
                tracing::info!(target: "raft", node = id, addr = %core.grpc_advertise, "client address registered");
                return;
            }
            Err(e) => {
                tracing::debug!(target: "raft", error = %e, "address registration failed; retrying")
            }
        }
        if crate::runtime::sleep_or_shutdown(REGISTER_RETRY, &shutdown).await {
            return;
        }
    }
}
