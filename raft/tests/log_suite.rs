//! openraft's storage conformance suite against our log store (over the in-memory file
//! seam), with a minimal in-memory state machine: it checks the log side of the contract.

use std::cell::RefCell;
use std::io::Cursor;
use std::rc::Rc;

use futureq_raft::log_store::LogStore;
use futureq_raft::rt::GlommioRuntime;
use futureq_raft::types::TypeConfig;
use futureq_storage::log::io::MemLogIo;
use futureq_storage::log::LogConfig;
use futures::StreamExt;
use openraft::storage::{
    EntryResponder, RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta,
};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{EntryPayload, RaftTypeConfig, StorageError, StoredMembership};
use openraft_rt::AsyncRuntime;

type LogIdC = <TypeConfig as RaftTypeConfig>::Entry;
type Membership =
    StoredMembership<openraft::impls::leader_id_adv::LeaderId<u64, u64>, u64, openraft::BasicNode>;
type Meta =
    SnapshotMeta<openraft::impls::leader_id_adv::LeaderId<u64, u64>, u64, openraft::BasicNode>;

#[derive(Default)]
struct SmState {
    applied: Option<openraft::LogId<openraft::impls::leader_id_adv::LeaderId<u64, u64>>>,
    membership: Membership,
    snapshot: Option<(Meta, Vec<u8>)>,
}

#[derive(Clone, Default)]
struct MemSm(Rc<RefCell<SmState>>);

impl RaftSnapshotBuilder<TypeConfig> for MemSm {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<
        Snapshot<
            openraft::impls::leader_id_adv::LeaderId<u64, u64>,
            u64,
            openraft::BasicNode,
            Cursor<Vec<u8>>,
        >,
        std::io::Error,
    > {
        let mut st = self.0.borrow_mut();
        let meta = Meta {
            last_log_id: st.applied,
            last_membership: st.membership.clone(),
        };
        let data = format!("{:?}", st.applied).into_bytes();
        st.snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for MemSm {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<openraft::LogId<openraft::impls::leader_id_adv::LeaderId<u64, u64>>>,
            Membership,
        ),
        std::io::Error,
    > {
        let st = self.0.borrow();
        Ok((st.applied, st.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), std::io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, std::io::Error>> + Unpin,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder): (LogIdC, _) = item?;
            {
                let mut st = self.0.borrow_mut();
                st.applied = Some(entry.log_id);
                if let EntryPayload::Membership(m) = &entry.payload {
                    st.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                }
            }
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Self::SnapshotData,
    ) -> Result<(), std::io::Error> {
        let mut st = self.0.borrow_mut();
        st.applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        st.snapshot = Some((meta.clone(), snapshot.into_inner()));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<
        Option<
            Snapshot<
                openraft::impls::leader_id_adv::LeaderId<u64, u64>,
                u64,
                openraft::BasicNode,
                Cursor<Vec<u8>>,
            >,
        >,
        std::io::Error,
    > {
        Ok(self
            .0
            .borrow()
            .snapshot
            .clone()
            .map(|(meta, data)| Snapshot {
                meta,
                snapshot: Cursor::new(data),
            }))
    }
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore<MemLogIo>, MemSm> for Builder {
    async fn build(&self) -> Result<((), LogStore<MemLogIo>, MemSm), StorageError<TypeConfig>> {
        let io = MemLogIo::new();
        let store = LogStore::open(
            move || io.clone(),
            LogConfig {
                segment_bytes: 16 * 1024,
            },
            Box::new(|_| {}),
        )
        .await
        .map_err(|e| {
            StorageError::read(
                <TypeConfig as openraft::type_config::TypeConfigExt>::err_from_error(&e),
            )
        })?;
        Ok(((), store, MemSm::default()))
    }
}

#[test]
fn openraft_log_storage_suite_passes() {
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        Suite::test_all(Builder).await.expect("storage suite");
    });
}

struct EventBuilder;

impl StoreBuilder<TypeConfig, LogStore<MemLogIo>, futureq_raft::state_machine::EventStateMachine>
    for EventBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            (),
            LogStore<MemLogIo>,
            futureq_raft::state_machine::EventStateMachine,
        ),
        StorageError<TypeConfig>,
    > {
        let err = |e: &dyn std::fmt::Display| {
            StorageError::read(
                <TypeConfig as openraft::type_config::TypeConfigExt>::err_from_string(e),
            )
        };
        let io = MemLogIo::new();
        let store = LogStore::open(
            move || io.clone(),
            LogConfig {
                segment_bytes: 16 * 1024,
            },
            Box::new(|_| {}),
        )
        .await
        .map_err(|e| err(&e))?;
        let db = futureq_storage::Store::open(&futureq_storage::StoreMode::Memory)
            .map_err(|e| err(&e))?;
        Ok((
            (),
            store,
            futureq_raft::state_machine::EventStateMachine::new(db, Rc::new(|_| {})),
        ))
    }
}

#[test]
fn openraft_storage_suite_passes_with_the_event_state_machine() {
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        Suite::test_all(EventBuilder).await.expect("storage suite");
    });
}

struct MetaBuilder;

impl StoreBuilder<TypeConfig, LogStore<MemLogIo>, futureq_raft::metadata_sm::MetaStateMachine>
    for MetaBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            (),
            LogStore<MemLogIo>,
            futureq_raft::metadata_sm::MetaStateMachine,
        ),
        StorageError<TypeConfig>,
    > {
        let io = MemLogIo::new();
        let store = LogStore::open(
            move || io.clone(),
            LogConfig {
                segment_bytes: 16 * 1024,
            },
            Box::new(|_| {}),
        )
        .await
        .map_err(|e| {
            StorageError::read(
                <TypeConfig as openraft::type_config::TypeConfigExt>::err_from_error(&e),
            )
        })?;
        Ok((
            (),
            store,
            futureq_raft::metadata_sm::MetaStateMachine::default(),
        ))
    }
}

#[test]
fn openraft_storage_suite_passes_with_the_metadata_state_machine() {
    let mut rt = GlommioRuntime::new(1);
    rt.block_on(async {
        Suite::test_all(MetaBuilder).await.expect("storage suite");
    });
}
