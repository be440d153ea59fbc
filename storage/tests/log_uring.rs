//! The segmented log on real files through io_uring (glommio `DmaFile`).
#![cfg(feature = "glommio")]

use std::io::{Seek, SeekFrom, Write};

use futureq_storage::log::uring::DmaLogIo;
use futureq_storage::log::{Log, LogConfig, LogIndex, Term};
use glommio::{LocalExecutorBuilder, Placement};

const CFG: LogConfig = LogConfig {
    segment_bytes: 64 * 1024,
    cache_bytes: 0,
};

/// Runs `f` on a small glommio executor and returns its result.
fn run_with<T: Send + 'static, F: std::future::Future<Output = T> + 'static>(
    f: impl FnOnce() -> F + Send + 'static,
) -> T {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(512 << 10)
        .spawn(move || async move { f().await })
        .expect("executor")
        .join()
        .expect("test body")
}

/// Runs `f` on a small glommio executor (small io memory: several tests run at once).
fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    run_with(f);
}

fn payload(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; (i * 53 % 700) as usize]
}

#[test]
fn entries_survive_reopen_on_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let log = Log::open(DmaLogIo::new(&path).unwrap(), CFG, Box::new(|_| {}))
            .await
            .unwrap();
        for i in 1..=400u64 {
            log.append(
                vec![(Term(1), LogIndex(i), payload(i))],
                Box::new(|r| r.unwrap()),
            )
            .unwrap();
            if i % 37 == 0 {
                log.flush().await.unwrap();
            }
        }
        log.flush().await.unwrap();
        // Read back in the executor that wrote (a direct-I/O read here once failed).
        for i in [1u64, 37, 400] {
            assert_eq!(
                log.read(LogIndex(i)).await.unwrap().unwrap().payload,
                payload(i)
            );
        }
        // Entries being flushed stay readable while the write is in flight.
        log.append(
            vec![(Term(1), LogIndex(401), payload(401))],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
        let (flushed, read) = futures::join!(log.flush(), log.read(LogIndex(401)));
        flushed.unwrap();
        assert_eq!(read.unwrap().unwrap().payload, payload(401));
        log.truncate(LogIndex(401)).await.unwrap();
    });
    let path = dir.path().to_path_buf();
    run(move || async move {
        let log = Log::open(DmaLogIo::new(&path).unwrap(), CFG, Box::new(|_| {}))
            .await
            .unwrap();
        assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(400))));
        for i in 1..=400u64 {
            assert_eq!(
                log.read(LogIndex(i)).await.unwrap().unwrap().payload,
                payload(i)
            );
        }
        log.truncate(LogIndex(350)).await.unwrap();
        log.purge(LogIndex(200)).await.unwrap();
        let (LogIndex(first), LogIndex(last)) = log.bounds().unwrap();
        assert!(first > 1 && first <= 201 && last == 349, "{first}..{last}");
    });
    assert!(
        !dir.path().join("00000000000000000001.log").exists(),
        "the purged segment's file is gone"
    );
    assert!(std::fs::read_dir(dir.path()).unwrap().count() >= 1);
}

#[test]
fn a_torn_tail_on_disk_is_cut_at_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p2 = path.clone();
    run(move || async move {
        let log = Log::open(DmaLogIo::new(&p2).unwrap(), CFG, Box::new(|_| {}))
            .await
            .unwrap();
        for i in 1..=5u64 {
            log.append(
                vec![(Term(1), LogIndex(i), payload(i))],
                Box::new(|r| r.unwrap()),
            )
            .unwrap();
        }
        log.flush().await.unwrap();
    });
    // Damage the last record's last bytes as an interrupted write would; the durable mark
    // (saved after the first flush) must not cover it then: drop it.
    std::fs::remove_file(path.join(futureq_storage::log::segmented::MARK_FILE)).unwrap();
    let seg = path.join("00000000000000000001.log");
    let bytes = std::fs::read(&seg).unwrap();
    let end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    let mut f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.seek(SeekFrom::Start((end - 3) as u64)).unwrap();
    f.write_all(&[0x55, 0x55, 0x55]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    run(move || async move {
        let log = Log::open(DmaLogIo::new(&path).unwrap(), CFG, Box::new(|_| {}))
            .await
            .unwrap();
        assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(4))));
        log.append(
            vec![(Term(2), LogIndex(5), b"again".to_vec())],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
        log.flush().await.unwrap();
        assert_eq!(
            log.read(LogIndex(5)).await.unwrap().unwrap().payload,
            b"again"
        );
    });
}

