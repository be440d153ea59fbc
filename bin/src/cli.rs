//! The client commands of the `futureq` binary: publish, consume, cancel, reschedule, stats,
//! peek, groups (list, delete), cluster info. They talk gRPC through [`futureq_client`] (which finds and follows
//! the leader). Tags are printed and read as 48 hex digits; durations and sizes take units
//! (`5s`, `1h`; `64KiB`, `64KB`); `--json` prints one JSON object per line.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine as _;
use clap::{Args, Subcommand};
use futureq_broker::config::{parse_duration, parse_size};
use futureq_client::{pb, Client, Message, PublisherConfig, Subscription, Tag};

use serde_json::json;

/// Where the client commands connect, and how they print.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// gRPC address of a broker (any cluster member; the leader is found from it). Default:
    /// the configuration's api.grpc.advertise (or listen) address.
    #[arg(long, global = true)]
    pub server: Option<String>,
    /// Print JSON (one object per line) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Connect over TLS, verifying the broker against this CA certificate (PEM).
    #[arg(long, global = true, env = "FUTUREQ_CLI_TLS_CA", value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Connect over TLS, verifying the broker against the system's roots.
    #[arg(long, global = true, env = "FUTUREQ_CLI_TLS")]
    pub tls: bool,
    /// This client's certificate (PEM), for a broker that asks for one.
    #[arg(
        long,
        global = true,
        env = "FUTUREQ_CLI_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(
        long,
        global = true,
        env = "FUTUREQ_CLI_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// The name the broker's certificate must carry, when not the host of --server.
    #[arg(
        long,
        global = true,
        env = "FUTUREQ_CLI_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub tls_server_name: Option<String>,
    /// A file holding the bearer token sent on every call (surrounding whitespace ignored).
    #[arg(
        long,
        global = true,
        env = "FUTUREQ_CLI_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<PathBuf>,
}

impl Target {
    /// The client's TLS settings and token, read from the files named.
    ///
    /// # Errors
    /// A file that cannot be read.
    pub fn security(&self) -> anyhow::Result<(Option<futureq_client::TlsConfig>, Option<String>)> {
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let tls_on = self.tls
            || self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_server_name.is_some();
        let tls = if tls_on {
            Some(futureq_client::TlsConfig {
                ca_pem: self.tls_ca.as_ref().map(read).transpose()?,
                identity: match (&self.tls_cert, &self.tls_key) {
                    (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                    _ => None,
                },
                server_name: self.tls_server_name.clone(),
            })
        } else {
            None
        };
        let token = match &self.token_file {
            Some(f) => {
                let t = String::from_utf8(read(f)?)
                    .with_context(|| format!("{}: the token is not UTF-8", f.display()))?;
                let t = t.trim();
                if t.is_empty() {
                    bail!("{}: the token file is empty", f.display());
                }
                Some(t.to_owned())
            }
            None => None,
        };
        Ok((tls, token))
    }
}

/// A client command.
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Publish one message; prints its delivery tag.
    Publish {
        /// Topic.
        #[arg(short, long)]
        topic: String,
        /// Due this long after the broker receives it (e.g. 5s, 10m).
        #[arg(long, value_parser = duration)]
        delay: Option<Duration>,
        /// Expires this long after the broker receives it.
        #[arg(long, value_parser = duration)]
        ttl: Option<Duration>,
        /// Idempotency key: a repeated publish of it stores nothing and prints the first tag.
        #[arg(long)]
        dedup_id: Option<String>,
        /// Deliveries per recipient before it goes to the dead-letter topic.
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Where a recipient that gives up sends its copy (default <topic>.dlq).
        #[arg(long)]
        dead_letter_topic: Option<String>,
        /// Largest payload read from stdin (e.g. 4MiB).
        #[arg(long, value_parser = size, default_value = "4MiB")]
        max_size: usize,
        /// The payload; "-" or absent: read stdin.
        data: Option<String>,
    },
    /// Receive messages; acks each one (or nacks with --nack).
    Consume {
        /// Topic.
        #[arg(short, long)]
        topic: String,
        /// Consumer group ("" or absent: a universal consumer, which gets every message).
        #[arg(short, long, default_value = "")]
        group: String,
        /// Stop after this many messages.
        #[arg(short = 'n', long)]
        count: Option<u64>,
        /// Nack instead of ack (each message comes again).
        #[arg(long)]
        nack: bool,
        /// Stop when no message came for this long (e.g. 10s).
        #[arg(long, value_parser = duration)]
        wait: Option<Duration>,
    },
    /// Cancel stored messages by tag; prints per tag whether it was stored.
    Cancel {
        /// Delivery tags (48 hex digits each).
        #[arg(required = true, value_parser = tag)]
        tags: Vec<Tag>,
    },
    /// Move a stored message to a new due time; prints its new tag.
    Reschedule {
        /// The delivery tag.
        #[arg(value_parser = tag)]
        tag: Tag,
        /// Due this long from now.
        #[arg(long, value_parser = duration)]
        delay: Duration,
    },
    /// Per-topic counts (all topics, or one).
    Stats {
        /// Only this topic.
        topic: Option<String>,
    },
    /// Show the first stored messages of a topic in due order (nothing is delivered).
    Peek {
        /// Topic.
        topic: String,
        /// How many (1..=1000).
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: u32,
        /// Continue after this tag.
        #[arg(long, value_parser = tag)]
        after: Option<Tag>,
    },
    /// Consumer groups of a topic: list, delete.
    Groups {
        #[command(subcommand)]
        cmd: GroupCommand,
    },
    /// Cluster commands.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCommand,
    },
}

