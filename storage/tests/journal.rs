//! The local journal (standalone's write path): writes through the log and the shared apply,
//! replay after a crash compared with the store that took the writes, fsync failure, clean
//! stop, ids in log order, bounded memory.
#![cfg(feature = "glommio")]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use futureq_core::command::{StoreItem, IDS_UNAPPLIED_MAX as W};
use futureq_core::{EventKey, TopicHash};
use futureq_storage::journal::{Journal, JournalConfig, JournalError, OpenError, Wait};
use futureq_storage::log::io::MemLogIo;
use futureq_storage::log::{LogConfig, LogIndex, Term};
use futureq_storage::{Store, StoreMode};
use glommio::{LocalExecutorBuilder, Placement};

/// Never durable on its own: the log keeps every entry until a stop (a crash replays them).
const KEEP: JournalConfig = JournalConfig {
    log: LogConfig {
        segment_bytes: 64 * 1024,
        cache_bytes: 0,
    },
    durable_interval: Duration::from_secs(3600),
};

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(512 << 10)
        .spawn(move || async move { f().await })
        .expect("executor")
        .join()
        .expect("test body");
}

fn item(topic: u64, n: u8) -> StoreItem {
    StoreItem {
        event_id: 0,
        bucket: 7,
        topic_hash: topic,
        expires_at_ms: 0,
        index_keys: vec![],
        message: vec![n; 10 + usize::from(n)],
    }
}

fn memory() -> Store {
    Store::open(&StoreMode::Memory).unwrap()
}

type Seen = Rc<RefCell<(Vec<EventKey>, Vec<EventKey>)>>;

async fn open(io: &MemLogIo, cfg: JournalConfig, store: &Store) -> (Journal<MemLogIo>, Seen) {
    let seen: Seen = Rc::default();
    let s = Rc::clone(&seen);
    let j = Journal::open(
        io.clone(),
        cfg,
        store.clone(),
        Box::new(move |p, d| {
            s.borrow_mut().0.extend_from_slice(p);
            s.borrow_mut().1.extend_from_slice(d);
        }),
    )
    .await
    .unwrap();
    (j, seen)
}

/// Starts `j.run` until the returned sender is dropped or fired.
fn serve(
    j: &Journal<MemLogIo>,
) -> (
    futures::channel::oneshot::Sender<()>,
    glommio::task::JoinHandle<()>,
) {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    let j = j.clone();
    let h = glommio::spawn_local(async move {
        j.run(async {
            let _ = rx.await;
        })
        .await;
    })
    .detach();
    (tx, h)
}

#[test]
fn writes_are_applied_and_a_crash_replays_what_was_acknowledged() {
    run(|| async {
        let io = MemLogIo::new();
        let store = memory();
        let (j, seen) = open(&io, KEEP, &store).await;
        // A new store: the ids up to W are reserved at open, the first handed out is W + 1.
        assert_eq!(store.last_id().unwrap(), W);
        let (_stop, _task) = serve(&j);
        let a = j
            .publish(vec![item(1, 1), item(1, 2)], Wait::Applied)
            .await
            .unwrap();
        // Acknowledged once durable: the apply follows, in log order.
        let b = j.publish(vec![item(2, 3)], Wait::Durable).await.unwrap();
        assert_eq!((a, b), (W + 1, W + 3), "ids are consecutive in log order");
        j.delete(&[key(1, 7, W + 2)]).await.unwrap();
        for (t, id) in [(1, W + 1), (2, W + 3)] {
            assert!(store.get(&key(t, 7, id)).unwrap().is_some());
        }
        let mut published = seen.borrow().0.clone();
        published.sort();
        assert_eq!(
            published,
            vec![key(1, 7, W + 1), key(2, 7, W + 3)],
            "the dispatcher hears of each apply's smallest key per topic"
        );
        assert!(store.get(&key(1, 7, W + 2)).unwrap().is_none());
        assert_eq!(seen.borrow().1, vec![key(1, 7, W + 2)]);
        // A cancel answers per key whether it was stored, once applied (the replay below
        // applies it again: the replica ends with the same rows).
        assert_eq!(
            j.cancel(&[key(1, 7, W + 1), key(1, 7, W + 2)])
                .await
                .unwrap(),
            vec![true, false]
        );
        assert!(store.get(&key(1, 7, W + 1)).unwrap().is_none());
        assert_eq!(
            seen.borrow().1,
            vec![key(1, 7, W + 2), key(1, 7, W + 1), key(1, 7, W + 2)]
        );
        j.register_group(TopicHash(1), "g".into()).await.unwrap();
        assert_eq!(store.groups_of(TopicHash(1)).unwrap(), vec!["g".to_owned()]);
        assert!(j.applies() >= 1);

        // Power loss: only what was fsynced survives, and the store lost everything it did
        // not commit durably (here: all of it). The replay rebuilds the same store.
        let replica = memory();
        let (j2, _) = open(&io.crash(), KEEP, &replica).await;
        assert_eq!(
            replica.computed_digest().unwrap(),
            store.computed_digest().unwrap()
        );
        // Replayed up to W + 3, then W more reserved.
        assert_eq!(replica.last_id().unwrap(), 2 * W + 3);
        assert_eq!(
            replica.groups_of(TopicHash(1)).unwrap(),
            vec!["g".to_owned()]
        );
        let (_stop2, _task2) = serve(&j2);
        let c = j2.publish(vec![item(1, 4)], Wait::Applied).await.unwrap();
        assert_eq!(c, 2 * W + 4, "ids never regress across a restart");
    });
}

