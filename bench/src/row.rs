//! One measured run of the comparison: a row of its table and of `results.json`, and what
//! the plots draw.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::stats::PublishOut;

/// Payload bytes of lateness messages (the bench publishes them with 100 B) and the default
/// message size.
pub(crate) const MSG_BYTES: usize = 100;

/// What a series cost the broker per acked message (every node of a cluster; the load
/// generator is not counted), and the elections it saw.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Costs {
    /// CPU time, µs.
    pub(crate) cpu_us: Option<f64>,
    /// Thread sleeps (voluntary context switches): each is a wake-up paid later.
    pub(crate) sleeps: Option<f64>,
    /// Messages put in queues another executor serves (`futureq_cross_core_messages_total`),
    /// all nodes.
    pub(crate) cross_core: Option<f64>,
    /// How much the Raft term grew (elections) during the series: 0 unless a fault or an
    /// overload moved leadership (cluster only).
    pub(crate) term_changes: Option<u64>,
    /// Leadership gained or lost on any node during the series: 0 with no fault (cluster
    /// only).
    pub(crate) leader_changes: Option<u64>,
    /// Leases that lapsed while their leader went on leading the same term (followers that
    /// answered late; deliveries were held meanwhile) (cluster only).
    pub(crate) lease_lapses: Option<u64>,
}

impl Costs {
    /// Only the leadership moves between two readings (`None` if either is missing).
    pub(crate) fn moves(
        before: Option<crate::procs::Leadership>,
        after: Option<crate::procs::Leadership>,
    ) -> Costs {
        let both = before.zip(after);
        Costs {
            term_changes: both.map(|(b, a)| a.term.saturating_sub(b.term)),
            leader_changes: both.map(|(b, a)| a.changes.saturating_sub(b.changes)),
            lease_lapses: both.map(|(b, a)| a.lapses.saturating_sub(b.lapses)),
            ..Costs::default()
        }
    }
}

/// One measured run (one row of the table, one element of `runs`).
#[derive(Debug, Serialize)]
pub(crate) struct Run {
    pub(crate) system: &'static str,
    pub(crate) mode: &'static str,
    pub(crate) ack_level: &'static str,
    pub(crate) scenario: &'static str,
    pub(crate) msg_bytes: usize,
    pub(crate) msgs_per_s: f64,
    pub(crate) mb_per_s: f64,
    pub(crate) p50_us: f64,
    pub(crate) p90_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
    pub(crate) rss_mb: Option<f64>,
    /// Messages per publish request (1 = one ack per message); 0 for other scenarios.
    pub(crate) batch: usize,
    /// `closed` (fixed requests in flight) or `open` (fixed offered rate).
    pub(crate) load: &'static str,
    pub(crate) offered_msgs_per_s: Option<f64>,
    pub(crate) pending_msgs: Option<u64>,
    pub(crate) fill_msgs_per_s: Option<f64>,
    pub(crate) restart_ms: Option<f64>,
    /// Lateness runs: messages delivered before their due time (not in the percentiles).
    pub(crate) early: Option<u64>,
    /// Failover runs: how many failovers the percentiles are over.
    pub(crate) repetitions: Option<usize>,
    /// Closed-loop publish: the server's CPU time per acked message (all nodes of a cluster),
    /// µs.
    pub(crate) cpu_us_per_msg: Option<f64>,
    /// Publish series: the server's thread sleeps (voluntary context switches) per acked
    /// message, all nodes.
    pub(crate) sleeps_per_msg: Option<f64>,
    /// Publish series: messages the broker's threads put in queues another executor serves,
    /// per acked message, all nodes (`futureq_cross_core_messages_total`).
    pub(crate) cross_core_per_msg: Option<f64>,
    /// Cluster publish series: elections during the series (Raft term growth); no fault is
    /// injected, so anything above 0 is a defect.
    pub(crate) term_changes: Option<u64>,
    /// Cluster publish and pending series: leadership gained or lost on any node (also a
    /// leader that heard no quorum for 13 rtt and led again in the same term); anything above
    /// 0 is a defect.
    pub(crate) leader_changes: Option<u64>,
    /// Cluster publish and pending series: leases that lapsed in the same term (deliveries
    /// held while the followers answered late; not a leader change).
    pub(crate) lease_lapses: Option<u64>,
    /// Publish series: messages of the measured window refused as OVERLOADED (shed load,
    /// nothing stored, a retry hint given).
    pub(crate) refused_msgs: Option<u64>,
    /// Cluster pending: the largest RSS of one node when it starts (after the publish and
    /// failover series on the same cluster), MiB: tells what the fill added.
    pub(crate) node_rss_before_mb: Option<f64>,
    /// Cluster pending: the largest RSS of one node while filling and publishing, MiB.
    pub(crate) node_rss_max_mb: Option<f64>,
    /// Cluster pending: time until a fresh node that joined applied what the leader had, ms.
    pub(crate) join_ms: Option<f64>,
    /// Cluster pending: the joining node's largest RSS until then, MiB.
    pub(crate) join_rss_mb: Option<f64>,
    /// The latency (or lateness) histogram, µs: for the plots.
    #[serde(skip)]
    pub(crate) hist: Histogram<u64>,
}

