//! Broker metrics (`futureq_` prefix), shared by every core, on `prometheus-client`: typed
//! counters, gauges, histograms and labelled families registered once in a [`Registry`] and
//! encoded in the Prometheus text format (version 0.0.4) at each scrape. Values that live
//! elsewhere (the store's digest, the data disk, the certificates, the per-topic gauges, the
//! Raft group's state) are read at the scrape by collectors.
//!
//! Units are Prometheus base units (`_seconds`, `_bytes`). A `topic` label names at most
//! [`TOPIC_LABELS_MAX`] topics, the same ones in every counter (the first seen since the
//! start; for the gauges, the largest at each refresh); everything else is counted under
//! `topic=""` (no topic is named so: other topics, publish batches of several topics, refused
//! ones), however many topics clients create.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Buckets for latencies in seconds (100 µs to 5 s).
pub const LATENCY_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// Buckets for batch sizes.
pub const SIZES: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];
/// Topics that get a `topic` label value of their own (see the module docs).
pub const TOPIC_LABELS_MAX: usize = 100;

/// A histogram over `bounds`.
fn histogram(bounds: &[f64]) -> Histogram {
    Histogram::new(bounds.iter().copied())
}

/// The label values of one series, in the order of its family's label names.
type Labels = Vec<(&'static str, String)>;

/// The topics the counters label (at most [`TOPIC_LABELS_MAX`], the first seen), shared by
/// every counter with a `topic` label.
#[derive(Default)]
struct TopicLabels(Mutex<HashSet<String>>);

impl TopicLabels {
    /// `topic` if it has a label value of its own (taking one while there are places), else
    /// "".
    fn label(&self, topic: &mut String) {
        if topic.is_empty() {
            return;
        }
        let mut known = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !known.contains(topic.as_str()) {
            if known.len() < TOPIC_LABELS_MAX {
                known.insert(topic.clone());
            } else {
                topic.clear();
            }
        }
    }
}

/// A counter with labels; a `topic` label, when it has one, is bounded (see the module docs).
pub struct LabeledCounter {
    names: &'static [&'static str],
    /// For a counter with a `topic` label: the topics it may name.
    topics: Option<Arc<TopicLabels>>,
    family: Family<Labels, Counter>,
}

impl LabeledCounter {
    /// A counter named `names`, registered as `name` (without `_total`); the first label is
    /// bounded by `topics` when given (it must then be `topic`).
    fn register(
        registry: &mut Registry,
        (name, help): (&str, &str),
        names: &'static [&'static str],
        topics: Option<&Arc<TopicLabels>>,
    ) -> Self {
        debug_assert_eq!(
            topics.is_some(),
            names.first() == Some(&"topic"),
            "a topic label is bounded, and only a topic label"
        );
        let family = Family::default();
        registry.register(name, help, family.clone());
        LabeledCounter {
            names,
            topics: topics.map(Arc::clone),
            family,
        }
    }

    /// Adds `n` to the series with these label values (a topic without a label value of its
    /// own counts under `topic=""`).
    pub fn add(&self, values: &[&str], n: u64) {
        let mut labels: Labels = self
            .names
            .iter()
            .zip(values)
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect();
        if let (Some(topics), Some((_, t))) = (&self.topics, labels.first_mut()) {
            topics.label(t);
        }
        self.family.get_or_create(&labels).inc_by(n);
    }
}

/// A gauge per topic, set whole by each refresh: the [`TOPIC_LABELS_MAX`] largest topics and
/// the sum over the others (`topic=""`). Nothing is exported before the first refresh; a
/// scrape sees one refresh whole, never half of one.
#[derive(Debug)]
pub struct TopicGauge {
    name: &'static str,
    help: String,
    values: Mutex<Option<TopicValues>>,
}

/// The labelled topics (name, value) and the sum over the others.
type TopicValues = (Vec<(String, u64)>, u64);

