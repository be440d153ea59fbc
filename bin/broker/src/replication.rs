//! The seam between the standalone and the clustered broker, as every core sees it: where
//! write requests go ([`WriteReq`]: served by the local journal standalone, by the Raft core
//! in a cluster, with the same replies) and who leads ([`View`]). A standalone broker is a
//! one-node cluster that always leads: the services and the dispatcher take one path.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use futureq_core::command::StoreItem;
use futureq_core::metadata::{ClusterView, NodeView};
use futureq_core::refusal::WriteError;
use futureq_core::{AckLevel, EventKey, TopicHash};
use futureq_net::Shutdown;
use futures::channel::oneshot;

use crate::mailbox::Mailbox;

/// Capacity of the write core's request queue.
pub const WRITES_QUEUE_MAX: usize = 4096;

/// A request to the write core (`runtime.raftCore`).
pub enum WriteReq {
    /// Store a publish batch (ids are assigned on the write core); replies with the first id.
    Publish {
        /// Items with `event_id` unset.
        items: Vec<StoreItem>,
        /// The batch's bytes in the node's publish budget, held as long as the write core
        /// holds the items.
        admitted: crate::budget::Admitted,
        /// How long to wait.
        level: AckLevel,
        /// The batch has dedup ids: answer once applied (QUORUM), with what the apply found.
        dedup: bool,
        /// When to give up.
        deadline: Instant,
        /// The ids assigned, and what dedup found.
        reply: oneshot::Sender<Result<Stored, WriteError>>,
    },
    /// Delete keys (ACKs, TTL expiry) through the log.
    Delete {
        /// The keys.
        keys: Vec<EventKey>,
        /// When to give up.
        deadline: Instant,
        /// Done.
        reply: oneshot::Sender<Result<(), WriteError>>,
    },
    /// Cancel stored messages (the `Cancel` RPC), at QUORUM; replies per key whether it was
    /// stored.
    Cancel {
        /// The keys.
        keys: Vec<EventKey>,
        /// When to give up.
        deadline: Instant,
        /// Per key, in order: whether it was stored.
        reply: oneshot::Sender<Result<Vec<bool>, WriteError>>,
    },
    /// A command that takes one event id (a reschedule, a dead letter), at QUORUM; replies
    /// the key it stored, or `None` when its message was not stored.
    WithId {
        /// The command (its `event_id` is assigned by the write core).
        cmd: futureq_core::command::WithId,
        /// When to give up.
        deadline: Instant,
        /// The key stored.
        reply: oneshot::Sender<Result<Option<EventKey>, WriteError>>,
    },
    /// Add a consumer group to the durable registry (a no-op when it is there).
    RegisterGroup {
        /// Topic hash.
        topic_hash: TopicHash,
        /// The group.
        group: String,
        /// When to give up.
        deadline: Instant,
        /// Done.
        reply: oneshot::Sender<Result<(), WriteError>>,
    },
    /// Remove a consumer group from the durable registry (only while leading); replies
    /// whether it was registered.
    DeleteGroup {
        /// Topic hash.
        topic_hash: TopicHash,
        /// The group.
        group: String,
        /// When to give up.
        deadline: Instant,
        /// Whether it was registered.
        reply: oneshot::Sender<Result<bool, WriteError>>,
    },
    /// A membership change asked over gRPC.
    Membership {
        /// What to change.
        op: MembershipOp,
        /// Done.
        reply: oneshot::Sender<Result<(), MembershipError>>,
    },
}

/// Membership changes (`FutureQCluster`).
#[derive(Debug, Clone)]
pub enum MembershipOp {
    /// Add a node to both groups (learner → catch up → voter).
    Join {
        /// Its id.
        node_id: u64,
        /// Its Raft address.
        raft_addr: String,
    },
    /// Remove a node from the event shard, then from the metadata group.
    Leave {
        /// Its id.
        node_id: u64,
    },
    /// Add a non-voting observer of the metadata group.
    JoinMeta {
        /// Its id.
        node_id: u64,
        /// Its Raft address.
        raft_addr: String,
    },
    /// Remove a node from the metadata group.
    LeaveMeta {
        /// Its id.
        node_id: u64,
    },
}

