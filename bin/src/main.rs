//! `futureq`: the delayed-message broker.
//!
//! `futureq start [-c config.yaml]` runs the broker; `futureq leave --seed host:port` asks a
//! cluster to remove this node (clustered mode only). The client commands (`publish`,
//! `consume`, `cancel`, `reschedule`, `stats`, `peek`, `cluster info`) are in [`cli`].
//!
//! The broker lives in [`futureq_broker`]; this binary parses the command line, loads the
//! configuration, sets up logging and signals, and runs it.

/// jemalloc with its default decay: freed pages go back to the system some 10 s after, the
/// next time the allocator runs (it has no background thread), where glibc kept the arenas of a
/// fill's peak. Measured in docs/benchmarks.md (issue 29).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use futureq_broker::{config, Shutdown};

mod cli;

/// How long shutdown may take before the process gives up waiting.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(9);

#[derive(Parser)]
#[command(
    name = "futureq",
    version,
    about = "futureq: a clustered delayed-message broker"
)]
struct Cli {
    /// Configuration file (YAML, configVersion: 1). Without it: built-in defaults + FUTUREQ_* env.
    #[arg(short = 'c', long = "config", global = true)]
    config: Option<PathBuf>,
    #[command(flatten)]
    target: cli::Target,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker.
    Start {
        /// Cluster seed to join (repeatable); overrides cluster.joinSeeds.
        #[arg(long = "join")]
        join: Vec<String>,
    },
    /// Ask the cluster (via a seed) to remove this node.
    Leave {
        /// gRPC address of a cluster member.
        #[arg(long)]
        seed: String,
    },
    /// Make TLS material.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Make bearer tokens for a principals file (api.auth.principalsFile).
    #[command(subcommand)]
    Token(TokenCommand),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Write a development CA (ca.pem, ca-key.pem), a node certificate for both planes
    /// (node.pem, node-key.pem; localhost, 127.0.0.1, ::1 and each --host) and a client
    /// certificate per --client (NAME.pem, NAME-key.pem). For development only.
    Dev {
        /// Directory to write to (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Another DNS name or IP address of the nodes (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// A client certificate to make, named NAME (repeatable; default: dev-client).
        #[arg(long = "client", value_parser = client_name)]
        clients: Vec<String>,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a new random token and, on the next line, the SHA-256 hash a principals file lists.
    New,
    /// Print the SHA-256 hash of the token read from standard input.
    Hash,
}

/// A client certificate's name: it names its files too.
fn client_name(s: &str) -> Result<String, String> {
    if !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !s.starts_with('.')
        && !matches!(s, "ca" | "node")
    {
        Ok(s.to_owned())
    } else {
        Err("1 to 64 of A-Z a-z 0-9 - _ . (not starting with a dot; not ca or node, whose files these are)".into())
    }
}

fn certs(cmd: CertsCommand) -> anyhow::Result<()> {
    let CertsCommand::Dev {
        out,
        hosts,
        mut clients,
    } = cmd;
    if clients.is_empty() {
        clients.push("dev-client".into());
    }
    let written = futureq_broker::certs::write_dev(&out, &hosts, &clients)?;
    for f in written.files {
        println!("{}", f.display());
    }
    Ok(())
}

fn token(cmd: &TokenCommand) -> anyhow::Result<()> {
    use std::io::Read as _;
    match cmd {
        TokenCommand::New => {
            let token = futureq_broker::auth::new_token();
            println!("{token}\n{}", futureq_broker::auth::token_hash_hex(&token));
        }
        TokenCommand::Hash => {
            let mut t = String::new();
            std::io::stdin()
                .take(64 << 10)
                .read_to_string(&mut t)
                .context("reading the token from standard input")?;
            let t = t.trim();
            anyhow::ensure!(!t.is_empty(), "no token on standard input");
            println!("{}", futureq_broker::auth::token_hash_hex(t));
        }
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let purpose = match cli.cmd {
        Command::Start { .. } | Command::Leave { .. } => config::Purpose::Broker,
        _ => config::Purpose::Addresses,
    };
    let (_, settings) =
        match config::load_for(cli.config.as_deref(), &config::process_env(), purpose) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("futureq: invalid configuration: {e}");
                std::process::exit(2);
            }
        };
    // A client command reports its own errors on stderr, once; the log shows warnings only.
    let client = matches!(
        cli.cmd,
        Command::Client(_) | Command::Certs(_) | Command::Token(_)
    );
    init_tracing(
        if client { "warn" } else { &settings.log_level },
        settings.log_format,
    );
    for d in &settings.deprecated {
        tracing::warn!(target: "app", "configuration: {d}");
    }
    let result = match cli.cmd {
        Command::Start { join } => {
            let mut settings = settings;
            match (&mut settings.cluster, join.is_empty()) {
                (_, true) => start(settings),
                (Some(c), false) => {
                    c.join_seeds = join;
                    start(settings)
                }
                (None, false) => Err(anyhow::anyhow!(
                    "--join needs a clustered node (cluster.enabled: true)"
                )),
            }
        }
        Command::Leave { seed } => leave(&settings, &seed),
        Command::Certs(c) => certs(c),
        Command::Token(t) => token(&t),
        Command::Client(c) => {
            let server = cli
                .target
                .server
                .clone()
                .unwrap_or_else(|| cli::default_server(&settings));
            cli::run(&cli.target, server, c)
        }
    };
    if let Err(e) = result {
        let status = e
            .downcast_ref::<futureq_broker::ServerError>()
            .map_or(1, futureq_broker::ServerError::exit_status);
        let e = report(&e);
        if !client {
            tracing::error!(target: "app", "{e}");
        }
        eprintln!("futureq: {e}");
        std::process::exit(status);
    }
}

