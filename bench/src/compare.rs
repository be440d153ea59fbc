//! `futureq-bench compare`: starts each system under test itself, measures it, stops it, and
//! reports every run side by side (markdown table on stdout; `results.json` and PNG plots in
//! `--out`).
//!
//! Systems: futureq standalone and as a 3-node loopback cluster (real processes); Redis 7
//! sorted sets with AOF `appendfsync always` and `everysec` (the `redis` crate); NATS JetStream
//! (the current release from `target/peers/venv`, `async-nats`) with file storage, R1 and a
//! 3-server R3 cluster, each with `sync_interval: always` and with the default, and its message
//! schedules as a delayed queue. A peer that is not installed is skipped with a line
//! (`scripts/install-peers.sh` installs them).
//!
//! Scenarios: `publish` closed-loop (8 connections × 4 requests in flight; batches of 100 and
//! of 1 — the peers publish one message per ack) and open-loop up a ladder of offered rates
//! while the system sustains them (coordinated-omission corrected, see [`crate::openloop`]); `lateness` (receive − due) at a
//! steady due rate and for a burst; `pending` (publish rate, latency and RSS with a backlog of
//! far-future messages; restart time to serving with it; on the cluster, the largest RSS of a
//! node and a fresh node's catch-up time and RSS); `failover` (3 nodes: kill -9 of the
//! loaded leader → the first QUORUM ack from the new leader, repeated; see
//! [`crate::failover`]).
//!
//! `results.json` schema (stable, other tools read it): `{"machine": {...}, "runs": [{"system",
//! "mode", "ack_level", "scenario", "msg_bytes", "msgs_per_s", "p50_us", "p99_us", "p999_us",
//! "rss_mb", …}]}` plus, per run: `batch` (messages per request; 0 outside publish), `load`
//! (`closed` or `open`), `offered_msgs_per_s` (open loop), `mb_per_s`, `p90_us`, `max_us`,
//! `pending_msgs`, `fill_msgs_per_s` and `restart_ms` (pending), `cpu_us_per_msg` and
//! `sleeps_per_msg` (futureq publish, closed and open loop: the server's CPU time and thread
//! sleeps per acked message, all nodes of a cluster; the peers' CPU time), `term_changes`
//! `leader_changes` and `lease_lapses` (futureq cluster publish, and pending with its fill:
//! elections, leadership gained or lost on any node, 0 without a fault, and leases that
//! lapsed in the same term while followers answered late), `refused_msgs` (publish: messages
//! of the measured window refused as OVERLOADED, the load a system shed), `early` (lateness: messages
//! delivered before their due time, not in the percentiles), `repetitions` (failover: the
//! failovers timed; the percentiles are over them, µs), `node_rss_before_mb` (the largest
//! RSS of a node when the cluster pending scenario starts), `node_rss_max_mb`, `join_ms` and
//! `join_rss_mb` (cluster pending). For `lateness` runs
//! `msgs_per_s` is the due rate (0 for a burst) and the percentiles are lateness.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::load::{drain, lateness_run, publish_open, publish_run, Ack, PublishParams};
use crate::openloop::Schedule;
use crate::procs::{standalone, Broker, Cluster, Leadership, PeerProcess, RssPeaks};
use crate::row::{Costs, Key, Run};
use crate::stats::PublishOut;

/// The systems `compare` can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum System {
    Futureq,
    Redis,
    Nats,
}

#[derive(Debug, Serialize)]
struct Machine {
    cpus: usize,
    kernel: String,
    memory_gib: f64,
    /// The peers' `--version` lines (those installed).
    peers: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    runs: Vec<Run>,
}

/// Counts and durations of one compare run.
pub(crate) struct Plan {
    warmup: Duration,
    measure: Duration,
    /// Lateness series: (messages, due rate per second; 0 = burst).
    lateness: Vec<(usize, u64)>,
    lead_ms: i64,
    /// The open-loop ladder, msgs/s offered (one message per request): each system climbs it
    /// while it sustains the rate ([`sustained`]).
    open_rates: Vec<f64>,
    /// Far-future messages waiting in the pending scenario.
    pending: u64,
    /// Payload bytes of each published message (lateness and pending use 100).
    msg_bytes: usize,
    /// Messages per request of the batched closed-loop series (every system also runs 1).
    batch: usize,
    /// Leader kills in the failover scenario.
    failovers: usize,
}

impl Plan {
    pub(crate) fn new(quick: bool, msg_bytes: usize, batch: usize) -> Self {
        if quick {
            Plan {
                warmup: Duration::from_millis(500),
                measure: Duration::from_millis(1500),
                lateness: vec![(10_000, 10_000), (10_000, 0)],
                lead_ms: 1000,
                open_rates: vec![10_000.0],
                pending: 1_000_000,
                msg_bytes,
                batch,
                failovers: 2,
            }
        } else {
            Plan {
                warmup: Duration::from_secs(1),
                measure: Duration::from_secs(10),
                lateness: vec![(100_000, 10_000), (1_000_000, 100_000), (100_000, 0)],
                lead_ms: 2000,
                open_rates: vec![
                    10_000.0, 20_000.0, 30_000.0, 40_000.0, 60_000.0, 80_000.0, 120_000.0,
                    160_000.0,
                ],
                pending: 10_000_000,
                msg_bytes,
                batch,
                failovers: 10,
            }
        }
    }

    /// The closed-loop publish every system gets: 8 connections × 4 in flight, `msg_bytes`
    /// messages, `batch` per request (`ack` and `delay_ms` matter to futureq only).
    pub(crate) fn publish(&self, batch: usize, ack: Ack, delay_ms: i64) -> PublishParams {
        PublishParams {
            streams: 8,
            window: 4,
            batch,
            size: self.msg_bytes,
            warmup: self.warmup,
            measure: self.measure,
            ack,
            delay_ms,
            dedup: false,
        }
    }

    /// The open-loop schedule at `rate` msgs/s: 8 connections, one message per request.
    fn open(&self, rate: f64) -> Schedule {
        Schedule {
            rate,
            streams: 8,
            batch: 1,
            warmup: self.warmup,
            measure: self.measure,
        }
    }

    /// The batch sizes of the closed-loop series: the configured one, and 1.
    fn batches(&self) -> Vec<usize> {
        if self.batch == 1 {
            vec![1]
        } else {
            vec![self.batch, 1]
        }
    }