/// What a row measured: `(system, mode, ack level or peer setting, scenario, batch)`.
pub(crate) type Key = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    usize,
);

impl Run {
    pub(crate) fn new(
        (system, mode, ack_level, scenario, batch): Key,
        msgs_per_s: f64,
        h: Histogram<u64>,
        rss_mb: Option<f64>,
    ) -> Run {
        #[allow(clippy::cast_precision_loss)]
        let q = |x| h.value_at_quantile(x) as f64;
        #[allow(clippy::cast_precision_loss)]
        let max_us = h.max() as f64;
        Run {
            system,
            mode,
            ack_level,
            scenario,
            msg_bytes: MSG_BYTES,
            msgs_per_s,
            // Set by `run` once the message size of every row is known.
            mb_per_s: 0.0,
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us,
            rss_mb,
            batch,
            load: "closed",
            offered_msgs_per_s: None,
            pending_msgs: None,
            fill_msgs_per_s: None,
            restart_ms: None,
            early: None,
            repetitions: None,
            cpu_us_per_msg: None,
            sleeps_per_msg: None,
            cross_core_per_msg: None,
            term_changes: None,
            leader_changes: None,
            lease_lapses: None,
            refused_msgs: None,
            node_rss_before_mb: None,
            node_rss_max_mb: None,
            join_ms: None,
            join_rss_mb: None,
            hist: h,
        }
    }

    pub(crate) fn publish(key: Key, o: PublishOut, rss_mb: Option<f64>) -> Run {
        let mut run = Run::new(key, o.msgs_per_s, o.latency, rss_mb);
        run.refused_msgs = Some(o.refused);
        run
    }

    /// With the costs the broker paid for it.
    pub(crate) fn costs(mut self, c: Costs) -> Run {
        self.cpu_us_per_msg = c.cpu_us;
        self.sleeps_per_msg = c.sleeps;
        self.cross_core_per_msg = c.cross_core;
        self.term_changes = c.term_changes;
        self.leader_changes = c.leader_changes;
        self.lease_lapses = c.lease_lapses;
        self
    }

    pub(crate) fn open(mut self, offered: f64) -> Run {
        self.load = "open";
        self.offered_msgs_per_s = Some(offered);
        self
    }

    pub(crate) fn pending(mut self, count: u64, fill_rate: f64, restart: Duration) -> Run {
        self.pending_msgs = Some(count);
        self.fill_msgs_per_s = Some(fill_rate);
        self.restart_ms = Some(restart.as_secs_f64() * 1000.0);
        self
    }
}
