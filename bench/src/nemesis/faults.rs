//! The faults: their kinds and classes, the nftables partitions, and the seeded schedule that
//! injects them (kills, pauses, partitions, a follower replaced, disk faults).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::history::{lock, now_ms, FaultRec, Rng, Shared};
use futureq_bench::pb::future_q_cluster_client::FutureQClusterClient;
use futureq_bench::pb::ClusterInfoRequest;

use super::workload::{find_leader, leader_channel, CALL_TIMEOUT};
use crate::procs::Cluster;

/// Fault classes a run may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FaultKind {
    /// kill -9, restart after 0.5–3 s.
    Kill,
    /// SIGSTOP for 0.5–5 s, then SIGCONT.
    Pause,
    /// Cut Raft links with nftables for 1–5 s.
    Partition,
    /// A follower is killed, removed (`futureq leave`), wiped and joins again as a new node.
    Membership,
    /// A disk fault under a node's Raft log (fsync error, ENOSPC, torn write + crash); needs
    /// futureq built with `--features fault-injection`.
    Disk,
}

/// The nftables table holding the partition rules (removed when the run ends).
pub(super) const NFT_TABLE: &str = "futureq_nemesis";

pub(super) fn nft(args: &str) -> Result<(), String> {
    let out = std::process::Command::new("nft")
        .args(args.split_whitespace())
        .output()
        .map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft {args}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Partitions between the nodes' addresses (127.0.0.1–3) on the Raft port.
pub(super) struct Firewall {
    pub(super) raft_port: u16,
}

impl Firewall {
    /// Creates the table and its output chain; an error says why partitions cannot run.
    pub(super) fn new(raft_port: u16) -> Result<Firewall, String> {
        let _ = nft(&format!("delete table inet {NFT_TABLE}"));
        nft(&format!("add table inet {NFT_TABLE}"))?;
        nft(&format!(
            "add chain inet {NFT_TABLE} output {{ type filter hook output priority 0 ; }}"
        ))?;
        Ok(Firewall { raft_port })
    }

    /// Drops every Raft packet between nodes `a` and `b` (0-based), both directions.
    pub(super) fn cut(&self, a: usize, b: usize) -> Result<(), String> {
        let p = self.raft_port;
        for (x, y) in [(a, b), (b, a)] {
            for dir in ["dport", "sport"] {
                nft(&format!(
                    "add rule inet {NFT_TABLE} output ip saddr 127.0.0.{} ip daddr 127.0.0.{} tcp {dir} {p} drop",
                    x + 1,
                    y + 1
                ))?;
            }
        }
        Ok(())
    }

    pub(super) fn heal(&self) -> Result<(), String> {
        nft(&format!("flush chain inet {NFT_TABLE} output"))
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {NFT_TABLE}"));
    }
}

/// The index of the node that leads (by its gRPC URL), if known.
pub(super) async fn leader_index(c: &Cluster) -> Option<usize> {
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    let l = find_leader(&addrs).await?;
    addrs.iter().position(|a| *a == l)
}

/// Runs the fault schedule for `duration`, then heals everything.
/// One fault class: what is done, and to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    KillLeader,
    KillFollower,
    PauseLeader,
    PauseFollower,
    IsolateLeader,
    IsolateFollower,
    /// The two followers cut from each other; both still see the leader.
    Bridge,
    /// A follower killed, removed from the cluster, wiped, and joined again under a new id.
    ReplaceFollower,
    /// The node's next Raft log fsync fails: it must stop (and is restarted).
    DiskFsync,
    /// The node's next Raft log write fails with ENOSPC: it must stop (and is restarted).
    DiskFull,
    /// The node's next Raft log write is torn, then the process dies (and is restarted).
    DiskTorn,
}

impl Class {
    pub(super) const ALL: [Class; 11] = [
        Class::KillLeader,
        Class::KillFollower,
        Class::PauseLeader,
        Class::PauseFollower,
        Class::IsolateLeader,
        Class::IsolateFollower,
        Class::Bridge,
        Class::ReplaceFollower,
        Class::DiskFsync,
        Class::DiskFull,
        Class::DiskTorn,
    ];