    /// Progress steps of a run with every peer installed (at most: each ladder stops where
    /// its system stops keeping up).
    fn steps(&self) -> usize {
        let (open, late) = (self.open_rates.len(), self.lateness.len());
        let futureq = 6 + open + 1 + late + 1 + 1 + 6 + open + 1 + self.failovers + 2;
        let redis = 2 * (2 + late) + open + 1;
        let nats = 4 * (1 + open) + late + 1;
        futureq + redis + nats
    }
}

fn ack_name(a: Ack) -> &'static str {
    match a {
        Ack::Quorum => "quorum",
        Ack::Leader => "leader",
        Ack::NoAck => "no_ack",
    }
}

#[allow(clippy::cast_precision_loss)]
fn per_s(rate: u64) -> f64 {
    rate as f64
}

/// CPU µs per acked message from the CPU seconds before and after a run.
#[allow(clippy::cast_precision_loss)]
fn cpu_per_msg(before: Option<f64>, after: Option<f64>, acked: u64) -> Option<f64> {
    before
        .zip(after)
        .filter(|_| acked > 0)
        .map(|(b, a)| (a - b) * 1e6 / acked as f64)
}

/// A counter's growth per acked message between two readings.
#[allow(clippy::cast_precision_loss)]
fn per_msg(before: Option<u64>, after: Option<u64>, acked: u64) -> Option<f64> {
    before
        .zip(after)
        .filter(|_| acked > 0)
        .map(|(b, a)| a.saturating_sub(b) as f64 / acked as f64)
}

/// The broker's counters at one instant ([`Target::usage`]).
struct Usage {
    cpu_s: Option<f64>,
    sleeps: Option<u64>,
    cross_core: Option<u64>,
    leadership: Option<Leadership>,
}

impl Usage {
    /// The costs of a series that acked `acked` messages between `self` and `after`.
    #[allow(clippy::cast_precision_loss)]
    fn costs(&self, after: &Usage, acked: u64) -> Costs {
        Costs {
            cpu_us: cpu_per_msg(self.cpu_s, after.cpu_s, acked),
            sleeps: per_msg(self.sleeps, after.sleeps, acked),
            cross_core: per_msg(self.cross_core, after.cross_core, acked),
            ..Costs::moves(self.leadership, after.leadership)
        }
    }
}

/// The futureq deployment a series runs against.
pub(crate) enum Target<'a> {
    One(&'a Broker),
    Three(&'a Cluster),
}

impl Target<'_> {
    pub(crate) fn mode(&self) -> &'static str {
        match self {
            Target::One(_) => "standalone",
            Target::Three(_) => "cluster3",
        }
    }

    /// CPU time the broker used so far (the sum over the cluster), seconds.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        match self {
            Target::One(b) => b.cpu_seconds(),
            Target::Three(c) => c.cpu_seconds(),
        }
    }

    /// The broker's CPU time and sleeps so far (the sums over the cluster) and its term.
    async fn usage(&self) -> Usage {
        match self {
            Target::One(b) => Usage {
                cpu_s: self.cpu_seconds(),
                sleeps: b.sleeps(),
                cross_core: b.cross_core().await,
                leadership: None,
            },
            Target::Three(c) => Usage {
                cpu_s: self.cpu_seconds(),
                sleeps: c.sleeps(),
                cross_core: c.cross_core().await,
                leadership: c.leadership().await,
            },
        }
    }

    /// Runs a publish `series` on the leader ([`Target::on_leader`]) and measures what it
    /// cost the broker: the CPU, sleeps and cross-core messages of the attempt that counted
    /// (a series run again on a new leader starts afresh), the leadership moves of every
    /// attempt.
    async fn measured<F: Future<Output = anyhow::Result<PublishOut>>>(
        &self,
        series: impl Fn(String) -> F,
    ) -> anyhow::Result<(PublishOut, Costs)> {
        let first = self.usage().await;
        let (o, before) = self
            .on_leader(|addr| {
                let run = series(addr);
                async move {
                    let before = self.usage().await;
                    run.await.map(|o| (o, before))
                }
            })
            .await?;
        let after = self.usage().await;
        let moves = Costs::moves(first.leadership, after.leadership);
        let costs = Costs {
            term_changes: moves.term_changes,
            leader_changes: moves.leader_changes,
            lease_lapses: moves.lease_lapses,
            ..before.costs(&after, o.acked)
        };
        Ok((o, costs))
    }

    /// Closed-loop publish on the leader, and its costs.
    pub(crate) async fn publish(&self, p: &PublishParams) -> anyhow::Result<(PublishOut, Costs)> {
        self.measured(|addr| async move { publish_run(&addr, p).await })
            .await
    }

    /// Open-loop publish on the leader at `s`, one message of `bytes` per request, and its
    /// costs.
    async fn publish_open(&self, s: Schedule, bytes: usize) -> anyhow::Result<(PublishOut, Costs)> {
        self.measured(|addr| async move { publish_open(&addr, s, Ack::Quorum, bytes).await })
            .await
    }

    /// Resident memory of the broker (the sum over the cluster), MiB.
    fn rss_mb(&self) -> Option<f64> {
        match self {
            Target::One(b) => b.rss_mb(),
            Target::Three(c) => c.rss_mb(),
        }
    }

    /// Runs `series` against the broker, or the cluster's current leader; in a cluster, a
    /// series that fails because leadership moved (elections happen on a loaded 2-CPU
    /// machine) runs again on the new leader, at most twice.
    pub(crate) async fn on_leader<T, F: Future<Output = anyhow::Result<T>>>(
        &self,
        series: impl Fn(String) -> F,
    ) -> anyhow::Result<T> {
        let cluster = match self {
            Target::One(b) => return series(b.addr.clone()).await,
            Target::Three(c) => c,
        };
        let mut retries = 0;
        loop {
            let leader = cluster.leader().await?.addr.clone();
            match series(leader.clone()).await {
                Err(e) if retries < 2 && leadership_moved(&e) => {
                    retries += 1;
                    eprintln!(
                        "leadership moved away from {leader} ({e:#}); running the series again"
                    );
                }
                r => return r,
            }
        }
    }
}

/// Whether a series failed because its node no longer leads: a batch refused as NOT_LEADER,
/// or a stream the broker ended with that reason (told by type, not by the message's text).
fn leadership_moved(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<crate::load::Refused>()
            .is_some_and(|r| r.not_leader)
            || c.downcast_ref::<tonic::Status>().is_some_and(|s| {
                matches!(
                    futureq_client::refusal::of_status(s),
                    Some((futureq_client::Reason::NotLeader, _))
                )
            })
    })
}

