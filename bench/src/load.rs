//! The futureq load drivers: closed-loop and open-loop publishing, filling a backlog, and
//! delivery lateness, each measured into an HDR histogram.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::ValueEnum;
use futureq_bench::pb::future_q_consumer_client::FutureQConsumerClient;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::{
    consumer_frame, AckRequest, ConsumerFrame, PublishBatch, PublishBatchAck, PublishMessage,
    SubscribeInit,
};
use hdrhistogram::Histogram;

use crate::conn::{authed, connect};
use crate::openloop;
use crate::stats::{hist, now_us, row, PublishOut, HEADER};

#[derive(Clone, Copy, Debug, ValueEnum)]
#[allow(clippy::enum_variant_names)]
pub(crate) enum Ack {
    Quorum,
    Leader,
    NoAck,
}

/// One closed-loop publish measurement.
#[derive(Clone, Copy)]
pub(crate) struct PublishParams {
    pub(crate) streams: usize,
    pub(crate) window: usize,
    pub(crate) batch: usize,
    pub(crate) size: usize,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
    pub(crate) ack: Ack,
    pub(crate) delay_ms: i64,
    /// Give every message a unique dedup id (the cost of idempotent publishes).
    pub(crate) dedup: bool,
}

impl PublishParams {
    /// `streams` × `window` batches of `batch` messages of `size` bytes at `ack`, measured for
    /// `measure` after 1 s of warm-up, due in an hour, without dedup ids.
    pub(crate) fn new(
        streams: usize,
        window: usize,
        batch: usize,
        size: usize,
        measure: Duration,
        ack: Ack,
    ) -> Self {
        PublishParams {
            streams,
            window,
            batch,
            size,
            warmup: Duration::from_secs(1),
            measure,
            ack,
            delay_ms: 3_600_000,
            dedup: false,
        }
    }

    /// The same with messages due in `delay_ms`, with dedup ids or not.
    pub(crate) fn delayed(self, delay_ms: i64, dedup: bool) -> Self {
        PublishParams {
            delay_ms,
            dedup,
            ..self
        }
    }
}

/// Publishes one QUORUM message and waits for its ack: the broker's writer is FIFO, so this
/// returns once everything queued before (a NO_ACK backlog of the previous run) is committed.
pub(crate) async fn drain(addr: &str) -> anyhow::Result<()> {
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
        return Err(Refused::of(&a).into());
    }
    Ok(())
}

pub(crate) async fn publish_run(addr: &str, p: &PublishParams) -> anyhow::Result<PublishOut> {
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
    // Dedup ids unique across runs on one broker (a later series is not answered as
    // duplicates of an earlier one's), about as long as a UUID's text.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
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
            let mut c = crate::stats::StreamCounts::default();
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
                            format!("{run:x}-s{s}-b{id}-m{i}")
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
                send_or_status(&tx, &mut acks, mk(next_id)).await?;
                next_id += 1;
            }
            while let Some(a) = acks.message().await? {
                let t0 = sent_at.pop_front().unwrap_or_else(Instant::now);
                let now = Instant::now();
                if let Some(after) = retry_after(&a) {
                    // Shed: counted, and the next batch waits for the hint.
                    if now >= warm && now < end {
                        c.refused += batch as u64;
                    }
                    tokio::time::sleep(after).await;
                } else if !a.success {
                    return Err(Refused::of(&a).into());
                }
                if a.success {
                    c.acked += batch as u64;
                }
                if a.success && now >= warm && now < end {
                    local.record(
                        u64::try_from(now.duration_since(t0).as_micros())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    )?;
                    c.msgs += batch as u64;
                }
                if now >= end {
                    break;
                }
                sent_at.push_back(Instant::now());
                send_or_status(&tx, &mut acks, mk(next_id)).await?;
                next_id += 1;
            }
            Ok::<_, anyhow::Error>((c, local))
        }));
    }
    crate::stats::collect(tasks, measure).await
}

