//! Three Raft nodes in one glommio executor, connected by an in-process router: election,
//! replication of publish batches into every replica's redb store, and leader failover.
//! Uses the real log store, state machine, codec and runtime; only the network is simulated.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futureq_core::command::{encode_store, StoreBatch, StoreItem};
use futureq_raft::log_store::LogStore;
use futureq_raft::persisted::{PersistKey, PersistTracker};
use futureq_raft::rt::GlommioRuntime;
use futureq_raft::snapshot::Receiving;
use futureq_raft::state_machine::{EventSnapshot, EventStateMachine};
use futureq_raft::types::{Command, SnapshotData, TypeConfig, Vote};
use futureq_storage::log::io::MemLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::{Store, StoreMode};
use openraft::error::{RPCError, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RaftNetworkV2};
use openraft_rt::AsyncRuntime;

type Raft = openraft::Raft<TypeConfig, EventStateMachine>;

/// Routes RPCs to the nodes that are up.
#[derive(Clone, Default)]
struct Router(Rc<RefCell<BTreeMap<u64, Raft>>>);

impl Router {
    fn get(&self, id: u64) -> Result<Raft, Unreachable<TypeConfig>> {
        self.0
            .borrow()
            .get(&id)
            .cloned()
            .ok_or_else(|| Unreachable::from_string(format!("node {id} is down")))
    }
}

struct Net {
    target: u64,
    router: Router,
}

impl RaftNetworkFactory<TypeConfig> for Router {
    type Network = Net;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Net {
        Net {
            target,
            router: self.clone(),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for Net {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let raft = self
            .router
            .get(self.target)
            .map_err(RPCError::Unreachable)?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let raft = self
            .router
            .get(self.target)
            .map_err(RPCError::Unreachable)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: EventSnapshot,
        _cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed> + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let raft = self
            .router
            .get(self.target)
            .map_err(StreamingError::Unreachable)?;
        raft.install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))
    }
}

fn item(id: u64) -> StoreItem {
    StoreItem {
        event_id: id,
        bucket: 1000,
        topic_hash: 7,
        expires_at_ms: 0,
        index_keys: vec![],
        message: format!("m{id}").into_bytes(),
    }
}

fn test_config() -> Arc<openraft::Config> {
    let c = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        ..Default::default()
    };
    Arc::new(c.validate().unwrap())
}

/// Writes `ids` in batches of 10 messages through `raft`; returns the last log index.
///
/// Right after an election openraft refuses writes with ForwardToLeader(LeaseExpired) for a
/// few milliseconds; like the broker will, the helper retries that (bounded) instead of failing.
async fn write(raft: &Raft, ids: std::ops::RangeInclusive<u64>) -> Option<u64> {
    use openraft::error::{ClientWriteError, RaftError};
    let ids: Vec<u64> = ids.collect();
    let mut last = None;
    for chunk in ids.chunks(10) {
        let cmd = bytes::Bytes::from(encode_store(&StoreBatch {
            items: chunk.iter().copied().map(item).collect(),
        }));
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            match raft.client_write(Command(cmd.clone())).await {
                Ok(r) => {
                    last = Some(r.log_id.index);
                    break;
                }
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
                    if f.leader_id.is_none() && std::time::Instant::now() < deadline =>
                {
                    GlommioRuntime::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => panic!("write failed: {e}"),
            }
        }
    }
    last
}

/// Waits until every node applied `applied`, then checks each store holds `count` messages.
async fn assert_replicated(
    nodes: &[(u64, Raft)],
    stores: &BTreeMap<u64, Store>,
    applied: Option<u64>,
    count: u64,
) {
    for (id, r) in nodes {
        r.wait(Some(Duration::from_secs(5)))
            .applied_index_at_least(applied, "replicated")
            .await
            .unwrap_or_else(|e| panic!("node {id}: {e}"));
        assert_eq!(
            stores[id].counts().unwrap().0,
            count,
            "node {id} stored every message"
        );
    }
}