/// [`Replication::request`] over a bare sender (the dispatcher holds one).
///
/// # Errors
/// As [`Replication::request`].
pub async fn request<T>(
    writes: &Mailbox<WriteReq>,
    make: impl FnOnce(oneshot::Sender<Result<T, WriteError>>) -> WriteReq,
) -> Result<T, WriteError> {
    let (reply, rx) = oneshot::channel();
    writes
        .send_async(make(reply))
        .await
        .map_err(|_| WriteError::not_taken("the write core stopped"))?;
    rx.await
        .unwrap_or_else(|_| Err(WriteError::failed("the write core stopped")))
}

/// What a stored batch answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// The id of the batch's first item (its items have consecutive ids).
    pub first_id: u64,
    /// Per item that repeated a remembered dedup id (and was not stored): its id and the key
    /// of the message stored first. Known only for a batch answered once applied.
    pub dups: Vec<(u64, EventKey)>,
}

impl Stored {
    /// The answer for the `len` items from `first_id` of an entry whose apply answered
    /// `answer`.
    #[must_use]
    pub fn of(first_id: u64, len: usize, answer: &futureq_core::command::Answer) -> Stored {
        let dups = match answer {
            futureq_core::command::Answer::Deduplicated(d) => d
                .iter()
                .filter(|(id, _)| (first_id..first_id + len as u64).contains(id))
                .copied()
                .collect(),
            _ => Vec::new(),
        };
        Stored { first_id, dups }
    }
}

/// A server of the write requests: the local journal (standalone) or the Raft core
/// (clustered). [`answer`] routes each request to it and sends the reply.
pub(crate) trait WriteCore {
    /// Stores a batch, assigning its ids at append (log order); the first id.
    async fn publish(
        &self,
        items: Vec<StoreItem>,
        admitted: crate::budget::Admitted,
        level: AckLevel,
        dedup: bool,
        deadline: Instant,
    ) -> Result<Stored, WriteError>;
    /// Deletes keys through the log.
    async fn delete(&self, keys: Vec<EventKey>, deadline: Instant) -> Result<(), WriteError>;
    /// Cancels stored messages through the log (only while leading): per key, whether it was
    /// stored.
    async fn cancel(&self, keys: Vec<EventKey>, deadline: Instant)
        -> Result<Vec<bool>, WriteError>;
    /// Applies a command that takes one event id through the log (only while leading): the
    /// key it stored, or `None` when its message was not stored.
    async fn with_id(
        &self,
        cmd: futureq_core::command::WithId,
        deadline: Instant,
    ) -> Result<Option<EventKey>, WriteError>;
    /// Adds a consumer group to the durable registry (a no-op when it is there).
    async fn register_group(
        &self,
        topic_hash: TopicHash,
        group: String,
        deadline: Instant,
    ) -> Result<(), WriteError>;
    /// Removes a consumer group from the durable registry (only while leading): whether it
    /// was registered.
    async fn delete_group(
        &self,
        topic_hash: TopicHash,
        group: String,
        deadline: Instant,
    ) -> Result<bool, WriteError>;
    /// Changes the membership.
    async fn membership(&self, op: MembershipOp) -> Result<(), MembershipError>;
}

/// Whether `group` is in the durable registry already (a registration then writes nothing).
///
/// # Errors
/// The store could not be read.
pub(crate) async fn group_known(
    store: &futureq_storage::Store,
    topic_hash: TopicHash,
    group: &str,
) -> Result<bool, WriteError> {
    let (store, group) = (store.clone(), group.to_owned());
    glommio::executor()
        .spawn_blocking(move || store.has_group(topic_hash, &group))
        .await
        .map_err(|e| WriteError::not_taken(e.to_string()))
}

