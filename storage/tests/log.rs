//! The segmented Raft log over the in-memory seam: round trips, group commit, torn tails at
//! every byte, corruption refusal, fsync poisoning, truncate and purge, crash recovery.

use std::cell::RefCell;
use std::rc::Rc;

use futureq_storage::log::io::{LogIo, MemLogIo};
use futureq_storage::log::segmented::MARK_FILE;
use futureq_storage::log::{Log, LogConfig, LogError, LogIndex, Term};
use futures::executor::block_on;

const CFG: LogConfig = LogConfig {
    segment_bytes: 16 * 1024,
    cache_bytes: 0,
};

fn payload(i: u64) -> Vec<u8> {
    (0..(i * 37 % 300)).map(|j| (i + j) as u8).collect()
}

fn open(io: &MemLogIo) -> Result<Log<MemLogIo>, LogError> {
    block_on(Log::open(io.clone(), CFG, Box::new(|_| {})))
}

/// A log whose persist hook records each payload it hears of.
type Persisted = Rc<RefCell<Vec<Vec<u8>>>>;

fn open_recording(io: &MemLogIo) -> (Log<MemLogIo>, Persisted) {
    let persisted: Persisted = Rc::default();
    let p = Rc::clone(&persisted);
    let log = block_on(Log::open(
        io.clone(),
        CFG,
        Box::new(move |b: &[u8]| p.borrow_mut().push(b.to_vec())),
    ))
    .unwrap();
    (log, persisted)
}

fn fill(log: &Log<MemLogIo>, range: std::ops::RangeInclusive<u64>) {
    for i in range {
        log.append(
            vec![(Term(1), LogIndex(i), payload(i))],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
    }
    block_on(log.flush()).unwrap();
}

fn check_all(log: &Log<MemLogIo>, range: std::ops::RangeInclusive<u64>) {
    for i in range {
        let r = block_on(log.read(LogIndex(i)))
            .unwrap()
            .unwrap_or_else(|| panic!("entry {i} missing"));
        assert_eq!(
            (r.index, r.term, &r.payload),
            (LogIndex(i), Term(1), &payload(i))
        );
    }
}

/// The segment files (not the durable mark).
fn segments(io: &MemLogIo) -> Vec<String> {
    let mut names: Vec<String> = block_on(io.list())
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".log"))
        .collect();
    names.sort();
    names
}

/// Fsyncs of segment files (the durable mark has its own, after some flushes).
fn segment_syncs(io: &MemLogIo) -> usize {
    io.events()
        .iter()
        .filter(|e| e.starts_with("sync ") && e.ends_with(".log"))
        .count()
}

/// A copy of `io`'s files, with `name` replaced by `img` (a damaged image).
fn damaged(io: &MemLogIo, name: &str, img: Vec<u8>) -> MemLogIo {
    let d = MemLogIo::new();
    for n in block_on(io.list()).unwrap() {
        d.set_file(&n, io.file(&n).unwrap());
    }
    d.set_file(name, img);
    d
}

#[test]
fn entries_round_trip_across_segments_and_restarts() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=400);
    assert!(
        segments(&io).len() > 3,
        "small segments roll: {:?}",
        segments(&io)
    );
    check_all(&log, 1..=400);
    drop(log);
    let log = open(&io.crash()).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(400))));
    check_all(&log, 1..=400);
}

#[test]
fn group_commit_one_fsync_for_many_appends_and_callbacks_after_it() {
    let io = MemLogIo::new();
    let (log, persisted) = open_recording(&io);
    for i in 1..=50 {
        let io2 = io.clone();
        log.append(
            vec![(Term(1), LogIndex(i), payload(i))],
            Box::new(move |r| {
                r.unwrap();
                io2.mark("callback");
            }),
        )
        .unwrap();
        // Readable before the flush.
        assert_eq!(
            block_on(log.read(LogIndex(i))).unwrap().unwrap().payload,
            payload(i)
        );
    }
    assert!(
        persisted.borrow().is_empty(),
        "nothing is persisted before the fsync"
    );
    block_on(log.flush()).unwrap();
    assert_eq!(
        segment_syncs(&io),
        1,
        "one fsync for 50 appends in one segment"
    );
    let ev = io.events();
    let first_cb = ev.iter().position(|e| e == "callback").unwrap();
    let last_sync = ev
        .iter()
        .rposition(|e| e.starts_with("sync") && e.ends_with(".log"))
        .unwrap();
    assert!(
        last_sync < first_cb,
        "callbacks fire only after the fsync: {ev:?}"
    );
    assert_eq!(ev.iter().filter(|e| *e == "callback").count(), 50);
    assert_eq!(
        persisted.borrow().len(),
        50,
        "the persist hook saw every entry"
    );
    assert_eq!(persisted.borrow()[9], payload(10));
}

/// Over files whose writes are durable when they return (`O_DSYNC`), a group commit is its
/// writes alone: no fsync of a segment, and what the callbacks confirmed survives a crash.
#[test]
fn with_durable_writes_a_group_commit_skips_the_fsync_and_stays_durable() {
    let io = MemLogIo::with_durable_writes();
    let log = open(&io).unwrap();
    let confirmed = Rc::new(RefCell::new(0u64));
    for i in 1..=50 {
        let c = Rc::clone(&confirmed);
        log.append(
            vec![(Term(1), LogIndex(i), payload(i))],
            Box::new(move |r| {
                r.unwrap();
                *c.borrow_mut() += 1;
            }),
        )
        .unwrap();
    }
    block_on(log.flush()).unwrap();
    assert_eq!(*confirmed.borrow(), 50);
    // Not of a segment, nor of the durable mark written beside the flush.
    assert!(io
        .events()
        .iter()
        .any(|e| e.starts_with("write durable.mark")));
    assert_eq!(io.syncs(), 0, "no fsync: {:?}", io.events());
    drop(log);
    let log = open(&io.crash()).unwrap();
    check_all(&log, 1..=50);

    // The same files without durable writes: the fsync is what makes them durable.
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=50);
    assert_eq!(segment_syncs(&io), 1);
}

