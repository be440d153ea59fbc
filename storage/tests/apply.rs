//! Applying replicated commands: one transaction per call, validation before any write,
//! replay-safe, ids and applied log id persisted with the data.

use bytes::Bytes;
use futureq_core::command::{encode_delete, encode_store, DeleteBatch, StoreBatch, StoreItem};
use futureq_core::{bucket_of, topic_hash, EventKey, IndexValue, StoredMessage};
use futureq_storage::{Store, StoreError, StoreMode};

fn item(id: u64, ttl_ms: i64) -> StoreItem {
    let m = StoredMessage {
        topic: "t".into(),
        payload: Bytes::from_static(b"p"),
        enqueued_at_ms: 1000,
        delay_ms: 5,
        ttl_ms,
        indexes: vec![IndexValue::Int64(id as i64)],
    };
    StoreItem {
        event_id: id,
        bucket: bucket_of(m.due_at_ms(), 1),
        topic_hash: topic_hash("t"),
        expires_at_ms: m.expires_at_ms().unwrap_or(0),
        index_keys: m.indexes.iter().map(IndexValue::index_key).collect(),
        message: m.encode().to_vec(),
    }
}

fn key(id: u64) -> EventKey {
    EventKey::new(topic_hash("t"), 1005, id)
}

#[test]
fn store_and_delete_commands_apply_atomically_with_the_log_id() {
    let s = Store::open(&StoreMode::Memory).unwrap();
    let store = encode_store(&StoreBatch {
        items: vec![item(7, 0), item(9, 100)],
    });
    let del = encode_delete(&DeleteBatch {
        keys: vec![key(7).0, key(42).0],
    });
    let out = s
        .apply_entries(&[(1, 1, &store), (2, 1, &[]), (3, 2, &del)], false)
        .unwrap();
    assert_eq!(out.stored, 2);
    assert_eq!(
        out.deleted,
        vec![key(7), key(42)],
        "deletes are reported even for absent keys"
    );
    assert_eq!(out.max_event_id, 9);
    assert_eq!(out.applied, Some((3, 2)));
    assert_eq!(s.applied().unwrap(), Some((3, 2)));
    assert_eq!(s.last_id().unwrap(), 9);
    assert_eq!(
        s.counts().unwrap(),
        (1, 1, 1),
        "message 9 with its index and expiry entries"
    );
    assert!(s.get(&key(9)).unwrap().is_some());
}

#[test]
fn a_malformed_entry_fails_the_whole_call() {
    let s = Store::open(&StoreMode::Memory).unwrap();
    let good = encode_store(&StoreBatch {
        items: vec![item(1, 0)],
    });
    let mut bad = encode_store(&StoreBatch {
        items: vec![item(2, 0)],
    });
    bad.truncate(bad.len() - 3);
    let err = s
        .apply_entries(&[(1, 1, &good), (2, 1, &bad)], false)
        .unwrap_err();
    assert!(
        matches!(err, StoreError::BadCommand { index: 2, .. }),
        "{err}"
    );
    assert_eq!(s.counts().unwrap(), (0, 0, 0));
    assert_eq!(s.applied().unwrap(), None);
    assert_eq!(s.last_id().unwrap(), 0);
}

#[test]
fn replayed_entries_are_skipped_and_ids_never_regress() {
    let s = Store::open(&StoreMode::Memory).unwrap();
    let a = encode_store(&StoreBatch {
        items: vec![item(50, 0)],
    });
    s.apply_entries(&[(1, 1, &a)], true).unwrap();
    let del = encode_delete(&DeleteBatch {
        keys: vec![key(50).0],
    });
    s.apply_entries(&[(2, 1, &del)], true).unwrap();
    // A replay of index 1 (e.g. after a restart) must not resurrect the deleted message.
    let out = s.apply_entries(&[(1, 1, &a)], true).unwrap();
    assert_eq!(out.applied, None);
    assert_eq!(s.counts().unwrap().0, 0);
    // A lower id applied later keeps the high-water mark.
    let low = encode_store(&StoreBatch {
        items: vec![item(3, 0)],
    });
    let out = s.apply_entries(&[(3, 1, &low)], true).unwrap();
    assert_eq!(out.max_event_id, 50);
    assert_eq!(s.last_id().unwrap(), 50);
}
