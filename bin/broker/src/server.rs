//! The broker process: one glommio executor per core, started and stopped together.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futureq_core::hub::HubConfig;
use futureq_net::grpc::ServerConfig;
use futureq_net::http::HttpResponse;
use futureq_net::Shutdown;
use futureq_storage::{StoreMode, StoreService};
use glommio::{LocalExecutorBuilder, Placement, PoolPlacement};

use crate::api::Ctx;
use crate::config::Settings;
use crate::dispatcher::{DispatcherConfig, HubCmd, HUB_QUEUE_MAX};
use crate::exit::{Exit, Ready, ServerError, StoppedGuard};
use crate::fatal::FatalReporter;
use crate::metrics::Metrics;
use crate::replication::{Replication, WriteReq};
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
    let cores = if settings.cores == 0 {
        cpus.len()
    } else {
        settings.cores as usize
    };
    // The write core (the Raft groups, or the journal standalone) must be an executor; by
    // default the last one, apart from the dispatcher's core 0 (measured standalone at 1
    // message/request on 2 executors: 5 of 6 alternating runs faster, median +8%).
    let write_core = match settings.raft_core {
        None => cores.saturating_sub(1),
        Some(c) if (c as usize) < cores => c as usize,
        Some(raft_core) => return Err(ServerError::RaftCore { raft_core, cores }),
    };
    if settings.security.auth.is_none() && !settings.grpc_listen.ip().is_loopback() {
        tracing::warn!(target: "app", listen = %settings.grpc_listen, "api.grpc.listen is not a loopback address and api.auth.principalsFile is unset: anyone who reaches the port may publish, consume, cancel and peek on every topic");
    }
    let memlock = runtime::raise_memlock(cores)?;
    tracing::debug!(target: "app", memlock, cores, "runtime limits");
    // The executors' listeners share their ports (SO_REUSEPORT), which would also let them
    // join a port another broker serves: clients would be split between two stores.
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

    let (hub_tx, hub_rx) = flume::bounded::<HubCmd>(HUB_QUEUE_MAX);
    let mode = if settings.memory_storage {
        StoreMode::Memory
    } else {
        StoreMode::Disk(settings.data_dir.clone(), settings.cache_bytes)
    };
    if let (StoreMode::Disk(dir, _), Some(_)) = (&mode, &settings.cluster) {
        let journal = dir.join(local::JOURNAL_DIR);
        if journal.exists() {
            return Err(ServerError::StandaloneStore {
                dir: dir.clone(),
                journal,
            });
        }
    }
    if let StoreMode::Disk(dir, _) = &mode {
        let wal = dir.join("futureq.wal");
        if wal.exists() {
            return Err(ServerError::OldWal { path: wal });
        }
    }
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
    // Every write request goes to one core: the Raft core in a cluster, the journal
    // standalone (`runtime.raftCore` either way).
    let (repl, write_rx) = match settings.cluster {
        Some(_) => Replication::clustered(),
        None => Replication::standalone(settings.node_id, &settings.grpc_advertise),
    };
    let mut write_requests = Some(write_rx);
    let dispatcher_done = Shutdown::new();
    let writes_open = Shutdown::new();
    // The data disk's free space (on disk storage): below storage.minFreeBytes publishes
    // are refused.
    let disk = match &mode {
        StoreMode::Disk(dir, _) => {
            let space = Arc::new(crate::disk::DiskSpace::new(settings.min_free_bytes));
            let mut dirs = vec![dir.clone()];
            dirs.extend(settings.cluster.as_ref().map(|c| c.data_dir.clone()));
            let thread = crate::disk::watch(Arc::clone(&space), dirs, shutdown.clone())
                .map_err(ServerError::Thread)?;
            Some((space, thread))
        }
        StoreMode::Memory => None,
    };
    let metrics = Arc::new(Metrics {
        store_digest: store.store().digest_cell(),
        disk: disk.as_ref().map(|(d, _)| Arc::clone(d)),
        security: Some(Arc::clone(&settings.security)),
        ..Metrics::default()
    });

    let (exits, exit_rx) = std::sync::mpsc::channel::<Exit>();
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
    let mut handles = Vec::new();
    let mut hub_rx = Some(hub_rx);
    let publish_budget =
        crate::budget::Budget::new(crate::budget::IN_SERVICE_BYTES_MAX, Arc::clone(&metrics));
    for core in 0..cores {
        let cpu = cpus[core % cpus.len()];
        let ctx_parts = CtxParts {
            settings: Arc::clone(&settings),
            store: store.clone(),
            hub: hub_tx.clone(),
            metrics: Arc::clone(&metrics),
            shutdown: shutdown.clone(),
            repl: Arc::clone(&repl),
            write_requests: if core == write_core {
                write_requests.take()
            } else {
                None
            },
            dispatcher_done: dispatcher_done.clone(),
            writes_open: writes_open.clone(),
            fatal: fatal.clone(),
            stopped: StoppedGuard(exits.clone()),
            publish_budget: Arc::clone(&publish_budget),
            reflection: Arc::clone(&reflection),
            disk: disk.as_ref().map(|(d, _)| Arc::clone(d)),
        };
        let hub_rx = if core == 0 { hub_rx.take() } else { None };
        let ready = Ready(exits.clone());
        let spawned = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("futureq-core{core}"))
            .io_memory(runtime::IO_MEMORY_PER_EXECUTOR)
            // Work handed off the reactor (Raft apply, snapshot builds, sweeps) must not queue
            // behind one long job: a snapshot build stalled every apply for seconds.
            .blocking_thread_pool_placement(PoolPlacement::Unbound(runtime::BLOCKING_THREADS))
            .spawn(move || async move { core_main(core, ctx_parts, hub_rx, ready).await });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                return Err(stop_all(
                    &shutdown,
                    handles,
                    ServerError::Executor {
                        core,
                        cpu,
                        reason: e.to_string(),
                    },
                ))
            }
        }
    }
    drop(hub_tx);
    drop((exits, fatal));
    let mut started = 0;
    while started < cores {
        match exit_rx.recv() {
            Ok(Exit::Ready(Ok(()))) => started += 1,
            Ok(Exit::Ready(Err(e))) => return Err(stop_all(&shutdown, handles, e)),
            // The reporter started the shutdown; the caller exits.
            Ok(Exit::Failed(e)) => return Err(e),
            // An executor ended (a panic) before it reported.
            Ok(Exit::Stopped) | Err(_) => {
                return Err(stop_all(&shutdown, handles, ServerError::ExecutorLost))
            }
        }
    }
    tracing::info!(
        target: "app",
        grpc = %settings.grpc_listen,
        metrics = %settings
            .metrics_listen
            .map_or_else(|| "off".to_owned(), |a| a.to_string()),
        storage = %match &mode {
            futureq_storage::StoreMode::Disk(dir, cache) => {
                format!("{} (cache {} MiB)", dir.display(), cache >> 20)
            }
            futureq_storage::StoreMode::Memory => "in memory".to_owned(),
        },
        cores,
        mode = if settings.cluster.is_some() { "clustered" } else { "standalone" },
        "futureq serving"
    );
    // An executor only stops once the shutdown began; one that stops before (a panic) takes
    // the others down rather than leave a broker that serves half.
    let mut stopped = 0;
    let mut lost = false;
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
    hub: flume::Sender<HubCmd>,
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

