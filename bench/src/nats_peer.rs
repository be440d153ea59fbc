//! NATS JetStream as a peer of `compare`: a `nats-server -js` this run starts on a loopback
//! port with file storage, one stream (R1), and publishers that wait for JetStream's publish
//! ack with a bounded window per connection. A minimal NATS client of our own (CONNECT, SUB,
//! PUB with a reply subject, MSG, PING/PONG).
//!
//! JetStream 2.9 does not fsync every message by default (it syncs on an interval): its acks
//! mean "in the stream's file, not necessarily on disk". Its rows say so.

use std::collections::HashMap;
use std::ffi::OsString;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::procs::{free_port, PeerProcess};
use crate::{hist, PublishOut, PublishParams};

/// Starts `nats-server` with JetStream (file storage in the temp dir), or `Ok(None)` when it
/// is not installed.
pub async fn start() -> anyhow::Result<Option<PeerProcess>> {
    PeerProcess::start("nats-server", |port, dir| {
        let mut a: Vec<OsString> = ["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"]
            .iter()
            .map(OsString::from)
            .collect();
        a.push(dir.into());
        a
    })
    .await
}

/// One connection: messages to our inbox come back from [`Conn::next_msg`].
struct Conn {
    r: Reader,
    w: tokio::net::tcp::OwnedWriteHalf,
    inbox: String,
}

impl Conn {
    async fn open(port: u16, inbox: String) -> anyhow::Result<Conn> {
        let s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.set_nodelay(true)?;
        let (r, w) = s.into_split();
        let mut c = Conn {
            r: BufReader::new(r),
            w,
            inbox,
        };
        let mut info = String::new();
        c.r.read_line(&mut info).await?;
        if !info.starts_with("INFO ") {
            bail!("nats: expected INFO, got {info:?}");
        }
        let hello = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":false}}\r\nSUB {}.> 1\r\n",
            c.inbox
        );
        c.w.write_all(hello.as_bytes()).await?;
        Ok(c)
    }

    fn publish(buf: &mut Vec<u8>, subject: &str, reply: &str, payload: &[u8]) {
        buf.extend_from_slice(format!("PUB {subject} {reply} {}\r\n", payload.len()).as_bytes());
        buf.extend_from_slice(payload);
        buf.extend_from_slice(b"\r\n");
    }

    /// The next message delivered to this connection: (subject, payload). Answers PINGs.
    async fn next_msg(&mut self) -> anyhow::Result<(String, Vec<u8>)> {
        read_msg(&mut self.r, Some(&mut self.w)).await
    }
}

type Reader = BufReader<tokio::net::tcp::OwnedReadHalf>;

/// The next MSG on `r`: (subject, payload). PINGs are answered on `pong` when given (an
/// open-loop reader has no writer; its runs are far shorter than the server's 2-minute ping
/// interval).
async fn read_msg(
    r: &mut Reader,
    mut pong: Option<&mut tokio::net::tcp::OwnedWriteHalf>,
) -> anyhow::Result<(String, Vec<u8>)> {
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            bail!("nats closed the connection");
        }
        let line = line.trim_end();
        if line == "PING" {
            if let Some(w) = pong.as_mut() {
                w.write_all(b"PONG\r\n").await?;
            }
        } else if let Some(rest) = line.strip_prefix("MSG ") {
            let parts: Vec<&str> = rest.split(' ').collect();
            let (subject, len) = match parts.as_slice() {
                [s, _sid, len] | [s, _sid, _, len] => (*s, len.parse::<usize>()?),
                _ => bail!("nats: bad MSG line {line:?}"),
            };
            let mut payload = vec![0u8; len + 2];
            r.read_exact(&mut payload).await?;
            payload.truncate(len);
            return Ok((subject.to_owned(), payload));
        } else if line.starts_with("-ERR") {
            bail!("nats: {line}");
        }
        // +OK, PONG, INFO updates: nothing to do.
    }
}

/// Fails on a JetStream error answer.
fn check_ack(ack: &[u8]) -> anyhow::Result<()> {
    if ack.windows(7).any(|w| w == b"\"error\"") {
        bail!(
            "JetStream refused a publish: {}",
            String::from_utf8_lossy(ack)
        );
    }
    Ok(())
}

