//! The checks after the faults heal: liveness (every node answers, all agree on the leader,
//! it acks a write) and convergence (same applied index and store digest everywhere).

use std::time::{Duration, Instant};

use futureq_bench::pb::future_q_cluster_client::FutureQClusterClient;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{ClusterInfoRequest, PublishBatch, PublishMessage};

use super::workload::{channel, leader_channel, CALL_TIMEOUT};
use crate::procs::Cluster;

/// How long after the faults heal every node must answer and agree on the leader.
pub(super) const LIVENESS_WITHIN: Duration = Duration::from_secs(20);
/// How long the liveness check's write may take to be acked.
pub(super) const WRITE_WITHIN: Duration = Duration::from_secs(5);
/// The topic of the liveness check's write (nothing consumes it).
pub(super) const LIVENESS_TOPIC: &str = "nemesis-liveness";

/// Every node answers GetClusterInfo on a fresh channel and all name the same leader.
pub(super) async fn liveness(c: &Cluster) -> Result<Duration, String> {
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
pub(super) async fn write_accepted(addrs: &[String]) -> Result<(), String> {
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
pub(super) async fn convergence(c: &Cluster) -> Result<(), String> {
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
