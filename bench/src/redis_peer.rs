//! Redis as the common delayed queue (a sorted set scored by due time), measured by
//! `compare`: a `redis-server` this run starts on a loopback port with AOF on and
//! `appendfsync` always (durability like QUORUM on one node) or everysec, and publishers that
//! ZADD with pipelining. A minimal RESP client of our own (commands out, one reply each in).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use anyhow::bail;
use hdrhistogram::Histogram;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

use crate::procs::PeerProcess;
use crate::{hist, PublishOut, PublishParams};

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
        a
    })
    .await
}

/// Appends one RESP command (an array of bulk strings).
fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

type Reader = BufReader<tokio::net::tcp::OwnedReadHalf>;

/// Reads one reply: the bulk strings of an array reply (one for a bulk reply, none for a
/// status or integer); an error reply (`-ERR …`) is an error.
async fn reply(r: &mut Reader) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        bail!("redis closed the connection");
    }
    let n = || line[1..].trim_end().parse::<i64>();
    match line.as_bytes().first() {
        Some(b'+' | b':') => Ok(Vec::new()),
        Some(b'-') => bail!("redis: {}", line.trim_end()),
        Some(b'$') => Ok(bulk(r, n()?).await?.into_iter().collect()),
        Some(b'*') => {
            let mut items = Vec::new();
            for _ in 0..n()?.max(0) {
                let mut l = String::new();
                r.read_line(&mut l).await?;
                if !l.starts_with('$') {
                    bail!("unexpected redis array item {l:?}");
                }
                items.extend(bulk(r, l[1..].trim_end().parse()?).await?);
            }
            Ok(items)
        }
        _ => bail!("unexpected redis reply {line:?}"),
    }
}

/// The body of a bulk string of length `n` (-1: nil).
async fn bulk(r: &mut Reader, n: i64) -> anyhow::Result<Option<Vec<u8>>> {
    if n < 0 {
        return Ok(None);
    }
    let mut b = vec![0u8; usize::try_from(n)? + 2];
    r.read_exact(&mut b).await?;
    b.truncate(b.len() - 2);
    Ok(Some(b))
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
    let key = format!("lateness-{}", crate::now_us());
    let first_due_us = crate::now_us() + crate::lead_time_ms(count, lead_ms) * 1000;
    let conn = TcpStream::connect(("127.0.0.1", port)).await?;
    conn.set_nodelay(true)?;
    let (r, mut w) = conn.into_split();
    let mut r = BufReader::new(r);
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let members: Vec<(String, Vec<u8>)> = chunk
            .iter()
            .map(|&i| {
                let offset_us = (i as u64 * 1_000_000)
                    .checked_div(rate)
                    .map_or(0, |v| i64::try_from(v).unwrap_or(0));
                let due_us = first_due_us + offset_us;
                let mut m = format!("{due_us}:{i}:").into_bytes();
                m.resize(m.len() + 100, b'x');
                (due_us.to_string(), m)
            })
            .collect();
        let mut args: Vec<&[u8]> = vec![b"ZADD", key.as_bytes()];
        for (score, m) in &members {
            args.push(score.as_bytes());
            args.push(m);
        }
        let mut buf = Vec::new();
        command(&mut buf, &args);
        w.write_all(&buf).await?;
        reply(&mut r).await?;
    }
    if crate::now_us() > first_due_us {
        bail!("publishing to redis took longer than the lead time");
    }
    let mut h = hist();
    let deadline = Instant::now() + Duration::from_secs(60 + count as u64 / rate.max(1));
    while h.len() < count as u64 {
        if Instant::now() > deadline {
            bail!("redis lateness: only {} of {count} taken in time", h.len());
        }
        let now_us = crate::now_us().to_string();
        let mut buf = Vec::new();
        command(
            &mut buf,
            &[
                b"EVAL",
                TAKE_DUE.as_bytes(),
                b"1",
                key.as_bytes(),
                now_us.as_bytes(),
                b"1000",
            ],
        );
        w.write_all(&buf).await?;
        let taken = reply(&mut r).await?;
        let now = crate::now_us();
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
            tag: format!("{}-{stream}", crate::now_us()),
            seq: 0,
            batch,
            size,
            delay_ms,
        }
    }

    fn append(&mut self, buf: &mut Vec<u8>) {
        let due = (crate::now_us() / 1000 + self.delay_ms).to_string();
        let members: Vec<Vec<u8>> = (0..self.batch)
            .map(|_| {
                self.seq += 1;
                let mut m = format!("{}:{}:", self.tag, self.seq).into_bytes();
                m.resize(m.len() + self.size, b'x');
                m
            })
            .collect();
        let mut args: Vec<&[u8]> = vec![b"ZADD", self.key.as_bytes()];
        for m in &members {
            args.push(due.as_bytes());
            args.push(m);
        }
        command(buf, &args);
    }
}