#[test]
fn torn_tail_at_every_byte_of_the_last_record_is_cut() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=9);
    let before = segments(&io);
    assert_eq!(before.len(), 1);
    let name = &before[0];
    let full = io.file(name).unwrap();
    let end = full.iter().rposition(|b| *b != 0).unwrap() + 1;
    let last_len = 24 + payload(9).len();
    let last_start = end - last_len;
    for cut in last_start + 1..end {
        // The write of the last record stopped after `cut` bytes; the rest is zeros or junk.
        for junk in [0u8, 0xA5] {
            let mut img = full.clone();
            for b in &mut img[cut..end] {
                *b = junk;
            }
            let damaged = MemLogIo::new();
            damaged.set_file(name, img);
            let log = open(&damaged).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
            assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(8))), "cut {cut}");
            check_all(&log, 1..=8);
            // The log goes on from the cut, and the repair was durable.
            fill(&log, 9..=10);
            let again = open(&damaged.crash()).unwrap();
            assert_eq!(again.bounds(), Some((LogIndex(1), LogIndex(10))));
            check_all(&again, 1..=10);
        }
    }
}

#[test]
fn corruption_before_valid_records_is_refused() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=9);
    let name = segments(&io)[0].clone();
    let mut img = io.file(&name).unwrap();
    img[24 + payload(1).len() + 30] ^= 0x40; // inside record 2's payload/header
                                             // The durable mark says record 9 was fsynced: damage before it is corruption.
    match open(&damaged(&io, &name, img)) {
        Err(LogError::Corrupt { offset, .. }) => assert_eq!(offset as usize, 24 + payload(1).len()),
        other => panic!("expected corruption, got {:?}", other.map(|l| l.bounds())),
    }
}

#[test]
fn corruption_in_an_earlier_segment_is_refused() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=300);
    let names = segments(&io);
    assert!(names.len() >= 2);
    let mut img = io.file(&names[0]).unwrap();
    let end = img.iter().rposition(|b| *b != 0).unwrap();
    img[end] ^= 0xff; // the last record of the first segment: later segments hold valid data
    assert!(matches!(
        open(&damaged(&io, &names[0], img)),
        Err(LogError::Corrupt { .. })
    ));
}

#[test]
fn failed_fsync_poisons_the_log() {
    let io = MemLogIo::new();
    let persisted = Rc::new(RefCell::new(0));
    let p = Rc::clone(&persisted);
    let log = block_on(Log::open(
        io.clone(),
        CFG,
        Box::new(move |_: &[u8]| *p.borrow_mut() += 1),
    ))
    .unwrap();
    fill(&log, 1..=3);
    io.fail_syncs(true);
    let outcome = Rc::new(RefCell::new(None));
    let o = Rc::clone(&outcome);
    log.append(
        vec![(Term(1), LogIndex(4), payload(4))],
        Box::new(move |r| *o.borrow_mut() = Some(r)),
    )
    .unwrap();
    assert!(block_on(log.flush()).is_err());
    assert!(
        matches!(*outcome.borrow(), Some(Err(_))),
        "the callback hears of the failure"
    );
    assert_eq!(
        *persisted.borrow(),
        3,
        "no persist notification for the failed fsync"
    );
    io.fail_syncs(false);
    assert!(matches!(
        log.append(vec![(Term(1), LogIndex(5), vec![])], Box::new(|_| {})),
        Err(LogError::Poisoned)
    ));
    assert!(matches!(block_on(log.flush()), Err(LogError::Poisoned)));
}

/// Records a process wrote but did not get fsynced before it died (here: its fsync failed)
/// are read back at the next open; they are made durable there, before the log reports them
/// — a power loss after that open keeps them.
#[test]
fn records_found_at_open_beyond_the_mark_are_made_durable() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=3);
    io.fail_syncs(true);
    log.append(
        (4..=6)
            .map(|i| (Term(1), LogIndex(i), payload(i)))
            .collect(),
        Box::new(|_| {}),
    )
    .unwrap();
    assert!(block_on(log.flush()).is_err());
    drop(log);
    io.fail_syncs(false);
    let reopened = open(&io).unwrap();
    assert_eq!(reopened.durable_mark(), Some(LogIndex(3)));
    check_all(&reopened, 1..=6);
    drop(reopened);
    let after_power_loss = open(&io.crash()).unwrap();
    check_all(&after_power_loss, 1..=6);
}

#[test]
fn appends_must_be_contiguous() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=3);
    assert!(matches!(
        log.append(vec![(Term(1), LogIndex(5), vec![])], Box::new(|_| {})),
        Err(LogError::Gap {
            last: LogIndex(3),
            got: LogIndex(5)
        })
    ));
    assert!(matches!(
        log.append(
            vec![(Term(1), LogIndex(4), vec![0; 20_000])],
            Box::new(|_| {})
        ),
        Err(LogError::TooLarge(_))
    ));
}

#[test]
fn truncate_removes_the_suffix_durably() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=300);
    let segs_before = segments(&io).len();
    block_on(log.truncate(LogIndex(120))).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(119))));
    assert!(block_on(log.read(LogIndex(120))).unwrap().is_none());
    assert!(
        segments(&io).len() < segs_before,
        "later segments are deleted"
    );
    // A new term rewrites the suffix.
    for i in 120..=130 {
        log.append(
            vec![(Term(2), LogIndex(i), vec![i as u8; 10])],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
    }
    block_on(log.flush()).unwrap();
    let log = open(&io.crash()).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(130))));
    check_all(&log, 1..=119);
    let r = block_on(log.read(LogIndex(125))).unwrap().unwrap();
    assert_eq!((r.term, r.payload), (Term(2), vec![125u8; 10]));
}

#[test]
fn purge_drops_whole_segments_before_the_index() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=300);
    let n = segments(&io).len();
    block_on(log.purge(LogIndex(150))).unwrap();
    let (LogIndex(first), LogIndex(last)) = log.bounds().unwrap();
    assert!(first > 1 && first <= 151, "first kept index {first}");
    assert_eq!(last, 300);
    assert!(segments(&io).len() < n);
    check_all(&log, 151..=300);
    let log = open(&io.crash()).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(first), LogIndex(300))));
}

#[test]
fn unflushed_entries_are_lost_in_a_crash_but_the_log_stays_consistent() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=10);
    log.append(vec![(Term(1), LogIndex(11), payload(11))], Box::new(|_| {}))
        .unwrap();
    let log = open(&io.crash()).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(10))));
    fill(&log, 11..=12);
    check_all(&log, 1..=12);
}

