//! End-to-end API contract: every bad input gets its status and a precise message, the
//! stream stays open, and the broker keeps serving.

mod common;

use std::time::Duration;

use common::*;
use futureq_bench::health::health_client::HealthClient;
use futureq_bench::health::HealthCheckRequest;
use futureq_bench::pb::future_q_cluster_client::FutureQClusterClient;
use futureq_bench::pb::future_q_consumer_client::FutureQConsumerClient;
use futureq_bench::pb::{
    consumer_frame, index, AckRequest, ClusterInfoRequest, ConsumerFrame, Index, JoinRequest,
    SubscribeInit,
};
use tonic::Code;

const QUORUM: i32 = 0;
const LEADER: i32 = 1;
const NO_ACK: i32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_are_rejected_precisely_and_the_stream_stays_open() {
    let b = Broker::start("publish:\n  minAckLevel: leader\n  maxDelay: 1h\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    let no_value = futureq_bench::pb::PublishMessage {
        indexes: vec![Index { value: None }],
        ..msg("t", "x", 0, 0)
    };
    let cases: Vec<(futureq_bench::pb::PublishBatch, &str)> = vec![
        (
            batch(1, QUORUM, vec![]),
            "PublishBatch.messages must not be empty",
        ),
        (
            batch(2, QUORUM, vec![msg("t", "ok", 0, 0), msg("", "x", 0, 0)]),
            "messages[1].topic",
        ),
        (
            batch(3, QUORUM, vec![msg(&"x".repeat(256), "x", 0, 0)]),
            "messages[0].topic",
        ),
        (
            batch(4, QUORUM, vec![msg("t", "x", -1, 0)]),
            "messages[0].delay_ms",
        ),
        (
            batch(5, QUORUM, vec![msg("t", "x", 0, -1)]),
            "messages[0].ttl_ms",
        ),
        (
            batch(6, QUORUM, vec![msg("t", "x", 3_600_001, 0)]),
            "publish.maxDelay",
        ),
        (
            batch(7, NO_ACK, vec![msg("t", "x", 0, 0)]),
            "publish.minAckLevel",
        ),
        (batch(8, QUORUM, vec![no_value]), "messages[0].indexes"),
    ];
    for (bt, want) in cases {
        let id = bt.batch_id;
        let a = p.publish(bt).await;
        assert!(!a.success, "batch {id} must be rejected");
        assert_eq!(a.batch_id, id);
        assert_eq!(
            a.error_code,
            Code::InvalidArgument as u32,
            "batch {id}: {a:?}"
        );
        assert!(
            a.error_message.contains(want),
            "batch {id}: {:?} should mention {want}",
            a.error_message
        );
        assert!(a.delivery_tags.is_empty());
    }
    // The stream is still usable, and nothing of the rejected batches was stored.
    let ok = p
        .publish(batch(
            9,
            LEADER,
            vec![futureq_bench::pb::PublishMessage {
                indexes: vec![Index {
                    value: Some(index::Value::StringValue("order-1".into())),
                }],
                ..msg("t", "good", 0, 0)
            }],
        ))
        .await;
    assert!(ok.success, "{ok:?}");
    // An unknown ack level counts as QUORUM.
    assert!(
        p.publish(batch(10, 42, vec![msg("t", "good2", 0, 0)]))
            .await
            .success
    );
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let got: Vec<_> = sub
        .drain(Duration::from_millis(500))
        .await
        .into_iter()
        .map(|m| m.payload)
        .collect();
    assert_eq!(
        got,
        vec![&b"good"[..], &b"good2"[..]],
        "batch 2's valid first message was not stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_end_the_stream_with_resource_exhausted() {
    let b = Broker::start("api:\n  grpc:\n    maxReceiveMessageSize: 16KiB\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    p.send(batch(1, QUORUM, vec![msg("t", &"x".repeat(20_000), 0, 0)]));
    let s = p.end_status().await;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("maxReceiveMessageSize"), "{s:?}");
    // The broker keeps serving.
    let mut p2 = Publisher::open(b.channel().await).await;
    assert!(
        p2.publish(batch(2, QUORUM, vec![msg("t", "small", 0, 0)]))
            .await
            .success
    );
}

/// Issue 10.11: a message whose delivery could never be sent (over maxSendMessageSize) is
/// refused at publish, naming it; it never reaches the store and never blocks its topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_too_large_to_deliver_is_refused_at_publish() {
    let b = Broker::start("api:\n  grpc:\n    maxSendMessageSize: 1KiB\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    let ack = p
        .publish(batch(
            1,
            QUORUM,
            vec![
                msg("big", "first", 0, 0),
                msg("big", &"x".repeat(1000), 0, 0),
            ],
        ))
        .await;
    assert!(!ack.success, "{ack:?}");
    assert_eq!(ack.error_code, 8, "RESOURCE_EXHAUSTED: {ack:?}");
    assert!(
        ack.error_message.contains("messages[1]")
            && ack.error_message.contains("maxSendMessageSize"),
        "{ack:?}"
    );
    // The batch is atomic: nothing of it stored; the topic keeps delivering.
    let ack = p
        .publish(batch(2, QUORUM, vec![msg("big", "after", 0, 0)]))
        .await;
    assert!(ack.success, "{ack:?}");
    let mut s = Subscriber::open(b.channel().await, "big", "", 10).await;
    let got: Vec<Vec<u8>> = s
        .drain(Duration::from_millis(500))
        .await
        .into_iter()
        .map(|m| m.payload)
        .collect();
    assert_eq!(got, vec![b"after".to_vec()]);
}

/// A batch of many tiny messages fits a gRPC message but its log entry could pass the entry
/// limit (32 MiB; segments are 64 MiB): it is refused at the edge with RESOURCE_EXHAUSTED,
/// nothing stored, the broker serving on (such a batch once reached the log, which refused
/// the append).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_too_large_for_one_log_entry_is_refused() {
    let b = Broker::start("").await;
    let mut p = Publisher::open(b.channel().await).await;
    // ~3.6 MB on the wire (under the default 4 MiB limit), ~100 bytes each as stored.
    let many: Vec<_> = (0..400_000).map(|_| msg("t", "", 60_000, 0)).collect();
    let ack = p.publish(batch(1, QUORUM, many)).await;
    assert!(!ack.success, "{:?}", ack.error_message);
    assert_eq!(
        ack.error_code, 8,
        "RESOURCE_EXHAUSTED: {}",
        ack.error_message
    );
    assert!(
        ack.error_message.contains("log entry") && ack.error_message.contains("split"),
        "{}",
        ack.error_message
    );
    let ack = p
        .publish(batch(2, QUORUM, vec![msg("t", "after", 0, 0)]))
        .await;
    assert!(ack.success, "{ack:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_rejects_bad_first_frames() {
    let b = Broker::start("").await;
    let frames = [
        (
            ConsumerFrame {
                frame: Some(consumer_frame::Frame::Ack(AckRequest {
                    success: true,
                    delivery_tag: vec![0; 24],
                })),
            },
            "first ConsumerFrame must be init",
        ),
        (
            ConsumerFrame { frame: None },
            "first ConsumerFrame must be init",
        ),
        (
            ConsumerFrame {
                frame: Some(consumer_frame::Frame::Init(SubscribeInit {
                    topic: String::new(),
                    group_id: String::new(),
                    read_from_replica: false,
                    max_in_flight: 0,
                })),
            },
            "SubscribeInit.topic must not be empty",
        ),
    ];
    for (f, want) in frames {
        let req = futures::stream::iter(vec![f]).chain(futures::stream::pending());
        let s = match FutureQConsumerClient::new(b.channel().await)
            .subscribe(req)
            .await
        {
            Err(s) => s,
            Ok(r) => {
                let mut st = r.into_inner();
                tokio::time::timeout(Duration::from_secs(5), st.message())
                    .await
                    .unwrap()
                    .unwrap_err()
            }
        };
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains(want), "{s:?} should mention {want}");
    }
}

