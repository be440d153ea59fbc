//! Process set-up for the thread-per-core runtime: locked-memory limit, CPU list, executors.

/// Why the process cannot host the executors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// RLIMIT_MEMLOCK could not be read or raised.
    #[error("{what}")]
    Rlimit {
        /// What failed.
        what: &'static str,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("{what}")]
    Thread {
        /// What failed.
        what: &'static str,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// RLIMIT_MEMLOCK stays below what the executors need.
    #[error(
        "RLIMIT_MEMLOCK is {soft} bytes but {executors} executors need at least {need}: \
         raise it (ulimit -l, or LimitMEMLOCK=infinity in the systemd unit) or lower runtime.cores"
    )]
    MemlockTooLow {
        /// The limit.
        soft: u64,
        /// Executors to start.
        executors: usize,
        /// Bytes they need.
        need: u64,
    },
    /// Another process listens on a port this broker is configured to serve.
    #[error("cannot listen on {key} {addr}: the port is already in use ({other} is served by process {pid} {name}: another futureq or another server)")]
    PortTaken {
        /// The configuration key.
        key: String,
        /// The configured address.
        addr: std::net::SocketAddr,
        /// The other listener's address.
        other: std::net::SocketAddr,
        /// The other process.
        pid: u32,
        /// Its name.
        name: String,
    },
}

/// io_uring buffer memory registered per executor. This broker does no DMA file I/O on its
/// executors (redb has its own threads), so a small pool suffices; it must fit in
/// RLIMIT_MEMLOCK together with the other executors (and, in tests, other brokers).
pub const IO_MEMORY_PER_EXECUTOR: usize = 512 << 10;
/// Longest a task queue runs before glommio chooses again among the queues with work (its
/// default is 100 ms). Timers, heartbeats' among them, wait for the running queue's turn to
/// end: during a 1 M-message fill of a 3-node cluster, ticks of the Raft queue ran up to
/// 82/59 ms late with 100 ms, 37/28 ms with 10 (two runs each), and publish throughput did
/// not move (`ab`, 3 rounds: cluster 1.09× / 1.05×, ranges overlapping; docs/benchmarks.md).
/// A shorter period makes more likely the stall [`keep_awake`] works around (a round whose
/// preemption timer fired before it ran anything, parked with tasks runnable); such a round
/// ends within [`KEEP_AWAKE_PERIOD`], or at the next completion or timer.
pub const PREEMPT_PERIOD: std::time::Duration = std::time::Duration::from_millis(10);
/// Threads per executor for blocking work (not pinned: they may run on any CPU).
pub const BLOCKING_THREADS: usize = 2;

/// Where work runs on a clustered node's executor. glommio runs, of the task queues that have
/// work, the one that used least CPU for its shares; a queue runs its ready tasks until it has
/// none left or the preemption timer fires, then the next is chosen.
///
/// - `Raft`: this node's Raft groups (heartbeats, votes, replication, the log, the apply
///   hand-off): the most shares glommio gives (1000).
/// - `Clients`: the client connections (gRPC, HTTP/2): a fifth of that (200). When both
///   have work, the Raft groups get five times the clients' CPU: an overloaded node reads its
///   clients more slowly, and HTTP/2 flow control pushes back on them, instead of sending its
///   heartbeats late (a leader whose followers hear nothing for an election timeout is
///   replaced with no fault).
/// - Everything else (the dispatcher, the write core's coalescer, the sweepers) stays in the
///   executor's default queue, with the Raft groups' shares.
///
/// The queues' latency is left `NotImportant`: glommio 0.9 chooses the ring of an I/O by its
/// kind, not by its queue. glommio switches queues only between tasks: a queue whose tasks
/// keep yielding runs about [`PREEMPT_PERIOD`] while another waits, and a task that runs long
/// without yielding holds every queue (the log writes its flushes in pieces for that reason).
#[derive(Debug, Clone, Copy)]
pub enum Queue {
    /// The Raft groups.
    Raft,
    /// The client connections.
    Clients,
}

