//! Managing scheduled messages through the real binary: Cancel and Reschedule.

mod common;

use std::time::Duration;

use common::*;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{CancelRequest, RescheduleRequest, RescheduleResponse};
use tonic::Code;

const QUORUM: i32 = 0;

async fn cancel(b: &Broker, tags: Vec<Vec<u8>>) -> Result<Vec<bool>, tonic::Status> {
    FutureQProducerClient::new(b.channel().await)
        .cancel(CancelRequest {
            delivery_tags: tags,
        })
        .await
        .map(|r| r.into_inner().cancelled)
}

async fn reschedule(
    b: &Broker,
    tag: &[u8],
    delay_ms: i64,
) -> Result<RescheduleResponse, tonic::Status> {
    FutureQProducerClient::new(b.channel().await)
        .reschedule(RescheduleRequest {
            delivery_tag: tag.to_vec(),
            delay_ms,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// A cancelled message is never delivered; the answer says per tag whether it was stored; a
/// cancel survives a restart (it is durable before the answer); bad tags are refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_messages_are_never_delivered_and_the_cancel_is_durable() {
    let mut b = Broker::start("").await;
    let mut p = Publisher::open(b.channel().await).await;
    let ack = p
        .publish(batch(
            1,
            QUORUM,
            vec![
                msg("t", "keep", 1500, 0),
                msg("t", "drop-1", 1500, 0),
                msg("t", "drop-2", 1500, 0),
                msg("t", "twice", 1500, 0),
            ],
        ))
        .await;
    assert!(ack.success, "{ack:?}");
    let tags = ack.delivery_tags.clone();
    let mut unknown = tags[1].clone();
    unknown[23] ^= 0xff;
    let got = cancel(&b, vec![tags[1].clone(), unknown, tags[2].clone()])
        .await
        .unwrap();
    assert_eq!(got, vec![true, false, true]);
    assert_eq!(
        cancel(&b, vec![tags[1].clone()]).await.unwrap(),
        vec![false],
        "a second cancel finds nothing"
    );
    assert_eq!(
        cancel(&b, vec![tags[3].clone(), tags[1].clone(), tags[3].clone()])
            .await
            .unwrap(),
        vec![true, false, true],
        "a tag given twice is answered alike"
    );
    assert_eq!(b.metric("futureq_messages_cancelled_total").await, 3.0);

    for (tags, what) in [
        (vec![], "delivery_tags: 0 tags"),
        (vec![vec![1; 23]], "delivery_tags[0]: 23 bytes"),
        (vec![vec![1; 24]; 1001], "delivery_tags: 1001 tags"),
    ] {
        let s = cancel(&b, tags).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains(what), "{s:?}");
    }

    // Durable before the answer: a kill -9 right after it loses nothing of it.
    b.kill9();
    b.spawn().await;
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let m = sub
        .next(Duration::from_secs(5))
        .await
        .expect("the message not cancelled");
    assert_eq!(&m.payload[..], b"keep");
    sub.ack(&m.delivery_tag, true);
    assert!(
        sub.next(Duration::from_millis(1500)).await.is_none(),
        "a cancelled message was delivered"
    );
}

/// A message in flight is revoked by a cancel: its NACK is ignored and it never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_revokes_a_delivery_in_flight() {
    // A long in-flight timeout: only the NACK could bring it back.
    let b = Broker::start("delivery:\n  inFlightTimeout: 30s\n").await;
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let mut p = Publisher::open(b.channel().await).await;
    let ack = p.publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)])).await;
    assert!(ack.success, "{ack:?}");
    let m = sub
        .next(Duration::from_secs(5))
        .await
        .expect("delivered at once");
    assert_eq!(
        cancel(&b, vec![m.delivery_tag.clone()]).await.unwrap(),
        vec![true]
    );
    sub.ack(&m.delivery_tag, false);
    assert!(
        sub.next(Duration::from_millis(2500)).await.is_none(),
        "the NACK brought it back"
    );
}