use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rpcs_health_and_unknown_methods() {
    let b = Broker::start("").await;
    let mut c = FutureQClusterClient::new(b.channel().await);
    let info = c
        .get_cluster_info(ClusterInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.leader_node_id, 1);
    assert_eq!(info.leader_address, format!("127.0.0.1:{}", b.grpc_port));
    assert_eq!(info.nodes.len(), 1);
    assert!(info.nodes[0].is_leader && info.nodes[0].is_alive && info.nodes[0].is_voter);
    let join = c
        .join_cluster(JoinRequest {
            node_id: 2,
            raft_address: "127.0.0.1:1".into(),
            grpc_address: "127.0.0.1:2".into(),
        })
        .await;
    let s = join.unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert!(s.message().contains("cluster"), "{s:?}");

    let mut h = HealthClient::new(b.channel().await);
    for svc in ["", "futureq.FutureQProducer"] {
        assert_eq!(
            h.check(HealthCheckRequest {
                service: svc.into()
            })
            .await
            .unwrap()
            .into_inner()
            .status,
            1
        );
    }
    let s = h
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
    // Watch: the status at once on the stream; an unknown service is SERVICE_UNKNOWN there.
    for (svc, want) in [("", 1), ("nope", 3)] {
        let mut w = h
            .watch(HealthCheckRequest {
                service: svc.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(5), w.message())
            .await
            .expect("a status in time")
            .unwrap()
            .expect("a status");
        assert_eq!(first.status, want, "{svc:?}");
    }
    // A method the server does not know: UNIMPLEMENTED, naming it.
    let mut g = tonic::client::Grpc::new(b.channel().await);
    g.ready().await.unwrap();
    let s =
        g
            .unary(
                tonic::Request::new(HealthCheckRequest::default()),
                http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Nope"),
                tonic_prost::ProstCodec::<
                    HealthCheckRequest,
                    futureq_bench::health::HealthCheckResponse,
                >::default(),
            )
            .await
            .unwrap_err();
    assert_eq!(s.code(), Code::Unimplemented, "{s:?}");
    assert!(s.message().contains("/grpc.health.v1.Health/Nope"));

    // Metrics and health probes on the metrics listener.
    let (code, body) = b.http_get("/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, body) = b.http_get("/metrics").await;
    assert_eq!(code, 200);
    // Unlabelled metrics are there from the start; a labelled family appears with its first
    // series (as in every Prometheus client).
    assert!(body.contains("\nfutureq_active_consumers 0\n"), "{body}");
    assert!(
        body.contains(&format!(
            "futureq_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "{body}"
    );
    assert_eq!(b.http_get("/nope").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_is_enforced() {
    let b = Broker::start("").await;
    let (tx, rx) = futures::channel::mpsc::unbounded::<futureq_bench::pb::PublishBatch>();
    let mut req = tonic::Request::new(rx);
    req.set_timeout(Duration::from_millis(300));
    let mut client =
        futureq_bench::pb::future_q_producer_client::FutureQProducerClient::new(b.channel().await);
    let t = std::time::Instant::now();
    let res = client.publish_stream(req).await;
    let status = match res {
        Err(s) => s,
        Ok(r) => {
            let mut st = r.into_inner();
            loop {
                match tokio::time::timeout(Duration::from_secs(5), st.message())
                    .await
                    .unwrap()
                {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("stream ended OK"),
                    Err(s) => break s,
                }
            }
        }
    };
    drop(tx);
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_ignore_keepalive_pings_are_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = Broker::start("api:\n  grpc:\n    keepaliveTimeout: 1s\n").await;
    // A raw HTTP/2 client that never answers PINGs.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", b.grpc_port))
        .await
        .unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // A well-behaved client (tonic answers pings) on the same broker.
    let mut healthy = Subscriber::open(b.channel().await, "t", "", 0).await;
    let t = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "dead peer still connected after 20 s");
    assert!(
        t.elapsed() >= Duration::from_secs(9),
        "closed after {:?}, before the first ping was due",
        t.elapsed()
    );
    // The healthy subscriber is still served.
    let mut p = Publisher::open(b.channel().await).await;
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("t", "alive", 0, 0)]))
            .await
            .success
    );
    let m = healthy
        .next(Duration::from_secs(5))
        .await
        .expect("healthy stream still open");
    assert_eq!(&m.payload[..], b"alive");
}

/// grpcurl and similar tools list and describe the services through reflection (v1 here; the
/// interop suite checks v1alpha with grpcio-reflection), answered in order on one stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_and_describes_the_services() {
    use futureq_bench::reflection::server_reflection_client::ServerReflectionClient;
    use futureq_bench::reflection::server_reflection_request::MessageRequest;
    use futureq_bench::reflection::server_reflection_response::MessageResponse;
    use futureq_bench::reflection::ServerReflectionRequest;
    use prost::Message;

    let b = Broker::start("").await;
    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "futureq.FutureQProducer.PublishStream".into(),
        )),
        ask(MessageRequest::FileContainingSymbol("futureq.Nope".into())),
    ];
    let mut answers = ServerReflectionClient::new(b.channel().await)
        .server_reflection_info(futures::stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    async fn next(
        answers: &mut tonic::Streaming<futureq_bench::reflection::ServerReflectionResponse>,
    ) -> MessageResponse {
        tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .expect("an answer in time")
            .unwrap()
            .expect("an answer per request")
            .message_response
            .expect("a response")
    }
    let MessageResponse::ListServicesResponse(l) = next(&mut answers).await else {
        panic!("not a service list");
    };
    let names: Vec<String> = l.service.into_iter().map(|s| s.name).collect();
    for want in [
        "futureq.FutureQProducer",
        "futureq.FutureQConsumer",
        "futureq.FutureQCluster",
        "futureq.FutureQAdmin",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    let MessageResponse::FileDescriptorResponse(f) = next(&mut answers).await else {
        panic!("not a file");
    };
    let file =
        prost_types::FileDescriptorProto::decode(f.file_descriptor_proto[0].as_slice()).unwrap();
    assert_eq!(file.package(), "futureq");
    let producer = file
        .service
        .iter()
        .find(|s| s.name() == "FutureQProducer")
        .expect("the service is in its file");
    assert_eq!(producer.method[0].input_type(), ".futureq.PublishBatch");
    // One list of services: every service the file describes is listed, and every method of
    // it is routed (an empty request gets an answer, never UNIMPLEMENTED).
    let mut g = tonic::client::Grpc::new(b.channel().await);
    for svc in &file.service {
        let full = format!("futureq.{}", svc.name());
        assert!(names.contains(&full), "{full} not listed in {names:?}");
        for m in &svc.method {
            g.ready().await.unwrap();
            let path = format!("/{full}/{}", m.name());
            let call = g.unary(
                tonic::Request::new(()),
                http::uri::PathAndQuery::try_from(path.as_str()).unwrap(),
                tonic_prost::ProstCodec::<(), ()>::default(),
            );
            let code = match tokio::time::timeout(Duration::from_secs(10), call)
                .await
                .unwrap_or_else(|_| panic!("{path} answers in time"))
            {
                Ok(_) => Code::Ok,
                Err(s) => s.code(),
            };
            assert_ne!(code, Code::Unimplemented, "{path} is not routed");
        }
    }
    let MessageResponse::ErrorResponse(e) = next(&mut answers).await else {
        panic!("an unknown symbol is an error response");
    };
    assert_eq!(e.error_code, Code::NotFound as i32, "{e:?}");
    assert!(
        answers.message().await.unwrap().is_none(),
        "the stream ends"
    );
}

async fn health(ch: tonic::transport::Channel) -> Result<i32, tonic::Status> {
    let mut h = HealthClient::new(ch);
    let req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    tokio::time::timeout(Duration::from_secs(5), h.check(req))
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no answer within 5 s"))
        .map(|r| r.map(|r| r.into_inner().status))?
}

/// Issue 26: with the defaults, an application with a few dozen consumers on one connection
/// (tonic's channel is one HTTP/2 connection) is served, and so are its other calls. The
/// default limit was 10 streams: the 11th call waited in the client's HTTP/2 queue, silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dozens_of_streams_share_one_connection_with_the_defaults() {
    let b = Broker::start("").await;
    let ch = b.channel().await;
    let mut subs = Vec::new();
    for i in 0..40 {
        subs.push(Subscriber::open(ch.clone(), &format!("t{i}"), "", 0).await);
    }
    let mut p = Publisher::open(ch.clone()).await;
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("t39", "x", 0, 0)]))
            .await
            .success
    );
    let got = subs[39]
        .next(Duration::from_secs(5))
        .await
        .expect("delivered");
    assert_eq!(&got.payload[..], b"x");
    assert_eq!(health(ch).await.expect("health answers"), 1);
}