#[test]
fn the_flusher_batches_whatever_was_appended() {
    use futures::task::LocalSpawnExt;
    let io = MemLogIo::new();
    let log = Rc::new(open(&io).unwrap());
    let mut pool = futures::executor::LocalPool::new();
    let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
    let l = Rc::clone(&log);
    pool.spawner()
        .spawn_local(async move {
            l.run_flusher(
                async {
                    let _ = stop_rx.await;
                },
                |_| futures::future::ready(()),
            )
            .await;
        })
        .unwrap();
    pool.run_until_stalled();
    let done = Rc::new(RefCell::new(0));
    for i in 1..=40 {
        let d = Rc::clone(&done);
        log.append(
            vec![(Term(1), LogIndex(i), payload(i))],
            Box::new(move |r| {
                r.unwrap();
                *d.borrow_mut() += 1;
            }),
        )
        .unwrap();
    }
    pool.run_until_stalled();
    assert_eq!(*done.borrow(), 40);
    assert_eq!(
        segment_syncs(&io),
        1,
        "40 appends made before the flusher ran share one fsync"
    );
    let _ = stop_tx.send(());
    pool.run_until_stalled();
}

/// Issue 26 (a full disk degrades): a flush that finds no space for a new segment (its
/// creation fails with ENOSPC: the first one, and a roll) poisons nothing and answers no
/// callback; the entries wait, the next flush writes them, and they survive a crash.
#[test]
fn no_space_for_the_next_segment_delays_the_flush_and_poisons_nothing() {
    use futureq_storage::log::faults::{FaultyIo, TRIGGER_FILE};
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join(TRIGGER_FILE);
    let mem = MemLogIo::new();
    let io = FaultyIo::new(mem.clone(), trigger.clone(), || {});
    let log = block_on(Log::open(io, CFG, Box::new(|_| {}))).unwrap();
    let answered: Rc<RefCell<Vec<bool>>> = Rc::default();
    let big = |i: u64| vec![u8::try_from(i).unwrap(); 5000];
    let append = |i: u64| {
        let a = Rc::clone(&answered);
        log.append(
            vec![(Term(1), LogIndex(i), big(i))],
            Box::new(move |r| a.borrow_mut().push(r.is_ok())),
        )
        .unwrap();
    };
    for (first, last) in [(1, 2), (3, 6)] {
        // 1..=2: the log's first segment; 3..=6 roll over into a second one.
        std::fs::write(&trigger, "prealloc").unwrap();
        for i in first..=last {
            append(i);
        }
        let e = block_on(log.flush()).unwrap_err();
        assert!(matches!(e, LogError::NoSpace { .. }), "{e:?}");
        assert_eq!(
            answered.borrow().len(),
            usize::try_from(first - 1).unwrap(),
            "nothing answered"
        );
        assert!(log.has_pending(), "the entries wait");
        // Space is back (the fault fired once): the next flush takes them all.
        block_on(log.flush()).unwrap();
        assert_eq!(
            *answered.borrow(),
            vec![true; usize::try_from(last).unwrap()]
        );
    }
    assert_eq!(segments(&mem).len(), 2);
    let log = open(&mem.crash()).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(6))));
    for i in 1..=6 {
        assert_eq!(
            block_on(log.read(LogIndex(i))).unwrap().unwrap().payload,
            big(i)
        );
    }
}

/// The flusher pauses after a flush that found no space, then tries again by itself.
#[test]
fn the_flusher_waits_for_space_and_goes_on() {
    use futureq_storage::log::faults::{FaultyIo, TRIGGER_FILE};
    use futures::task::LocalSpawnExt;
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join(TRIGGER_FILE);
    let io = FaultyIo::new(MemLogIo::new(), trigger.clone(), || {});
    let log = Rc::new(block_on(Log::open(io, CFG, Box::new(|_| {}))).unwrap());
    let mut pool = futures::executor::LocalPool::new();
    let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
    let pauses = Rc::new(RefCell::new(Vec::new()));
    let (l, p) = (Rc::clone(&log), Rc::clone(&pauses));
    pool.spawner()
        .spawn_local(async move {
            l.run_flusher(
                async {
                    let _ = stop_rx.await;
                },
                |d| {
                    p.borrow_mut().push(d);
                    futures::future::ready(())
                },
            )
            .await;
        })
        .unwrap();
    pool.run_until_stalled();
    std::fs::write(&trigger, "prealloc").unwrap();
    let done = Rc::new(RefCell::new(None));
    let d = Rc::clone(&done);
    log.append(
        vec![(Term(1), LogIndex(1), payload(1))],
        Box::new(move |r| *d.borrow_mut() = Some(r.is_ok())),
    )
    .unwrap();
    pool.run_until_stalled();
    assert_eq!(*done.borrow(), Some(true), "flushed after the pause");
    assert_eq!(
        *pauses.borrow(),
        vec![futureq_storage::log::segmented::NO_SPACE_RETRY]
    );
    let _ = stop_tx.send(());
    pool.run_until_stalled();
}

/// Review of issue 26: the wait for space is bounded. Once more than a segment's bytes wait
/// (a Raft leader whose followers commit on while its own log cannot grow), the log gives up:
/// it is poisoned and every waiter gets ENOSPC, as for any failed write.
#[test]
fn a_log_waiting_for_space_gives_up_past_a_segment_of_entries() {
    use futureq_storage::log::faults::{FaultyIo, TRIGGER_FILE};
    use futures::task::LocalSpawnExt;
    type Resume = Rc<RefCell<Option<futures::channel::oneshot::Sender<()>>>>;
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join(TRIGGER_FILE);
    let io = FaultyIo::new(MemLogIo::new(), trigger.clone(), || {});
    let log = Rc::new(block_on(Log::open(io, CFG, Box::new(|_| {}))).unwrap());
    let mut pool = futures::executor::LocalPool::new();
    let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
    // Each pause lasts until the test ends it.
    let resume: Resume = Rc::default();
    let ended = Rc::new(RefCell::new(false));
    let (l, r, e) = (Rc::clone(&log), Rc::clone(&resume), Rc::clone(&ended));
    pool.spawner()
        .spawn_local(async move {
            l.run_flusher(
                async {
                    let _ = stop_rx.await;
                },
                move |_| {
                    let (tx, rx) = futures::channel::oneshot::channel();
                    *r.borrow_mut() = Some(tx);
                    async move {
                        let _ = rx.await;
                    }
                },
            )
            .await;
            *e.borrow_mut() = true;
        })
        .unwrap();
    let answers: Rc<RefCell<Vec<bool>>> = Rc::default();
    let mut i = 0;
    while !*ended.borrow() && i < 20 {
        i += 1;
        // Still no space at the next try.
        std::fs::write(&trigger, "prealloc").unwrap();
        let a = Rc::clone(&answers);
        log.append(
            vec![(Term(1), LogIndex(i), vec![7u8; 5000])],
            Box::new(move |r| a.borrow_mut().push(r.is_ok())),
        )
        .unwrap();
        if let Some(tx) = resume.borrow_mut().take() {
            let _ = tx.send(());
        }
        pool.run_until_stalled();
        assert!(log.waiting_for_space() || *ended.borrow());
    }
    assert!(*ended.borrow(), "the flusher gave up");
    assert_eq!(i, 4, "past 16 KiB waiting");
    assert_eq!(
        *answers.borrow(),
        vec![false; 4],
        "every waiter got the error"
    );
    assert!(matches!(
        log.append(vec![(Term(1), LogIndex(5), vec![1])], Box::new(|_| {})),
        Err(LogError::Poisoned)
    ));
    let _ = stop_tx.send(());
}

