//! The processes `compare` starts and stops: futureq (standalone, or a 3-node loopback
//! cluster) and peer servers. Every one runs on 127.0.0.x ports in a temp dir and is killed
//! when its handle drops, so a failed run leaves nothing behind.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::conn::connect;

/// A free TCP port on 127.0.0.1 (nothing listens on it when this returns).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One futureq process with its own data directory (kept across [`Broker::restart`]).
pub(crate) struct Broker {
    bin: PathBuf,
    env: Vec<(String, OsString)>,
    child: Child,
    /// gRPC address (`http://ip:port`).
    pub(crate) addr: String,
    /// `ip:port` of the metrics listener.
    metrics: String,
    dir: PathBuf,
}

impl Broker {
    /// Starts futureq listening on `ip` (gRPC `port`, metrics `port + 1`), its data in
    /// `dir`, with `extra` settings (environment overrides), and waits until gRPC accepts.
    pub(crate) async fn start(
        bin: &Path,
        ip: &str,
        port: u16,
        dir: PathBuf,
        extra: Vec<(String, OsString)>,
    ) -> anyhow::Result<Broker> {
        let mut b = Broker::launch(bin, ip, port, dir, extra)?;
        b.wait_serving().await?;
        Ok(b)
    }

    /// Waits until a launched broker's gRPC accepts.
    async fn started(mut self) -> anyhow::Result<Broker> {
        self.wait_serving().await?;
        Ok(self)
    }

    /// [`Broker::start`] without waiting for gRPC (a joining node may serve only once it
    /// joined).
    pub(crate) fn launch(
        bin: &Path,
        ip: &str,
        port: u16,
        dir: PathBuf,
        extra: Vec<(String, OsString)>,
    ) -> anyhow::Result<Broker> {
        let metrics = format!("{ip}:{}", port + 1);
        let mut env: Vec<(String, OsString)> = [
            ("API_GRPC_LISTEN", format!("{ip}:{port}")),
            ("API_GRPC_ADVERTISE", format!("{ip}:{port}")),
            ("OBSERVABILITY_METRICS_LISTEN", metrics.clone()),
            ("PUBLISH_MINACKLEVEL", "noAck".into()),
            ("OBSERVABILITY_LOGGING_LEVEL", "warn".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.into()))
        .collect();
        env.push(("STORAGE_DATADIR".into(), dir.join("data").into()));
        env.extend(extra);
        let child = spawn(bin, &env, &dir)?;
        Ok(Broker {
            bin: bin.to_owned(),
            env,
            child,
            addr: format!("http://{ip}:{port}"),
            metrics,
            dir,
        })
    }

