//! The dispatcher task: owns the [`Hub`] on one core and turns its decisions into I/O.
//!
//! It sleeps until the earliest instant with work — a topic's next due message (among topics
//! with consumers), a waiting redelivery, an in-flight deadline, a delete flush — or until a
//! command arrives (a consumer, an ack, a commit that stored an earlier message). Topics
//! without consumers are never scanned, and a scan reads only keys of due buckets.
//!
//! Jobs: this file runs the dispatcher's loop (commands, passes, delete flushes, dead
//! letters, group deletions); `inbox` is what other tasks and threads send it; `sweeper`
//! deletes messages whose TTL passed; `gauges` refreshes the per-topic gauges.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futureq_core::command::{DeadLetter, WithId};
use futureq_core::hub::{Hub, HubConfig};
use futureq_core::refusal::WriteError;
use futureq_core::EventKey;
use futureq_net::Shutdown;
use futureq_storage::StoreService;
use futures::channel::oneshot;
use futures_lite::future;

mod gauges;
mod inbox;
mod sweeper;

pub use self::gauges::refresh_topic_gauges;
pub use self::inbox::{
    applied_to_hub, ConsumerSink, GroupDeleted, HubCmd, RegisterRefused, HUB_QUEUE_MAX,
};
pub use self::sweeper::sweep_ttl;
use crate::clock::{instant_of, now_ms};
use crate::metrics::Metrics;
use crate::replication::WriteReq;

/// Pending deletes that trigger a flush before the interval ends.
pub const DELETE_FLUSH_EARLY: usize = 16_384;
/// Delay before retrying after a failed scan.
const SCAN_RETRY: Duration = Duration::from_millis(100);
/// How long a dead letter whose command failed waits before its recipient gives up again.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);
/// Dead-letter commands in flight at most; more recipients that gave up wait their turn (a
/// burst, such as a group member crashing with many poison messages in flight, does not
/// crowd out publishes).
const DEAD_LETTERS_IN_FLIGHT_MAX: usize = 64;
/// How long the dispatcher keeps serving acks after shutdown starts, while consumers leave.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// When, after shutdown starts, the last delete flush gives up: before the write core stops
/// serving (5 s after shutdown: `local::STOP_GRACE`, the Raft core's drain), so that a delete
/// still failing (no leader while an election runs) is tried until then.
const FINAL_FLUSH_BY: Duration = Duration::from_millis(4500);
/// Pause between attempts of the last delete flush.
const FINAL_FLUSH_RETRY: Duration = Duration::from_millis(100);

/// The dispatcher's configuration.
pub struct DispatcherConfig {
    /// Hub timing.
    pub hub: HubConfig,
    /// `delivery.deleteBatchInterval`.
    pub delete_interval: Duration,
    /// How long a replicated delete may take (`publish.proposalTimeout`).
    pub delete_timeout: Duration,
    /// `cluster.nodeId`: part of the consumer ids this process gives.
    pub node_id: u64,
}

struct Dispatcher {
    hub: Hub<ConsumerSink>,
    store: StoreService,
    /// Where deletes go: the Raft core, or the local journal standalone.
    writes: crate::mailbox::Mailbox<WriteReq>,
    delete_timeout: Duration,
    delete_interval: Duration,
    /// How long the next delete flush may take (see [`next_flush_attempt`]).
    flush_attempt: Duration,
    /// `delivery.timeBucket` (the bucket of a dead letter's copy).
    bucket_ms: u64,
    /// Recipients that gave up, waiting for a place among the dead letters in flight.
    dead_letters_waiting: std::collections::VecDeque<futureq_core::hub::DeadLetter>,
    /// Dead-letter commands not answered yet (at most [`DEAD_LETTERS_IN_FLIGHT_MAX`]).
    dead_letters_in_flight: usize,
    tx: crate::mailbox::Mailbox<HubCmd>,
    metrics: Arc<Metrics>,
    flushing: bool,
    /// Group deletions in progress, per (topic, group): its members are not registered
    /// meanwhile.
    deleting: std::collections::HashMap<(futureq_core::TopicHash, String), u32>,
    /// The last delete flush failed (its keys are queued again).
    flush_failed: bool,
    last_counters: futureq_core::hub::HubCounters,
}

