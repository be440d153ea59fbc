//! Managing scheduled messages through the real binary: Cancel.

mod common;

use std::time::Duration;

use common::*;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::CancelRequest;
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
