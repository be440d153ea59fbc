//! Applying a long run of committed entries (a node replaying its log after a restart, a
//! follower far behind) holds a bounded piece of it at a time: the log store reads the range
//! as the state machine consumes it, and the state machine commits it in several
//! transactions, never the whole run in memory at once.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use futureq_core::command::{encode_store, StoreBatch, StoreItem};
use futureq_raft::log_store::{LogStore, APPLY_READ_BYTES};
use futureq_raft::rt::GlommioRuntime;
use futureq_raft::state_machine::{EventStateMachine, APPLY_TXN_BYTES};
use futureq_raft::types::{Command, Entry, LeaderId};
use futureq_storage::log::io::MemLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::{Store, StoreMode};
use futures::StreamExt;
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, LogId};
use openraft_rt::AsyncRuntime;

/// Entries of one message each, this long.
const ENTRY_BYTES: usize = 1 << 20;
/// Enough entries for several pieces of either bound.
const ENTRIES: u64 = 40;

fn entry(index: u64) -> Entry {
    let cmd = encode_store(&StoreBatch {
        items: vec![StoreItem {
            event_id: index,
            bucket: 1000,
            topic_hash: 7,
            expires_at_ms: 0,
            index_keys: vec![],
            message: vec![u8::try_from(index % 251).unwrap(); ENTRY_BYTES],
        }],
    });
    Entry {
        log_id: LogId {
            leader_id: LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        },
        payload: EntryPayload::Normal(Command(cmd.into())),
    }
}

#[test]
fn a_long_run_of_committed_entries_is_read_and_applied_a_bounded_piece_at_a_time() {
    const {
        assert!(ENTRY_BYTES * 4 <= APPLY_READ_BYTES && APPLY_READ_BYTES * 4 <= ENTRY_BYTES * 40);
        assert!(ENTRY_BYTES * 4 <= APPLY_TXN_BYTES && APPLY_TXN_BYTES * 4 <= ENTRY_BYTES * 40);
    }
    GlommioRuntime::new(1).block_on(async {
        let io = MemLogIo::new();
        let files = io.clone();
        let mut log = LogStore::open(
            move || files.clone(),
            LogConfig {
                segment_bytes: futureq_storage::log::SEGMENT_BYTES,
                cache_bytes: 0,
            },
            Box::new(|_| {}),
        )
        .await
        .unwrap();
        log.blocking_append((1..=ENTRIES).map(entry)).await.unwrap();

        // The stream reads as it is consumed: after the first entry, about one piece was read
        // (openraft's default read the whole range first).
        let mut reader = log.get_log_reader().await;
        let before = io.reads();
        let mut stream = Box::pin(reader.entries_stream(1..=ENTRIES).await);
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.log_id.index, 1);
        let read = io.reads() - before;
        assert!(
            read <= APPLY_READ_BYTES / ENTRY_BYTES + 2,
            "{read} reads before the first entry of {ENTRIES}"
        );
        let rest: Vec<u64> = stream.map(|e| e.unwrap().log_id.index).collect().await;
        assert_eq!(
            rest,
            (2..=ENTRIES).collect::<Vec<_>>(),
            "every entry, in order"
        );

        // Ranges the log does not hold all of end early, never loop.
        let beyond: Vec<u64> = reader
            .entries_stream(ENTRIES - 1..ENTRIES + 10)
            .await
            .map(|e| e.unwrap().log_id.index)
            .collect()
            .await;
        assert_eq!(beyond, vec![ENTRIES - 1, ENTRIES]);
        let empty = reader.entries_stream(5..5).await.count().await;
        assert_eq!(empty, 0);
        let from_7: Vec<u64> = reader
            .entries_stream((std::ops::Bound::Excluded(6), std::ops::Bound::Unbounded))
            .await
            .map(|e| e.unwrap().log_id.index)
            .collect()
            .await;
        assert_eq!(from_7, (7..=ENTRIES).collect::<Vec<_>>());

        // The state machine commits the run in several transactions, all of it applied.
        let store = Store::open(&StoreMode::Memory).unwrap();
        let mut sm = EventStateMachine::new(store.clone(), Rc::new(|_, _| {}));
        let entries = reader
            .entries_stream(1..=ENTRIES)
            .await
            .map(|e| e.map(|e| (e, None)));
        sm.apply(Box::pin(entries)).await.unwrap();
        let txns = store.stats().transactions.load(Ordering::Relaxed);
        assert_eq!(store.stats().entries.load(Ordering::Relaxed), ENTRIES);
        let whole = u64::try_from(ENTRY_BYTES).unwrap() * ENTRIES;
        let per_txn = u64::try_from(APPLY_TXN_BYTES).unwrap();
        assert!(
            txns >= whole / (per_txn + u64::try_from(ENTRY_BYTES).unwrap()),
            "{txns} transactions for {ENTRIES} entries of 1 MiB"
        );
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|id| id.index), Some(ENTRIES));
        assert_eq!(store.last_id().unwrap(), ENTRIES);

        // A range reaching below what the log holds is an error, not a silent skip.
        log.purge(entry(10).log_id).await.unwrap();
        let mut after_purge = Box::pin(reader.entries_stream(5..=20).await);
        assert!(after_purge.next().await.unwrap().is_err());
        assert!(
            after_purge.next().await.is_none(),
            "nothing after the error"
        );
    });
}
