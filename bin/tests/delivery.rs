//! End-to-end delivery through the real binary: timing, groups, acks, redelivery, TTL.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::*;
use futureq_bench::pb::{consumer_frame, AckRequest, ConsumerFrame, QueueMessage, SubscribeInit};

const QUORUM: i32 = 0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_then_deliver_on_time_with_matching_tags() {
    let b = Broker::start("").await;
    let mut sub = Subscriber::open(b.channel().await, "orders", "", 0).await;
    let mut p = Publisher::open(b.channel().await).await;
    let before = now_ms();
    let ack = p
        .publish(batch(
            7,
            QUORUM,
            vec![msg("orders", "a", 0, 0), msg("orders", "b", 400, 0)],
        ))
        .await;
    assert!(ack.success, "{ack:?}");
    assert_eq!(ack.batch_id, 7);
    assert_eq!(ack.error_code, 0);
    assert_eq!(ack.delivery_tags.len(), 2);
    assert!(ack.delivery_tags.iter().all(|t| t.len() == 24));

    let first = sub
        .next(Duration::from_secs(5))
        .await
        .expect("immediate message");
    assert_eq!(&first.payload[..], b"a");
    assert_eq!(first.delivery_tag, ack.delivery_tags[0]);
    assert_eq!(first.attempt, 1);
    assert_eq!(first.topic, "orders");
    assert!(first.enqueued_at_unix_ms >= before - 5);
    sub.ack(&first.delivery_tag, true);

    let second = sub
        .next(Duration::from_secs(5))
        .await
        .expect("delayed message");
    let now = now_ms();
    let due = second.enqueued_at_unix_ms + second.delay_ms;
    assert_eq!(&second.payload[..], b"b");
    assert_eq!(second.delay_ms, 400);
    assert!(now >= due, "delivered {}ms early", due - now);
    assert!(now - due < 1000, "delivered {}ms late", now - due);
    assert_eq!(second.delivery_tag, ack.delivery_tags[1]);
    sub.ack(&second.delivery_tag, true);
    assert!(sub.next(Duration::from_millis(300)).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_timeout_and_ack_drive_redelivery() {
    let b =
        Broker::start("delivery:\n  inFlightTimeout: 600ms\n  deleteBatchInterval: 50ms\n").await;
    let mut sub = Subscriber::open(b.channel().await, "t", "workers", 0).await;
    let mut p = Publisher::open(b.channel().await).await;
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)]))
            .await
            .success
    );
    let m1 = sub.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(m1.attempt, 1);
    let t = Instant::now();
    sub.ack(&m1.delivery_tag, false);
    let m2 = sub.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!((m2.attempt, &m2.delivery_tag), (2, &m1.delivery_tag));
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "NACK makes it due at once"
    );
    // No ack: redelivered after inFlightTimeout.
    let t = Instant::now();
    let m3 = sub.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(m3.attempt, 3);
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "redelivered after {:?}",
        t.elapsed()
    );
    sub.ack(&m3.delivery_tag, true);
    assert!(
        sub.next(Duration::from_millis(1200)).await.is_none(),
        "acked message is gone"
    );
    // And it stays gone for a new subscriber.
    drop(sub);
    let mut again = Subscriber::open(b.channel().await, "t", "workers", 0).await;
    assert!(again.next(Duration::from_millis(800)).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_compete_universals_get_everything() {
    let b = Broker::start("").await;
    let mut g1 = Subscriber::open(b.channel().await, "t", "g", 0).await;
    let mut g2 = Subscriber::open(b.channel().await, "t", "g", 0).await;
    let mut h = Subscriber::open(b.channel().await, "t", "h", 0).await;
    let mut u = Subscriber::open(b.channel().await, "t", "", 0).await;
    // Subscriptions register asynchronously; give them a moment before the messages fall due.
    let mut p = Publisher::open(b.channel().await).await;
    let msgs = (0..20).map(|i| msg("t", &i.to_string(), 300, 0)).collect();
    assert!(p.publish(batch(1, QUORUM, msgs)).await.success);
    let quiet = Duration::from_millis(700);
    let (a, bb, hh, uu) = tokio::join!(
        g1.drain(quiet),
        g2.drain(quiet),
        h.drain(quiet),
        u.drain(quiet)
    );
    let group: Vec<_> = a
        .iter()
        .chain(bb.iter())
        .map(|m| m.payload.clone())
        .collect();
    let distinct: HashSet<_> = group.iter().collect();
    assert_eq!(group.len(), 20, "group g gets each message once");
    assert_eq!(distinct.len(), 20);
    assert!(
        !a.is_empty() && !bb.is_empty(),
        "both members share the work ({} / {})",
        a.len(),
        bb.len()
    );
    assert_eq!(hh.len(), 20, "group h gets every message");
    assert_eq!(uu.len(), 20, "the universal consumer gets every message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_bounds_each_consumer() {
    let b = Broker::start("").await;
    let mut slow = Subscriber::open(b.channel().await, "t", "", 3).await;
    let mut p = Publisher::open(b.channel().await).await;
    let msgs = (0..10).map(|i| msg("t", &i.to_string(), 0, 0)).collect();
    assert!(p.publish(batch(1, QUORUM, msgs)).await.success);
    let got = slow.drain(Duration::from_millis(500)).await;
    assert_eq!(got.len(), 3, "only max_in_flight unacked deliveries");
    for m in &got {
        slow.ack(&m.delivery_tag, true);
    }
    let more = slow.drain(Duration::from_millis(500)).await;
    assert_eq!(more.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_are_never_delivered_and_get_swept() {
    let b = Broker::start("delivery:\n  ttlSweepInterval: 200ms\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    // Nobody subscribes to "lonely": the sweeper must delete it anyway.
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("lonely", "x", 0, 100)]))
            .await
            .success
    );
    // "t" has a consumer, but the message expires before it falls due.
    assert!(
        p.publish(batch(
            2,
            QUORUM,
            vec![msg("t", "late", 300, 150), msg("t", "ok", 300, 5000)]
        ))
        .await
        .success
    );
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let got = sub.drain(Duration::from_millis(900)).await;
    let payloads: Vec<_> = got
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(payloads, vec!["ok"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let swept = b
            .metric("futureq_messages_expired_total{source=\"sweeper\"}")
            .await;
        let inline = b
            .metric("futureq_messages_expired_total{source=\"dispatcher\"}")
            .await;
        if swept + inline >= 2.0 && swept >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expired: sweeper {swept}, dispatcher {inline}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_for_tags_not_delivered_on_the_stream_are_ignored() {
    let b = Broker::start("delivery:\n  deleteBatchInterval: 50ms\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    let ack = p
        .publish(batch(1, QUORUM, vec![msg("t", "keep", 400, 0)]))
        .await;
    // A stranger acks the tag before it was delivered to anyone: ignored.
    let stranger = Subscriber::open(b.channel().await, "other", "", 0).await;
    stranger.ack(&ack.delivery_tags[0], true);
    stranger.ack(b"not-a-24-byte-tag", true);
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let m = sub
        .next(Duration::from_secs(5))
        .await
        .expect("still delivered");
    assert_eq!(m.delivery_tag, ack.delivery_tags[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_releases_in_flight_at_once() {
    let b = Broker::start("delivery:\n  inFlightTimeout: 30s\n").await;
    let mut a = Subscriber::open(b.channel().await, "t", "g", 0).await;
    let mut p = Publisher::open(b.channel().await).await;
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)]))
            .await
            .success
    );
    let m = a.next(Duration::from_secs(5)).await.unwrap();
    drop(a);
    let mut bsub = Subscriber::open(b.channel().await, "t", "g", 0).await;
    let t = Instant::now();
    let again = bsub
        .next(Duration::from_secs(5))
        .await
        .expect("redelivered after disconnect");
    assert_eq!(again.delivery_tag, m.delivery_tag);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "not after the 30 s timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_pipelined_batches_all_acked_in_order() {
    let b = Broker::start("publish:\n  minAckLevel: noAck\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    for i in 0..300u64 {
        let level = (i % 3) as i32;
        p.send(batch(
            i,
            level,
            (0..20)
                .map(|j| msg(&format!("t{}", j % 4), "payload", 60_000, 0))
                .collect(),
        ));
    }
    let mut last: HashMap<bool, u64> = HashMap::new();
    let mut ids = HashSet::new();
    for _ in 0..300 {
        let a = p.ack().await;
        assert!(a.success, "{a:?}");
        let durable = a.batch_id % 3 != 2;
        if let Some(prev) = last.insert(durable, a.batch_id) {
            assert!(
                a.batch_id > prev,
                "acks of one ack level come back in order"
            );
        }
        for t in &a.delivery_tags {
            assert!(ids.insert(t.clone()), "tags are unique");
        }
    }
    assert_eq!(ids.len(), 6000);
    let status = p.close().await;
    assert!(
        matches!(status, Ok(None)),
        "half-close ends with OK: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_subscriptions_keep_receiving_and_redeliver_unacked() {
    let b = Broker::start("delivery:\n  inFlightTimeout: 500ms\n").await;
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    sub.half_close();
    let mut p = Publisher::open(b.channel().await).await;
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)]))
            .await
            .success
    );
    let m = sub
        .next(Duration::from_secs(5))
        .await
        .expect("delivered after half-close");
    assert_eq!(m.attempt, 1);
    // It cannot be acknowledged any more, so it comes back after the in-flight timeout.
    let again = sub.next(Duration::from_secs(5)).await.expect("redelivered");
    assert_eq!((again.delivery_tag, again.attempt), (m.delivery_tag, 2));
}