impl TopicGauge {
    fn new(name: &'static str, help: String) -> Self {
        TopicGauge {
            name,
            help,
            values: Mutex::new(None),
        }
    }

    /// Sets the gauge: `top` (name, value), and `rest` for every other topic.
    pub fn set(&self, top: Vec<(String, u64)>, rest: u64) {
        *self
            .values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((top, rest));
    }

    /// Sets the gauge from every topic's value: the [`TOPIC_LABELS_MAX`] largest (ties by
    /// name) and the sum of the others; zeros are left out.
    pub fn set_all(&self, mut all: Vec<(String, u64)>) {
        all.retain(|(_, n)| *n > 0);
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let rest = all
            .get(TOPIC_LABELS_MAX..)
            .map_or(0, |r| r.iter().map(|(_, n)| n).sum());
        all.truncate(TOPIC_LABELS_MAX);
        self.set(all, rest);
    }
}

impl Collector for TopicGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let values = self
            .values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some((top, rest)) = values.as_ref() else {
            return Ok(());
        };
        let mut family =
            encoder.encode_descriptor(self.name, &self.help, None, MetricType::Gauge)?;
        let rest = (*rest > 0).then(|| (String::new(), *rest));
        for (topic, n) in top.iter().chain(rest.as_ref()) {
            let labels = [("topic", topic.as_str())];
            ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The event shard's state, exported while the node is clustered.
#[derive(Debug)]
pub struct RaftMetrics {
    /// Clustered mode: the metrics below are exported.
    pub clustered: AtomicBool,
    pub term: AtomicU64,
    pub is_leader: AtomicU64,
    pub applied_index: AtomicU64,
    pub last_log_index: AtomicU64,
    pub purged_index: AtomicU64,
    pub leader_changes: AtomicU64,
    /// Times this node's lease lapsed while it went on leading the same term.
    pub lease_lapses: AtomicU64,
    pub refused_entries: AtomicU64,
    /// Times the Raft core's reactor ran late by `cluster::STALL_REPORT` or more.
    pub reactor_stalls: AtomicU64,
    /// Publish batches proposed in each event-shard entry (`cluster::coalesce`).
    pub entry_batches: Histogram,
}

impl Default for RaftMetrics {
    fn default() -> Self {
        RaftMetrics {
            clustered: AtomicBool::new(false),
            term: AtomicU64::new(0),
            is_leader: AtomicU64::new(0),
            applied_index: AtomicU64::new(0),
            last_log_index: AtomicU64::new(0),
            purged_index: AtomicU64::new(0),
            leader_changes: AtomicU64::new(0),
            lease_lapses: AtomicU64::new(0),
            refused_entries: AtomicU64::new(0),
            reactor_stalls: AtomicU64::new(0),
            entry_batches: histogram(SIZES),
        }
    }
}

impl Collector for RaftMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let r = Ordering::Relaxed;
        if !self.clustered.load(r) {
            return Ok(());
        }
        let gauges = [
            (
                "futureq_raft_term",
                "Current term of the event shard.",
                &self.term,
            ),
            (
                "futureq_raft_is_leader",
                "1 while this node leads the event shard and takes clients.",
                &self.is_leader,
            ),
            (
                "futureq_raft_applied_index",
                "Last event-shard log index applied to the store.",
                &self.applied_index,
            ),
            (
                "futureq_raft_last_log_index",
                "Last index in this node's event-shard log.",
                &self.last_log_index,
            ),
            (
                "futureq_raft_purged_index",
                "Event-shard log entries up to this index were compacted into a snapshot.",
                &self.purged_index,
            ),
        ];
        for (name, help, v) in gauges {
            gauge(&mut encoder, name, help, v.load(r))?;
        }
        let counters = [
            ("futureq_raft_leader_changes", "Times this node gained or lost event-shard leadership.", &self.leader_changes),
            ("futureq_raft_lease_lapses", "Times the leader heard no quorum for an election timeout and held deliveries while it went on leading the same term (followers answering late: a stalled disk; or cut off).", &self.lease_lapses),
            ("futureq_raft_refused_entries", "Committed event-shard entries the state machine refused (undecodable, or event ids from an earlier term); nothing of them was applied.", &self.refused_entries),
            ("futureq_raft_reactor_stalls", "Times the Raft core's reactor did not run for 100 ms or more (heartbeats late; the log says how much of it was on CPU).", &self.reactor_stalls),
        ];
        for (name, help, v) in counters {
            let e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v.load(r)).encode(e)?;
        }
        let e = encoder.encode_descriptor(
            "futureq_raft_entry_batches",
            "Publish batches coalesced into each proposed event-shard entry.",
            None,
            MetricType::Histogram,
        )?;
        self.entry_batches.encode(e)
    }
}