impl Dispatcher {
    /// Applies a command; a consumer's registration first loads its topic's known groups
    /// (when that fails the consumer is not registered: its stream ends UNAVAILABLE and the
    /// client retries, rather than ACKs deleting messages owed to groups the hub missed).
    ///
    /// A group's member registers only while the registry holds the group and no deletion
    /// of it is in progress: a stream that registered it just before a deletion committed, or
    /// while one runs, registers it again afterwards, so the hub never serves a group the
    /// registry (and so the next leader) does not know, nor an old group's state to a new
    /// group's member.
    async fn handle(&mut self, cmd: HubCmd) {
        match cmd {
            HubCmd::Register { sub, sink, reply } => {
                let deleting = (futureq_core::topic_hash(&sub.topic), sub.group.clone());
                let refused = match self.load_known_groups(&sub.topic).await {
                    None => Some(RegisterRefused::RegistryUnreadable),
                    Some(_) if self.deleting.contains_key(&deleting) => {
                        Some(RegisterRefused::GroupDeleting)
                    }
                    Some(groups) if !sub.group.is_empty() && !groups.contains(&sub.group) => {
                        Some(RegisterRefused::GroupDeleted)
                    }
                    Some(_) => None,
                };
                if let Some(why) = refused {
                    let _ = reply.send(Err(why));
                    return;
                }
                let id = self.hub.register(&sub, sink, now_ms());
                tracing::debug!(target: "dispatcher", consumer = id.0, topic = %sub.topic, group = %sub.group, "consumer registered");
                let _ = reply.send(Ok(id));
            }
            HubCmd::GroupGone {
                topic,
                group,
                committed,
                reply,
            } => self.group_gone(&topic, &group, committed, reply).await,
            cmd => self.apply(cmd),
        }
    }

    fn apply(&mut self, cmd: HubCmd) {
        match cmd {
            HubCmd::Register { .. } | HubCmd::GroupGone { .. } => {
                unreachable!("handled by Dispatcher::handle")
            }
            HubCmd::DeleteGroup {
                topic,
                group,
                reply,
            } => self.start_group_deletion(topic, group, reply),
            HubCmd::Groups { only, reply } => {
                let _ = reply.send(self.hub.groups(only));
            }
            HubCmd::Acks { consumer, acks } => {
                let now = now_ms();
                for (key, success) in acks {
                    let outcome = self.hub.ack(consumer, key, success, now);
                    if outcome == futureq_core::hub::AckOutcome::Ignored {
                        tracing::debug!(target: "dispatcher", consumer = consumer.0, ?key, "ignoring ACK for a delivery not in flight on this consumer");
                    }
                }
            }
            HubCmd::Unregister(id) => {
                self.hub.unregister(id, now_ms());
                tracing::debug!(target: "dispatcher", consumer = id.0, "consumer unregistered");
            }
            HubCmd::Published(keys) => {
                for k in keys {
                    self.hub.on_published(k);
                }
            }
            HubCmd::Expired(keys) => self.hub.on_deleted(&keys),
            HubCmd::Revoke { keys, done } => {
                self.hub.on_deleted(&keys);
                let _ = done.send(());
            }
            HubCmd::DeadLettered { dl, committed } => {
                self.dead_letters_in_flight = self.dead_letters_in_flight.saturating_sub(1);
                self.hub.dead_lettered(&dl, committed, now_ms());
            }
            HubCmd::Activity(reply) => {
                let _ = reply.send(self.hub.topic_activity());
            }
            HubCmd::DeleteFlushed { committed } => {
                self.hub.finish_delete_batch(committed);
                self.flushing = false;
                self.flush_failed = !committed;
                self.flush_attempt = next_flush_attempt(
                    self.flush_attempt,
                    committed,
                    self.delete_interval,
                    self.delete_timeout,
                );
                if !committed {
                    self.metrics.delete_failures.inc_by(1);
                }
            }
        }
    }

