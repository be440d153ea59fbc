//! `futureq-bench`: load generator for a running futureq broker.
//!
//! - `publish`: closed-loop publish throughput and per-batch latency (N streams, W batches in
//!   flight each) at one ack level.
//! - `lateness`: delivery lateness (receive time − due time) for a burst of messages due at
//!   one instant, or a steady rate of messages falling due.
//!
//! - `compare`: starts the brokers itself and measures them side by side in one run (see
//!   [`compare`]); writes `results.json` and prints a markdown table.
//! - `ab`: two futureq binaries (before and after a change) side by side in one run (see
//!   [`ab`]); writes `ab.json` and prints medians, ranges and ratios.
//! - `nemesis`: a seeded fault run against a 3-node cluster with a history checker (see
//!   [`nemesis`]); writes `nemesis.json`, fails on any violation.
//!
//! Every latency figure comes from an HDR histogram; results print as a markdown table.

mod ab;
mod compare;
mod failover;
mod nats_peer;
mod nemesis;
mod openloop;
mod plot;
mod procs;
mod redis_peer;
mod security;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use futureq_bench::pb::future_q_consumer_client::FutureQConsumerClient;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{
    consumer_frame, AckRequest, ConsumerFrame, PublishBatch, PublishBatchAck, PublishMessage,
    SubscribeInit,
};
use hdrhistogram::Histogram;
use tonic::transport::Channel;

#[derive(Parser)]
#[command(about = "futureq load generator")]
struct Cli {
    /// Broker gRPC address.
    #[arg(long, default_value = "http://127.0.0.1:8443", global = true)]
    addr: String,
    /// Connect over TLS, verifying the broker against this CA certificate (PEM): `publish`
    /// and `lateness` against a broker with api.grpc.tls.
    #[arg(long, global = true, value_name = "PEM")]
    tls_ca: Option<std::path::PathBuf>,
    /// A file holding a bearer token sent on every call (a broker with principals).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_ca")]
    token_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
#[allow(clippy::enum_variant_names)]
enum Ack {
    Quorum,
    Leader,
    NoAck,
}

#[derive(Subcommand)]
enum Cmd {
    /// Closed-loop publish throughput and latency.
    Publish {
        /// Concurrent PublishStreams (each on its own HTTP/2 connection).
        #[arg(long, default_value_t = 8)]
        streams: usize,
        /// Batches in flight per stream.
        #[arg(long, default_value_t = 4)]
        window: usize,
        /// Messages per batch.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Payload bytes per message.
        #[arg(long, default_value_t = 100)]
        size: usize,
        /// Measured duration in seconds (after 1 s of warm-up).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, value_enum, default_value_t = Ack::Quorum)]
        ack: Ack,
        /// Delay of every message (ms): far in the future keeps the dispatcher out of the way.
        #[arg(long, default_value_t = 3_600_000)]
        delay_ms: i64,
        /// Give every message a unique dedup id (idempotent publishes; answered at QUORUM).
        #[arg(long)]
        dedup: bool,
    },
    /// Delivery lateness: messages falling due in a burst or at a steady rate.
    Lateness {
        /// Messages.
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// Due rate in msgs/s; 0 = all due at the same instant.
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Lead time between the end of publishing and the first due instant (ms).
        #[arg(long, default_value_t = 1000)]
        lead_ms: i64,
    },
    /// Starts the systems under test itself and measures them in one run.
    Compare {
        /// Small counts and short runs (CI smoke test; ≤ 90 s).
        #[arg(long)]
        quick: bool,
        /// Directory for results.json.
        #[arg(long, default_value = "results")]
        out: std::path::PathBuf,
        /// The futureq binary (default: next to this one, built with cargo if missing).
        #[arg(long)]
        futureq: Option<std::path::PathBuf>,
        /// Payload bytes of each published message.
        #[arg(long, default_value_t = 100)]
        msg_bytes: usize,
        /// Messages per request of the batched publish series (a series of 1 always runs too).
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Measure only these systems (comma-separated; default: all).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [compare::System::Futureq, compare::System::Redis, compare::System::Nats])]
        only: Vec<compare::System>,
    },
    /// Two futureq binaries side by side in one run (before and after a change): QUORUM
    /// publish at 1 and 100 messages per request, rounds alternating the order; medians,
    /// ranges and the after ÷ before ratio.
    Ab {
        /// The binary before the change.
        #[arg(long)]
        before: std::path::PathBuf,
        /// The binary after the change.
        #[arg(long)]
        after: std::path::PathBuf,
        /// Rounds (each runs both binaries, the order alternating from round to round; an odd
        /// count runs "before" first once more than "after" first).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Short series (smoke test).
        #[arg(long)]
        quick: bool,
        /// Measure 3-node clusters instead of standalone brokers.
        #[arg(long)]
        cluster: bool,
        /// Directory for ab.json.
        #[arg(long, default_value = "ab")]
        out: std::path::PathBuf,
    },
    /// The cost of security in one run: the same binary plaintext, over TLS, and over TLS
    /// with a bearer token (principals on), standalone and on 3 nodes (mutual TLS between
    /// them); QUORUM publish at 1 and 100 messages per request, rounds rotating the order;
    /// and TLS handshakes per second and per broker CPU-second.
    Security {
        /// Rounds (each runs every variant, the order rotating from round to round).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Short series (smoke test).
        #[arg(long)]
        quick: bool,
        /// Directory for security.json.
        #[arg(long, default_value = "security")]
        out: std::path::PathBuf,
        /// The futureq binary (default: next to this one, built with cargo if missing).
        #[arg(long)]
        futureq: Option<std::path::PathBuf>,
    },
    /// Failover of a 3-node cluster it starts: kill -9 of the loaded leader → the first
    /// QUORUM ack from the new leader, repeated (each from three healthy nodes).
    Failover {
        /// Failovers to time.
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// `cluster.raft.rtt` of the nodes (default: the broker's default).
        #[arg(long)]
        rtt: Option<String>,
        /// The futureq binary (default: next to this one, built with cargo if missing).
        #[arg(long)]
        futureq: Option<std::path::PathBuf>,
    },
    /// Seeded fault run against a 3-node cluster it starts; checks the history.
    Nemesis {
        /// Seed of the fault schedule and the workload.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Seconds of faults (then everything heals and the checker runs).
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Fault kinds (comma-separated).
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [nemesis::FaultKind::Kill, nemesis::FaultKind::Pause, nemesis::FaultKind::Partition, nemesis::FaultKind::Membership, nemesis::FaultKind::Disk])]
        faults: Vec<nemesis::FaultKind>,
        /// Directory for nemesis.json (and the nodes' logs after a violation).
        #[arg(long, default_value = "nemesis")]
        out: std::path::PathBuf,
        /// The futureq binary (default: next to this one, built with cargo if missing).
        #[arg(long)]
        futureq: Option<std::path::PathBuf>,
        /// Run the cluster on mutual TLS between its nodes and TLS on the client plane
        /// (certificates from `futureq certs dev`).
        #[arg(long)]
        tls: bool,
    },
}