/// One compare run in progress: the plan, the rows so far, the progress display.
struct Compare {
    plan: Plan,
    runs: Vec<Run>,
    progress: Progress,
}

impl Compare {
    fn step(&self, what: String) {
        self.progress.step(what);
    }

    /// Prints a line above the progress bar (a skipped system, a peer's version, a failed
    /// series); on stderr when there is no bar (a hidden bar prints nothing).
    fn say(&self, what: &str) {
        if self.progress.0.is_hidden() {
            eprintln!("{what}");
        } else {
            self.progress.0.println(what);
        }
    }

    /// Closed-loop publish at every ack level, batches of 100 and of 1, then the open-loop
    /// rates at QUORUM.
    async fn futureq_publish(&mut self, target: &Target<'_>) -> anyhow::Result<()> {
        let mode = target.mode();
        for ack in [Ack::Quorum, Ack::Leader, Ack::NoAck] {
            for batch in self.plan.batches() {
                let level = ack_name(ack);
                self.step(format!(
                    "futureq {mode}: publish, ack {level}, {batch}/request"
                ));
                let p = self.plan.publish(batch, ack, 3_600_000);
                let (o, costs) = target.publish(&p).await?;
                let key = ("futureq", mode, level, "publish", batch);
                self.runs
                    .push(Run::publish(key, o, target.rss_mb()).costs(costs));
            }
        }
        for rate in self.plan.open_rates.clone() {
            self.step(format!(
                "futureq {mode}: open-loop publish, ack quorum, {rate} msgs/s"
            ));
            self.futureq_open(target, rate, "publish").await?;
            if !self.runs.last().is_some_and(sustained) {
                break;
            }
        }
        self.futureq_overload(target).await
    }

    /// Open loop at twice what the ladder reached (the most any step sustained or achieved):
    /// the excess is shed (refused OVERLOADED with a retry hint, counted in `refused_msgs`),
    /// the stored part acked, and leadership must not move (checked with the other series by
    /// [`elections`]).
    async fn futureq_overload(&mut self, target: &Target<'_>) -> anyhow::Result<()> {
        let mode = target.mode();
        let reached = self
            .runs
            .iter()
            .filter(|r| {
                (r.system, r.mode, r.load, r.scenario) == ("futureq", mode, "open", "publish")
            })
            .map(|r| {
                let offered = r.offered_msgs_per_s.filter(|_| sustained(r)).unwrap_or(0.0);
                offered.max(r.msgs_per_s)
            })
            .fold(0.0, f64::max);
        if reached == 0.0 {
            return Ok(());
        }
        let rate = (2.0 * reached / 1000.0).round().max(1.0) * 1000.0;
        self.step(format!(
            "futureq {mode}: overload, open loop at 2× the {reached:.0} msgs/s the ladder reached: {rate} msgs/s"
        ));
        self.futureq_open(target, rate, "overload").await
    }

    /// One open-loop QUORUM series at `rate` msgs/s, one message per request, recorded as
    /// `scenario`.
    async fn futureq_open(
        &mut self,
        target: &Target<'_>,
        rate: f64,
        scenario: &'static str,
    ) -> anyhow::Result<()> {
        let (o, costs) = target
            .publish_open(self.plan.open(rate), self.plan.msg_bytes)
            .await?;
        let key = ("futureq", target.mode(), "quorum", scenario, 1);
        self.runs.push(
            Run::publish(key, o, target.rss_mb())
                .open(rate)
                .costs(costs),
        );
        Ok(())
    }

    async fn futureq_standalone(&mut self, bin: &Path, dir: &Path) -> anyhow::Result<()> {
        let mut broker = standalone(bin, dir).await?;
        self.futureq_publish(&Target::One(&broker)).await?;
        for &(count, rate) in &self.plan.lateness {
            self.step(format!(
                "futureq standalone: lateness, {count} messages due at {rate}/s (0 = burst)"
            ));
            let (h, early) = lateness_run(&broker.addr, count, rate, self.plan.lead_ms).await?;
            let key = ("futureq", "standalone", "quorum", "lateness", 0);
            let mut run = Run::new(key, per_s(rate), h, broker.rss_mb());
            run.early = Some(early);
            self.runs.push(run);
        }
        let n = self.plan.pending;
        self.step(format!(
            "futureq standalone: pending, {n} far-future messages, restart"
        ));
        let fill = crate::load::fill(&broker.addr, n).await?;
        let o = publish_run(
            &broker.addr,
            &self.plan.publish(100, Ack::Quorum, 3_600_000),
        )
        .await?;
        let rss = broker.rss_mb();
        let t0 = Instant::now();
        let listening = broker.restart().await?;
        let stopped = t0.elapsed() - listening;
        drain(&broker.addr).await?;
        let restart = t0.elapsed() - stopped;
        let key = ("futureq", "standalone", "quorum", "pending", 100);
        self.runs
            .push(Run::publish(key, o, rss).pending(n, fill, restart));
        broker.stop()
    }

    async fn futureq_cluster(&mut self, bin: &Path, dir: &Path) -> anyhow::Result<()> {
        self.step("futureq cluster3: starting 3 nodes on 127.0.0.1-3".into());
        let mut cluster = Cluster::start(bin, dir).await?;
        self.futureq_publish(&Target::Three(&cluster)).await?;
        let reps = self.plan.failovers;
        let h = crate::failover::run(&mut cluster, reps, |s| self.step(s)).await?;
        let key = ("futureq", "cluster3", "quorum", "failover", 1);
        let mut run = Run::new(key, 0.0, h, cluster.rss_mb());
        run.repetitions = Some(reps);
        self.runs.push(run);
        self.cluster_pending(&mut cluster).await?;
        cluster.stop()
    }