/// Issue 26: a stream past `api.grpc.maxConcurrentStreams` is refused at once with
/// RESOURCE_EXHAUSTED naming the limit (not queued by the client's HTTP/2 layer until its
/// deadline), the connection's open streams go on, and a slot that frees is used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_limit_are_refused_with_a_reason() {
    let b = Broker::start("api:\n  grpc:\n    maxConcurrentStreams: 8\n").await;
    let ch = b.channel().await;
    let mut subs = Vec::new();
    for i in 0..8 {
        subs.push(Subscriber::open(ch.clone(), &format!("t{i}"), "", 0).await);
    }
    let t = std::time::Instant::now();
    let refused = health(ch.clone())
        .await
        .expect_err("a ninth stream is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("api.grpc.maxConcurrentStreams")
            && refused.message().contains('8'),
        "{refused:?}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "refused after {:?}",
        t.elapsed()
    );
    // More calls at once than the advertised slack (16): each refusal ends its stream at
    // once, so none waits in the client's queue past its deadline.
    let calls: Vec<_> = (0..40).map(|_| health(ch.clone())).collect();
    for r in futures::future::join_all(calls).await {
        let s = r.expect_err("still full");
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    }
    // The open streams are still served (a publish on another connection reaches a
    // subscriber on the full one).
    let mut other = Publisher::open(b.channel().await).await;
    assert!(
        other
            .publish(batch(1, QUORUM, vec![msg("t7", "y", 0, 0)]))
            .await
            .success
    );
    let got = subs[7]
        .next(Duration::from_secs(5))
        .await
        .expect("delivered");
    assert_eq!(&got.payload[..], b"y");
    // One stream ends: its slot serves the next call.
    drop(subs.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match health(ch.clone()).await {
            Ok(status) => {
                assert_eq!(status, 1);
                break;
            }
            Err(s)
                if s.code() == Code::ResourceExhausted && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(s) => panic!("the freed slot was not reused: {s:?}"),
        }
    }
    assert!(
        b.log().contains("refusing the excess"),
        "{}",
        b.log_tail(20)
    );
}