/// Sends a batch on a publish stream; when the broker has ended the call (its request half is
/// gone), the error is the status it ended it with, not "channel closed".
async fn send_or_status(
    tx: &tokio::sync::mpsc::Sender<PublishBatch>,
    acks: &mut tonic::Streaming<PublishBatchAck>,
    batch: PublishBatch,
) -> anyhow::Result<()> {
    if tx.send(batch).await.is_ok() {
        return Ok(());
    }
    let ended = async {
        loop {
            match acks.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => bail!("the broker ended the publish stream without a status"),
                Err(status) => {
                    return Err(
                        anyhow::Error::new(status).context("the broker ended the publish stream")
                    )
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), ended)
        .await
        .unwrap_or_else(|_| bail!("the publish stream's request half closed; no status within 5 s"))
}

/// The sending half of one open-loop futureq publish stream.
pub(crate) struct OpenSender {
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
    async fn recv(&mut self) -> anyhow::Result<(u64, bool)> {
        let a = self.message().await?.context("publish stream ended")?;
        if !a.success && retry_after(&a).is_none() {
            return Err(Refused::of(&a).into());
        }
        Ok((a.batch_id, a.success))
    }
}

/// A batch the broker refused (not one shed with a retry hint): an error a caller can tell by
/// type, not by its text.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) batch_id: u64,
    /// Refused because the node no longer leads (leadership moved).
    pub(crate) not_leader: bool,
    pub(crate) message: String,
}

impl Refused {
    fn of(a: &PublishBatchAck) -> Refused {
        Refused {
            batch_id: a.batch_id,
            not_leader: a.error_reason == futureq_bench::pb::ErrorReason::NotLeader as i32,
            message: a.error_message.clone(),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "batch {} rejected: {}", self.batch_id, self.message)
    }
}

impl std::error::Error for Refused {}

/// A refused batch's retry hint when it was refused as OVERLOADED (nothing stored; send it
/// again after the hint), else `None`.
pub(crate) fn retry_after(a: &PublishBatchAck) -> Option<Duration> {
    let overloaded = futureq_bench::pb::ErrorReason::Overloaded as i32;
    (!a.success && a.error_reason == overloaded)
        .then(|| Duration::from_millis(u64::from(a.retry_after_ms)))
}