    async fn wait_serving(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while connect(&self.addr).await.is_err() {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "futureq exited during start-up ({status}); log: {}",
                    self.dir.join("futureq.log").display()
                );
            }
            if Instant::now() > deadline {
                bail!("futureq did not listen on {} within 60 s", self.addr);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Stops it (SIGTERM, checked clean exit), starts it again on the same data and returns
    /// the time from the new process's start until its gRPC listener accepts.
    pub(crate) async fn restart(&mut self) -> anyhow::Result<Duration> {
        self.terminate()?;
        let t0 = Instant::now();
        self.child = spawn(&self.bin, &self.env, &self.dir)?;
        self.wait_serving().await?;
        Ok(t0.elapsed())
    }

    /// Resident memory of the process, MiB.
    pub(crate) fn rss_mb(&self) -> Option<f64> {
        rss_mb(self.child.id())
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process exited.
    pub(crate) fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// CPU time the process used so far, seconds.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds(self.child.id())
    }

    /// Times the process's threads went to sleep so far (voluntary context switches): a
    /// thread-per-core executor sleeps when it has nothing to run, and each sleep and wake-up
    /// costs far more than a task switch.
    pub(crate) fn sleeps(&self) -> Option<u64> {
        sleeps(self.child.id())
    }

    /// SIGKILL and reap: nothing is flushed.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the process again on the same data and ports (after [`Broker::kill9`]) and
    /// waits until gRPC accepts.
    pub(crate) async fn respawn(&mut self) -> anyhow::Result<()> {
        self.child = spawn(&self.bin, &self.env, &self.dir)?;
        self.wait_serving().await
    }

    /// Runs a `futureq` command (e.g. `leave`) with this node's settings; fails unless it
    /// exits 0.
    pub(crate) fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.bin)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (format!("FUTUREQ_{k}"), v)))
            .output()
            .with_context(|| format!("running futureq {args:?}"))?;
        if !out.status.success() {
            bail!(
                "futureq {args:?} exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// After [`Broker::kill9`] (and the node's removal from the cluster): deletes its data and
    /// Raft data and starts it as a new node `node_id` that joins through `seed` (`ip:port`).
    pub(crate) async fn rejoin_fresh(&mut self, node_id: u64, seed: &str) -> anyhow::Result<()> {
        for d in ["data", "raft"] {
            let path = self.dir.join(d);
            if path.exists() {
                std::fs::remove_dir_all(&path)
                    .with_context(|| format!("deleting {}", path.display()))?;
            }
        }
        self.env.retain(|(k, _)| {
            !matches!(
                k.as_str(),
                "CLUSTER_NODEID" | "CLUSTER_RAFT_INITIALMEMBERS" | "CLUSTER_JOINSEEDS"
            )
        });
        self.env
            .push(("CLUSTER_NODEID".into(), node_id.to_string().into()));
        self.env.push(("CLUSTER_JOINSEEDS".into(), seed.into()));
        self.respawn().await
    }

    /// Waits up to `within` for the process to exit by itself; its status, or `None`.
    pub(crate) async fn wait_exit(
        &mut self,
        within: Duration,
    ) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(None)
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status();
    }

    /// The process's directory (data, Raft data, `futureq.log`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The text of its Prometheus `/metrics` page.
    pub(crate) async fn metrics(&self) -> anyhow::Result<String> {
        let mut s = tokio::net::TcpStream::connect(&self.metrics).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await?;
        let mut page = String::new();
        s.read_to_string(&mut page).await?;
        Ok(page)
    }

    /// Its metrics page, or `None` when it cannot be read within 5 s.
    async fn metrics_page(&self) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(5), self.metrics())
            .await
            .ok()?
            .ok()
    }

    /// Messages its threads put in queues another executor serves, so far (the sum of
    /// `futureq_cross_core_messages_total`); `None` when the metrics page cannot be read
    /// within 5 s or does not have them (an older build).
    pub(crate) async fn cross_core(&self) -> Option<u64> {
        let page = self.metrics_page().await?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        series_sum(&page, "futureq_cross_core_messages_total").map(|v| v as u64)
    }

    /// SIGTERM, then waits up to 20 s for a clean exit.
    fn terminate(&mut self) -> anyhow::Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("futureq exited with {status} on SIGTERM");
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("futureq did not stop within 20 s of SIGTERM")
    }

    /// Stops it with SIGTERM and checks that it exited cleanly.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        self.terminate()
    }
}

/// The sum of every series of metric `name` on a metrics page (with any labels); `None` when
/// the page has none.
fn series_sum(page: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = page
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.chars().next()? {
                ' ' => rest,
                '{' => rest.rsplit_once('}')?.1,
                _ => return None,
            };
            value.trim().parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn spawn(bin: &Path, env: &[(String, OsString)], dir: &Path) -> anyhow::Result<Child> {
    std::fs::create_dir_all(dir)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("futureq.log"))?;
    Command::new(bin)
        .arg("start")
        .envs(env.iter().map(|(k, v)| (format!("FUTUREQ_{k}"), v)))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

impl Drop for Broker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A standalone futureq on a free loopback port, its data in `dir`.
pub(crate) async fn standalone(bin: &Path, dir: &Path) -> anyhow::Result<Broker> {
    Broker::start(
        bin,
        "127.0.0.1",
        free_port()?,
        dir.join("standalone"),
        vec![],
    )
    .await
}

/// What a cluster's metrics say of its leadership.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Leadership {
    /// The highest Raft term of the nodes.
    pub(crate) term: u64,
    /// Times nodes gained or lost leadership, summed (an election is two: one lost, one
    /// gained).
    pub(crate) changes: u64,
    /// Times a leader's lease lapsed while it went on leading the same term, summed
    /// (`futureq_raft_lease_lapses_total`; 0 from a broker that does not export it).
    pub(crate) lapses: u64,
}

/// Three futureq nodes on 127.0.0.1–3 (one executor each; the three nodes and the load
/// generator share this machine's CPUs).
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<Broker>,
    /// The Raft port every node listens on (at 127.0.0.1, .2, .3).
    pub(crate) raft_port: u16,
    /// The gRPC port every node listens on.
    grpc_port: u16,
    /// Where the nodes' directories are.
    dir: PathBuf,
    /// The binary and the extra settings every node got.
    bin: PathBuf,
    extra: Vec<(String, OsString)>,
}