#[test]
fn purging_past_the_last_entry_empties_the_log() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=10);
    block_on(log.purge(LogIndex(20))).unwrap();
    assert_eq!(log.bounds(), None);
    assert!(segments(&io).is_empty());
    fill(&log, 21..=22);
    check_all(&log, 21..=22);
    let log = open(&io.crash()).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(21), LogIndex(22))));
}

#[test]
fn truncating_everything_then_appending_starts_over() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    // Flushed, and still pending: both are cut.
    for flush_first in [true, false] {
        log.append(
            vec![(Term(0), LogIndex(0), b"mine".to_vec())],
            Box::new(|_| {}),
        )
        .unwrap();
        if flush_first {
            block_on(log.flush()).unwrap();
        }
        block_on(log.truncate(LogIndex(0))).unwrap();
        assert_eq!(log.bounds(), None);
        append_the_leaders_entries(&log, &io);
        block_on(log.truncate(LogIndex(0))).unwrap();
    }
}

/// CI (a torn-write round of the cluster's disk-fault test): a follower installing a snapshot
/// truncates its whole log (nothing in it is committed), then purges up to the snapshot; the
/// log, empty, kept its segment named after the old first index, and the entries after the
/// snapshot were written into it at offset 0: readable until a restart, which refused the log
/// ("index out of sequence" at byte 0). An emptied log keeps no segment; the next append, at
/// any index, starts one named after it.
#[test]
fn a_log_emptied_by_truncate_takes_any_next_index_across_a_restart() {
    for purge_after in [false, true] {
        let io = MemLogIo::new();
        let log = open(&io).unwrap();
        fill(&log, 0..=5);
        block_on(log.truncate(LogIndex(0))).unwrap();
        if purge_after {
            block_on(log.purge(LogIndex(9))).unwrap();
        }
        assert_eq!(log.bounds(), None);
        assert!(segments(&io).is_empty(), "{:?}", segments(&io));
        fill(&log, 10..=12);
        check_all(&log, 10..=12);
        drop(log);
        let log = open(&io.crash()).unwrap();
        assert_eq!(log.bounds(), Some((LogIndex(10), LogIndex(12))));
        check_all(&log, 10..=12);
    }
    // The same from a first index other than 0, and from below the first index.
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 3..=8);
    block_on(log.purge(LogIndex(2))).unwrap();
    block_on(log.truncate(LogIndex(1))).unwrap();
    assert_eq!(log.bounds(), None);
    fill(&log, 20..=21);
    let log = open(&io.crash()).unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(20), LogIndex(21))));
}

/// Emptying a log of several segments removes them all, last first: a crash part way leaves
/// a prefix of them (the mark cleared first), which opens as a shorter log, contiguous.
#[test]
fn a_crash_while_a_log_is_emptied_leaves_a_prefix_that_opens() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 0..=400);
    let names = segments(&io);
    assert!(names.len() > 3, "{names:?}");
    let images: Vec<Vec<u8>> = names.iter().map(|n| io.file(n).unwrap()).collect();
    block_on(log.truncate(LogIndex(0))).unwrap();
    assert!(segments(&io).is_empty(), "{:?}", segments(&io));
    drop(log);
    // The crash came after the last two removals.
    let crashed = io.crash();
    for (n, img) in names.iter().zip(&images).take(2) {
        crashed.set_file(n, img.clone());
    }
    let log = open(&crashed).unwrap();
    let third: u64 = names[2].trim_end_matches(".log").parse().unwrap();
    assert_eq!(log.bounds(), Some((LogIndex(0), LogIndex(third - 1))));
    check_all(&log, 0..=third - 1);
}

/// Review finding: a torn cut that removes every segment while the mark (lagging) is below
/// them left the mark behind; with no append before the next stop, that open refused the log
/// ("entries up to the durable mark are missing").
#[test]
fn a_torn_cut_of_every_segment_clears_the_mark() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 0..=4);
    let mark_at_4 = io.file(MARK_FILE).unwrap();
    fill(&log, 5..=400);
    let names = segments(&io);
    let second: u64 = names[1].trim_end_matches(".log").parse().unwrap();
    block_on(log.purge(LogIndex(second - 1))).unwrap();
    assert_eq!(log.bounds().map(|b| b.0), Some(LogIndex(second)));
    drop(log);
    // The mark as it was after the first flush (a later save may have lagged that much).
    let crashed = io.crash();
    crashed.set_file(MARK_FILE, mark_at_4);
    let mut img = io.file(&names[1]).unwrap();
    img[..64].fill(0);
    let torn = damaged(&crashed, &names[1], img);
    let log = open(&torn).unwrap();
    assert_eq!((log.bounds(), log.durable_mark()), (None, None));
    drop(log);
    let log = open(&torn.crash()).unwrap();
    assert_eq!(log.bounds(), None);
}

/// A data directory written before the fix above may hold an emptied log's leftover segment
/// (and a mark below it): the open drops both, so the next append starts its own segment.
#[test]
fn an_empty_leftover_segment_is_dropped_at_open() {
    let marked = MemLogIo::new();
    let log = open(&marked).unwrap();
    fill(&log, 0..=4);
    assert_eq!(log.durable_mark(), Some(LogIndex(4)));
    for with_mark in [false, true] {
        let io = MemLogIo::new();
        if with_mark {
            io.set_file(MARK_FILE, marked.file(MARK_FILE).unwrap());
        }
        block_on(io.open(&format!("{:020}.log", 5), CFG.segment_bytes)).unwrap();
        let log = open(&io).unwrap();
        assert_eq!((log.bounds(), log.durable_mark()), (None, None));
        assert!(segments(&io).is_empty(), "{:?}", segments(&io));
        fill(&log, 10..=11);
        let log = open(&io.crash()).unwrap();
        assert_eq!(log.bounds(), Some((LogIndex(10), LogIndex(11))));
    }
}