/// Issue 10.5: a group whose members all left still gets every message stored meanwhile,
/// however fast another group acks — also across a kill -9, with the other group back first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_away_gets_every_message_stored_meanwhile() {
    let mut b = Broker::start("delivery:\n  deleteBatchInterval: 10ms\n").await;
    // Both groups subscribe once; then "late" leaves.
    let late = Subscriber::open(b.channel().await, "owed", "late", 10).await;
    let mut early = Subscriber::open(b.channel().await, "owed", "early", 100).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(late);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut p = Publisher::open(b.channel().await).await;
    let payloads: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let ack = p
        .publish(batch(
            1,
            QUORUM,
            payloads.iter().map(|s| msg("owed", s, 0, 0)).collect(),
        ))
        .await;
    assert!(ack.success, "{ack:?}");
    let mut got = 0;
    while got < 10 {
        let m = early
            .next(Duration::from_secs(5))
            .await
            .expect("early gets all");
        early.ack(&m.delivery_tag, true);
        got += 1;
    }
    // Let the acks' deletes (if any) commit, then crash.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(early);
    b.kill9();
    b.spawn().await;
    // The other group is back first and acks whatever it gets (nothing: it acked them all).
    let mut early = Subscriber::open(b.channel().await, "owed", "early", 100).await;
    for m in early.drain(Duration::from_millis(300)).await {
        early.ack(&m.delivery_tag, true);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut late = Subscriber::open(b.channel().await, "owed", "late", 100).await;
    let mut owed: Vec<String> = late
        .drain(Duration::from_millis(800))
        .await
        .into_iter()
        .map(|m| String::from_utf8(m.payload).unwrap())
        .collect();
    owed.sort();
    assert_eq!(
        owed, payloads,
        "group late got what was stored while it was away"
    );
}

