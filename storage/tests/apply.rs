//! Applying replicated commands: one transaction per call, validation before any write,
//! replay-safe, ids and applied log id persisted with the data.

use bytes::Bytes;
use futureq_core::command::{
    encode_delete, encode_register_group, encode_store, DeleteBatch, RegisterGroup, StoreBatch,
    StoreItem,
};
use futureq_core::{bucket_of, topic_hash, EventKey, IndexValue, StoredMessage};
use futureq_storage::{Refusal, Store, StoreError, StoreMode};

fn item(id: u64, ttl_ms: i64) -> StoreItem {
    let m = StoredMessage {
        topic: "t".into(),
        payload: Bytes::from_static(b"p"),
        enqueued_at_ms: 1000,
        delay: futureq_core::DelayMs(5),
        ttl: futureq_core::TtlMs(ttl_ms),
        indexes: vec![IndexValue::Int64(id as i64)],
        extras: Default::default(),
    };
    StoreItem {
        event_id: id,
        bucket: bucket_of(m.due_at_ms(), 1).0,
        topic_hash: topic_hash("t").0,
        expires_at_ms: m.expires_at_ms().unwrap_or(0),
        index_keys: m.indexes.iter().map(IndexValue::index_key).collect(),
        message: m.encode().to_vec(),
    }
}

