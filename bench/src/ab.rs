//! `futureq-bench ab`: two futureq binaries measured side by side in one run — the before and
//! after of a change on this noisy machine. Rounds alternate the order (before then after,
//! after then before, …), each run gets a fresh deployment and data directory, and the report
//! gives each series' median and range per binary and the ratio of the medians.

/// `cluster.raft.rtt` of the clusters `ab` starts.
const AB_RTT: &str = "20ms";

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::compare::{Plan, Target};
use crate::load::{Ack, PublishParams};
use crate::procs::{standalone, Broker, Cluster};

/// The series measured: QUORUM publish at one message per request and at 100, and with
/// `--dedup` the same with a dedup id on every message.
fn series(dedup: bool) -> Vec<(usize, bool)> {
    let mut s = vec![(1, false), (100, false)];
    if dedup {
        s.extend([(1, true), (100, true)]);
    }
    s
}

/// What one run measures: a standalone broker or a 3-node cluster.
enum Deployment {
    One(Broker),
    Three(Cluster),
}

impl Deployment {
    fn stop(self) -> anyhow::Result<()> {
        match self {
            Deployment::One(b) => b.stop(),
            Deployment::Three(c) => c.stop(),
        }
    }
}

/// One measured series of one binary in one round.
#[derive(Debug, Serialize)]
struct Sample {
    binary: &'static str,
    round: usize,
    batch: usize,
    /// Every message carried a dedup id.
    dedup: bool,
    msgs_per_s: f64,
    p99_us: u64,
    /// The broker's CPU time per acked message (every node of a cluster), µs.
    cpu_us_per_msg: Option<f64>,
    /// The broker's thread sleeps per acked message (every node of a cluster).
    sleeps_per_msg: Option<f64>,
    /// Messages put in queues another executor serves, per acked message (every node).
    cross_core_per_msg: Option<f64>,
    /// Leadership gained or lost on any node during the series, every attempt (a series
    /// whose leader moved runs again on the new one): 0 with no fault (cluster only).
    leader_changes: Option<u64>,
    /// Leases that lapsed in the same term during the series, every attempt (cluster only).
    lease_lapses: Option<u64>,
}

/// Median, smallest and largest of `v` (not empty).
pub(crate) fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    (median, v[0], v[v.len() - 1])
}

/// The report's table: per series, each binary's median [range] throughput and median p99,
/// and the after ÷ before ratio of the median throughputs.
fn table(samples: &[Sample], mode: &str) -> String {
    let mut out = format!(
        "| {mode} series | before msgs/s median [range] | after msgs/s median [range] | after ÷ before | before p99 ms | after p99 ms | before CPU µs/msg | after CPU µs/msg | before sleeps/msg | after sleeps/msg | before cross-core/msg | after cross-core/msg |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut rows: Vec<(usize, bool)> = Vec::new();
    for s in samples {
        if !rows.contains(&(s.batch, s.dedup)) {
            rows.push((s.batch, s.dedup));
        }
    }
    for (batch, dedup) in rows {
        let of = |binary: &str, f: fn(&Sample) -> f64| -> Vec<f64> {
            samples
                .iter()
                .filter(|s| s.binary == binary && s.batch == batch && s.dedup == dedup)
                .map(f)
                .collect()
        };
        let rate = |s: &Sample| s.msgs_per_s;
        #[allow(clippy::cast_precision_loss)]
        let p99 = |s: &Sample| s.p99_us as f64 / 1000.0;
        let (b, a) = (of("before", rate), of("after", rate));
        if b.is_empty() || a.is_empty() {
            continue;
        }
        let ((bm, bl, bh), (am, al, ah)) = (spread(b), spread(a));
        let (bp, ap) = (spread(of("before", p99)).0, spread(of("after", p99)).0);
        let cpu = |s: &Sample| s.cpu_us_per_msg.unwrap_or(f64::NAN);
        let (bc, ac) = (spread(of("before", cpu)).0, spread(of("after", cpu)).0);
        let sleeps = |s: &Sample| s.sleeps_per_msg.unwrap_or(f64::NAN);
        let (bs, as_) = (
            spread(of("before", sleeps)).0,
            spread(of("after", sleeps)).0,
        );
        let cross = |s: &Sample| s.cross_core_per_msg.unwrap_or(f64::NAN);
        let (bx, ax) = (spread(of("before", cross)).0, spread(of("after", cross)).0);
        let ratio = if bm > 0.0 && (am / bm).is_finite() {
            format!("{:.2}×", am / bm)
        } else {
            "—".to_owned()
        };
        let ids = ids_label(dedup);
        out.push_str(&format!(
            "| QUORUM {batch}/request{ids} | {bm:.0} [{bl:.0}–{bh:.0}] | {am:.0} [{al:.0}–{ah:.0}] | {ratio} | {bp:.2} | {ap:.2} | {bc:.1} | {ac:.1} | {bs:.2} | {as_:.2} | {bx:.2} | {ax:.2} |\n"
        ));
    }
    out
}

/// How a series with dedup ids is named after its batch size.
fn ids_label(dedup: bool) -> &'static str {
    if dedup {
        ", dedup ids"
    } else {
        ""
    }
}

