//! `futureq-bench security`: what TLS and authentication cost, measured in one run on one
//! binary. Three variants — plaintext, TLS, TLS with a bearer token (principals on) — each
//! standalone and on 3 nodes (the cluster on mutual TLS between nodes in the TLS variants),
//! QUORUM publish at 1 and 100 messages per request, rounds rotating the variants' order; and
//! the rate of new connections (TCP + TLS handshake + HTTP/2 + one call) per second and per
//! broker CPU-second. The certificates come from `futureq certs dev`, the token from
//! `futureq token new`: what a user runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::ab::spread;
use crate::compare::{Plan, Target};
use crate::conn::{authed, connect, set_client_security, ClientSecurity};
use crate::load::Ack;
use crate::procs::{free_port, Broker, Cluster};

/// How the broker is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Variant {
    Plaintext,
    Tls,
    TlsToken,
}

const VARIANTS: [Variant; 3] = [Variant::Plaintext, Variant::Tls, Variant::TlsToken];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plaintext => "plaintext",
            Variant::Tls => "TLS",
            Variant::TlsToken => "TLS + token",
        }
    }
}

/// The certificates, token and principals file every variant uses.
pub(crate) struct Material {
    _dir: tempfile::TempDir,
    certs: PathBuf,
    principals: PathBuf,
    ca: Vec<u8>,
    token: String,
}

/// Makes the certificates (nodes at 127.0.0.1 to .9), a token and a principals file with
/// the binary's own commands.
pub(crate) fn material(bin: &Path) -> anyhow::Result<Material> {
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    let run = |args: &[&std::ffi::OsStr]| -> anyhow::Result<String> {
        let out = std::process::Command::new(bin)
            .args(args)
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "{} {args:?}: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    };
    let mut args: Vec<std::ffi::OsString> = vec![
        "certs".into(),
        "dev".into(),
        "--out".into(),
        certs.clone().into(),
    ];
    for i in 2..=9 {
        args.push("--host".into());
        args.push(format!("127.0.0.{i}").into());
    }
    run(&args
        .iter()
        .map(std::ffi::OsString::as_os_str)
        .collect::<Vec<_>>())?;
    let made = run(&["token".as_ref(), "new".as_ref()])?;
    let mut lines = made.lines();
    let (token, hash) = (
        lines.next().context("no token")?.to_owned(),
        lines.next().context("no token hash")?.to_owned(),
    );
    let principals = dir.path().join("principals.yaml");
    std::fs::write(
        &principals,
        format!("principals:\n- name: bench\n  tokens: [{hash}]\n  publish: ['*']\n  consume: ['*']\n  admin: true\n"),
    )?;
    let ca = std::fs::read(certs.join("ca.pem"))?;
    Ok(Material {
        _dir: dir,
        certs,
        principals,
        ca,
        token,
    })
}

/// The broker settings of `v` (environment overrides without the `FUTUREQ_` prefix).
fn broker_env(v: Variant, cluster: bool, m: &Material) -> Vec<(String, OsString)> {
    let mut env: Vec<(String, OsString)> = Vec::new();
    let file = |f: &str| m.certs.join(f).into_os_string();
    if v != Variant::Plaintext {
        env.push(("API_GRPC_TLS_CERTFILE".into(), file("node.pem")));
        env.push(("API_GRPC_TLS_KEYFILE".into(), file("node-key.pem")));
        if cluster {
            env.push(("CLUSTER_TLS_CERTFILE".into(), file("node.pem")));
            env.push(("CLUSTER_TLS_KEYFILE".into(), file("node-key.pem")));
            env.push(("CLUSTER_TLS_CAFILE".into(), file("ca.pem")));
        }
    }
    if v == Variant::TlsToken {
        env.push((
            "API_AUTH_PRINCIPALSFILE".into(),
            m.principals.clone().into_os_string(),
        ));
        if cluster {
            env.push(("CLUSTER_SECRET".into(), "bench-cluster-secret".into()));
        }
    }
    env
}

/// A cluster's settings on mutual TLS and TLS on the client plane (the nemesis' `--tls`).
pub(crate) fn tls_env(m: &Material) -> Vec<(String, OsString)> {
    broker_env(Variant::Tls, true, m)
}

/// How the bench connects to a TLS broker without a token.
pub(crate) fn tls_client(m: &Material) -> ClientSecurity {
    ClientSecurity {
        tls: tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&m.ca)),
        token: None,
    }
}