/// [`MemLogIo`] that is slow where a test says:
/// - `writes` counts writes; each yields to the executor first (the first one the longest, so
///   it finishes after a later one), letting other log calls run while a flush is writing;
/// - `mark_open`, while false, holds back the fsync of the durable mark.
struct SlowIo {
    io: MemLogIo,
    writes: std::cell::Cell<u32>,
    mark_open: Rc<std::cell::Cell<bool>>,
}

impl SlowIo {
    fn new(io: MemLogIo) -> Self {
        SlowIo {
            io,
            writes: std::cell::Cell::new(0),
            mark_open: Rc::new(std::cell::Cell::new(true)),
        }
    }
}

impl LogIo for SlowIo {
    async fn list(&self) -> std::io::Result<Vec<String>> {
        self.io.list().await
    }
    async fn open(&self, name: &str, len: u64) -> std::io::Result<()> {
        self.io.open(name, len).await
    }
    async fn remove(&self, name: &str) -> std::io::Result<()> {
        self.io.remove(name).await
    }
    async fn read_at(&self, name: &str, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.io.read_at(name, offset, len).await
    }
    async fn write_at(&self, name: &str, offset: u64, data: Vec<u8>) -> std::io::Result<()> {
        let n = self.writes.get();
        self.writes.set(n + 1);
        for _ in 0..if n == 0 { 4 } else { 1 } {
            futures_lite::future::yield_now().await;
        }
        self.io.write_at(name, offset, data).await
    }
    async fn sync(&self, name: &str) -> std::io::Result<()> {
        while name == futureq_storage::log::segmented::MARK_FILE && !self.mark_open.get() {
            futures_lite::future::yield_now().await;
        }
        self.io.sync(name).await
    }
    async fn len(&self, name: &str) -> std::io::Result<u64> {
        self.io.len(name).await
    }
}

/// Regression: a truncate issued while the flusher was writing the entry it cuts used to be
/// undone by that flush's bookkeeping, so the next append landed behind the stale entry and
/// reads found the wrong record ("record changed on disk").
#[test]
fn truncate_waits_for_a_flush_in_progress() {
    let io = MemLogIo::new();
    let log = block_on(Log::open(SlowIo::new(io.clone()), CFG, Box::new(|_| {}))).unwrap();
    log.append(
        vec![(Term(0), LogIndex(0), b"mine".to_vec())],
        Box::new(|_| {}),
    )
    .unwrap();
    block_on(async {
        let flush = log.flush();
        // Polled after the flush reached its (yielding) write.
        let cut = log.truncate(LogIndex(0));
        let (f, t) = futures::join!(flush, cut);
        f.unwrap();
        t.unwrap();
    });
    append_the_leaders_entries(&log, &io);
}

/// Issue 29 (a leader fenced itself during a disk stall): a purge's file removals (each with
/// a directory fsync, which can wait behind seconds of the file system's dirty data) must not
/// hold back the flushes of new entries. They ran under the log's write side, so a follower's
/// log flushed nothing until its purge was through.
#[test]
fn a_flush_does_not_wait_for_a_purges_file_removals() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=300);
    let before = segments(&io).len();
    io.hold_removals(true);
    let flushed_while_removing = block_on(async {
        let purge = log.purge(LogIndex(150));
        let flush = async {
            // Polled after the purge reached its (held) removal.
            futures_lite::future::yield_now().await;
            log.append(
                vec![(Term(1), LogIndex(301), payload(301))],
                Box::new(|r| r.unwrap()),
            )
            .unwrap();
            log.flush().await.unwrap();
            let during = io.removals_waiting() > 0;
            io.hold_removals(false);
            during
        };
        let (p, during) = futures::join!(purge, flush);
        p.unwrap();
        during
    });
    assert!(
        flushed_while_removing,
        "the flush waited for the purge's removals"
    );
    assert!(segments(&io).len() < before);
    check_all(&log, 151..=301);
    let log = open(&io.crash()).unwrap();
    assert_eq!(log.bounds().map(|b| b.1), Some(LogIndex(301)));
}

/// Review of issue 29: a purge's files are removed after the log forgot them, in the
/// background, so a crash (or a failed removal) can leave an older purged segment with a later
/// one gone: a gap the scan took for lost entries (refused, or cut as a torn tail with every
/// entry after it). Opened with the purge's record, such segments are dropped first.
#[test]
fn segments_a_purge_left_behind_below_a_gap_are_dropped_at_open() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=300);
    let names = segments(&io);
    assert!(names.len() >= 4, "{names:?}");
    let first_of = |n: &str| n.trim_end_matches(".log").parse::<u64>().unwrap();
    let upto = first_of(&names[3]) - 1;
    let doomed = block_on(log.forget(LogIndex(upto))).unwrap();
    assert_eq!(doomed, names[..3].to_vec());
    // The second one's removal went through, the first one's not.
    block_on(io.remove(&names[1])).unwrap();
    drop(log);
    assert!(
        matches!(open(&io.crash()), Err(LogError::Corrupt { .. })),
        "the gap before the durable mark is taken for lost entries"
    );
    let crashed = io.crash();
    let log = block_on(Log::open_purged(
        crashed.clone(),
        CFG,
        None,
        Some(LogIndex(upto)),
    ))
    .unwrap();
    assert_eq!(segments(&crashed), names[3..].to_vec());
    assert_eq!(log.bounds(), Some((LogIndex(upto + 1), LogIndex(300))));
    check_all(&log, upto + 1..=300);
}

/// After the entry at index 0 was cut: the new leader's entries 0 and 1 are appended,
/// flushed, read back, and found again by a reopen of `io`.
fn append_the_leaders_entries<I: LogIo>(log: &Log<I>, io: &MemLogIo) {
    log.append(
        vec![
            (Term(0), LogIndex(0), b"leader".to_vec()),
            (Term(1), LogIndex(1), payload(1)),
        ],
        Box::new(|_| {}),
    )
    .unwrap();
    block_on(log.flush()).unwrap();
    assert_eq!(
        block_on(log.read(LogIndex(0))).unwrap().unwrap().payload,
        b"leader"
    );
    assert_eq!(
        block_on(log.read(LogIndex(1))).unwrap().unwrap().payload,
        payload(1)
    );
    let reopened = open(io).unwrap();
    assert_eq!(reopened.bounds(), Some((LogIndex(0), LogIndex(1))));
    assert_eq!(
        block_on(reopened.read(LogIndex(1)))
            .unwrap()
            .unwrap()
            .payload,
        payload(1)
    );
}

