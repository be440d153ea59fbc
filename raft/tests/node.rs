//! What a node refuses: a store behind its log at start-up, forged writes on the peer port.

use std::rc::Rc;
use std::time::Duration;

use futureq_raft::codec::RaftLogId;
use futureq_raft::log_store::LogStore;
use futureq_raft::node::{Node, NodeConfig, NodeError};
use futureq_raft::rt::GlommioRuntime;
use futureq_storage::log::uring::DmaLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::{Store, StoreMode};
use openraft::storage::RaftLogStorage;
use openraft_rt::AsyncRuntime;

/// Issue 10.2: a store that applied less than the log purged (a crash after a purge behind a
/// snapshot that was not durable) must not be served: openraft would apply the entries after
/// the purge point over the gap.
#[test]
fn a_store_behind_the_log_purge_point_is_refused() {
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let event = dir.path().join("event");
        std::fs::create_dir_all(&event).unwrap();
        {
            let mut log = LogStore::open(
                move || DmaLogIo::in_dir(event.clone()),
                LogConfig {
                    segment_bytes: 1 << 20,
                    cache_bytes: 1 << 16,
                },
                Box::new(|_| {}),
            )
            .await
            .unwrap();
            let purged: RaftLogId = openraft::LogId {
                leader_id: openraft::impls::leader_id_adv::LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index: 10,
            };
            log.purge(purged).await.unwrap();
        }
        let cfg = one_node(dir.path());
        let store = Store::open(&StoreMode::Memory).unwrap();
        match Node::start(&cfg, store, Rc::new(|_, _| {})).await {
            Err(e @ NodeError::BehindPurge { .. }) => {
                let m = e.to_string();
                assert!(m.contains("entries 1..=10"), "{m}");
            }
            Err(e) => panic!("wrong refusal: {e}"),
            Ok(_) => panic!("a node behind its log's purge point started"),
        }
    });
}

/// Issue 10.9: the peer port takes no forwarded writes for the event shard (one frame could
/// commit bytes that every replica then has to apply); only typed deletes, which the leader
/// encodes itself.
#[test]
fn the_event_shard_takes_no_forwarded_writes() {
    use bytes::Bytes;
    use futureq_net::peer_link::{PeerClient, PeerSecret};
    use futureq_raft::node::{Forward, EVENT_GROUP, KIND_FORWARD};
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let secret = PeerSecret::new(b"s3cret");
        let cfg = NodeConfig {
            secret: secret.clone(),
            ..one_node(dir.path())
        };
        let addr = cfg.raft_advertise.clone();
        let store = Store::open(&StoreMode::Memory).unwrap();
        let node = single_leader(&cfg, store.clone()).await;
        // The term's first (blank) entry is in the log before the forged write comes.
        for _ in 0..200 {
            if node.leadership().last_log > 0 {
                break;
            }
            GlommioRuntime::sleep(Duration::from_millis(10)).await;
        }
        let last = node.leadership().last_log;
        assert!(last > 0, "the leader's blank entry");
        let client = PeerClient::new(addr.parse().unwrap(), 1 << 20).with_secret(secret);
        let forged = Forward::Write(vec![1, 0, 0, 0, 0, 0xde, 0xad]);
        let reply = client
            .call(
                EVENT_GROUP,
                KIND_FORWARD,
                Bytes::from(forged.encode()),
                Duration::from_secs(2),
            )
            .await
            .unwrap();
        assert_eq!(reply.payload.first(), Some(&5), "refused: not stored");
        assert!(
            String::from_utf8_lossy(&reply.payload[1..]).contains("takes no forwarded writes"),
            "{:?}",
            reply.payload
        );
        GlommioRuntime::sleep(Duration::from_millis(100)).await;
        assert_eq!(node.leadership().last_log, last, "nothing was proposed");
        assert_eq!(store.counts().unwrap(), (0, 0, 0));
        node.shutdown().await;
    });
}