impl Queue {
    fn config(self) -> (glommio::Shares, &'static str) {
        match self {
            Queue::Raft => (glommio::Shares::Static(1000), "raft"),
            Queue::Clients => (glommio::Shares::Static(200), "clients"),
        }
    }

    /// Runs `work` on this executor in a new task queue of this kind; every task it spawns
    /// (glommio spawns into the running task's queue) runs there too. Its output comes
    /// through [`crate::task::Owned`] (`None` if the executor dropped it).
    pub fn spawn<T: 'static>(
        self,
        work: impl std::future::Future<Output = T> + 'static,
    ) -> crate::task::Owned<T> {
        let (shares, name) = self.config();
        let queue =
            glommio::executor().create_task_queue(shares, glommio::Latency::NotImportant, name);
        crate::task::spawn_owned_into(work, queue)
    }
}

/// Raises RLIMIT_MEMLOCK as far as allowed (unlimited when privileged, else the hard limit)
/// and checks that `executors` io_uring pools fit.
///
/// # Errors
/// The limit stays below what the executors need; the message says how to fix it.
pub fn raise_memlock(executors: usize) -> Result<u64, RuntimeError> {
    use rlimit::Resource;
    let reading = |source| RuntimeError::Rlimit {
        what: "reading RLIMIT_MEMLOCK",
        source,
    };
    let (_, hard) = Resource::MEMLOCK.get().map_err(reading)?;
    if Resource::MEMLOCK
        .set(rlimit::INFINITY, rlimit::INFINITY)
        .is_err()
    {
        Resource::MEMLOCK
            .set(hard, hard)
            .map_err(|source| RuntimeError::Rlimit {
                what: "raising RLIMIT_MEMLOCK to its hard limit",
                source,
            })?;
    }
    let (soft, _) = Resource::MEMLOCK.get().map_err(reading)?;
    // glommio refuses to start below 512 KiB, and each executor registers its pool.
    let need = (executors as u64 * IO_MEMORY_PER_EXECUTOR as u64).max(512 << 10);
    if soft < need {
        return Err(RuntimeError::MemlockTooLow {
            soft,
            executors,
            need,
        });
    }
    Ok(soft)
}

/// Period of [`keep_awake`]: the longest an executor that glommio parked with work to do
/// sleeps before it runs that work.
pub const KEEP_AWAKE_PERIOD: std::time::Duration = std::time::Duration::from_millis(20);

/// Wakes the executor it was made on every [`KEEP_AWAKE_PERIOD`] for as long as it lives.
///
/// glommio 0.9 parks an executor whose preempt timer fired before the executor ran anything
/// in a scheduling round (the thread was stopped or descheduled for longer than the preempt
/// period right after arming it: SIGSTOP, an overloaded host), although tasks are runnable.
/// It sleeps in `io_uring_enter` until some completion, timer or remote wake wakes it; when
/// the runnable tasks were the ones to submit the next I/O or arm the next timer (an accept
/// loop whose connection was just taken), nothing does, and the executor serves nothing
/// (issue 10.15: a node that answered no gRPC call after pauses; fixed upstream in glommio's
/// scheduler, not in a release yet).
///
/// The wake comes from a process-wide ticker thread, through glommio's cross-thread waker
/// (its eventfd), so it does not depend on any task of the stalled executor having run: a
/// round preempted before running anything, again and again, still ends after one period
/// each time. (A timer on the executor itself did: it fired once, and re-arming it took the
/// task to run — a second preempted round in a row parked the executor for good, seen on a
/// loaded CI machine.)
#[must_use = "the executor is kept awake only while the guard lives"]
pub struct KeepAwake {
    _task: glommio::Task<()>,
    /// The only strong reference: dropped with the guard, so that the ticker stops waking
    /// the task (the task, cancelled, may outlive its executor).
    slot: std::sync::Arc<WakerSlot>,
}

impl Drop for KeepAwake {
    fn drop(&mut self) {
        lock(&self.slot).take();
    }
}

/// The waker of one [`KeepAwake`] task, shared with the ticker thread.
type WakerSlot = std::sync::Mutex<Option<std::task::Waker>>;