#[test]
fn the_entry_cache_serves_recent_reads_and_forgets_what_truncate_and_purge_remove() {
    let cfg = LogConfig {
        cache_bytes: 4096,
        ..CFG
    };
    let io = MemLogIo::new();
    let log = block_on(Log::open(io.clone(), cfg, Box::new(|_| {}))).unwrap();
    fill(&log, 1..=300);
    // The newest entries come from memory; their bytes fit the bound.
    let reads = io.reads();
    check_all(&log, 291..=300);
    assert_eq!(io.reads(), reads, "recent entries are read from the cache");
    // Older ones were evicted (the cache holds at most 4 KiB) and come from the segments.
    check_all(&log, 1..=10);
    assert_eq!(io.reads(), reads + 10);
    // A truncated suffix rewritten in a new term is never served stale from the cache.
    block_on(log.truncate(LogIndex(295))).unwrap();
    assert!(block_on(log.read(LogIndex(296))).unwrap().is_none());
    for i in 295..=297 {
        log.append(
            vec![(Term(2), LogIndex(i), vec![7; 5])],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
    }
    block_on(log.flush()).unwrap();
    check_all(&log, 290..=294);
    for i in 295..=297 {
        let r = block_on(log.read(LogIndex(i))).unwrap().unwrap();
        assert_eq!((r.term, r.payload), (Term(2), vec![7; 5]));
    }
    // Purging everything empties the cache too: a log restarted at another index serves
    // only the new entries.
    block_on(log.purge(LogIndex(297))).unwrap();
    assert_eq!(log.bounds(), None);
    log.append(
        vec![(Term(3), LogIndex(1000), vec![9; 3])],
        Box::new(|r| r.unwrap()),
    )
    .unwrap();
    block_on(log.flush()).unwrap();
    assert!(block_on(log.read(LogIndex(297))).unwrap().is_none());
    assert_eq!(
        block_on(log.read(LogIndex(1000))).unwrap().unwrap().payload,
        vec![9; 3]
    );
}

/// Byte offset of record `index` in a one-segment log written by [`fill`] from index 1.
fn record_offset(index: u64) -> usize {
    (1..index).map(|i| 24 + payload(i).len()).sum()
}

/// Issue 10.7: an O_DIRECT flush of several blocks may persist a later block and not an
/// earlier one. Nothing of that flush was acknowledged (its fsync never returned), so the
/// valid-looking records after the hole are a torn tail, not corruption: the log opens with
/// everything up to the durable mark and cuts the rest durably.
#[test]
fn a_later_block_persisted_before_an_earlier_one_is_a_torn_tail() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=5);
    block_on(log.save_mark()).unwrap();
    assert_eq!(log.durable_mark(), Some(LogIndex(5)));
    let mark_before = io.file(futureq_storage::log::segmented::MARK_FILE).unwrap();
    let name = segments(&io)[0].clone();
    let old = io.file(&name).unwrap();
    fill(&log, 6..=80);
    let mut img = io.file(&name).unwrap();
    // The flush rewrote block 0 and wrote blocks 1, 2, ...; block 1 never reached the disk
    // (it keeps its old bytes), later blocks did.
    let hole = 4096..8192;
    assert!(
        record_offset(6) < hole.start,
        "block 0 holds the marked records"
    );
    assert!(
        record_offset(80) > hole.end + 512,
        "later blocks hold records"
    );
    img[hole.clone()].copy_from_slice(&old[hole]);
    let crashed = damaged(&io, &name, img);
    crashed.set_file(futureq_storage::log::segmented::MARK_FILE, mark_before);
    let log = open(&crashed).unwrap_or_else(|e| panic!("a torn flush must not stop the node: {e}"));
    let (LogIndex(first), LogIndex(last)) = log.bounds().unwrap();
    assert_eq!(first, 1);
    assert!(
        last >= 5 && record_offset(last + 1) <= 4096,
        "cut before the hole: {last}"
    );
    check_all(&log, 1..=last);
    // The cut is durable: the stale records after the hole never come back.
    let reopened = crashed.crash();
    let again = open(&reopened).unwrap();
    assert_eq!(again.bounds(), Some((LogIndex(1), LogIndex(last))));
    fill(&again, last + 1..=last + 3);
    let again = open(&reopened.crash()).unwrap();
    assert_eq!(again.bounds(), Some((LogIndex(1), LogIndex(last + 3))));
    check_all(&again, 1..=last + 3);
}

/// Issue 10.7: an all-zero header inside durable data is not the end of the log: entries
/// after it were acknowledged. The log refuses to open instead of dropping them silently.
#[test]
fn a_zeroed_header_before_the_durable_mark_is_corruption() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=9);
    block_on(log.save_mark()).unwrap();
    let name = segments(&io)[0].clone();
    let mut img = io.file(&name).unwrap();
    let at = record_offset(3);
    for b in &mut img[at..at + 24] {
        *b = 0;
    }
    match open(&damaged(&io, &name, img)) {
        Err(LogError::Corrupt { offset, .. }) => assert_eq!(offset as usize, at),
        other => panic!("expected corruption, got {:?}", other.map(|l| l.bounds())),
    }
    // Entries missing at the end (a lost last block) are corruption too.
    let mut img = io.file(&name).unwrap();
    let at = record_offset(8);
    for b in &mut img[at..] {
        *b = 0;
    }
    assert!(matches!(
        open(&damaged(&io, &name, img)),
        Err(LogError::Corrupt { .. })
    ));
}