    /// The pending scenario on the cluster: far-future messages filled in (the peak RSS of
    /// each node meanwhile and during a publish series with that backlog), then a fresh node
    /// joins and catches up (by snapshot: the others purged their logs long ago): its time
    /// and peak RSS.
    async fn cluster_pending(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        let n = self.plan.pending;
        self.step(format!(
            "futureq cluster3: pending, {n} far-future messages"
        ));
        let before = cluster
            .nodes
            .iter()
            .filter_map(Broker::rss_mb)
            .reduce(f64::max);
        let peaks = RssPeaks::start(cluster.nodes.iter().map(Broker::pid).collect());
        let leadership = cluster.leadership().await;
        // Filled on the leader; a fill that fails because leadership moved runs again on the
        // new leader (the backlog is then larger), and the run fails (`elections`).
        let fill = Target::Three(cluster)
            .on_leader(|addr| async move { crate::load::fill(&addr, n).await })
            .await?;
        let (o, mut costs) = Target::Three(cluster)
            .publish(&self.plan.publish(100, Ack::Quorum, 3_600_000))
            .await?;
        // Leadership over the fill and the series.
        let whole = Costs::moves(leadership, cluster.leadership().await);
        (costs.term_changes, costs.leader_changes, costs.lease_lapses) =
            (whole.term_changes, whole.leader_changes, whole.lease_lapses);
        let node_peaks = peaks.stop();
        self.step("futureq cluster3: a fresh node joins and catches up".into());
        let t0 = Instant::now();
        let i = cluster.join_fresh().await?;
        let mut join_peak = 0.0f64;
        cluster
            .catch_up(i, Duration::from_secs(900), |b| {
                join_peak = join_peak.max(b.rss_mb().unwrap_or(0.0));
            })
            .await?;
        let key = ("futureq", "cluster3", "quorum", "pending", 100);
        let mut run = Run::publish(key, o, Some(node_peaks.iter().sum())).costs(costs);
        run.pending_msgs = Some(n);
        run.fill_msgs_per_s = Some(fill);
        run.node_rss_before_mb = before;
        run.node_rss_max_mb = Some(node_peaks.iter().copied().fold(0.0, f64::max));
        run.join_ms = Some(t0.elapsed().as_secs_f64() * 1000.0);
        run.join_rss_mb = Some(join_peak);
        self.runs.push(run);
        Ok(())
    }

    async fn redis(&mut self) -> anyhow::Result<()> {
        for (policy, level) in [
            ("always", "appendfsync-always"),
            ("everysec", "appendfsync-everysec"),
        ] {
            let Some(mut redis) = crate::redis_peer::start(policy).await? else {
                self.say("redis-server not installed: skipping the Redis runs (scripts/install-peers.sh)");
                return Ok(());
            };
            let port = redis.port();
            for batch in self.plan.batches() {
                self.step(format!(
                    "redis-zset: publish (ZADD), {level}, {batch}/request"
                ));
                let p = self.plan.publish(batch, Ack::Quorum, 3_600_000);
                let before = redis.cpu_seconds();
                let o = crate::redis_peer::publish(port, &p).await?;
                let key = ("redis-zset", "standalone", level, "publish", batch);
                let per_msg = cpu_per_msg(before, redis.cpu_seconds(), o.acked);
                let mut run = Run::publish(key, o, redis.rss_mb());
                run.cpu_us_per_msg = per_msg;
                self.runs.push(run);
            }
            for &(count, rate) in &self.plan.lateness {
                self.step(format!(
                    "redis-zset: lateness (ZRANGEBYSCORE+ZREM poller), {level}, {count} due at {rate}/s"
                ));
                let h = crate::redis_peer::lateness(port, count, rate, self.plan.lead_ms).await?;
                let key = ("redis-zset", "standalone", level, "lateness", 0);
                self.runs
                    .push(Run::new(key, per_s(rate), h, redis.rss_mb()));
            }
            if policy != "always" {
                continue;
            }
            for rate in self.plan.open_rates.clone() {
                self.step(format!(
                    "redis-zset: open-loop publish, {level}, {rate} msgs/s"
                ));
                let o = crate::redis_peer::publish_open(
                    port,
                    self.plan.open(rate),
                    self.plan.msg_bytes,
                )
                .await?;
                let key = ("redis-zset", "standalone", level, "publish", 1);
                self.runs
                    .push(Run::publish(key, o, redis.rss_mb()).open(rate));
                if !self.runs.last().is_some_and(sustained) {
                    break;
                }
            }
            let n = self.plan.pending;
            self.step(format!(
                "redis-zset: pending, {n} far-future members, restart"
            ));
            let fill = crate::redis_peer::fill(port, n).await?;
            let p = self.plan.publish(100, Ack::Quorum, 3_600_000);
            let o = crate::redis_peer::publish(port, &p).await?;
            let rss = redis.rss_mb();
            let restart = redis.restart(crate::redis_peer::ready).await?;
            let key = ("redis-zset", "standalone", level, "pending", 100);
            self.runs
                .push(Run::publish(key, o, rss).pending(n, fill, restart));
        }
        Ok(())
    }

    /// JetStream R1 (one server) and R3 (three), each with an fsync per write and with the
    /// default sync interval: closed loop and the open-loop ladder, one message per publish.
    /// Then message schedules (R1, default sync): lateness and pending.
    async fn nats(&mut self) -> anyhow::Result<()> {
        let Some(version) = crate::procs::version("nats-server") else {
            self.say("nats-server not installed: skipping the NATS JetStream runs (scripts/install-peers.sh)");
            return Ok(());
        };
        self.say(&format!("NATS: {version}"));
        let schedules = crate::nats_peer::has_schedules(&version);
        for (mode, replicas, sync, level) in NATS_SETUPS {
            if sync == crate::nats_peer::Fsync::Always && !schedules {
                self.say(&format!("{version} has no sync_interval: always: skipping JetStream {mode} {level} (scripts/install-peers.sh installs the current server)"));
                continue;
            }
            let Some(servers) = crate::nats_peer::start(replicas, sync).await? else {
                bail!("nats-server did not start");
            };
            let rss = || servers.iter().map(PeerProcess::rss_mb).sum::<Option<f64>>();
            let cpu = || {
                servers
                    .iter()
                    .map(PeerProcess::cpu_seconds)
                    .sum::<Option<f64>>()
            };
            let port = servers[0].port();
            crate::nats_peer::create_stream(port, "BENCH", &["bench.>"], replicas).await?;
            self.step(format!("nats-jetstream {mode}: publish, {level}"));
            let before = cpu();
            let o = crate::nats_peer::publish(port, &self.plan.publish(1, Ack::Quorum, 0)).await?;
            let key = ("nats-jetstream", mode, level, "publish", 1);
            let per_msg = cpu_per_msg(before, cpu(), o.acked);
            let mut run = Run::publish(key, o, rss());
            run.cpu_us_per_msg = per_msg;
            self.runs.push(run);
            for rate in self.plan.open_rates.clone() {
                self.step(format!(
                    "nats-jetstream {mode}: open-loop publish, {level}, {rate} msgs/s"
                ));
                let o =
                    crate::nats_peer::publish_open(port, self.plan.open(rate), self.plan.msg_bytes)
                        .await?;
                self.runs.push(Run::publish(key, o, rss()).open(rate));
                if !self.runs.last().is_some_and(sustained) {
                    break;
                }
            }
        }
        if !schedules {
            self.say(&format!("{version} has no message schedules: skipping the NATS schedules runs (scripts/install-peers.sh installs the current server)"));
            return Ok(());
        }
        self.nats_schedules().await
    }