#[test]
fn a_failed_fsync_fails_the_write_and_every_later_one() {
    run(|| async {
        let io = MemLogIo::new();
        let store = memory();
        let (j, _) = open(&io, KEEP, &store).await;
        let (_stop, task) = serve(&j);
        j.publish(vec![item(1, 1)], Wait::Applied).await.unwrap();
        io.fail_syncs(true);
        let e = j
            .publish(vec![item(1, 2)], Wait::Durable)
            .await
            .unwrap_err();
        assert!(matches!(e, JournalError::Failed { .. }), "{e}");
        let e = j
            .publish(vec![item(1, 3)], Wait::Applied)
            .await
            .unwrap_err();
        assert!(matches!(e, JournalError::Failed { .. }), "{e}");
        assert!(j.failed().is_some());
        assert!(store.get(&key(1, 7, 2)).unwrap().is_none(), "never applied");
        let e = j
            .publish(vec![item(1, 4)], Wait::Appended)
            .await
            .unwrap_err();
        assert!(matches!(e, JournalError::Failed { .. }), "{e}");
        // The journal's task ends by itself.
        task.await;
    });
}

#[test]
fn a_clean_stop_leaves_nothing_to_replay() {
    run(|| async {
        let io = MemLogIo::new();
        let store = memory();
        let (j, _) = open(&io, KEEP, &store).await;
        let (stop, task) = serve(&j);
        for n in 0..50u8 {
            j.publish(
                vec![item(1, n)],
                if n % 2 == 0 {
                    Wait::Durable
                } else {
                    Wait::Appended
                },
            )
            .await
            .unwrap();
        }
        drop(stop);
        task.await;
        let e = j
            .publish(vec![item(1, 99)], Wait::Applied)
            .await
            .unwrap_err();
        assert!(matches!(e, JournalError::Stopped), "{e}");
        assert_eq!(
            store.last_id().unwrap(),
            W + 50,
            "NO_ACK writes were applied before the stop"
        );
        // The next start applies nothing: every entry left in the log is at or below the
        // store's applied index.
        let entries = store
            .stats()
            .entries
            .load(std::sync::atomic::Ordering::Relaxed);
        let (j2, _) = open(&io.crash(), KEEP, &store).await;
        drop(j2);
        assert_eq!(
            store
                .stats()
                .entries
                .load(std::sync::atomic::Ordering::Relaxed),
            entries,
            "nothing was applied again"
        );
        assert_eq!(store.last_id().unwrap(), 2 * W + 50, "W more reserved");
    });
}

#[test]
fn a_log_that_starts_after_the_store_is_refused() {
    run(|| async {
        // A log holding entries 5..=6 (1..=4 purged behind a durable apply) beside a store that
        // applied nothing (a restored old copy): entries 1..=4 are gone, refuse to serve.
        let io = MemLogIo::new();
        let log = futureq_storage::log::Log::open(io.clone(), KEEP.log, Box::new(|_| {}))
            .await
            .unwrap();
        for i in 5..=6u64 {
            let cmd = futureq_core::command::encode_register_group(
                &futureq_core::command::RegisterGroup {
                    topic_hash: i,
                    group: "g".into(),
                },
            );
            log.append(vec![(Term(1), LogIndex(i), cmd)], Box::new(|r| r.unwrap()))
                .unwrap();
        }
        log.flush().await.unwrap();
        drop(log);
        match Journal::open(io.crash(), KEEP, memory(), Box::new(|_, _| {})).await {
            Err(OpenError::Gap {
                first: 5,
                applied: 0,
            }) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened over a gap"),
        }
        // The same log beside a store that applied up to 4 replays 5 and 6.
        let store = memory();
        store.apply_entries(&[(4, 1, &[][..])], &[], true).unwrap();
        let (_j, _) = open(&io.crash(), KEEP, &store).await;
        assert_eq!(store.applied().unwrap(), Some((6, 1)));
        assert_eq!(store.groups_of(TopicHash(5)).unwrap(), vec!["g".to_owned()]);
    });
}