async fn open(port: u16) -> anyhow::Result<(Reader, OwnedWriteHalf)> {
    let conn = TcpStream::connect(("127.0.0.1", port)).await?;
    conn.set_nodelay(true)?;
    let (r, w) = conn.into_split();
    Ok((BufReader::new(r), w))
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
        tasks.push(tokio::spawn(async move {
            let (mut r, mut w) = open(port).await?;
            let mut sent_at = std::collections::VecDeque::new();
            let mut buf = Vec::new();
            for _ in 0..window {
                zadd.append(&mut buf);
                sent_at.push_back(Instant::now());
            }
            w.write_all(&buf).await?;
            let (mut local, mut msgs, mut acked) = (hist(), 0u64, 0u64);
            loop {
                reply(&mut r).await?;
                acked += batch as u64;
                let now = Instant::now();
                let t0 = sent_at.pop_front().unwrap_or(now);
                if now >= warm && now < end {
                    local.record(u64::try_from((now - t0).as_micros())?.max(1))?;
                    msgs += batch as u64;
                }
                if now >= end {
                    break;
                }
                buf.clear();
                zadd.append(&mut buf);
                sent_at.push_back(Instant::now());
                w.write_all(&buf).await?;
            }
            Ok::<_, anyhow::Error>((msgs, acked, local))
        }));
    }
    crate::collect(tasks, p.measure).await
}

struct OpenSender {
    w: OwnedWriteHalf,
    zadd: Zadd,
    buf: Vec<u8>,
}

impl crate::openloop::Sender for OpenSender {
    async fn send(&mut self, _seq: u64) -> anyhow::Result<()> {
        self.buf.clear();
        self.zadd.append(&mut self.buf);
        self.w.write_all(&self.buf).await?;
        Ok(())
    }
}

/// Replies come in command order: the n-th reply acknowledges request n.
struct OpenAcks {
    r: Reader,
    next: u64,
}

impl crate::openloop::Acks for OpenAcks {
    async fn recv(&mut self) -> anyhow::Result<u64> {
        reply(&mut self.r).await?;
        self.next += 1;
        Ok(self.next - 1)
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
        let (r, w) = open(port).await?;
        let zadd = Zadd::new(i, s.batch, size, 3_600_000);
        halves.push((
            OpenSender {
                w,
                zadd,
                buf: Vec::new(),
            },
            OpenAcks { r, next: 0 },
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
        tasks.push(tokio::spawn(async move {
            let (mut r, mut w) = open(port).await?;
            let mut buf = Vec::new();
            let mut zadd = Zadd::new(usize::try_from(s)?, 100, 100, 365 * 86_400_000);
            while left > 0 {
                buf.clear();
                let mut cmds = 0;
                while left > 0 && cmds < 16 {
                    let n = left.min(100);
                    zadd.batch = usize::try_from(n)?;
                    zadd.append(&mut buf);
                    left -= n;
                    cmds += 1;
                }
                w.write_all(&buf).await?;
                for _ in 0..cmds {
                    reply(&mut r).await?;
                }
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

/// Whether the server answers PING (not while it is still loading its AOF).
pub async fn ready(port: u16) -> bool {
    async {
        let (mut r, mut w) = open(port).await?;
        let mut buf = Vec::new();
        command(&mut buf, &[b"PING"]);
        w.write_all(&buf).await?;
        reply(&mut r).await
    }
    .await
    .is_ok()
}