/// One executor: its gRPC listener; on core 0 the dispatcher, TTL sweeper and metrics; on the
/// Raft core (clustered) both Raft groups.
#[allow(clippy::too_many_lines)]
async fn core_main(
    core: usize,
    parts: CtxParts,
    hub_rx: Option<flume::Receiver<HubCmd>>,
    ready: Ready,
) {
    let CtxParts {
        settings,
        store,
        hub,
        metrics,
        shutdown,
        repl,
        write_requests,
        dispatcher_done,
        writes_open,
        fatal,
        stopped: _stopped,
        publish_budget,
        reflection,
        disk,
    } = parts;
    let _awake = match runtime::keep_awake() {
        Ok(a) => a,
        Err(e) => {
            ready.send(Err(e.into()));
            return;
        }
    };
    let listener = match glommio::net::TcpListener::bind(settings.grpc_listen) {
        Ok(l) => l,
        Err(e) => {
            ready.send(Err(ServerError::Listen {
                key: "api.grpc.listen",
                addr: settings.grpc_listen,
                reason: e.to_string(),
            }));
            return;
        }
    };
    let mut background = Vec::new();
    // The write core: one of the two servers of the write requests.
    if let (Some(rx), None) = (&write_requests, &settings.cluster) {
        let (opened, open_rx) = futures::channel::oneshot::channel();
        let data_dir = (!settings.memory_storage).then(|| settings.data_dir.clone());
        background.push(glommio::spawn_local(local::serve(
            data_dir,
            store.store().clone(),
            Box::new(dispatcher::applied_to_hub(hub.clone())),
            rx.clone(),
            (dispatcher_done.clone(), shutdown.clone()),
            fatal.clone(),
            move |r| {
                let _ = opened.send(r);
            },
        )));
        match open_rx.await {
            Ok(Ok(())) => writes_open.trigger(),
            Ok(Err(e)) => {
                ready.send(Err(ServerError::Journal(e)));
                return;
            }
            Err(_) => {
                ready.send(Err(ServerError::Journal(local::OpenError::Stopped)));
                return;
            }
        }
    }
    if let (Some(rx), Some(cfg)) = (write_requests, &settings.cluster) {
        let node = match cluster::start(
            cfg,
            &settings.grpc_advertise,
            store.store().clone(),
            Rc::new(dispatcher::applied_to_hub(hub.clone())),
        )
        .await
        {
            Ok(n) => n,
            Err(cluster::StartError::Failed(reason)) => {
                ready.send(Err(ServerError::WritePathFailed {
                    what: "a Raft group",
                    reason,
                }));
                return;
            }
            Err(e) => {
                ready.send(Err(ServerError::Cluster(e)));
                return;
            }
        };
        writes_open.trigger();
        background.push(glommio::spawn_local(cluster::serve(
            node,
            cfg.clone(),
            settings.grpc_advertise.clone(),
            Arc::clone(&repl),
            rx,
            store.store().clone(),
            shutdown.clone(),
            dispatcher_done.clone(),
            Arc::clone(&metrics),
            fatal.clone(),
        )));
    }
    if let Some(rx) = hub_rx {
        if let Some(addr) = settings.metrics_listen {
            match glommio::net::TcpListener::bind(addr) {
                Ok(l) => {
                    let h = metrics_handler(
                        Arc::clone(&metrics),
                        shutdown.clone(),
                        writes_open.clone(),
                    );
                    background.push(glommio::spawn_local(futureq_net::http::serve(
                        l,
                        h,
                        shutdown.clone(),
                    )));
                    let gauges = dispatcher::refresh_topic_gauges(
                        settings.metrics_topics_interval,
                        store.clone(),
                        hub.clone(),
                        Arc::clone(&metrics),
                        shutdown.clone(),
                    );
                    let open = opened(writes_open.clone(), shutdown.clone());
                    background.push(glommio::spawn_local(async move {
                        if open.await {
                            gauges.await;
                        }
                    }));
                }
                Err(e) => {
                    ready.send(Err(ServerError::Listen {
                        key: "observability.metrics.listen",
                        addr,
                        reason: e.to_string(),
                    }));
                    return;
                }
            }
        }
        let cfg = DispatcherConfig {
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
        };
        // The store is read once the write path replayed what it holds (on another core
        // when `runtime.raftCore` is not 0): a delete still in the journal would otherwise
        // let an acknowledged message be delivered again.
        let sweep = dispatcher::sweep_ttl(
            settings.ttl_sweep_interval,
            store.clone(),
            Arc::clone(&repl),
            Arc::clone(&metrics),
            shutdown.clone(),
            settings.proposal_timeout,
        );
        // A shutdown before the write path opened (a failed or slow replay) runs neither:
        // the store may still hold what the replay deletes.
        let open = opened(writes_open.clone(), shutdown.clone());
        background.push(glommio::spawn_local(async move {
            if open.await {
                sweep.await;
            }
        }));
        let run = dispatcher::run(
            cfg,
            rx,
            hub.clone(),
            store.clone(),
            repl.writes().clone(),
            Arc::clone(&metrics),
            shutdown.clone(),
        );
        let open = opened(writes_open.clone(), shutdown.clone());
        background.push(glommio::spawn_local(async move {
            if open.await {
                run.await;
            }
            dispatcher_done.trigger();
        }));
    }
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
        store: store.clone(),
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