#[test]
fn no_ack_writes_wait_when_the_apply_falls_behind() {
    run(|| async {
        let io = MemLogIo::new();
        let store = memory();
        let (j, _) = open(&io, KEEP, &store).await;
        // Not serving: nothing is flushed or applied, so the queue fills to its bound.
        let mut taken = 0usize;
        for n in 0..(futureq_storage::journal::UNAPPLIED_MAX + 10) {
            let fut = j.publish(vec![item(1, (n % 200) as u8)], Wait::Appended);
            match futures::future::select(
                Box::pin(fut),
                Box::pin(glommio::timer::sleep(Duration::from_millis(20))),
            )
            .await
            {
                futures::future::Either::Left((r, _)) => {
                    r.unwrap();
                    taken += 1;
                }
                futures::future::Either::Right(_) => break,
            }
        }
        assert_eq!(taken, futureq_storage::journal::UNAPPLIED_MAX);
    });
}

#[test]
fn concurrent_publishes_share_fsyncs_and_applies() {
    run(|| async {
        let io = MemLogIo::new();
        let store = memory();
        let (j, _) = open(&io, KEEP, &store).await;
        let (_stop, _task) = serve(&j);
        let futs: Vec<_> = (0..200u8)
            .map(|n| j.publish(vec![item(1, n)], Wait::Applied))
            .collect();
        let all = futures::future::join_all(futs).await;
        assert!(all.iter().all(Result::is_ok));
        let mut firsts: Vec<u64> = all.into_iter().map(Result::unwrap).collect();
        firsts.sort_unstable();
        assert_eq!(
            firsts,
            (W + 1..=W + 200).collect::<Vec<u64>>(),
            "one id each, none twice"
        );
        let syncs = io.syncs();
        assert!(syncs < 200, "200 concurrent batches took {syncs} fsyncs");
        assert!(
            j.applies() < 200,
            "200 concurrent batches took {} applies",
            j.applies()
        );
    });
}

/// The journal on real files (io_uring) beside a redb file: writes survive a clean stop and a
/// restart, ids go on above the last one, nothing is applied twice.
#[test]
fn the_journal_on_disk_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let cfg = JournalConfig {
            durable_interval: futureq_storage::durability::JOURNAL_DURABLE_APPLY_INTERVAL,
            log: LogConfig {
                segment_bytes: 1 << 20,
                cache_bytes: 0,
            },
        };
        let mode = StoreMode::Disk(path.join("db"), 1 << 20);
        let mut next = 0;
        for round in 0..3u8 {
            let store = Store::open(&mode).unwrap();
            let io = futureq_storage::log::uring::DmaLogIo::new(path.join("journal")).unwrap();
            let j = Journal::open(io, cfg, store.clone(), Box::new(|_, _| {}))
                .await
                .unwrap();
            let (tx, rx) = futures::channel::oneshot::channel::<()>();
            let task = {
                let j = j.clone();
                glommio::spawn_local(async move {
                    j.run(async {
                        let _ = rx.await;
                    })
                    .await;
                })
            };
            // Each open reserves W ids above the last: the next goes on above them.
            next += W + 1;
            for n in 0..30u8 {
                // Large enough to roll the 1 MiB segments.
                let mut it = item(u64::from(round) + 1, n);
                it.message = vec![n; 50_000];
                let first = j.publish(vec![it], Wait::Durable).await.unwrap();
                assert_eq!(first, next, "ids go on across restarts");
                next += 1;
            }
            next -= 1;
            drop(tx);
            task.await;
            assert_eq!(
                store
                    .stats()
                    .entries
                    .load(std::sync::atomic::Ordering::Relaxed),
                30,
                "this round's entries applied once each; the kept segment's older ones skipped"
            );
            assert_eq!(store.last_id().unwrap(), next);
            assert_eq!(
                store.counts().unwrap().0,
                30 * (u64::from(round) + 1),
                "every message stored once"
            );
        }
    });
}