/// `futureq groups ...`
#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    /// The topic's consumer groups: messages pending for each, in flight, connected members.
    List {
        /// Topic.
        topic: String,
    },
    /// Delete a consumer group: its members' subscriptions end, and what only it still needed
    /// is deleted (a member that subscribes again starts a new group, owed the backlog).
    Delete {
        /// Topic.
        topic: String,
        /// The group.
        group: String,
    },
}

/// `futureq cluster ...`
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Members, leader and liveness.
    Info,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

fn size(s: &str) -> Result<usize, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn tag(s: &str) -> Result<Tag, String> {
    Tag::from_hex(s.trim()).map_err(|e| e.to_string())
}

/// The address the commands connect to by default: the configuration's advertised client
/// address, with a wildcard listen address read as this host.
#[must_use]
pub fn default_server(settings: &futureq_broker::config::Settings) -> String {
    let a = &settings.grpc_advertise;
    match a.parse::<std::net::SocketAddr>() {
        Ok(s) if s.ip().is_unspecified() => format!("127.0.0.1:{}", s.port()),
        _ => a.clone(),
    }
}

/// Runs one client command.
///
/// # Errors
/// The command failed; the message says why.
pub fn run(target: &Target, server: String, cmd: ClientCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the client runtime")?;
    rt.block_on(async move {
        let client = connect(target, &server).await?;
        let out = &mut std::io::stdout().lock();
        match cmd {
            ClientCommand::Publish {
                topic,
                delay,
                ttl,
                dedup_id,
                max_attempts,
                dead_letter_topic,
                max_size,
                data,
            } => {
                let payload = match data.as_deref() {
                    None | Some("-") => read_stdin(max_size)?,
                    Some(d) => d.as_bytes().to_vec(),
                };
                let mut m = Message::new(topic, payload);
                if let Some(d) = delay {
                    m = m.delay(d);
                }
                if let Some(t) = ttl {
                    m = m.ttl(t);
                }
                if let Some(id) = dedup_id {
                    m = m.dedup_id(id);
                }
                if let Some(n) = max_attempts {
                    m = m.max_attempts(n);
                }
                if let Some(t) = dead_letter_topic {
                    m = m.dead_letter_topic(t);
                }
                publish(&client, target, out, m).await?;
            }
            ClientCommand::Consume {
                topic,
                group,
                count,
                nack,
                wait,
            } => consume(&client, target, out, topic, group, count, nack, wait).await?,
            ClientCommand::Cancel { tags } => {
                let found = client.cancel(&tags).await?;
                for (t, f) in tags.iter().zip(found) {
                    if target.json {
                        writeln!(out, "{}", json!({ "tag": t.to_string(), "cancelled": f }))?;
                    } else {
                        writeln!(out, "{t} {}", if f { "cancelled" } else { "not found" })?;
                    }
                }
            }
            ClientCommand::Reschedule { tag, delay } => {
                reschedule(&client, target, out, &tag, delay).await?;
            }
            ClientCommand::Stats { topic } => {
                let stats = client.topic_stats(topic.as_deref()).await?;
                print_stats(out, target.json, &stats)?;
            }
            ClientCommand::Peek {
                topic,
                limit,
                after,
            } => {
                let msgs = client.peek(&topic, limit, after.as_ref()).await?;
                for m in &msgs {
                    print_message(out, target.json, m)?;
                }
            }
            ClientCommand::Groups {
                cmd: GroupCommand::List { topic },
            } => {
                let stats = client.topic_stats(Some(&topic)).await?;
                let groups = stats.into_iter().flat_map(|t| t.groups).collect::<Vec<_>>();
                print_groups(out, target.json, &groups)?;
            }
            ClientCommand::Groups {
                cmd: GroupCommand::Delete { topic, group },
            } => delete_group(&client, target, out, &topic, &group).await?,
            ClientCommand::Cluster {
                cmd: ClusterCommand::Info,
            } => {
                let info = client.cluster_info().await?;
                print_cluster(out, target.json, &info)?;
            }
        }
        Ok(())
    })
}