/// The series in which leadership moved with no fault injected (their numbers include a
/// series run again on the new leader), if any.
fn leadership_moves(samples: &[Sample]) -> Option<String> {
    series_where(samples, "leadership moved with no fault injected in", |s| {
        s.leader_changes
    })
}

/// The series in which a leader's lease lapsed in the same term (deliveries held while the
/// followers answered late), if any.
fn lease_lapses(samples: &[Sample]) -> Option<String> {
    series_where(
        samples,
        "leases lapsed in the same term (deliveries held) in",
        |s| s.lease_lapses,
    )
}

/// `what`, then the series whose `count` is above 0 with it, if any.
fn series_where(
    samples: &[Sample],
    what: &str,
    count: impl Fn(&Sample) -> Option<u64>,
) -> Option<String> {
    let moved: Vec<String> = samples
        .iter()
        .filter(|s| count(s).is_some_and(|c| c > 0))
        .map(|s| {
            let ids = ids_label(s.dedup);
            format!(
                "{} round {} QUORUM {}/request{ids} (+{})",
                s.binary,
                s.round,
                s.batch,
                count(s).unwrap_or_default()
            )
        })
        .collect();
    (!moved.is_empty()).then(|| format!("{what}: {}", moved.join("; ")))
}

/// Runs `rounds` rounds of every series on both binaries, standalone or on a 3-node cluster;
/// writes `out/ab.json` and prints the table.
///
/// Both binaries are started by the bench's harness (its `FUTUREQ_*` environment settings and
/// flags): a "before" binary must be recent enough to accept them.
pub(crate) async fn run(
    (before, after): (&Path, &Path),
    rounds: usize,
    quick: bool,
    (cluster, dedup): (bool, bool),
    out: &Path,
) -> anyhow::Result<()> {
    if rounds == 0 {
        anyhow::bail!("--rounds must be at least 1");
    }
    for bin in [before, after] {
        if !bin.is_file() {
            anyhow::bail!("{} is not a file", bin.display());
        }
    }
    let plan = Plan::new(quick, 100, 100);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("ab.json");
    let mut samples = Vec::new();
    let measured = measure(
        &plan,
        (before, after),
        rounds,
        (cluster, dedup),
        &mut samples,
    )
    .await;
    // The samples measured so far are written even when a run failed: a long A/B that fails in
    // its last round still leaves its numbers.
    std::fs::write(&path, serde_json::to_vec_pretty(&samples)?)
        .with_context(|| format!("writing {}", path.display()))?;
    measured?;
    let mode = if cluster { "cluster3" } else { "standalone" };
    println!(
        "before: {}\nafter:  {}\n",
        before.display(),
        after.display()
    );
    println!("{}", table(&samples, mode));
    for note in [leadership_moves(&samples), lease_lapses(&samples)]
        .into_iter()
        .flatten()
    {
        println!("{note}\n");
    }
    println!("samples: {}", path.display());
    Ok(())
}