/// A rescheduled message comes at its new time under the new tag (same payload and enqueue
/// time, attempt 1), never under the old one; the move is durable before the answer; an old
/// or unknown tag is not found; bad input is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescheduled_message_comes_at_its_new_time_under_its_new_tag() {
    let mut b = Broker::start("publish:\n  maxDelay: 1h\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    let ack = p
        .publish(batch(
            1,
            QUORUM,
            vec![
                msg("t", "sooner", 600_000, 3_000_000),
                msg("t", "later", 1000, 0),
            ],
        ))
        .await;
    assert!(ack.success, "{ack:?}");
    let tags = ack.delivery_tags.clone();
    let asked_at = now_ms();
    let sooner = reschedule(&b, &tags[0], 300).await.unwrap();
    assert!(sooner.found && sooner.delivery_tag != tags[0], "{sooner:?}");
    let later = reschedule(&b, &tags[1], 600_000).await.unwrap();
    assert!(later.found, "{later:?}");
    assert!(
        !reschedule(&b, &tags[0], 10).await.unwrap().found,
        "the old tag is gone"
    );
    let mut unknown = tags[1].clone();
    unknown[23] ^= 0xff;
    assert!(!reschedule(&b, &unknown, 10).await.unwrap().found);
    assert_eq!(b.metric("futureq_messages_rescheduled_total").await, 2.0);

    for (tag, delay, what) in [
        (vec![1; 23], 0, "delivery_tag: 23 bytes"),
        (tags[1].clone(), -1, "delay_ms: must be >= 0"),
        (tags[1].clone(), 3_600_001, "exceeds publish.maxDelay"),
    ] {
        let s = reschedule(&b, &tag, delay).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains(what), "{s:?}");
    }

    // Durable before the answer: a kill -9 right after it keeps both moves.
    b.kill9();
    b.spawn().await;
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let m = sub
        .next(Duration::from_secs(10))
        .await
        .expect("the message moved forward");
    assert!(
        now_ms() >= asked_at + 300,
        "delivered before its new due time"
    );
    assert_eq!(&m.payload[..], b"sooner");
    assert_eq!(m.delivery_tag, sooner.delivery_tag);
    assert_eq!(m.attempt, 1);
    assert!(m.delay_ms >= 300, "{m:?}");
    sub.ack(&m.delivery_tag, true);
    assert!(
        sub.next(Duration::from_millis(2500)).await.is_none(),
        "the message moved back (or the old copy) was delivered"
    );
    // Moved back by 10 minutes: still stored, under its new tag.
    assert!(!reschedule(&b, &tags[1], 0).await.unwrap().found);
    let now = reschedule(&b, &later.delivery_tag, 0).await.unwrap();
    assert!(now.found);
    let m = sub
        .next(Duration::from_secs(5))
        .await
        .expect("moved to now");
    assert_eq!(
        (&m.payload[..], m.delivery_tag),
        (&b"later"[..], now.delivery_tag)
    );
}

/// A delivery in flight is revoked by a reschedule: its NACK is ignored (the old tag never
/// comes back), and the message comes again under its new tag, attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reschedule_revokes_a_delivery_in_flight() {
    let b = Broker::start("delivery:\n  inFlightTimeout: 30s\n").await;
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let mut p = Publisher::open(b.channel().await).await;
    let ack = p.publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)])).await;
    assert!(ack.success, "{ack:?}");
    let first = sub
        .next(Duration::from_secs(5))
        .await
        .expect("delivered at once");
    let moved = reschedule(&b, &first.delivery_tag, 200).await.unwrap();
    assert!(moved.found);
    sub.ack(&first.delivery_tag, false);
    let again = sub
        .next(Duration::from_secs(5))
        .await
        .expect("the moved message comes");
    assert_eq!(again.delivery_tag, moved.delivery_tag);
    assert_eq!((&again.payload[..], again.attempt), (&b"x"[..], 1));
    sub.ack(&again.delivery_tag, true);
    assert!(sub.next(Duration::from_millis(1500)).await.is_none());
}
