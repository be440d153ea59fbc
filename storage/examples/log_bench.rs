//! Raft log write throughput on this disk: entries/s and flushes/s for several group sizes.
//!
//!   cargo run --release -p futureq-storage --example log_bench -- [dir]
//!
//! Each round appends `group` entries of 200 bytes and flushes once (one `O_DSYNC` write), the
//! way the Raft core's flusher batches whatever was appended while the previous flush ran.

use std::time::{Duration, Instant};

use futureq_storage::log::uring::DmaLogIo;
use futureq_storage::log::{Log, LogConfig, LogIndex, Term};
use glommio::{LocalExecutorBuilder, Placement};

fn main() {
    let dir = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join("futureq-log-bench"),
        Into::into,
    );
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(4 << 20)
        .spawn(move || async move {
            println!("| entries per flush | entries/s | flushes/s | flush p50 µs | flush p99 µs |");
            println!("|---|---|---|---|---|");
            for group in [1usize, 8, 64, 512] {
                let _ = std::fs::remove_dir_all(&dir);
                let log = Log::open(
                    DmaLogIo::new(&dir).expect("dir"),
                    LogConfig {
                        segment_bytes: futureq_storage::log::SEGMENT_BYTES,
                        cache_bytes: futureq_storage::log::segmented::DEFAULT_CACHE_BYTES,
                    },
                    Box::new(|_| {}),
                )
                .await
                .expect("open");
                let mut index = 1u64;
                let mut flushes = Vec::new();
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(3) {
                    for _ in 0..group {
                        log.append(
                            vec![(Term(1), LogIndex(index), vec![7u8; 200])],
                            Box::new(|r| r.expect("flushed")),
                        )
                        .expect("append");
                        index += 1;
                    }
                    let t = Instant::now();
                    log.flush().await.expect("flush");
                    flushes.push(t.elapsed());
                }
                let secs = start.elapsed().as_secs_f64();
                flushes.sort();
                let pct = |q: f64| flushes[((flushes.len() - 1) as f64 * q) as usize].as_micros();
                println!(
                    "| {group} | {:.0} | {:.0} | {} | {} |",
                    (index - 1) as f64 / secs,
                    flushes.len() as f64 / secs,
                    pct(0.5),
                    pct(0.99)
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
        })
        .expect("executor")
        .join()
        .expect("bench");
}
