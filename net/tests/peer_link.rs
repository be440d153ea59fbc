//! Peer links over loopback TCP: concurrent requests matched by id, timeouts, broken
//! connections failing fast, and reconnection.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futureq_net::peer::PeerFrame;
use futureq_net::peer_link::{serve_peers, PeerAuth, PeerClient, PeerError, PeerHandler};
use futureq_net::Shutdown;
use glommio::{LocalExecutorBuilder, Placement};

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(512 << 10)
        .spawn(move || async move { f().await })
        .expect("executor")
        .join()
        .expect("test body");
}

/// Answers with the payload reversed and kind + 1; kind 9 never answers; kind 8 answers late.
fn handler() -> PeerHandler {
    Rc::new(|f: PeerFrame| {
        Box::pin(async move {
            match f.kind {
                9 => None,
                8 => {
                    glommio::timer::sleep(Duration::from_millis(300)).await;
                    Some((f.kind + 1, f.payload))
                }
                k => {
                    let mut p = f.payload.to_vec();
                    p.reverse();
                    // Out-of-order answers: later requests may finish first.
                    let wait = u64::from(p.last().copied().unwrap_or(0)) * 10;
                    glommio::timer::sleep(Duration::from_micros(wait)).await;
                    Some((k + 1, Bytes::from(p)))
                }
            }
        })
    })
}

