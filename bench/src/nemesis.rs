//! `futureq-bench nemesis`: a Jepsen-style fault run. It starts a 3-node futureq cluster on
//! loopback, drives it with two QUORUM publishers and one group consumer, injects faults from
//! a seeded schedule, heals them, lets every due message be delivered, and checks the history:
//!
//! - **lost**: QUORUM-acked, never delivered;
//! - **unexpected**: delivered, never published;
//! - **early**: delivered before it was due;
//! - **tag reuse**: one delivery tag for two payloads;
//! - **resurrected**: delivered again after its ACK had [`ACK_SETTLE`] of fault-free time to
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

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use futureq_bench::pb::future_q_cluster_client::FutureQClusterClient;
use futureq_bench::pb::future_q_consumer_client::FutureQConsumerClient;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{
    consumer_frame, AckRequest, ClusterInfoRequest, ConsumerFrame, PublishBatch, PublishMessage,
    SubscribeInit,
};
use serde::Serialize;
use tonic::transport::Channel;

use crate::procs::Cluster;

/// Fault-free time after an ACK within which it must have committed: a delivery after that
/// is a resurrection.
const ACK_SETTLE: Duration = Duration::from_secs(5);
/// How long after the faults heal every node must answer and agree on the leader.
const LIVENESS_WITHIN: Duration = Duration::from_secs(20);
/// How long the liveness check's write may take to be acked.
const WRITE_WITHIN: Duration = Duration::from_secs(5);
/// The topic of the liveness check's write (nothing consumes it).
const LIVENESS_TOPIC: &str = "nemesis-liveness";
/// Longest delay of a published message.
const DELAY_MAX_MS: u64 = 3_000;
/// Messages per published batch.
const BATCH: usize = 5;
/// Pause between a publisher's batches.
const PUBLISH_PACE: Duration = Duration::from_millis(20);
/// Per-call timeout of the clients.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The consumer group.
const GROUP: &str = "nemesis";
/// The topic.
const TOPIC: &str = "nemesis";

/// A small seeded generator (splitmix64): the schedule depends on the seed only.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (ms).
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo).max(1))
    }
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(i64::MAX)
}

/// One delivery the consumer saw.
#[derive(Clone)]
struct Delivered {
    payload: String,
    tag: Vec<u8>,
    at_ms: i64,
    due_ms: i64,
}

/// One injected fault: `[start, end)` in Unix ms.
#[derive(Clone, Serialize)]
struct FaultRec {
    kind: &'static str,
    node: usize,
    leader: bool,
    start_ms: i64,
    end_ms: i64,
}

/// What the clients and the nemesis recorded.
#[derive(Default)]
struct History {
    /// Payloads whose publish was attempted (acked or not).
    attempted: HashMap<String, ()>,
    /// QUORUM-acked payloads: their tags and when the ack came (Unix ms).
    acked: HashMap<String, (Vec<u8>, i64)>,
    deliveries: Vec<Delivered>,
    /// First ACK sent per payload (Unix ms).
    acks: HashMap<String, i64>,
    faults: Vec<FaultRec>,
}

type Shared = Arc<Mutex<History>>;

fn lock(h: &Shared) -> std::sync::MutexGuard<'_, History> {
    h.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The summary a run prints and writes.
#[derive(Serialize, Default)]
pub(crate) struct Report {
    seed: u64,
    duration_s: u64,
    faults: BTreeMap<&'static str, usize>,
    /// Enabled fault classes that never ran (the pass was too short): the pass fails.
    classes_not_run: Vec<&'static str>,
    published_attempted: usize,
    acked: usize,
    deliveries: usize,
    redeliveries: usize,
    lost: Vec<String>,
    unexpected: Vec<String>,
    early: Vec<String>,
    tag_reuse: Vec<String>,
    resurrected: Vec<String>,
    liveness: Option<String>,
    liveness_after_ms: u64,
    convergence: Option<String>,
    fault_log: Vec<FaultRec>,
}

impl Report {
    /// The pass's summary: what ran, and each check's count.
    fn print(&self) {
        println!(
            "nemesis seed {}: faults {:?}; {} publishes attempted, {} acked, {} deliveries ({} redeliveries)",
            self.seed, self.faults, self.published_attempted, self.acked, self.deliveries, self.redeliveries
        );
        println!(
            "lost {} · unexpected {} · early {} · tag reuse {} · resurrected {} · liveness {} · convergence {}",
            self.lost.len(),
            self.unexpected.len(),
            self.early.len(),
            self.tag_reuse.len(),
            self.resurrected.len(),
            self.liveness.as_deref().map_or_else(|| format!("ok ({} ms)", self.liveness_after_ms), str::to_owned),
            self.convergence.as_deref().unwrap_or("ok"),
        );
    }