impl Cluster {
    /// A cluster with the default settings (`cluster.raft.rtt` among them).
    pub(crate) async fn start(bin: &Path, dir: &Path) -> anyhow::Result<Cluster> {
        Cluster::start_with(bin, dir, vec![]).await
    }

    /// A cluster with `extra` settings on every node.
    pub(crate) async fn start_with(
        bin: &Path,
        dir: &Path,
        extra: Vec<(String, OsString)>,
    ) -> anyhow::Result<Cluster> {
        let (port, raft) = (free_port()?, free_port()?);
        let members = format!(
            "{{1: \"127.0.0.1:{raft}\", 2: \"127.0.0.2:{raft}\", 3: \"127.0.0.3:{raft}\"}}"
        );
        let mut nodes = Vec::new();
        for i in 1..=3 {
            let membership = (
                "CLUSTER_RAFT_INITIALMEMBERS".to_owned(),
                members.clone().into(),
            );
            nodes.push(
                node_launch(bin, dir, i, (port, raft), membership, &extra)?
                    .started()
                    .await?,
            );
        }
        let cluster = Cluster {
            nodes,
            raft_port: raft,
            grpc_port: port,
            dir: dir.to_owned(),
            bin: bin.to_owned(),
            extra,
        };
        cluster.settle().await?;
        Ok(cluster)
    }

    /// Launches a fresh node (the next id, on the next 127.0.0.x) that joins through the
    /// leader; returns its index in `nodes` at once (it serves once it joined).
    pub(crate) async fn join_fresh(&mut self) -> anyhow::Result<usize> {
        let seed = self
            .leader()
            .await?
            .addr
            .trim_start_matches("http://")
            .to_owned();
        let i = self.nodes.len() + 1;
        let joining = ("CLUSTER_JOINSEEDS".to_owned(), seed.into());
        let b = node_launch(
            &self.bin,
            &self.dir,
            i,
            (self.grpc_port, self.raft_port),
            joining,
            &self.extra,
        )?;
        self.nodes.push(b);
        Ok(i - 1)
    }