#[test]
fn requests_are_matched_timeouts_fire_and_links_recover() {
    run(|| async {
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let server = glommio::spawn_local(serve_peers(
            listener,
            handler(),
            1 << 20,
            PeerAuth::default(),
            stop.clone(),
        ));
        let client = Rc::new(PeerClient::new(addr, 1 << 20));

        let calls: Vec<_> = (0..200u32)
            .map(|i| {
                let c = Rc::clone(&client);
                glommio::spawn_local(async move {
                    let payload = Bytes::from(vec![(i % 200) as u8, 1, 2, (199 - i % 200) as u8]);
                    let f = c
                        .call(1, 3, payload.clone(), Duration::from_secs(5))
                        .await
                        .unwrap();
                    let mut want = payload.to_vec();
                    want.reverse();
                    assert_eq!((f.group, f.kind, &f.payload[..]), (1, 4, &want[..]));
                })
            })
            .collect();
        for c in calls {
            c.await;
        }

        let e = client
            .call(0, 9, Bytes::new(), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(e, PeerError::Timeout(..)), "{e}");
        let late = client
            .call(0, 8, Bytes::from_static(b"x"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(late.kind, 9);

        // The server goes away: calls fail instead of hanging; an attempt right after a
        // refused one is not even made.
        stop.trigger();
        server.await;
        drop(client);
        let client = PeerClient::new(addr, 1 << 20);
        let call = || client.call(0, 1, Bytes::new(), Duration::from_secs(5));
        let e = call().await.unwrap_err();
        assert!(!e.to_string().contains("too soon"), "{e}");
        let e = call().await.unwrap_err();
        assert!(e.to_string().contains("too soon"), "{e}");

        // It comes back on the same address: the client reconnects.
        let listener = glommio::net::TcpListener::bind(addr).unwrap();
        let stop = Shutdown::new();
        let server = glommio::spawn_local(serve_peers(
            listener,
            handler(),
            1 << 20,
            PeerAuth::default(),
            stop.clone(),
        ));
        glommio::timer::sleep(Duration::from_millis(60)).await;
        let f = client
            .call(2, 1, Bytes::from_static(b"ab"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(&f.payload[..], b"ba");
        stop.trigger();
        server.await;
    });
}

/// Issue 10.9: with a cluster secret, a link that does not open with it is closed before
/// any request reaches the handler; one that does works.
#[test]
fn links_without_the_secret_are_refused() {
    use futureq_net::peer_link::PeerSecret;
    run(|| async {
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let secret = PeerSecret::new(b"right");
        let server = glommio::spawn_local(serve_peers(
            listener,
            handler(),
            1 << 20,
            secret.clone(),
            stop.clone(),
        ));
        let t = Duration::from_secs(2);
        for wrong in [
            PeerSecret::default(),
            PeerSecret::new(b"wrong"),
            PeerSecret::new(b"righ"),
        ] {
            let c = PeerClient::new(addr, 1 << 20).with_secret(wrong);
            let r = c.call(1, 3, Bytes::from_static(b"ab"), t).await;
            assert!(
                matches!(r, Err(PeerError::Closed(_))),
                "a link without the secret must be closed: {r:?}"
            );
        }
        let c = PeerClient::new(addr, 1 << 20).with_secret(secret);
        let f = c.call(1, 3, Bytes::from_static(b"ab"), t).await.unwrap();
        assert_eq!(&f.payload[..], b"ba");
        stop.trigger();
        server.await;
    });
}

/// Outgoing links bound to the node's own address: the peer sees it as the source (rules
/// between node addresses then cut both directions of a link).
#[test]
fn bound_links_come_from_the_node_address() {
    run(|| async {
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = PeerClient::new(addr, 1 << 20).with_bind(Some("127.0.0.3".parse().unwrap()));
        let call = glommio::spawn_local(async move {
            let _ = client
                .call(1, 3, Bytes::from_static(b"x"), Duration::from_millis(300))
                .await;
        });
        let conn = listener.accept().await.unwrap();
        assert_eq!(conn.peer_addr().unwrap().ip().to_string(), "127.0.0.3");
        call.await;
    });
}

/// Issue 10.10: one connection gets at most PEER_REQUESTS_MAX requests served at once; the
/// server stops reading it beyond that instead of spawning tasks without bound.
#[test]
fn requests_in_service_per_connection_are_bounded() {
    use futureq_net::peer_link::PEER_REQUESTS_MAX;
    use std::cell::Cell;
    run(|| async {
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let running = Rc::new(Cell::new(0u64));
        let r = Rc::clone(&running);
        let stuck: PeerHandler = Rc::new(move |_f: PeerFrame| {
            let r = Rc::clone(&r);
            Box::pin(async move {
                r.set(r.get() + 1);
                glommio::timer::sleep(Duration::from_secs(30)).await;
                None
            })
        });
        let server = glommio::spawn_local(serve_peers(
            listener,
            stuck,
            1 << 20,
            PeerAuth::default(),
            stop.clone(),
        ));
        let client = Rc::new(PeerClient::new(addr, 1 << 20));
        let calls: Vec<_> = (0..PEER_REQUESTS_MAX + 50)
            .map(|_| {
                let c = Rc::clone(&client);
                glommio::spawn_local(async move {
                    let _ = c
                        .call(1, 3, Bytes::from_static(b"x"), Duration::from_millis(500))
                        .await;
                })
            })
            .collect();
        for c in calls {
            c.await;
        }
        assert_eq!(running.get(), PEER_REQUESTS_MAX);
        stop.trigger();
        drop(server);
    });
}

/// A CA: its certificate and key.
struct Ca(rcgen::Certificate, rcgen::KeyPair);

fn ca(name: &str) -> Ca {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    Ca(ca.self_signed(&key).unwrap(), key)
}

/// Files in `dir` of a certificate `ca` signed for 127.0.0.1 (a node certificate when
/// `node`: it carries a futureq-node URI), trusting `trust`'s CA.
fn files(dir: &std::path::Path, ca: &Ca, node: bool, trust: &Ca) -> futureq_net::tls::PeerFiles {
    use rcgen::{CertificateParams, KeyPair, SanType};
    std::fs::create_dir_all(dir).unwrap();
    let mut p = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    if node {
        p.subject_alt_names
            .push(SanType::URI("futureq-node://test".try_into().unwrap()));
    }
    p.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.0, &ca.1).unwrap();
    std::fs::write(dir.join("ca.pem"), trust.0.pem()).unwrap();
    std::fs::write(dir.join("node.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("node-key.pem"), key.serialize_pem()).unwrap();
    futureq_net::tls::PeerFiles {
        cert: dir.join("node.pem"),
        key: dir.join("node-key.pem"),
        ca: dir.join("ca.pem"),
        server_name: None,
    }
}

/// Issue 27.3: with mutual TLS, a link works between node certificates of one CA. Refused,
/// each by the server's check of the client: a foreign CA's node certificate (its holder
/// trusting our CA), a certificate of our CA that is no node certificate, plain TCP.
#[test]
fn mutual_tls_links_admit_only_node_certificates_of_the_cluster_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (our_ca, their_ca) = (ca("ours"), ca("theirs"));
    let load = |d: &str, ca: &Ca, node: bool| {
        std::sync::Arc::new(
            futureq_net::tls::PeerTls::load(files(&dir.path().join(d), ca, node, &our_ca)).unwrap(),
        )
    };
    let ours = load("ours", &our_ca, true);
    let foreign = load("foreign", &their_ca, true);
    let not_a_node = load("app", &our_ca, false);
    run(move || async move {
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let secret = futureq_net::peer_link::PeerSecret::new(b"s3cret");
        let server = glommio::spawn_local(serve_peers(
            listener,
            handler(),
            1 << 20,
            PeerAuth {
                secret: secret.clone(),
                tls: Some(std::sync::Arc::clone(&ours)),
            },
            stop.clone(),
        ));
        let client = |tls| {
            PeerClient::new(addr, 1 << 20)
                .with_secret(secret.clone())
                .with_tls(tls)
        };
        let member = client(Some(std::sync::Arc::clone(&ours)));
        let f = member
            .call(1, 3, Bytes::from_static(b"ab"), Duration::from_secs(5))
            .await
            .expect("a member's call");
        assert_eq!(&f.payload[..], b"ba");
        for (what, tls) in [
            ("a foreign CA's node certificate", Some(foreign)),
            ("our CA's certificate that is no node's", Some(not_a_node)),
            ("plain TCP", None),
        ] {
            let e = client(tls)
                .call(1, 3, Bytes::from_static(b"ab"), Duration::from_secs(2))
                .await
                .expect_err(what);
            assert!(
                matches!(
                    e,
                    PeerError::Closed(..) | PeerError::Timeout(..) | PeerError::Unreachable(..)
                ),
                "{what}: {e}"
            );
        }
        // The member's link still works.
        member
            .call(1, 3, Bytes::from_static(b"cd"), Duration::from_secs(5))
            .await
            .expect("the member again");
        stop.trigger();
        server.await;
    });
}