/// Issue 26: a connection that never sends its HTTP/2 preface is closed after
/// `api.grpc.handshakeTimeout`, not held for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_handshake_is_closed() {
    use tokio::io::AsyncReadExt;
    let b = Broker::start("api:\n  grpc:\n    handshakeTimeout: 500ms\n").await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", b.grpc_port))
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a silent connection still open after 10 s");
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "closed after {:?}",
        t.elapsed()
    );
    assert_eq!(health(b.channel().await).await.expect("serving"), 1);
}

/// Issue 26: a PublishStream with nothing outstanding ends after `publish.streamIdleTimeout`
/// (UNAVAILABLE, saying why), so an abandoned stream frees its slot; a busy one does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_publish_stream_ends() {
    let b = Broker::start("publish:\n  streamIdleTimeout: 1s\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    for i in 0..6 {
        // Busy for longer than the timeout in all.
        assert!(
            p.publish(batch(i, QUORUM, vec![msg("t", "x", 0, 0)]))
                .await
                .success
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let t = std::time::Instant::now();
    let end = p.end_status().await;
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert!(
        end.message().contains("publish.streamIdleTimeout"),
        "{end:?}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "ended after {:?}",
        t.elapsed()
    );
}

/// Issue 29 (overload without resets): when the write path falls behind, batches past what it
/// finishes within `publish.maxQueueDelay` are refused at once, RESOURCE_EXHAUSTED / OVERLOADED
/// with nothing stored and a retry hint, on streams that stay open; sent again after the hint
/// they are stored, each exactly once. The write path is held up by a journal write that takes
/// 2 s (the `slow` disk fault, injected), while two streams pipeline 800 batches each: more
/// than the 1,024 in service an idle node always takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_path_behind_refuses_the_excess_with_a_retry_hint() {
    const BATCHES: u64 = 800;
    let b = Broker::start("publish:\n  maxQueueDelay: 50ms\n").await;
    let mut streams = [
        Publisher::open(b.channel().await).await,
        Publisher::open(b.channel().await).await,
    ];
    assert!(
        streams[0]
            .publish(batch(u64::MAX, QUORUM, vec![msg("od", "warm", 0, 0)]))
            .await
            .success
    );
    let trigger = b.dir.path().join("data").join("inject-disk-fault");
    std::fs::write(&trigger, "slow 2000").unwrap();
    let one = |id: u64| batch(id, QUORUM, vec![msg("od", &id.to_string(), 3_600_000, 0)]);
    let mut waiting: Vec<Vec<u64>> = vec![(0..BATCHES).collect(), (BATCHES..2 * BATCHES).collect()];
    let (mut stored, mut refusals, mut rounds) = (0u64, 0u64, 0);
    while waiting.iter().any(|w| !w.is_empty()) {
        rounds += 1;
        assert!(rounds <= 100, "batches never stored: {waiting:?}");
        for (p, ids) in streams.iter().zip(&waiting) {
            for &id in ids {
                p.send(one(id));
            }
        }
        let mut hint = Duration::ZERO;
        for (p, ids) in streams.iter_mut().zip(&mut waiting) {
            let mut again = Vec::new();
            for &id in ids.iter() {
                let ack = p.ack().await;
                assert_eq!(ack.batch_id, id, "acks in order");
                if ack.success {
                    stored += 1;
                    continue;
                }
                assert_eq!(ack.error_code, Code::ResourceExhausted as u32, "{ack:?}");
                assert_eq!(ack.error_reason, 8, "OVERLOADED: {ack:?}");
                assert_eq!(ack.write_outcome, 1, "NOT_STORED: {ack:?}");
                assert!(
                    ack.retry_after_ms >= 50,
                    "a hint of at least the bound: {ack:?}"
                );
                assert!(ack.retry_after_ms <= 500, "at most 10 × the bound: {ack:?}");
                assert!(
                    ack.error_message.contains("publish.maxQueueDelay"),
                    "{ack:?}"
                );
                hint = hint.max(Duration::from_millis(u64::from(ack.retry_after_ms)));
                again.push(id);
            }
            refusals += again.len() as u64;
            *ids = again;
        }
        tokio::time::sleep(hint).await;
    }
    assert!(!trigger.exists(), "the slow write happened");
    assert_eq!(stored, 2 * BATCHES);
    assert!(
        refusals > 0,
        "1,600 batches behind a 2 s write: some must be refused"
    );
    // Each stored once (the store applies a moment after the journal's ack).
    eventually("1,601 stored", || async {
        topic_stats(&b, "od").await[0].stored == 2 * BATCHES + 1
    })
    .await;
    let counted = b
        .metric(
            "futureq_publish_requests_total{topic=\"\",ack_level=\"quorum\",result=\"overloaded\"}",
        )
        .await;
    assert_eq!(counted as u64, refusals, "counted as overloaded");
}