/// Found by the nemesis (replace-follower): `futureq leave` of a node that leads the metadata
/// group (but not the event shard) failed at once — the removal was forwarded to the node
/// being removed, which was down. The metadata request is idempotent: it waits for the other
/// members to elect a leader and goes there, within its deadline.
#[test]
fn a_metadata_request_outlives_a_metadata_leader_that_is_down() {
    use futureq_raft::node::Forward;
    use openraft_rt::watch::WatchReceiver as _;
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let nodes = bootstrapped(3, dir.path()).await;
        // Node 1 leads the event shard, node 2 the metadata group.
        let meta_leader = |n: &Node| n.meta.metrics().borrow_watched().current_leader;
        for round in 0..100 {
            if nodes[0].leadership().leading && meta_leader(&nodes[0]) == Some(2) {
                break;
            }
            if round % 10 == 5 {
                if nodes[0].leadership().leader != Some(1) {
                    let _ = nodes[0].event.trigger().elect(false).await;
                }
                if meta_leader(&nodes[0]) != Some(2) {
                    let _ = nodes[1].meta.trigger().elect(false).await;
                }
            }
            GlommioRuntime::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            nodes[0].leadership().leading,
            "{:?} / meta leader {:?}",
            nodes[0].leadership(),
            meta_leader(&nodes[0])
        );
        assert_eq!(meta_leader(&nodes[0]), Some(2));
        // Node 2 goes down; node 1 removes it from the metadata group.
        nodes[1].shutdown().await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        nodes[0]
            .meta_request(Forward::Remove(2), deadline)
            .await
            .expect("removed once the others elected a metadata leader");
        let voters: Vec<u64> = nodes[0]
            .meta
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        assert!(!voters.contains(&2), "{voters:?}");
        for (i, n) in nodes.iter().enumerate() {
            if i != 1 {
                n.shutdown().await;
            }
        }
    });
}

/// A one-node cluster's configuration on a free loopback port, data in `dir`.
fn one_node(dir: &std::path::Path) -> NodeConfig {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    node_config(1, &format!("127.0.0.1:{port}"), dir)
}

/// The tests' configuration of node `id` at Raft address `addr`.
fn node_config(id: u64, addr: &str, dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        node_id: id,
        raft_listen: addr.parse().unwrap(),
        raft_advertise: addr.to_owned(),
        data_dir: dir.to_path_buf(),
        rtt: Duration::from_millis(20),
        snapshot_entries: 100,
        compaction_overhead: 10,
        secret: Default::default(),
        tls: None,
        log_bytes_max: futureq_raft::node::EVENT_LOG_BYTES_MAX,
        segment_bytes: futureq_raft::node::SEGMENT_BYTES,
    }
}

/// Starts `n` nodes (ids 1..=n, memory stores, data under `dir`) on free loopback ports and
/// bootstraps them as one cluster.
async fn bootstrapped(n: u64, dir: &std::path::Path) -> Vec<Node> {
    let members: std::collections::BTreeMap<u64, String> = (1..=n)
        .map(|id| {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            (id, format!("127.0.0.1:{port}"))
        })
        .collect();
    let mut nodes = Vec::new();
    for (id, addr) in &members {
        let cfg = node_config(*id, addr, &dir.join(id.to_string()));
        let store = Store::open(&StoreMode::Memory).unwrap();
        nodes.push(Node::start(&cfg, store, Rc::new(|_, _| {})).await.unwrap());
    }
    for n in &nodes {
        n.bootstrap(&members).await.unwrap();
    }
    nodes
}

/// Starts a one-node cluster on `cfg` and waits until it leads.
async fn single_leader(cfg: &NodeConfig, store: Store) -> Node {
    let node = Node::start(cfg, store, Rc::new(|_, _| {})).await.unwrap();
    node.bootstrap(&[(1, cfg.raft_advertise.clone())].into_iter().collect())
        .await
        .unwrap();
    for _ in 0..200 {
        if node.leadership().leading {
            break;
        }
        GlommioRuntime::sleep(Duration::from_millis(10)).await;
    }
    assert!(node.leadership().leading);
    node
}

/// Segment files in an event log directory.
fn log_segments(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
        })
        .count()
}

