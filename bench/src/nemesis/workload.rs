//! The workload: two QUORUM publishers and one group consumer, each following the leader
//! through faults and recording what it saw in the history.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futureq_bench::pb::future_q_cluster_client::FutureQClusterClient;
use futureq_bench::pb::future_q_consumer_client::FutureQConsumerClient;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{
    consumer_frame, AckRequest, ClusterInfoRequest, ConsumerFrame, PublishBatch, PublishMessage,
    SubscribeInit,
};
use tonic::transport::Channel;

use super::history::{lock, now_ms, Delivered, Rng, Shared};

/// Longest delay of a published message.
pub(super) const DELAY_MAX_MS: u64 = 3_000;
/// Messages per published batch.
pub(super) const BATCH: usize = 5;
/// Pause between a publisher's batches.
pub(super) const PUBLISH_PACE: Duration = Duration::from_millis(20);
/// Per-call timeout of the clients.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The consumer group.
pub(super) const GROUP: &str = "nemesis";
/// The topic.
pub(super) const TOPIC: &str = "nemesis";

/// A channel to `addr` (over TLS in a `--tls` run), or `None` within [`CALL_TIMEOUT`].
pub(super) async fn channel(addr: &str) -> Option<Channel> {
    tokio::time::timeout(CALL_TIMEOUT, crate::conn::connect(addr))
        .await
        .ok()?
        .ok()
}

/// The leader's gRPC URL as some node reports it (a paused node times out and is skipped).
pub(super) async fn find_leader(addrs: &[String]) -> Option<String> {
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
pub(super) async fn leader_channel(addrs: &[String]) -> Option<(String, Channel)> {
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
pub(super) async fn publisher(
    id: usize,
    addrs: Vec<String>,
    h: Shared,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
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
pub(super) async fn consumer(addrs: Vec<String>, h: Shared, stop: Arc<AtomicBool>) {
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
