//! The broker process: one glommio executor per core, started and stopped together.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futureq_core::hub::HubConfig;
use futureq_net::grpc::ServerConfig;
use futureq_net::http::HttpResponse;
use futureq_net::Shutdown;
use futureq_storage::{StoreMode, StoreService};
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement, PoolPlacement};

use crate::api::Ctx;
use crate::config::Settings;
use crate::dispatcher::{DispatcherConfig, HubCmd, HUB_QUEUE_MAX};
use crate::exit::{Exit, Ready, ServerError, StoppedGuard};
use crate::fatal::FatalReporter;
use crate::mailbox::Mailbox;
use crate::metrics::Metrics;
use crate::replication::{Replication, WriteReq};
use crate::task::{spawn_owned, Owned};
use crate::{api, cluster, dispatcher, local, runtime};

/// `/metrics`, and `/healthz`: 200 once the write path is open and until shutdown.
fn metrics_handler(
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
    writes_open: Shutdown,
) -> futureq_net::http::HttpHandler {
    Rc::new(move |path: &str| match path {
        "/metrics" => HttpResponse {
            status: 200,
            content_type: "text/plain; version=0.0.4",
            body: metrics.render(),
        },
        "/healthz" if !shutdown.is_triggered() && writes_open.is_triggered() => HttpResponse {
            status: 200,
            content_type: "text/plain",
            body: "ok\n".into(),
        },
        "/healthz" if !shutdown.is_triggered() => HttpResponse {
            status: 503,
            content_type: "text/plain",
            body: "starting: the write path is not open yet\n".into(),
        },
        "/healthz" => HttpResponse {
            status: 503,
            content_type: "text/plain",
            body: "shutting down\n".into(),
        },
        _ => HttpResponse {
            status: 404,
            content_type: "text/plain",
            body: "not found\n".into(),
        },
    })
}

/// Runs the broker until `shutdown` fires and every executor stopped: opens the store,
/// starts one executor per core (its gRPC listener; on core 0 the dispatcher, TTL sweeper
/// and metrics; on `runtime.raftCore` the write path: the Raft groups or the journal).
///
/// # Errors
/// A start-up failure ([`ServerError`]). Once serving, a failed write path
/// ([`ServerError::WritePathFailed`]) returns at once, with the shutdown started but the
/// executors possibly still winding down: the caller should exit (a restart recovers from
/// what is durable). Other failures are logged.
pub fn run(settings: Settings, shutdown: Shutdown) -> Result<(), ServerError> {
    let reflection = Arc::new(api::reflection_index()?);
    let settings = Arc::new(settings);
    let cpus = runtime::allowed_cpus();
    let (cores, write_core) = executors(&settings, cpus.len())?;
    preflight(&settings, cores)?;
    let mode = store_mode(&settings)?;
    // Writes reach redb through a log either way: the Raft log in a cluster, the local
    // journal standalone (both apply with the same code).
    let (store, store_threads) =
        StoreService::start(&mode).map_err(|source| ServerError::Storage {
            place: match &mode {
                StoreMode::Disk(dir, _) => dir.display().to_string(),
                StoreMode::Memory => "memory".into(),
            },
            source,
        })?;
    let disk = watch_disk(&settings, &mode, &shutdown)?;
    let metrics = Arc::new(Metrics::new(crate::metrics::Scraped {
        store_digest: store.store().digest_cell(),
        disk: disk.as_ref().map(|(d, _)| Arc::clone(d)),
        security: Some(Arc::clone(&settings.security)),
    }));
    let (exits, exit_rx) = std::sync::mpsc::channel::<Exit>();
    let handles = spawn_executors(
        Shared {
            settings: Arc::clone(&settings),
            store: store.clone(),
            metrics,
            reflection,
            disk: disk.as_ref().map(|(d, _)| Arc::clone(d)),
            shutdown: shutdown.clone(),
        },
        (&cpus, cores, write_core),
        exits,
    )?;
    let handles = wait_started(&exit_rx, handles, cores, &shutdown)?;
    log_serving(&settings, &mode, cores);
    let lost = wait_stopped(&exit_rx, cores, &shutdown)?;
    for h in handles {
        if let Err(e) = h.join() {
            tracing::error!(target: "app", error = %e, "executor failed");
        }
    }
    drop(store);
    store_threads.join();
    if let Some((_, thread)) = disk {
        let _ = thread.join();
    }
    tracing::info!(target: "app", "stopped");
    if lost {
        return Err(ServerError::ExecutorLost);
    }
    Ok(())
}

