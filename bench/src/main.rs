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
mod backlog;
mod compare;
mod conn;
mod failover;
mod load;
mod nats_peer;
mod nemesis;
mod openloop;
mod plot;
mod procs;
mod redis_peer;
mod row;
mod security;
mod stats;

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use crate::conn::{set_client_security, ClientSecurity};
use crate::load::{lateness, publish, Ack, PublishParams};
use crate::stats::{row, HEADER};

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
        /// Open loop at this many msgs/s offered over all streams (each sends on its schedule
        /// whatever its acks do; messages due in an hour, without dedup ids); closed loop
        /// when absent.
        #[arg(long, conflicts_with_all = ["window", "dedup", "delay_ms"])]
        rate: Option<f64>,
    },
    /// Fills the broker with far-future messages (due in a year; QUORUM, batches of 100 on 4
    /// streams), as the pending scenario does; prints the rate.
    Fill {
        /// Messages.
        #[arg(long, default_value_t = 1_000_000)]
        count: u64,
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
        /// Also measure both series with a dedup id on every message.
        #[arg(long)]
        dedup: bool,
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
    /// A standalone broker filled with far-future messages in ten steps (RSS and disk after
    /// each), then publish latency, delivery lateness and a restart with that backlog.
    Backlog {
        /// Messages waiting at the end (10^8 takes ~20 GB of disk and minutes to fill).
        #[arg(long, default_value_t = 10_000_000)]
        count: u64,
        /// Directory for the broker's data (a temporary directory is made in it).
        #[arg(long, default_value = ".")]
        work: std::path::PathBuf,
        /// Directory for backlog.json.
        #[arg(long, default_value = "backlog")]
        out: std::path::PathBuf,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(ca) = &cli.tls_ca {
        set_client_security(Some(client_security(ca, cli.token_file.as_deref())?));
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
            rate,
        } => {
            let measure = Duration::from_secs(seconds);
            let p = PublishParams::new(streams, window, batch, size, measure, ack);
            publish(&cli.addr, &p.delayed(delay_ms, dedup), rate).await
        }
        Cmd::Fill { count } => {
            let rate = crate::load::fill(&cli.addr, count).await?;
            println!("filled {count} messages at {rate:.0} msgs/s");
            Ok(())
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
            let run = nemesis::run(
                seed,
                Duration::from_secs(seconds),
                &faults,
                &out,
                (futureq, tls),
            );
            until_stopped(run, "every node").await
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
        Cmd::Failover { reps, rtt, futureq } => failover(reps, rtt, futureq).await,
        Cmd::Ab {
            before,
            after,
            rounds,
            quick,
            cluster,
            dedup,
            out,
        } => {
            let canon = |p: &std::path::Path| {
                std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))
            };
            let (before, after) = (canon(&before)?, canon(&after)?);
            let run = ab::run((&before, &after), rounds, quick, (cluster, dedup), &out);
            until_stopped(run, "every broker").await
        }
        Cmd::Backlog {
            count,
            work,
            out,
            futureq,
        } => {
            let bin = compare::futureq_binary(futureq)?;
            until_stopped(backlog::run(&bin, count, &work, &out), "the broker").await
        }
        Cmd::Compare {
            quick,
            out,
            futureq,
            only,
            msg_bytes,
            batch,
        } => {
            let run = compare::run(quick, (msg_bytes, batch), &out, futureq, &only);
            until_stopped(run, "every server").await
        }
    }
}

/// Runs `run` until it ends, or until Ctrl-C or SIGTERM drops it: every process it started
/// (`started`, for the message) is killed, their handles killing on drop, and every temp dir
/// removed; nothing is left running.
async fn until_stopped(
    run: impl std::future::Future<Output = anyhow::Result<()>>,
    started: &str,
) -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = run => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted; {started} this run started is stopped"),
        _ = term.recv() => bail!("terminated; {started} this run started is stopped"),
    }
}

/// `--tls-ca` and `--token-file`: TLS towards the broker, and the token of every call.
fn client_security(
    ca: &std::path::Path,
    token_file: Option<&std::path::Path>,
) -> anyhow::Result<ClientSecurity> {
    let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
    let token = match token_file {
        Some(f) => {
            let t =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            Some(format!("Bearer {}", t.trim()).parse()?)
        }
        None => None,
    };
    Ok(ClientSecurity {
        tls: tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem)),
        token,
    })
}

/// `failover`: kills the leader of a fresh 3-node cluster `reps` times and reports the time
/// to the first QUORUM ack after each.
async fn failover(
    reps: usize,
    rtt: Option<String>,
    futureq: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
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
