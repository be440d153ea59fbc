//! `futureq`: the delayed-message broker.
//!
//! `futureq start [-c config.yaml]` runs the broker; `futureq leave --seed host:port` asks a
//! cluster to remove this node (clustered mode only). The client commands (`publish`,
//! `consume`, `cancel`, `reschedule`, `stats`, `peek`, `cluster info`) are in [`cli`].
//!
//! The broker lives in [`futureq_broker`]; this binary parses the command line, loads the
//! configuration, sets up logging and signals, and runs it.

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
    #[command(flatten)]
    Client(cli::ClientCommand),
}

fn main() {
    let cli = Cli::parse();
    let (_, settings) = match config::load(cli.config.as_deref(), &config::process_env()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("futureq: invalid configuration: {e}");
            std::process::exit(2);
        }
    };
    // A client command reports its own errors on stderr, once; the log shows warnings only.
    let client = matches!(cli.cmd, Command::Client(_));
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
/// [`SHUTDOWN_DEADLINE`]); a second one exits at once.
fn install_signals(shutdown: Shutdown) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .context("installing signal handlers")?;
    std::thread::Builder::new().name("futureq-signals".into()).spawn(move || {
        let mut first = true;
        for sig in signals.forever() {
            if first {
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
    install_signals(shutdown.clone())?;
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