/// One closed-loop publish measurement.
#[derive(Clone, Copy)]
struct PublishParams {
    streams: usize,
    window: usize,
    batch: usize,
    size: usize,
    warmup: Duration,
    measure: Duration,
    ack: Ack,
    delay_ms: i64,
    /// Give every message a unique dedup id (the cost of idempotent publishes).
    dedup: bool,
}

/// What a publish measurement found.
struct PublishOut {
    msgs_per_s: f64,
    /// Per-batch ack latency, µs.
    latency: Histogram<u64>,
    /// Messages acked in the whole run, warm-up included (for costs per message).
    acked: u64,
}

fn now_us() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros(),
    )
    .unwrap_or(i64::MAX)
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

fn row(name: &str, h: &Histogram<u64>) -> String {
    #[allow(clippy::cast_precision_loss)]
    let ms = |v: u64| v as f64 / 1000.0;
    format!(
        "| {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
        h.len(),
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.9)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max())
    )
}

const HEADER: &str =
    "| series | n | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |\n|---|---|---|---|---|---|---|";

/// How the bench connects: plaintext, or TLS (and a token) while `futureq-bench security`
/// measures a TLS variant. Set between runs, never during one.
static CLIENT_SECURITY: std::sync::RwLock<Option<ClientSecurity>> = std::sync::RwLock::new(None);

