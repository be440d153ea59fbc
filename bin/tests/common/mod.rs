//! Test harness: starts the real `futureq` binary on free 127.0.0.1 ports and talks to it
//! with tonic (an independent gRPC implementation).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use futureq_bench::health::health_client::HealthClient;
use futureq_bench::health::HealthCheckRequest;
use futureq_bench::pb::future_q_consumer_client::FutureQConsumerClient;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{
    consumer_frame, AckRequest, ConsumerFrame, PublishBatch, PublishBatchAck, PublishMessage,
    QueueMessage, SubscribeInit,
};
use futures::channel::mpsc;
use tonic::transport::Channel;

/// A free loopback port, never the same twice in one test binary: tests run in parallel, and
/// two brokers started at once on one port would both bind it (SO_REUSEPORT) and split its
/// connections — a GET then reached the other test's broker as it was killed (ECONNRESET).
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// A port free on `ip` (a loopback address), never the same twice in one test binary, and
/// below the kernel's ephemeral range: a port the kernel picked for us (bind to port 0) is one
/// it may give next to an outgoing connection's local end — a peer link from 127.0.0.2 then
/// held the port a node was about to listen on there (EADDRINUSE at start).
pub fn free_port_on(ip: &str) -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    assert!(
        low > 12_000,
        "the ephemeral port range starts at {low}: too low for the harness"
    );
    let span = u32::from(low) - 10_000;
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Start where another test binary (another pid) is unlikely to be.
    let mut n = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add((given.len() as u32).wrapping_mul(104_729));
    for _ in 0..span {
        n = n.wrapping_add(1);
        let port = 10_000 + (n % span) as u16;
        if given.contains(&port) {
            continue;
        }
        let free = |ip: &str| std::net::TcpListener::bind((ip, port)).is_ok();
        if free(ip) && free("127.0.0.1") {
            given.push(port);
            return port;
        }
    }
    panic!("no free port on {ip} below {low}");
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A broker process with its own data directory and ports.
pub struct Broker {
    pub dir: tempfile::TempDir,
    pub grpc_port: u16,
    pub metrics_port: u16,
    pub extra: String,
    /// How the harness itself connects when the broker serves TLS (health checks,
    /// [`Broker::channel`]).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    child: Option<Child>,
}

impl Broker {
    /// Starts a broker; `extra` is YAML appended to the generated config (top-level keys).
    pub async fn start(extra: &str) -> Broker {
        let mut b = Broker::prepare(extra);
        b.spawn().await;
        b
    }

    /// A broker with its directory and ports chosen, not started.
    pub fn prepare(extra: &str) -> Broker {
        Broker {
            dir: tempfile::tempdir().unwrap(),
            grpc_port: free_port(),
            metrics_port: free_port(),
            extra: extra.to_owned(),
            tls: None,
            child: None,
        }
    }