/// How the bench connects in `v`.
fn client(v: Variant, m: &Material) -> anyhow::Result<Option<ClientSecurity>> {
    Ok(match v {
        Variant::Plaintext => None,
        Variant::Tls => Some(tls_client(m)),
        Variant::TlsToken => Some(ClientSecurity {
            token: Some(format!("Bearer {}", m.token).parse()?),
            ..tls_client(m)
        }),
    })
}

/// One publish series of one variant in one round.
#[derive(Debug, Serialize)]
struct Sample {
    variant: Variant,
    mode: &'static str,
    round: usize,
    batch: usize,
    msgs_per_s: f64,
    p99_us: u64,
    cpu_us_per_msg: Option<f64>,
}

/// New connections of one variant in one round.
#[derive(Debug, Serialize)]
struct Connections {
    variant: Variant,
    mode: &'static str,
    round: usize,
    per_s: f64,
    /// Per broker CPU-second (every node of a cluster).
    per_cpu_s: Option<f64>,
    /// Attempts that failed (counted, not in `per_s`).
    failed: u64,
}

/// Runs every round and variant, standalone then on 3 nodes; writes `out/security.json` and
/// prints the tables.
pub(crate) async fn run(bin: &Path, rounds: usize, quick: bool, out: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(rounds > 0, "--rounds must be at least 1");
    let m = material(bin)?;
    let plan = Plan::new(quick, 100, 100);
    let connect_for = if quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(3)
    };
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let (mut samples, mut conns) = (Vec::new(), Vec::new());
    let measured = async {
        for cluster in [false, true] {
            for round in 1..=rounds {
                // Rotate the order: each variant runs first in some round.
                let mut order = VARIANTS;
                order.rotate_left((round - 1) % VARIANTS.len());
                for v in order {
                    measure_variant(
                        bin,
                        &m,
                        (v, cluster, round),
                        (&plan, connect_for),
                        (&mut samples, &mut conns),
                    )
                    .await?;
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    set_client_security(None);
    let path = out.join("security.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(
            &serde_json::json!({ "publish": samples, "connections": conns }),
        )?,
    )
    .with_context(|| format!("writing {}", path.display()))?;
    measured?;
    println!("{}", report(&samples, &conns));
    println!("samples: {}", path.display());
    Ok(())
}

async fn measure_variant(
    bin: &Path,
    m: &Material,
    (v, cluster, round): (Variant, bool, usize),
    (plan, connect_for): (&Plan, Duration),
    (samples, conns): (&mut Vec<Sample>, &mut Vec<Connections>),
) -> anyhow::Result<()> {
    set_client_security(client(v, m)?);
    let work = tempfile::tempdir()?;
    let env = broker_env(v, cluster, m);
    let (one, three) = if cluster {
        let c = Cluster::start_with(bin, work.path(), env)
            .await
            .with_context(|| format!("starting a {} cluster", v.name()))?;
        (None, Some(c))
    } else {
        let b = Broker::start(
            bin,
            "127.0.0.1",
            free_port()?,
            work.path().join("standalone"),
            env,
        )
        .await
        .with_context(|| format!("starting a {} broker", v.name()))?;
        (Some(b), None)
    };
    let target = match (&one, &three) {
        (Some(b), _) => Target::One(b),
        (_, Some(c)) => Target::Three(c),
        _ => unreachable!("one deployment was started"),
    };
    let mode = target.mode();
    for batch in [1, 100] {
        eprintln!(
            "security round {round}: {mode} {} QUORUM {batch}/request",
            v.name()
        );
        let (o, costs) = target
            .publish(&plan.publish(batch, Ack::Quorum, 3_600_000))
            .await?;
        samples.push(Sample {
            variant: v,
            mode,
            round,
            batch,
            msgs_per_s: o.msgs_per_s,
            p99_us: o.latency.value_at_quantile(0.99),
            cpu_us_per_msg: costs.cpu_us,
        });
    }
    eprintln!(
        "security round {round}: {mode} {} new connections",
        v.name()
    );
    let target = &target;
    let (n, failed, took, cpu) = target
        .on_leader(|addr| async move {
            // CPU counted around this attempt only (a retry on a new leader starts again).
            let before = target.cpu_seconds();
            let (n, failed, took) = new_connections(&addr, connect_for).await?;
            let cpu = match (before, target.cpu_seconds()) {
                (Some(b), Some(a)) if a > b => Some(a - b),
                _ => None,
            };
            anyhow::Ok((n, failed, took, cpu))
        })
        .await?;
    #[allow(clippy::cast_precision_loss)]
    conns.push(Connections {
        variant: v,
        mode,
        round,
        per_s: n as f64 / took.as_secs_f64(),
        per_cpu_s: cpu.map(|c| n as f64 / c),
        failed,
    });
    if let Some(b) = one {
        b.stop()?;
    }
    if let Some(c) = three {
        c.stop()?;
    }
    Ok(())
}

/// Four clients each opening connection after connection for `span`, one GetClusterInfo on
/// each (authenticated in the token variant): how many succeeded, how many failed, and how
/// long it took. A run where more failed than succeeded is an error.
async fn new_connections(addr: &str, span: Duration) -> anyhow::Result<(u64, u64, Duration)> {
    use futureq_bench::pb::future_q_cluster_client::FutureQClusterClient;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let addr = addr.to_owned();
        tasks.push(tokio::spawn(async move {
            let (mut n, mut failed) = (0u64, 0u64);
            while start.elapsed() < span {
                let ok = match connect(&addr).await {
                    Ok(ch) => FutureQClusterClient::new(ch)
                        .get_cluster_info(authed(futureq_bench::pb::ClusterInfoRequest {}))
                        .await
                        .is_ok(),
                    Err(_) => false,
                };
                if ok {
                    n += 1;
                } else {
                    failed += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            (n, failed)
        }));
    }
    let (mut total, mut failed) = (0, 0);
    for t in tasks {
        let (n, f) = t.await?;
        total += n;
        failed += f;
    }
    anyhow::ensure!(
        failed <= total,
        "{addr}: {failed} of {} new connections failed",
        total + failed
    );
    Ok((total, failed, start.elapsed()))
}

/// Per deployment and series: each variant's median [range] throughput, its ratio to
/// plaintext's median, median p99 and CPU per message; then the connection rates.
fn report(samples: &[Sample], conns: &[Connections]) -> String {
    let mut out = String::from(
        "| deployment | series | variant | msgs/s median [range] | ÷ plaintext | p99 ms | CPU µs/msg | CPU ÷ plaintext |\n|---|---|---|---|---|---|---|---|\n",
    );
    for mode in ["standalone", "cluster3"] {
        for batch in [1, 100] {
            let of = |v: Variant, f: fn(&Sample) -> f64| -> Vec<f64> {
                samples
                    .iter()
                    .filter(|s| s.mode == mode && s.batch == batch && s.variant == v)
                    .map(f)
                    .collect()
            };
            let rate = |s: &Sample| s.msgs_per_s;
            #[allow(clippy::cast_precision_loss)]
            let p99 = |s: &Sample| s.p99_us as f64 / 1000.0;
            let cpu = |s: &Sample| s.cpu_us_per_msg.unwrap_or(f64::NAN);
            let base = of(Variant::Plaintext, rate);
            if base.is_empty() {
                continue;
            }
            let (base_rate, base_cpu) = (spread(base).0, spread(of(Variant::Plaintext, cpu)).0);
            for v in VARIANTS {
                let (r, lo, hi) = spread(of(v, rate));
                let c = spread(of(v, cpu)).0;
                out.push_str(&format!(
                    "| {mode} | QUORUM {batch}/request | {} | {r:.0} [{lo:.0}–{hi:.0}] | {:.2}× | {:.2} | {c:.1} | {:.2}× |\n",
                    v.name(),
                    r / base_rate,
                    spread(of(v, p99)).0,
                    c / base_cpu,
                ));
            }
        }
    }
    out.push_str("\n| deployment | variant | new connections/s median [range] | per broker CPU-second |\n|---|---|---|---|\n");
    for mode in ["standalone", "cluster3"] {
        for v in VARIANTS {
            let of = |f: fn(&Connections) -> f64| -> Vec<f64> {
                conns
                    .iter()
                    .filter(|c| c.mode == mode && c.variant == v)
                    .map(f)
                    .collect()
            };
            let rates = of(|c| c.per_s);
            if rates.is_empty() {
                continue;
            }
            let (r, lo, hi) = spread(rates);
            let per_cpu = spread(of(|c| c.per_cpu_s.unwrap_or(f64::NAN))).0;
            out.push_str(&format!(
                "| {mode} | {} | {r:.0} [{lo:.0}–{hi:.0}] | {per_cpu:.0} |\n",
                v.name()
            ));
        }
    }
    out
}