/// Issue 29.2: the broker counts the messages its threads put in queues another executor
/// serves, and each executor's sleeps. One core: a publish's write request stays on it. Two
/// cores (the write core is the last, the dispatcher on the first): of 16 connections (spread
/// by the kernel over both listeners) some reach the write core from the other executor, and
/// what the write path stored is told to the dispatcher across.
#[tokio::test]
async fn cross_core_messages_and_executor_sleeps_are_exported() {
    let writes = r#"futureq_cross_core_messages_total{queue="writes"}"#;
    let hub = r#"futureq_cross_core_messages_total{queue="hub"}"#;
    let one = Broker::start("runtime:\n  cores: 1\n").await;
    let mut p = Publisher::open(one.channel().await).await;
    for id in 0..20 {
        assert!(
            p.publish(batch(id, QUORUM, vec![msg("xc", "m", 3_600_000, 0)]))
                .await
                .success
        );
    }
    let (_, page) = one.http_get("/metrics").await;
    assert!(
        page.contains(&format!("{writes} 0\n")),
        "one core: nothing crossed:\n{page}"
    );
    assert!(
        one.metric(r#"futureq_executor_sleeps_total{core="0"}"#)
            .await
            > 0.0
    );

    let two = Broker::start("runtime:\n  cores: 2\n").await;
    for id in 0..16 {
        let mut p = Publisher::open(two.channel().await).await;
        assert!(
            p.publish(batch(id, QUORUM, vec![msg("xc", "m", 3_600_000, 0)]))
                .await
                .success
        );
    }
    assert!(
        two.metric(writes).await >= 1.0,
        "16 connections over 2 cores: some write requests crossed"
    );
    eventually(
        "the stored messages told to the dispatcher across",
        || async { two.metric(hub).await >= 1.0 },
    )
    .await;
    for core in ["0", "1"] {
        let series = format!("futureq_executor_sleeps_total{{core=\"{core}\"}}");
        assert!(two.metric(&series).await > 0.0, "{series}");
    }
}