/// TLS towards the broker and the token sent on every call.
#[derive(Clone)]
struct ClientSecurity {
    tls: tonic::transport::ClientTlsConfig,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

fn client_security() -> Option<ClientSecurity> {
    CLIENT_SECURITY
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

fn set_client_security(s: Option<ClientSecurity>) {
    *CLIENT_SECURITY
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
}

/// `m` as a request carrying the token, if the bench has one.
fn authed<T>(m: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    if let Some(t) = client_security().and_then(|s| s.token) {
        r.metadata_mut().insert("authorization", t);
    }
    r
}

async fn connect(addr: &str) -> anyhow::Result<Channel> {
    let security = client_security();
    let addr = match (&security, addr.strip_prefix("http://")) {
        (Some(_), Some(rest)) => format!("https://{rest}"),
        _ => addr.to_owned(),
    };
    let mut e = Channel::from_shared(addr.clone())?;
    if let Some(s) = security {
        e = e.tls_config(s.tls)?;
    }
    e.connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}

/// Publishes one QUORUM message and waits for its ack: the broker's writer is FIFO, so this
/// returns once everything queued before (a NO_ACK backlog of the previous run) is committed.
async fn drain(addr: &str) -> anyhow::Result<()> {
    let batch = PublishBatch {
        messages: messages("bench-drain", 1, 1, 3_600_000),
        ack_level: 0,
        batch_id: 0,
    };
    let mut acks = FutureQProducerClient::new(connect(addr).await?)
        .publish_stream(authed(futures::stream::iter([batch])))
        .await?
        .into_inner();
    let a = acks.message().await?.context("publish stream ended")?;
    if !a.success {
        bail!("drain batch rejected: {}", a.error_message);
    }
    Ok(())
}

async fn publish_run(addr: &str, p: &PublishParams) -> anyhow::Result<PublishOut> {
    drain(addr).await?;
    let PublishParams {
        streams,
        window,
        batch,
        size,
        warmup,
        measure,
        ack,
        delay_ms,
        dedup,
    } = *p;
    let payload = vec![b'x'; size];
    let level = ack as i32;
    let start = Instant::now();
    let warm = start + warmup;
    let end = warm + measure;
    let mut tasks = Vec::new();
    for s in 0..streams {
        let ch = connect(addr).await?;
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = tokio::sync::mpsc::channel::<PublishBatch>(window * 2);
            let mut acks = FutureQProducerClient::new(ch)
                .publish_stream(authed(tokio_stream(rx)))
                .await?
                .into_inner();
            let mut sent_at = std::collections::VecDeque::new();
            let mut local = hist();
            let mut msgs = 0u64;
            let mut acked = 0u64;
            let mut next_id = 0u64;
            let mk = |id: u64| PublishBatch {
                messages: (0..batch)
                    .map(|i| PublishMessage {
                        topic: format!("bench-{}", (s + i) % 4),
                        payload: payload.clone(),
                        delay_ms,
                        ttl_ms: 0,
                        indexes: vec![],
                        dedup_id: if dedup {
                            format!("s{s}-b{id}-m{i}")
                        } else {
                            String::new()
                        },
                        ..PublishMessage::default()
                    })
                    .collect(),
                ack_level: level,
                batch_id: id,
            };
            for _ in 0..window {
                sent_at.push_back(Instant::now());
                tx.send(mk(next_id)).await?;
                next_id += 1;
            }
            while let Some(a) = acks.message().await? {
                let t0 = sent_at.pop_front().unwrap_or_else(Instant::now);
                if !a.success {
                    bail!("batch {} rejected: {}", a.batch_id, a.error_message);
                }
                acked += batch as u64;
                let now = Instant::now();
                if now >= warm && now < end {
                    local.record(
                        u64::try_from(now.duration_since(t0).as_micros())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    )?;
                    msgs += batch as u64;
                }
                if now >= end {
                    break;
                }
                sent_at.push_back(Instant::now());
                tx.send(mk(next_id)).await?;
                next_id += 1;
            }
            Ok::<_, anyhow::Error>((msgs, acked, local))
        }));
    }
    crate::collect(tasks, measure).await
}

/// One publishing connection's task: messages acked in the measured window, in the whole
/// run, and their latency histogram.
type StreamTask = tokio::task::JoinHandle<anyhow::Result<(u64, u64, Histogram<u64>)>>;

