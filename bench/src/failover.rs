//! The `failover` scenario: `kill -9` of a loaded 3-node cluster's leader, timed until the
//! first QUORUM ack from the new leader.
//!
//! Each repetition starts from three healthy nodes (the node killed in the previous one was
//! restarted and caught up, and leadership held for 1.5 s), publishes at QUORUM on 4
//! streams, one message per request, to the leader for 0.5 s, then kills it. From the kill,
//! probes on every survivor publish one QUORUM message at a time (a follower refuses it at
//! once with the leader's address); the time to the first ack is the failover time.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;

use crate::load::{Ack, PublishParams};
use crate::procs::Cluster;
use crate::stats::hist;

/// Longest a failover may take before the run fails.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
/// Longest one probe waits for its ack (a request to a node that lost leadership can wait
/// for a commit that never comes).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One QUORUM message to `addr` ([`crate::load::drain`]): Ok once it is acked.
async fn probe(addr: &str) -> anyhow::Result<()> {
    tokio::time::timeout(PROBE_TIMEOUT, crate::load::drain(addr))
        .await
        .context("no ack")?
}

/// Probes every address in `survivors` until one acks; the time from `t0`.
async fn first_ack(survivors: &[String], t0: Instant) -> anyhow::Result<Duration> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Duration>(survivors.len());
    let mut probers = Vec::new();
    for addr in survivors {
        let (addr, tx) = (addr.clone(), tx.clone());
        probers.push(tokio::spawn(async move {
            while probe(&addr).await.is_err() {
                if t0.elapsed() > FAILOVER_LIMIT {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let _ = tx.send(t0.elapsed()).await;
        }));
    }
    drop(tx);
    let took = rx.recv().await;
    for p in probers {
        p.abort();
    }
    took.with_context(|| format!("no survivor acked a QUORUM publish within {FAILOVER_LIMIT:?}"))
}

/// `reps` failovers of `cluster` (it ends with three healthy nodes); the histogram of their
/// times, µs. `step` reports progress.
pub(crate) async fn run(
    cluster: &mut Cluster,
    reps: usize,
    step: impl Fn(String),
) -> anyhow::Result<Histogram<u64>> {
    let mut h = hist();
    for rep in 1..=reps {
        let leader = cluster.leader_index().await?;
        step(format!(
            "futureq cluster3: failover {rep}/{reps} (kill -9 node {})",
            leader + 1
        ));
        let addr = cluster.nodes[leader].addr.clone();
        let params = PublishParams {
            streams: 4,
            window: 1,
            batch: 1,
            size: 100,
            warmup: Duration::ZERO,
            measure: Duration::from_secs(3600),
            ack: Ack::Quorum,
            delay_ms: 3_600_000,
            dedup: false,
        };
        // The load ends with an error when its node dies: that is expected.
        let load = tokio::spawn(async move { crate::load::publish_run(&addr, &params).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        if load.is_finished() {
            let why = match load.await {
                Ok(Err(e)) => format!("{e:#}"),
                other => format!("{:?}", other.map(|_| ())),
            };
            bail!("the load on the leader stopped before the kill: {why}");
        }
        let t0 = Instant::now();
        cluster.nodes[leader].kill9();
        let survivors: Vec<String> = (0..cluster.nodes.len())
            .filter(|&i| i != leader)
            .map(|i| cluster.nodes[i].addr.clone())
            .collect();
        let took = first_ack(&survivors, t0).await;
        load.abort();
        let took = took?;
        h.record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1))?;
        cluster.nodes[leader].respawn().await?;
        cluster.caught_up(leader).await?;
        cluster.settle().await?;
    }
    Ok(h)
}