/// The ticker thread's registrations; a dropped [`KeepAwake`] leaves a dead `Weak` behind,
/// pruned at the next tick.
struct Ticker {
    running: bool,
    slots: Vec<std::sync::Weak<WakerSlot>>,
}

static TICKER: std::sync::Mutex<Ticker> = std::sync::Mutex::new(Ticker {
    running: false,
    slots: Vec::new(),
});

/// Locks `m`; the ticker's locks guard plain data, which a panic while holding one leaves
/// consistent.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wakes every registered slot each period; ends when none is left (the next
/// [`ticked_slot`] starts it again).
fn tick() {
    loop {
        std::thread::sleep(KEEP_AWAKE_PERIOD);
        let mut t = lock(&TICKER);
        t.slots.retain(|slot| {
            let Some(slot) = slot.upgrade() else {
                return false;
            };
            if let Some(w) = lock(&slot).as_ref() {
                // A wake that panics (glommio asserts on a waker's reference count, which
                // queued cross-thread wakes of an executor thread stuck for minutes raise)
                // must not end the ticker for every other executor.
                let woke =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake_by_ref()));
                if woke.is_err() {
                    tracing::error!(target: "app", "waking an executor from the keep-awake ticker panicked");
                }
            }
            true
        });
        if t.slots.is_empty() {
            t.running = false;
            return;
        }
    }
}