    /// Before a consumer registers, loads its topic's groups from the durable registry: they
    /// are recipients even while away (groups registered under another leader, after a
    /// restart, or while this node did not lead). The registry's groups; `None` when it
    /// cannot be read.
    async fn load_known_groups(&mut self, topic: &str) -> Option<Vec<String>> {
        let groups = self.registry(topic).await?;
        self.hub
            .add_known_groups(topic, groups.iter().cloned(), now_ms());
        Some(groups)
    }

    /// The groups the durable registry holds for `topic`; `None` when it cannot be read.
    async fn registry(&self, topic: &str) -> Option<Vec<String>> {
        let store = self.store.store().clone();
        let h = futureq_core::topic_hash(topic);
        match glommio::executor()
            .spawn_blocking(move || store.groups_of(h))
            .await
        {
            Ok(groups) => Some(groups),
            Err(e) => {
                tracing::error!(target: "dispatcher", topic, error = %e, "cannot read the topic's consumer groups");
                None
            }
        }
    }

    /// A group's deletion ended (see [`HubCmd::GroupGone`]): the hub forgets the group once
    /// the deletion committed (its members' streams end NOT_FOUND), or when the registry no
    /// longer holds it after an unknown outcome; a group registered again since is a new
    /// group, owed the backlog like any new group.
    async fn group_gone(
        &mut self,
        topic: &str,
        group: &str,
        committed: Option<bool>,
        reply: Option<oneshot::Sender<Result<GroupDeleted, WriteError>>>,
    ) {
        let key = (futureq_core::topic_hash(topic), group.to_owned());
        if let Some(n) = self.deleting.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.deleting.remove(&key);
            }
        }
        let registry = self.registry(topic).await;
        let gone = committed.is_some()
            || registry
                .as_ref()
                .is_some_and(|r| !r.iter().any(|g| g == group));
        let mut consumers_ended = 0;
        if gone {
            let ended = self.hub.forget_group(topic, group, now_ms());
            consumers_ended = u32::try_from(ended.len()).unwrap_or(u32::MAX);
            for sink in ended {
                sink.mark_group_deleted();
            }
            tracing::info!(target: "dispatcher", %topic, %group, consumers_ended, late = committed.is_none(), "consumer group deleted");
        }
        if let Some(groups) = registry {
            self.hub.add_known_groups(topic, groups, now_ms());
        }
        if let (Some(reply), Some(found)) = (reply, committed) {
            let _ = reply.send(Ok(GroupDeleted {
                found,
                consumers_ended,
            }));
        }
    }

    /// Deletes a group's registration through the write path on a task of its own; once it
    /// committed, [`HubCmd::GroupGone`] drops the group from the hub and answers.
    fn start_group_deletion(
        &mut self,
        topic: String,
        group: String,
        reply: oneshot::Sender<Result<GroupDeleted, WriteError>>,
    ) {
        let (tx, writes) = (self.tx.clone(), self.writes.clone());
        let timeout = self.delete_timeout;
        let deadline = Instant::now() + timeout;
        *self
            .deleting
            .entry((futureq_core::topic_hash(&topic), group.clone()))
            .or_default() += 1;
        glommio::spawn_local(async move {
            let topic_hash = futureq_core::topic_hash(&topic);
            let written = crate::replication::request(&writes, |reply| WriteReq::DeleteGroup {
                topic_hash,
                group: group.clone(),
                deadline,
                reply,
            })
            .await;
            let gone = match written {
                Ok(found) => HubCmd::GroupGone {
                    topic,
                    group,
                    committed: Some(found),
                    reply: Some(reply),
                },
                Err(e) => {
                    tracing::warn!(target: "dispatcher", %topic, %group, error = %e, "consumer group not deleted (or outcome unknown)");
                    let _ = reply.send(Err(e));
                    // An unknown outcome may still commit: look again once it cannot.
                    glommio::timer::sleep(timeout).await;
                    HubCmd::GroupGone {
                        topic,
                        group,
                        committed: None,
                        reply: None,
                    }
                }
            };
            let _ = tx.send_async(gone).await;
        })
        .detach();
    }

    /// Starts a delete flush of the pending deletes, its write bounded by `flush_attempt`
    /// and `by`.
    fn start_flush(&mut self, by: Option<Instant>) {
        if self.flushing {
            return;
        }
        let Some(batch) = self.hub.take_delete_batch() else {
            return;
        };
        self.flushing = true;
        #[allow(clippy::cast_precision_loss)]
        self.metrics.delete_batch_size.observe(batch.len() as f64);
        let tx = self.tx.clone();
        let writes = self.writes.clone();
        let deadline = Instant::now() + self.flush_attempt;
        let deadline = by.map_or(deadline, |by| deadline.min(by));
        let metrics = Arc::clone(&self.metrics);
        glommio::spawn_local(async move {
            let keys = batch.len() as u64;
            let result = delete_logged(&writes, batch, deadline).await;
            let committed = match result {
                Ok(()) => {
                    metrics.deletes_committed.inc_by(keys);
                    true
                }
                Err(e) => {
                    tracing::error!(target: "deleter", error = %e, "delete flush failed; will retry");
                    false
                }
            };
            let _ = tx.send_async(HubCmd::DeleteFlushed { committed }).await;
        })
        .detach();
    }

    /// Turns each recipient that gave up into one replicated command on its own task (at most
    /// [`DEAD_LETTERS_IN_FLIGHT_MAX`] at a time, the others wait in order); its outcome goes
    /// back to the hub. A failed one is reported after [`DEAD_LETTER_RETRY`], so
    /// a write path that refuses (a lost leadership) is not asked again at once.
    fn start_dead_letters(&mut self) {
        self.dead_letters_waiting
            .extend(self.hub.take_dead_letters());
        while self.dead_letters_in_flight < DEAD_LETTERS_IN_FLIGHT_MAX {
            let Some(dl) = self.dead_letters_waiting.pop_front() else {
                break;
            };
            self.dead_letters_in_flight += 1;
            let now = now_ms();
            let cmd = WithId::DeadLetter(DeadLetter {
                key: dl.key.0,
                event_id: 0,
                bucket: futureq_core::bucket_of(now, self.bucket_ms).0,
                now_ms: now,
                group: dl.group().to_owned(),
                consumer: dl.consumer(),
            });
            let (tx, writes, metrics) = (
                self.tx.clone(),
                self.writes.clone(),
                Arc::clone(&self.metrics),
            );
            let deadline = Instant::now() + self.delete_timeout;
            glommio::spawn_local(async move {
                let r = crate::replication::request(&writes, |reply| WriteReq::WithId {
                    cmd,
                    deadline,
                    reply,
                })
                .await;
                let committed = match r {
                    Ok(Some(copy)) => {
                        metrics.messages_dead_lettered.inc_by(1);
                        tracing::info!(target: "dispatcher", key = %dl.key, group = %dl.group(), copy = %copy, "a recipient gave up on a message: copied to its dead-letter topic");
                        true
                    }
                    Ok(None) => true,
                    Err(e) => {
                        tracing::warn!(target: "dispatcher", key = %dl.key, group = %dl.group(), error = %e, "dead letter not stored; will retry");
                        glommio::timer::sleep(DEAD_LETTER_RETRY).await;
                        false
                    }
                };
                let _ = tx.send_async(HubCmd::DeadLettered { dl, committed }).await;
            })
            .detach();
        }
    }

    fn export(&mut self) {
        let m = &self.metrics;
        let c = self.hub.counters();
        let r = Ordering::Relaxed;
        // The hub's counters, mirrored whole.
        m.messages_dispatched.inner().store(c.dispatched, r);
        m.messages_redelivered.inner().store(c.redelivered, r);
        m.in_flight_timeouts.inner().store(c.timeouts, r);
        if c.expired > self.last_counters.expired {
            m.messages_expired
                .add(&["dispatcher"], c.expired - self.last_counters.expired);
        }
        self.last_counters = c;
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        m.messages_in_flight.set(count(self.hub.in_flight()));
        m.pending_deletes.set(count(self.hub.pending_deletes()));
        m.parked_messages.set(count(self.hub.parked()));
        let applied = self.store.store().stats();
        m.store_commits
            .inner()
            .store(applied.transactions.load(r), r);
        m.store_commit_ops.inner().store(applied.entries.load(r), r);
    }

    /// One pass: timeouts, waiting redeliveries, due scans. Returns false if a scan failed.
    async fn pass(&mut self) -> bool {
        let now = now_ms();
        self.hub.expire_in_flight(now);
        self.hub.drain_waiting(now);
        self.hub.deliver_read_ahead(now);
        let reqs = self.hub.scans_due(now);
        if reqs.is_empty() {
            return true;
        }
        // Every topic's due range in one round trip to the reader thread.
        let results = match self.store.scan_all(reqs.clone()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(target: "dispatcher", error = %e, "scan failed; retrying");
                return false;
            }
        };
        let mut ok = true;
        for (req, res) in reqs.iter().zip(results) {
            match res {
                Ok(res) => self.hub.apply_scan(req, res, now_ms()),
                Err(e) => {
                    tracing::error!(target: "dispatcher", topic_hash = %req.topic_hash, error = %e, "scan failed; retrying");
                    ok = false;
                }
            }
        }
        ok
    }
}