/// A client of `server` for one command: a person waits a few seconds for a leader, not a
/// service's quarter of a minute.
async fn connect(target: &Target, server: &str) -> anyhow::Result<Client> {
    let (tls, token) = target.security()?;
    let cfg = futureq_client::ClientConfig {
        tls,
        token,
        retry_for: Duration::from_secs(5),
        ..futureq_client::ClientConfig::default()
    };
    Client::connect_with([server.to_owned()], cfg)
        .await
        .with_context(|| format!("connecting to {server}"))
}

/// `publish`: one message, retried only if it has a dedup id (then it is stored once); prints
/// its tag.
async fn publish(
    client: &Client,
    target: &Target,
    out: &mut impl Write,
    m: Message,
) -> anyhow::Result<()> {
    let publisher = client.publisher(PublisherConfig {
        idempotent: false,
        linger: Duration::ZERO,
        ..PublisherConfig::default()
    });
    let tag = publisher.publish(m).await?;
    publisher.close().await;
    if target.json {
        writeln!(out, "{}", json!({ "tag": tag.to_string() }))?;
    } else {
        writeln!(out, "{tag}")?;
    }
    Ok(())
}

/// `reschedule`: prints the moved message's new tag; fails when it was not stored.
async fn reschedule(
    client: &Client,
    target: &Target,
    out: &mut impl Write,
    tag: &Tag,
    delay: Duration,
) -> anyhow::Result<()> {
    let moved = client.reschedule(tag, delay).await?;
    if target.json {
        writeln!(
            out,
            "{}",
            json!({ "found": moved.is_some(), "tag": moved.map(|t| t.to_string()) })
        )?;
    } else if let Some(t) = moved {
        writeln!(out, "{t}")?;
    }
    if moved.is_none() {
        bail!("{tag}: not stored (delivered and acked, cancelled, expired, or never published)");
    }
    Ok(())
}

/// `groups delete`: prints what was ended; fails when the group was not registered.
async fn delete_group(
    client: &Client,
    target: &Target,
    out: &mut impl Write,
    topic: &str,
    group: &str,
) -> anyhow::Result<()> {
    let r = client.delete_group(topic, group).await?;
    if target.json {
        writeln!(
            out,
            "{}",
            json!({ "found": r.found, "consumers_ended": r.consumers_ended })
        )?;
    } else if r.found {
        writeln!(
            out,
            "deleted group {group:?} of topic {topic:?} ({} consumer streams ended)",
            r.consumers_ended
        )?;
    }
    if !r.found {
        bail!("group {group:?} of topic {topic:?}: not found");
    }
    Ok(())
}

fn read_stdin(max: usize) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::io::stdin()
        .take(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut buf)
        .context("reading the payload from stdin")?;
    if buf.len() > max {
        bail!("the payload on stdin is over --max-size ({max} bytes)");
    }
    Ok(buf)
}

