//! `futureq-bench nemesis`: a Jepsen-style fault run. It starts a 3-node futureq cluster on
//! loopback, drives it with two QUORUM publishers and one group consumer, injects faults from
//! a seeded schedule, heals them, lets every due message be delivered, and checks the history:
//!
//! - **lost**: QUORUM-acked, never delivered;
//! - **unexpected**: delivered, never published;
//! - **early**: delivered before it was due;
//! - **tag reuse**: one delivery tag for two payloads;
//! - **resurrected**: delivered again after its ACK had [`history::ACK_SETTLE`] of fault-free time to
//!   commit;
//! - **liveness**: soon after the faults heal every node answers on a fresh connection, all
//!   agree on the leader, and the leader acks a QUORUM write within a few seconds;
//! - **convergence**: after healing every node reports the same applied index and the same
//!   store digest (a hash of every stored row: same messages, indexes and groups).
//!
//! Faults: kill -9 + restart, SIGSTOP/SIGCONT pauses of the leader or a follower (0.5–5 s),
//! and partitions of the Raft links (an isolated leader, an isolated follower, a bridge where
//! two nodes are cut but both see the third) made with nftables rules between the nodes'
//! loopback addresses (peer links bind to the host of `cluster.raft.listen`). Without `nft`
//! (`scripts/install-nemesis.sh`) or the privilege to load rules, partitions are skipped with
//! a line saying so. Membership change under load: a follower is killed, removed with
//! `futureq leave`, its data deleted, and it joins again as a new node (catching up from a
//! snapshot or the log); the run waits until it is a voter. Disk faults (the leader's or a
//! follower's): the next Raft log fsync fails, the next write fails with ENOSPC, or the next
//! write is torn and the process dies — injected in-process through the log's I/O seam
//! (futureq built with `--features fault-injection`); the node must stop by itself (status
//! 74, or the crash), and it is restarted.
//!
//! Files: `history` (what a pass records, and the checks over it), `workload` (publishers and
//! the consumer), `faults` (the fault classes and the schedule), `checks` (liveness and
//! convergence after healing); this file runs a pass.

mod checks;
mod faults;
mod history;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use self::checks::{convergence, liveness};
pub(crate) use self::faults::FaultKind;
use self::faults::{nemesis, Class, Firewall};
use self::history::{check, lock, Report, Rng, Shared};
use self::workload::{consumer, publisher, DELAY_MAX_MS};
use crate::procs::Cluster;

/// The cluster under test: a short Raft rtt and in-flight timeout; with `tls`, the nodes on
/// mutual TLS and TLS on the client plane, and the workload over TLS. The TLS material must
/// live as long as the cluster: restarted nodes read it again.
async fn start_cluster(
    bin: &std::path::Path,
    dir: &std::path::Path,
    tls: bool,
) -> anyhow::Result<(Cluster, Option<crate::security::Material>)> {
    let material = tls.then(|| crate::security::material(bin)).transpose()?;
    let mut tls_env = Vec::new();
    if let Some(m) = &material {
        tls_env = crate::security::tls_env(m);
        crate::conn::set_client_security(Some(crate::security::tls_client(m)));
    }
    let c = Cluster::start_with(
        bin,
        dir,
        vec![
            ("CLUSTER_RAFT_RTT".into(), "20ms".into()),
            ("DELIVERY_INFLIGHTTIMEOUT".into(), "2s".into()),
            ("OBSERVABILITY_LOGGING_LEVEL".into(), "info".into()),
        ]
        .into_iter()
        .chain(tls_env)
        .collect(),
    )
    .await?;
    Ok((c, material))
}

/// Partitions need nftables: without it they are left out of `kinds` (said once).
fn firewall_for(kinds: &mut Vec<FaultKind>, raft_port: u16) -> Option<Firewall> {
    if !kinds.contains(&FaultKind::Partition) {
        return None;
    }
    match Firewall::new(raft_port) {
        Ok(f) => Some(f),
        Err(e) => {
            println!("nemesis: partitions skipped: nftables cannot run here ({e}); install it with scripts/install-nemesis.sh (as root)");
            kinds.retain(|k| *k != FaultKind::Partition);
            None
        }
    }
}