fn node(nodes: &[(u64, Raft)], id: u64) -> Raft {
    nodes.iter().find(|(n, _)| *n == id).unwrap().1.clone()
}

fn without(nodes: &[(u64, Raft)], id: u64) -> Vec<(u64, Raft)> {
    nodes.iter().filter(|(n, _)| *n != id).cloned().collect()
}

async fn leader_of(nodes: &[(u64, Raft)]) -> u64 {
    for _ in 0..400 {
        for (_, r) in nodes {
            if let Some(l) = r.current_leader().await {
                if nodes.iter().any(|(id, _)| *id == l) {
                    return l;
                }
            }
        }
        GlommioRuntime::sleep(Duration::from_millis(10)).await;
    }
    panic!("no leader elected within 4 s");
}

#[test]
fn three_nodes_elect_replicate_and_fail_over() {
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let config = test_config();
        let router = Router::default();
        let mut nodes = Vec::new();
        let mut stores = BTreeMap::new();
        let mut trackers = BTreeMap::new();
        for id in 1..=3u64 {
            let io = MemLogIo::new();
            // The leader-persist hook: every fsynced entry goes to this node's tracker.
            let tracker = PersistTracker::default();
            trackers.insert(id, tracker.clone());
            let hook: futureq_storage::log::segmented::PersistHook =
                Box::new(move |entry: &[u8]| tracker.persisted(entry));
            let log = LogStore::open(
                move || io.clone(),
                LogConfig {
                    segment_bytes: 64 * 1024,
                    cache_bytes: 8 * 1024,
                },
                hook,
            )
            .await
            .unwrap();
            let store = Store::open(&StoreMode::Memory).unwrap();
            stores.insert(id, store.clone());
            let sm = EventStateMachine::new(store, Rc::new(|_, _| {}));
            let raft = Raft::new(id, Arc::clone(&config), router.clone(), log, sm)
                .await
                .unwrap();
            router.0.borrow_mut().insert(id, raft.clone());
            nodes.push((id, raft));
        }
        let members: BTreeMap<u64, BasicNode> = (1..=3)
            .map(|id| {
                (
                    id,
                    BasicNode {
                        addr: format!("node{id}"),
                    },
                )
            })
            .collect();
        nodes[0].1.initialize(members).await.unwrap();

        let leader = leader_of(&nodes).await;
        let lraft = node(&nodes, leader);
        // LEADER ack: a waiter registered before the proposal fires once the leader's own log
        // has fsynced the entry.
        let probe = encode_store(&StoreBatch {
            items: vec![item(1000)],
        });
        let term = {
            use openraft_rt::watch::WatchReceiver as _;
            lraft.metrics().borrow_watched().current_term
        };
        let persisted = trackers[&leader].register(PersistKey {
            term,
            first_id: 1000,
        });
        lraft
            .client_write_ff(Command(probe.into()), None)
            .await
            .unwrap();
        GlommioRuntime::timeout(Duration::from_secs(5), persisted)
            .await
            .expect("leader-persist hook fired");

        // Ids only ever rise (the state machine refuses lower ones).
        let applied = write(&lraft, 1001..=1100).await;
        assert_replicated(&nodes, &stores, applied, 101).await;
        for id in stores.keys() {
            assert_eq!(stores[id].last_id().unwrap(), 1100);
        }

        // Kill the leader: the others elect a new one and keep accepting writes.
        router.0.borrow_mut().remove(&leader);
        lraft.shutdown().await.unwrap();
        let rest = without(&nodes, leader);
        let new_leader = leader_of(&rest).await;
        assert_ne!(new_leader, leader);
        let nraft = node(&rest, new_leader);
        let applied = write(&nraft, 1101..=1110).await;
        assert_replicated(&rest, &stores, applied, 111).await;

        // A batch carrying ids from an earlier term (a stale proposal committed late):
        // committed, refused by every replica's state machine, the client told so, and the
        // messages stored under those ids untouched.
        let before = stores[&new_leader].get(&futureq_core::EventKey::new(
            futureq_core::TopicHash(7),
            futureq_core::Bucket(1000),
            futureq_core::EventId(1005),
        ));
        let stale = encode_store(&StoreBatch {
            items: (1005..=1006).map(|i| StoreItem { message: b"stale".to_vec(), ..item(i) }).collect(),
        });
        let resp = nraft.client_write(Command(stale.into())).await.unwrap();
        assert!(
            matches!(&resp.data, futureq_raft::types::Applied::Refused(why) if why.contains("1005..=1006")),
            "{:?}",
            resp.data
        );
        assert_replicated(&rest, &stores, Some(resp.log_id.index), 111).await;
        for (id, _) in &rest {
            assert_eq!(
                stores[id].get(&futureq_core::EventKey::new(
            futureq_core::TopicHash(7),
            futureq_core::Bucket(1000),
            futureq_core::EventId(1005),
        )).unwrap(),
                before.as_ref().unwrap().clone(),
                "node {id}"
            );
        }
        for (_, r) in &rest {
            r.shutdown().await.unwrap();
        }
    });
}