    pub(super) fn kind(self) -> FaultKind {
        match self {
            Class::KillLeader | Class::KillFollower => FaultKind::Kill,
            Class::PauseLeader | Class::PauseFollower => FaultKind::Pause,
            Class::ReplaceFollower => FaultKind::Membership,
            Class::DiskFsync | Class::DiskFull | Class::DiskTorn => FaultKind::Disk,
            _ => FaultKind::Partition,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Class::KillLeader => "kill-leader",
            Class::KillFollower => "kill-follower",
            Class::PauseLeader => "pause-leader",
            Class::PauseFollower => "pause-follower",
            Class::IsolateLeader => "isolate-leader",
            Class::IsolateFollower => "isolate-follower",
            Class::Bridge => "bridge",
            Class::ReplaceFollower => "replace-follower",
            Class::DiskFsync => "disk-fsync",
            Class::DiskFull => "disk-enospc",
            Class::DiskTorn => "disk-torn",
        }
    }

    /// The trigger word of a disk fault.
    pub(super) fn disk_fault(self) -> Option<&'static str> {
        match self {
            Class::DiskFsync => Some("fsync"),
            Class::DiskFull => Some("enospc"),
            Class::DiskTorn => Some("torn"),
            _ => None,
        }
    }

    /// Whether it targets the leader (a bridge keeps the leader and cuts the followers).
    pub(super) fn hits_leader(self) -> bool {
        matches!(
            self,
            Class::KillLeader | Class::PauseLeader | Class::IsolateLeader | Class::Bridge
        )
    }
}

/// Runs the fault schedule for `duration`, then heals everything. The first faults go
/// through every enabled class once (in a seeded order, past `duration` if need be), so that
/// every class runs in every pass; then classes are drawn at random.
pub(super) async fn nemesis(
    c: &mut Cluster,
    rng: &mut Rng,
    kinds: &[FaultKind],
    firewall: Option<&Firewall>,
    duration: Duration,
    h: &Shared,
) -> anyhow::Result<()> {
    let enabled: Vec<Class> = Class::ALL
        .into_iter()
        .filter(|c| kinds.contains(&c.kind()))
        .collect();
    let mut first_round = enabled.clone();
    for i in (1..first_round.len()).rev() {
        let j = usize::try_from(rng.next() % (i as u64 + 1)).unwrap_or(0);
        first_round.swap(i, j);
    }
    first_round.reverse();
    let end = Instant::now() + duration;
    // Node ids given to replaced followers (the initial members are 1-3).
    let mut next_id = 4u64;
    // Every enabled class runs once however short the pass, then random ones until the end.
    while !first_round.is_empty() || Instant::now() < end {
        tokio::time::sleep(rng.ms(1_000, 3_000)).await;
        let class = first_round
            .pop()
            .unwrap_or_else(|| enabled[usize::try_from(rng.next()).unwrap_or(0) % enabled.len()]);
        let leader = leader_index(c).await.unwrap_or(0);
        let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
        let node = if class.hits_leader()
            || (class.disk_fault().is_some() && rng.next().is_multiple_of(2))
        {
            leader
        } else {
            followers[usize::try_from(rng.next() % 2).unwrap_or(0)]
        };
        let start_ms = now_ms();
        match class {
            Class::KillLeader | Class::KillFollower => {
                c.nodes[node].kill9();
                tokio::time::sleep(rng.ms(500, 3_000)).await;
                c.nodes[node]
                    .respawn()
                    .await
                    .with_context(|| format!("restarting node {}", node + 1))?;
            }
            Class::PauseLeader | Class::PauseFollower => {
                c.nodes[node].signal("STOP");
                tokio::time::sleep(rng.ms(500, 5_000)).await;
                c.nodes[node].signal("CONT");
            }
            Class::IsolateLeader | Class::IsolateFollower | Class::Bridge => {
                let fw = firewall.context("partitions need nftables")?;
                let cuts: Vec<(usize, usize)> = if class == Class::Bridge {
                    vec![(followers[0], followers[1])]
                } else {
                    (0..3).filter(|o| *o != node).map(|o| (node, o)).collect()
                };
                for (a, b) in &cuts {
                    fw.cut(*a, *b).map_err(anyhow::Error::msg)?;
                }
                tokio::time::sleep(rng.ms(1_000, 5_000)).await;
                fw.heal().map_err(anyhow::Error::msg)?;
            }
            Class::ReplaceFollower => {
                replace_follower(c, (node, leader), rng, next_id).await?;
                next_id += 1;
            }
            Class::DiskFsync | Class::DiskFull | Class::DiskTorn => {
                disk_fault(c, class, node, rng).await?;
            }
        }
        eprintln!(
            "nemesis: {} (node {}) for {} ms",
            class.name(),
            node + 1,
            now_ms() - start_ms
        );
        lock(h).faults.push(FaultRec {
            kind: class.name(),
            node: node + 1,
            leader: node == leader,
            start_ms,
            end_ms: now_ms(),
        });
    }
    Ok(())
}