fn key(id: u64) -> EventKey {
    EventKey::new(
        topic_hash("t"),
        futureq_core::Bucket(1005),
        futureq_core::EventId(id),
    )
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
        .apply_entries(&[(1, 1, &store), (2, 1, &[]), (3, 2, &del)], &[], false)
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
fn a_malformed_entry_is_skipped_deterministically_and_never_fatal() {
    let s = Store::open(&StoreMode::Memory).unwrap();
    let good = encode_store(&StoreBatch {
        items: vec![item(1, 0)],
    });
    let mut bad = encode_store(&StoreBatch {
        items: vec![item(2, 0)],
    });
    bad.truncate(bad.len() - 3);
    let later = encode_store(&StoreBatch {
        items: vec![item(3, 0)],
    });
    let out = s
        .apply_entries(&[(1, 1, &good), (2, 1, &bad), (3, 1, &later)], &[], false)
        .unwrap();
    assert_eq!(out.refused.len(), 1, "{:?}", out.refused);
    assert_eq!(out.refused[0].0, 2);
    assert!(matches!(out.refused[0].1, Refusal::Undecodable { .. }));
    assert_eq!(out.stored, 2);
    assert_eq!(s.counts().unwrap().0, 2);
    assert!(s.get(&key(2)).unwrap().is_none());
    assert_eq!(s.applied().unwrap(), Some((3, 1)), "the log moves on");
    assert_eq!(s.last_id().unwrap(), 3);
}

/// Issue 10.1: leader A (term 1) assigned ids 1000..=1099 and its proposal waited; leader B
/// (term 2) assigned the same ids and committed; A, leading again in term 3, commits its
/// stale batch. Every replica must refuse it: the acked messages of B stay as they were.
#[test]
fn a_batch_with_ids_from_an_earlier_term_is_refused_and_changes_nothing() {
    let s = Store::open(&StoreMode::Memory).unwrap();
    let mut b_items: Vec<StoreItem> = (1000..1100).map(|i| item(i, 100)).collect();
    for it in &mut b_items {
        it.message = b"from leader B".to_vec();
    }
    let from_b = encode_store(&StoreBatch { items: b_items });
    s.apply_entries(&[(5, 2, &from_b)], &[], false).unwrap();
    let stored_b = s.get(&key(1000)).unwrap();
    let counts = s.counts().unwrap();

    let stale_a = encode_store(&StoreBatch {
        items: (1000..1100).map(|i| item(i, 0)).collect(),
    });
    // Overlapping, and below-but-disjoint: both refused.
    let low = encode_store(&StoreBatch {
        items: vec![item(10, 0)],
    });
    let out = s
        .apply_entries(&[(6, 3, &stale_a), (7, 3, &low)], &[], false)
        .unwrap();
    assert_eq!(out.stored, 0);
    assert_eq!(out.refused.len(), 2);
    assert_eq!(
        out.refused[0],
        (
            6,
            Refusal::StaleIds {
                first: 1000,
                last: 1099,
                max: 1099
            }
        )
    );
    assert_eq!(s.get(&key(1000)).unwrap(), stored_b, "B's message intact");
    assert_eq!(s.counts().unwrap(), counts, "no stale expiry/index rows");
    assert_eq!(s.applied().unwrap(), Some((7, 3)));

    // Ids out of order inside one batch are refused whole.
    let unordered = encode_store(&StoreBatch {
        items: vec![item(2001, 0), item(2000, 0)],
    });
    let out = s.apply_entries(&[(8, 3, &unordered)], &[], false).unwrap();
    assert_eq!(out.refused.len(), 1);
    assert!(s.get(&key(2001)).unwrap().is_none());
    // And a fresh batch above the mark goes in.
    let fresh = encode_store(&StoreBatch {
        items: vec![item(1100, 0)],
    });
    let out = s.apply_entries(&[(9, 3, &fresh)], &[], false).unwrap();
    assert!(out.refused.is_empty());
    assert_eq!(s.last_id().unwrap(), 1100);
}

#[test]
fn replayed_entries_are_skipped_and_ids_never_regress() {
    let s = Store::open(&StoreMode::Memory).unwrap();
    let a = encode_store(&StoreBatch {
        items: vec![item(50, 0)],
    });
    s.apply_entries(&[(1, 1, &a)], &[], true).unwrap();
    let del = encode_delete(&DeleteBatch {
        keys: vec![key(50).0],
    });
    s.apply_entries(&[(2, 1, &del)], &[], true).unwrap();
    // A replay of index 1 (e.g. after a restart) must not resurrect the deleted message.
    let out = s.apply_entries(&[(1, 1, &a)], &[], true).unwrap();
    assert_eq!(out.applied, None);
    assert_eq!(s.counts().unwrap().0, 0);
    // A lower id applied later is refused and keeps the high-water mark.
    let low = encode_store(&StoreBatch {
        items: vec![item(3, 0)],
    });
    let out = s.apply_entries(&[(3, 1, &low)], &[], true).unwrap();
    assert_eq!(out.refused.len(), 1);
    assert_eq!(out.max_event_id, 50);
    assert_eq!(s.last_id().unwrap(), 50);
}

#[test]
fn snapshots_round_trip_and_replace_everything() {
    let src = Store::open(&StoreMode::Memory).unwrap();
    let a = encode_store(&StoreBatch {
        items: (1..=50)
            .map(|i| item(i, if i % 2 == 0 { 500 } else { 0 }))
            .collect(),
    });
    src.apply_entries(&[(4, 2, &a)], &[("membership", b"m1")], false)
        .unwrap();
    assert_eq!(
        src.raft_meta("membership").unwrap().as_deref(),
        Some(&b"m1"[..])
    );
    let mut snap = Vec::new();
    assert_eq!(src.write_snapshot(&mut snap).unwrap().applied, Some((4, 2)));

    let dst = Store::open(&StoreMode::Memory).unwrap();
    // Something the snapshot must replace.
    let old = encode_store(&StoreBatch {
        items: vec![item(999, 0)],
    });
    dst.apply_entries(&[(1, 1, &old)], &[], false).unwrap();
    dst.install_snapshot(&mut snap.as_slice(), Some((4, 2)))
        .unwrap();
    assert_eq!(dst.counts().unwrap(), src.counts().unwrap());
    assert_eq!(dst.applied().unwrap(), Some((4, 2)));
    assert_eq!(dst.last_id().unwrap(), 50);
    assert!(dst.get(&key(999)).unwrap().is_none());
    assert_eq!(
        dst.raft_meta("membership").unwrap().as_deref(),
        Some(&b"m1"[..]),
        "raft state travels with the snapshot"
    );
    assert_eq!(dst.get(&key(10)).unwrap(), src.get(&key(10)).unwrap());
}

#[test]
fn bad_snapshots_change_nothing() {
    let src = Store::open(&StoreMode::Memory).unwrap();
    let a = encode_store(&StoreBatch {
        items: (1..=5).map(|i| item(i, 0)).collect(),
    });
    src.apply_entries(&[(3, 1, &a)], &[], false).unwrap();
    let mut snap = Vec::new();
    src.write_snapshot(&mut snap).unwrap();

    let dst = Store::open(&StoreMode::Memory).unwrap();
    let keep = encode_store(&StoreBatch {
        items: vec![item(77, 0)],
    });
    dst.apply_entries(&[(1, 1, &keep)], &[], false).unwrap();
    let before = (dst.counts().unwrap(), dst.applied().unwrap());
    // Wrong applied id, truncation at every length, garbage.
    assert!(matches!(
        dst.install_snapshot(&mut snap.as_slice(), Some((9, 9))),
        Err(StoreError::BadSnapshot(_))
    ));
    for cut in [0, 7, 8, 20, 32, snap.len() / 2, snap.len() - 1] {
        assert!(
            dst.install_snapshot(&mut &snap[..cut], Some((3, 1)))
                .is_err(),
            "cut {cut}"
        );
    }
    let mut junk = snap.clone();
    junk[33] = 9; // unknown table id in the first record
    assert!(dst
        .install_snapshot(&mut junk.as_slice(), Some((3, 1)))
        .is_err());
    assert_eq!((dst.counts().unwrap(), dst.applied().unwrap()), before);
}

/// Issue 12: a snapshot is a stream read from one read transaction, one bounded piece at a
/// time (never the whole store in memory), and later commits do not change it.
#[test]
fn a_snapshot_streams_in_bounded_pieces_from_one_version() {
    use futureq_storage::snapshot::SNAPSHOT_PIECE_BYTES;
    use std::io::Read as _;
    let src = Store::open(&StoreMode::Memory).unwrap();
    let big = |id: u64| {
        let mut it = item(id, 0);
        let mut m = StoredMessage::decode(&Bytes::from(it.message.clone())).unwrap();
        m.payload = Bytes::from(vec![b'x'; 2000]);
        it.message = m.encode().to_vec();
        it
    };
    // ~6 MiB: several pieces.
    for chunk in 0..30u64 {
        let cmd = encode_store(&StoreBatch {
            items: (1..=100).map(|i| big(chunk * 100 + i)).collect(),
        });
        src.apply_entries(&[(chunk + 1, 1, &cmd)], &[("membership", b"m")], false)
            .unwrap();
    }
    let mut before = Vec::new();
    src.write_snapshot(&mut before).unwrap();
    assert!(before.len() > 4 * SNAPSHOT_PIECE_BYTES, "{}", before.len());

    let mut reader = src.snapshot().unwrap();
    assert_eq!(reader.info().applied, Some((30, 1)));
    // Commits after the reader began are not in its stream.
    let later = encode_store(&StoreBatch {
        items: vec![big(5000)],
    });
    let del = encode_delete(&DeleteBatch {
        keys: vec![key(1).0, key(2).0],
    });
    src.apply_entries(&[(31, 1, &later), (32, 1, &del)], &[], false)
        .unwrap();

    let mut streamed = Vec::new();
    let mut buf = vec![0u8; 4 * SNAPSHOT_PIECE_BYTES];
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        // One read hands out at most one piece: a piece is the size asked for plus at most
        // one record.
        assert!(n <= SNAPSHOT_PIECE_BYTES + 4096, "a read of {n} bytes");
        streamed.extend_from_slice(&buf[..n]);
    }
    assert_eq!(
        streamed, before,
        "the stream is the store as of the reader's start"
    );
    let mut after = Vec::new();
    src.write_snapshot(&mut after).unwrap();
    assert_ne!(after, before);

    // Installing straight from a reader (a stream, not a buffer) gives the same store.
    let dst = Store::open(&StoreMode::Memory).unwrap();
    dst.install_snapshot(&mut src.snapshot().unwrap(), Some((32, 1)))
        .unwrap();
    assert_eq!(dst.counts().unwrap(), src.counts().unwrap());
    assert_eq!(dst.digest(), src.digest());
    // Small reads see the same bytes.
    let mut small = Vec::new();
    let mut r = src.snapshot().unwrap();
    let mut b = [0u8; 7];
    loop {
        let n = r.read(&mut b).unwrap();
        if n == 0 {
            break;
        }
        small.extend_from_slice(&b[..n]);
    }
    assert_eq!(small, after);
}