/// Joins publishing tasks into one result.
async fn collect(tasks: Vec<StreamTask>, measure: Duration) -> anyhow::Result<PublishOut> {
    let (mut total, mut acked, mut latency) = (0, 0, hist());
    for t in tasks {
        let (msgs, all, h) = t.await??;
        total += msgs;
        acked += all;
        latency.add(&h)?;
    }
    #[allow(clippy::cast_precision_loss)]
    let msgs_per_s = total as f64 / measure.as_secs_f64();
    Ok(PublishOut {
        msgs_per_s,
        latency,
        acked,
    })
}

/// The sending half of one open-loop futureq publish stream.
struct OpenSender {
    tx: tokio::sync::mpsc::UnboundedSender<PublishBatch>,
    messages: Vec<PublishMessage>,
    ack_level: i32,
}

impl openloop::Sender for OpenSender {
    async fn send(&mut self, seq: u64) -> anyhow::Result<()> {
        self.tx
            .send(PublishBatch {
                messages: self.messages.clone(),
                ack_level: self.ack_level,
                batch_id: seq,
            })
            .map_err(|_| anyhow::anyhow!("publish stream closed"))
    }
}

impl openloop::Acks for tonic::Streaming<PublishBatchAck> {
    async fn recv(&mut self) -> anyhow::Result<u64> {
        let a = self.message().await?.context("publish stream ended")?;
        if !a.success {
            bail!("batch {} rejected: {}", a.batch_id, a.error_message);
        }
        Ok(a.batch_id)
    }
}

/// Open-loop futureq publishing on the schedule `s` (see [`openloop`]).
async fn publish_open(
    addr: &str,
    s: openloop::Schedule,
    ack: Ack,
    size: usize,
) -> anyhow::Result<PublishOut> {
    drain(addr).await?;
    let mut halves = Vec::new();
    for i in 0..s.streams {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let acks = FutureQProducerClient::new(connect(addr).await?)
            .publish_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
            .await?
            .into_inner();
        let messages = messages(&format!("bench-{}", i % 4), s.batch, size, 3_600_000);
        halves.push((
            OpenSender {
                tx,
                messages,
                ack_level: ack as i32,
            },
            acks,
        ));
    }
    openloop::run(halves, s).await
}

/// `n` messages of `size` bytes on `topic`, due in `delay_ms`.
fn messages(topic: &str, n: usize, size: usize, delay_ms: i64) -> Vec<PublishMessage> {
    (0..n)
        .map(|_| PublishMessage {
            topic: topic.to_owned(),
            payload: vec![b'x'; size],
            delay_ms,
            ttl_ms: 0,
            indexes: vec![],
            ..PublishMessage::default()
        })
        .collect()
}

