//! openraft's storage conformance suite against our log store (over the in-memory file seam)
//! with each of our state machines: the event shard on redb and the in-memory metadata group.

use std::rc::Rc;

use futureq_raft::codec::RaftLogId;
use futureq_raft::log_store::LogStore;
use futureq_raft::metadata_sm::MetaStateMachine;
use futureq_raft::rt::GlommioRuntime;
use futureq_raft::state_machine::EventStateMachine;
use futureq_raft::types::TypeConfig;
use futureq_raft::types::{Entry, LeaderId};
use futureq_storage::log::io::MemLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::{Store, StoreMode};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::StorageError;
use openraft_rt::AsyncRuntime;

fn storage_error(e: &dyn std::fmt::Display) -> StorageError<TypeConfig> {
    StorageError::read(TypeConfig::err_from_string(e))
}

/// A fresh log store over in-memory files.
async fn log_store() -> Result<LogStore<MemLogIo>, StorageError<TypeConfig>> {
    log_store_on(MemLogIo::new()).await
}

/// A log store over the in-memory files of `io`.
async fn log_store_on(io: MemLogIo) -> Result<LogStore<MemLogIo>, StorageError<TypeConfig>> {
    LogStore::open(
        move || io.clone(),
        LogConfig {
            segment_bytes: 16 * 1024,
            cache_bytes: 2 * 1024,
        },
        Box::new(|_| {}),
    )
    .await
    .map_err(|e| storage_error(&e))
}

struct EventBuilder;

impl StoreBuilder<TypeConfig, LogStore<MemLogIo>, EventStateMachine> for EventBuilder {
    async fn build(
        &self,
    ) -> Result<((), LogStore<MemLogIo>, EventStateMachine), StorageError<TypeConfig>> {
        let db = Store::open(&StoreMode::Memory).map_err(|e| storage_error(&e))?;
        Ok((
            (),
            log_store().await?,
            EventStateMachine::new(db, Rc::new(|_, _| {})),
        ))
    }
}

struct MetaBuilder;

impl StoreBuilder<TypeConfig, LogStore<MemLogIo>, MetaStateMachine> for MetaBuilder {
    async fn build(
        &self,
    ) -> Result<((), LogStore<MemLogIo>, MetaStateMachine), StorageError<TypeConfig>> {
        Ok(((), log_store().await?, MetaStateMachine::default()))
    }
}

#[test]
fn openraft_storage_suite_passes_with_the_event_state_machine() {
    GlommioRuntime::new(1).block_on(async {
        Suite::test_all(EventBuilder).await.expect("storage suite");
    });
}

#[test]
fn openraft_storage_suite_passes_with_the_metadata_state_machine() {
    GlommioRuntime::new(1).block_on(async {
        Suite::test_all(MetaBuilder).await.expect("storage suite");
    });
}

fn log_id(index: u64) -> RaftLogId {
    openraft::LogId {
        leader_id: LeaderId {
            term: 2,
            node_id: 1,
        },
        index,
    }
}

/// A blank entry of term 2 at `index`.
fn blank(index: u64) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: openraft::EntryPayload::Blank,
    }
}

/// CI (the torn-write round of the cluster's disk-fault test refused a restarted node's log:
/// "index out of sequence" at byte 0 of its first segment): what a follower does installing a
/// snapshot over a log of which nothing is committed (openraft truncates it all, then purges
/// up to the snapshot) left the emptied log's segment in place, and the entries after the
/// snapshot were written into it under its old name. They must survive a restart.
#[test]
fn a_log_emptied_for_a_snapshot_reopens_with_the_entries_after_it() {
    GlommioRuntime::new(1).block_on(async {
        let io = MemLogIo::new();
        let mut log = log_store_on(io.clone()).await.unwrap();
        log.blocking_append((0..=5).map(blank)).await.unwrap();
        log.truncate_after(None).await.unwrap();
        log.purge(log_id(9)).await.unwrap();
        log.blocking_append((10..=12).map(blank)).await.unwrap();
        drop(log);
        let mut log = log_store_on(io.crash()).await.unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(
            (state.last_purged_log_id, state.last_log_id),
            (Some(log_id(9)), Some(log_id(12)))
        );
        let got: Vec<u64> = log
            .try_get_log_entries(10..=12)
            .await
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect();
        assert_eq!(got, vec![10, 11, 12]);
    });
}

/// A purge cut short by a crash (its marker saved, some segments not yet removed) is finished
/// at the next open: the log never reports a last entry below what it purged.
#[test]
fn a_purge_cut_short_by_a_crash_is_finished_at_open() {
    GlommioRuntime::new(1).block_on(async {
        let io = MemLogIo::new();
        let mut log = log_store_on(io.clone()).await.unwrap();
        log.blocking_append((0..=5).map(blank)).await.unwrap();
        let segment = format!("{:020}.log", 0);
        let image = io.file(&segment).unwrap();
        log.purge(log_id(9)).await.unwrap();
        drop(log);
        let crashed = io.crash();
        crashed.set_file(&segment, image);
        let mut log = log_store_on(crashed.clone()).await.unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(
            (state.last_purged_log_id, state.last_log_id),
            (Some(log_id(9)), Some(log_id(9)))
        );
        assert!(crashed.file(&segment).is_none(), "the purge was finished");
    });
}

/// Issue 29 (a leader fenced itself during a disk stall): openraft awaits a purge in its core,
/// where AppendEntries and heartbeats are answered, so a purge answers once the log forgot the
/// segments, and their files (each a directory fsync, which can wait behind seconds of the
/// file system's dirty data) are removed after. A follower answered nothing until its purge's
/// removals were through.
#[test]
fn a_purge_does_not_wait_for_its_file_removals() {
    GlommioRuntime::new(1).block_on(async {
        let io = MemLogIo::new();
        let mut log = log_store_on(io.clone()).await.unwrap();
        log.blocking_append((0..=2000).map(blank)).await.unwrap();
        let segments = || {
            let io = io.clone();
            async move {
                use futureq_storage::log::io::LogIo as _;
                let names = io.list().await.unwrap();
                names.iter().filter(|n| n.ends_with(".log")).count()
            }
        };
        let before = segments().await;
        assert!(before > 2, "{before} segments");
        io.hold_removals(true);
        log.purge(log_id(1500)).await.unwrap();
        assert!(
            io.removals_waiting() > 0,
            "the purge returned after its removals"
        );
        assert_eq!(segments().await, before);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1500)));
        io.hold_removals(false);
        for _ in 0..100 {
            if segments().await < before {
                break;
            }
            GlommioRuntime::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(segments().await < before, "the purged segments are removed");
        let read = log.try_get_log_entries(1501..1503).await.unwrap();
        assert_eq!(read.len(), 2);
    });
}
