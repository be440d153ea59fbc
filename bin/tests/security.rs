//! TLS on the client plane, principals and permissions, and reloads, through the real binary
//! with tonic (and the futureq client and CLI) as clients. Certificates are made here (rcgen).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{batch, msg, Broker, Publisher, Subscriber};
use futureq_bench::health::health_client::HealthClient;
use futureq_bench::health::HealthCheckRequest;
use futureq_bench::pb::future_q_admin_client::FutureQAdminClient;
use futureq_bench::pb::future_q_cluster_client::FutureQClusterClient;
use futureq_bench::pb::future_q_consumer_client::FutureQConsumerClient;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{
    consumer_frame, CancelRequest, ClusterInfoRequest, ConsumerFrame, DeleteGroupRequest,
    PeekRequest, RescheduleRequest, SubscribeInit, TopicStatsRequest,
};
use futureq_broker::auth::token_hash_hex;
use futureq_broker::certs::{write_pair, DevCa, Validity};
use futureq_client::{Outcome, Reason};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const ACK_QUORUM: i32 = 0;
const ACK_LEADER: i32 = 1;

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| (*s).to_owned()).collect()
}

/// Writes `ca`'s certificate and a node certificate for 127.0.0.1 into `dir`.
fn node_files(dir: &Path, ca: &DevCa) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.cert_pem()).unwrap();
    let node = ca
        .issue(&names(&["localhost", "127.0.0.1"]), Validity::Days(30))
        .unwrap();
    write_pair(dir, "node", &node).unwrap();
    dir.to_owned()
}

fn tls_yaml(dir: &Path, client_auth: &str) -> String {
    let d = dir.display();
    format!(
        "api:\n  grpc:\n    tls:\n      certFile: {d}/node.pem\n      keyFile: {d}/node-key.pem\n      caFile: {d}/ca.pem\n      clientAuth: {client_auth}\n"
    )
}

fn trusting(ca: &DevCa) -> ClientTlsConfig {
    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.cert_pem()))
}

fn with_identity(t: ClientTlsConfig, ca: &DevCa, name: &str, v: Validity) -> ClientTlsConfig {
    let pem = ca.issue(&names(&[name]), v).unwrap();
    t.identity(Identity::from_pem(pem.cert, pem.key))
}

