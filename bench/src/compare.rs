//! `futureq-bench compare`: starts each system under test itself, measures it, stops it, and
//! reports every run side by side (markdown table on stdout, `results.json` in `--out`).
//!
//! Measured so far: futureq standalone (publish at each ack level, batches of 100 and of 1;
//! delivery lateness at a steady due rate and for a burst) and Redis sorted sets (publish with
//! `appendfsync always` and `everysec`; delivery lateness with the usual ZRANGEBYSCORE+ZREM
//! poller; skipped with a line when `redis-server` is missing — `scripts/install-peers.sh`).
//! NATS JetStream R1 with file storage (publish, one ack per message; skipped likewise). The
//! 3-node cluster (and JetStream R3), lateness of JetStream, the pending-scale scenario and
//! plots come next.
//!
//! `results.json` schema (stable, other tools read it): `{"machine": {...}, "runs": [{"system",
//! "mode", "ack_level", "scenario", "msg_bytes", "msgs_per_s", "p50_us", "p99_us", "p999_us",
//! "rss_mb", "batch"}]}`; for `lateness` runs `msgs_per_s` is the due rate (0 for a burst)
//! and the percentiles are lateness (receive − due).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{connect, lateness_run, publish_run, Ack, PublishParams};

/// One measured run (one row of the table, one element of `runs`).
#[derive(Debug, Serialize)]
struct Run {
    system: &'static str,
    mode: &'static str,
    ack_level: &'static str,
    scenario: &'static str,
    msg_bytes: usize,
    msgs_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    rss_mb: Option<f64>,
    /// Messages per publish batch (1 = one ack per message); 0 for non-publish scenarios.
    batch: usize,
}

impl Run {
    /// A standalone run of 100-byte messages: `(system, ack level, scenario, batch)`, its
    /// rate and latency histogram (µs).
    fn new(
        (system, ack_level, scenario, batch): (&'static str, &'static str, &'static str, usize),
        msgs_per_s: f64,
        h: &Histogram<u64>,
        rss_mb: Option<f64>,
    ) -> Run {
        let (p50_us, p99_us, p999_us) = percentiles(h);
        Run {
            system,
            mode: "standalone",
            ack_level,
            scenario,
            msg_bytes: 100,
            msgs_per_s,
            p50_us,
            p99_us,
            p999_us,
            rss_mb,
            batch,
        }
    }
}

#[derive(Debug, Serialize)]
struct Machine {
    cpus: usize,
    kernel: String,
    memory_gib: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    runs: Vec<Run>,
}

/// Counts and durations of one compare run.
struct Plan {
    warmup: Duration,
    measure: Duration,
    lateness: Vec<(usize, u64)>,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                warmup: Duration::from_millis(500),
                measure: Duration::from_secs(2),
                lateness: vec![(10_000, 10_000), (10_000, 0)],
            }
        } else {
            Plan {
                warmup: Duration::from_secs(1),
                measure: Duration::from_secs(10),
                lateness: vec![(100_000, 10_000), (1_000_000, 100_000), (100_000, 0)],
            }
        }
    }
}

impl Plan {
    /// The closed-loop publish every system gets: 8 connections × 4 in flight, 100-byte
    /// messages, `batch` per request (`ack` and `delay_ms` matter to futureq only).
    fn publish(&self, batch: usize, ack: Ack, delay_ms: i64) -> PublishParams {
        PublishParams {
            streams: 8,
            window: 4,
            batch,
            size: 100,
            warmup: self.warmup,
            measure: self.measure,
            ack,
            delay_ms,
        }
    }
}

fn percentiles(h: &Histogram<u64>) -> (f64, f64, f64) {
    #[allow(clippy::cast_precision_loss)]
    let q = |x| h.value_at_quantile(x) as f64;
    (q(0.5), q(0.99), q(0.999))
}

#[allow(clippy::cast_precision_loss)]
fn per_s(rate: u64) -> f64 {
    rate as f64
}