/// The error and its causes on one line, each cause once (some errors already name their
/// cause in their own message).
fn report(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

fn init_tracing(level: &str, format: config::LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // openraft logs every vote at info and every failed heartbeat to a down peer at warn.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},openraft=error")));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        config::LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).init(),
        config::LogFormat::Json => fmt.json().init(),
    }
}

/// Installs SIGTERM/SIGINT handling: the first signal starts a graceful shutdown (bounded by
/// [`SHUTDOWN_DEADLINE`]); a second one exits at once. SIGHUP re-reads the certificates and
/// the principals file (a bad file keeps what is in use).
fn install_signals(
    shutdown: Shutdown,
    security: std::sync::Arc<futureq_broker::security::Security>,
) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .context("installing signal handlers")?;
    std::thread::Builder::new().name("futureq-signals".into()).spawn(move || {
        let mut first = true;
        for sig in signals.forever() {
            if sig == SIGHUP {
                tracing::info!(target: "app", "SIGHUP: reloading the certificates and principals");
                let _ = security.reload(); // logged and counted there
            } else if first {
                first = false;
                tracing::info!(target: "app", signal = sig, "shutting down");
                shutdown.trigger();
                std::thread::spawn(|| {
                    std::thread::sleep(SHUTDOWN_DEADLINE);
                    tracing::error!(target: "app", "graceful shutdown did not finish in time; exiting");
                    std::process::exit(1);
                });
            } else {
                tracing::warn!(target: "app", signal = sig, "second signal: exiting now");
                std::process::exit(130);
            }
        }
    })?;
    Ok(())
}

/// `futureq start`: runs the broker until SIGTERM or SIGINT.
fn start(settings: config::Settings) -> anyhow::Result<()> {
    tracing::info!(
        target: "app",
        version = env!("CARGO_PKG_VERSION"),
        mode = if settings.cluster.is_some() { "cluster" } else { "standalone" },
        "futureq starting"
    );
    let shutdown = Shutdown::new();
    install_signals(shutdown.clone(), std::sync::Arc::clone(&settings.security))?;
    Ok(futureq_broker::run(settings, shutdown)?)
}

/// `futureq leave --seed`: removes this node from its cluster.
fn leave(settings: &config::Settings, seed: &str) -> anyhow::Result<()> {
    futureq_broker::admin::leave(settings, seed)?;
    if let Some(c) = &settings.cluster {
        println!(
            "node {} left the cluster; its Raft data ({}) may be deleted",
            c.node_id,
            c.data_dir.display()
        );
    }
    Ok(())
}
