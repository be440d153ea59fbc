//! The backlog scenario: a standalone broker filled with far-future messages in ten equal
//! steps (the pending scenario's fill: QUORUM, batches of 100 on 4 streams), then measured with
//! that backlog. Tells whether memory stays flat in the number waiting, what each message costs
//! on disk, how long a restart takes to serve again, and what publish latency and delivery
//! lateness are with the backlog in place.
//!
//! Per step: the fill rate, the broker's RSS after the step and the largest seen during it
//! (sampled every 100 ms), and the bytes its data directory holds on disk (allocated blocks).
//! With the backlog: closed-loop publish at 1 and at 100 messages per request (8 × 4, 5 s),
//! lateness of 100,000 messages due at 10,000/s, and a restart (SIGTERM, start, the first
//! QUORUM publish acked), with the RSS after it. Writes `backlog.json` and prints a table.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::load::{drain, fill, lateness_run, publish_run, Ack, PublishParams};
use crate::procs::{standalone, RssPeaks};

/// Fill steps: RSS and disk are read after each.
const STEPS: u64 = 10;
/// Lead time of the lateness run (its messages are published first, then fall due).
const LATENESS_LEAD_MS: i64 = 2_000;

/// One fill step.
#[derive(Serialize)]
struct Step {
    /// Messages waiting after it.
    pending: u64,
    fill_msgs_per_s: f64,
    rss_mb: f64,
    peak_rss_mb: f64,
    disk_bytes: u64,
}

/// A latency figure with the backlog in place (µs).
#[derive(Serialize)]
struct Latency {
    what: String,
    msgs_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
}

#[derive(Serialize)]
struct Report {
    count: u64,
    steps: Vec<Step>,
    disk_bytes_per_msg: f64,
    with_backlog: Vec<Latency>,
    /// From the new process's start until the first QUORUM publish is acked.
    restart_to_serving_ms: f64,
    rss_after_restart_mb: f64,
}

/// Bytes the files under `dir` hold on disk (allocated blocks, so preallocated log segments
/// count in full).
fn disk_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let m = e.metadata()?;
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    Ok(total)
}

fn latency(what: &str, msgs_per_s: f64, h: &hdrhistogram::Histogram<u64>) -> Latency {
    Latency {
        what: what.to_owned(),
        msgs_per_s,
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
    }
}

/// Runs the scenario with `count` messages on the futureq binary `bin`, the broker's data under
/// `work` (it needs the disk: see docs/benchmarks.md for the bytes per message), the report
/// into `out`.
pub(crate) async fn run(bin: &Path, count: u64, work: &Path, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let work = tempfile::tempdir_in(work)?;
    let mut broker = standalone(bin, work.path()).await?;
    let data: PathBuf = work.path().join("standalone");
    let mut steps = Vec::new();
    let mut pending = 0;
    for k in 1..=STEPS {
        let n = count * k / STEPS - pending;
        let peaks = RssPeaks::start(vec![broker.pid()]);
        let rate = fill(&broker.addr, n).await?;
        let peak = peaks.stop().first().copied().unwrap_or(0.0);
        pending += n;
        let rss = broker.rss_mb().unwrap_or(0.0);
        let step = Step {
            pending,
            fill_msgs_per_s: rate,
            rss_mb: rss,
            peak_rss_mb: peak.max(rss),
            disk_bytes: disk_bytes(&data)?,
        };
        println!(
            "{pending} waiting: filled at {rate:.0} msgs/s, RSS {:.0} MiB (peak {peak:.0}), disk {:.2} GB",
            step.rss_mb,
            step.disk_bytes as f64 / 1e9
        );
        steps.push(step);
    }
    let mut with_backlog = Vec::new();
    for batch in [1, 100] {
        let p = PublishParams::new(8, 4, batch, 100, Duration::from_secs(5), Ack::Quorum);
        let o = publish_run(&broker.addr, &p.delayed(3_600_000, false)).await?;
        let what = format!("publish QUORUM, {batch}/request, 8 × 4 (ack latency)");
        with_backlog.push(latency(&what, o.msgs_per_s, &o.latency));
    }
    let (h, early) = lateness_run(&broker.addr, 100_000, 10_000, LATENESS_LEAD_MS).await?;
    let what = format!("lateness, 100000 due at 10000/s ({early} early)");
    with_backlog.push(latency(&what, 10_000.0, &h));
    let t0 = Instant::now();
    let listening = broker.restart().await?;
    let stopped = t0.elapsed() - listening;
    drain(&broker.addr).await?;
    let restart = t0.elapsed() - stopped;
    let report = Report {
        count,
        disk_bytes_per_msg: steps
            .last()
            .map_or(0.0, |s| s.disk_bytes as f64 / count as f64),
        steps,
        with_backlog,
        restart_to_serving_ms: restart.as_secs_f64() * 1000.0,
        rss_after_restart_mb: broker.rss_mb().unwrap_or(0.0),
    };
    broker.stop()?;
    std::fs::write(
        out.join("backlog.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    print!("{}", table(&report));
    Ok(())
}

/// The report as markdown.
fn table(r: &Report) -> String {
    let mut t = String::from(
        "\n| waiting | fill msgs/s | RSS MiB after | peak RSS MiB | disk GB |\n|---|---|---|---|---|\n",
    );
    for s in &r.steps {
        t.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} |\n",
            s.pending,
            s.fill_msgs_per_s,
            s.rss_mb,
            s.peak_rss_mb,
            s.disk_bytes as f64 / 1e9
        ));
    }
    t.push_str(&format!(
        "\ndisk per message: {:.0} B; restart to serving: {:.0} ms (RSS after: {:.0} MiB)\n\n\
         | with the backlog | msgs/s | p50 ms | p99 ms | p99.9 ms | max ms |\n|---|---|---|---|---|---|\n",
        r.disk_bytes_per_msg, r.restart_to_serving_ms, r.rss_after_restart_mb
    ));
    for l in &r.with_backlog {
        let ms = |us: u64| us as f64 / 1000.0;
        t.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            l.what,
            l.msgs_per_s,
            ms(l.p50_us),
            ms(l.p99_us),
            ms(l.p999_us),
            ms(l.max_us)
        ));
    }
    t
}