#[allow(clippy::too_many_arguments)]
async fn consume(
    client: &Client,
    target: &Target,
    out: &mut impl Write,
    topic: String,
    group: String,
    count: Option<u64>,
    nack: bool,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    // With a count, one at a time: nothing is fetched beyond what is printed (a message
    // fetched and handed back at the end would spend one of its delivery attempts).
    let max_in_flight = if count.is_some() { 1 } else { 64 };
    let mut consumer = client
        .subscribe(
            Subscription::new(topic)
                .group(group)
                .max_in_flight(max_in_flight),
        )
        .await?;
    let mut got = 0u64;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    while count.is_none_or(|n| got < n) {
        let next = async {
            match wait {
                Some(w) => consumer.next_within(w).await,
                None => consumer.next().await,
            }
        };
        let d = tokio::select! {
            d = next => d,
            _ = &mut interrupted => None,
        };
        let Some(d) = d else { break };
        print_message(out, target.json, d.message())?;
        out.flush()?;
        if nack {
            d.nack();
        } else {
            d.ack();
        }
        got += 1;
    }
    let ended = consumer.error();
    consumer.drain(Duration::from_secs(5)).await;
    match ended {
        Some(e) => Err(anyhow::Error::new(e).context("the subscription ended")),
        None => Ok(()),
    }
}

/// A due time relative to `now_ms`, for people: `in 4.9s`, `now`, `12.0s ago`, `in 3h`.
fn relative(at_ms: i64, now_ms: i64) -> String {
    let d = at_ms.saturating_sub(now_ms);
    let human = |ms: u64| {
        let round = |unit: u64| (ms + unit / 2) / unit;
        if ms < 1000 {
            format!("{ms}ms")
        } else if ms < 120_000 {
            format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
        } else if round(60_000) < 60 {
            format!("{}m", round(60_000))
        } else if round(3_600_000) < 48 {
            format!("{}h", round(3_600_000))
        } else {
            format!("{}d", round(86_400_000))
        }
    };
    match d {
        0 => "now".into(),
        d if d > 0 => format!("in {}", human(d.unsigned_abs())),
        d => format!("{} ago", human(d.unsigned_abs())),
    }
}

fn payload_json(p: &[u8]) -> (&'static str, serde_json::Value) {
    match std::str::from_utf8(p) {
        Ok(s) => ("payload", json!(s)),
        Err(_) => (
            "payload_base64",
            json!(base64::engine::general_purpose::STANDARD.encode(p)),
        ),
    }
}

fn print_message(out: &mut impl Write, as_json: bool, m: &pb::QueueMessage) -> anyhow::Result<()> {
    let tag = Tag::from_slice(&m.delivery_tag).map_or_else(|_| "?".into(), |t| t.to_string());
    let due = m.enqueued_at_unix_ms.saturating_add(m.delay_ms);
    if as_json {
        let (key, payload) = payload_json(&m.payload);
        let mut v = json!({
            "tag": tag,
            "topic": m.topic,
            "attempt": m.attempt,
            "enqueued_at_unix_ms": m.enqueued_at_unix_ms,
            "due_unix_ms": due,
        });
        v[key] = payload;
        if !m.origin_topic.is_empty() {
            v["origin_topic"] = json!(m.origin_topic);
            v["origin_group"] = json!(m.origin_group);
        }
        writeln!(out, "{v}")?;
    } else {
        let origin = if m.origin_topic.is_empty() {
            String::new()
        } else {
            format!(
                "  (dead letter of {}{})",
                m.origin_topic,
                if m.origin_group.is_empty() {
                    String::new()
                } else {
                    format!(", group {}", m.origin_group)
                }
            )
        };
        let attempt = if m.attempt == 0 {
            format!("due {}", relative(due, futureq_broker::clock::now_ms()))
        } else {
            format!("attempt {}", m.attempt)
        };
        // One line per message: control characters escaped (`\n`), invalid UTF-8 replaced.
        writeln!(
            out,
            "{tag}  {}  {attempt}  {}{origin}",
            m.topic,
            String::from_utf8_lossy(&m.payload).escape_debug()
        )?;
    }
    Ok(())
}

fn print_stats(
    out: &mut impl Write,
    as_json: bool,
    stats: &[pb::TopicStats],
) -> anyhow::Result<()> {
    if as_json {
        for t in stats {
            writeln!(
                out,
                "{}",
                json!({
                    "topic": t.topic,
                    "stored": t.stored,
                    "in_flight": t.in_flight,
                    "consumers": t.consumers,
                    "dead_lettered_total": t.dead_lettered_total,
                    "next_due_unix_ms": t.next_due_unix_ms,
                    "groups": t.groups.iter().map(group_json).collect::<Vec<_>>(),
                })
            )?;
        }
        return Ok(());
    }
    let rows: Vec<[String; 6]> = stats
        .iter()
        .map(|t| {
            [
                t.topic.clone(),
                t.stored.to_string(),
                t.in_flight.to_string(),
                t.consumers.to_string(),
                t.dead_lettered_total.to_string(),
                if t.next_due_unix_ms == 0 {
                    "-".into()
                } else {
                    relative(t.next_due_unix_ms, futureq_broker::clock::now_ms())
                },
            ]
        })
        .collect();
    table(
        out,
        [
            "TOPIC",
            "STORED",
            "IN FLIGHT",
            "CONSUMERS",
            "DEAD LETTERED",
            "NEXT DUE",
        ],
        &rows,
    )
}