    /// JetStream message schedules as a delayed queue (R1, default sync): lateness at each due
    /// rate, then a backlog of schedules a year ahead (fill rate, publishing beside it, RSS,
    /// restart).
    async fn nats_schedules(&mut self) -> anyhow::Result<()> {
        const LEVEL: &str = "schedules @at (whole seconds), file-r1, sync default";
        let Some(mut servers) =
            crate::nats_peer::start(1, crate::nats_peer::Fsync::Default).await?
        else {
            bail!("nats-server did not start");
        };
        let server = &mut servers[0];
        let port = server.port();
        let mut failed = None;
        for &(count, rate) in &self.plan.lateness {
            self.step(format!(
                "nats-schedules: lateness, {count} due at {rate}/s (0 = burst)"
            ));
            // A failed series costs only itself (reported at the end).
            let (h, early) =
                match crate::nats_peer::lateness(port, count, rate, self.plan.lead_ms).await {
                    Ok(r) => r,
                    Err(e) => {
                        self.say(&format!(
                            "nats-schedules: lateness, {count} due at {rate}/s failed: {e:#}"
                        ));
                        failed.get_or_insert(e);
                        continue;
                    }
                };
            let key = ("nats-schedules", "standalone", LEVEL, "lateness", 0);
            let mut run = Run::new(key, per_s(rate), h, server.rss_mb());
            run.early = Some(early);
            self.runs.push(run);
        }
        let n = self.plan.pending;
        self.step(format!(
            "nats-schedules: pending, {n} schedules a year ahead, restart"
        ));
        crate::nats_peer::create_stream(port, "BENCH", &["bench.>"], 1).await?;
        let fill = crate::nats_peer::fill_schedules(port, n).await?;
        // Delayed messages, like futureq's pending series (1 h ahead).
        let p = self.plan.publish(1, Ack::Quorum, 3_600_000);
        let o = crate::nats_peer::publish(port, &p).await?;
        let rss = server.rss_mb();
        let restart = server.restart(crate::nats_peer::ready).await?;
        let key = ("nats-schedules", "standalone", LEVEL, "pending", 1);
        self.runs
            .push(Run::publish(key, o, rss).pending(n, fill, restart));
        failed.map_or(Ok(()), Err)
    }
}

/// The JetStream setups `compare` runs: (mode, replicas, sync, ack level label).
const NATS_SETUPS: [(&str, usize, crate::nats_peer::Fsync, &str); 4] = [
    (
        "standalone",
        1,
        crate::nats_peer::Fsync::Always,
        "file-r1, sync always",
    ),
    (
        "standalone",
        1,
        crate::nats_peer::Fsync::Default,
        "file-r1, sync default (2 min)",
    ),
    (
        "cluster3",
        3,
        crate::nats_peer::Fsync::Always,
        "file-r3, sync always",
    ),
    (
        "cluster3",
        3,
        crate::nats_peer::Fsync::Default,
        "file-r3, sync default (2 min)",
    ),
];

/// The open-loop ladder climbs while a rate is sustained: at least 95 % of the offered rate
/// acknowledged, p99 ≤ 10 ms.
const SUSTAINED_P99_US: f64 = 10_000.0;

fn sustained(r: &Run) -> bool {
    r.offered_msgs_per_s
        .is_some_and(|o| r.msgs_per_s >= 0.95 * o && r.p99_us <= SUSTAINED_P99_US)
}

/// The futureq binary: `explicit`, else the one next to this executable, else built with
/// cargo (release or debug, like this executable).
pub(crate) fn futureq_binary(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    let me = std::env::current_exe()?;
    let sibling = me.with_file_name("futureq");
    if !sibling.exists() {
        eprintln!("building futureq (cargo build -p futureq) …");
        let release = me.parent().is_some_and(|d| d.ends_with("release"));
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "-q", "-p", "futureq"]);
        if release {
            cmd.arg("--release");
        }
        if !cmd.status()?.success() {
            bail!("cargo build -p futureq failed; pass --futureq PATH");
        }
    }
    Ok(sibling)
}

fn machine() -> Machine {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        kernel,
        memory_gib,
        peers: ["redis-server", "nats-server"]
            .iter()
            .filter_map(|p| crate::procs::version(p))
            .collect(),
    }
}

fn table(runs: &[Run]) -> String {
    let mut t = String::from(
        "| system | mode | ack level / setting | scenario | load | batch | msgs/s | p50 ms | p99 ms | p99.9 ms | RSS MiB | CPU µs/msg | sleeps/msg | cross-core/msg | elections | notes |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let load = match r.offered_msgs_per_s {
            Some(rate) => format!("open {rate:.0}/s"),
            None if r.scenario == "lateness" => "-".into(),
            None if r.scenario == "failover" => "4×1, kill -9 leader".into(),
            None => "closed 8×4".into(),
        };
        let notes = match (r.pending_msgs, r.fill_msgs_per_s, r.restart_ms) {
            (Some(n), Some(fill), Some(restart)) => {
                format!("{n} waiting (filled at {fill:.0}/s); restart to serving {restart:.0} ms")
            }
            (Some(n), Some(fill), None) => format!(
                "{n} waiting (filled at {fill:.0}/s); RSS of one node ≤ {:.0} MiB ({} before the fill); a fresh node caught up in {:.1} s, its RSS ≤ {:.0} MiB",
                r.node_rss_max_mb.unwrap_or(0.0),
                r.node_rss_before_mb
                    .map_or_else(|| "unknown".to_owned(), |b| format!("{b:.0} MiB")),
                r.join_ms.unwrap_or(0.0) / 1000.0,
                r.join_rss_mb.unwrap_or(0.0)
            ),
            _ => match r.repetitions {
                Some(n) => format!(
                    "kill -9 → first QUORUM ack from the new leader: median of {n} (p50), max {:.0} ms",
                    r.max_us / 1000.0
                ),
                None => match r.refused_msgs {
                    Some(n) if n > 0 => {
                        format!("{n} msgs refused as overloaded (shed, with a retry hint)")
                    }
                    _ => String::new(),
                },
            },
        };
        t.push_str(&format!(
            "| {} | {} | {} | {} | {load} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} | {} | {notes} |\n",
            r.system,
            r.mode,
            r.ack_level,
            r.scenario,
            r.batch,
            r.msgs_per_s,
            r.p50_us / 1000.0,
            r.p99_us / 1000.0,
            r.p999_us / 1000.0,
            r.rss_mb.map_or("-".into(), |m| format!("{m:.0}")),
            r.cpu_us_per_msg.map_or("-".into(), |c| format!("{c:.1}")),
            r.sleeps_per_msg.map_or("-".into(), |c| format!("{c:.2}")),
            r.cross_core_per_msg.map_or("-".into(), |c| format!("{c:.2}")),
            elections_cell(r),
        ));
    }
    t
}