/// Issue 10.7: a crash in the middle of a truncate that spans segments leaves a log that
/// opens: later segments are removed before the cut, and a cut segment followed by stale
/// later ones (the old order) is a torn tail, since the mark was lowered first.
#[test]
fn a_crash_inside_a_truncate_leaves_a_log_that_opens() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=300);
    block_on(log.save_mark()).unwrap();
    let names = segments(&io);
    assert!(names.len() >= 3, "{names:?}");
    let before: Vec<(String, Vec<u8>)> = names
        .iter()
        .map(|n| (n.clone(), io.file(n).unwrap()))
        .collect();
    block_on(log.truncate(LogIndex(20))).unwrap();
    assert_eq!(
        log.durable_mark(),
        Some(LogIndex(19)),
        "lowered before the cut"
    );
    assert_eq!(segments(&io), names[..1].to_vec());
    // The cut happened but the later segments are still there.
    let stale = io.crash();
    for (n, img) in &before[1..] {
        stale.set_file(n, img.clone());
    }
    let log = open(&stale).unwrap_or_else(|e| panic!("must open: {e}"));
    assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(19))));
    assert_eq!(
        segments(&stale),
        names[..1].to_vec(),
        "stale segments removed"
    );
    // The later segments are gone but the cut did not happen yet: the log ends early.
    let uncut = io.crash();
    uncut.set_file(&before[0].0, before[0].1.clone());
    let log = open(&uncut).unwrap();
    assert_eq!(log.bounds().map(|b| b.0), Some(LogIndex(1)));
    assert!(log.bounds().unwrap().1 >= LogIndex(19));
}

/// The durable mark lags after a second flush inside MARK_INTERVAL; once the log was quiet
/// for MARK_INTERVAL, `mark_lags` tells the flusher's timer to save it (the raft log store
/// does, every MARK_INTERVAL).
#[test]
fn a_lagging_mark_is_reported_and_saved() {
    let io = MemLogIo::new();
    let log = open(&io).unwrap();
    fill(&log, 1..=3);
    assert_eq!(
        log.durable_mark(),
        Some(LogIndex(3)),
        "the first flush saves it"
    );
    fill(&log, 4..=6);
    // A flush within MARK_INTERVAL of the last save leaves it behind (a slow machine may
    // have saved it already); a log that just flushed is not quiet.
    assert!(!log.mark_lags(), "reported right after a flush");
    std::thread::sleep(futureq_storage::log::segmented::MARK_INTERVAL);
    assert_eq!(log.mark_lags(), log.durable_mark() == Some(LogIndex(3)));
    block_on(log.save_mark()).unwrap();
    assert!(!log.mark_lags());
    assert_eq!(log.durable_mark(), Some(LogIndex(6)));
    // It survives a crash with the data it names.
    let again = open(&io.crash()).unwrap();
    assert_eq!(again.durable_mark(), Some(LogIndex(6)));
    assert_eq!(again.bounds(), Some((LogIndex(1), LogIndex(6))));
}

/// Disk faults through the I/O seam ([`FaultyIo`]): a write torn by a crash — one-block (new
/// first half, old second half) or multi-block (first block old, later blocks new) — after
/// any number of durable records, with the durable mark saved right before: the log reopens
/// with every durable record, and the torn one is gone (or whole, if its part persisted).
#[test]
fn a_torn_write_after_durable_records_reopens_without_it() {
    use futureq_storage::log::faults::{FaultyIo, TRIGGER_FILE};
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join(TRIGGER_FILE);
    let mut cut = 0;
    for durable in 1..=30u64 {
        for torn_len in [40usize, 9_000] {
            let mem = MemLogIo::new();
            let log = block_on(Log::open(
                FaultyIo::new(mem.clone(), trigger.clone(), || {}),
                CFG,
                Box::new(|_| {}),
            ))
            .unwrap();
            for i in 1..=durable {
                log.append(
                    vec![(Term(1), LogIndex(i), payload(i))],
                    Box::new(|r| r.unwrap()),
                )
                .unwrap();
            }
            block_on(log.flush()).unwrap();
            block_on(log.save_mark()).unwrap();
            std::fs::write(&trigger, "torn").unwrap();
            log.append(
                vec![(Term(1), LogIndex(durable + 1), vec![0xAB; torn_len])],
                Box::new(|_| {}),
            )
            .unwrap();
            assert!(block_on(log.flush()).is_err(), "the torn flush fails");
            let reopened = open(&mem.crash())
                .unwrap_or_else(|e| panic!("{durable} durable, {torn_len} B torn: {e}"));
            check_all(&reopened, 1..=durable);
            // The torn record is gone, or whole if the part that persisted held all of it.
            match block_on(reopened.read(LogIndex(durable + 1))).unwrap() {
                Some(r) => assert_eq!(r.payload, vec![0xAB; torn_len]),
                None => cut += 1,
            }
        }
    }
    assert!(
        cut >= 30,
        "the multi-block torn writes were cut ({cut} cut)"
    );
}

/// Under load the durable mark is saved beside a group's write, not before the next group:
/// a group's callbacks run while the mark's fsync is still out, and the mark then names the
/// entries flushed before that group.
#[test]
fn a_due_mark_is_saved_while_the_next_group_is_written() {
    let io = SlowIo::new(MemLogIo::new());
    let gate = Rc::clone(&io.mark_open);
    let log = block_on(Log::open(io, CFG, Box::new(|_| {}))).unwrap();
    let append = |i: u64, done: Rc<std::cell::Cell<bool>>| {
        log.append(
            vec![(Term(1), LogIndex(i), payload(i))],
            Box::new(move |r| {
                r.unwrap();
                done.set(true);
            }),
        )
        .unwrap();
    };
    append(1, Rc::default());
    block_on(log.flush()).unwrap();
    assert_eq!(
        log.durable_mark(),
        Some(LogIndex(1)),
        "the first flush saves it"
    );
    // Flushes until one leaves the mark behind (on a slow machine a flush may come past
    // MARK_INTERVAL and save it).
    let mut last = 1;
    while log.durable_mark() == Some(LogIndex(last)) {
        last += 1;
        assert!(last < 20, "every flush saved the mark");
        append(last, Rc::default());
        block_on(log.flush()).unwrap();
    }
    let saved = log.durable_mark();
    // Past MARK_INTERVAL the next flush saves the mark, with its fsync held back.
    std::thread::sleep(futureq_storage::log::segmented::MARK_INTERVAL);
    gate.set(false);
    let done = Rc::new(std::cell::Cell::new(false));
    append(last + 1, Rc::clone(&done));
    block_on(async {
        let flush = std::pin::pin!(log.flush());
        let watch = async {
            while !done.get() {
                futures_lite::future::yield_now().await;
            }
            // The new entry is acknowledged while the mark's fsync still waits.
            assert_eq!(log.durable_mark(), saved);
            gate.set(true);
        };
        let (flushed, ()) = futures::join!(flush, watch);
        flushed.unwrap();
    });
    assert_eq!(
        log.durable_mark(),
        Some(LogIndex(last)),
        "saved up to the earlier groups"
    );
}

