//! Store and store-service behaviour on a real redb file.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futureq_core::hub::ScanRequest;
use futureq_core::{bucket_of, topic_hash, EventKey, IndexValue, StoredMessage};
use futureq_storage::{NewMessage, Store, StoreMode, StoreService};
use futures::executor::block_on;

fn new_message(
    topic: &str,
    enq: i64,
    delay: i64,
    ttl: i64,
    indexes: Vec<IndexValue>,
) -> NewMessage {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let m = StoredMessage {
        topic: topic.into(),
        payload: Bytes::from_static(b"payload"),
        enqueued_at_ms: enq,
        delay_ms: delay,
        ttl_ms: ttl,
        indexes,
    };
    NewMessage {
        key: EventKey::new(topic_hash(topic), bucket_of(m.due_at_ms(), 1), id),
        expires_at_ms: m.expires_at_ms(),
        index_keys: m.indexes.iter().map(IndexValue::index_key).collect(),
        value: m.encode(),
    }
}

fn scan_all(s: &Store, topic: &str, now: i64) -> futureq_core::hub::ScanResult {
    let h = topic_hash(topic);
    s.scan(&ScanRequest {
        topic_hash: h,
        from: EventKey::topic_start(h),
        upper: EventKey::bucket_start(h, bucket_of(now, 1) + 1),
        limit: 100,
        catch_up: None,
    })
    .unwrap()
}

#[test]
fn ids_are_monotonic_and_never_regress_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mode = StoreMode::Disk(dir.path().to_path_buf(), 16 << 20);
    let mut last = 0u64;
    for _ in 0..3 {
        let (svc, threads) = StoreService::start(&mode, Box::new(|_| {})).unwrap();
        assert_eq!(
            svc.last_id_at_open(),
            last,
            "the high-water mark survives the restart"
        );
        let batch: Vec<_> = (0..3).map(|_| new_message("t", 1, 0, 0, vec![])).collect();
        let keys = block_on(svc.publish(batch.clone(), true)).unwrap();
        last = keys.iter().map(EventKey::event_id).max().unwrap();
        assert_eq!(svc.store().last_id().unwrap(), last);
        // An older id committed later never lowers the mark.
        let mut old = new_message("t", 1, 0, 0, vec![]);
        old.key = EventKey::new(old.key.topic_hash(), old.key.bucket(), 1);
        block_on(svc.publish(vec![old], true)).unwrap();
        assert_eq!(svc.store().last_id().unwrap(), last);
        drop(svc);
        threads.join();
    }
}

#[test]
fn scan_reads_only_the_due_range_and_reports_the_next_key() {
    let (svc, _t) = StoreService::start(&StoreMode::Memory, Box::new(|_| {})).unwrap();
    block_on(svc.publish(
        vec![
            new_message("a", 1000, 0, 0, vec![]),
            new_message("a", 1000, 500, 0, vec![]),
            new_message("b", 1000, 0, 0, vec![]),
        ],
        true,
    ))
    .unwrap();
    let r = scan_all(svc.store(), "a", 1200);
    assert_eq!(r.items.len(), 1);
    assert!(r.exhausted);
    assert_eq!(r.next_key.map(|k| k.bucket()), Some(1500));
    let r = scan_all(svc.store(), "a", 1500);
    assert_eq!(r.items.len(), 2);
    assert_eq!(r.next_key, None, "topic b is not part of topic a's range");
}

#[test]
fn delete_and_sweep_remove_index_and_expiry_entries() {
    let (svc, _t) = StoreService::start(&StoreMode::Memory, Box::new(|_| {})).unwrap();
    let idx = vec![IndexValue::Int64(7), IndexValue::String("order-1".into())];
    let keys = block_on(svc.publish(
        vec![
            new_message("t", 1000, 0, 100, idx.clone()),
            new_message("t", 1000, 0, 5000, idx.clone()),
            new_message("t", 1000, 0, 0, idx),
        ],
        true,
    ))
    .unwrap();
    assert_eq!(svc.store().counts().unwrap(), (3, 6, 2));
    let expired = block_on(svc.sweep_expired(1099, 100)).unwrap();
    assert!(expired.is_empty());
    let expired = block_on(svc.sweep_expired(1100, 100)).unwrap();
    assert_eq!(expired, vec![keys[0]]);
    assert_eq!(svc.store().counts().unwrap(), (2, 4, 1));
    let deleted = block_on(svc.delete(vec![keys[1], keys[0]])).unwrap();
    assert_eq!(
        deleted,
        vec![keys[1]],
        "an already deleted key is not reported"
    );
    assert_eq!(svc.store().counts().unwrap(), (1, 2, 0));
    // Every standalone write path keeps the digest in step with the rows.
    let s = svc.store();
    assert_ne!(s.digest(), 0);
    assert_eq!(s.digest(), s.computed_digest().unwrap());
    s.register_group(topic_hash("t"), "g").unwrap();
    assert_eq!(s.digest(), s.computed_digest().unwrap());
    block_on(svc.delete(vec![keys[2]])).unwrap();
    s.register_group(topic_hash("t"), "g").unwrap();
    let only_group = s.digest();
    assert_eq!(only_group, s.computed_digest().unwrap());
    assert_ne!(only_group, 0, "the group's row");
}

#[test]
fn commit_hook_sees_the_smallest_key_per_topic() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (svc, _t) = StoreService::start(
        &StoreMode::Memory,
        Box::new(move |mins| {
            tx.send(mins.to_vec()).unwrap();
        }),
    )
    .unwrap();
    let keys = block_on(svc.publish(
        vec![
            new_message("t", 1000, 50, 0, vec![]),
            new_message("t", 1000, 10, 0, vec![]),
        ],
        false,
    ))
    .unwrap();
    let mins = rx.recv().unwrap();
    assert_eq!(mins, vec![keys[1]]);
}

#[test]
fn concurrent_publishes_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (svc, _t) = StoreService::start(
        &StoreMode::Disk(dir.path().to_path_buf(), 16 << 20),
        Box::new(|_| {}),
    )
    .unwrap();
    let futs: Vec<_> = (0..200)
        .map(|_| svc.publish(vec![new_message("t", 1, 0, 0, vec![])], true))
        .collect();
    let all = block_on(futures::future::join_all(futs));
    assert!(all.iter().all(Result::is_ok));
    let commits = svc
        .stats()
        .commits
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        commits < 200,
        "200 concurrent batches took {commits} commits"
    );
}

#[test]
fn scan_stops_at_the_byte_bound() {
    let (svc, _t) = StoreService::start(&StoreMode::Memory, Box::new(|_| {})).unwrap();
    let big: Vec<NewMessage> = (0..12)
        .map(|_| {
            let mut m = new_message("big", 1000, 0, 0, vec![]);
            let stored = StoredMessage {
                topic: "big".into(),
                payload: Bytes::from(vec![7u8; 1 << 20]),
                enqueued_at_ms: 1000,
                delay_ms: 0,
                ttl_ms: 0,
                indexes: vec![],
            };
            m.value = stored.encode();
            m
        })
        .collect();
    block_on(svc.publish(big, true)).unwrap();
    let r = scan_all(svc.store(), "big", 2000);
    assert!(
        !r.exhausted,
        "a scan past SCAN_BYTES_MAX reports more to come"
    );
    let bytes: usize = r.items.iter().map(|(_, m)| m.payload.len()).sum();
    assert!(
        bytes >= futureq_core::hub::SCAN_BYTES_MAX && r.items.len() < 12,
        "{} items",
        r.items.len()
    );
}
