//! What a node refuses at start-up.

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
        let cfg = NodeConfig {
            node_id: 1,
            raft_listen: "127.0.0.1:0".parse().unwrap(),
            raft_advertise: "127.0.0.1:1".into(),
            data_dir: dir.path().to_path_buf(),
            rtt: Duration::from_millis(50),
            snapshot_entries: 100,
            compaction_overhead: 10,
        };
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