/// Issue 10.5: a connected group that takes its messages slowly (one in flight, never acked
/// here) does not hold the topic back for a group that keeps up; it still gets each of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_group_does_not_hold_the_topic_for_a_fast_one() {
    let b = Broker::start("delivery:\n  deleteBatchInterval: 10ms\n").await;
    let mut slow = Subscriber::open(b.channel().await, "shared", "slow", 1).await;
    let mut fast = Subscriber::open(b.channel().await, "shared", "fast", 50).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut p = Publisher::open(b.channel().await).await;
    // Several times the topic's entry cap (1024 with these consumers).
    let n = 3000;
    for chunk in 0..(n / 500) {
        let ack = p
            .publish(batch(
                chunk + 1,
                QUORUM,
                (0..500)
                    .map(|i| msg("shared", &format!("m{}", chunk * 500 + i), 0, 0))
                    .collect(),
            ))
            .await;
        assert!(ack.success, "{ack:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut got = std::collections::BTreeSet::new();
    while got.len() < n as usize {
        assert!(
            Instant::now() < deadline,
            "fast: {} of {n} in 120 s",
            got.len()
        );
        let Some(m) = fast.next(Duration::from_secs(5)).await else {
            panic!("the fast group stalled after {} of {n}", got.len());
        };
        fast.ack(&m.delivery_tag, true);
        got.insert(m.delivery_tag);
    }
    // The slow group had one; acked one at a time, it gets every other as well.
    let mut slow_got = std::collections::BTreeSet::new();
    while slow_got.len() < n as usize {
        assert!(
            Instant::now() < deadline,
            "slow: {} of {n} in 120 s",
            slow_got.len()
        );
        let Some(m) = slow.next(Duration::from_secs(5)).await else {
            panic!("the slow group stalled after {} of {n}", slow_got.len());
        };
        slow.ack(&m.delivery_tag, true);
        slow_got.insert(m.delivery_tag);
    }
    assert_eq!(slow_got, got);
}

/// ACKs written together reach the broker in one read and are taken as one batch (issue
/// 29.3): every one of them counts, a malformed tag among them is skipped, a NACK among them
/// redelivers, and a second SubscribeInit after them still ends the stream (after the ACKs
/// before it were taken: on that end, only the NACKed message comes again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_sent_together_are_all_taken() {
    let b = Broker::start("delivery:\n  inFlightTimeout: 30s\n  deleteBatchInterval: 50ms\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    for i in 0..5 {
        let msgs = (0..100)
            .map(|j| msg("burst", &format!("{i}-{j}"), 0, 0))
            .collect();
        assert!(p.publish(batch(i, QUORUM, msgs)).await.success);
    }
    let mut sub = Subscriber::open(b.channel().await, "burst", "", 500).await;
    let mut got = Vec::new();
    while got.len() < 500 {
        let m = sub
            .next(Duration::from_secs(10))
            .await
            .expect("all 500 delivered");
        got.push(m);
    }
    let nacked = got[250].delivery_tag.clone();
    for (i, m) in got.iter().enumerate() {
        if i == 100 {
            sub.ack(b"not-a-24-byte-tag", true);
        }
        sub.ack(&m.delivery_tag, i != 250);
    }
    sub.tx_init_again();
    ends_invalid_and_only_comes_back(&b, &mut sub.rx, "burst", &nacked).await;
}