/// Issue 12: the event log is bounded in bytes, not only in entries: coalesced entries can be
/// megabytes each, and `snapshot_entries` of them would be gigabytes on disk. Past
/// `log_bytes_max` the node snapshots and purges down to half of it, though the entry policy
/// never fires here.
#[test]
fn the_event_log_is_bounded_in_bytes() {
    use futureq_core::command::{encode_delete, DeleteBatch};
    use futureq_raft::node::{Ack, Proposal};
    const SEGMENT: u64 = 256 << 10;
    const MAX: u64 = 2 << 20;
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = NodeConfig {
            snapshot_entries: 1_000_000,
            compaction_overhead: 1_000_000,
            log_bytes_max: MAX,
            segment_bytes: SEGMENT,
            ..one_node(dir.path())
        };
        let store = Store::open(&StoreMode::Memory).unwrap();
        let node = single_leader(&cfg, store).await;
        // 48 entries of 5,000 keys (120 KB each): 5.8 MB of log, three times the bound.
        let entry = bytes::Bytes::from(encode_delete(&DeleteBatch {
            keys: (0..5_000u32)
                .map(|i| {
                    let mut k = [0u8; 24];
                    k[20..].copy_from_slice(&i.to_be_bytes());
                    k
                })
                .collect(),
        }));
        for _ in 0..48 {
            let e = entry.clone();
            node.write_event(
                move || Ok(Proposal::command(e.clone())),
                Ack::Quorum,
                std::time::Instant::now() + Duration::from_secs(10),
            )
            .await
            .unwrap();
        }
        let event_dir = dir.path().join("event");
        let bound = usize::try_from(MAX / SEGMENT).unwrap() + 2;
        let mut segments = log_segments(&event_dir);
        for _ in 0..100 {
            if node.leadership().purged > 0 && segments <= bound {
                break;
            }
            GlommioRuntime::sleep(Duration::from_millis(100)).await;
            segments = log_segments(&event_dir);
        }
        let l = node.leadership();
        assert!(l.purged > 0, "nothing was purged: {l:?}");
        assert!(
            segments <= bound,
            "{segments} segments of {SEGMENT} bytes are left, more than {bound}"
        );
        // The newest half of the bound stays (1 MiB: at least 4 segments of 2 entries).
        assert!(
            segments >= 4,
            "only {segments} segments are left: more than the oldest half was purged"
        );
        node.shutdown().await;
    });
}

/// Issue 26.4: a write whose LEADER persist key never fires (here: a key of another term) and
/// whose entry never commits (the leader lost its quorum after appending it) ends at its
/// deadline. It used to wait for the key before starting its timer: the write, and its place
/// among the leader's outstanding proposals, were held for good.
#[test]
fn a_write_whose_persist_key_never_fires_ends_at_its_deadline() {
    use futureq_core::command::{encode_store, StoreBatch, StoreItem};
    use futureq_raft::node::{Proposal, WriteError};
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let nodes = bootstrapped(2, dir.path()).await;
        let mut leader = None;
        for _ in 0..500 {
            leader = nodes.iter().position(|n| n.leadership().leading);
            if leader.is_some() {
                break;
            }
            GlommioRuntime::sleep(Duration::from_millis(10)).await;
        }
        let leader = leader.expect("a leader within 5 s");
        let follower = 1 - leader;
        let (term, before) = {
            let l = nodes[leader].leadership();
            (l.term, l.last_log)
        };
        // The quorum goes; the leader's lease still lets it append.
        nodes[follower].shutdown().await;
        let cmd = encode_store(&StoreBatch {
            items: vec![StoreItem {
                event_id: 1,
                bucket: 0,
                topic_hash: 0,
                expires_at_ms: 0,
                index_keys: vec![],
                message: vec![7; 16],
            }],
        });
        let deadline = std::time::Instant::now() + Duration::from_millis(500);
        let write = nodes[leader]
            .propose_event(
                move || Ok(Proposal::store(cmd.clone().into(), term + 1000)),
                true,
                deadline,
            )
            .await
            .expect("a place among the proposals");
        let done = futures_lite::future::or(async { Some(write.done.await) }, async {
            GlommioRuntime::sleep(Duration::from_secs(10)).await;
            None
        })
        .await;
        assert!(
            nodes[leader].leadership().last_log > before,
            "the entry was appended (the write was taken, not refused)"
        );
        match done {
            Some(Ok(Err(WriteError::Timeout))) => {}
            Some(other) => panic!("expected a timeout, got {other:?}"),
            None => panic!("the write outlived its deadline by 9.5 s"),
        }
        nodes[leader].shutdown().await;
    });
}