/// How many executors run, and which one is the write core (the Raft groups, or the journal
/// standalone): by default the last one, apart from the dispatcher's core 0 (measured
/// standalone at 1 message/request on 2 executors: 5 of 6 alternating runs faster, median
/// +8%).
fn executors(settings: &Settings, cpus: usize) -> Result<(usize, usize), ServerError> {
    let cores = if settings.cores == 0 {
        cpus
    } else {
        settings.cores as usize
    };
    let write_core = match settings.raft_core {
        None => cores.saturating_sub(1),
        Some(c) if (c as usize) < cores => c as usize,
        Some(raft_core) => return Err(ServerError::RaftCore { raft_core, cores }),
    };
    Ok((cores, write_core))
}

/// What is checked before anything starts: the locked-memory limit the executors need, and
/// that no other process serves our ports. The executors' listeners share their ports
/// (SO_REUSEPORT), which would also let them join a port another broker serves: clients
/// would be split between two stores.
fn preflight(settings: &Settings, cores: usize) -> Result<(), ServerError> {
    if settings.security.auth.is_none() && !settings.grpc_listen.ip().is_loopback() {
        tracing::warn!(target: "app", listen = %settings.grpc_listen, "api.grpc.listen is not a loopback address and api.auth.principalsFile is unset: anyone who reaches the port may publish, consume, cancel and peek on every topic");
    }
    let memlock = runtime::raise_memlock(cores)?;
    tracing::debug!(target: "app", memlock, cores, "runtime limits");
    let mut exclusive = vec![("api.grpc.listen", settings.grpc_listen)];
    exclusive.extend(
        settings
            .metrics_listen
            .map(|a| ("observability.metrics.listen", a)),
    );
    exclusive.extend(
        settings
            .cluster
            .as_ref()
            .map(|c| ("cluster.raft.listen", c.raft_listen)),
    );
    for (key, addr) in exclusive {
        runtime::check_port_free(key, addr)?;
    }
    Ok(())
}

/// Where the store lives; refused when the directory holds a store of another kind (a
/// standalone broker's for a cluster node, or a write-ahead log of before the journal).
fn store_mode(settings: &Settings) -> Result<StoreMode, ServerError> {
    if settings.memory_storage {
        return Ok(StoreMode::Memory);
    }
    let dir = &settings.data_dir;
    let journal = dir.join(local::JOURNAL_DIR);
    if settings.cluster.is_some() && journal.exists() {
        return Err(ServerError::StandaloneStore {
            dir: dir.clone(),
            journal,
        });
    }
    let wal = dir.join("futureq.wal");
    if wal.exists() {
        return Err(ServerError::OldWal { path: wal });
    }
    Ok(StoreMode::Disk(dir.clone(), settings.cache_bytes))
}

/// The data disks' free space and the thread that reads it.
type DiskWatch = (Arc<crate::disk::DiskSpace>, std::thread::JoinHandle<()>);

/// The data disks' free space, watched by a thread (on disk storage): below
/// `storage.minFreeBytes` publishes are refused.
fn watch_disk(
    settings: &Settings,
    mode: &StoreMode,
    shutdown: &Shutdown,
) -> Result<Option<DiskWatch>, ServerError> {
    let StoreMode::Disk(dir, _) = mode else {
        return Ok(None);
    };
    let space = Arc::new(crate::disk::DiskSpace::new(settings.min_free_bytes));
    let mut dirs = vec![dir.clone()];
    dirs.extend(settings.cluster.as_ref().map(|c| c.data_dir.clone()));
    let thread = crate::disk::watch(Arc::clone(&space), dirs, shutdown.clone())
        .map_err(ServerError::Thread)?;
    Ok(Some((space, thread)))
}

/// What every executor shares, built once by [`run`].
struct Shared {
    settings: Arc<Settings>,
    store: StoreService,
    metrics: Arc<Metrics>,
    reflection: Arc<futureq_net::reflection::Reflection>,
    disk: Option<Arc<crate::disk::DiskSpace>>,
    shutdown: Shutdown,
}