/// Serves one request with `core` and sends its reply.
pub(crate) async fn answer(core: &impl WriteCore, req: WriteReq) {
    match req {
        WriteReq::Publish {
            items,
            mut admitted,
            level,
            dedup,
            deadline,
            reply,
        } => {
            // From here on the batch counts in the write path's rate (`crate::budget`).
            admitted.handed_over();
            let _ = reply.send(core.publish(items, admitted, level, dedup, deadline).await);
        }
        WriteReq::Delete {
            keys,
            deadline,
            reply,
        } => {
            let _ = reply.send(core.delete(keys, deadline).await);
        }
        WriteReq::Cancel {
            keys,
            deadline,
            reply,
        } => {
            let _ = reply.send(core.cancel(keys, deadline).await);
        }
        WriteReq::WithId {
            cmd,
            deadline,
            reply,
        } => {
            let _ = reply.send(core.with_id(cmd, deadline).await);
        }
        WriteReq::RegisterGroup {
            topic_hash,
            group,
            deadline,
            reply,
        } => {
            let _ = reply.send(core.register_group(topic_hash, group, deadline).await);
        }
        WriteReq::DeleteGroup {
            topic_hash,
            group,
            deadline,
            reply,
        } => {
            let _ = reply.send(core.delete_group(topic_hash, group, deadline).await);
        }
        WriteReq::Membership { op, reply } => {
            let _ = reply.send(core.membership(op).await);
        }
    }
}

/// Write requests a write core serves at once (each waits for its entry).
pub const REQUESTS_IN_SERVICE_MAX: u64 = 4096;

/// Serves the requests of `rx` until it closes, each in its own task, at most
/// [`REQUESTS_IN_SERVICE_MAX`] at once: beyond it the queue fills and the ingress cores wait
/// (back-pressure) instead of tasks piling up on the write core.
pub(crate) async fn serve_requests<C: WriteCore + Clone + 'static>(
    core: C,
    rx: &flume::Receiver<WriteReq>,
) {
    let in_service = std::rc::Rc::new(glommio::sync::Semaphore::new(REQUESTS_IN_SERVICE_MAX));
    while let Ok(req) = rx.recv_async().await {
        let Ok(permit) = std::rc::Rc::clone(&in_service)
            .acquire_static_permit(1)
            .await
        else {
            break;
        };
        let core = core.clone();
        glommio::spawn_local(async move {
            answer(&core, req).await;
            drop(permit);
        })
        .detach();
    }
}

/// Why a membership change did not happen.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// A standalone broker has no membership.
    #[error("this broker is standalone (cluster.enabled is false): no membership to change")]
    Standalone,
    /// Only the leader changes the membership.
    #[error("node is not the cluster leader{}", leader_text(leader_addr))]
    NotLeader {
        /// The leader's client address ("" if unknown).
        leader_addr: String,
    },
    /// A step of the change failed (the steps before it stay done; a retry does the rest).
    #[error("{step}: {cause}")]
    Step {
        /// What was being done.
        step: &'static str,
        /// Why it failed.
        cause: WriteError,
    },
    /// A joining node did not catch up in time (it stays a learner; a retry goes on).
    #[error("node {node_id} did not catch up within {within:?}")]
    CatchUp {
        /// The node.
        node_id: u64,
        /// How long it had.
        within: std::time::Duration,
    },
    /// The write core stopped.
    #[error("server is shutting down")]
    Stopped,
}

fn leader_text(addr: &str) -> String {
    if addr.is_empty() {
        " (leader unknown)".into()
    } else {
        format!("; leader: {addr}")
    }
}

/// Who leads, as every core may read it.
#[derive(Clone, Default)]
pub struct View {
    /// This node leads the event shard and may take clients (standalone: always).
    pub leading: bool,
    /// While `leading`: when it ends unless the Raft core hears a quorum again (`None`: no
    /// bound: standalone, or a single voter). [`Replication::leading`] reads it with the
    /// caller's clock: a Raft core that stops running cannot stretch it.
    pub leading_until: Option<Instant>,
    /// The leader this node knows of.
    pub leader_id: Option<u64>,
    /// The leader's client address ("" if unknown).
    pub leader_addr: String,
    /// The event shard's current Raft term as this node knows it (standalone: 0).
    pub term: u64,
    /// What `GetClusterInfo` answers (`None` before the topology is known).
    pub info: Option<ClusterView>,
    /// On the leader: the members it heard from within an election timeout (`None`: only
    /// this node is known alive).
    pub alive: Option<BTreeSet<u64>>,
    /// Fires when the leadership that `leading` describes ends (standalone: never).
    pub lost: Shutdown,
    /// `leading` and the lease held: deliveries may go out (standalone: always). A lapse in
    /// the same term keeps `leading` and holds deliveries (see
    /// `futureq_raft::node::Leadership::lease`).
    pub lease: bool,
    /// While `lease`: when it ends, as `leading_until` ([`Replication::lease`]).
    pub lease_until: Option<Instant>,
    /// Fires when the lease is back after the lapse during which this view was made; never
    /// fired while `lease` is false (see [`View::set_lease`]).
    pub lease_back: Shutdown,
}