/// The table's elections cell: the term's growth, then what else moved (leader changes
/// beyond the two of each election, leases that lapsed in the same term).
fn elections_cell(r: &Run) -> String {
    let Some(t) = r.term_changes else {
        return "-".into();
    };
    let mut also = Vec::new();
    if let Some(c) = r.leader_changes.filter(|&c| c > 2 * t) {
        also.push(format!("{c} leader changes"));
    }
    if let Some(l) = r.lease_lapses.filter(|&l| l > 0) {
        also.push(format!("{l} lease lapses"));
    }
    if also.is_empty() {
        t.to_string()
    } else {
        format!("{t} ({})", also.join(", "))
    }
}

/// The like-for-like pairs the ratios compare: a futureq run and a peer run, matched by
/// `(system, mode, ack level, scenario, batch)`; closed loop, and open loop at every offered
/// rate both were measured at; `batch` is the batched series' size.
fn pairs(batch: usize) -> Vec<(String, Key, Key)> {
    let redis = |level, batch| ("redis-zset", "standalone", level, "publish", batch);
    let futureq = |mode, level, batch| ("futureq", mode, level, "publish", batch);
    let mut pairs = vec![
        (
            format!("standalone, QUORUM vs Redis appendfsync always, {batch}/request"),
            futureq("standalone", "quorum", batch),
            redis("appendfsync-always", batch),
        ),
        (
            "standalone, QUORUM vs Redis appendfsync always, 1/request".into(),
            futureq("standalone", "quorum", 1),
            redis("appendfsync-always", 1),
        ),
        (
            "standalone, NO_ACK vs Redis appendfsync everysec, 1/request".into(),
            futureq("standalone", "no_ack", 1),
            redis("appendfsync-everysec", 1),
        ),
    ];
    for (mode, replicas, _, level) in NATS_SETUPS {
        let what = if mode == "standalone" {
            "standalone, QUORUM"
        } else {
            "3 nodes, QUORUM"
        };
        pairs.push((
            format!("{what} vs JetStream R{replicas} {level}, 1/request"),
            futureq(mode, "quorum", 1),
            ("nats-jetstream", mode, level, "publish", 1),
        ));
    }
    pairs
}

fn pick<'r>(runs: &'r [Run], k: &Key, offered: Option<f64>) -> Option<&'r Run> {
    runs.iter().find(|r| {
        (r.system, r.mode, r.ack_level, r.scenario, r.batch) == *k
            && r.offered_msgs_per_s == offered
    })
}

/// futureq ÷ peer for throughput and p99 latency (p99 ratio < 1: futureq is faster), for
/// every pair both of whose runs exist; lateness p99 for every due rate both measured.
fn ratios(runs: &[Run], batch: usize) -> String {
    let mut t = String::from(
        "| comparison | futureq msgs/s | peer msgs/s | throughput ratio | futureq p99 ms | peer p99 ms | p99 ratio |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut row = |what: &str, f: &Run, p: &Run| {
        t.push_str(&format!(
            "| {what} | {:.0} | {:.0} | {:.2}× | {:.3} | {:.3} | {:.2}× |\n",
            f.msgs_per_s,
            p.msgs_per_s,
            f.msgs_per_s / p.msgs_per_s.max(1e-9),
            f.p99_us / 1000.0,
            p.p99_us / 1000.0,
            f.p99_us / p.p99_us.max(1e-9),
        ));
    };
    let mut offered: Vec<Option<f64>> = vec![None];
    for r in runs {
        if r.offered_msgs_per_s.is_some() && !offered.contains(&r.offered_msgs_per_s) {
            offered.push(r.offered_msgs_per_s);
        }
    }
    for o in offered {
        for (what, f, p) in &pairs(batch) {
            if let (Some(f), Some(p)) = (pick(runs, f, o), pick(runs, p, o)) {
                match o {
                    None => row(what, f, p),
                    Some(rate) => row(&format!("{what}, open loop {rate:.0}/s"), f, p),
                }
            }
        }
    }
    let lateness = |system: &'static str| {
        runs.iter()
            .filter(move |r| r.system == system && r.scenario == "lateness")
            .filter(|r| r.ack_level == "quorum" || r.ack_level == "appendfsync-always")
    };
    for f in lateness("futureq") {
        let shape = if f.msgs_per_s > 0.0 {
            format!("{:.0} due/s", f.msgs_per_s)
        } else {
            "a burst".into()
        };
        for (peer, name) in [
            ("redis-zset", "Redis poller (always)"),
            (
                "nats-schedules",
                "JetStream schedules (due at whole seconds)",
            ),
        ] {
            let same = |p: &&Run| p.msgs_per_s == f.msgs_per_s;
            let found = runs
                .iter()
                .filter(|r| r.system == peer && r.scenario == "lateness")
                .find(same);
            if let Some(p) = found.filter(|p| p.ack_level != "appendfsync-everysec") {
                row(&format!("lateness, {shape}: futureq vs {name}"), f, p);
            }
        }
    }
    t
}