/// Publishes `count` messages due in a year (QUORUM, batches of 100 on 4 streams with 8 in
/// flight each) and returns the publish rate, msgs/s.
async fn fill(addr: &str, count: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    let per_stream = count.div_ceil(4);
    let mut tasks = Vec::new();
    for s in 0..4u64 {
        let n = per_stream.min(count.saturating_sub(s * per_stream));
        let (tx, rx) = tokio::sync::mpsc::channel::<PublishBatch>(8);
        let mut acks = FutureQProducerClient::new(connect(addr).await?)
            .publish_stream(tokio_stream(rx))
            .await?
            .into_inner();
        tasks.push(tokio::spawn(async move {
            let batches = n.div_ceil(100);
            let sender = tokio::spawn(async move {
                for b in 0..batches {
                    let k = usize::try_from((n - b * 100).min(100))?;
                    let messages = messages(&format!("pending-{s}"), k, 100, 365 * 86_400_000);
                    tx.send(PublishBatch {
                        messages,
                        ack_level: Ack::Quorum as i32,
                        batch_id: b,
                    })
                    .await?;
                }
                Ok::<_, anyhow::Error>(())
            });
            for _ in 0..batches {
                let a = acks.message().await?.context("publish stream ended")?;
                if !a.success {
                    bail!("fill batch rejected: {}", a.error_message);
                }
            }
            sender.await?
        }));
    }
    for t in tasks {
        t.await??;
    }
    #[allow(clippy::cast_precision_loss)]
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

#[allow(clippy::too_many_arguments)]
async fn publish(
    addr: &str,
    streams: usize,
    window: usize,
    batch: usize,
    size: usize,
    seconds: u64,
    ack: Ack,
    delay_ms: i64,
    dedup: bool,
) -> anyhow::Result<()> {
    let level = ack as i32;
    let out = publish_run(
        addr,
        &PublishParams {
            streams,
            window,
            batch,
            size,
            warmup: Duration::from_secs(1),
            measure: Duration::from_secs(seconds),
            ack,
            delay_ms,
            dedup,
        },
    )
    .await?;
    let (rate, h) = (out.msgs_per_s, out.latency);
    println!(
        "publish: {streams} streams × {window} in flight, {batch} msgs/batch, {size} B payload, ack level {level}\n"
    );
    println!(
        "throughput: {rate:.0} msgs/s ({:.1} MB/s payload)\n",
        rate * size as f64 / 1e6
    );
    println!("{HEADER}\n{}", row("publish ack latency (per batch)", &h));
    Ok(())
}

fn tokio_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Time from the start of publishing `count` lateness messages to the first due instant:
/// `lead_ms`, plus room to publish them at 50k msgs/s.
fn lead_time_ms(count: usize, lead_ms: i64) -> i64 {
    lead_ms + i64::try_from(count / 50).unwrap_or(i64::MAX / 2)
}

/// Seconds over which `count` messages fall due at `rate` msgs/s; for a burst (`rate` 0), the
/// time draining it at 10k/s takes: with a minute more, how long a lateness run waits.
fn due_span_s(count: usize, rate: u64) -> u64 {
    count as u64 / if rate == 0 { 10_000 } else { rate }
}

/// Publishes `count` messages falling due at `rate` msgs/s (0: all at one instant) and
/// returns the lateness histogram (µs) and how many came early.
async fn lateness_run(
    addr: &str,
    count: usize,
    rate: u64,
    lead_ms: i64,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let topic = format!("lateness-{}", now_us());
    // Subscribe first (universal consumer, room for everything).
    let (ack_tx, ack_rx) = tokio::sync::mpsc::unbounded_channel::<ConsumerFrame>();
    ack_tx.send(ConsumerFrame {
        frame: Some(consumer_frame::Frame::Init(SubscribeInit {
            topic: topic.clone(),
            group_id: String::new(),
            read_from_replica: false,
            max_in_flight: 65_536,
        })),
    })?;
    let mut ack_rx = ack_rx;
    let frames = futures::stream::poll_fn(move |cx| ack_rx.poll_recv(cx));
    let mut deliveries = FutureQConsumerClient::new(connect(addr).await?)
        .subscribe(frames)
        .await?
        .into_inner();

    // Publish: every message carries its own delay so that due times land where we want.
    let publish_start_ms = now_us() / 1000;
    let first_due_ms = publish_start_ms + lead_time_ms(count, lead_ms);
    let (tx, rx) = tokio::sync::mpsc::channel::<PublishBatch>(64);
    let mut acks = FutureQProducerClient::new(connect(addr).await?)
        .publish_stream(tokio_stream(rx))
        .await?
        .into_inner();
    let n_batches = count.div_ceil(100);
    let sender = tokio::spawn(async move {
        for b in 0..n_batches {
            let now_ms = now_us() / 1000;
            let messages = (b * 100..((b + 1) * 100).min(count))
                .map(|i| {
                    let offset_ms = (i as u64 * 1000)
                        .checked_div(rate)
                        .map_or(0, |v| i64::try_from(v).unwrap_or(0));
                    PublishMessage {
                        topic: topic.clone(),
                        payload: vec![0u8; 100],
                        delay_ms: (first_due_ms + offset_ms - now_ms).max(0),
                        ttl_ms: 0,
                        indexes: vec![],
                        ..PublishMessage::default()
                    }
                })
                .collect();
            if tx
                .send(PublishBatch {
                    messages,
                    ack_level: 0,
                    batch_id: b as u64,
                })
                .await
                .is_err()
            {
                break;
            }
        }
    });
    for _ in 0..n_batches {
        let a = acks.message().await?.context("publish stream ended")?;
        if !a.success {
            bail!("batch rejected: {}", a.error_message);
        }
    }
    sender.await?;
    if now_us() / 1000 > first_due_ms {
        bail!("publishing took longer than the lead time; raise --lead-ms");
    }
    let mut h = hist();
    let mut early = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60 + due_span_s(count, rate));
    while h.len() + early < count as u64 {
        let m = tokio::time::timeout_at(deadline.into(), deliveries.message())
            .await
            .context("timed out waiting for deliveries")??
            .context("subscribe stream ended")?;
        let due_us = (m.enqueued_at_unix_ms + m.delay_ms) * 1000;
        let late = now_us() - due_us;
        if late < 0 {
            early += 1;
        } else {
            h.record(u64::try_from(late).unwrap_or(0).max(1))?;
        }
        ack_tx.send(ConsumerFrame {
            frame: Some(consumer_frame::Frame::Ack(AckRequest {
                success: true,
                delivery_tag: m.delivery_tag,
            })),
        })?;
    }
    Ok((h, early))
}