/// Open-loop futureq publishing on the schedule `s` (see [`openloop`]).
pub(crate) async fn publish_open(
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
pub(crate) fn messages(topic: &str, n: usize, size: usize, delay_ms: i64) -> Vec<PublishMessage> {
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

/// Batches each fill stream keeps in flight. The four streams' 128 stay below what a node
/// always takes in service (`BATCHES_IN_SERVICE_MIN`, 1,024), so a fill is shed only by a node
/// whose write path is behind (then each shed batch goes again after its retry hint).
const FILL_WINDOW: u64 = 32;
/// Most times one batch is shed before a bench publish gives up (a node that sheds everything
/// must fail the run, not hang it).
const SHED_RETRIES_MAX: u32 = 1_000;

/// Publishes batches `0..batches`, each built by `make` when it is sent, on one stream with at
/// most `window` in flight, until every one is stored. A batch shed (OVERLOADED) is built and
/// sent again once its retry hint has passed, while the acks of the others go on being read;
/// any other refusal fails.
pub(crate) async fn publish_all(
    addr: &str,
    batches: u64,
    window: u64,
    mut make: impl FnMut(u64) -> anyhow::Result<PublishBatch> + Send + 'static,
) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PublishBatch>();
    let mut acks = FutureQProducerClient::new(connect(addr).await?)
        .publish_stream(authed(futures::stream::poll_fn(move |cx| rx.poll_recv(cx))))
        .await?
        .into_inner();
    let mut send = |b: u64| -> anyhow::Result<()> { Ok(tx.send(make(b)?)?) };
    let mut next = 0;
    while next < batches.min(window) {
        send(next)?;
        next += 1;
    }
    // Shed batches, in the order their hints pass (each hint is at least the previous), and
    // how often each was shed.
    let mut again: std::collections::VecDeque<(tokio::time::Instant, u64)> = Default::default();
    let mut sheds: std::collections::HashMap<u64, u32> = Default::default();
    let mut stored = 0;
    while stored < batches {
        let resend = async {
            match again.front() {
                Some(&(at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let a = tokio::select! {
            a = acks.message() => a?.context("publish stream ended")?,
            () = resend => {
                if let Some((_, b)) = again.pop_front() {
                    send(b)?;
                }
                continue;
            }
        };
        if let Some(after) = retry_after(&a) {
            let times = sheds.entry(a.batch_id).or_default();
            *times += 1;
            if *times > SHED_RETRIES_MAX {
                bail!(
                    "batch {} shed {SHED_RETRIES_MAX} times: {}",
                    a.batch_id,
                    a.error_message
                );
            }
            let at = tokio::time::Instant::now() + after;
            let at = again.back().map_or(at, |&(last, _)| at.max(last));
            again.push_back((at, a.batch_id));
            continue;
        }
        if !a.success {
            return Err(Refused::of(&a).into());
        }
        sheds.remove(&a.batch_id);
        stored += 1;
        if next < batches {
            send(next)?;
            next += 1;
        }
    }
    Ok(())
}

/// Publishes `count` messages due in a year (QUORUM, batches of 100 on 4 streams with
/// [`FILL_WINDOW`] in flight each) and returns the publish rate, msgs/s.
pub(crate) async fn fill(addr: &str, count: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    let per_stream = count.div_ceil(4);
    let mut tasks = Vec::new();
    for s in 0..4u64 {
        let n = per_stream.min(count.saturating_sub(s * per_stream));
        let make = move |b: u64| {
            let k = usize::try_from((n - b * 100).min(100))?;
            Ok(PublishBatch {
                messages: messages(&format!("pending-{s}"), k, 100, 365 * 86_400_000),
                ack_level: Ack::Quorum as i32,
                batch_id: b,
            })
        };
        let addr = addr.to_owned();
        tasks.push(tokio::spawn(async move {
            publish_all(&addr, n.div_ceil(100), FILL_WINDOW, make).await
        }));
    }
    for t in tasks {
        t.await??;
    }
    #[allow(clippy::cast_precision_loss)]
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// The `publish` command: closed loop with `p`, or open loop at `rate` msgs/s offered.
pub(crate) async fn publish(
    addr: &str,
    p: &PublishParams,
    rate: Option<f64>,
) -> anyhow::Result<()> {
    let (level, size) = (p.ack as i32, p.size);
    let out = match rate {
        None => publish_run(addr, p).await?,
        Some(rate) => {
            let s = openloop::Schedule {
                rate,
                streams: p.streams,
                batch: p.batch,
                warmup: p.warmup,
                measure: p.measure,
            };
            publish_open(addr, s, p.ack, size).await?
        }
    };
    let (streams, window, batch) = (p.streams, p.window, p.batch);
    match rate {
        None => println!(
            "publish: {streams} streams × {window} in flight, {batch} msgs/batch, {size} B payload, ack level {level}\n"
        ),
        Some(rate) => println!(
            "publish: open loop at {rate:.0} msgs/s offered, {streams} streams, {batch} msgs/batch, {size} B payload, ack level {level}\n"
        ),
    }
    let (rate, h) = (out.msgs_per_s, out.latency);
    println!(
        "throughput: {rate:.0} msgs/s ({:.1} MB/s payload); {} acked in the whole run; {} refused as overloaded in the measured window\n",
        rate * size as f64 / 1e6,
        out.acked,
        out.refused
    );
    println!("{HEADER}\n{}", row("publish ack latency (per batch)", &h));
    Ok(())
}

pub(crate) fn tokio_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Time from the start of publishing `count` lateness messages to the first due instant:
/// `lead_ms`, plus room to publish them at 50k msgs/s.
pub(crate) fn lead_time_ms(count: usize, lead_ms: i64) -> i64 {
    lead_ms + i64::try_from(count / 50).unwrap_or(i64::MAX / 2)
}

/// Seconds over which `count` messages fall due at `rate` msgs/s; for a burst (`rate` 0), the
/// time draining it at 10k/s takes: with a minute more, how long a lateness run waits.
pub(crate) fn due_span_s(count: usize, rate: u64) -> u64 {
    count as u64 / if rate == 0 { 10_000 } else { rate }
}

/// Batches the lateness run's publisher keeps in flight.
const LATENESS_WINDOW: u64 = 64;

/// Publishes `count` messages falling due at `rate` msgs/s (0: all at one instant) and
/// returns the lateness histogram (µs) and how many came early.
pub(crate) async fn lateness_run(
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
    let n_batches = count.div_ceil(100);
    // Each batch's delays are computed when it is sent (again, if it was shed), so that its
    // messages fall due where they should.
    let make = move |b: u64| {
        let b = usize::try_from(b)?;
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
        Ok(PublishBatch {
            messages,
            ack_level: 0,
            batch_id: b as u64,
        })
    };
    publish_all(addr, n_batches as u64, LATENESS_WINDOW, make).await?;
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

pub(crate) async fn lateness(
    addr: &str,
    count: usize,
    rate: u64,
    lead_ms: i64,
) -> anyhow::Result<()> {
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