/// Keeps the current executor awake (see [`KeepAwake`]); starts the ticker thread on first
/// use.
///
/// # Errors
/// The ticker thread could not be started.
pub fn keep_awake() -> Result<KeepAwake, RuntimeError> {
    let slot = ticked_slot()?;
    let weak = std::sync::Arc::downgrade(&slot);
    let task = glommio::spawn_local(std::future::poll_fn(move |cx| {
        if let Some(slot) = weak.upgrade() {
            let mut w = lock(&slot);
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        std::task::Poll::<()>::Pending
    }));
    Ok(KeepAwake { _task: task, slot })
}

/// A slot whose waker the ticker wakes every [`KEEP_AWAKE_PERIOD`] until it is dropped,
/// whether or not the woken task ever runs.
fn ticked_slot() -> Result<std::sync::Arc<WakerSlot>, RuntimeError> {
    let slot: std::sync::Arc<WakerSlot> = std::sync::Arc::default();
    let mut t = lock(&TICKER);
    if !t.running {
        std::thread::Builder::new()
            .name("futureq-keepawake".into())
            .spawn(tick)
            .map_err(|source| RuntimeError::Thread {
                what: "starting the executors' keep-awake ticker",
                source,
            })?;
        t.running = true;
    }
    t.slots.push(std::sync::Arc::downgrade(&slot));
    Ok(slot)
}

/// Sleeps for `d` unless `shutdown` fires first: true when it did.
pub async fn sleep_or_shutdown(d: std::time::Duration, shutdown: &futureq_net::Shutdown) -> bool {
    futures_lite::future::or(
        async {
            glommio::timer::sleep(d).await;
            false
        },
        async {
            shutdown.wait().await;
            true
        },
    )
    .await
}

/// How long start-up waits for a listener that no process holds any more to close: the
/// io_uring of a broker killed just before releases its files a little after its exit.
const ORPHAN_LISTENER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Fails when another process listens on `addr`'s port at that address or a wildcard (port 0
/// always passes). The executors' listeners share their port (SO_REUSEPORT), which would also
/// let them join a port another broker serves and split the clients between two stores.
///
/// A trial bind cannot tell (the kernel also refuses it for the lingering connections of a
/// broker that was just killed), so the listening sockets are read from `/proc/net/tcp{,6}`
/// (this network namespace) and their owners from `/proc/*/fd`. A listener that no process
/// holds (a killed broker's, released late by its io_uring) is waited for, up to
/// [`ORPHAN_LISTENER_WAIT`].
///
/// # Errors
/// Another process listens there; the message names the configuration key and the process.
pub fn check_port_free(key: &str, addr: std::net::SocketAddr) -> Result<(), RuntimeError> {
    if addr.port() == 0 {
        return Ok(());
    }
    let until = std::time::Instant::now() + ORPHAN_LISTENER_WAIT;
    loop {
        let mut tables = String::new();
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(t) = std::fs::read_to_string(f) {
                tables.push_str(&t);
            }
        }
        let clash: Vec<(std::net::SocketAddr, u64)> = listeners(&tables)
            .into_iter()
            .filter(|(l, _)| {
                l.port() == addr.port()
                    && (l.ip() == addr.ip()
                        || l.ip().is_unspecified()
                        || addr.ip().is_unspecified())
            })
            .collect();
        if clash.is_empty() {
            return Ok(());
        }
        for (other, inode) in &clash {
            if let Some(pid) = socket_owner(*inode) {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                return Err(RuntimeError::PortTaken {
                    key: key.to_owned(),
                    addr,
                    other: *other,
                    pid,
                    name: name.trim().to_owned(),
                });
            }
        }
        if std::time::Instant::now() >= until {
            tracing::warn!(target: "app", %addr, "a listener no process holds is still open on {key}; starting anyway");
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The process (other than this one) that holds the socket with this inode, if any.
fn socket_owner(inode: u64) -> Option<u32> {
    let want = format!("socket:[{inode}]");
    let me = std::process::id();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
        let pid: u32 = p.file_name().to_str()?.parse().ok()?;
        if pid == me {
            return None;
        }
        std::fs::read_dir(p.path().join("fd"))
            .ok()?
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
            .then_some(pid)
    })
}

/// The local addresses and inodes of the sockets in LISTEN state in `/proc/net/tcp{,6}` text.
fn listeners(tables: &str) -> Vec<(std::net::SocketAddr, u64)> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    const LISTEN: &str = "0A";
    tables
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let local = f.nth(1)?;
            let state = f.nth(1)?;
            if state != LISTEN {
                return None;
            }
            let inode: u64 = f.nth(5)?.parse().ok()?;
            let (ip, port) = local.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            // The kernel prints each 32-bit word of the address in host (little-endian) order.
            let words: Vec<u32> = (0..ip.len() / 8)
                .map(|i| u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok())
                .collect::<Option<_>>()?;
            let ip = match words.as_slice() {
                [w] => IpAddr::V4(Ipv4Addr::from(w.to_le_bytes())),
                [a, b, c, d] => {
                    let mut bytes = [0u8; 16];
                    for (i, w) in [a, b, c, d].iter().enumerate() {
                        bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
                    }
                    let v6 = Ipv6Addr::from(bytes);
                    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
                }
                _ => return None,
            };
            Some((SocketAddr::new(ip, port), inode))
        })
        .collect()
}

/// The CPUs this process may run on (from /proc/self/status `Cpus_allowed_list`), falling
/// back to `0..available_parallelism`.
#[must_use]
pub fn allowed_cpus() -> Vec<usize> {
    let fallback =
        || (0..std::thread::available_parallelism().map_or(1, std::num::NonZero::get)).collect();
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return fallback();
    };
    let Some(line) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) else {
        return fallback();
    };
    let list = parse_cpu_list(line.trim_start_matches("Cpus_allowed_list:").trim());
    if list.is_empty() {
        fallback()
    } else {
        list
    }
}