async fn lateness(addr: &str, count: usize, rate: u64, lead_ms: i64) -> anyhow::Result<()> {
    let (h, early) = lateness_run(addr, count, rate, lead_ms).await?;
    let shape = if rate == 0 {
        format!("burst of {count} due at one instant")
    } else {
        format!("{count} msgs due at {rate} msgs/s")
    };
    println!("lateness (receive − due), {shape}; early deliveries: {early}\n");
    println!("{HEADER}\n{}", row("delivery lateness", &h));
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(ca) = &cli.tls_ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        let token = match &cli.token_file {
            Some(f) => {
                let t = std::fs::read_to_string(f)
                    .with_context(|| format!("reading {}", f.display()))?;
                Some(format!("Bearer {}", t.trim()).parse()?)
            }
            None => None,
        };
        set_client_security(Some(ClientSecurity {
            tls: tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(pem)),
            token,
        }));
    }
    match cli.cmd {
        Cmd::Publish {
            streams,
            window,
            batch,
            size,
            seconds,
            ack,
            delay_ms,
            dedup,
        } => {
            publish(
                &cli.addr, streams, window, batch, size, seconds, ack, delay_ms, dedup,
            )
            .await
        }
        Cmd::Lateness {
            count,
            rate,
            lead_ms,
        } => lateness(&cli.addr, count, rate, lead_ms).await,
        Cmd::Nemesis {
            seed,
            seconds,
            faults,
            out,
            futureq,
            tls,
        } => {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = nemesis::run(seed, Duration::from_secs(seconds), &faults, &out, (futureq, tls)) => r,
                _ = tokio::signal::ctrl_c() => bail!("interrupted; every node this run started is stopped"),
                _ = term.recv() => bail!("terminated; every node this run started is stopped"),
            }
        }
        Cmd::Security {
            rounds,
            quick,
            out,
            futureq,
        } => {
            let bin = compare::futureq_binary(futureq)?;
            security::run(&bin, rounds, quick, &out).await
        }
        Cmd::Failover { reps, rtt, futureq } => {
            let bin = compare::futureq_binary(futureq)?;
            let dir = tempfile::tempdir()?;
            let extra = rtt
                .map(|r| ("CLUSTER_RAFT_RTT".to_owned(), r.into()))
                .into_iter()
                .collect();
            let mut c = procs::Cluster::start_with(&bin, dir.path(), extra).await?;
            let h = failover::run(&mut c, reps, |s| eprintln!("{s}")).await?;
            println!(
                "{HEADER}\n{}",
                row(
                    &format!("failover ({reps}×), kill -9 → first QUORUM ack"),
                    &h
                )
            );
            c.stop()
        }
        Cmd::Ab {
            before,
            after,
            rounds,
            quick,
            cluster,
            out,
        } => {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = async {
                    let canon = |p: &std::path::Path| {
                        std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))
                    };
                    ab::run((&canon(&before)?, &canon(&after)?), rounds, quick, cluster, &out).await
                } => r,
                _ = tokio::signal::ctrl_c() => bail!("interrupted; every broker this run started is stopped"),
                _ = term.recv() => bail!("terminated; every broker this run started is stopped"),
            }
        }
        Cmd::Compare {
            quick,
            out,
            futureq,
            only,
            msg_bytes,
            batch,
        } => {
            // Ctrl-C or SIGTERM drops the run: every server it started is killed (their
            // handles kill on drop) and every temp dir removed — nothing is left running.
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = compare::run(quick, (msg_bytes, batch), &out, futureq, &only) => r,
                _ = tokio::signal::ctrl_c() => bail!("interrupted; every server this run started is stopped"),
                _ = term.recv() => bail!("terminated; every server this run started is stopped"),
            }
        }
    }
}
