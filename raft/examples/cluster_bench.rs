//! Early Raft figures: three nodes in ONE glommio executor (one core), real io_uring logs
//! with fdatasync in temp dirs, real loopback TCP between them, the redb state machine.
//! Measures `client_write` (QUORUM: committed by a majority and applied) throughput and
//! latency for 1 and 64 concurrent writers, each writing 100-message batches.
//!
//!   cargo run --release -p futureq-raft --example cluster_bench

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futureq_core::command::{encode_store, StoreBatch, StoreItem};
use futureq_net::peer_link::serve_peers;
use futureq_net::Shutdown;
use futureq_raft::log_store::LogStore;
use futureq_raft::network::{raft_handler, PeerNetwork, PEER_FRAME_MAX};
use futureq_raft::rt::GlommioRuntime;
use futureq_raft::state_machine::EventStateMachine;
use futureq_raft::types::{Command, TypeConfig};
use futureq_storage::log::uring::DmaLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::{Store, StoreMode};
use openraft::BasicNode;
use openraft_rt::AsyncRuntime;

type Raft = openraft::Raft<TypeConfig, EventStateMachine>;

fn batch(first_id: u64) -> Vec<u8> {
    let items = (first_id..first_id + 100)
        .map(|id| StoreItem {
            event_id: id,
            bucket: 1,
            topic_hash: 7,
            expires_at_ms: 0,
            index_keys: vec![],
            message: vec![b'x'; 100],
        })
        .collect();
    encode_store(&StoreBatch { items })
}

fn pct(sorted: &[Duration], q: f64) -> f64 {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() - 1) as f64 * q) as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().to_path_buf();
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async move {
        let config = Arc::new(
            openraft::Config {
                heartbeat_interval: 50,
                election_timeout_min: 500,
                election_timeout_max: 1000,
                ..Default::default()
            }
            .validate()
            .expect("config"),
        );
        let mut listeners = Vec::new();
        let mut members = BTreeMap::new();
        for id in 1..=3u64 {
            let l = glommio::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            members.insert(
                id,
                BasicNode {
                    addr: l.local_addr().expect("addr").to_string(),
                },
            );
            listeners.push(l);
        }
        let mut nodes: Vec<(u64, Raft)> = Vec::new();
        let mut stops = Vec::new();
        for (id, listener) in (1..=3u64).zip(listeners) {
            let d = base.join(format!("n{id}"));
            let log = LogStore::open(
                move || DmaLogIo::new(&d).expect("dir"),
                LogConfig {
                    segment_bytes: futureq_storage::log::SEGMENT_BYTES,
                    cache_bytes: futureq_storage::log::segmented::DEFAULT_CACHE_BYTES,
                },
                Box::new(|_| {}),
            )
            .await
            .expect("log");
            let sm = EventStateMachine::new(
                Store::open(&StoreMode::Memory).expect("store"),
                Rc::new(|_, _| {}),
            );
            let raft = Raft::new(
                id,
                Arc::clone(&config),
                PeerNetwork::new(1, Duration::from_secs(2)),
                log,
                sm,
            )
            .await
            .expect("raft");
            let stop = Shutdown::new();
            let receiving = futureq_raft::snapshot::Receiving::new(
                &base.join(format!("n{id}")),
                1,
                futureq_raft::network::SNAPSHOT_BYTES_MAX,
            )
            .expect("spool dir");
            glommio::spawn_local(serve_peers(
                listener,
                raft_handler(1, raft.clone(), receiving),
                PEER_FRAME_MAX,
                futureq_net::peer_link::PeerAuth::default(),
                stop.clone(),
            ))
            .detach();
            stops.push(stop);
            nodes.push((id, raft));
        }
        nodes[0].1.initialize(members).await.expect("init");
        let mut leader = None;
        for _ in 0..500 {
            leader = nodes[0].1.current_leader().await;
            if leader.is_some() {
                break;
            }
            GlommioRuntime::sleep(Duration::from_millis(10)).await;
        }
        let leader = leader.expect("leader");
        // A new leader refuses writes (ForwardToLeader/LeaseExpired) for a few ms.
        GlommioRuntime::sleep(Duration::from_millis(200)).await;
        let lraft = nodes
            .iter()
            .find(|(id, _)| *id == leader)
            .expect("leader node")
            .1
            .clone();
        println!("| writers | batches/s | msgs/s | p50 ms | p99 ms |\n|---|---|---|---|---|");
        let mut next_id = 1u64;
        for writers in [1usize, 64] {
            let lat = Rc::new(std::cell::RefCell::new(Vec::new()));
            let start = Instant::now();
            let tasks: Vec<_> = (0..writers)
                .map(|w| {
                    let (r, lat) = (lraft.clone(), Rc::clone(&lat));
                    let first = next_id + (w as u64) * 1_000_000;
                    glommio::spawn_local(async move {
                        let mut id = first;
                        while start.elapsed() < Duration::from_secs(3) {
                            let t = Instant::now();
                            r.client_write(Command(batch(id).into()))
                                .await
                                .expect("write");
                            lat.borrow_mut().push(t.elapsed());
                            id += 100;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
            next_id += 1_000_000_000;
            let secs = start.elapsed().as_secs_f64();
            let mut l = lat.borrow().clone();
            l.sort();
            #[allow(clippy::cast_precision_loss)]
            let rate = l.len() as f64 / secs;
            println!(
                "| {writers} | {rate:.0} | {:.0} | {:.2} | {:.2} |",
                rate * 100.0,
                pct(&l, 0.5),
                pct(&l, 0.99)
            );
        }
        for (_, r) in &nodes {
            r.shutdown().await.expect("shutdown");
        }
        for s in stops {
            s.trigger();
        }
    });
}
