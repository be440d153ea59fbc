//! The dispatcher task: owns the [`Hub`] on one core and turns its decisions into I/O.
//!
//! It sleeps until the earliest instant with work — a topic's next due message (among topics
//! with consumers), a waiting redelivery, an in-flight deadline, a delete flush — or until a
//! command arrives (a consumer, an ack, a commit that stored an earlier message). Topics
//! without consumers are never scanned, and a scan reads only keys of due buckets.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futureq_core::command::{DeadLetter, WithId};
use futureq_core::hub::{ConsumerId, Delivery, Hub, HubConfig, Sink, Subscription};
use futureq_core::EventKey;
use futureq_net::Shutdown;
use futureq_raft::node::WriteError;
use futureq_storage::StoreService;
use futures::channel::oneshot;
use futures_lite::future;

use crate::metrics::Metrics;
use crate::replication::{RaftReq, Replication};

/// Capacity of the dispatcher's command queue.
pub const HUB_QUEUE_MAX: usize = 65_536;
/// Keys per TTL sweep transaction.
pub const SWEEP_BATCH_MAX: usize = 10_000;
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

/// Current wall clock in Unix ms.
#[must_use]
pub fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(i64::MAX)
}

/// The instant at which the wall clock reads `at_ms`.
fn instant_of(at_ms: i64) -> Instant {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let target = Duration::from_millis(u64::try_from(at_ms).unwrap_or(0));
    Instant::now() + target.saturating_sub(now)
}

/// A consumer's delivery queue, bounded by its `max_in_flight`.
pub struct ConsumerSink(pub flume::Sender<Delivery>);

impl Sink for ConsumerSink {
    fn try_send(&self, d: Delivery) -> bool {
        self.0.try_send(d).is_ok()
    }

    fn room(&self) -> usize {
        if self.0.is_disconnected() {
            return 0;
        }
        self.0
            .capacity()
            .map_or(usize::MAX, |c| c.saturating_sub(self.0.len()))
    }
}

/// What other tasks and threads tell the dispatcher.
pub enum HubCmd {
    /// A Subscribe stream started.
    Register {
        /// What it asked for.
        sub: Subscription,
        /// Where its deliveries go.
        sink: ConsumerSink,
        /// Its id.
        reply: oneshot::Sender<ConsumerId>,
    },
    /// An ACK or NACK frame.
    Ack {
        /// The stream.
        consumer: ConsumerId,
        /// The delivery tag.
        key: EventKey,
        /// ACK (true) or NACK.
        success: bool,
    },
    /// A Subscribe stream ended.
    Unregister(ConsumerId),
    /// A commit stored messages; the smallest key per topic.
    Published(Vec<EventKey>),
    /// The TTL sweeper deleted these keys.
    Expired(Vec<EventKey>),
    /// A delete flush finished.
    DeleteFlushed {
        /// Whether it committed.
        committed: bool,
    },
    /// Keys a cancel deleted: dropped from memory (read-ahead copies, waiting recipients,
    /// deliveries in flight) like [`HubCmd::Expired`], then answered. Commands are handled
    /// between passes, so once answered no scan that read the store before the commit can
    /// deliver them. Carries its own keys: the apply's notice may reach the hub later (it
    /// goes through a task when the queue is full).
    Revoke {
        /// The keys.
        keys: Vec<EventKey>,
        /// Answered once they are dropped.
        done: oneshot::Sender<()>,
    },
    /// A dead letter's command ended: committed or not.
    DeadLettered {
        /// The recipient that gave up.
        dl: futureq_core::hub::DeadLetter,
        /// Whether the command committed.
        committed: bool,
    },
    /// Per topic with consumers: its streams and deliveries in flight (`TopicStats`).
    Activity(
        oneshot::Sender<
            std::collections::HashMap<futureq_core::TopicHash, futureq_core::hub::TopicActivity>,
        >,
    ),
}

/// The dispatcher's configuration.
pub struct DispatcherConfig {
    /// Hub timing.
    pub hub: HubConfig,
    /// `delivery.deleteBatchInterval`.
    pub delete_interval: Duration,
    /// How long a replicated delete may take (`publish.proposalTimeout`).
    pub delete_timeout: Duration,
}