/// Segments are zero-filled when created (no unwritten extents for an fsync to convert) and
/// the next one is prepared in the background: a roll renames it into place. The spare is
/// never taken for a segment, and a log reopened beside one reads back every entry.
#[test]
fn rolls_take_the_prepared_segment_and_the_spare_is_never_a_segment() {
    const BIG: LogConfig = LogConfig {
        segment_bytes: 1 << 20,
        cache_bytes: 0,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let entry = |i: u64| vec![(i % 251) as u8; 100_000];
    let spares = run_with(move || async move {
        let log = Log::open(DmaLogIo::new(&path).unwrap(), BIG, Box::new(|_| {}))
            .await
            .unwrap();
        let mut spares = std::collections::HashSet::new();
        for i in 1..=40u64 {
            log.append(
                vec![(Term(1), LogIndex(i), entry(i))],
                Box::new(|r| r.unwrap()),
            )
            .unwrap();
            log.flush().await.unwrap();
            // Let the background preparation run between rolls.
            glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
            for e in std::fs::read_dir(&path).unwrap() {
                let e = e.unwrap();
                if e.file_name().to_string_lossy().ends_with(".spare") {
                    spares.insert(std::os::unix::fs::MetadataExt::ino(&e.metadata().unwrap()));
                }
            }
        }
        spares
    });
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let segments: Vec<&String> = names.iter().filter(|n| n.ends_with(".log")).collect();
    assert!(segments.len() >= 4, "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".spare")), "{names:?}");
    let mut taken = 0;
    for s in &segments {
        let meta = std::fs::metadata(dir.path().join(s)).unwrap();
        assert_eq!(meta.len(), 1 << 20, "{s}: preallocated to the segment size");
        taken += usize::from(spares.contains(&std::os::unix::fs::MetadataExt::ino(&meta)));
    }
    assert!(
        taken >= 2,
        "rolls renamed prepared spares into place ({taken} of {segments:?})"
    );
    let path = dir.path().to_path_buf();
    run(move || async move {
        let log = Log::open(DmaLogIo::new(&path).unwrap(), BIG, Box::new(|_| {}))
            .await
            .unwrap();
        assert_eq!(log.bounds(), Some((LogIndex(1), LogIndex(40))));
        for i in 1..=40u64 {
            assert_eq!(
                log.read(LogIndex(i)).await.unwrap().unwrap().payload,
                entry(i)
            );
        }
    });
}

/// The real files are what `DmaLogIo::durable_writes` promises: every segment, the durable
/// mark and the vote-style files are open with `O_DSYNC` (the group commit skips its fsync
/// on that promise).
#[test]
fn the_log_files_are_open_with_o_dsync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let log = Log::open(DmaLogIo::new(&path).unwrap(), CFG, Box::new(|_| {}))
            .await
            .unwrap();
        log.append(
            vec![(Term(1), LogIndex(1), payload(1))],
            Box::new(|r| r.unwrap()),
        )
        .unwrap();
        log.flush().await.unwrap();
        let mut seen = 0;
        for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if !target.starts_with(&path) || target.to_string_lossy().ends_with(".spare") {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
                .unwrap();
            assert_ne!(
                flags & 0o10000,
                0,
                "{} without O_DSYNC: {flags:o}",
                target.display()
            );
            seen += 1;
        }
        assert!(seen >= 2, "the segment and the mark are open");
    });
}