/// The executors' per-message costs of the thread-per-core design: messages put in the queues
/// one executor serves from other threads, and each executor thread's sleeps.
#[derive(Debug, Default)]
pub struct Executors {
    /// Write requests sent to the write core from other threads ([`crate::mailbox`]).
    pub writes_crossed: Arc<AtomicU64>,
    /// Hub commands sent to the dispatcher's executor from other threads.
    pub hub_crossed: Arc<AtomicU64>,
    /// `(core, thread id)` of each executor thread started.
    threads: std::sync::Mutex<Vec<(usize, i32)>>,
}

impl Executors {
    /// Records the calling thread as executor `core`'s.
    pub fn register_current(&self, core: usize) {
        let tid = current_tid();
        if tid == 0 {
            tracing::warn!(target: "app", core, "cannot read /proc/thread-self: futureq_executor_sleeps_total will not show this executor");
            return;
        }
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((core, tid));
    }
}

/// The calling thread's id (as `gettid`), from `/proc/thread-self`; 0 if unreadable.
fn current_tid() -> i32 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

/// A thread's voluntary context switches (it blocked: an executor going to sleep), from
/// `/proc/self/task/<tid>/status`; `None` if unreadable.
fn voluntary_switches(tid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Read at each scrape, on the metrics listener's executor: one small `/proc` file per
/// executor thread.
impl Collector for Executors {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let r = Ordering::Relaxed;
        let mut family = encoder.encode_descriptor(
            "futureq_cross_core_messages",
            "Messages put in a queue one executor serves by another thread (each may wake that executor from its thread): queue=\"writes\", requests to the write core (each is answered back across); queue=\"hub\", commands to the dispatcher (ACKs, deliveries' outcomes, applied keys). Deliveries to consumer streams and the replies are not counted.",
            None,
            MetricType::Counter,
        )?;
        for (queue, n) in [("writes", &self.writes_crossed), ("hub", &self.hub_crossed)] {
            ConstCounter::new(n.load(r)).encode(family.encode_family(&[("queue", queue)])?)?;
        }
        let threads = self
            .threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut family = encoder.encode_descriptor(
            "futureq_executor_sleeps",
            "Times each executor's thread blocked (the kernel's voluntary context switches: waiting for I/O or another thread's wake-up).",
            None,
            MetricType::Counter,
        )?;
        for (core, tid) in threads {
            if let Some(n) = voluntary_switches(tid) {
                let core = core.to_string();
                ConstCounter::new(n).encode(family.encode_family(&[("core", core.as_str())])?)?;
            }
        }
        Ok(())
    }
}

/// One gauge of a collector, read at the scrape.
fn gauge(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(e)
}