/// The rounds of [`run`], each sample pushed as soon as it is measured. A deployment that
/// fails to start keeps its data directory (with the broker's log) and names it in the error.
async fn measure(
    plan: &Plan,
    (before, after): (&Path, &Path),
    rounds: usize,
    (cluster, dedup): (bool, bool),
    samples: &mut Vec<Sample>,
) -> anyhow::Result<()> {
    for round in 1..=rounds {
        let order = if !round.is_multiple_of(2) {
            [("before", before), ("after", after)]
        } else {
            [("after", after), ("before", before)]
        };
        for (binary, bin) in order {
            let work = tempfile::tempdir()?;
            let started = if cluster {
                // The same timers for both builds, whatever their defaults.
                Cluster::start_with(
                    bin,
                    work.path(),
                    vec![("CLUSTER_RAFT_RTT".into(), AB_RTT.into())],
                )
                .await
                .map(Deployment::Three)
            } else {
                standalone(bin, work.path()).await.map(Deployment::One)
            };
            let deployment = match started {
                Ok(d) => d,
                Err(e) => {
                    let kept = work.keep();
                    return Err(e.context(format!(
                        "starting {} ({binary}); its data directory and log are kept in {}",
                        bin.display(),
                        kept.display()
                    )));
                }
            };
            let target = match &deployment {
                Deployment::One(b) => Target::One(b),
                Deployment::Three(c) => Target::Three(c),
            };
            for (batch, with_ids) in series(dedup) {
                eprintln!(
                    "ab round {round}/{rounds}: {binary} ({}), {} QUORUM {batch}/request{}",
                    bin.display(),
                    target.mode(),
                    ids_label(with_ids)
                );
                let p = PublishParams {
                    dedup: with_ids,
                    ..plan.publish(batch, Ack::Quorum, 3_600_000)
                };
                let ids = ids_label(with_ids);
                let (o, costs) = match target.publish(&p).await {
                    Ok(measured) => measured,
                    Err(e) => {
                        // The brokers' logs say why; they stay with the data directories
                        // (kept whether or not the brokers stop cleanly).
                        let stopped = deployment.stop();
                        let kept = work.keep();
                        let stop = stopped.err().map_or_else(String::new, |s| {
                            format!(" (stopping them failed too: {s:#})")
                        });
                        return Err(e.context(format!(
                            "{binary} ({}), QUORUM {batch}/request{ids}; the brokers' data directories and logs are kept in {}{stop}",
                            bin.display(),
                            kept.display()
                        )));
                    }
                };
                samples.push(Sample {
                    binary,
                    round,
                    batch,
                    dedup: with_ids,
                    msgs_per_s: o.msgs_per_s,
                    p99_us: o.latency.value_at_quantile(0.99),
                    cpu_us_per_msg: costs.cpu_us,
                    sleeps_per_msg: costs.sleeps,
                    cross_core_per_msg: costs.cross_core,
                    leader_changes: costs.leader_changes,
                    lease_lapses: costs.lease_lapses,
                });
            }
            deployment.stop()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ranges_and_ratio() {
        assert_eq!(spread(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        let s = |binary, round, batch, msgs_per_s| Sample {
            binary,
            round,
            batch,
            dedup: batch == 7,
            msgs_per_s,
            p99_us: 2000,
            cpu_us_per_msg: Some(30.0),
            sleeps_per_msg: Some(2.0),
            cross_core_per_msg: Some(1.5),
            leader_changes: Some(0),
            lease_lapses: Some(0),
        };
        let samples = [
            s("before", 1, 1, 100.0),
            s("after", 1, 1, 150.0),
            s("after", 2, 1, 250.0),
            s("before", 2, 1, 100.0),
        ];
        let t = table(&samples, "standalone");
        assert!(
            t.contains(
                "| QUORUM 1/request | 100 [100–100] | 200 [150–250] | 2.00× | 2.00 | 2.00 | 30.0 | 30.0 | 2.00 | 2.00 | 1.50 | 1.50 |"
            ),
            "{t}"
        );
        assert!(
            !t.contains("100/request"),
            "a series without samples has no row"
        );
        let t = table(&[s("before", 1, 100, 0.0), s("after", 1, 100, 50.0)], "x");
        assert!(
            t.contains("| QUORUM 100/request | 0 [0–0] | 50 [50–50] | — |"),
            "no ratio against a zero median: {t}"
        );
        assert_eq!(leadership_moves(&samples), None);
        assert_eq!(lease_lapses(&samples), None);
        let mut moved = s("after", 3, 1, 10.0);
        moved.leader_changes = Some(2);
        assert_eq!(
            leadership_moves(std::slice::from_ref(&moved)).as_deref(),
            Some("leadership moved with no fault injected in: after round 3 QUORUM 1/request (+2)")
        );
        assert_eq!(lease_lapses(std::slice::from_ref(&moved)), None);
        moved.lease_lapses = Some(1);
        assert_eq!(
            lease_lapses(&[moved]).as_deref(),
            Some("leases lapsed in the same term (deliveries held) in: after round 3 QUORUM 1/request (+1)")
        );
        // With dedup ids, the plain and the dedup series are rows of their own.
        let t = table(
            &[
                s("before", 1, 1, 100.0),
                s("after", 1, 1, 100.0),
                s("before", 1, 7, 10.0),
                s("after", 1, 7, 30.0),
            ],
            "x",
        );
        assert!(
            t.contains("| QUORUM 1/request | 100 [100–100] | 100 [100–100] | 1.00× |"),
            "{t}"
        );
        assert!(
            t.contains("| QUORUM 7/request, dedup ids | 10 [10–10] | 30 [30–30] | 3.00× |"),
            "{t}"
        );
    }
}