/// No leader change without a fault: a cluster publish, overload or pending series whose Raft
/// term grew (an election on an overloaded cluster), in which a node gained or lost leadership
/// (a lease that ran out), or whose leadership could not be read, fails the run.
fn elections(runs: &[Run]) -> Option<anyhow::Error> {
    let moved: Vec<String> = runs
        .iter()
        .filter(|r| {
            matches!(r.scenario, "publish" | "pending" | "overload")
                && r.mode == "cluster3"
                && (r.term_changes.is_none_or(|t| t > 0) || r.leader_changes.is_none_or(|c| c > 0))
        })
        .map(|r| {
            let load = r.offered_msgs_per_s.map_or_else(
                || "closed loop".to_owned(),
                |o| format!("open loop {o:.0}/s"),
            );
            let moves = match (r.term_changes, r.leader_changes) {
                (Some(t), Some(c)) => format!("term +{t}, leader changes +{c}"),
                _ => "leadership unknown (a node's metrics did not answer)".to_owned(),
            };
            format!(
                "{} {} {} {}/request {load}: {moves}",
                r.mode, r.ack_level, r.scenario, r.batch
            )
        })
        .collect();
    (!moved.is_empty()).then(|| {
        anyhow::anyhow!(
            "leadership moved with no fault injected: {}",
            moved.join("; ")
        )
    })
}

/// The highest offered rate each system sustained on the open-loop ladder ([`sustained`]),
/// and the first it did not.
fn ladder(runs: &[Run], top: f64) -> String {
    let mut t = String::from(
        "| system | mode | ack level / setting | sustained msgs/s (p99 ≤ 10 ms) | next rate: achieved, p99 ms |\n\
         |---|---|---|---|---|\n",
    );
    let mut seen: Vec<(&str, &str, &str)> = Vec::new();
    let on_ladder = |r: &Run| r.load == "open" && r.scenario == "publish";
    for r in runs.iter().filter(|r| on_ladder(r)) {
        let who = (r.system, r.mode, r.ack_level);
        if seen.contains(&who) {
            continue;
        }
        seen.push(who);
        let climb: Vec<&Run> = runs
            .iter()
            .filter(|x| on_ladder(x) && (x.system, x.mode, x.ack_level) == who)
            .collect();
        let best = climb
            .iter()
            .filter(|x| sustained(x))
            .filter_map(|x| x.offered_msgs_per_s)
            .fold(0.0, f64::max);
        let reached_top = climb.last().and_then(|x| x.offered_msgs_per_s) == Some(top);
        let failed = climb.iter().find(|x| !sustained(x)).map_or_else(
            || {
                if reached_top {
                    "- (the ladder's top)".into()
                } else {
                    "- (the series stopped with an error)".into()
                }
            },
            |x| {
                format!(
                    "{:.0}/s offered: {:.0}/s, {:.1}",
                    x.offered_msgs_per_s.unwrap_or(0.0),
                    x.msgs_per_s,
                    x.p99_us / 1000.0
                )
            },
        );
        t.push_str(&format!(
            "| {} | {} | {} | {best:.0} | {failed} |\n",
            who.0, who.1, who.2
        ));
    }
    t
}

/// Progress: a bar on a terminal, one line per step otherwise (CI logs).
struct Progress(indicatif::ProgressBar);