/// Starts one executor per core, pinned to `cpus` in turn: the write requests' queue goes to
/// the write core, the dispatcher's to core 0. On a failure the ones started are stopped.
fn spawn_executors(
    shared: Shared,
    (cpus, cores, write_core): (&[usize], usize, usize),
    exits: std::sync::mpsc::Sender<Exit>,
) -> Result<Vec<glommio::ExecutorJoinHandle<()>>, ServerError> {
    let Shared {
        settings,
        store,
        metrics,
        reflection,
        disk,
        shutdown,
    } = shared;
    // The dispatcher runs on core 0.
    let (hub_tx, hub_rx) =
        Mailbox::<HubCmd>::bounded(HUB_QUEUE_MAX, 0, Arc::clone(&metrics.executors.hub_crossed));
    let mut hub_rx = Some(hub_rx);
    // Every write request goes to one core: the Raft core in a cluster, the journal
    // standalone (`runtime.raftCore` either way).
    let (writes, write_rx) = Mailbox::bounded(
        crate::replication::WRITES_QUEUE_MAX,
        write_core,
        Arc::clone(&metrics.executors.writes_crossed),
    );
    let repl = match settings.cluster {
        Some(_) => Replication::clustered(writes),
        None => Replication::standalone(settings.node_id, &settings.grpc_advertise, writes),
    };
    let mut write_rx = Some(write_rx);
    let (dispatcher_done, writes_open) = (Shutdown::new(), Shutdown::new());
    let fatal = {
        let exits = exits.clone();
        FatalReporter::new(
            move |what, reason: &str| {
                let _ = exits.send(Exit::Failed(ServerError::WritePathFailed {
                    what,
                    reason: reason.to_owned(),
                }));
            },
            shutdown.clone(),
        )
    };
    let publish_budget = crate::budget::Budget::new(
        crate::budget::IN_SERVICE_BYTES_MAX,
        settings.max_queue_delay,
        Arc::clone(&metrics),
    );
    let mut handles = Vec::new();
    for core in 0..cores {
        let cpu = cpus[core % cpus.len()];
        let parts = CtxParts {
            settings: Arc::clone(&settings),
            store: store.clone(),
            hub: hub_tx.clone(),
            metrics: Arc::clone(&metrics),
            shutdown: shutdown.clone(),
            repl: Arc::clone(&repl),
            write_requests: if core == write_core {
                write_rx.take()
            } else {
                None
            },
            dispatcher_done: dispatcher_done.clone(),
            writes_open: writes_open.clone(),
            fatal: fatal.clone(),
            stopped: StoppedGuard(exits.clone()),
            publish_budget: Arc::clone(&publish_budget),
            reflection: Arc::clone(&reflection),
            disk: disk.clone(),
        };
        let hub_rx = if core == 0 { hub_rx.take() } else { None };
        let ready = Ready(exits.clone());
        let spawned = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("futureq-core{core}"))
            .io_memory(runtime::IO_MEMORY_PER_EXECUTOR)
            .preempt_timer(runtime::PREEMPT_PERIOD)
            // Work handed off the reactor (Raft apply, snapshot builds, sweeps) must not queue
            // behind one long job: a snapshot build stalled every apply for seconds.
            .blocking_thread_pool_placement(PoolPlacement::Unbound(runtime::BLOCKING_THREADS))
            .spawn(move || async move { core_main(core, parts, hub_rx, ready).await });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                let e = ServerError::Executor {
                    core,
                    cpu,
                    reason: e.to_string(),
                };
                return Err(stop_all(&shutdown, handles, e));
            }
        }
    }
    Ok(handles)
}

/// Waits until every executor reported that it serves; the first failure stops them all.
fn wait_started(
    exit_rx: &std::sync::mpsc::Receiver<Exit>,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
    cores: usize,
    shutdown: &Shutdown,
) -> Result<Vec<glommio::ExecutorJoinHandle<()>>, ServerError> {
    let mut started = 0;
    while started < cores {
        match exit_rx.recv() {
            Ok(Exit::Ready(Ok(()))) => started += 1,
            Ok(Exit::Ready(Err(e))) => return Err(stop_all(shutdown, handles, e)),
            // The reporter started the shutdown; the caller exits.
            Ok(Exit::Failed(e)) => return Err(e),
            // An executor ended (a panic) before it reported.
            Ok(Exit::Stopped) | Err(_) => {
                return Err(stop_all(shutdown, handles, ServerError::ExecutorLost))
            }
        }
    }
    Ok(handles)
}