    /// Waits until one node has led for 1.5 s (longer than a failover): a node that
    /// bootstraps just after the others elected a leader forces one more election.
    pub(crate) async fn settle(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut since: Option<(String, Instant)> = None;
        loop {
            let leader = self.leader().await?.addr.clone();
            match &since {
                Some((l, t)) if *l == leader => {
                    if t.elapsed() >= Duration::from_millis(1500) {
                        return Ok(());
                    }
                }
                _ => since = Some((leader, Instant::now())),
            }
            if Instant::now() > deadline {
                bail!("the cluster's leadership did not settle within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The node that reports itself Raft leader (waits up to 30 s for an election).
    pub(crate) async fn leader(&self) -> anyhow::Result<&Broker> {
        Ok(&self.nodes[self.leader_index().await?])
    }

    /// The index in `nodes` of the node that reports itself Raft leader (waits up to 30 s).
    pub(crate) async fn leader_index(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for (i, n) in self.nodes.iter().enumerate() {
                if let Ok(page) = n.metrics().await {
                    if page.lines().any(|l| l == "futureq_raft_is_leader 1") {
                        return Ok(i);
                    }
                }
            }
            if Instant::now() > deadline {
                bail!("no futureq node became leader within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits up to 60 s until node `i` applied what the leader had applied when it was asked.
    pub(crate) async fn caught_up(&mut self, i: usize) -> anyhow::Result<()> {
        self.catch_up(i, Duration::from_secs(60), |_| {}).await
    }

    /// Waits up to `within` until node `i` applied what the leader had applied when it was
    /// asked, calling `tick` with the node every 100 ms meanwhile.
    pub(crate) async fn catch_up(
        &mut self,
        i: usize,
        within: Duration,
        mut tick: impl FnMut(&Broker),
    ) -> anyhow::Result<()> {
        let target = applied_index(&self.leader().await?.metrics().await?).unwrap_or(0.0);
        let deadline = Instant::now() + within;
        loop {
            tick(&self.nodes[i]);
            let page = self.nodes[i].metrics().await.unwrap_or_default();
            if applied_index(&page).is_some_and(|a| a >= target) {
                return Ok(());
            }
            if self.nodes[i].exited() {
                bail!(
                    "node {} exited before it caught up (log: {})",
                    i + 1,
                    self.nodes[i].dir().join("futureq.log").display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} did not catch up with the leader within {within:?}",
                    i + 1
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// CPU time every node's process used so far, seconds.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        self.nodes.iter().map(Broker::cpu_seconds).sum()
    }

    /// Sleeps of every node's threads so far ([`Broker::sleeps`]).
    pub(crate) fn sleeps(&self) -> Option<u64> {
        self.nodes.iter().map(Broker::sleeps).sum()
    }

    /// Cross-core messages of every node so far ([`Broker::cross_core`]).
    pub(crate) async fn cross_core(&self) -> Option<u64> {
        let mut sum = 0;
        for n in &self.nodes {
            sum += n.cross_core().await?;
        }
        Some(sum)
    }

    /// The highest Raft term the nodes report (`futureq_raft_term`: it grows at every
    /// election), their leadership changes (`futureq_raft_leader_changes_total`) and lease
    /// lapses. `None` when a node's metrics page cannot be read within 5 s.
    pub(crate) async fn leadership(&self) -> Option<Leadership> {
        let mut l = Leadership::default();
        for n in &self.nodes {
            let page = n.metrics_page().await?;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let (term, changes) = (
                series_sum(&page, "futureq_raft_term")? as u64,
                series_sum(&page, "futureq_raft_leader_changes_total")? as u64,
            );
            l.term = l.term.max(term);
            l.changes += changes;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let lapses = series_sum(&page, "futureq_raft_lease_lapses_total").unwrap_or(0.0) as u64;
            l.lapses += lapses;
        }
        Some(l)
    }

    /// Resident memory of all three processes, MiB.
    pub(crate) fn rss_mb(&self) -> Option<f64> {
        self.nodes.iter().map(Broker::rss_mb).sum()
    }

    /// Stops every node with SIGTERM; each must exit cleanly.
    pub(crate) fn stop(self) -> anyhow::Result<()> {
        self.nodes.into_iter().try_for_each(Broker::stop)
    }
}

/// Launches cluster node `i` on 127.0.0.`i` (one executor, the gRPC and Raft ports given),
/// its directory under `dir`, with its `membership` setting (initial members or join seeds)
/// and `extra` settings; [`Broker::started`] waits until it serves.
fn node_launch(
    bin: &Path,
    dir: &Path,
    i: usize,
    (port, raft): (u16, u16),
    membership: (String, OsString),
    extra: &[(String, OsString)],
) -> anyhow::Result<Broker> {
    let ndir = dir.join(format!("node{i}"));
    let env: Vec<(String, OsString)> = [
        ("CLUSTER_ENABLED", "true".into()),
        ("CLUSTER_NODEID", i.to_string()),
        ("CLUSTER_RAFT_LISTEN", format!("127.0.0.{i}:{raft}")),
        ("CLUSTER_RAFT_ADVERTISE", format!("127.0.0.{i}:{raft}")),
        ("RUNTIME_CORES", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into()))
    .chain([
        ("CLUSTER_RAFT_DATADIR".to_owned(), ndir.join("raft").into()),
        membership,
    ])
    .chain(extra.iter().cloned())
    .collect();
    Broker::launch(bin, &format!("127.0.0.{i}"), port, ndir, env)
}

/// `futureq_raft_applied_index` on a metrics page.
fn applied_index(page: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix("futureq_raft_applied_index "))
        .and_then(|v| v.parse::<f64>().ok())
}

/// The largest RSS of each of some processes, sampled every 100 ms until stopped.
pub(crate) struct RssPeaks {
    peaks: std::sync::Arc<std::sync::Mutex<Vec<f64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssPeaks {
    pub(crate) fn start(pids: Vec<u32>) -> RssPeaks {
        let peaks = std::sync::Arc::new(std::sync::Mutex::new(vec![0.0f64; pids.len()]));
        let p = std::sync::Arc::clone(&peaks);
        let task = tokio::spawn(async move {
            loop {
                if let Ok(mut v) = p.lock() {
                    for (peak, pid) in v.iter_mut().zip(&pids) {
                        *peak = f64::max(*peak, rss_mb(*pid).unwrap_or(0.0));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        RssPeaks { peaks, task }
    }

    /// The peaks, MiB (per process, in the order given).
    pub(crate) fn stop(self) -> Vec<f64> {
        self.task.abort();
        self.peaks.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// A peer server this run started on loopback ports with a temp dir; killed when dropped.
pub(crate) struct PeerProcess {
    child: Child,
    bin: PathBuf,
    args: Vec<OsString>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PeerProcess {
    /// Starts `name` (if installed; `Ok(None)` otherwise) on a free port with the arguments
    /// `args(port, dir)` returns, and waits up to 10 s until it accepts connections.
    pub(crate) async fn start(
        name: &str,
        args: impl FnOnce(u16, &Path) -> anyhow::Result<Vec<OsString>>,
    ) -> anyhow::Result<Option<PeerProcess>> {
        Self::start_on(name, free_port()?, args).await
    }

    /// Like [`PeerProcess::start`] on a port the caller chose.
    pub(crate) async fn start_on(
        name: &str,
        port: u16,
        args: impl FnOnce(u16, &Path) -> anyhow::Result<Vec<OsString>>,
    ) -> anyhow::Result<Option<PeerProcess>> {
        let Some(bin) = which(name) else {
            return Ok(None);
        };
        let dir = tempfile::tempdir()?;
        let args = args(port, dir.path())?;
        let child = spawn_peer(&bin, &args)?;
        let peer = PeerProcess {
            child,
            bin,
            args,
            port,
            _dir: dir,
        };
        peer.wait_until(|port| async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await?;
        Ok(Some(peer))
    }

    /// Waits up to 300 s until `ready(port)` (a server recovering 10^7 schedules).
    async fn wait_until<F: std::future::Future<Output = bool>>(
        &self,
        ready: impl Fn(u16) -> F,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(300);
        while !ready(self.port).await {
            if Instant::now() > deadline {
                bail!(
                    "{} was not ready on port {} within 300 s",
                    self.bin.display(),
                    self.port
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Stops it (SIGTERM, waits for the exit), starts it again on the same data and returns
    /// the time from the new start until `ready(port)`.
    pub(crate) async fn restart<F: std::future::Future<Output = bool>>(
        &mut self,
        ready: impl Fn(u16) -> F,
    ) -> anyhow::Result<Duration> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait()?;
        let t0 = Instant::now();
        self.child = spawn_peer(&self.bin, &self.args)?;
        self.wait_until(ready).await?;
        Ok(t0.elapsed())
    }

    /// Its port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Resident memory, MiB.
    pub(crate) fn rss_mb(&self) -> Option<f64> {
        rss_mb(self.child.id())
    }

    /// CPU time it used so far, seconds.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds(self.child.id())
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_peer(bin: &Path, args: &[OsString]) -> anyhow::Result<Child> {
    Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// The path of `name`: in the peers' venv `scripts/install-peers.sh` makes beside this
/// executable's build (`target/peers/venv/bin`: the current nats-server), else on `PATH`, else
/// in /usr/sbin (where Debian puts some servers).
fn which(name: &str) -> Option<PathBuf> {
    let venv = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("peers/venv/bin")));
    venv.into_iter()
        .chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default(),
        )
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `name --version`'s first line (the installed peer's version), if it runs.
pub(crate) fn version(name: &str) -> Option<String> {
    let out = Command::new(which(name)?).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(text.lines().next()?.trim().to_owned())
}

/// CPU time (user + system, every thread) process `pid` used so far, seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from field 3: utime and stime
    // are fields 14 and 15, in clock ticks (USER_HZ, 100 on Linux).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Voluntary context switches of every thread of process `pid` so far.
fn sleeps(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        // A thread that ended between the listing and the read counts as none.
        let Ok(status) = std::fs::read_to_string(task.ok()?.path().join("status")) else {
            continue;
        };
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// Resident memory of process `pid`, MiB.
fn rss_mb(pid: u32) -> Option<f64> {
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

#[cfg(test)]
mod series_tests {
    use super::series_sum;

    #[test]
    fn a_metric_is_summed_over_its_labels_and_not_confused_with_a_longer_name() {
        let page = "# HELP x\nfutureq_raft_term 7\nfutureq_raft_term_extra 100\n\
                    futureq_cross_core_messages_total{queue=\"writes\"} 3\n\
                    futureq_cross_core_messages_total{queue=\"hub\"} 4\n";
        assert_eq!(series_sum(page, "futureq_raft_term"), Some(7.0));
        assert_eq!(
            series_sum(page, "futureq_cross_core_messages_total"),
            Some(7.0)
        );
        assert_eq!(series_sum(page, "futureq_missing"), None);
    }
}