/// The same cluster over real loopback TCP: peer links, RPC encodings and the raft handler.
#[test]
fn three_nodes_over_tcp_elect_replicate_and_fail_over() {
    use futureq_net::peer_link::serve_peers;
    use futureq_net::Shutdown;
    use futureq_raft::network::{raft_handler, PeerNetwork, PEER_FRAME_MAX};

    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let config = test_config();
        let mut nodes = Vec::new();
        let mut stores = BTreeMap::new();
        let mut servers = BTreeMap::new();
        let mut members = BTreeMap::new();
        let mut listeners = Vec::new();
        let spool = tempfile::tempdir().unwrap();
        for id in 1..=3u64 {
            let l = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            members.insert(
                id,
                BasicNode {
                    addr: l.local_addr().unwrap().to_string(),
                },
            );
            listeners.push(l);
        }
        for (id, listener) in (1..=3u64).zip(listeners) {
            let io = MemLogIo::new();
            let log = LogStore::open(
                move || io.clone(),
                LogConfig {
                    segment_bytes: 64 * 1024,
                    cache_bytes: 8 * 1024,
                },
                Box::new(|_| {}),
            )
            .await
            .unwrap();
            let store = Store::open(&StoreMode::Memory).unwrap();
            stores.insert(id, store.clone());
            let sm = EventStateMachine::new(store, Rc::new(|_, _| {}));
            let raft = Raft::new(
                id,
                Arc::clone(&config),
                PeerNetwork::new(1, Duration::from_secs(1)),
                log,
                sm,
            )
            .await
            .unwrap();
            let stop = Shutdown::new();
            let receiving = Receiving::new(&spool.path().join(id.to_string()), 1, 1 << 30).unwrap();
            let task = glommio::spawn_local(serve_peers(
                listener,
                raft_handler(1, raft.clone(), receiving),
                PEER_FRAME_MAX,
                futureq_net::peer_link::PeerAuth::default(),
                stop.clone(),
            ));
            servers.insert(id, (stop, task));
            nodes.push((id, raft));
        }
        nodes[0].1.initialize(members).await.unwrap();
        let leader = leader_of(&nodes).await;
        let lraft = node(&nodes, leader);
        let applied = write(&lraft, 1..=50).await;
        assert_replicated(&nodes, &stores, applied, 50).await;
        // Stop the leader's listener and node: the others fail over over TCP.
        let (stop, task) = servers.remove(&leader).unwrap();
        stop.trigger();
        task.await;
        lraft.shutdown().await.unwrap();
        let rest = without(&nodes, leader);
        let new_leader = leader_of(&rest).await;
        let nraft = node(&rest, new_leader);
        let applied = write(&nraft, 51..=60).await;
        assert_replicated(&rest, &stores, applied, 60).await;
        for (_, r) in &rest {
            r.shutdown().await.unwrap();
        }
        for (_, (stop, task)) in servers {
            stop.trigger();
            task.await;
        }
    });
}