impl Progress {
    fn new(steps: usize) -> Self {
        let bar = indicatif::ProgressBar::new(steps as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "[{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Progress(bar)
    }

    fn step(&self, what: String) {
        if self.0.is_hidden() {
            eprintln!("{what}");
        }
        self.0.set_message(what);
        self.0.inc(1);
    }
}

/// Runs every scenario on every system; writes `out/results.json` and the plots, prints the
/// table.
pub async fn run(
    quick: bool,
    (msg_bytes, batch): (usize, usize),
    out: &Path,
    futureq: Option<PathBuf>,
    only: &[System],
) -> anyhow::Result<()> {
    if msg_bytes == 0 || batch == 0 {
        bail!("--msg-bytes and --batch must be at least 1");
    }
    let plan = Plan::new(quick, msg_bytes, batch);
    let bin = futureq_binary(futureq)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let work = tempfile::tempdir()?;
    let progress = Progress::new(plan.steps());
    let mut c = Compare {
        plan,
        runs: Vec::new(),
        progress,
    };
    // A failing system does not cost the others' results: every error is reported at the end.
    let mut failed = Vec::new();
    if only.contains(&System::Futureq) {
        failed.extend(c.futureq_standalone(&bin, work.path()).await.err());
        // Each setup's data goes once it is measured (its log stays): with 10^7 pending
        // messages it takes GBs per node (a full run ran out of disk while the standalone
        // data stayed behind).
        let remove_data = |setup: &str| {
            for sub in ["data", "raft"] {
                let _ = std::fs::remove_dir_all(work.path().join(setup).join(sub));
            }
        };
        remove_data("standalone");
        failed.extend(c.futureq_cluster(&bin, work.path()).await.err());
        for i in 1..=4 {
            remove_data(&format!("node{i}"));
        }
    }
    if only.contains(&System::Redis) {
        failed.extend(c.redis().await.err());
    }
    if only.contains(&System::Nats) {
        failed.extend(c.nats().await.err());
    }
    c.progress.0.finish_and_clear();
    failed.extend(elections(&c.runs));
    for r in &mut c.runs {
        if r.scenario != "lateness" {
            r.msg_bytes = c.plan.msg_bytes;
            #[allow(clippy::cast_precision_loss)]
            let mb = r.msgs_per_s * c.plan.msg_bytes as f64 / 1e6;
            r.mb_per_s = mb;
        }
    }
    let batch = c.plan.batch;
    let results = Results {
        machine: machine(),
        runs: c.runs,
    };
    let path = out.join("results.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&results)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("{}", table(&results.runs));
    println!(
        "futureq ÷ peer, like for like:\n\n{}",
        ratios(&results.runs, batch)
    );
    println!(
        "Open-loop ladder, the highest rate sustained:\n\n{}",
        ladder(
            &results.runs,
            c.plan.open_rates.last().copied().unwrap_or(0.0)
        )
    );
    println!("results: {}", path.display());
    for plot in crate::plot::write_all(&results.runs, out)? {
        println!("plot: {}", plot.display());
    }
    if !failed.is_empty() {
        let logs = keep_logs(work.path(), out);
        let list: Vec<String> = failed.iter().map(|e| format!("{e:#}")).collect();
        bail!(
            "some measurements failed (the brokers' logs: {}):\n  {}",
            logs.display(),
            list.join("\n  ")
        );
    }
    Ok(())
}

/// Copies each broker's `futureq.log` under `work` (one directory per setup) to
/// `out/logs/<setup>.log`, so that a failed run can be read after its work directory is gone;
/// returns that directory. A log that cannot be copied is reported and skipped.
fn keep_logs(work: &Path, out: &Path) -> PathBuf {
    let logs = out.join("logs");
    // Logs of an earlier run in the same --out would be taken for this one's.
    let _ = std::fs::remove_dir_all(&logs);
    let copy = |setup: &std::fs::DirEntry| -> std::io::Result<()> {
        let from = setup.path().join("futureq.log");
        if from.exists() {
            std::fs::create_dir_all(&logs)?;
            let name = format!("{}.log", setup.file_name().to_string_lossy());
            std::fs::copy(&from, logs.join(name))?;
        }
        Ok(())
    };
    for setup in std::fs::read_dir(work).into_iter().flatten().flatten() {
        if let Err(e) = copy(&setup) {
            eprintln!("could not keep the log of {}: {e}", setup.path().display());
        }
    }
    logs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series is run again on a new leader only for a refusal that says NOT_LEADER, by
    /// type: a batch's, or the status a stream ended with; never for words in a message.
    #[test]
    fn leadership_moves_are_told_by_type() {
        let refused = |not_leader| crate::load::Refused {
            batch_id: 7,
            not_leader,
            message: "this node is no longer the cluster leader".into(),
        };
        assert!(leadership_moved(
            &anyhow::Error::new(refused(true)).context("series")
        ));
        assert!(!leadership_moved(&anyhow::Error::new(refused(false))));
        use tonic_types::StatusExt as _;
        let status = |reason: futureq_client::Reason| {
            tonic::Status::with_error_details(
                tonic::Code::FailedPrecondition,
                "for people",
                tonic_types::ErrorDetails::with_error_info(
                    reason.name(),
                    futureq_core::refusal::ERROR_DOMAIN,
                    [],
                ),
            )
        };
        let ended = anyhow::Error::new(status(futureq_client::Reason::NotLeader))
            .context("the broker ended the publish stream");
        assert!(leadership_moved(&ended));
        assert!(!leadership_moved(&anyhow::Error::new(status(
            futureq_client::Reason::Overloaded
        ))));
        assert!(!leadership_moved(&anyhow::anyhow!("no leader within 10 s")));
    }

    fn run(key: Key, rate: f64, latency_us: u64) -> Run {
        let mut h = crate::stats::hist();
        h.record(latency_us).unwrap();
        Run::new(key, rate, h, None)
    }

    #[test]
    fn an_election_during_a_publish_series_fails_the_run() {
        let series = |terms: Option<u64>, offered: Option<f64>| {
            let mut r = run(("futureq", "cluster3", "quorum", "publish", 1), 1.0, 1);
            r.term_changes = terms;
            r.leader_changes = terms.map(|t| 2 * t);
            r.offered_msgs_per_s = offered;
            r
        };
        let calm = vec![series(Some(0), None), series(Some(0), Some(10_000.0))];
        assert!(elections(&calm).is_none());
        let mut standalone = series(None, None);
        standalone.mode = "standalone";
        assert!(elections(&[standalone]).is_none());
        let unknown = elections(&[series(None, None)]).expect("a failure");
        assert!(
            unknown.to_string().contains("leadership unknown"),
            "{unknown}"
        );
        let moved = vec![series(Some(0), None), series(Some(2), Some(20_000.0))];
        let e = elections(&moved).expect("a failure").to_string();
        assert!(
            e.contains("publish 1/request open loop 20000/s: term +2, leader changes +4"),
            "{e}"
        );
        // A leader that stopped leading for want of a quorum and led again: no new term.
        let mut lease = series(Some(0), None);
        lease.leader_changes = Some(2);
        assert!(elections(std::slice::from_ref(&lease)).is_some());
        assert_eq!(elections_cell(&lease), "0 (2 leader changes)");
        // A lease that lapsed in the same term is shown, and is no leader change.
        let mut lapsed = series(Some(0), None);
        lapsed.lease_lapses = Some(3);
        assert!(elections(std::slice::from_ref(&lapsed)).is_none());
        assert_eq!(elections_cell(&lapsed), "0 (3 lease lapses)");
        assert_eq!(elections_cell(&series(Some(1), None)), "1");
        // The pending scenario (its fill) counts as well.
        let mut pending = series(Some(1), None);
        pending.scenario = "pending";
        assert!(elections(&[pending]).is_some());
        // And so does the overload series.
        let mut overload = series(Some(0), Some(40_000.0));
        overload.scenario = "overload";
        overload.leader_changes = Some(1);
        assert!(elections(&[overload]).is_some());
    }

    #[test]
    fn ratios_pair_like_with_like() {
        let runs = vec![
            run(
                ("futureq", "standalone", "quorum", "publish", 1),
                60_000.0,
                1000,
            ),
            run(("futureq", "standalone", "leader", "publish", 1), 1.0, 1),
            run(
                (
                    "redis-zset",
                    "standalone",
                    "appendfsync-always",
                    "publish",
                    1,
                ),
                30_000.0,
                4000,
            ),
            run(
                (
                    "redis-zset",
                    "standalone",
                    "appendfsync-always",
                    "publish",
                    1,
                ),
                10_000.0,
                500,
            )
            .open(10_000.0),
        ];
        let t = ratios(&runs, 100);
        let rows: Vec<&str> = t.lines().skip(2).collect();
        assert_eq!(
            rows.len(),
            1,
            "the open-loop run has no futureq partner: {t}"
        );
        assert!(rows[0].contains("1/request"), "{t}");
        assert!(rows[0].contains("| 2.00× |"), "throughput ratio: {t}");
        assert!(rows[0].ends_with("| 0.25× |"), "p99 ratio: {t}");
        let mut runs = runs;
        runs.push(
            run(
                ("futureq", "standalone", "quorum", "publish", 1),
                10_000.0,
                250,
            )
            .open(10_000.0),
        );
        let t = ratios(&runs, 100);
        let open = t
            .lines()
            .find(|l| l.contains("open loop 10000/s"))
            .expect(&t);
        assert!(open.ends_with("| 0.50× |"), "{t}");
    }
}