fn log_serving(settings: &Settings, mode: &StoreMode, cores: usize) {
    tracing::info!(
        target: "app",
        grpc = %settings.grpc_listen,
        metrics = %settings
            .metrics_listen
            .map_or_else(|| "off".to_owned(), |a| a.to_string()),
        storage = %match mode {
            StoreMode::Disk(dir, cache) => format!("{} (cache {} MiB)", dir.display(), cache >> 20),
            StoreMode::Memory => "in memory".to_owned(),
        },
        cores,
        mode = if settings.cluster.is_some() { "clustered" } else { "standalone" },
        "futureq serving"
    );
}

/// Waits until every executor stopped: whether one stopped before the shutdown began (a
/// panic), which takes the others down rather than leave a broker that serves half.
///
/// # Errors
/// A failed write path, reported while stopping.
fn wait_stopped(
    exit_rx: &std::sync::mpsc::Receiver<Exit>,
    cores: usize,
    shutdown: &Shutdown,
) -> Result<bool, ServerError> {
    let (mut stopped, mut lost) = (0, false);
    while stopped < cores {
        match exit_rx.recv() {
            Ok(Exit::Stopped) => {
                stopped += 1;
                if !shutdown.is_triggered() {
                    tracing::error!(target: "app", "an executor stopped unexpectedly: shutting down");
                    lost = true;
                    shutdown.trigger();
                }
            }
            Ok(Exit::Failed(e)) => return Err(e),
            Ok(Exit::Ready(_)) => {}
            Err(_) => break,
        }
    }
    Ok(lost)
}

/// A failed start: stops the executors started so far and waits for them; `e` is the error.
fn stop_all(
    shutdown: &Shutdown,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
    e: ServerError,
) -> ServerError {
    shutdown.trigger();
    for h in handles {
        let _ = h.join();
    }
    e
}

/// Waits until the write path opened (true) or shutdown came first (false).
async fn opened(writes_open: Shutdown, shutdown: Shutdown) -> bool {
    futures_lite::future::or(writes_open.wait(), shutdown.wait()).await;
    writes_open.is_triggered()
}

/// What each executor starts with.
struct CtxParts {
    settings: Arc<Settings>,
    store: StoreService,
    hub: Mailbox<HubCmd>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
    repl: Arc<Replication>,
    /// The write requests' queue (on the Raft core only): the Raft core's or the journal's.
    write_requests: Option<flume::Receiver<WriteReq>>,
    /// Fires when the dispatcher stopped (its last deletes are through).
    dispatcher_done: Shutdown,
    /// Fires when the write path is open: the journal replayed (standalone), the Raft groups
    /// started (clustered).
    writes_open: Shutdown,
    /// Where the write core reports a failed log.
    fatal: FatalReporter,
    /// Reports the executor's end to [`run`]'s thread when dropped.
    stopped: StoppedGuard,
    /// The node's budget of publish bytes in service.
    publish_budget: Arc<crate::budget::Budget>,
    /// Server reflection's index of the API descriptors (built once).
    reflection: Arc<futureq_net::reflection::Reflection>,
    /// The data disk's free space (`None`: memory storage).
    disk: Option<Arc<crate::disk::DiskSpace>>,
}

/// One executor: its gRPC listener; on the write core (`runtime.raftCore`) the write path (the
/// journal, or the Raft groups); on core 0 the dispatcher, the TTL sweeper and the metrics
/// listener. Reports to [`run`]'s thread once serving, or why it could not start.
async fn core_main(
    core: usize,
    mut parts: CtxParts,
    hub_rx: Option<flume::Receiver<HubCmd>>,
    ready: Ready,
) {
    crate::mailbox::set_current_core(core);
    parts.metrics.executors.register_current(core);
    let write_requests = parts.write_requests.take();
    let started = async {
        let awake = runtime::keep_awake()?;
        let listener = bind("api.grpc.listen", parts.settings.grpc_listen)?;
        let mut background = Vec::new();
        if let Some(rx) = write_requests {
            background.push(start_write_path(&parts, rx).await?);
        }
        if let Some(rx) = hub_rx {
            background.extend(start_dispatcher(&parts, rx)?);
        }
        Ok::<_, ServerError>((awake, listener, background))
    };
    match started.await {
        Ok((_awake, listener, background)) => {
            let clustered = parts.settings.cluster.is_some();
            let serve = serve_clients(core, parts, listener, background, ready);
            if clustered {
                runtime::Queue::Clients.spawn(serve).await;
            } else {
                serve.await;
            }
        }
        Err(e) => ready.send(Err(e)),
    }
}