    /// Whether the process runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("futureq.yaml")
    }

    fn write_config(&self) {
        let data = self.dir.path().join("data");
        // Ports come from the environment so that `extra` may hold any section.
        let mut yaml = String::from("configVersion: 1\n");
        if !self.extra.contains("runtime:") {
            yaml.push_str("runtime:\n  cores: 2\n");
        }
        if !self.extra.contains("storage:") {
            yaml.push_str(&format!("storage:\n  dataDir: {}\n", data.display()));
        }
        yaml.push_str(&self.extra);
        std::fs::write(self.config_path(), yaml).unwrap();
    }

    /// (Re)starts the process on the same ports and data and waits until it serves.
    pub async fn spawn(&mut self) {
        self.launch();
        self.wait_ready().await;
    }

    /// (Re)starts the process on the same ports and data.
    pub fn launch(&mut self) {
        self.write_config();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_futureq"))
            .args(["start", "-c"])
            .arg(self.config_path())
            .env(
                "FUTUREQ_API_GRPC_LISTEN",
                format!("127.0.0.1:{}", self.grpc_port),
            )
            .env(
                "FUTUREQ_OBSERVABILITY_METRICS_LISTEN",
                format!("127.0.0.1:{}", self.metrics_port),
            )
            .env_remove("RUST_LOG")
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Waits until the health check says SERVING (clustered: a leader is known).
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut h) = self.try_channel().await.map(HealthClient::new) {
                if let Ok(r) = h
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                {
                    if r.into_inner().status == 1 {
                        return;
                    }
                }
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("broker exited during start-up ({st}); log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "broker did not become healthy; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// The last `n` lines of the broker's log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.grpc_port)
    }

    /// A channel as the harness connects (over TLS when [`Broker::tls`] is set).
    pub async fn try_channel(&self) -> Result<Channel, tonic::transport::Error> {
        let mut e = Channel::from_shared(self.url()).unwrap();
        if let Some(t) = &self.tls {
            e = e.tls_config(t.clone())?;
        }
        e.connect().await
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Waits (bounded) for the process to exit by itself; its status, or `None` if it still
    /// runs after `within` (it then keeps running).
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM and wait (bounded) for the exit status.
    pub fn sigterm(&mut self, within: Duration) -> ExitStatus {
        let mut c = self.child.take().unwrap();
        Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!(
                    "broker did not exit within {within:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub async fn channel(&self) -> Channel {
        self.try_channel().await.unwrap()
    }

    /// GET on the metrics listener.
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = String::new();
        let got = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).await?;
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await?;
            s.read_to_string(&mut buf).await
        }
        .await;
        if let Err(e) = got {
            panic!(
                "GET {path} on the broker of port {}: {e}; its log ends:\n{}",
                self.grpc_port,
                self.log_tail(40)
            );
        }
        let code = buf.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
        let body = buf
            .split_once("\r\n\r\n")
            .map(|x| x.1.to_owned())
            .unwrap_or_default();
        (code, body)
    }

    /// The value of one metric series (exact line prefix match), or 0.
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, body) = self.http_get("/metrics").await;
        body.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|r| r.strip_prefix(' '))
                    .map(|v| v.parse().unwrap_or(0.0))
            })
            .unwrap_or(0.0)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(Some(st)) = c.try_wait() {
                eprintln!("broker of port {} had exited ({st})", self.grpc_port);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test shows how each of its brokers' logs ended (CI keeps no data dirs).
        if std::thread::panicking() {
            eprintln!(
                "--- broker of port {}, log ends:\n{}\n---",
                self.grpc_port,
                self.log_tail(30)
            );
        }
        // Debugging aid: TEST_KEEP_BROKERS=dir copies every broker's directory there.
        if let Ok(keep) = std::env::var("TEST_KEEP_BROKERS") {
            let to = std::path::Path::new(&keep).join(self.grpc_port.to_string());
            let _ = Command::new("cp")
                .arg("-r")
                .arg(self.dir.path())
                .arg(&to)
                .status();
        }
    }
}

/// Sends `signal` (`-STOP`, `-CONT`) to a broker's process.
pub fn signal(b: &Broker, signal: &str) {
    let pid = b.pid().to_string();
    assert!(Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap()
        .success());
}

pub fn msg(topic: &str, payload: &str, delay_ms: i64, ttl_ms: i64) -> PublishMessage {
    PublishMessage {
        topic: topic.into(),
        payload: payload.as_bytes().to_vec(),
        delay_ms,
        ttl_ms,
        ..PublishMessage::default()
    }
}

pub fn batch(id: u64, level: i32, messages: Vec<PublishMessage>) -> PublishBatch {
    PublishBatch {
        messages,
        ack_level: level,
        batch_id: id,
    }
}

/// One PublishStream: send batches, read acks.
pub struct Publisher {
    tx: mpsc::UnboundedSender<PublishBatch>,
    acks: tonic::Streaming<PublishBatchAck>,
}

impl Publisher {
    pub async fn open(ch: Channel) -> Publisher {
        let (tx, rx) = mpsc::unbounded();
        let acks = FutureQProducerClient::new(ch)
            .publish_stream(rx)
            .await
            .unwrap()
            .into_inner();
        Publisher { tx, acks }
    }