/// The group registry is replicated (a command) and travels with snapshots.
#[test]
fn group_registrations_apply_and_travel_with_snapshots() {
    let src = Store::open(&StoreMode::Memory).unwrap();
    let reg = |g: &str| {
        encode_register_group(&RegisterGroup {
            topic_hash: topic_hash("t").0,
            group: g.into(),
        })
    };
    let other = encode_register_group(&RegisterGroup {
        topic_hash: topic_hash("u").0,
        group: "z".into(),
    });
    src.apply_entries(
        &[
            (1, 1, &reg("b")),
            (2, 1, &reg("a")),
            (3, 1, &reg("a")),
            (4, 1, &other),
        ],
        &[],
        false,
    )
    .unwrap();
    assert_eq!(src.groups_of(topic_hash("t")).unwrap(), vec!["a", "b"]);
    assert!(src.has_group(topic_hash("u"), "z").unwrap());
    assert!(!src.has_group(topic_hash("u"), "a").unwrap());
    let mut snap = Vec::new();
    src.write_snapshot(&mut snap).unwrap();
    let dst = Store::open(&StoreMode::Memory).unwrap();
    let stale = encode_register_group(&RegisterGroup {
        topic_hash: topic_hash("t").0,
        group: "stale".into(),
    });
    dst.apply_entries(&[(1, 1, &stale), (2, 1, &stale)], &[], false)
        .unwrap();
    assert_eq!(
        dst.groups_of(topic_hash("t")).unwrap(),
        vec!["stale"],
        "idempotent"
    );
    dst.install_snapshot(&mut snap.as_slice(), Some((4, 1)))
        .unwrap();
    assert_eq!(dst.groups_of(topic_hash("t")).unwrap(), vec!["a", "b"]);
    assert_eq!(dst.groups_of(topic_hash("u")).unwrap(), vec!["z"]);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// The digest kept by every commit equals the one computed from the rows; replicas that
    /// apply the same log in different batches, a snapshot's receiver and a reopened store all
    /// have the same one; a different state has a different one.
    #[test]
    fn the_digest_is_a_function_of_the_stored_state(
        ops in proptest::collection::vec((0u8..4, 0u64..30, 0i64..3), 1..40),
        split in 1usize..5,
    ) {
        let mut entries: Vec<Vec<u8>> = Vec::new();
        let mut next = 1u64;
        for (op, a, ttl) in ops {
            entries.push(match op {
                0 | 1 => {
                    let items = (0..=a % 3).map(|_| { next += 1; item(next, ttl * 50) }).collect();
                    encode_store(&StoreBatch { items })
                }
                2 => encode_delete(&DeleteBatch { keys: vec![key(a + 1).0, key(a + 2).0] }),
                _ => encode_register_group(&RegisterGroup {
                    topic_hash: topic_hash("t").0,
                    group: format!("g{}", a % 4),
                }),
            });
        }
        let log: Vec<(u64, u64, &[u8])> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i as u64 + 1, 1, e.as_slice()))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let mode = StoreMode::Disk(dir.path().to_path_buf(), 1 << 20);
        let one = Store::open(&mode).unwrap();
        let other = Store::open(&StoreMode::Memory).unwrap();
        let mut seen = std::collections::HashMap::new();
        for e in &log {
            one.apply_entries(std::slice::from_ref(e), &[], false).unwrap();
            proptest::prop_assert_eq!(one.digest(), one.computed_digest().unwrap());
            let (m, i, x) = one.counts().unwrap();
            let rows = (m, i, x, one.groups_of(topic_hash("t")).unwrap().len());
            // Equal digests only for equal row counts (a cheap stand-in for equal states).
            if let Some(r) = seen.insert(one.digest(), rows) {
                proptest::prop_assert_eq!(r, rows);
            }
        }
        for chunk in log.chunks(split) {
            other.apply_entries(chunk, &[], true).unwrap();
        }
        proptest::prop_assert_eq!(other.digest(), one.digest());
        let mut snap = Vec::new();
        one.write_snapshot(&mut snap).unwrap();
        let third = Store::open(&StoreMode::Memory).unwrap();
        third.install_snapshot(&mut snap.as_slice(), one.applied().unwrap()).unwrap();
        proptest::prop_assert_eq!(third.digest(), one.digest());
        proptest::prop_assert_eq!(third.computed_digest().unwrap(), one.digest());
        let before = one.digest();
        drop(one);
        let reopened = Store::open(&mode).unwrap();
        proptest::prop_assert_eq!(reopened.digest(), before);
        proptest::prop_assert_eq!(reopened.computed_digest().unwrap(), before);
    }
}

