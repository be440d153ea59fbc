//! Redis as the common delayed queue (a sorted set scored by due time), measured by
//! `compare`: a `redis-server` this run starts on a loopback port with AOF on and
//! `appendfsync` always (durability like QUORUM on one node) or everysec, and publishers that
//! ZADD with pipelining, through the `redis` crate (a multiplexed connection per publisher:
//! concurrent commands are pipelined on it).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;

use crate::load::PublishParams;
use crate::procs::PeerProcess;
use crate::stats::{hist, PublishOut};

/// Starts `redis-server` with AOF and the given `appendfsync` policy, or `Ok(None)` when it
/// is not installed.
pub async fn start(appendfsync: &str) -> anyhow::Result<Option<PeerProcess>> {
    PeerProcess::start("redis-server", |port, dir| {
        let mut a: Vec<OsString> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--appendonly",
            "yes",
            "--appendfsync",
            appendfsync,
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--dir",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        a.push(dir.into());
        Ok(a)
    })
    .await
}

/// A multiplexed connection to the server on `port`, without the client's response timeout
/// (500 ms by default): an overloaded server's slow replies are measured as late
/// ([`crate::openloop`]), not turned into errors.
async fn open(port: u16) -> anyhow::Result<MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .with_context(|| format!("connecting to redis-server on port {port}"))
}

/// Takes up to ARGV[2] members due by ARGV[1] off the set KEYS[1], atomically: the usual
/// sorted-set delayed-queue consumer. (Scores are due times in µs here, so that the poller
/// never takes a member before it is due — with ms scores it would, by up to 1 ms.)
const TAKE_DUE: &str =
    "local m = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2]) \
if #m > 0 then redis.call('ZREM', KEYS[1], unpack(m)) end return m";

/// Delivery lateness of the sorted-set queue: `count` members falling due at `rate` per
/// second (0: all at one instant), `lead_ms` after publishing starts; one consumer polls
/// with [`TAKE_DUE`] (1 ms pause when nothing is due). Lateness = take time − due time (µs).
pub async fn lateness(
    port: u16,
    count: usize,
    rate: u64,
    lead_ms: i64,
) -> anyhow::Result<Histogram<u64>> {
    let key = format!("lateness-{}", crate::stats::now_us());
    let first_due_us = crate::stats::now_us() + crate::load::lead_time_ms(count, lead_ms) * 1000;
    let mut con = open(port).await?;
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&key);
        for &i in chunk {
            let offset_us = (i as u64 * 1_000_000)
                .checked_div(rate)
                .map_or(0, |v| i64::try_from(v).unwrap_or(0));
            let due_us = first_due_us + offset_us;
            let mut m = format!("{due_us}:{i}:").into_bytes();
            m.resize(m.len() + 100, b'x');
            zadd.arg(due_us).arg(m);
        }
        zadd.query_async::<i64>(&mut con).await?;
    }
    if crate::stats::now_us() > first_due_us {
        bail!("publishing to redis took longer than the lead time");
    }
    let mut h = hist();
    let deadline = Instant::now() + Duration::from_secs(60 + crate::load::due_span_s(count, rate));
    while h.len() < count as u64 {
        if Instant::now() > deadline {
            bail!("redis lateness: only {} of {count} taken in time", h.len());
        }
        let taken: Vec<Vec<u8>> = redis::cmd("EVAL")
            .arg(TAKE_DUE)
            .arg(1)
            .arg(&key)
            .arg(crate::stats::now_us())
            .arg(1000)
            .query_async(&mut con)
            .await?;
        let now = crate::stats::now_us();
        if taken.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for m in taken {
            let due_us: i64 = std::str::from_utf8(&m)?
                .split(':')
                .next()
                .unwrap_or_default()
                .parse()?;
            h.record(u64::try_from(now - due_us).unwrap_or(0).max(1))?;
        }
    }
    Ok(h)
}

/// Builds ZADD commands adding `batch` fresh members scored `delay_ms` from now (ms).
struct Zadd {
    key: String,
    /// Unique per connection and run, so members never repeat (ZADD of an existing member
    /// only moves it).
    tag: String,
    seq: u64,
    batch: usize,
    size: usize,
    delay_ms: i64,
}

impl Zadd {
    fn new(stream: usize, batch: usize, size: usize, delay_ms: i64) -> Self {
        Zadd {
            key: format!("bench-{}", stream % 4),
            tag: format!("{}-{stream}", crate::stats::now_us()),
            seq: 0,
            batch,
            size,
            delay_ms,
        }
    }

    fn next(&mut self) -> redis::Cmd {
        let due = crate::stats::now_us() / 1000 + self.delay_ms;
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&self.key);
        for _ in 0..self.batch {
            self.seq += 1;
            let mut m = format!("{}:{}:", self.tag, self.seq).into_bytes();
            m.resize(m.len() + self.size, b'x');
            cmd.arg(due).arg(m);
        }
        cmd
    }
}