/// A health check over `tls`: Ok when the connection is accepted and the call served.
async fn health(b: &Broker, tls: Option<ClientTlsConfig>) -> Result<(), String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut e = Channel::from_shared(format!("{scheme}://127.0.0.1:{}", b.grpc_port))
        .unwrap()
        .timeout(Duration::from_secs(5));
    if let Some(t) = tls {
        e = e.tls_config(t).map_err(|e| e.to_string())?;
    }
    let ch = e.connect().await.map_err(|e| format!("connect: {e:?}"))?;
    HealthClient::new(ch)
        .check(HealthCheckRequest::default())
        .await
        .map(|_| ())
        .map_err(|s| format!("{s:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_verified_clients_and_refuses_the_rest() {
    let ca = DevCa::new("test CA").unwrap();
    let mut b = Broker::prepare("");
    let dir = node_files(&b.dir.path().join("certs"), &ca);
    b.extra = tls_yaml(&dir, "optional");
    b.tls = Some(trusting(&ca));
    b.spawn().await;

    // A standard client that trusts the CA: a message goes through, both ways.
    let ch = b.channel().await;
    let mut p = Publisher::open(ch.clone()).await;
    let ack = p
        .publish(batch(1, ACK_QUORUM, vec![msg("tls", "over TLS", 0, 0)]))
        .await;
    assert_eq!(ack.error_code, 0, "{ack:?}");
    let mut s = Subscriber::open(ch, "tls", "", 10).await;
    let m = s.next(Duration::from_secs(5)).await.expect("delivered");
    assert_eq!(&m.payload[..], b"over TLS");

    // The futureq client over TLS.
    let client = futureq_client::Client::connect_with(
        [format!("127.0.0.1:{}", b.grpc_port)],
        futureq_client::ClientConfig {
            tls: Some(futureq_client::TlsConfig {
                ca_pem: Some(ca.cert_pem().into_bytes()),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .expect("the client connects over TLS");
    let stats = client.topic_stats(Some("tls")).await.unwrap();
    assert_eq!(stats.len(), 1);

    // Refused: plaintext, a foreign CA, an expired client certificate; accepted: a valid one.
    assert!(health(&b, None).await.is_err(), "plaintext on a TLS port");
    let foreign = DevCa::new("foreign CA").unwrap();
    assert!(
        health(&b, Some(trusting(&foreign))).await.is_err(),
        "a server the client's CA did not sign"
    );
    let expired = with_identity(trusting(&ca), &ca, "old", Validity::Expired);
    assert!(
        health(&b, Some(expired)).await.is_err(),
        "an expired client certificate"
    );
    let unknown = with_identity(trusting(&ca), &foreign, "stranger", Validity::Days(1));
    assert!(
        health(&b, Some(unknown)).await.is_err(),
        "a client certificate of a foreign CA"
    );
    let valid = with_identity(trusting(&ca), &ca, "app", Validity::Days(1));
    health(&b, Some(valid))
        .await
        .expect("a valid client certificate");
    health(&b, Some(trusting(&ca)))
        .await
        .expect("optional: no client certificate");
    assert!(
        b.log().contains("TLS handshake failed"),
        "refusals are logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_auth_require_refuses_a_client_without_a_certificate() {
    let ca = DevCa::new("test CA").unwrap();
    let mut b = Broker::prepare("");
    let dir = node_files(&b.dir.path().join("certs"), &ca);
    b.extra = tls_yaml(&dir, "require");
    b.tls = Some(with_identity(
        trusting(&ca),
        &ca,
        "harness",
        Validity::Days(1),
    ));
    b.spawn().await;
    assert!(
        health(&b, Some(trusting(&ca))).await.is_err(),
        "no client certificate"
    );
    let valid = with_identity(trusting(&ca), &ca, "app", Validity::Days(1));
    health(&b, Some(valid))
        .await
        .expect("a valid client certificate");
}

/// `authorization: Bearer <token>` on every call of a client.
#[derive(Clone)]
struct Bearer(Option<String>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Ok(r)
    }
}

type Authed = InterceptedService<Channel, Bearer>;

fn producer(ch: &Channel, t: Option<&str>) -> FutureQProducerClient<Authed> {
    FutureQProducerClient::with_interceptor(ch.clone(), Bearer(t.map(str::to_owned)))
}

fn admin(ch: &Channel, t: Option<&str>) -> FutureQAdminClient<Authed> {
    FutureQAdminClient::with_interceptor(ch.clone(), Bearer(t.map(str::to_owned)))
}

fn reason(s: &tonic::Status) -> Option<Reason> {
    futureq_client::refusal::of_status(s).map(|r| r.0)
}

fn principals_yaml(cert_name: &str) -> String {
    format!(
        "principals:\n\
         - name: producer\n  tokens: [{p}]\n  publish: [\"orders*\"]\n\
         - name: consumer\n  tokens: [{c}]\n  consume: [\"orders*\"]\n\
         - name: ops\n  tokens: [{o}]\n  admin: true\n  publish: [\"*\"]\n  consume: [\"*\"]\n\
         - name: service\n  certificateNames: [{cert_name}]\n  publish: [\"svc\", \"svc.dlq\"]\n  consume: [svc]\n",
        p = token_hash_hex("tok-producer"),
        c = token_hash_hex("tok-consumer"),
        o = token_hash_hex("tok-ops"),
    )
}

async fn subscribe_status(
    ch: &Channel,
    token: Option<&str>,
    topic: &str,
) -> Result<(), tonic::Status> {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(ConsumerFrame {
        frame: Some(consumer_frame::Frame::Init(SubscribeInit {
            topic: topic.into(),
            ..Default::default()
        })),
    })
    .unwrap();
    let mut c =
        FutureQConsumerClient::with_interceptor(ch.clone(), Bearer(token.map(str::to_owned)));
    let mut stream = c.subscribe(rx).await?.into_inner();
    // A refusal comes as the stream's first status, at once (nothing is published to these
    // topics meanwhile, so a served stream stays silent).
    match tokio::time::timeout(Duration::from_secs(1), stream.message()).await {
        Ok(Err(s)) => Err(s),
        Ok(Ok(m)) => panic!("a subscription to an empty topic delivered {m:?}"),
        Err(_) => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principals_need_credentials_and_get_only_their_permissions() {
    let ca = DevCa::new("test CA").unwrap();
    let mut b = Broker::prepare("");
    let dir = node_files(&b.dir.path().join("certs"), &ca);
    let principals = dir.join("principals.yaml");
    std::fs::write(&principals, principals_yaml("svc.example")).unwrap();
    b.extra = format!(
        "{}  auth:\n    principalsFile: {}\npublish:\n  minAckLevel: leader\n",
        tls_yaml(&dir, "optional"),
        principals.display()
    );
    b.tls = Some(trusting(&ca));
    b.spawn().await;
    let ch = b.channel().await;

    // No credential, a wrong token, a malformed header: UNAUTHENTICATED; health stays open.
    for t in [None, Some("wrong")] {
        let e = FutureQClusterClient::with_interceptor(ch.clone(), Bearer(t.map(str::to_owned)))
            .get_cluster_info(ClusterInfoRequest {})
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        assert_eq!(reason(&e), Some(Reason::Unauthenticated));
        assert_eq!(
            futureq_client::refusal::of_status(&e).map(|r| r.1),
            Some(Outcome::NotStored)
        );
    }
    HealthClient::new(ch.clone())
        .check(HealthCheckRequest::default())
        .await
        .expect("health needs no credential");
    FutureQClusterClient::with_interceptor(ch.clone(), Bearer(Some("tok-consumer".into())))
        .get_cluster_info(ClusterInfoRequest {})
        .await
        .expect("any principal reads the cluster info");
    assert!(
        b.metric("futureq_auth_refusals_total{reason=\"UNAUTHENTICATED\"}")
            .await
            >= 2.0
    );

    // PublishStream: a denied batch gets its ack (code 7) and the stream goes on.
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut acks = producer(&ch, Some("tok-producer"))
        .publish_stream(rx)
        .await
        .unwrap()
        .into_inner();
    tx.unbounded_send(batch(1, ACK_QUORUM, vec![msg("billing", "x", 0, 0)]))
        .unwrap();
    let denied = acks.message().await.unwrap().unwrap();
    assert_eq!(denied.error_code, 7, "{denied:?}");
    assert_eq!(
        denied.error_reason(),
        futureq_bench::pb::ErrorReason::PermissionDenied
    );
    assert_eq!(
        denied.write_outcome(),
        futureq_bench::pb::WriteOutcome::NotStored
    );
    assert!(
        denied.error_message.contains("\"billing\""),
        "{}",
        denied.error_message
    );
    tx.unbounded_send(batch(2, ACK_QUORUM, vec![msg("orders", "o1", 60_000, 0)]))
        .unwrap();
    let ok = acks.message().await.unwrap().unwrap();
    assert_eq!(ok.error_code, 0, "the stream goes on: {ok:?}");
    let tag = ok.delivery_tags[0].clone();
    // A custom dead-letter topic the producer may not publish to is denied.
    let mut dl = msg("orders", "o2", 0, 0);
    dl.dead_letter_topic = "elsewhere".into();
    tx.unbounded_send(batch(3, ACK_QUORUM, vec![dl])).unwrap();
    let denied = acks.message().await.unwrap().unwrap();
    assert_eq!(denied.error_code, 7, "dead-letter topic: {denied:?}");
    assert!(
        denied.error_message.contains("elsewhere"),
        "{}",
        denied.error_message
    );

    // Subscribe and Peek need consume.
    let e = subscribe_status(&ch, Some("tok-producer"), "orders")
        .await
        .expect_err("producer may not consume");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(reason(&e), Some(Reason::PermissionDenied));
    subscribe_status(&ch, Some("tok-consumer"), "orders")
        .await
        .expect("consumer subscribes");
    let peek = |t: &'static str| {
        let mut a = admin(&ch, Some(t));
        async move {
            a.peek(PeekRequest {
                topic: "orders".into(),
                limit: 10,
                ..Default::default()
            })
            .await
        }
    };
    assert_eq!(
        peek("tok-producer").await.expect_err("denied").code(),
        tonic::Code::PermissionDenied
    );
    assert_eq!(
        peek("tok-consumer")
            .await
            .expect("allowed")
            .into_inner()
            .messages
            .len(),
        1
    );

    // Cancel and Reschedule need publish on the message's topic.
    let e = producer(&ch, Some("tok-consumer"))
        .reschedule(RescheduleRequest {
            delivery_tag: tag.clone(),
            delay_ms: 1000,
        })
        .await
        .expect_err("consumer may not reschedule");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = producer(&ch, Some("tok-consumer"))
        .cancel(CancelRequest {
            delivery_tags: vec![tag.clone()],
        })
        .await
        .expect_err("consumer may not cancel");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(reason(&e), Some(Reason::PermissionDenied));
    assert!(e.message().contains("orders"), "{e:?}");
    // A message acked before it is applied (LEADER) is found by a Cancel sent at once.
    for i in 0..20 {
        tx.unbounded_send(batch(
            10 + i,
            ACK_LEADER,
            vec![msg("orders.fresh", "f", 60_000, 0)],
        ))
        .unwrap();
        let ack = acks.message().await.unwrap().unwrap();
        assert_eq!(ack.error_code, 0, "{ack:?}");
        let done = producer(&ch, Some("tok-producer"))
            .cancel(CancelRequest {
                delivery_tags: ack.delivery_tags.clone(),
            })
            .await
            .expect("producer cancels")
            .into_inner();
        assert_eq!(done.cancelled, vec![true], "round {i}");
    }
    let moved = producer(&ch, Some("tok-producer"))
        .reschedule(RescheduleRequest {
            delivery_tag: tag.clone(),
            delay_ms: 60_000,
        })
        .await
        .expect("producer reschedules")
        .into_inner();
    assert!(moved.found);
    let done = producer(&ch, Some("tok-producer"))
        .cancel(CancelRequest {
            delivery_tags: vec![moved.delivery_tag],
        })
        .await
        .expect("producer cancels")
        .into_inner();
    assert_eq!(done.cancelled, vec![true]);

    // TopicStats lists what the principal may publish or consume; DeleteGroup is admin's.
    let mut o = producer(&ch, Some("tok-ops"));
    let (otx, orx) = futures::channel::mpsc::unbounded();
    let mut oacks = o.publish_stream(orx).await.unwrap().into_inner();
    otx.unbounded_send(batch(
        1,
        ACK_QUORUM,
        vec![
            msg("billing", "b", 60_000, 0),
            msg("orders", "o", 60_000, 0),
        ],
    ))
    .unwrap();
    assert_eq!(oacks.message().await.unwrap().unwrap().error_code, 0);
    let topics = |t: &'static str| {
        let mut a = admin(&ch, Some(t));
        async move {
            let r = a
                .topic_stats(TopicStatsRequest::default())
                .await
                .unwrap()
                .into_inner();
            r.topics.into_iter().map(|t| t.topic).collect::<Vec<_>>()
        }
    };
    // An ack (QUORUM, standalone: fsynced) may come before the apply the stats read.
    common::eventually("the ops principal sees both topics", || async {
        topics("tok-ops").await == vec!["billing", "orders"]
    })
    .await;
    assert_eq!(topics("tok-consumer").await, vec!["orders"]);
    let e = admin(&ch, Some("tok-consumer"))
        .topic_stats(TopicStatsRequest {
            topic: "billing".into(),
        })
        .await
        .expect_err("a topic it may not see");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let del = |t: &'static str| {
        let mut a = admin(&ch, Some(t));
        async move {
            a.delete_group(DeleteGroupRequest {
                topic: "orders".into(),
                group: "g".into(),
            })
            .await
        }
    };
    assert_eq!(
        del("tok-consumer").await.expect_err("not admin").code(),
        tonic::Code::PermissionDenied
    );
    del("tok-ops").await.expect("admin deletes a group");

    // A verified client certificate's name identifies a principal without a token.
    let svc = Channel::from_shared(b.url())
        .unwrap()
        .tls_config(with_identity(
            trusting(&ca),
            &ca,
            "svc.example",
            Validity::Days(1),
        ))
        .unwrap()
        .connect()
        .await
        .unwrap();
    subscribe_status(&svc, None, "svc")
        .await
        .expect("the certificate's principal consumes svc");
    let e = subscribe_status(&svc, None, "orders")
        .await
        .expect_err("but not orders");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let stranger = Channel::from_shared(b.url())
        .unwrap()
        .tls_config(with_identity(
            trusting(&ca),
            &ca,
            "nobody.example",
            Validity::Days(1),
        ))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let e = subscribe_status(&stranger, None, "svc")
        .await
        .expect_err("a name of no principal");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // The CLI over TLS with a token file.
    let token = dir.join("token");
    std::fs::write(&token, "tok-producer\n").unwrap();
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_futureq"))
            .args(args)
            .args(["--server", &format!("127.0.0.1:{}", b.grpc_port)])
            .arg("--tls-ca")
            .arg(dir.join("ca.pem"))
            .arg("--token-file")
            .arg(&token)
            .output()
            .unwrap()
    };
    let out = cli(&["publish", "-t", "orders", "--delay", "1m", "from the CLI"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["publish", "-t", "billing", "x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("may not publish") && err.contains("billing"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_certificates_and_principals_and_a_bad_file_keeps_them() {
    let ca = DevCa::new("first CA").unwrap();
    let mut b = Broker::prepare("");
    let dir = node_files(&b.dir.path().join("certs"), &ca);
    let principals = dir.join("principals.yaml");
    std::fs::write(&principals, principals_yaml("svc.example")).unwrap();
    b.extra = format!(
        "{}  auth:\n    principalsFile: {}\n",
        tls_yaml(&dir, "optional"),
        principals.display()
    );
    b.tls = Some(trusting(&ca));
    b.spawn().await;
    let expiry = b
        .metric("futureq_tls_cert_expiry_seconds{plane=\"client\"}")
        .await;
    assert!(
        expiry > common::now_ms() as f64 / 1000.0 + 20.0 * 86_400.0,
        "{expiry}"
    );
    let old = b.channel().await;
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut acks = producer(&old, Some("tok-ops"))
        .publish_stream(rx)
        .await
        .unwrap()
        .into_inner();
    tx.unbounded_send(batch(1, ACK_QUORUM, vec![msg("a", "1", 0, 0)]))
        .unwrap();
    assert_eq!(acks.message().await.unwrap().unwrap().error_code, 0);

    // A new CA's certificate and a new principal, then SIGHUP.
    let second = DevCa::new("second CA").unwrap();
    let node = second
        .issue(&names(&["localhost", "127.0.0.1"]), Validity::Days(90))
        .unwrap();
    write_pair(&dir, "node", &node).unwrap();
    std::fs::write(
        &principals,
        format!(
            "{}- name: late\n  tokens: [{}]\n  publish: [\"*\"]\n  consume: [late]\n",
            principals_yaml("svc.example"),
            token_hash_hex("tok-late")
        ),
    )
    .unwrap();
    common::signal(&b, "-HUP");
    common::eventually("a reload", || async {
        b.metric("futureq_tls_reload_total{result=\"ok\"}").await == 1.0
    })
    .await;
    assert!(
        health(&b, Some(trusting(&ca))).await.is_err(),
        "new connections get the new certificate"
    );
    health(&b, Some(trusting(&second)))
        .await
        .expect("signed by the second CA");
    assert!(
        b.metric("futureq_tls_cert_expiry_seconds{plane=\"client\"}")
            .await
            > expiry
    );
    // The connection opened before goes on.
    tx.unbounded_send(batch(2, ACK_QUORUM, vec![msg("a", "2", 0, 0)]))
        .unwrap();
    assert_eq!(acks.message().await.unwrap().unwrap().error_code, 0);
    let fresh = Channel::from_shared(b.url())
        .unwrap()
        .tls_config(trusting(&second))
        .unwrap()
        .connect()
        .await
        .unwrap();
    FutureQClusterClient::with_interceptor(fresh.clone(), Bearer(Some("tok-late".into())))
        .get_cluster_info(ClusterInfoRequest {})
        .await
        .expect("the new principal");

    // A bad file: counted, logged, and everything in use stays.
    std::fs::write(dir.join("node-key.pem"), "not a key").unwrap();
    common::signal(&b, "-HUP");
    common::eventually("a failed reload", || async {
        b.metric("futureq_tls_reload_total{result=\"error\"}").await == 1.0
    })
    .await;
    assert!(b.log().contains("reload failed"), "{}", b.log_tail(5));
    health(&b, Some(trusting(&second)))
        .await
        .expect("the certificate in use stays");
    write_pair(&dir, "node", &node).unwrap();
    std::fs::write(&principals, "principals: [{name: broken}]").unwrap();
    common::signal(&b, "-HUP");
    common::eventually("a second failed reload", || async {
        b.metric("futureq_tls_reload_total{result=\"error\"}").await == 2.0
    })
    .await;
    FutureQClusterClient::with_interceptor(fresh.clone(), Bearer(Some("tok-late".into())))
        .get_cluster_info(ClusterInfoRequest {})
        .await
        .expect("the principals in use stay");

    // Revocation: streams of a principal that a reload removes end (a publish stream at its
    // next batch, a subscription at once).
    let (ltx, lrx) = futures::channel::mpsc::unbounded();
    let mut lacks = producer(&fresh, Some("tok-late"))
        .publish_stream(lrx)
        .await
        .unwrap()
        .into_inner();
    ltx.unbounded_send(batch(1, ACK_QUORUM, vec![msg("late", "1", 0, 0)]))
        .unwrap();
    assert_eq!(lacks.message().await.unwrap().unwrap().error_code, 0);
    let (stx, srx) = futures::channel::mpsc::unbounded();
    stx.unbounded_send(ConsumerFrame {
        frame: Some(consumer_frame::Frame::Init(SubscribeInit {
            topic: "late".into(),
            ..Default::default()
        })),
    })
    .unwrap();
    let mut sub = FutureQConsumerClient::with_interceptor(fresh, Bearer(Some("tok-late".into())))
        .subscribe(srx)
        .await
        .unwrap()
        .into_inner();
    let first = sub.message().await.expect("delivered").expect("a message");
    assert_eq!(&first.payload[..], b"1");
    std::fs::write(&principals, principals_yaml("svc.example")).unwrap();
    common::signal(&b, "-HUP");
    common::eventually("the revoking reload", || async {
        b.metric("futureq_tls_reload_total{result=\"ok\"}").await == 2.0
    })
    .await;
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match sub.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the subscription ended OK"),
                Err(s) => return s,
            }
        }
    })
    .await
    .expect("the subscription ends at the reload");
    assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
    ltx.unbounded_send(batch(2, ACK_QUORUM, vec![msg("late", "2", 0, 0)]))
        .unwrap();
    let refused = lacks.message().await.unwrap().unwrap();
    assert_eq!(refused.error_code, 16, "{refused:?}");
    let end = lacks.message().await.expect_err("the publish stream ends");
    assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
    assert!(b.running());
}

/// `futureq start` with the configuration `yaml`: exits 2 naming `key`.
fn refused(dir: &Path, yaml: &str, key: &str) {
    let cfg = dir.join("refused.yaml");
    std::fs::write(
        &cfg,
        format!("configVersion: 1\nstorage:\n  dataDir: {}/data\nobservability:\n  metrics:\n    listen: \"\"\n{yaml}", dir.display()),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_futureq"))
        .args(["start", "-c"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{yaml}: {err}");
    assert!(err.contains(key), "{yaml}: {err}");
}

#[test]
fn unsafe_or_incomplete_security_settings_refuse_to_start() {
    let ca = DevCa::new("test CA").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = node_files(tmp.path(), &ca);
    let d = dir.display();
    let principals = dir.join("p.yaml");
    std::fs::write(&principals, principals_yaml("x")).unwrap();
    let t = tmp.path();
    refused(
        t,
        &format!("api:\n  grpc:\n    tls:\n      certFile: {d}/node.pem\n"),
        "api.grpc.tls.keyFile",
    );
    refused(
        t,
        &format!("api:\n  grpc:\n    tls:\n      certFile: {d}/node.pem\n      keyFile: {d}/node-key.pem\n      clientAuth: require\n"),
        "api.grpc.tls.caFile",
    );
    refused(
        t,
        &format!(
            "api:\n  grpc:\n    tls:\n      certFile: {d}/node.pem\n      keyFile: {d}/ca.pem\n"
        ),
        "api.grpc.tls.keyFile",
    );
    refused(
        t,
        &format!(
            "api:\n  grpc:\n    listen: 0.0.0.0:1\n  auth:\n    principalsFile: {}\n",
            principals.display()
        ),
        "api.auth.principalsFile",
    );
    refused(
        t,
        "api:\n  auth:\n    principalsFile: /nonexistent/p.yaml\n",
        "api.auth.principalsFile",
    );
    refused(
        t,
        "api:\n  grpc:\n    tls:\n      clientAuth: sometimes\n",
        "api.grpc.tls.clientAuth",
    );
    // Clusters: TLS on both planes or neither; principals need the cluster secret.
    let node = "cluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\"}\n";
    let api_tls = format!("api:\n  grpc:\n    advertise: 127.0.0.1:8443\n    tls:\n      certFile: {d}/node.pem\n      keyFile: {d}/node-key.pem\n");
    let api_plain = "api:\n  grpc:\n    advertise: 127.0.0.1:8443\n";
    let peer_tls = format!("  tls:\n    certFile: {d}/node.pem\n    keyFile: {d}/node-key.pem\n    caFile: {d}/ca.pem\n");
    refused(t, &format!("{node}{api_tls}"), "cluster.tls.certFile");
    refused(
        t,
        &format!("{node}{peer_tls}{api_plain}"),
        "api.grpc.tls.certFile",
    );
    refused(
        t,
        &format!(
            "{node}  tls:\n    certFile: {d}/node.pem\n    keyFile: {d}/node-key.pem\n{api_tls}"
        ),
        "cluster.tls.caFile",
    );
    refused(
        t,
        &format!(
            "{node}{api_plain}  auth:\n    principalsFile: {}\n",
            principals.display()
        ),
        "cluster.secret",
    );
    // The client plane's certificate must chain to the cluster CA: nodes dial it.
    let other = node_files(&tmp.path().join("other"), &DevCa::new("other CA").unwrap());
    let o = other.display();
    refused(
        t,
        &format!("{node}{peer_tls}api:\n  grpc:\n    advertise: 127.0.0.1:8443\n    tls:\n      certFile: {o}/node.pem\n      keyFile: {o}/node-key.pem\n"),
        "under the cluster CA",
    );
}