struct Dispatcher {
    hub: Hub<ConsumerSink>,
    store: StoreService,
    /// Where deletes go: the Raft core, or the local journal standalone.
    writes: flume::Sender<RaftReq>,
    delete_timeout: Duration,
    /// `delivery.timeBucket` (the bucket of a dead letter's copy).
    bucket_ms: u64,
    /// Recipients that gave up, waiting for a place among the dead letters in flight.
    dead_letters_waiting: std::collections::VecDeque<futureq_core::hub::DeadLetter>,
    /// Dead-letter commands not answered yet (at most [`DEAD_LETTERS_IN_FLIGHT_MAX`]).
    dead_letters_in_flight: usize,
    tx: flume::Sender<HubCmd>,
    metrics: Arc<Metrics>,
    flushing: bool,
    last_counters: futureq_core::hub::HubCounters,
}

impl Dispatcher {
    /// Applies a command; a consumer's registration first loads its topic's known groups
    /// (when that fails the consumer is not registered: its stream ends UNAVAILABLE and the
    /// client retries, rather than ACKs deleting messages owed to groups the hub missed).
    async fn handle(&mut self, cmd: HubCmd) {
        if let HubCmd::Register { sub, .. } = &cmd {
            if !self.load_known_groups(&sub.topic).await {
                return;
            }
        }
        self.apply(cmd);
    }