    pub fn send(&self, b: PublishBatch) {
        self.tx.unbounded_send(b).unwrap();
    }

    pub async fn ack(&mut self) -> PublishBatchAck {
        tokio::time::timeout(Duration::from_secs(10), self.acks.message())
            .await
            .expect("ack within 10 s")
            .expect("stream healthy")
            .expect("stream not ended")
    }

    /// The next ack, or None when the stream ended or failed.
    pub async fn ack_raw(&mut self) -> Option<PublishBatchAck> {
        self.acks.message().await.ok().flatten()
    }

    pub async fn publish(&mut self, b: PublishBatch) -> PublishBatchAck {
        self.send(b);
        self.ack().await
    }

    /// Half-closes and returns the final status of the stream.
    pub async fn close(mut self) -> Result<Option<PublishBatchAck>, tonic::Status> {
        self.tx.close_channel();
        self.acks.message().await
    }

    pub async fn end_status(&mut self) -> tonic::Status {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.acks.message())
                .await
                .expect("status within 10 s")
            {
                Ok(Some(_)) => continue,
                Ok(None) => return tonic::Status::ok(""),
                Err(s) => return s,
            }
        }
    }
}

/// One Subscribe stream.
pub struct Subscriber {
    tx: mpsc::UnboundedSender<ConsumerFrame>,
    pub rx: tonic::Streaming<QueueMessage>,
}

impl Subscriber {
    pub async fn open(ch: Channel, topic: &str, group: &str, max_in_flight: u32) -> Subscriber {
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(ConsumerFrame {
            frame: Some(consumer_frame::Frame::Init(SubscribeInit {
                topic: topic.into(),
                group_id: group.into(),
                read_from_replica: false,
                max_in_flight,
            })),
        })
        .unwrap();
        let rx = FutureQConsumerClient::new(ch)
            .subscribe(rx)
            .await
            .unwrap()
            .into_inner();
        Subscriber { tx, rx }
    }

    /// The next message within `within`, or None.
    pub async fn next(&mut self, within: Duration) -> Option<QueueMessage> {
        match tokio::time::timeout(within, self.rx.message()).await {
            Ok(Ok(m)) => m,
            Ok(Err(s)) => panic!("subscribe stream failed: {s:?}"),
            Err(_) => None,
        }
    }

    pub fn ack(&self, tag: &[u8], success: bool) {
        self.tx
            .unbounded_send(ConsumerFrame {
                frame: Some(consumer_frame::Frame::Ack(AckRequest {
                    success,
                    delivery_tag: tag.to_vec(),
                })),
            })
            .unwrap();
    }

    /// Sends a second SubscribeInit (a protocol error the broker ends the stream for).
    pub fn tx_init_again(&self) {
        self.tx
            .unbounded_send(ConsumerFrame {
                frame: Some(consumer_frame::Frame::Init(SubscribeInit::default())),
            })
            .unwrap();
    }

    /// Ends the request stream (no more ACK frames).
    pub fn half_close(&self) {
        self.tx.close_channel();
    }

    /// Collects messages until `quiet` passes with none.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<QueueMessage> {
        let mut out = Vec::new();
        while let Some(m) = self.next(quiet).await {
            out.push(m);
        }
        out
    }

    pub async fn end_status(&mut self) -> tonic::Status {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.rx.message())
                .await
                .expect("status within 10 s")
            {
                Ok(Some(_)) => continue,
                Ok(None) => return tonic::Status::ok(""),
                Err(s) => return s,
            }
        }
    }
}

/// TopicStats of `topic` (all topics when empty).
pub async fn topic_stats(b: &Broker, topic: &str) -> Vec<futureq_bench::pb::TopicStats> {
    futureq_bench::pb::future_q_admin_client::FutureQAdminClient::new(b.channel().await)
        .topic_stats(futureq_bench::pb::TopicStatsRequest {
            topic: topic.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .topics
}

/// Waits until `f` holds, at most 10 s (else fails naming `what`).
pub async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut f: impl FnMut() -> F,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