/// A listener on `addr` (`key` names it in the error).
fn bind(key: &'static str, addr: std::net::SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr).map_err(|e| ServerError::Listen {
        key,
        addr,
        reason: e.to_string(),
    })
}

/// Opens the write path on the write core and starts serving its requests: the journal
/// standalone (replayed before this returns), the Raft groups in a cluster.
async fn start_write_path(
    parts: &CtxParts,
    rx: flume::Receiver<WriteReq>,
) -> Result<Owned<()>, ServerError> {
    let task = match &parts.settings.cluster {
        None => start_journal(parts, rx).await?,
        Some(cfg) => start_raft(parts, cfg, rx).await?,
    };
    parts.writes_open.trigger();
    Ok(task)
}

/// The standalone write core: the journal, replayed before this returns.
async fn start_journal(
    parts: &CtxParts,
    rx: flume::Receiver<WriteReq>,
) -> Result<Owned<()>, ServerError> {
    let settings = &parts.settings;
    let (opened, open_rx) = futures::channel::oneshot::channel();
    let data_dir = (!settings.memory_storage).then(|| settings.data_dir.clone());
    let task = spawn_owned(local::serve(
        data_dir,
        parts.store.store().clone(),
        Box::new(dispatcher::applied_to_hub(parts.hub.clone())),
        rx,
        (parts.dispatcher_done.clone(), parts.shutdown.clone()),
        parts.fatal.clone(),
        move |r| {
            let _ = opened.send(r);
        },
    ));
    match open_rx.await {
        Ok(Ok(())) => Ok(task),
        Ok(Err(e)) => Err(ServerError::Journal(e)),
        Err(_) => Err(ServerError::Journal(local::OpenError::Stopped)),
    }
}

/// The clustered write core: this node's Raft groups, started.
async fn start_raft(
    parts: &CtxParts,
    cfg: &crate::config::ClusterSettings,
    rx: flume::Receiver<WriteReq>,
) -> Result<Owned<()>, ServerError> {
    let settings = &parts.settings;
    let start = {
        let (cfg, advertise) = (cfg.clone(), settings.grpc_advertise.clone());
        let store = parts.store.store().clone();
        let on_applied = Rc::new(dispatcher::applied_to_hub(parts.hub.clone()));
        async move { cluster::start(&cfg, &advertise, store, on_applied).await }
    };
    // The Raft groups' tasks are spawned from their start (or by their tasks), so all of them
    // run there; their peer links' connections too, whoever opens them (`in_current_queue`).
    let node = runtime::Queue::Raft
        .spawn(start)
        .await
        .unwrap_or_else(|| {
            Err(cluster::StartError::Failed(
                "the executor stopped while the Raft groups started".into(),
            ))
        })
        .map_err(|e| match e {
            cluster::StartError::Failed(reason) => ServerError::WritePathFailed {
                what: "a Raft group",
                reason,
            },
            e => ServerError::Cluster(e),
        })?;
    Ok(spawn_owned(cluster::serve(
        node,
        cfg.clone(),
        settings.grpc_advertise.clone(),
        Arc::clone(&parts.repl),
        rx,
        parts.store.store().clone(),
        parts.shutdown.clone(),
        parts.dispatcher_done.clone(),
        Arc::clone(&parts.metrics),
        parts.fatal.clone(),
    )))
}