/// Creates the file-storage stream `BENCH` (subjects `bench.>`, `replicas`), retrying for up
/// to 30 s while a new cluster has not elected its JetStream meta leader yet.
pub async fn create_stream(port: u16, replicas: u32) -> anyhow::Result<()> {
    let mut c = Conn::open(port, "_INBOX.setup".into()).await?;
    let cfg = format!(
        "{{\"name\":\"BENCH\",\"subjects\":[\"bench.>\"],\"storage\":\"file\",\"num_replicas\":{replicas}}}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut buf = Vec::new();
        Conn::publish(
            &mut buf,
            "$JS.API.STREAM.CREATE.BENCH",
            "_INBOX.setup.1",
            cfg.as_bytes(),
        );
        c.w.write_all(&buf).await?;
        let answer = match tokio::time::timeout(Duration::from_secs(5), c.next_msg()).await {
            Ok(m) => String::from_utf8_lossy(&m?.1).into_owned(),
            // No responders yet (a cluster still forming): ask again.
            Err(_) => "no answer".into(),
        };
        if !answer.contains("\"error\"") && answer != "no answer" {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("JetStream refused the stream: {answer}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts three `nats-server`s with JetStream clustered over routes (cluster `bench`), or
/// `Ok(None)` when it is not installed; clients connect to the first.
pub async fn start_cluster() -> anyhow::Result<Option<Vec<PeerProcess>>> {
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
    let route: Vec<u16> = (0..3).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
    let mut servers = Vec::new();
    for i in 0..3 {
        let routes = (0..3)
            .filter(|&j| j != i)
            .map(|j| format!("nats://127.0.0.1:{}", route[j]))
            .collect::<Vec<_>>()
            .join(",");
        let server = PeerProcess::start_on("nats-server", client[i], |port, dir| {
            let mut a: Vec<OsString> = ["-js", "-a", "127.0.0.1", "-p", &port.to_string()]
                .iter()
                .map(OsString::from)
                .collect();
            a.extend(
                [
                    "-n".to_owned(),
                    format!("bench{i}"),
                    "--cluster_name".into(),
                    "bench".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{}", route[i]),
                    "--routes".into(),
                    routes,
                    "-sd".into(),
                ]
                .map(OsString::from),
            );
            a.push(dir.into());
            a
        })
        .await?;
        let Some(server) = server else {
            return Ok(None);
        };
        servers.push(server);
    }
    Ok(Some(servers))
}

/// Closed-loop JetStream publishing: `streams` connections, `window` publishes awaiting
/// their ack each, one message per publish (JetStream has no batch publish).
pub async fn publish(port: u16, p: &PublishParams) -> anyhow::Result<PublishOut> {
    let start = Instant::now();
    let (warm, end) = (start + p.warmup, start + p.warmup + p.measure);
    let mut tasks = Vec::new();
    for s in 0..p.streams {
        let (window, size) = (p.window, p.size);
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(port, format!("_INBOX.bench{s}")).await?;
            let subject = format!("bench.{}", s % 4);
            let payload = vec![b'x'; size];
            let mut sent_at: HashMap<String, Instant> = HashMap::new();
            let mut seq = 0u64;
            let mut buf = Vec::new();
            for _ in 0..window {
                seq += 1;
                let reply = format!("{}.{seq}", c.inbox);
                Conn::publish(&mut buf, &subject, &reply, &payload);
                sent_at.insert(reply, Instant::now());
            }
            c.w.write_all(&buf).await?;
            let (mut local, mut msgs, mut acked) = (hist(), 0u64, 0u64);
            loop {
                let (reply, ack) = c.next_msg().await?;
                check_ack(&ack)?;
                acked += 1;
                let now = Instant::now();
                let t0 = sent_at.remove(&reply).unwrap_or(now);
                if now >= warm && now < end {
                    local.record(u64::try_from((now - t0).as_micros())?.max(1))?;
                    msgs += 1;
                }
                if now >= end {
                    break;
                }
                seq += 1;
                let reply = format!("{}.{seq}", c.inbox);
                buf.clear();
                Conn::publish(&mut buf, &subject, &reply, &payload);
                sent_at.insert(reply, Instant::now());
                c.w.write_all(&buf).await?;
            }
            Ok::<_, anyhow::Error>((msgs, acked, local))
        }));
    }
    crate::collect(tasks, p.measure).await
}

struct OpenSender {
    w: tokio::net::tcp::OwnedWriteHalf,
    inbox: String,
    subject: String,
    payload: Vec<u8>,
    buf: Vec<u8>,
}

impl crate::openloop::Sender for OpenSender {
    async fn send(&mut self, seq: u64) -> anyhow::Result<()> {
        self.buf.clear();
        let reply = format!("{}.{seq}", self.inbox);
        Conn::publish(&mut self.buf, &self.subject, &reply, &self.payload);
        self.w.write_all(&self.buf).await?;
        Ok(())
    }
}

/// Acks arrive on `inbox.<seq>`.
struct OpenAcks(Reader);

impl crate::openloop::Acks for OpenAcks {
    async fn recv(&mut self) -> anyhow::Result<u64> {
        let (subject, ack) = read_msg(&mut self.0, None).await?;
        check_ack(&ack)?;
        subject
            .rsplit('.')
            .next()
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("nats: ack on an unexpected subject {subject:?}"))
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
        let c = Conn::open(port, format!("_INBOX.open{i}")).await?;
        let tx = OpenSender {
            w: c.w,
            inbox: c.inbox,
            subject: format!("bench.{}", i % 4),
            payload: vec![b'x'; size],
            buf: Vec::new(),
        };
        halves.push((tx, OpenAcks(c.r)));
    }
    crate::openloop::run(halves, s).await
}