/// The first consumer id of a process started at `now_ms` on node `node_id`: its start time
/// (ms, modulo 2^34: 198 days), then the node id's low 8 bits, then 22 bits of sequence.
/// Unique across restarts and nodes unless a process gives more than 2^22 (4M) universal
/// consumer ids, or two nodes whose ids agree in their low 8 bits start in the same ms.
fn consumer_id_base(now_ms: i64, node_id: u64) -> u64 {
    let ms = u64::try_from(now_ms).unwrap_or(0) & ((1 << 34) - 1);
    (ms << 30) | ((node_id & 0xff) << 22) | 1
}

/// How long the next delete flush may take: `max(1 s, 2 × delete_interval)` after a
/// committed one (so that a flush held by a leader that lost its quorum gives up soon, and the
/// next goes to whichever node leads by then: only one flush runs at a time, and a held one
/// held every later ACK's delete while a new leader delivered them again), doubled after each
/// failure (a cluster slow to commit is not asked again and again at the same pace), never
/// more than `delete_timeout`.
fn next_flush_attempt(
    last: Duration,
    committed: bool,
    delete_interval: Duration,
    delete_timeout: Duration,
) -> Duration {
    let base = delete_interval
        .saturating_mul(2)
        .max(Duration::from_secs(1));
    let next = if committed {
        base
    } else {
        last.saturating_mul(2).max(base)
    };
    next.min(delete_timeout)
}