/// Issue 26 (ENOSPC on each write path): a store whose disk is full at a commit (an apply, a
/// snapshot install; injected under redb) fails that commit whole. Opened again (the node's
/// restart), it holds the state before it, and the same apply or install (the log replays it,
/// the leader sends the snapshot again) succeeds.
#[test]
fn a_full_disk_at_an_apply_or_a_snapshot_install_leaves_the_state_before_it() {
    use futureq_storage::log::faults::TRIGGER_FILE;
    use futureq_storage::store_faults::STORE_NO_SPACE;
    let dir = tempfile::tempdir().unwrap();
    let mode = StoreMode::Disk(dir.path().to_path_buf(), 1 << 20);
    let arm = || std::fs::write(dir.path().join(TRIGGER_FILE), STORE_NO_SPACE).unwrap();
    let batch = |ids: std::ops::RangeInclusive<u64>| {
        encode_store(&StoreBatch {
            items: ids.map(|i| item(i, 0)).collect(),
        })
    };
    let (first, second) = (batch(1..=5), batch(6..=10));
    let s = Store::open(&mode).unwrap();
    s.apply_entries(&[(1, 1, &first)], &[], true).unwrap();
    let before = (s.counts().unwrap(), s.applied().unwrap(), s.digest());
    arm();
    // A commit without fsync may stay in redb's memory; the durable one meets the full disk
    // (or, if the first did, finds redb refusing everything after it).
    let _ = s.apply_entries(&[(2, 1, &second)], &[], false);
    assert!(s.sync().is_err());
    assert!(!dir.path().join(TRIGGER_FILE).exists(), "the fault fired");
    drop(s);
    let s = Store::open(&mode).unwrap();
    assert_eq!(
        (s.counts().unwrap(), s.applied().unwrap(), s.digest()),
        before
    );
    s.apply_entries(&[(2, 1, &second)], &[], true).unwrap();
    assert_eq!(s.applied().unwrap(), Some((2, 1)));
    let before = (s.counts().unwrap(), s.applied().unwrap(), s.digest());

    let src = Store::open(&StoreMode::Memory).unwrap();
    src.apply_entries(&[(7, 3, &batch(1..=40))], &[], true)
        .unwrap();
    let mut snap = Vec::new();
    src.write_snapshot(&mut snap).unwrap();
    arm();
    assert!(s
        .install_snapshot(&mut snap.as_slice(), Some((7, 3)))
        .is_err());
    drop(s);
    let s = Store::open(&mode).unwrap();
    assert_eq!(
        (s.counts().unwrap(), s.applied().unwrap(), s.digest()),
        before
    );
    assert_eq!(s.digest(), s.computed_digest().unwrap());
    s.install_snapshot(&mut snap.as_slice(), Some((7, 3)))
        .unwrap();
    assert_eq!(s.counts().unwrap(), src.counts().unwrap());
    assert_eq!(s.digest(), src.digest());
}
