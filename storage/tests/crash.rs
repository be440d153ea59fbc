//! Crash consistency of the store: a child process (this test binary, re-executed) works on a
//! real redb file and aborts at a chosen point, like a kill -9; the parent reopens the file
//! and checks what survived.

use std::path::Path;
use std::process::Command;

use futureq_core::command::{encode_store, StoreBatch, StoreItem};
use futureq_storage::{Store, StoreMode};

const CHILD: &str = "FUTUREQ_STORAGE_CRASH_CHILD";
/// Snapshots per child run.
const SNAPSHOTS: usize = 50;

fn item(id: u64) -> StoreItem {
    StoreItem {
        event_id: id,
        bucket: 1,
        topic_hash: 7,
        expires_at_ms: 0,
        index_keys: vec![],
        message: vec![1; 64],
    }
}

fn open(dir: &Path) -> Store {
    Store::open(&StoreMode::Disk(dir.to_path_buf(), 1 << 20)).unwrap()
}

/// The child: applies entries without fsync on one thread while another takes a snapshot
/// for the log's purge; writes the snapshot's applied index to `snap-index` and aborts.
fn child(dir: &Path) {
    let store = open(dir);
    {
        // Runs until the abort below.
        let store = store.clone();
        std::thread::spawn(move || {
            let mut index = 1u64;
            loop {
                let cmd = encode_store(&StoreBatch {
                    items: vec![item(index)],
                });
                store
                    .apply_entries(&[(index, 1, &cmd)], &[], false)
                    .unwrap();
                index += 1;
            }
        });
    }
    // Snapshots while non-durable applies go on; the newest one is what the log may be
    // purged to.
    let mut index = 0;
    for _ in 0..SNAPSHOTS {
        let info = store.durable_snapshot().unwrap().info().clone();
        index = info.applied.map_or(0, |(i, _)| i);
    }
    std::fs::write(dir.join("snap-index"), index.to_string()).unwrap();
    // A crash: no destructor, no flush.
    std::process::abort();
}

/// Issue 10.2: the Raft log is purged up to a snapshot's applied index, so that index must
/// be durable in the store before the snapshot is handed out — else a crash right after
/// leaves the replica without entries it can no longer replay.
#[test]
fn a_snapshot_for_purging_never_claims_more_than_is_durable() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(Path::new(&dir));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for round in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(&exe)
            .args([
                "--exact",
                "a_snapshot_for_purging_never_claims_more_than_is_durable",
                "--nocapture",
            ])
            .env(CHILD, dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "the child aborts");
        let snap: u64 = std::fs::read_to_string(dir.path().join("snap-index"))
            .unwrap_or_else(|_| panic!("child output: {}", String::from_utf8_lossy(&out.stderr)))
            .parse()
            .unwrap();
        let durable = open(dir.path()).applied().unwrap().map_or(0, |(i, _)| i);
        assert!(
            durable >= snap,
            "round {round}: the snapshot claims index {snap} but only {durable} survived the crash"
        );
    }
}