/// Waits until everything acked was delivered: it is due within [`DELAY_MAX_MS`], and
/// redeliveries get 15 s more.
async fn wait_delivered(h: &Shared) {
    let drain_until =
        Instant::now() + Duration::from_millis(DELAY_MAX_MS) + Duration::from_secs(15);
    loop {
        let (acked, delivered) = {
            let g = lock(h);
            let delivered = g.acked.keys().filter(|p| g.acks.contains_key(*p)).count();
            (g.acked.len(), delivered)
        };
        if delivered == acked || Instant::now() > drain_until {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Copies every node's log into `keep`.
fn keep_logs(c: &Cluster, keep: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(keep)?;
    for (i, n) in c.nodes.iter().enumerate() {
        let _ = std::fs::copy(
            n.dir().join("futureq.log"),
            keep.join(format!("node{}.log", i + 1)),
        );
    }
    Ok(())
}

/// Runs one nemesis pass; fails when the checker found a violation.
pub(crate) async fn run(
    seed: u64,
    duration: Duration,
    kinds: &[FaultKind],
    out: &std::path::Path,
    (futureq, tls): (Option<PathBuf>, bool),
) -> anyhow::Result<()> {
    if kinds.is_empty() {
        bail!("no fault kinds selected");
    }
    let bin = crate::compare::futureq_binary(futureq)?;
    std::fs::create_dir_all(out)?;
    let dir = tempfile::Builder::new()
        .prefix("futureq-nemesis")
        .tempdir()?;
    eprintln!(
        "nemesis: seed {seed}, {} s of faults {kinds:?}; cluster in {}",
        duration.as_secs(),
        dir.path().display()
    );
    let mut kinds = kinds.to_vec();
    let (mut c, _material) = start_cluster(&bin, dir.path(), tls).await?;
    let firewall = firewall_for(&mut kinds, c.raft_port);
    if kinds.is_empty() {
        bail!("no fault kind can run here");
    }
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    let h: Shared = Arc::default();
    let stop_pub = Arc::new(AtomicBool::new(false));
    let stop_con = Arc::new(AtomicBool::new(false));
    let mut rng = Rng(seed);
    let tasks: Vec<_> = (0..2)
        .map(|i| {
            tokio::spawn(publisher(
                i,
                addrs.clone(),
                Arc::clone(&h),
                Arc::clone(&stop_pub),
                seed ^ (i as u64 + 1),
            ))
        })
        .collect();
    let cons = tokio::spawn(consumer(
        addrs.clone(),
        Arc::clone(&h),
        Arc::clone(&stop_con),
    ));
    let faults = nemesis(&mut c, &mut rng, &kinds, firewall.as_ref(), duration, &h).await;
    if let Some(fw) = &firewall {
        let _ = fw.heal();
    }
    // Healed: every node runs and none is paused.
    stop_pub.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let mut report = Report {
        seed,
        duration_s: duration.as_secs(),
        ..Report::default()
    };
    match liveness(&c).await {
        Ok(t) => report.liveness_after_ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX),
        Err(e) => report.liveness = Some(e),
    }
    wait_delivered(&h).await;
    // A little longer: late redeliveries (resurrections) show up here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_con.store(true, Ordering::Relaxed);
    let _ = cons.await;
    if let Err(e) = convergence(&c).await {
        report.convergence = Some(e);
    }
    check(&lock(&h), &mut report);
    report.classes_not_run = Class::ALL
        .into_iter()
        .filter(|c| kinds.contains(&c.kind()) && !report.faults.contains_key(c.name()))
        .map(Class::name)
        .collect();
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(out.join("nemesis.json"), &json)?;
    report.print();
    let violations = report.violations();
    if faults.is_err() || violations > 0 || !report.classes_not_run.is_empty() {
        // Keep the nodes' logs for the post-mortem.
        keep_logs(&c, &out.join("logs"))?;
    }
    verdict(faults, &report, out)?;
    c.stop()?;
    Ok(())
}

/// The pass fails on a fault that could not be carried out (a node that would not restart,
/// leave or rejoin: the checks then judged a cluster left broken), on any violation, and
/// when a fault class never ran.
fn verdict(
    faults: anyhow::Result<()>,
    report: &Report,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    faults.context("carrying out the fault schedule")?;
    let violations = report.violations();
    if violations > 0 {
        bail!(
            "{violations} violation(s); details in {}",
            out.join("nemesis.json").display()
        );
    }
    if !report.classes_not_run.is_empty() {
        bail!(
            "fault classes that never ran: {} (give the pass more --seconds)",
            report.classes_not_run.join(", ")
        );
    }
    Ok(())
}