/// What the registry reads at each scrape from the parts that keep it: the store's digest,
/// the data disk's free space, the certificates' reloads and expiry.
#[derive(Debug, Default)]
pub struct Scraped {
    /// The store's digest ([`futureq_storage::Store::digest_cell`]).
    pub store_digest: Arc<AtomicU64>,
    /// The data disk's free space (on disk storage).
    pub disk: Option<Arc<crate::disk::DiskSpace>>,
    /// Reloads and certificate expiries.
    pub security: Option<Arc<crate::security::Security>>,
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        if let Some(s) = &self.security {
            s.encode_metrics(&mut encoder)?;
        }
        gauge(
            &mut encoder,
            "futureq_store_digest",
            "Digest of the stored messages, indexes and groups (its low 52 bits, exact as a float): equal on replicas that applied the same log (compare at equal futureq_raft_applied_index).",
            self.store_digest.load(Ordering::Relaxed) & ((1 << 52) - 1),
        )?;
        if let Some(d) = &self.disk {
            if d.free_bytes() != u64::MAX {
                gauge(
                    &mut encoder,
                    "futureq_disk_free_bytes",
                    "Free bytes of the fullest data directory's file system, read every 500 ms.",
                    d.free_bytes(),
                )?;
            }
            gauge(
                &mut encoder,
                "futureq_disk_min_free_bytes",
                "storage.minFreeBytes: below it publishes are refused.",
                d.min_free(),
            )?;
            gauge(
                &mut encoder,
                "futureq_disk_low",
                "1 while the data disk is below storage.minFreeBytes and publishes are refused (deliveries, ACKs and cancels go on).",
                u64::from(d.low()),
            )?;
        }
        Ok(())
    }
}

/// Every metric the broker exports, and the registry that encodes them.
#[allow(missing_docs)]
pub struct Metrics {
    registry: Registry,
    pub publish_requests: LabeledCounter,
    pub messages_published: LabeledCounter,
    pub publish_batch_size: Histogram,
    /// Per ack level: QUORUM, LEADER, NO_ACK.
    pub publish_latency_seconds: [Histogram; 3],
    pub auth_refusals: LabeledCounter,
    pub active_consumers: Gauge,
    /// Consumer streams open, by the executor serving them (`core`).
    pub consumer_streams: Family<Labels, Gauge>,
    pub consumer_acks: LabeledCounter,
    pub messages_in_flight: Gauge,
    /// Messages stored per topic (the state machine's exact counts, refreshed periodically).
    pub topic_messages_stored: Arc<TopicGauge>,
    /// Deliveries in flight per topic (this node's dispatcher, refreshed with the above).
    pub topic_messages_in_flight: Arc<TopicGauge>,
    /// Mirrors of the hub's counters (set whole, `inner().store`).
    pub messages_dispatched: Counter,
    pub messages_redelivered: Counter,
    pub in_flight_timeouts: Counter,
    pub messages_expired: LabeledCounter,
    pub delivery_send_lateness_seconds: Histogram,
    pub delivery_grpc_sends: Counter,
    pub delete_batch_size: Histogram,
    pub delete_failures: Counter,
    /// Keys whose delete (an ACK, a drop) the write path committed.
    pub deletes_committed: Counter,
    pub pending_deletes: Gauge,
    pub parked_messages: Gauge,
    /// Messages a `Cancel` deleted.
    pub messages_cancelled: Counter,
    /// Messages a `Reschedule` moved.
    pub messages_rescheduled: Counter,
    /// Published messages not stored because their dedup id was remembered.
    pub messages_deduplicated: Counter,
    /// Copies stored on a dead-letter topic.
    pub messages_dead_lettered: Counter,
    /// Publish bytes in service ([`crate::budget::Budget`] counts in its atomic).
    pub publish_bytes_in_service: Gauge<u64, AtomicU64>,
    /// Mirrors of the store's apply statistics (set whole).
    pub store_commits: Counter,
    pub store_commit_ops: Counter,
    /// The event shard's state (clustered).
    pub raft: Arc<RaftMetrics>,
    /// Cross-core messages and executor sleeps.
    pub executors: Arc<Executors>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(Scraped::default())
    }
}