    fn violations(&self) -> usize {
        self.lost.len()
            + self.unexpected.len()
            + self.early.len()
            + self.tag_reuse.len()
            + self.resurrected.len()
            + usize::from(self.liveness.is_some())
            + usize::from(self.convergence.is_some())
    }
}

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
const NFT_TABLE: &str = "futureq_nemesis";

fn nft(args: &str) -> Result<(), String> {
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
struct Firewall {
    raft_port: u16,
}

impl Firewall {
    /// Creates the table and its output chain; an error says why partitions cannot run.
    fn new(raft_port: u16) -> Result<Firewall, String> {
        let _ = nft(&format!("delete table inet {NFT_TABLE}"));
        nft(&format!("add table inet {NFT_TABLE}"))?;
        nft(&format!(
            "add chain inet {NFT_TABLE} output {{ type filter hook output priority 0 ; }}"
        ))?;
        Ok(Firewall { raft_port })
    }

    /// Drops every Raft packet between nodes `a` and `b` (0-based), both directions.
    fn cut(&self, a: usize, b: usize) -> Result<(), String> {
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

    fn heal(&self) -> Result<(), String> {
        nft(&format!("flush chain inet {NFT_TABLE} output"))
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {NFT_TABLE}"));
    }
}

/// A channel to `addr` (over TLS in a `--tls` run), or `None` within [`CALL_TIMEOUT`].
async fn channel(addr: &str) -> Option<Channel> {
    tokio::time::timeout(CALL_TIMEOUT, crate::conn::connect(addr))
        .await
        .ok()?
        .ok()
}

/// The leader's gRPC URL as some node reports it (a paused node times out and is skipped).
async fn find_leader(addrs: &[String]) -> Option<String> {
    for a in addrs {
        let Some(ch) = channel(a).await else { continue };
        let info = tokio::time::timeout(
            CALL_TIMEOUT,
            FutureQClusterClient::new(ch).get_cluster_info(ClusterInfoRequest {}),
        )
        .await;
        if let Ok(Ok(r)) = info {
            let r = r.into_inner();
            if !r.leader_address.is_empty() && r.leader_node_id != 0 {
                return Some(format!("http://{}", r.leader_address));
            }
        }
    }
    None
}

/// The leader's URL and a channel to it; `None` (after a short pause when no leader is
/// known) makes the caller try again.
async fn leader_channel(addrs: &[String]) -> Option<(String, Channel)> {
    let Some(leader) = find_leader(addrs).await else {
        tokio::time::sleep(Duration::from_millis(100)).await;
        return None;
    };
    let Some(ch) = channel(&leader).await else {
        tokio::time::sleep(Duration::from_millis(100)).await;
        return None;
    };
    Some((leader, ch))
}

/// Publishes QUORUM batches to whichever node leads until `stop`.
async fn publisher(id: usize, addrs: Vec<String>, h: Shared, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Some((_, ch)) = leader_channel(&addrs).await else {
            continue;
        };
        let (tx, rx) = futures::channel::mpsc::unbounded::<PublishBatch>();
        let Ok(Ok(resp)) = tokio::time::timeout(
            CALL_TIMEOUT,
            FutureQProducerClient::new(ch).publish_stream(rx),
        )
        .await
        else {
            continue;
        };
        let mut acks = resp.into_inner();
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let payloads: Vec<String> = (0..BATCH).map(|j| format!("p{id}-{n}-{j}")).collect();
            let messages = payloads
                .iter()
                .map(|p| PublishMessage {
                    topic: TOPIC.into(),
                    payload: p.clone().into_bytes(),
                    delay_ms: i64::try_from(rng.next() % DELAY_MAX_MS).unwrap_or(0),
                    ttl_ms: 0,
                    indexes: vec![],
                    ..PublishMessage::default()
                })
                .collect();
            {
                let mut g = lock(&h);
                for p in &payloads {
                    g.attempted.insert(p.clone(), ());
                }
            }
            if tx
                .unbounded_send(PublishBatch {
                    messages,
                    ack_level: 0,
                    batch_id: n,
                })
                .is_err()
            {
                break;
            }
            match tokio::time::timeout(CALL_TIMEOUT * 2, acks.message()).await {
                Ok(Ok(Some(a))) if a.success => {
                    let at = now_ms();
                    let mut g = lock(&h);
                    for (p, t) in payloads.iter().zip(a.delivery_tags) {
                        g.acked.insert(p.clone(), (t, at));
                    }
                }
                // Refused (not the leader), failed, timed out or the stream broke: the
                // outcome is unknown; find the leader again.
                _ => break,
            }
            tokio::time::sleep(PUBLISH_PACE).await;
        }
    }
}