/// Deletes keys through the log (the Raft log, or the journal standalone); a node that no
/// longer leads forwards them to the leader. A failure (no leader known, timeout) keeps them
/// queued for the next flush: deletes are idempotent, and an ACKed key is never dropped.
pub(crate) async fn delete_logged(
    writes: &crate::mailbox::Mailbox<WriteReq>,
    keys: Vec<EventKey>,
    deadline: Instant,
) -> Result<(), WriteError> {
    crate::replication::request(writes, |reply| WriteReq::Delete {
        keys,
        deadline,
        reply,
    })
    .await
}

/// Runs the dispatcher until shutdown, then flushes the pending deletes. Start it once the write path replayed what it holds (see
/// `core_main`): a delete still in the journal would otherwise let it deliver an
/// acknowledged message again.
pub async fn run(
    cfg: DispatcherConfig,
    rx: flume::Receiver<HubCmd>,
    tx: crate::mailbox::Mailbox<HubCmd>,
    store: StoreService,
    writes: crate::mailbox::Mailbox<WriteReq>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    let mut d = Dispatcher {
        hub: Hub::new(cfg.hub).first_consumer_id(consumer_id_base(now_ms(), cfg.node_id)),
        store,
        writes,
        delete_timeout: cfg.delete_timeout,
        delete_interval: cfg.delete_interval,
        flush_attempt: next_flush_attempt(
            Duration::ZERO,
            true,
            cfg.delete_interval,
            cfg.delete_timeout,
        ),
        bucket_ms: cfg.hub.bucket_ms,
        dead_letters_waiting: std::collections::VecDeque::new(),
        dead_letters_in_flight: 0,
        tx,
        metrics,
        flushing: false,
        deleting: std::collections::HashMap::new(),
        flush_failed: false,
        last_counters: futureq_core::hub::HubCounters::default(),
    };
    tracing::info!(target: "dispatcher", "dispatcher started");
    let stopping_at = d.serve(&rx, &shutdown).await;
    d.final_flush(&rx, stopping_at + FINAL_FLUSH_BY).await;
    d.export();
    tracing::info!(target: "dispatcher", pending_deletes = d.hub.pending_deletes(), "dispatcher stopped");
}