    fn apply(&mut self, cmd: HubCmd) {
        match cmd {
            HubCmd::Register { sub, sink, reply } => {
                let id = self.hub.register(&sub, sink, now_ms());
                tracing::debug!(target: "dispatcher", consumer = id.0, topic = %sub.topic, group = %sub.group, "consumer registered");
                let _ = reply.send(id);
            }
            HubCmd::Ack {
                consumer,
                key,
                success,
            } => {
                let outcome = self.hub.ack(consumer, key, success, now_ms());
                if outcome == futureq_core::hub::AckOutcome::Ignored {
                    tracing::debug!(target: "dispatcher", consumer = consumer.0, ?key, "ignoring ACK for a delivery not in flight on this consumer");
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
                if !committed {
                    self.metrics.delete_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Before a consumer registers, loads its topic's groups from the durable registry: they
    /// are recipients even while away (groups registered under another leader, after a
    /// restart, or while this node did not lead). False when the registry cannot be read.
    async fn load_known_groups(&mut self, topic: &str) -> bool {
        let store = self.store.store().clone();
        let h = futureq_core::topic_hash(topic);
        match glommio::executor()
            .spawn_blocking(move || store.groups_of(h))
            .await
        {
            Ok(groups) => {
                self.hub.add_known_groups(topic, groups, now_ms());
                true
            }
            Err(e) => {
                tracing::error!(target: "dispatcher", topic, error = %e, "cannot read the topic's consumer groups; refusing the consumer");
                false
            }
        }
    }

    fn start_flush(&mut self) {
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
        let timeout = self.delete_timeout;
        let metrics = Arc::clone(&self.metrics);
        glommio::spawn_local(async move {
            let keys = batch.len() as u64;
            let result = delete_logged(&writes, batch, timeout).await;
            let committed = match result {
                Ok(()) => {
                    metrics.deletes_committed.fetch_add(keys, Ordering::Relaxed);
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
                let r = crate::replication::request(&writes, |reply| RaftReq::WithId {
                    cmd,
                    deadline,
                    reply,
                })
                .await;
                let committed = match r {
                    Ok(Some(copy)) => {
                        metrics.messages_dead_lettered.fetch_add(1, Ordering::Relaxed);
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
        m.messages_dispatched.store(c.dispatched, r);
        m.messages_redelivered.store(c.redelivered, r);
        m.in_flight_timeouts.store(c.timeouts, r);
        if c.expired > self.last_counters.expired {
            m.messages_expired
                .add(&["dispatcher"], c.expired - self.last_counters.expired);
        }
        self.last_counters = c;
        m.messages_in_flight
            .store(i64::try_from(self.hub.in_flight()).unwrap_or(i64::MAX), r);
        m.pending_deletes.store(
            i64::try_from(self.hub.pending_deletes()).unwrap_or(i64::MAX),
            r,
        );
        m.parked_messages
            .store(i64::try_from(self.hub.parked()).unwrap_or(i64::MAX), r);
        let applied = self.store.store().stats();
        m.store_commits.store(applied.transactions.load(r), r);
        m.store_commit_ops.store(applied.entries.load(r), r);
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

/// Deletes keys through the log (the Raft log, or the journal standalone); a node that no
/// longer leads forwards them to the leader. A failure (no leader known, timeout) keeps them
/// queued for the next flush: deletes are idempotent, and an ACKed key is never dropped.
async fn delete_logged(
    writes: &flume::Sender<RaftReq>,
    keys: Vec<EventKey>,
    timeout: Duration,
) -> Result<(), WriteError> {
    let deadline = Instant::now() + timeout;
    crate::replication::request(writes, |reply| RaftReq::Delete {
        keys,
        deadline,
        reply,
    })
    .await
}

/// What an apply tells the dispatcher (on every replica, and standalone): the smallest new
/// key per topic (a scan cursor that passed it moves back) and the deleted keys (never
/// delivered again).
pub fn applied_to_hub(hub: flume::Sender<HubCmd>) -> impl Fn(&[EventKey], &[EventKey]) {
    move |published: &[EventKey], deleted: &[EventKey]| {
        if !published.is_empty() {
            send_to_hub(&hub, HubCmd::Published(published.to_vec()));
        }
        if !deleted.is_empty() {
            send_to_hub(&hub, HubCmd::Expired(deleted.to_vec()));
        }
    }
}

fn send_to_hub(hub: &flume::Sender<HubCmd>, cmd: HubCmd) {
    // Never block the write core: when the queue is full, hand the send to a task.
    if let Err(flume::TrySendError::Full(cmd)) = hub.try_send(cmd) {
        let hub = hub.clone();
        glommio::spawn_local(async move {
            let _ = hub.send_async(cmd).await;
        })
        .detach();
    }
}

/// Runs the dispatcher until shutdown, then flushes the pending deletes. Start it once the write path replayed what it holds (see
/// `core_main`): a delete still in the journal would otherwise let it deliver an
/// acknowledged message again.
pub async fn run(
    cfg: DispatcherConfig,
    rx: flume::Receiver<HubCmd>,
    tx: flume::Sender<HubCmd>,
    store: StoreService,
    writes: flume::Sender<RaftReq>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    let mut d = Dispatcher {
        hub: Hub::new(cfg.hub),
        store,
        writes,
        delete_timeout: cfg.delete_timeout,
        bucket_ms: cfg.hub.bucket_ms,
        dead_letters_waiting: std::collections::VecDeque::new(),
        dead_letters_in_flight: 0,
        tx,
        metrics,
        flushing: false,
        last_counters: futureq_core::hub::HubCounters::default(),
    };
    tracing::info!(target: "dispatcher", "dispatcher started");
    let mut next_flush = Instant::now() + cfg.delete_interval;
    let mut stop_by: Option<Instant> = None;
    loop {
        while let Ok(cmd) = rx.try_recv() {
            d.handle(cmd).await;
        }
        let scanned = d.pass().await;
        d.start_dead_letters();
        if Instant::now() >= next_flush || d.hub.pending_deletes() >= DELETE_FLUSH_EARLY {
            next_flush = Instant::now() + cfg.delete_interval;
            d.start_flush();
        }
        d.export();
        if stop_by.is_none() && shutdown.is_triggered() {
            stop_by = Some(Instant::now() + SHUTDOWN_GRACE);
        }
        if let Some(t) = stop_by {
            if d.hub.consumer_count() == 0 || Instant::now() >= t {
                break;
            }
        }
        let mut wake = d.hub.next_wakeup(now_ms()).map(instant_of);
        let mut merge = |i: Instant| wake = Some(wake.map_or(i, |w| w.min(i)));
        if d.hub.pending_deletes() > 0 && !d.flushing {
            merge(next_flush);
        }
        if !scanned {
            merge(Instant::now() + SCAN_RETRY);
        }
        if let Some(t) = stop_by {
            merge(t.min(Instant::now() + Duration::from_millis(50)));
        }
        if wake.is_some_and(|w| w <= Instant::now()) {
            // More work is due already (a scan stopped at its key limit, a redelivery): let
            // the other tasks of this core run, then go on. A zero timer would cost a
            // reactor round trip (~1 ms).
            future::yield_now().await;
            continue;
        }
        let sleep = async {
            match wake {
                Some(w) => {
                    glommio::timer::Timer::new(w.saturating_duration_since(Instant::now())).await;
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
            d.handle(cmd).await;
        }
    }
    // Final flush: wait for a running one, then flush the rest (a few retries).
    for _ in 0..50 {
        while let Ok(cmd) = rx.try_recv() {
            d.handle(cmd).await;
        }
        if !d.flushing && d.hub.pending_deletes() == 0 {
            break;
        }
        d.start_flush();
        if d.flushing {
            if let Ok(cmd) = rx.recv_async().await {
                d.handle(cmd).await;
            }
        } else {
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
    }
    d.export();
    tracing::info!(target: "dispatcher", pending_deletes = d.hub.pending_deletes(), "dispatcher stopped");
}

/// Why a TTL sweep step failed (retried next interval).
#[derive(Debug, thiserror::Error)]
enum SweepError {
    /// Reading the expiry index.
    #[error("reading expired keys: {0}")]
    Store(futureq_storage::StoreError),
    /// Deleting them.
    #[error("deleting expired keys: {0}")]
    Write(WriteError),
}

impl From<futureq_storage::StoreError> for SweepError {
    fn from(e: futureq_storage::StoreError) -> Self {
        SweepError::Store(e)
    }
}

impl From<WriteError> for SweepError {
    fn from(e: WriteError) -> Self {
        SweepError::Write(e)
    }
}

/// One sweep step: the leader (or the standalone broker) reads expired keys from its store
/// and deletes them through the log (every replica's apply tells its dispatcher). Followers
/// do nothing.
async fn sweep_step(
    repl: &Replication,
    store: &StoreService,
    timeout: Duration,
) -> Result<Vec<EventKey>, SweepError> {
    if !repl.leading() {
        return Ok(Vec::new());
    }
    let s = store.store().clone();
    let now = now_ms();
    let keys = glommio::executor()
        .spawn_blocking(move || s.expired_keys(now, SWEEP_BATCH_MAX))
        .await?;
    if !keys.is_empty() {
        delete_logged(repl.writes(), keys.clone(), timeout).await?;
    }
    Ok(keys)
}

/// Refreshes the per-topic gauges every `interval` until shutdown: the store's exact topic
/// counts (read on its admin thread, off every executor) and this dispatcher's deliveries in
/// flight, each cut to the largest [`crate::metrics::TOPIC_LABELS_MAX`] topics and the rest.
pub async fn refresh_topic_gauges(
    interval: Duration,
    store: StoreService,
    hub: flume::Sender<HubCmd>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    loop {
        match store
            .admin(|s| s.topic_counts(crate::metrics::TOPIC_LABELS_MAX))
            .await
        {
            Ok(Ok(c)) => metrics.topic_messages_stored.set(c.top, c.rest),
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(target: "metrics", error = %e, "reading the topic counts failed");
            }
        }
        let (tx, rx) = oneshot::channel();
        if hub.send_async(HubCmd::Activity(tx)).await.is_ok() {
            if let Ok(activity) = rx.await {
                metrics.topic_messages_in_flight.set_all(
                    activity
                        .into_values()
                        .map(|a| (a.topic.to_string(), a.in_flight))
                        .collect(),
                );
            }
        }
        if crate::runtime::sleep_or_shutdown(interval, &shutdown).await {
            return;
        }
    }
}

/// Deletes expired messages every `interval` (expiry index: no full scan) and tells the
/// dispatcher which keys went away. Started as [`run`] is.
pub async fn sweep_ttl(
    interval: Duration,
    store: StoreService,
    repl: Arc<Replication>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
    timeout: Duration,
) {
    loop {
        if crate::runtime::sleep_or_shutdown(interval, &shutdown).await {
            return;
        }
        loop {
            let swept = sweep_step(&repl, &store, timeout).await;
            match swept {
                Ok(keys) => {
                    let n = keys.len();
                    if n > 0 {
                        metrics.messages_expired.add(&["sweeper"], n as u64);
                        // The apply hook tells the dispatcher.
                        tracing::info!(target: "ttl_sweeper", expired = n, "deleted expired messages");
                    }
                    if n < SWEEP_BATCH_MAX {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!(target: "ttl_sweeper", error = %e, "TTL sweep failed; retrying next interval");
                    break;
                }
            }
        }
    }
}