/// Replaces follower `node`: kills it, removes it from the cluster through the leader
/// (`leave`), and joins it again with a fresh store as node `next_id`; returns once the
/// leader counts it as a voter.
pub(super) async fn replace_follower(
    c: &mut Cluster,
    (node, leader): (usize, usize),
    rng: &mut Rng,
    next_id: u64,
) -> anyhow::Result<()> {
    let seed = c.nodes[leader]
        .addr
        .trim_start_matches("http://")
        .to_owned();
    c.nodes[node].kill9();
    let said = c.nodes[node]
        .cli(&["leave", "--seed", &seed])
        .with_context(|| format!("removing node {}", node + 1))?;
    eprintln!("nemesis: {}", said.trim());
    tokio::time::sleep(rng.ms(500, 2_000)).await;
    let id = next_id;
    c.nodes[node]
        .rejoin_fresh(id, &seed)
        .await
        .with_context(|| format!("node {} joining again as {id}", node + 1))?;
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    wait_voter(&addrs, id).await?;
    Ok(())
}

/// Injects a disk fault under `node`'s Raft log and checks it stops as it must (status 74
/// after a failed write or fsync, SIGABRT after a torn write); then restarts it.
pub(super) async fn disk_fault(
    c: &mut Cluster,
    class: Class,
    node: usize,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let word = class.disk_fault().unwrap_or_default();
    let n = &mut c.nodes[node];
    let trigger = n.dir().join("raft").join("inject-disk-fault");
    std::fs::write(&trigger, word)?;
    let Some(status) = n.wait_exit(Duration::from_secs(15)).await? else {
        bail!(
            "node {} kept running 15 s after an injected {word} fault under its Raft \
             log (is futureq built with --features fault-injection?)",
            node + 1
        );
    };
    // A failed write or fsync: exit status 74; a torn write: the crash (SIGABRT).
    let expected = if class == Class::DiskTorn {
        std::os::unix::process::ExitStatusExt::signal(&status) == Some(6)
    } else {
        status.code() == Some(74)
    };
    if !expected {
        bail!(
            "node {} ended with {status} after the {word} fault",
            node + 1
        );
    }
    eprintln!(
        "nemesis: node {} stopped after the {word} fault ({status})",
        node + 1
    );
    tokio::time::sleep(rng.ms(500, 2_000)).await;
    n.respawn()
        .await
        .with_context(|| format!("restarting node {} after a disk fault", node + 1))?;
    Ok(())
}

/// Waits until the leader counts node `id` as a voter (its join finished).
pub(super) async fn wait_voter(addrs: &[String], id: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some((_, ch)) = leader_channel(addrs).await {
            let info = tokio::time::timeout(
                CALL_TIMEOUT,
                FutureQClusterClient::new(ch).get_cluster_info(ClusterInfoRequest {}),
            )
            .await;
            if let Ok(Ok(r)) = info {
                if r.into_inner()
                    .nodes
                    .iter()
                    .any(|n| n.node_id == id && n.is_voter)
                {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("node {id} did not become a voter within 60 s of joining")
}