/// Sends `cmd` on `con` (pipelined with whatever else is in flight on it).
async fn send(mut con: MultiplexedConnection, cmd: redis::Cmd) -> anyhow::Result<()> {
    cmd.query_async::<i64>(&mut con)
        .await
        .context("redis refused a ZADD")?;
    Ok(())
}

/// Closed-loop ZADD publishing: `streams` connections, `window` commands in flight each,
/// `batch` members per ZADD (score = due time in ms), like futureq's `publish_run`.
pub async fn publish(port: u16, p: &PublishParams) -> anyhow::Result<PublishOut> {
    let start = Instant::now();
    let (warm, end) = (start + p.warmup, start + p.warmup + p.measure);
    let mut tasks = Vec::new();
    for s in 0..p.streams {
        let mut zadd = Zadd::new(s, p.batch, p.size, p.delay_ms);
        let (batch, window) = (p.batch, p.window);
        let con = open(port).await?;
        tasks.push(tokio::spawn(async move {
            let mut waiting = FuturesUnordered::new();
            let next = |zadd: &mut Zadd| {
                let (t0, cmd) = (Instant::now(), zadd.next());
                let con = con.clone();
                async move { send(con, cmd).await.map(|()| t0) }
            };
            for _ in 0..window {
                waiting.push(next(&mut zadd));
            }
            let (mut local, mut msgs, mut acked) = (hist(), 0u64, 0u64);
            while let Some(t0) = waiting.next().await {
                let t0 = t0?;
                acked += batch as u64;
                let now = Instant::now();
                if now >= warm && now < end {
                    local.record(u64::try_from((now - t0).as_micros())?.max(1))?;
                    msgs += batch as u64;
                }
                if now < end {
                    waiting.push(next(&mut zadd));
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

type Reply = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

/// The sending half of an open-loop connection: hands each command's reply to [`OpenAcks`].
struct OpenSender {
    con: MultiplexedConnection,
    zadd: Zadd,
    replies: tokio::sync::mpsc::UnboundedSender<Reply>,
}

impl crate::openloop::Sender for OpenSender {
    async fn send(&mut self, _seq: u64) -> anyhow::Result<()> {
        // Polled once now: queued on the connection while its pipeline has room (else sent
        // when the ack half polls it; latency still counts from the schedule).
        let mut reply: Reply = Box::pin(send(self.con.clone(), self.zadd.next()));
        if let std::task::Poll::Ready(r) = futures::poll!(&mut reply) {
            r?;
            reply = Box::pin(async { Ok(()) });
        }
        self.replies
            .send(reply)
            .map_err(|_| anyhow::anyhow!("the ack reader stopped"))?;
        Ok(())
    }
}

/// Replies come in command order: the n-th reply acknowledges request n.
struct OpenAcks {
    replies: tokio::sync::mpsc::UnboundedReceiver<Reply>,
    next: u64,
}

impl crate::openloop::Acks for OpenAcks {
    async fn recv(&mut self) -> anyhow::Result<(u64, bool)> {
        let reply = self
            .replies
            .recv()
            .await
            .context("the open-loop sender stopped")?;
        reply.await?;
        self.next += 1;
        Ok((self.next - 1, true))
    }
}

/// Open-loop ZADD publishing on the schedule `s` (one ZADD of `s.batch` members per request).
pub async fn publish_open(
    port: u16,
    s: crate::openloop::Schedule,
    size: usize,
) -> anyhow::Result<PublishOut> {
    let mut halves = Vec::new();
    for i in 0..s.streams {
        let (replies, rx) = tokio::sync::mpsc::unbounded_channel();
        halves.push((
            OpenSender {
                con: open(port).await?,
                zadd: Zadd::new(i, s.batch, size, 3_600_000),
                replies,
            },
            OpenAcks {
                replies: rx,
                next: 0,
            },
        ));
    }
    crate::openloop::run(halves, s).await
}

/// Adds `count` members due in a year (ZADDs of 100, 16 pipelined, on 4 connections) and
/// returns the rate, members/s.
pub async fn fill(port: u16, count: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    let per_stream = count.div_ceil(4);
    let mut tasks = Vec::new();
    for s in 0..4u64 {
        let mut left = per_stream.min(count.saturating_sub(s * per_stream));
        let con = open(port).await?;
        tasks.push(tokio::spawn(async move {
            let mut zadd = Zadd::new(usize::try_from(s)?, 100, 100, 365 * 86_400_000);
            let mut waiting = FuturesUnordered::new();
            while left > 0 {
                let n = left.min(100);
                zadd.batch = usize::try_from(n)?;
                left -= n;
                waiting.push(send(con.clone(), zadd.next()));
                if waiting.len() >= 16 {
                    waiting.next().await.transpose()?;
                }
            }
            while waiting.next().await.transpose()?.is_some() {}
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    #[allow(clippy::cast_precision_loss)]
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// Whether the server answers PING (not while it is still loading its AOF).
pub async fn ready(port: u16) -> bool {
    async {
        let mut con = open(port).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await?;
        Ok::<_, anyhow::Error>(())
    }
    .await
    .is_ok()
}