/// Core 0's roles: the metrics listener and the per-topic gauges, the TTL sweeper and the
/// dispatcher. The sweeper, the gauges and the dispatcher read the store only once the write
/// path replayed what it holds (on another core when `runtime.raftCore` is not 0): a delete
/// still in the journal would otherwise let an acknowledged message be delivered again; a
/// shutdown before the write path opened runs none of them.
fn start_dispatcher(
    parts: &CtxParts,
    rx: flume::Receiver<HubCmd>,
) -> Result<Vec<Owned<()>>, ServerError> {
    let settings = &parts.settings;
    let once_open = |work: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>| {
        let open = opened(parts.writes_open.clone(), parts.shutdown.clone());
        spawn_owned(async move {
            if open.await {
                work.await;
            }
        })
    };
    let mut tasks = Vec::new();
    if let Some(addr) = settings.metrics_listen {
        let listener = bind("observability.metrics.listen", addr)?;
        let h = metrics_handler(
            Arc::clone(&parts.metrics),
            parts.shutdown.clone(),
            parts.writes_open.clone(),
        );
        tasks.push(spawn_owned(futureq_net::http::serve(
            listener,
            h,
            parts.shutdown.clone(),
        )));
        tasks.push(once_open(Box::pin(dispatcher::refresh_topic_gauges(
            settings.metrics_topics_interval,
            parts.store.clone(),
            parts.hub.clone(),
            Arc::clone(&parts.metrics),
            parts.shutdown.clone(),
        ))));
    }
    tasks.push(once_open(Box::pin(dispatcher::sweep_ttl(
        settings.ttl_sweep_interval,
        parts.store.clone(),
        Arc::clone(&parts.repl),
        Arc::clone(&parts.metrics),
        parts.shutdown.clone(),
        settings.proposal_timeout,
    ))));
    let run = dispatcher::run(
        dispatcher_config(settings),
        rx,
        parts.hub.clone(),
        parts.store.clone(),
        parts.repl.writes().clone(),
        Arc::clone(&parts.metrics),
        parts.shutdown.clone(),
    );
    // Its end releases the write core's stop (its last deletes are through), also when the
    // write path never opened and it never ran.
    let (open, done) = (
        opened(parts.writes_open.clone(), parts.shutdown.clone()),
        parts.dispatcher_done.clone(),
    );
    tasks.push(spawn_owned(async move {
        if open.await {
            run.await;
        }
        done.trigger();
    }));
    Ok(tasks)
}

/// The dispatcher's settings.
fn dispatcher_config(settings: &Settings) -> DispatcherConfig {
    DispatcherConfig {
        hub: HubConfig {
            in_flight_timeout_ms: i64::try_from(settings.in_flight_timeout.as_millis())
                .unwrap_or(i64::MAX),
            bucket_ms: settings.time_bucket_ms,
            scan_limit: settings.scan_max_keys,
            lookahead_ms: i64::try_from(settings.read_ahead.as_millis()).unwrap_or(i64::MAX),
            max_attempts: settings.max_attempts,
        },
        delete_interval: settings.delete_batch_interval,
        node_id: settings
            .cluster
            .as_ref()
            .map_or(settings.node_id, |c| c.node_id),
        delete_timeout: settings.proposal_timeout,
    }
}

/// Every executor's role: serves the gRPC API on `listener` until shutdown, then lets the
/// streams and the `background` tasks finish.
async fn serve_clients(
    core: usize,
    parts: CtxParts,
    listener: TcpListener,
    background: Vec<Owned<()>>,
    ready: Ready,
) {
    let CtxParts {
        settings,
        store,
        hub,
        metrics,
        shutdown,
        repl,
        write_requests: _,
        dispatcher_done: _,
        writes_open,
        fatal: _,
        stopped: _stopped,
        publish_budget,
        reflection,
        disk,
    } = parts;
    let server_cfg = ServerConfig {
        max_recv_message_len: settings.max_recv_message_len,
        max_send_message_len: settings.max_send_message_len,
        max_concurrent_streams: settings.max_concurrent_streams,
        keepalive_timeout: settings.keepalive_timeout,
        handshake_timeout: settings.handshake_timeout,
        cluster_tls: settings.cluster.as_ref().and_then(|c| c.tls.clone()),
        ..ServerConfig::default()
    };
    let ctx = Rc::new(Ctx {
        settings,
        store,
        hub,
        publish_budget,
        reflection,
        metrics,
        shutdown: shutdown.clone(),
        repl,
        writes_open,
        disk,
    });
    ready.send(Ok(()));
    tracing::debug!(target: "app", core, "executor serving");
    futureq_net::grpc::serve(
        listener,
        api::handler(Rc::clone(&ctx)),
        server_cfg,
        shutdown,
        ctx.settings.security.grpc_tls.clone(),
    )
    .await;
    // Let streams finish (they end themselves on shutdown), then stop the background tasks.
    for task in background {
        task.await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while Rc::strong_count(&ctx) > 1 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
}