impl Metrics {
    /// Every metric, registered once (collectors are encoded after the registered metrics);
    /// `scraped` is read at each scrape.
    #[must_use]
    pub fn new(scraped: Scraped) -> Self {
        let mut r = Registry::default();
        r.register(
            "futureq_build",
            "The running build: always 1, with its version as a label",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let topics = Arc::new(TopicLabels::default());
        let publish_requests = LabeledCounter::register(
            &mut r,
            ("futureq_publish_requests", "Publish batches by outcome"),
            &["topic", "ack_level", "result"],
            Some(&topics),
        );
        let messages_published = LabeledCounter::register(
            &mut r,
            (
                "futureq_messages_published",
                "Messages accepted for storage",
            ),
            &["topic", "ack_level"],
            Some(&topics),
        );
        let publish_batch_size = histogram(SIZES);
        r.register(
            "futureq_publish_batch_size",
            "Messages per publish batch",
            publish_batch_size.clone(),
        );
        let latency: Family<[(&'static str, &'static str); 1], Histogram, _> =
            Family::new_with_constructor(|| histogram(LATENCY_SECONDS));
        r.register(
            "futureq_publish_latency_seconds",
            "Broker-side batch latency from receipt to ack",
            latency.clone(),
        );
        let publish_latency_seconds = ["quorum", "leader", "no_ack"]
            .map(|l| latency.get_or_create(&[("ack_level", l)]).clone());
        let raft = Arc::new(RaftMetrics::default());
        r.register_collector(Box::new(Arc::clone(&raft)));
        let executors = Arc::new(Executors::default());
        r.register_collector(Box::new(Arc::clone(&executors)));
        let auth_refusals = LabeledCounter::register(
            &mut r,
            (
                "futureq_auth_refusals",
                "Calls refused for want of a valid credential, by reason",
            ),
            &["reason"],
            None,
        );
        let m = Metrics {
            publish_requests,
            messages_published,
            publish_batch_size,
            publish_latency_seconds,
            auth_refusals,
            active_consumers: reg(&mut r, "futureq_active_consumers", "Connected consumers"),
            consumer_streams: reg(&mut r, "futureq_consumer_streams", "Consumer streams open, by the executor serving them (core, an index in runtime.cores): how the listeners spread consumers"),
            consumer_acks: LabeledCounter::register(
                &mut r,
                ("futureq_consumer_ack", "ACK (success=true) and NACK frames"),
                &["success"],
                None,
            ),
            messages_in_flight: reg(&mut r, "futureq_messages_in_flight", "Delivered, not yet acknowledged"),
            topic_messages_stored: topic_gauge(&mut r, "futureq_topic_messages_stored", &format!("Messages stored per topic, exact as of the last refresh (observability.metrics.topicsInterval); the {TOPIC_LABELS_MAX} topics with the most, the others summed under topic=\"\".")),
            topic_messages_in_flight: topic_gauge(&mut r, "futureq_topic_messages_in_flight", &format!("Deliveries in flight per topic on this node, as of the last refresh; the {TOPIC_LABELS_MAX} topics with the most, the others summed under topic=\"\".")),
            messages_dispatched: reg(&mut r, "futureq_messages_dispatched", "Deliveries handed to consumers"),
            messages_redelivered: reg(&mut r, "futureq_messages_redelivered", "Of those, redeliveries"),
            in_flight_timeouts: reg(&mut r, "futureq_in_flight_timeouts", "Deliveries not acknowledged within delivery.inFlightTimeout"),
            messages_expired: LabeledCounter::register(
                &mut r,
                ("futureq_messages_expired", "Messages removed because their TTL passed"),
                &["source"],
                None,
            ),
            delivery_send_lateness_seconds: reg_histogram(&mut r, "futureq_delivery_send_lateness_seconds", "Send time minus due time", LATENCY_SECONDS),
            delivery_grpc_sends: reg(&mut r, "futureq_delivery_grpc_sends", "Messages written to consumer streams"),
            delete_batch_size: reg_histogram(&mut r, "futureq_delete_batch_size", "Keys per delete flush", SIZES),
            delete_failures: reg(&mut r, "futureq_delete_failures", "Failed delete flushes (retried)"),
            deletes_committed: reg(&mut r, "futureq_deletes_committed", "Keys whose delete (acknowledged or dropped deliveries) the write path committed: durable in the journal or the Raft log"),
            pending_deletes: reg(&mut r, "futureq_pending_deletes", "Acknowledged keys awaiting their delete flush"),
            parked_messages: reg(&mut r, "futureq_messages_parked", "Messages acked by some consumer groups and kept for groups without members (remembered in memory, at most 1000000)"),
            messages_cancelled: reg(&mut r, "futureq_messages_cancelled", "Stored messages deleted by Cancel requests"),
            messages_rescheduled: reg(&mut r, "futureq_messages_rescheduled", "Stored messages moved to a new due time by Reschedule requests"),
            messages_deduplicated: reg(&mut r, "futureq_messages_deduplicated", "Published messages not stored because their dedup id was remembered (publish.dedupWindow); each answered with the first message's tag"),
            messages_dead_lettered: reg(&mut r, "futureq_messages_dead_lettered", "Copies stored on a dead-letter topic by recipients that gave up (max_attempts deliveries without an ACK)"),
            publish_bytes_in_service: reg(&mut r, "futureq_publish_in_service_bytes", "Publish bytes read from clients and not yet answered by the write core (streams stop reading while the node's budget is used up)"),
            store_commits: reg(&mut r, "futureq_store_commits", "Apply transactions committed to the store (each applies a group of log entries)"),
            store_commit_ops: reg(&mut r, "futureq_store_commit_ops", "Log entries applied by those transactions"),
            raft,
            executors,
            registry: r,
        };
        let mut m = m;
        m.registry.register_collector(Box::new(scraped));
        m
    }

    /// Renders every metric in the Prometheus text format (version 0.0.4).
    #[must_use]
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(16 << 10);
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut o, &self.registry)
        {
            tracing::error!(target: "metrics", error = %e, "encoding the metrics failed");
        }
        o
    }
}