fn ack_name(a: Ack) -> &'static str {
    match a {
        Ack::Quorum => "quorum",
        Ack::Leader => "leader",
        Ack::NoAck => "no_ack",
    }
}

/// A futureq process this run started; killed if still running when dropped.
struct Broker {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Broker {
    /// Starts a standalone broker on a free loopback port with its data in a temp dir.
    async fn start(bin: &Path) -> anyhow::Result<Broker> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.path().join("futureq.log"))?;
        let child = Command::new(bin)
            .arg("start")
            .env("FUTUREQ_API_GRPC_LISTEN", format!("127.0.0.1:{port}"))
            .env("FUTUREQ_OBSERVABILITY_METRICS_LISTEN", "")
            .env("FUTUREQ_STORAGE_DATADIR", dir.path().join("data"))
            .env("FUTUREQ_PUBLISH_MINACKLEVEL", "noAck")
            .env("FUTUREQ_OBSERVABILITY_LOGGING_LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut b = Broker {
            child,
            addr: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while connect(&b.addr).await.is_err() {
            if let Some(status) = b.child.try_wait()? {
                bail!("futureq exited during start-up ({status})");
            }
            if Instant::now() > deadline {
                bail!("futureq did not listen on {} within 15 s", b.addr);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(b)
    }

    /// Resident memory of the process, MiB.
    fn rss_mb(&self) -> Option<f64> {
        rss_mb(self.child.id())
    }

    /// SIGTERM, then waits up to 10 s (SIGKILL after).
    fn stop(mut self) -> anyhow::Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("futureq exited with {status} on SIGTERM");
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("futureq did not stop within 10 s of SIGTERM")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A peer server this run started on a free loopback port with a temp dir; killed when dropped.
pub(crate) struct PeerProcess {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PeerProcess {
    /// Starts `name` (if installed; `Ok(None)` otherwise) with the arguments `args(port, dir)`
    /// returns, and waits up to 10 s until it accepts connections.
    pub(crate) async fn start(
        name: &str,
        args: impl FnOnce(u16, &Path) -> Vec<std::ffi::OsString>,
    ) -> anyhow::Result<Option<PeerProcess>> {
        let Some(bin) = which(name) else {
            return Ok(None);
        };
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(bin)
            .args(args(port, dir.path()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let peer = PeerProcess {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("{name} did not listen on port {port} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Some(peer))
    }

    /// Its port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Resident memory, MiB.
    pub(crate) fn rss_mb(&self) -> Option<f64> {
        rss_mb(self.child.id())
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The path of `name` on `PATH` (or in /usr/sbin, where Debian puts some servers).
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Resident memory of process `pid`, MiB.
pub(crate) fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// The futureq binary: `explicit`, else the one next to this executable, else built with
/// cargo (release or debug, like this executable).
fn futureq_binary(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    let me = std::env::current_exe()?;
    let sibling = me.with_file_name("futureq");
    if !sibling.exists() {
        eprintln!("building futureq (cargo build -p futureq) …");
        let release = me.parent().is_some_and(|d| d.ends_with("release"));
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "-q", "-p", "futureq"]);
        if release {
            cmd.arg("--release");
        }
        if !cmd.status()?.success() {
            bail!("cargo build -p futureq failed; pass --futureq PATH");
        }
    }
    Ok(sibling)
}

fn machine() -> Machine {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        kernel,
        memory_gib,
    }
}

fn table(runs: &[Run]) -> String {
    let mut t = String::from(
        "| system | mode | ack level | scenario | batch | msgs/s | p50 ms | p99 ms | p99.9 ms | RSS MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {} |\n",
            r.system,
            r.mode,
            r.ack_level,
            r.scenario,
            r.batch,
            r.msgs_per_s,
            r.p50_us / 1000.0,
            r.p99_us / 1000.0,
            r.p999_us / 1000.0,
            r.rss_mb.map_or("-".into(), |m| format!("{m:.0}")),
        ));
    }
    t
}

/// Progress: a bar on a terminal, one line per step otherwise (CI logs).
struct Progress(indicatif::ProgressBar);

impl Progress {
    fn new(steps: usize) -> Self {
        let bar = indicatif::ProgressBar::new(steps as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "[{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Progress(bar)
    }

    fn step(&self, what: String) {
        if self.0.is_hidden() {
            eprintln!("{what}");
        }
        self.0.set_message(what);
        self.0.inc(1);
    }
}

/// Runs every scenario on futureq standalone; writes `out/results.json`, prints the table.
pub async fn run(quick: bool, out: &Path, futureq: Option<PathBuf>) -> anyhow::Result<()> {
    let plan = Plan::new(quick);
    let bin = futureq_binary(futureq)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut runs = Vec::new();
    let progress = Progress::new(6 + plan.lateness.len() + 2 * (2 + plan.lateness.len()) + 1);
    let broker = Broker::start(&bin).await?;
    for ack in [Ack::Quorum, Ack::Leader, Ack::NoAck] {
        for batch in [100, 1] {
            progress.step(format!(
                "futureq standalone: publish, ack {}, {batch}/batch",
                ack_name(ack)
            ));
            let o = publish_run(&broker.addr, &plan.publish(batch, ack, 3_600_000)).await?;
            runs.push(Run::new(
                ("futureq", ack_name(ack), "publish", batch),
                o.msgs_per_s,
                &o.latency,
                broker.rss_mb(),
            ));
        }
    }
    for &(count, rate) in &plan.lateness {
        progress.step(format!(
            "futureq standalone: lateness, {count} messages due at {rate}/s (0 = burst)"
        ));
        let (h, _early) = lateness_run(&broker.addr, count, rate, 2000).await?;
        runs.push(Run::new(
            ("futureq", "quorum", "lateness", 0),
            per_s(rate),
            &h,
            broker.rss_mb(),
        ));
    }
    broker.stop()?;
    for (policy, level) in [
        ("always", "appendfsync-always"),
        ("everysec", "appendfsync-everysec"),
    ] {
        let Some(redis) = crate::redis_peer::start(policy).await? else {
            progress.0.println(
                "redis-server not installed: skipping the Redis runs (scripts/install-peers.sh)",
            );
            break;
        };
        for batch in [100, 1] {
            progress.step(format!(
                "redis-zset: publish (ZADD), {level}, {batch}/batch"
            ));
            let o = crate::redis_peer::publish(
                redis.port(),
                &plan.publish(batch, Ack::Quorum, 3_600_000),
            )
            .await?;
            runs.push(Run::new(
                ("redis-zset", level, "publish", batch),
                o.msgs_per_s,
                &o.latency,
                redis.rss_mb(),
            ));
        }
        for &(count, rate) in &plan.lateness {
            progress.step(format!(
                "redis-zset: lateness (ZRANGEBYSCORE+ZREM poller), {level}, {count} due at {rate}/s"
            ));
            let h = crate::redis_peer::lateness(redis.port(), count, rate, 2000).await?;
            runs.push(Run::new(
                ("redis-zset", level, "lateness", 0),
                per_s(rate),
                &h,
                redis.rss_mb(),
            ));
        }
    }
    match crate::nats_peer::start().await? {
        None => progress.0.println(
            "nats-server not installed: skipping the NATS JetStream runs (scripts/install-peers.sh)",
        ),
        Some(nats) => {
            progress.step("nats-jetstream: publish, file storage R1, 1/msg".into());
            crate::nats_peer::create_stream(nats.port(), 1).await?;
            let o = crate::nats_peer::publish(
                nats.port(),
                &plan.publish(1, Ack::Quorum, 0),
            )
            .await?;
            runs.push(Run::new(
                ("nats-jetstream", "file-r1 (acked before fsync)", "publish", 1),
                o.msgs_per_s,
                &o.latency,
                nats.rss_mb(),
            ));
        }
    }
    progress.0.finish_and_clear();
    let results = Results {
        machine: machine(),
        runs,
    };
    let path = out.join("results.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&results)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("{}", table(&results.runs));
    println!("results: {}", path.display());
    Ok(())
}