/// Issue 26.3: a truncate writes the entries still pending before it cuts, but the persist
/// hook (a LEADER ack) hears only of those it keeps: an entry the truncation removes is never
/// reported durable. It used to be reported, acking a write that was then cut.
#[test]
fn truncate_reports_no_entry_it_cuts_as_persisted() {
    let io = MemLogIo::new();
    let (log, persisted) = open_recording(&io);
    for i in 1..=10 {
        log.append(
            vec![(Term(1), LogIndex(i), payload(i))],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
    }
    block_on(log.truncate(LogIndex(4))).unwrap();
    let seen = persisted.borrow().clone();
    assert_eq!(
        seen,
        (1..=3).map(payload).collect::<Vec<_>>(),
        "only the kept entries"
    );
    assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(3))));
}

/// Issue 29 (an election with no fault): a flush copied every pending record into one buffer
/// on the reactor. On a leader that fell behind its disk, 18 entries of 3 MB (53 MB) took
/// 175 ms to copy, heartbeats stopped for 231 ms and the followers elected another leader.
/// A flush now writes each segment's bytes in block-aligned pieces of at most
/// `WRITE_BYTES_MAX` that do not overlap (as few as the bytes need, whatever the record
/// sizes: a record larger than a piece spans several), and still syncs each touched segment
/// once; what they wrote reads back and survives a crash.
#[test]
fn a_flush_writes_in_bounded_pieces_and_syncs_once() {
    use futureq_storage::log::format::BLOCK;
    use futureq_storage::log::segmented::{WRITES_IN_FLIGHT, WRITE_BYTES_MAX};
    let record =
        |len: usize, i: u64| -> Vec<u8> { (0..len).map(|j| (i as usize + j) as u8).collect() };
    let large = |i: u64| {
        record(
            WRITE_BYTES_MAX * 7 / 10 + usize::try_from(i).unwrap() * 1000,
            i,
        )
    };
    let cases: [(u64, Vec<Vec<u8>>); 3] = [
        // Large records, and one over the piece size, in one segment and across rolls.
        (
            64 << 20,
            (1..=12)
                .map(large)
                .chain([record(WRITE_BYTES_MAX * 3 / 2, 13)])
                .collect(),
        ),
        (
            4 << 20,
            (1..=12)
                .map(large)
                .chain([record(WRITE_BYTES_MAX * 3 / 2, 13)])
                .collect(),
        ),
        // Many small records: pieces hold many of them.
        (
            64 << 20,
            (1..=3_000)
                .map(|i| record(1_000 + usize::try_from(i % 7).unwrap(), i))
                .collect(),
        ),
    ];
    for ((segment_bytes, records), delayed) in cases
        .into_iter()
        .flat_map(|c| [(c.clone(), false), (c, true)])
    {
        let io = MemLogIo::new();
        if delayed {
            io.delay_writes();
        }
        let cfg = LogConfig {
            segment_bytes,
            cache_bytes: 0,
        };
        let log = block_on(Log::open(io.clone(), cfg, Box::new(|_| {}))).unwrap();
        // A first flush leaves a partial block, which the next rewrites ahead of its records.
        let appended: Vec<Vec<u8>> = std::iter::once(record(100, 0)).chain(records).collect();
        for (i, r) in (1u64..).zip(&appended) {
            log.append(
                vec![(Term(1), LogIndex(i), r.clone())],
                Box::new(|r| r.unwrap()),
            )
            .unwrap();
            if i == 1 {
                block_on(log.flush()).unwrap();
            }
        }
        let before = io.events().len();
        block_on(log.flush()).unwrap();
        let events = io.events().split_off(before);
        // (segment, offset, length) of each write to a segment.
        let mut written: Vec<(&str, u64, u64)> = events
            .iter()
            .filter_map(|e| {
                let (at, len) = e.strip_prefix("write ")?.rsplit_once('+')?;
                let (name, offset) = at.split_once('@')?;
                name.ends_with(".log")
                    .then_some((name, offset.parse().ok()?, len.parse().ok()?))
            })
            .collect();
        // Done in any order when delayed.
        written.sort_unstable();
        let segments: std::collections::BTreeSet<&str> = written.iter().map(|w| w.0).collect();
        assert_eq!(segments.len() > 1, segment_bytes == 4 << 20, "{segments:?}");
        for seg in &segments {
            let pieces: Vec<(u64, u64)> = written
                .iter()
                .filter(|w| w.0 == *seg)
                .map(|w| (w.1, w.2))
                .collect();
            let total: u64 = pieces.iter().map(|p| p.1).sum();
            assert!(
                pieces
                    .iter()
                    .all(|p| p.1 <= WRITE_BYTES_MAX as u64 && p.0 % BLOCK == 0),
                "{seg}: {pieces:?}"
            );
            assert!(
                pieces.windows(2).all(|w| w[1].0 == w[0].0 + w[0].1),
                "{seg}: contiguous, not overlapping: {pieces:?}"
            );
            assert_eq!(
                pieces.len() as u64,
                total.div_ceil(WRITE_BYTES_MAX as u64),
                "{seg}: as few pieces as the bytes need: {pieces:?}"
            );
        }
        assert!(written.len() > 2, "in pieces: {written:?}");
        let most = io.most_writes_in_flight();
        if delayed {
            assert!((2..=WRITES_IN_FLIGHT).contains(&most), "{most} in flight");
        }
        let synced = events
            .iter()
            .filter(|e| e.starts_with("sync ") && e.ends_with(".log"))
            .count();
        assert_eq!(synced, segments.len(), "one sync per touched segment");
        // The next flush rewrites the partial block the pieces left (their tail) ahead of its
        // record: read all of it back from the same log, then after a crash.
        let appended: Vec<Vec<u8>> = appended.into_iter().chain([record(300, 1)]).collect();
        let last = appended.len() as u64;
        log.append(
            vec![(
                Term(1),
                LogIndex(last),
                appended[appended.len() - 1].clone(),
            )],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
        block_on(log.flush()).unwrap();
        for l in [
            log,
            block_on(Log::open(io.crash(), cfg, Box::new(|_| {}))).unwrap(),
        ] {
            for (i, r) in (1u64..).zip(&appended) {
                let got = block_on(l.read(LogIndex(i))).unwrap().expect("present");
                assert!(got.payload == *r, "entry {i}");
            }
        }
    }
}
