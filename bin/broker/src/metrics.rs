//! Broker metrics in Prometheus text format (`futureq_` prefix), shared by every core.
//!
//! Counters and histograms are atomics (lock-free on the hot path) except labelled series,
//! which take a short mutex keyed by their label values. Units are Prometheus base units
//! (`_seconds`, `_bytes`). A `topic` label names at most [`TOPIC_LABELS_MAX`] topics, the
//! same ones in every counter (the first seen since the start; for the gauges, the largest at
//! each refresh); everything else is counted under `topic=""` (no topic is named so: other
//! topics, publish batches of several topics, refused ones), however many topics clients
//! create.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// A histogram with fixed upper bounds.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, v: f64) {
        for (i, b) in self.bounds.iter().enumerate() {
            if v <= *b {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        // Stored as millionths so the sum stays an integer atomic.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.sum_micros
            .fetch_add((v.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in self.bounds.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {}",
                self.counts[i].load(Ordering::Relaxed)
            );
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {n}");
        #[allow(clippy::cast_precision_loss)]
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {n}");
    }
}

/// Buckets for latencies in seconds (100 µs to 5 s).
pub const LATENCY_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// Topics that get a `topic` label value of their own (see the module docs).
pub const TOPIC_LABELS_MAX: usize = 100;

/// A label value in the text format: backslash, quote and newline escaped.
fn escaped(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
/// Buckets for batch sizes.
pub const SIZES: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

type Labels = Vec<String>;

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

/// A counter with labels.
pub struct LabeledCounter {
    names: &'static [&'static str],
    /// For a counter with a `topic` label: the topics it may name.
    topics: Option<std::sync::Arc<TopicLabels>>,
    series: Mutex<BTreeMap<Labels, u64>>,
}

impl LabeledCounter {
    /// A counter without a `topic` label (see [`LabeledCounter::with_topic`]).
    fn new(names: &'static [&'static str]) -> Self {
        debug_assert!(!names.contains(&"topic"), "a topic label is bounded");
        LabeledCounter {
            names,
            topics: None,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    /// A counter whose first label is `topic`, named from `topics`.
    fn with_topic(names: &'static [&'static str], topics: &std::sync::Arc<TopicLabels>) -> Self {
        debug_assert_eq!(names.first(), Some(&"topic"));
        LabeledCounter {
            names,
            topics: Some(std::sync::Arc::clone(topics)),
            series: Mutex::new(BTreeMap::new()),
        }
    }

    /// Adds `n` to the series with these label values (a topic without a label value of its
    /// own counts under `topic=""`).
    pub fn add(&self, values: &[&str], n: u64) {
        let mut labels: Labels = values.iter().map(|v| (*v).to_owned()).collect();
        if let (Some(topics), Some(t)) = (&self.topics, labels.first_mut()) {
            topics.label(t);
        }
        let mut s = self
            .series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *s.entry(labels).or_insert(0) += n;
    }

    fn render(&self, out: &mut String, name: &str) {
        let s = self
            .series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (vals, n) in s.iter() {
            let labels: Vec<String> = self
                .names
                .iter()
                .zip(vals)
                .map(|(k, v)| format!("{k}=\"{}\"", escaped(v)))
                .collect();
            let _ = writeln!(out, "{name}{{{}}} {n}", labels.join(","));
        }
    }
}

/// A gauge per topic, set whole by each refresh: the [`TOPIC_LABELS_MAX`] largest topics and
/// the sum over the others (`topic=""`). Nothing is exported before the first refresh.
#[derive(Default)]
pub struct TopicGauge(Mutex<Option<TopicValues>>);

/// The labelled topics (name, value) and the sum over the others.
type TopicValues = (Vec<(String, u64)>, u64);

impl TopicGauge {
    /// Sets the gauge: `top` (name, value), and `rest` for every other topic.
    pub fn set(&self, top: Vec<(String, u64)>, rest: u64) {
        *self
            .0
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

    fn render(&self, out: &mut String, name: &str) {
        let g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some((top, rest)) = g.as_ref() else {
            return;
        };
        for (topic, n) in top {
            let _ = writeln!(out, "{name}{{topic=\"{}\"}} {n}", escaped(topic));
        }
        if *rest > 0 {
            let _ = writeln!(out, "{name}{{topic=\"\"}} {rest}");
        }
    }
}

/// Every metric the broker exports.
#[allow(missing_docs)]
pub struct Metrics {
    pub publish_requests: LabeledCounter,
    pub messages_published: LabeledCounter,
    pub publish_batch_size: Histogram,
    pub publish_latency_seconds: [Histogram; 3],
    pub active_consumers: AtomicI64,
    pub consumer_acks: LabeledCounter,
    pub messages_in_flight: AtomicI64,
    /// Messages stored per topic (the state machine's exact counts, refreshed periodically).
    pub topic_messages_stored: TopicGauge,
    /// Deliveries in flight per topic (this node's dispatcher, refreshed with the above).
    pub topic_messages_in_flight: TopicGauge,
    pub messages_dispatched: AtomicU64,
    pub messages_redelivered: AtomicU64,
    pub in_flight_timeouts: AtomicU64,
    pub messages_expired: LabeledCounter,
    pub delivery_send_lateness_seconds: Histogram,
    pub delivery_grpc_sends: AtomicU64,
    pub delete_batch_size: Histogram,
    pub delete_failures: AtomicU64,
    /// Keys whose delete (an ACK, a drop) the write path committed.
    pub deletes_committed: AtomicU64,
    pub pending_deletes: AtomicI64,
    pub parked_messages: AtomicI64,
    /// Messages a `Cancel` deleted.
    pub messages_cancelled: AtomicU64,
    /// Messages a `Reschedule` moved.
    pub messages_rescheduled: AtomicU64,
    /// Published messages not stored because their dedup id was remembered.
    pub messages_deduplicated: AtomicU64,
    /// Copies stored on a dead-letter topic.
    pub messages_dead_lettered: AtomicU64,
    /// Publish bytes in service ([`crate::budget::Budget`] counts here).
    pub publish_bytes_in_service: AtomicU64,
    pub store_commits: AtomicU64,
    pub store_commit_ops: AtomicU64,
    /// The store's digest ([`futureq_storage::Store::digest_cell`]).
    pub store_digest: std::sync::Arc<AtomicU64>,
    /// The data disk's free space (on disk storage).
    pub disk: Option<std::sync::Arc<crate::disk::DiskSpace>>,
    /// Clustered mode: the Raft gauges below are exported.
    pub clustered: std::sync::atomic::AtomicBool,
    pub raft_term: AtomicU64,
    pub raft_is_leader: AtomicU64,
    pub raft_applied_index: AtomicU64,
    pub raft_last_log_index: AtomicU64,
    pub raft_purged_index: AtomicU64,
    pub raft_leader_changes: AtomicU64,
    pub raft_refused_entries: AtomicU64,
    /// Publish batches proposed in each event-shard entry (`cluster::coalesce`).
    pub raft_entry_batches: Histogram,
    /// Calls refused before any service saw them, by reason (UNAUTHENTICATED).
    pub auth_refusals: LabeledCounter,
    /// Reloads and certificate expiries.
    pub security: Option<std::sync::Arc<crate::security::Security>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let topics = std::sync::Arc::new(TopicLabels::default());
        Metrics {
            publish_requests: LabeledCounter::with_topic(
                &["topic", "ack_level", "result"],
                &topics,
            ),
            messages_published: LabeledCounter::with_topic(&["topic", "ack_level"], &topics),
            publish_batch_size: Histogram::new(SIZES),
            publish_latency_seconds: [
                Histogram::new(LATENCY_SECONDS),
                Histogram::new(LATENCY_SECONDS),
                Histogram::new(LATENCY_SECONDS),
            ],
            active_consumers: AtomicI64::new(0),
            consumer_acks: LabeledCounter::new(&["success"]),
            messages_in_flight: AtomicI64::new(0),
            topic_messages_stored: TopicGauge::default(),
            topic_messages_in_flight: TopicGauge::default(),
            messages_dispatched: AtomicU64::new(0),
            messages_redelivered: AtomicU64::new(0),
            in_flight_timeouts: AtomicU64::new(0),
            messages_expired: LabeledCounter::new(&["source"]),
            delivery_send_lateness_seconds: Histogram::new(LATENCY_SECONDS),
            delivery_grpc_sends: AtomicU64::new(0),
            delete_batch_size: Histogram::new(SIZES),
            delete_failures: AtomicU64::new(0),
            deletes_committed: AtomicU64::new(0),
            pending_deletes: AtomicI64::new(0),
            parked_messages: AtomicI64::new(0),
            publish_bytes_in_service: AtomicU64::new(0),
            messages_cancelled: AtomicU64::new(0),
            messages_rescheduled: AtomicU64::new(0),
            messages_deduplicated: AtomicU64::new(0),
            messages_dead_lettered: AtomicU64::new(0),
            store_commits: AtomicU64::new(0),
            store_commit_ops: AtomicU64::new(0),
            store_digest: std::sync::Arc::default(),
            disk: None,
            clustered: std::sync::atomic::AtomicBool::new(false),
            raft_term: AtomicU64::new(0),
            raft_is_leader: AtomicU64::new(0),
            raft_applied_index: AtomicU64::new(0),
            raft_last_log_index: AtomicU64::new(0),
            raft_purged_index: AtomicU64::new(0),
            raft_leader_changes: AtomicU64::new(0),
            raft_refused_entries: AtomicU64::new(0),
            raft_entry_batches: Histogram::new(SIZES),
            auth_refusals: LabeledCounter::new(&["reason"]),
            security: None,
        }
    }
}

fn scalar(out: &mut String, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
    );
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

impl Metrics {
    /// Renders every metric in Prometheus text format.
    #[must_use]
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(8 << 10);
        header(
            &mut o,
            "futureq_build_info",
            "gauge",
            "The running build: always 1, with its version as a label.",
        );
        let _ = writeln!(
            o,
            "futureq_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        self.render_publish(&mut o);
        self.render_raft(&mut o);
        self.render_security(&mut o);
        self.render_delivery(&mut o);
        self.render_deletes(&mut o);
        self.render_storage(&mut o);
        o
    }

    /// Publishing: requests, messages, batch sizes, latency per ack level.
    fn render_publish(&self, o: &mut String) {
        header(
            o,
            "futureq_publish_requests_total",
            "counter",
            "Publish batches by outcome.",
        );
        self.publish_requests
            .render(o, "futureq_publish_requests_total");
        header(
            o,
            "futureq_messages_published_total",
            "counter",
            "Messages accepted for storage.",
        );
        self.messages_published
            .render(o, "futureq_messages_published_total");
        header(
            o,
            "futureq_publish_batch_size",
            "histogram",
            "Messages per publish batch.",
        );
        self.publish_batch_size
            .render(o, "futureq_publish_batch_size", "");
        header(
            o,
            "futureq_publish_latency_seconds",
            "histogram",
            "Broker-side batch latency from receipt to ack.",
        );
        for (i, l) in ["quorum", "leader", "no_ack"].iter().enumerate() {
            self.publish_latency_seconds[i].render(
                o,
                "futureq_publish_latency_seconds",
                &format!("ack_level=\"{l}\""),
            );
        }
    }

    /// The Raft group (clustered only): term, leadership, log indexes, entry batches.
    fn render_raft(&self, o: &mut String) {
        let r = Ordering::Relaxed;
        if self.clustered.load(r) {
            for (name, kind, help, v) in [
                (
                    "futureq_raft_term",
                    "gauge",
                    "Current term of the event shard.",
                    &self.raft_term,
                ),
                (
                    "futureq_raft_is_leader",
                    "gauge",
                    "1 while this node leads the event shard and takes clients.",
                    &self.raft_is_leader,
                ),
                (
                    "futureq_raft_applied_index",
                    "gauge",
                    "Last event-shard log index applied to the store.",
                    &self.raft_applied_index,
                ),
                (
                    "futureq_raft_last_log_index",
                    "gauge",
                    "Last index in this node's event-shard log.",
                    &self.raft_last_log_index,
                ),
                (
                    "futureq_raft_purged_index",
                    "gauge",
                    "Event-shard log entries up to this index were compacted into a snapshot.",
                    &self.raft_purged_index,
                ),
                (
                    "futureq_raft_leader_changes_total",
                    "counter",
                    "Times this node gained or lost event-shard leadership.",
                    &self.raft_leader_changes,
                ),
                (
                    "futureq_raft_refused_entries_total",
                    "counter",
                    "Committed event-shard entries the state machine refused (undecodable, or event ids from an earlier term); nothing of them was applied.",
                    &self.raft_refused_entries,
                ),
            ] {
                scalar(o, name, kind, help, v.load(r));
            }
            header(
                o,
                "futureq_raft_entry_batches",
                "histogram",
                "Publish batches coalesced into each proposed event-shard entry.",
            );
            self.raft_entry_batches
                .render(o, "futureq_raft_entry_batches", "");
        }
    }

    /// Authentication refusals, and the certificates' reloads and expiry.
    fn render_security(&self, o: &mut String) {
        header(
            o,
            "futureq_auth_refusals_total",
            "counter",
            "Calls refused for want of a valid credential, by reason.",
        );
        self.auth_refusals.render(o, "futureq_auth_refusals_total");
        if let Some(s) = &self.security {
            s.render(o);
        }
    }

    /// Delivery: consumers, in flight, per-topic gauges, dispatches, expiry, lateness.
    fn render_delivery(&self, o: &mut String) {
        let r = Ordering::Relaxed;
        scalar(
            o,
            "futureq_active_consumers",
            "gauge",
            "Connected consumers.",
            self.active_consumers.load(r),
        );
        header(
            o,
            "futureq_consumer_ack_total",
            "counter",
            "ACK (success=true) and NACK frames.",
        );
        self.consumer_acks.render(o, "futureq_consumer_ack_total");
        scalar(
            o,
            "futureq_messages_in_flight",
            "gauge",
            "Delivered, not yet acknowledged.",
            self.messages_in_flight.load(r),
        );
        header(
            o,
            "futureq_topic_messages_stored",
            "gauge",
            &format!("Messages stored per topic, exact as of the last refresh (observability.metrics.topicsInterval); the {TOPIC_LABELS_MAX} topics with the most, the others summed under topic=\"\"."),
        );
        self.topic_messages_stored
            .render(o, "futureq_topic_messages_stored");
        header(
            o,
            "futureq_topic_messages_in_flight",
            "gauge",
            &format!("Deliveries in flight per topic on this node, as of the last refresh; the {TOPIC_LABELS_MAX} topics with the most, the others summed under topic=\"\"."),
        );
        self.topic_messages_in_flight
            .render(o, "futureq_topic_messages_in_flight");
        scalar(
            o,
            "futureq_messages_dispatched_total",
            "counter",
            "Deliveries handed to consumers.",
            self.messages_dispatched.load(r),
        );
        scalar(
            o,
            "futureq_messages_redelivered_total",
            "counter",
            "Of those, redeliveries.",
            self.messages_redelivered.load(r),
        );
        scalar(
            o,
            "futureq_in_flight_timeouts_total",
            "counter",
            "Deliveries not acknowledged within delivery.inFlightTimeout.",
            self.in_flight_timeouts.load(r),
        );
        header(
            o,
            "futureq_messages_expired_total",
            "counter",
            "Messages removed because their TTL passed.",
        );
        self.messages_expired
            .render(o, "futureq_messages_expired_total");
        header(
            o,
            "futureq_delivery_send_lateness_seconds",
            "histogram",
            "Send time minus due time.",
        );
        self.delivery_send_lateness_seconds
            .render(o, "futureq_delivery_send_lateness_seconds", "");
        scalar(
            o,
            "futureq_delivery_grpc_sends_total",
            "counter",
            "Messages written to consumer streams.",
            self.delivery_grpc_sends.load(r),
        );
    }

    /// Deletes: batch sizes, failures, commits, pending and parked messages.
    fn render_deletes(&self, o: &mut String) {
        let r = Ordering::Relaxed;
        header(
            o,
            "futureq_delete_batch_size",
            "histogram",
            "Keys per delete flush.",
        );
        self.delete_batch_size
            .render(o, "futureq_delete_batch_size", "");
        scalar(
            o,
            "futureq_delete_failures_total",
            "counter",
            "Failed delete flushes (retried).",
            self.delete_failures.load(r),
        );
        scalar(
            o,
            "futureq_deletes_committed_total",
            "counter",
            "Keys whose delete (acknowledged or dropped deliveries) the write path committed: durable in the journal or the Raft log.",
            self.deletes_committed.load(r),
        );
        scalar(
            o,
            "futureq_pending_deletes",
            "gauge",
            "Acknowledged keys awaiting their delete flush.",
            self.pending_deletes.load(r),
        );
        scalar(
            o,
            "futureq_messages_parked",
            "gauge",
            "Messages acked by some consumer groups and kept for groups without members (remembered in memory, at most 1000000).",
            self.parked_messages.load(r),
        );
    }

    /// The write path's other commands, the publish budget, the store and the data disk.
    fn render_storage(&self, o: &mut String) {
        let r = Ordering::Relaxed;
        scalar(
            o,
            "futureq_messages_cancelled_total",
            "counter",
            "Stored messages deleted by Cancel requests.",
            self.messages_cancelled.load(r),
        );
        scalar(
            o,
            "futureq_messages_rescheduled_total",
            "counter",
            "Stored messages moved to a new due time by Reschedule requests.",
            self.messages_rescheduled.load(r),
        );
        scalar(
            o,
            "futureq_messages_deduplicated_total",
            "counter",
            "Published messages not stored because their dedup id was remembered (publish.dedupWindow); each answered with the first message's tag.",
            self.messages_deduplicated.load(r),
        );
        scalar(
            o,
            "futureq_messages_dead_lettered_total",
            "counter",
            "Copies stored on a dead-letter topic by recipients that gave up (max_attempts deliveries without an ACK).",
            self.messages_dead_lettered.load(r),
        );
        scalar(
            o,
            "futureq_publish_in_service_bytes",
            "gauge",
            "Publish bytes read from clients and not yet answered by the write core (streams stop reading while the node's budget is used up).",
            self.publish_bytes_in_service.load(r),
        );
        scalar(
            o,
            "futureq_store_commits_total",
            "counter",
            "Apply transactions committed to the store (each applies a group of log entries).",
            self.store_commits.load(r),
        );
        scalar(
            o,
            "futureq_store_commit_ops_total",
            "counter",
            "Log entries applied by those transactions.",
            self.store_commit_ops.load(r),
        );
        scalar(
            o,
            "futureq_store_digest",
            "gauge",
            "Digest of the stored messages, indexes and groups (its low 52 bits, exact as a float): equal on replicas that applied the same log (compare at equal futureq_raft_applied_index).",
            self.store_digest.load(r) & ((1 << 52) - 1),
        );
        if let Some(d) = &self.disk {
            if d.free_bytes() != u64::MAX {
                scalar(
                    o,
                    "futureq_disk_free_bytes",
                    "gauge",
                    "Free bytes of the fullest data directory's file system, read every 500 ms.",
                    d.free_bytes(),
                );
            }
            scalar(
                o,
                "futureq_disk_min_free_bytes",
                "gauge",
                "storage.minFreeBytes: below it publishes are refused.",
                d.min_free(),
            );
            scalar(
                o,
                "futureq_disk_low",
                "gauge",
                "1 while the data disk is below storage.minFreeBytes and publishes are refused (deliveries, ACKs and cancels go on).",
                u8::from(d.low()),
            );
        }
    }
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