/// A store that applied past the journal (its entries came from another log) starts the
/// journal after its applied index: the old entries are dropped and writes go on.
#[test]
fn a_store_ahead_of_the_journal_empties_it() {
    run(|| async {
        let io = MemLogIo::new();
        let store = memory();
        let (j, _) = open(&io, KEEP, &store).await;
        let (stop, task) = serve(&j);
        for n in 0..3u8 {
            j.publish(vec![item(1, n)], Wait::Applied).await.unwrap();
        }
        drop(stop);
        task.await;
        let reg =
            futureq_core::command::encode_register_group(&futureq_core::command::RegisterGroup {
                topic_hash: 9,
                group: "g".into(),
            });
        let more: Vec<(u64, u64, &[u8])> = (4..=10).map(|i| (i, 7, reg.as_slice())).collect();
        store.apply_entries(&more, &[], true).unwrap();
        let (j2, _) = open(&io.crash(), KEEP, &store).await;
        let (_stop2, _task2) = serve(&j2);
        let first = j2.publish(vec![item(1, 9)], Wait::Applied).await.unwrap();
        assert_eq!(first, 2 * W + 4);
        assert_eq!(store.applied().unwrap(), Some((11, 1)));
    });
}

/// A key from its three parts.
/// A reschedule gets its id from the journal's sequence (so later publishes go above it),
/// answers the new key once applied, and a crash replays it to the same store.
#[test]
fn a_reschedule_takes_the_next_id_and_is_replayed() {
    run(|| async {
        let io = MemLogIo::new();
        let store = memory();
        let (j, _) = open(&io, KEEP, &store).await;
        let (_stop, _task) = serve(&j);
        let m = futureq_core::StoredMessage {
            topic: "t".into(),
            payload: bytes::Bytes::from_static(b"p"),
            enqueued_at_ms: 1000,
            delay: futureq_core::DelayMs(5000),
            ttl: futureq_core::TtlMs(0),
            indexes: vec![],
            extras: Default::default(),
        };
        let mut it = item(1, 1);
        it.message = m.encode().to_vec();
        let first = j.publish(vec![it], Wait::Applied).await.unwrap();
        let to = |key: EventKey| {
            futureq_core::command::WithId::Reschedule(futureq_core::command::Reschedule {
                key: key.0,
                event_id: 0,
                bucket: 9,
                due_at_ms: 9000,
                now_ms: 2000,
            })
        };
        let moved = j.with_id(to(key(1, 7, first))).await.unwrap();
        assert_eq!(moved, Some(key(1, 9, first + 1)));
        assert_eq!(j.with_id(to(key(1, 7, first))).await.unwrap(), None);
        let next = j.publish(vec![item(1, 2)], Wait::Applied).await.unwrap();
        assert_eq!(next, first + 3, "each reschedule used an id");

        let replica = memory();
        let (_j2, _) = open(&io.crash(), KEEP, &replica).await;
        assert_eq!(
            replica.computed_digest().unwrap(),
            store.computed_digest().unwrap()
        );
        assert!(replica.get(&key(1, 9, first + 1)).unwrap().is_some());
    });
}

fn key(topic: u64, bucket: u64, id: u64) -> EventKey {
    EventKey::new(
        futureq_core::TopicHash(topic),
        futureq_core::Bucket(bucket),
        futureq_core::EventId(id),
    )
}

/// Issue 26.1: an id handed out for a write that a crash cut before its fsync (a NO_ACK write
/// is answered at append) is never handed out again: the next start reserves the ids above
/// the replayed mark. It used to go on at `last-id + 1`, and the next message took the lost
/// message's tag.
#[test]
fn an_id_handed_out_for_a_write_a_crash_cut_is_never_handed_out_again() {
    run(|| async {
        let io = MemLogIo::new();
        // The store stands for what is durable: the crash below loses none of its commits.
        let store = memory();
        let (j, _) = open(&io, KEEP, &store).await;
        // Not served: no fsync ever comes, as with a crash right after the answers.
        let mut lost = Vec::new();
        for n in 0..100u8 {
            let first = j
                .publish(vec![item(1, n), item(1, n)], Wait::Appended)
                .await
                .unwrap();
            lost.extend([first, first + 1]);
        }
        drop(j);
        let (j2, _) = open(&io.crash(), KEEP, &store).await;
        let (_stop, _task) = serve(&j2);
        for n in 0..100u8 {
            let first = j2
                .publish(vec![item(1, n), item(1, n)], Wait::Applied)
                .await
                .unwrap();
            for id in [first, first + 1] {
                assert!(!lost.contains(&id), "id {id} named a lost write before");
            }
        }
    });
}