/// Waits for `stream` to end with INVALID_ARGUMENT (what it delivers meanwhile may only be
/// `tag` again), then checks that of what it had in flight only `tag` comes back to a new
/// subscriber of `topic`: had an ACK been dropped, its message would come back too.
async fn ends_invalid_and_only_comes_back(
    b: &Broker,
    stream: &mut tonic::Streaming<QueueMessage>,
    topic: &str,
    tag: &[u8],
) {
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(m))) => assert_eq!(m.delivery_tag, tag, "only {tag:?} again"),
            Ok(Ok(None)) => panic!("the stream ended without a status"),
            Ok(Err(s)) => break s,
            Err(_) => panic!("the stream did not end"),
        }
    };
    assert_eq!(end.code(), tonic::Code::InvalidArgument, "{end:?}");
    let mut again = Subscriber::open(b.channel().await, topic, "", 1000).await;
    let back = again.drain(Duration::from_secs(2)).await;
    assert_eq!(
        back.iter()
            .map(|m| m.delivery_tag.to_vec())
            .collect::<Vec<_>>(),
        vec![tag.to_vec()]
    );
}

/// Frames sent as they are, to write what a typed client cannot (a frame that does not
/// decode); what comes back decodes as `QueueMessage`.
#[derive(Default)]
struct RawFrames;

impl tonic::codec::Codec for RawFrames {
    type Encode = Vec<u8>;
    type Decode = QueueMessage;
    type Encoder = RawFrames;
    type Decoder = tonic_prost::ProstDecoder<QueueMessage>;

    fn encoder(&mut self) -> Self::Encoder {
        RawFrames
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

impl tonic::codec::Encoder for RawFrames {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

/// Issue 29.3, from review: ACKs that came in the same read as a frame that ends the stream
/// (here one that does not decode) are still taken: only the message left unACKed comes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_before_a_bad_frame_in_the_same_read_still_count() {
    use prost::Message;
    let b = Broker::start("delivery:\n  inFlightTimeout: 30s\n  deleteBatchInterval: 50ms\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    let msgs = (0..100)
        .map(|j| msg("raw", &format!("{j}"), 0, 0))
        .collect();
    assert!(p.publish(batch(1, QUORUM, msgs)).await.success);
    let frame = |f: consumer_frame::Frame| ConsumerFrame { frame: Some(f) }.encode_to_vec();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tx.send(frame(consumer_frame::Frame::Init(SubscribeInit {
        topic: "raw".into(),
        max_in_flight: 100,
        ..SubscribeInit::default()
    })))
    .unwrap();
    let mut grpc = tonic::client::Grpc::new(b.channel().await);
    grpc.ready().await.unwrap();
    let mut rx = rx;
    let frames = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut deliveries = grpc
        .streaming(
            tonic::Request::new(frames),
            http::uri::PathAndQuery::from_static("/futureq.FutureQConsumer/Subscribe"),
            RawFrames,
        )
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while got.len() < 100 {
        let m = tokio::time::timeout(Duration::from_secs(10), deliveries.message())
            .await
            .expect("all 100 delivered")
            .unwrap()
            .unwrap();
        got.push(m);
    }
    let kept = got[42].delivery_tag.clone();
    for m in got.iter().filter(|m| m.delivery_tag != kept) {
        tx.send(frame(consumer_frame::Frame::Ack(AckRequest {
            success: true,
            delivery_tag: m.delivery_tag.to_vec(),
        })))
        .unwrap();
    }
    // Field 1 as a varint of one byte with its continuation bit set, then nothing: does not decode.
    tx.send(vec![0x08, 0x80]).unwrap();
    ends_invalid_and_only_comes_back(&b, &mut deliveries, "raw", &kept).await;
}
