//! openraft's storage conformance suite against our log store (over the in-memory file seam)
//! with each of our state machines: the event shard on redb and the in-memory metadata group.

use std::rc::Rc;

use futureq_raft::log_store::LogStore;
use futureq_raft::metadata_sm::MetaStateMachine;
use futureq_raft::rt::GlommioRuntime;
use futureq_raft::state_machine::EventStateMachine;
use futureq_raft::types::TypeConfig;
use futureq_storage::log::io::MemLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::{Store, StoreMode};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::StorageError;
use openraft_rt::AsyncRuntime;

fn storage_error(e: &dyn std::fmt::Display) -> StorageError<TypeConfig> {
    StorageError::read(TypeConfig::err_from_string(e))
}

/// A fresh log store over in-memory files.
async fn log_store() -> Result<LogStore<MemLogIo>, StorageError<TypeConfig>> {
    let io = MemLogIo::new();
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