/// A metric of its default kind, registered as `name`.
fn reg<M: prometheus_client::registry::Metric + Default + Clone>(
    r: &mut Registry,
    name: &str,
    help: &str,
) -> M {
    let m = M::default();
    r.register(name, help, m.clone());
    m
}

/// A histogram over `bounds`, registered as `name`.
fn reg_histogram(r: &mut Registry, name: &str, help: &str, bounds: &[f64]) -> Histogram {
    let h = histogram(bounds);
    r.register(name, help, h.clone());
    h
}

/// A per-topic gauge, registered as `name` (its help as given: a collector's help is not
/// completed with a period).
fn topic_gauge(r: &mut Registry, name: &'static str, help: &str) -> Arc<TopicGauge> {
    let g = Arc::new(TopicGauge::new(name, help.to_owned()));
    r.register_collector(Box::new(Arc::clone(&g)));
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.publish_requests.add(&["a\"b", "quorum", "success"], 2);
        m.publish_latency_seconds[0].observe(0.0003);
        let t = m.render();
        assert!(t.contains("futureq_publish_requests_total{topic=\"a\\\"b\",ack_level=\"quorum\",result=\"success\"} 2"), "{t}");
        assert!(
            t.contains(
                "futureq_publish_latency_seconds_bucket{ack_level=\"quorum\",le=\"0.0005\"} 1"
            ),
            "{t}"
        );
        assert!(t.contains(
            "futureq_publish_latency_seconds_bucket{ack_level=\"quorum\",le=\"0.00025\"} 0"
        ));
        assert!(t.contains("futureq_publish_latency_seconds_count{ack_level=\"quorum\"} 1"));
        assert!(
            t.contains("futureq_publish_latency_seconds_sum{ack_level=\"quorum\"} 0.0003"),
            "{t}"
        );
    }

    /// However many topics clients create, a `topic` label takes at most TOPIC_LABELS_MAX
    /// values (and ""): the first topics seen keep theirs, the others count under "".
    #[test]
    fn topic_labels_are_bounded() {
        let m = Metrics::default();
        for i in 0..TOPIC_LABELS_MAX + 50 {
            m.messages_published.add(&[&format!("t{i}"), "quorum"], 1);
        }
        m.messages_published.add(&["t0", "quorum"], 1);
        m.messages_published.add(&["t7", "leader"], 1);
        m.messages_published.add(&["late", "leader"], 2);
        m.messages_published.add(&["", "leader"], 1);
        // The same topics in every counter.
        m.publish_requests.add(&["late", "leader", "success"], 1);
        m.publish_requests.add(&["t9", "leader", "success"], 1);
        let t = m.render();
        assert!(t.contains("futureq_publish_requests_total{topic=\"\",ack_level=\"leader\",result=\"success\"} 1"), "{t}");
        assert!(t.contains("futureq_publish_requests_total{topic=\"t9\",ack_level=\"leader\",result=\"success\"} 1"), "{t}");
        let series = |p: &str| t.lines().filter(|l| l.starts_with(p)).count();
        assert_eq!(
            series("futureq_messages_published_total{"),
            TOPIC_LABELS_MAX + 3
        );
        assert!(t.contains("futureq_messages_published_total{topic=\"t0\",ack_level=\"quorum\"} 2"));
        assert!(t.contains("futureq_messages_published_total{topic=\"t7\",ack_level=\"leader\"} 1"));
        assert!(t.contains("futureq_messages_published_total{topic=\"\",ack_level=\"quorum\"} 50"));
        assert!(t.contains("futureq_messages_published_total{topic=\"\",ack_level=\"leader\"} 3"));
    }

    #[test]
    fn topic_gauges_render_their_last_refresh() {
        let m = Metrics::default();
        let t = m.render();
        assert!(
            !t.contains("futureq_topic_messages_stored{"),
            "none before a refresh"
        );
        m.topic_messages_stored
            .set(vec![("a".into(), 5), ("b\"".into(), 3)], 0);
        m.topic_messages_in_flight.set(vec![("a".into(), 1)], 4);
        let t = m.render();
        assert!(t.contains("futureq_topic_messages_stored{topic=\"a\"} 5\nfutureq_topic_messages_stored{topic=\"b\\\"\"} 3\n"), "{t}");
        assert!(
            !t.contains("futureq_topic_messages_stored{topic=\"\"}"),
            "no rest: {t}"
        );
        assert!(t.contains("futureq_topic_messages_in_flight{topic=\"a\"} 1\nfutureq_topic_messages_in_flight{topic=\"\"} 4\n"), "{t}");
        m.topic_messages_stored.set(vec![], 0);
        assert!(
            !m.render().contains("futureq_topic_messages_stored{"),
            "{t}"
        );
        // From every topic: the largest keep their label, the rest is summed.
        let all: Vec<(String, u64)> = (0..TOPIC_LABELS_MAX as u64 + 2)
            .map(|i| (format!("t{i}"), i))
            .collect();
        m.topic_messages_in_flight.set_all(all);
        let t = m.render();
        let series = |p: &str| t.lines().filter(|l| l.starts_with(p)).count();
        assert_eq!(
            series("futureq_topic_messages_in_flight{"),
            TOPIC_LABELS_MAX + 1
        );
        let last = TOPIC_LABELS_MAX + 1;
        assert!(
            t.contains(&format!(
                "futureq_topic_messages_in_flight{{topic=\"t{last}\"}} {last}\n"
            )),
            "{t}"
        );
        assert!(
            t.contains("futureq_topic_messages_in_flight{topic=\"\"} 1\n"),
            "t1 (t0 is 0): {t}"
        );
    }
}