impl Dispatcher {
    /// The dispatcher's loop: commands, a pass, dead letters and delete flushes, then a sleep
    /// until the next work, a command or shutdown. After shutdown it serves acks while
    /// consumers leave, at most [`SHUTDOWN_GRACE`]; returns when the stop began.
    async fn serve(&mut self, rx: &flume::Receiver<HubCmd>, shutdown: &Shutdown) -> Instant {
        let mut next_flush = Instant::now() + self.delete_interval;
        let mut stopping_at: Option<Instant> = None;
        loop {
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd).await;
            }
            let scanned = self.pass().await;
            self.start_dead_letters();
            if Instant::now() >= next_flush || self.hub.pending_deletes() >= DELETE_FLUSH_EARLY {
                next_flush = Instant::now() + self.delete_interval;
                self.start_flush(None);
            }
            self.export();
            if stopping_at.is_none() && shutdown.is_triggered() {
                stopping_at = Some(Instant::now());
            }
            let stop_by = stopping_at.map(|t| t + SHUTDOWN_GRACE);
            if let (Some(at), Some(t)) = (stopping_at, stop_by) {
                if self.hub.consumer_count() == 0 || Instant::now() >= t {
                    return at;
                }
            }
            let wake = self.next_wake(next_flush, scanned, stop_by);
            if wake.is_some_and(|w| w <= Instant::now()) {
                // More work is due already (a scan stopped at its key limit, a redelivery):
                // let the other tasks of this core run, then go on. A zero timer would cost a
                // reactor round trip (~1 ms).
                future::yield_now().await;
                continue;
            }
            let sleep = async {
                match wake {
                    Some(w) => {
                        glommio::timer::Timer::new(w.saturating_duration_since(Instant::now()))
                            .await;
                    }
                    None => future::pending::<()>().await,
                }
                None
            };
            let stop = async {
                if stop_by.is_none() {
                    shutdown.wait().await;
                } else {
                    future::pending::<()>().await;
                }
                None
            };
            let cmd = future::or(
                future::or(async { rx.recv_async().await.ok() }, sleep),
                stop,
            )
            .await;
            if let Some(cmd) = cmd {
                self.handle(cmd).await;
            }
        }
    }

    /// When the loop must run again at the latest: the hub's next work, the next delete flush
    /// (when deletes wait), a scan retry, the end of the shutdown grace.
    fn next_wake(
        &self,
        next_flush: Instant,
        scanned: bool,
        stop_by: Option<Instant>,
    ) -> Option<Instant> {
        let mut wake = self.hub.next_wakeup(now_ms()).map(instant_of);
        let mut merge = |i: Instant| wake = Some(wake.map_or(i, |w| w.min(i)));
        if self.hub.pending_deletes() > 0 && !self.flushing {
            merge(next_flush);
        }
        if !scanned {
            merge(Instant::now() + SCAN_RETRY);
        }
        if let Some(t) = stop_by {
            merge(t.min(Instant::now() + Duration::from_millis(50)));
        }
        wake
    }

    /// The final flush: waits for a running one, then flushes the rest, again after each
    /// failure (a pause between) until `by`: an ACK the client was told was taken is not
    /// dropped while the write core could still take its delete.
    async fn final_flush(&mut self, rx: &flume::Receiver<HubCmd>, by: Instant) {
        loop {
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd).await;
            }
            if !self.flushing && self.hub.pending_deletes() == 0 {
                return;
            }
            let now = Instant::now();
            if now >= by {
                tracing::warn!(target: "dispatcher", pending_deletes = self.hub.pending_deletes(), "acknowledged deletes not made durable before the stop: those messages are delivered again after the restart");
                return;
            }
            if self.flush_failed && !self.flushing {
                self.flush_failed = false;
                glommio::timer::sleep(FINAL_FLUSH_RETRY.min(by - now)).await;
                continue;
            }
            self.start_flush(Some(by));
            let answer = future::or(async { rx.recv_async().await.ok() }, async {
                glommio::timer::sleep(by.saturating_duration_since(Instant::now())).await;
                None
            })
            .await;
            match answer {
                Some(cmd) => self.handle(cmd).await,
                None if !self.flushing => glommio::timer::sleep(FINAL_FLUSH_RETRY).await,
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26, late redelivery: one delete flush (only one runs at a time) gives up within
    /// max(1 s, 2 × the interval) after a committed one, not after publish.proposalTimeout:
    /// a flush held by a leader that lost its quorum held every later ACK's delete for 5 s
    /// while the new leader delivered them again. Failures back off to the timeout.
    #[test]
    fn a_delete_flush_gives_up_soon_and_backs_off_while_flushes_fail() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let next = |last, ok| next_flush_attempt(last, ok, ms(500), s(5));
        assert_eq!(next(Duration::ZERO, true), s(1));
        assert_eq!(next(s(1), false), s(2));
        assert_eq!(next(s(2), false), s(4));
        assert_eq!(next(s(4), false), s(5), "never past the timeout");
        assert_eq!(next(s(5), true), s(1), "reset by a committed flush");
        assert_eq!(next_flush_attempt(Duration::ZERO, true, s(2), s(5)), s(4));
        assert_eq!(
            next_flush_attempt(Duration::ZERO, true, ms(100), ms(300)),
            ms(300)
        );
    }

    /// Issue 26.2: consumer ids of processes started at different times, or on different
    /// nodes in the same ms, never meet (within 2^22 ids each).
    #[test]
    fn consumer_ids_of_two_processes_do_not_meet() {
        let t = 1_796_000_000_000;
        let a = consumer_id_base(t, 1);
        let b = consumer_id_base(t, 2);
        let c = consumer_id_base(t + 1, 1);
        for (x, y) in [(a, b), (a, c), (b, c)] {
            assert!(x.abs_diff(y) >= 1 << 22, "{x} {y}");
        }
        assert_eq!(a & ((1 << 22) - 1), 1, "the sequence starts at 1");
    }
}