/// Issue 10.10: replication is bounded by bytes, not only entries. A follower far behind on
/// large entries catches up although one AppendEntries of openraft's default size would be
/// far over the peer's frame limit.
#[test]
fn a_follower_behind_on_large_entries_catches_up_in_bounded_frames() {
    use futureq_net::peer_link::serve_peers;
    use futureq_net::Shutdown;
    use futureq_raft::network::{raft_handler, PeerNetwork};

    /// The peers' frame limit in this test, and the bytes one AppendEntries may carry.
    const FRAME_MAX: usize = 2 << 20;
    const APPEND_MAX: usize = 512 << 10;
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        let config = test_config();
        let ports: Vec<u16> = (0..3)
            .map(|_| {
                std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port()
            })
            .collect();
        let members: BTreeMap<u64, BasicNode> = (1..=3u64)
            .map(|id| {
                (
                    id,
                    BasicNode {
                        addr: format!("127.0.0.1:{}", ports[id as usize - 1]),
                    },
                )
            })
            .collect();
        let mut stores = BTreeMap::new();
        let mut servers = Vec::new();
        let spool = tempfile::tempdir().unwrap();
        let start = |id: u64| {
            let config = Arc::clone(&config);
            let port = ports[id as usize - 1];
            let spool = spool.path().join(id.to_string());
            async move {
                let io = MemLogIo::new();
                let log = LogStore::open(
                    move || io.clone(),
                    LogConfig {
                        segment_bytes: 16 << 20,
                        cache_bytes: 1 << 20,
                    },
                    Box::new(|_| {}),
                )
                .await
                .unwrap();
                let store = Store::open(&StoreMode::Memory).unwrap();
                let sm = EventStateMachine::new(store.clone(), Rc::new(|_, _| {}));
                let net =
                    PeerNetwork::new(1, Duration::from_secs(2)).with_append_bytes_max(APPEND_MAX);
                let raft = Raft::new(id, config, net, log, sm).await.unwrap();
                let listener = glommio::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
                let stop = Shutdown::new();
                let receiving = Receiving::new(&spool, 1, 1 << 30).unwrap();
                let task = glommio::spawn_local(serve_peers(
                    listener,
                    raft_handler(1, raft.clone(), receiving),
                    FRAME_MAX,
                    futureq_net::peer_link::PeerAuth::default(),
                    stop.clone(),
                ));
                (raft, store, (stop, task))
            }
        };
        let mut nodes = Vec::new();
        for id in 1..=2u64 {
            let (raft, store, server) = start(id).await;
            stores.insert(id, store);
            servers.push(server);
            nodes.push((id, raft));
        }
        nodes[0].1.initialize(members).await.unwrap();
        let leader = leader_of(&nodes).await;
        let lraft = node(&nodes, leader);
        // 60 entries of ~100 KB while node 3 does not exist yet: ~6 MB behind.
        let mut last = None;
        for i in 1..=60u64 {
            let cmd = bytes::Bytes::from(encode_store(&StoreBatch {
                items: vec![StoreItem {
                    message: vec![7; 100_000],
                    ..item(i)
                }],
            }));
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            let index = loop {
                match lraft.client_write(Command(cmd.clone())).await {
                    Ok(r) => break r.log_id.index,
                    Err(openraft::error::RaftError::APIError(
                        openraft::error::ClientWriteError::ForwardToLeader(f),
                    )) if f.leader_id.is_none() && std::time::Instant::now() < deadline => {
                        GlommioRuntime::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("write failed: {e}"),
                }
            };
            last = Some(index);
        }
        let (raft3, store3, server3) = start(3).await;
        stores.insert(3, store3);
        servers.push(server3);
        nodes.push((3, raft3));
        assert_replicated(&nodes, &stores, last, 60).await;
        for (_, r) in &nodes {
            r.shutdown().await.unwrap();
        }
        for (stop, task) in servers {
            stop.trigger();
            task.await;
        }
    });
}