impl View {
    /// Sets `lease`. `lease_back` is a new signal when the lease goes, fired when it is back:
    /// a stream that waits for the lease never finds the signal of an earlier lapse fired
    /// while the lease is still out (it would go round without waiting).
    pub(crate) fn set_lease(&mut self, lease: bool) {
        if self.lease && !lease {
            self.lease_back = Shutdown::new();
        } else if !self.lease && lease {
            self.lease_back.trigger();
        }
        self.lease = lease;
    }
}

/// Until when a flag holds, as any thread may read it with its own clock: 0 never,
/// `u64::MAX` always, else nanoseconds since [`Until::base`] (an instant before it counts
/// as 1: already past).
struct Until(AtomicU64);

impl Until {
    const NEVER: u64 = 0;
    const ALWAYS: u64 = u64::MAX;

    fn new(holds: bool, until: Option<Instant>) -> Until {
        Until(AtomicU64::new(Self::encode(holds, until)))
    }

    /// The instant every `Until` counts from (the first use).
    fn base() -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    fn nanos(t: Instant) -> u64 {
        let since = t.saturating_duration_since(Self::base()).as_nanos();
        u64::try_from(since).unwrap_or(Self::ALWAYS - 1).max(1)
    }

    fn encode(holds: bool, until: Option<Instant>) -> u64 {
        match (holds, until) {
            (false, _) => Self::NEVER,
            (true, None) => Self::ALWAYS,
            (true, Some(t)) => Self::nanos(t),
        }
    }

    fn store(&self, holds: bool, until: Option<Instant>) {
        self.0.store(Self::encode(holds, until), Ordering::Release);
    }

    /// Whether the flag holds now.
    fn holds(&self) -> bool {
        match self.0.load(Ordering::Acquire) {
            Self::NEVER => false,
            Self::ALWAYS => true,
            until => Self::nanos(Instant::now()) < until,
        }
    }
}

/// The handle every core holds; `writes` is the write core's request queue
/// ([`WRITES_QUEUE_MAX`] deep).
///
/// Reads are cheap: [`Replication::leading`] and [`Replication::lease`] are one atomic load
/// and a clock read, [`Replication::view`] an `Arc` clone under a read lock (the view is
/// replaced, never changed in place).
pub struct Replication {
    writes: Mailbox<WriteReq>,
    leading: Until,
    lease: Until,
    view: RwLock<Arc<View>>,
}

impl Replication {
    /// A standalone broker: a one-node topology that always leads. Returns the handle and
    /// the write core's end of the request queue.
    #[must_use]
    pub fn standalone(
        node_id: u64,
        grpc_advertise: &str,
        writes: Mailbox<WriteReq>,
    ) -> Arc<Replication> {
        let info = ClusterView {
            leader_id: node_id,
            leader_addr: grpc_advertise.to_owned(),
            nodes: vec![NodeView {
                node_id,
                address: grpc_advertise.to_owned(),
                raft_address: String::new(),
                is_leader: true,
                is_voter: true,
            }],
        };
        let view = View {
            leading: true,
            leading_until: None,
            leader_id: Some(node_id),
            leader_addr: grpc_advertise.to_owned(),
            term: 0,
            info: Some(info),
            alive: None,
            lost: Shutdown::new(),
            lease: true,
            lease_until: None,
            lease_back: Shutdown::new(),
        };
        Self::new(view, writes)
    }

    /// A cluster node: not leading until the Raft core says so.
    #[must_use]
    pub fn clustered(writes: Mailbox<WriteReq>) -> Arc<Replication> {
        Self::new(View::default(), writes)
    }

    fn new(view: View, writes: Mailbox<WriteReq>) -> Arc<Replication> {
        let r = Replication {
            writes,
            leading: Until::new(view.leading, view.leading_until),
            lease: Until::new(view.lease, view.lease_until),
            view: RwLock::new(Arc::new(view)),
        };
        Arc::new(r)
    }