/// Parses a kernel CPU list such as `0-3,6,8-9`.
#[must_use]
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b.min(a + 4096));
                }
            }
            None => {
                if let Ok(c) = part.parse() {
                    out.push(c);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn listening_sockets_are_read_from_proc_net_tcp() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:20FB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:20FB 0100007F:9C40 06 00000000:00000000 00:00000000 00000000     0        0 0 3
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1
   1: 0000000000000000FFFF00000100007F:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1
";
        let got: Vec<String> = listeners(tcp)
            .iter()
            .map(|(a, inode)| format!("{a} {inode}"))
            .collect();
        assert_eq!(
            got,
            [
                "127.0.0.1:8443 1",
                "0.0.0.0:22 2",
                "[::1]:8080 3",
                "127.0.0.1:8081 4"
            ],
            "time-wait rows are not listeners"
        );
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6,8-9"), vec![0, 1, 2, 3, 6, 8, 9]);
        assert_eq!(parse_cpu_list("1"), vec![1]);
        assert!(parse_cpu_list("").is_empty());
        assert!(!allowed_cpus().is_empty());
    }

    /// Wake-ups in one second that show a [`KEEP_AWAKE_PERIOD`] ticker at work on a loaded
    /// machine (a quarter of the nominal rate).
    fn ticks_expected() -> u64 {
        (Duration::from_secs(1).as_millis() / KEEP_AWAKE_PERIOD.as_millis()) as u64 / 4
    }

    /// Issue 10.15 (and the CI failure of its first test, which timed glommio against a
    /// 30 µs preempt timer): the wake-ups do not depend on the woken task having run. Its
    /// waker is woken every period although nothing ever polls it again — a timer armed by
    /// the task fired once, and re-arming it took the task to run, which a round preempted
    /// before running anything does not do.
    #[test]
    fn the_ticker_wakes_a_task_that_never_ran_again() {
        struct Count(std::sync::atomic::AtomicU64);
        impl std::task::Wake for Count {
            fn wake(self: std::sync::Arc<Self>) {
                self.wake_by_ref();
            }
            fn wake_by_ref(self: &std::sync::Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let count = std::sync::Arc::new(Count(std::sync::atomic::AtomicU64::new(0)));
        let slot = ticked_slot().expect("ticker");
        *slot.lock().expect("slot") = Some(std::task::Waker::from(std::sync::Arc::clone(&count)));
        std::thread::sleep(Duration::from_secs(1));
        let woken = count.0.load(std::sync::atomic::Ordering::Relaxed);
        assert!(woken >= ticks_expected(), "{woken} wake-ups in 1 s");
        // A dropped slot is no longer woken.
        drop(slot);
        std::thread::sleep(KEEP_AWAKE_PERIOD * 3);
        let after = count.0.load(std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(KEEP_AWAKE_PERIOD * 5);
        assert_eq!(count.0.load(std::sync::atomic::Ordering::Relaxed), after);
    }

    /// Voluntary context switches of thread `tid` of this process: one per sleep in
    /// `io_uring_enter`.
    fn sleeps_of(tid: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
            .expect("thread status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("voluntary_ctxt_switches")
    }

    /// The ticker's wake-ups reach an executor asleep in `io_uring_enter` with no timer armed
    /// (glommio's cross-thread wake writes its eventfd): it wakes every period. Without
    /// [`keep_awake`] the same executor sleeps through the second.
    #[test]
    fn an_idle_executor_is_woken_by_the_ticker() {
        raise_memlock(2).expect("memlock");
        let wakes = |awake: bool| {
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = flume::bounded::<()>(1);
            let t = std::thread::spawn(move || {
                let me = std::fs::read_link("/proc/thread-self").expect("thread-self");
                let tid = me.file_name().expect("tid").to_string_lossy().into_owned();
                let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                    .io_memory(IO_MEMORY_PER_EXECUTOR)
                    .make()
                    .expect("executor");
                ex.run(async move {
                    let _awake = awake.then(|| keep_awake().expect("ticker"));
                    tid_tx.send(tid).expect("tid");
                    let _ = stop_rx.recv_async().await;
                });
            });
            let tid = tid_rx.recv().expect("tid");
            std::thread::sleep(Duration::from_millis(100));
            let before = sleeps_of(&tid);
            std::thread::sleep(Duration::from_secs(1));
            let woke = sleeps_of(&tid) - before;
            stop_tx.send(()).expect("stop");
            t.join().expect("executor thread");
            woke
        };
        let (with, without) = (wakes(true), wakes(false));
        assert!(
            with >= ticks_expected(),
            "{with} wake-ups in 1 s with keep_awake"
        );
        assert!(
            without <= ticks_expected() / 2,
            "{without} wake-ups in 1 s of an idle executor without it"
        );
    }
}