fn group_json(g: &pb::GroupStats) -> serde_json::Value {
    json!({
        "group": g.group,
        "pending": g.pending,
        "in_flight": g.in_flight,
        "consumers": g.consumers,
    })
}

fn print_groups(
    out: &mut impl Write,
    as_json: bool,
    groups: &[pb::GroupStats],
) -> anyhow::Result<()> {
    if as_json {
        for g in groups {
            writeln!(out, "{}", group_json(g))?;
        }
        return Ok(());
    }
    let rows: Vec<[String; 4]> = groups
        .iter()
        .map(|g| {
            [
                g.group.clone(),
                g.pending.to_string(),
                g.in_flight.to_string(),
                g.consumers.to_string(),
            ]
        })
        .collect();
    table(out, ["GROUP", "PENDING", "IN FLIGHT", "CONSUMERS"], &rows)
}

fn print_cluster(
    out: &mut impl Write,
    as_json: bool,
    info: &pb::ClusterInfoResponse,
) -> anyhow::Result<()> {
    if as_json {
        let nodes: Vec<serde_json::Value> = info
            .nodes
            .iter()
            .map(|n| {
                json!({
                    "node_id": n.node_id,
                    "address": n.address,
                    "raft_address": n.raft_address,
                    "is_leader": n.is_leader,
                    "is_alive": n.is_alive,
                    "is_voter": n.is_voter,
                })
            })
            .collect();
        writeln!(
            out,
            "{}",
            json!({
                "leader_node_id": info.leader_node_id,
                "leader_address": info.leader_address,
                "term": info.term,
                "nodes": nodes,
            })
        )?;
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "no" }.to_owned();
    let rows: Vec<[String; 6]> = info
        .nodes
        .iter()
        .map(|n| {
            [
                n.node_id.to_string(),
                n.address.clone(),
                n.raft_address.clone(),
                yes(n.is_leader),
                yes(n.is_alive),
                yes(n.is_voter),
            ]
        })
        .collect();
    table(
        out,
        ["NODE", "ADDRESS", "RAFT", "LEADER", "ALIVE", "VOTER"],
        &rows,
    )?;
    if info.term > 0 {
        writeln!(out, "term {}", info.term)?;
    } else if info.nodes.iter().all(|n| n.raft_address.is_empty()) {
        writeln!(out, "standalone (no Raft term)")?;
    } else {
        writeln!(out, "term not known yet")?;
    }
    Ok(())
}

/// Left-aligned columns, two spaces apart.
fn table<const N: usize>(
    out: &mut impl Write,
    head: [&str; N],
    rows: &[[String; N]],
) -> anyhow::Result<()> {
    let mut width = head.map(str::len);
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: Vec<&str>| -> std::io::Result<()> {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        writeln!(out, "{}", s.trim_end())
    };
    line(out, head.to_vec())?;
    for r in rows {
        line(out, r.iter().map(String::as_str).collect())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_naturally() {
        let now = 1_000_000_000;
        assert_eq!(relative(now + 4_900, now), "in 4.9s");
        assert_eq!(relative(now - 12_000, now), "12.0s ago");
        assert_eq!(relative(now + 3 * 3_600_000 - 5, now), "in 3h");
        assert_eq!(relative(now + 3_600_000 - 900, now), "in 1h");
        assert_eq!(relative(now + 150_000, now), "in 3m");
        assert_eq!(relative(now + 250, now), "in 250ms");
        assert_eq!(relative(now, now), "now");
    }

    #[test]
    fn a_table_lines_up() {
        let mut out = Vec::new();
        table(
            &mut out,
            ["A", "BB"],
            &[["long".into(), "1".into()], ["x".into(), "22".into()]],
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "A     BB\nlong  1\nx     22\n"
        );
    }
}