    /// Where write requests go.
    #[must_use]
    pub fn writes(&self) -> &Mailbox<WriteReq> {
        &self.writes
    }

    /// Sends the request `make` builds to the write core and waits for its reply.
    ///
    /// # Errors
    /// The write's failure; [`WriteError::Failed`] when the write core stopped.
    pub async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, WriteError>>) -> WriteReq,
    ) -> Result<T, WriteError> {
        request(&self.writes, make).await
    }

    /// Whether this node leads (standalone: always): the view says so and its
    /// `leading_until` is still ahead.
    #[must_use]
    pub fn leading(&self) -> bool {
        self.leading.holds()
    }

    /// Whether this node leads and holds its lease: deliveries may go out (standalone:
    /// always). As [`Replication::leading`], with `lease_until`.
    #[must_use]
    pub fn lease(&self) -> bool {
        self.lease.holds()
    }

    /// The current view.
    #[must_use]
    pub fn view(&self) -> Arc<View> {
        Arc::clone(
            &self
                .view
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// The leader's client address ("" if unknown, or if the view still names this node
    /// but its leadership ran out: the Raft core has not looked since, and a client sent
    /// here again would only be refused again).
    #[must_use]
    pub fn leader_addr(&self) -> String {
        self.leader().1
    }

    /// The leader's node id and client address from one view, as
    /// [`Replication::leader_addr`] names it (`None` and "" if unknown, or if this node's
    /// leadership ran out).
    #[must_use]
    pub fn leader(&self) -> (Option<u64>, String) {
        let v = self.view();
        if v.leading && !self.leading() {
            return (None, String::new());
        }
        (v.leader_id, v.leader_addr.clone())
    }

    /// Replaces the view (the Raft core only).
    pub(crate) fn update(&self, f: impl FnOnce(&mut View)) {
        let mut g = self
            .view
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v = View::clone(&g);
        f(&mut v);
        self.leading.store(v.leading, v.leading_until);
        self.lease.store(v.lease, v.lease_until);
        *g = Arc::new(v);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Issue 29: the flags held until the Raft core looked again, however late that was.
    #[test]
    fn leading_and_the_lease_end_at_their_deadline_with_no_update() {
        let (writes, _rx) = Mailbox::bounded(1, 0, Arc::default());
        let r = Replication::clustered(writes);
        assert!(!r.leading() && !r.lease());
        let now = Instant::now();
        r.update(|v| {
            v.leading = true;
            v.leading_until = Some(now + Duration::from_secs(5));
            v.leader_id = Some(1);
            v.leader_addr = "me:1".into();
            v.set_lease(true);
            v.lease_until = Some(now + Duration::from_millis(600));
        });
        assert!(r.leading() && r.lease());
        assert_eq!(r.leader(), (Some(1), "me:1".to_owned()));
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            r.leading() && !r.lease(),
            "the lease ended, leading not yet"
        );
        r.update(|v| v.leading_until = Some(now + Duration::from_millis(200)));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!r.leading() && !r.lease());
        assert_eq!(
            r.leader(),
            (None, String::new()),
            "not named the leader once it ran out"
        );
        r.update(|v| v.leading_until = None);
        assert!(r.leading(), "one voter: no bound");
        r.update(|v| v.leading = false);
        assert!(!r.leading());
    }

    /// Review of issue 29: the broker's stop took the lease away without a new signal, so a
    /// consumer stream waiting for the lease found the last lapse's one fired and went round
    /// without waiting (a spinning executor).
    #[test]
    fn the_lease_back_signal_is_never_fired_while_the_lease_is_out() {
        let mut v = View::default();
        v.set_lease(true);
        v.set_lease(false);
        let first = v.lease_back.clone();
        assert!(!first.is_triggered());
        v.set_lease(true);
        assert!(first.is_triggered(), "fired when the lease is back");
        v.set_lease(false);
        assert!(!v.lease_back.is_triggered(), "a new one for the next lapse");
        let waiting = v.lease_back.clone();
        v.set_lease(false);
        assert!(!waiting.is_triggered());
        v.set_lease(true);
        assert!(waiting.is_triggered());
    }
}