/// Consumes the topic as group [`GROUP`] on whichever node leads, acking every delivery,
/// until `stop`.
async fn consumer(addrs: Vec<String>, h: Shared, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Some((leader, ch)) = leader_channel(&addrs).await else {
            continue;
        };
        let (tx, rx) = futures::channel::mpsc::unbounded::<ConsumerFrame>();
        let init = ConsumerFrame {
            frame: Some(consumer_frame::Frame::Init(SubscribeInit {
                topic: TOPIC.into(),
                group_id: GROUP.into(),
                read_from_replica: false,
                max_in_flight: 200,
            })),
        };
        if tx.unbounded_send(init).is_err() {
            continue;
        }
        let resp =
            match tokio::time::timeout(CALL_TIMEOUT, FutureQConsumerClient::new(ch).subscribe(rx))
                .await
            {
                Ok(Ok(r)) => r,
                other => {
                    let why = match other {
                        Ok(Err(s)) => format!("{:?}: {}", s.code(), s.message()),
                        _ => "timed out".into(),
                    };
                    eprintln!("nemesis: consumer: subscribe on {leader} failed ({why})");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
        eprintln!("nemesis: consumer: subscribed on {leader}");
        let mut stream = resp.into_inner();
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let m = match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
                Err(_) => continue,
                Ok(Ok(Some(m))) => m,
                Ok(end) => {
                    let why = match end {
                        Ok(_) => "ended".to_owned(),
                        Err(s) => format!("{:?}: {}", s.code(), s.message()),
                    };
                    eprintln!("nemesis: consumer: stream on {leader} {why}");
                    break;
                }
            };
            let at_ms = now_ms();
            let payload = String::from_utf8_lossy(&m.payload).into_owned();
            {
                let mut g = lock(&h);
                g.deliveries.push(Delivered {
                    payload: payload.clone(),
                    tag: m.delivery_tag.clone(),
                    at_ms,
                    due_ms: m.enqueued_at_unix_ms + m.delay_ms,
                });
                g.acks.entry(payload).or_insert(at_ms);
            }
            let ack = ConsumerFrame {
                frame: Some(consumer_frame::Frame::Ack(AckRequest {
                    success: true,
                    delivery_tag: m.delivery_tag,
                })),
            };
            if tx.unbounded_send(ack).is_err() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The index of the node that leads (by its gRPC URL), if known.
async fn leader_index(c: &Cluster) -> Option<usize> {
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    let l = find_leader(&addrs).await?;
    addrs.iter().position(|a| *a == l)
}

/// Runs the fault schedule for `duration`, then heals everything.
/// One fault class: what is done, and to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
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
    const ALL: [Class; 11] = [
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

    fn kind(self) -> FaultKind {
        match self {
            Class::KillLeader | Class::KillFollower => FaultKind::Kill,
            Class::PauseLeader | Class::PauseFollower => FaultKind::Pause,
            Class::ReplaceFollower => FaultKind::Membership,
            Class::DiskFsync | Class::DiskFull | Class::DiskTorn => FaultKind::Disk,
            _ => FaultKind::Partition,
        }
    }

    fn name(self) -> &'static str {
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
    fn disk_fault(self) -> Option<&'static str> {
        match self {
            Class::DiskFsync => Some("fsync"),
            Class::DiskFull => Some("enospc"),
            Class::DiskTorn => Some("torn"),
            _ => None,
        }
    }

    /// Whether it targets the leader (a bridge keeps the leader and cuts the followers).
    fn hits_leader(self) -> bool {
        matches!(
            self,
            Class::KillLeader | Class::PauseLeader | Class::IsolateLeader | Class::Bridge
        )
    }
}

/// Runs the fault schedule for `duration`, then heals everything. The first faults go
/// through every enabled class once (in a seeded order, past `duration` if need be), so that
/// every class runs in every pass; then classes are drawn at random.
async fn nemesis(
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
async fn replace_follower(
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
async fn disk_fault(
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
async fn wait_voter(addrs: &[String], id: u64) -> anyhow::Result<()> {
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

/// Every node answers GetClusterInfo on a fresh channel and all name the same leader.
async fn liveness(c: &Cluster) -> Result<Duration, String> {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < LIVENESS_WITHIN {
        let mut leaders = Vec::new();
        for n in &c.nodes {
            let answer = match channel(&n.addr).await {
                Some(ch) => tokio::time::timeout(
                    CALL_TIMEOUT,
                    FutureQClusterClient::new(ch).get_cluster_info(ClusterInfoRequest {}),
                )
                .await
                .ok()
                .and_then(Result::ok)
                .map(|r| r.into_inner().leader_node_id),
                None => None,
            };
            leaders.push(answer);
        }
        if leaders.iter().all(|l| l.is_some_and(|l| l != 0))
            && leaders.windows(2).all(|w| w[0] == w[1])
        {
            // And the leader takes a write, on a connection of its own.
            let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
            match write_accepted(&addrs).await {
                Ok(()) => return Ok(t0.elapsed()),
                Err(e) => last = format!("{leaders:?}; a write on the leader: {e}"),
            }
        } else {
            last = format!("{leaders:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "nodes did not all answer and agree on a leader within {LIVENESS_WITHIN:?} of healing (leader per node: {last})"
    ))
}

/// One QUORUM batch on a topic the history does not read, acked by the leader within
/// [`WRITE_WITHIN`].
async fn write_accepted(addrs: &[String]) -> Result<(), String> {
    let (_, ch) = leader_channel(addrs).await.ok_or("no leader reachable")?;
    let batch = PublishBatch {
        messages: vec![PublishMessage {
            topic: LIVENESS_TOPIC.into(),
            payload: b"liveness".to_vec(),
            ..PublishMessage::default()
        }],
        ack_level: 0,
        batch_id: 1,
    };
    let call = async {
        let mut acks = FutureQProducerClient::new(ch)
            .publish_stream(futures::stream::iter([batch]))
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        match acks.message().await {
            Ok(Some(a)) if a.success => Ok(()),
            Ok(Some(a)) => Err(format!("refused: {}", a.error_message)),
            Ok(None) => Err("the stream ended without an ack".to_owned()),
            Err(s) => Err(s.to_string()),
        }
    };
    tokio::time::timeout(WRITE_WITHIN, call)
        .await
        .map_err(|_| format!("no ack within {WRITE_WITHIN:?}"))?
}

/// Every node reports the same applied index and the same store digest (the cluster is idle
/// by then): the replicas hold the same messages, indexes and groups.
async fn convergence(c: &Cluster) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        seen.clear();
        for n in &c.nodes {
            let page = n.metrics().await.unwrap_or_default();
            let applied = page
                .lines()
                .find_map(|l| l.strip_prefix("futureq_raft_applied_index "))
                .and_then(|v| v.parse::<f64>().ok());
            let digest = page
                .lines()
                .find_map(|l| l.strip_prefix("futureq_store_digest "))
                .map(str::to_owned);
            seen.push(applied.zip(digest));
        }
        if seen.iter().all(Option::is_some) && seen.windows(2).all(|w| w[0] == w[1]) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "replicas differ after healing (applied index, store digest per node): {seen:?}"
    ))
}

/// Checks the history (see the module doc).
fn check(h: &History, r: &mut Report) {
    let mut by_payload: HashMap<&str, Vec<&Delivered>> = HashMap::new();
    let mut tags: HashMap<&[u8], &str> = HashMap::new();
    for d in &h.deliveries {
        by_payload.entry(&d.payload).or_default().push(d);
        if !h.attempted.contains_key(&d.payload) {
            r.unexpected.push(d.payload.clone());
        }
        if d.at_ms < d.due_ms {
            r.early
                .push(format!("{} {} ms early", d.payload, d.due_ms - d.at_ms));
        }
        match tags.insert(&d.tag, &d.payload) {
            Some(other) if other != d.payload => {
                r.tag_reuse.push(format!("{} and {}", other, d.payload));
            }
            _ => {}
        }
    }
    for (p, (tag, at)) in &h.acked {
        if !by_payload.contains_key(p.as_str()) {
            let id = tag
                .get(16..24)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_be_bytes);
            r.lost.push(format!("{p} (event id {id}, acked at {at})"));
        }
        if let Some(Some(d)) = by_payload.get(p.as_str()).map(|v| v.first()) {
            if d.tag != *tag {
                r.tag_reuse
                    .push(format!("{p}: acked with one tag, delivered with another"));
            }
        }
    }
    let settle = i64::try_from(ACK_SETTLE.as_millis()).unwrap_or(i64::MAX);
    let fault_free = |from: i64, to: i64| {
        !h.faults
            .iter()
            .any(|f| f.start_ms < to && f.end_ms + 1000 > from)
    };
    for (p, ds) in &by_payload {
        r.redeliveries += ds.len().saturating_sub(1);
        let Some(&acked_at) = h.acks.get(*p) else {
            continue;
        };
        for d in ds.iter().skip(1) {
            if d.at_ms > acked_at + settle && fault_free(acked_at, acked_at + settle) {
                r.resurrected.push(format!(
                    "{p}: acked at {acked_at}, delivered again {} ms later",
                    d.at_ms - acked_at
                ));
            }
        }
    }
    r.deliveries = h.deliveries.len();
    r.acked = h.acked.len();
    r.published_attempted = h.attempted.len();
    for f in &h.faults {
        *r.faults.entry(f.kind).or_default() += 1;
    }
    r.fault_log = h.faults.clone();
    for v in [
        &mut r.lost,
        &mut r.unexpected,
        &mut r.early,
        &mut r.tag_reuse,
        &mut r.resurrected,
    ] {
        v.sort();
    }
}

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
