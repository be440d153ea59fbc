//! The store's reader threads: due-range scans, and the operator's reads, off the executors.
//!
//! redb is synchronous, so it never runs on an executor. The dispatcher talks to the reader
//! over a bounded channel and awaits a oneshot reply; the bound is the back-pressure that keeps
//! memory bounded. The operator's reads (TopicStats, Peek, the per-topic gauges: O(topics) or
//! O(limit), possibly long) have a thread of their own, one read at a time, so that they
//! delay neither the dispatcher's scans nor an executor (the write core's applies). Writes do not come here: they are log entries (the Raft log, or the
//! standalone journal, [`crate::journal`]) applied by [`Store::apply_entries`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futureq_core::hub::{ScanRequest, ScanResult};
use futures::channel::oneshot;

use crate::store::{Store, StoreMode};
use crate::StoreError;

/// Capacity of the reader's queue.
pub const READ_QUEUE_MAX: usize = 1024;
/// Capacity of the admin thread's queue; callers beyond it wait for a place.
pub const ADMIN_QUEUE_MAX: usize = 16;

/// A read on the admin thread (it answers through a channel of its own).
type AdminOp = Box<dyn FnOnce(&Store) + Send>;

type Reply<T> = oneshot::Sender<Result<T, Arc<StoreError>>>;

struct ReadOp {
    reqs: Vec<ScanRequest>,
    reply: Reply<Vec<Result<ScanResult, StoreError>>>,
}

/// Handle to the store and its threads. Clone it freely; the threads stop when every handle
/// is dropped, or at [`StoreThreads::join`].
#[derive(Clone)]
pub struct StoreService {
    read_tx: flume::Sender<ReadOp>,
    admin_tx: flume::Sender<AdminOp>,
    store: Store,
    /// Set by [`StoreThreads::join`]: a request sent after it may never be served.
    stop: Arc<AtomicBool>,
}

/// Join handle of the store's threads.
pub struct StoreThreads {
    handles: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl StoreThreads {
    /// Stops the threads once their queues are empty (a handle still held somewhere then
    /// gets [`StoreError::Closed`]) and waits for them.
    pub fn join(self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles {
            let _ = h.join();
        }
    }
}

/// How often an idle store thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Serves `rx` on this thread until every sender is gone, or `stop` is set: then what is
/// queued is served and the thread ends. A sender that finds `stop` set after its send
/// answers [`StoreError::Closed`] itself (its request may have come after this last drain).
fn serve<T>(rx: &flume::Receiver<T>, stop: &AtomicBool, mut each: impl FnMut(T)) {
    loop {
        match rx.recv_timeout(STOP_POLL) {
            Ok(op) => each(op),
            Err(flume::RecvTimeoutError::Timeout) if !stop.load(Ordering::SeqCst) => {}
            Err(flume::RecvTimeoutError::Timeout) => {
                while let Ok(op) = rx.try_recv() {
                    each(op);
                }
                return;
            }
            Err(flume::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Starts a store thread named `name` serving `rx` (see [`serve`]).
fn spawn<T: Send + 'static>(
    name: &str,
    rx: flume::Receiver<T>,
    stop: &Arc<AtomicBool>,
    store: Store,
    each: impl Fn(&Store, T) + Send + 'static,
) -> Result<JoinHandle<()>, StoreError> {
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || serve(&rx, &stop, |op| each(&store, op)))
        .map_err(StoreError::Thread)
}

impl StoreService {
    /// After a send: whether the threads were told to stop (the request may never be
    /// served, see [`serve`]).
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

impl StoreService {
    /// Opens the store and starts its reader threads.
    ///
    /// # Errors
    /// The store cannot be opened, or the thread cannot be started.
    pub fn start(mode: &StoreMode) -> Result<(Self, StoreThreads), StoreError> {
        let store = Store::open(mode)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (read_tx, read_rx) = flume::bounded::<ReadOp>(READ_QUEUE_MAX);
        let r = spawn(
            "futureq-store-r",
            read_rx,
            &stop,
            store.clone(),
            |store, op| {
                let _ = op.reply.send(store.scan_all(&op.reqs).map_err(Arc::new));
            },
        )?;
        let (admin_tx, admin_rx) = flume::bounded::<AdminOp>(ADMIN_QUEUE_MAX);
        let a = spawn(
            "futureq-store-a",
            admin_rx,
            &stop,
            store.clone(),
            |store, op| {
                // A read that panicked answers nobody (its caller sees `Closed`); the thread
                // serves on.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(store)));
            },
        )?;
        Ok((
            StoreService {
                read_tx,
                admin_tx,
                store,
                stop: Arc::clone(&stop),
            },
            StoreThreads {
                handles: vec![r, a],
                stop,
            },
        ))
    }

    /// The underlying store, for synchronous calls off the reactor (blocking threads, tests).
    #[must_use]
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs `f` on the admin thread: one such read at a time on the node, on no executor.
    ///
    /// # Errors
    /// [`StoreError::Closed`]: the thread stopped, or `f` panicked.
    pub async fn admin<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.admin_tx
            .send_async(Box::new(move |store: &Store| {
                let _ = reply.send(f(store));
            }))
            .await
            .map_err(|_| StoreError::Closed)?;
        if self.stopping() {
            return Err(StoreError::Closed);
        }
        rx.await.map_err(|_| StoreError::Closed)
    }

    /// Reads a due range.
    ///
    /// # Errors
    /// A storage error or the store is closed.
    pub async fn scan(&self, req: ScanRequest) -> Result<ScanResult, Arc<StoreError>> {
        self.scan_all(vec![req])
            .await?
            .pop()
            .unwrap_or(Err(StoreError::Closed))
            .map_err(Arc::new)
    }

    /// Reads the due ranges of several topics in one round trip to the reader thread and one
    /// read transaction: one result per request, in order.
    ///
    /// # Errors
    /// The reader stopped or the transaction could not start.
    pub async fn scan_all(
        &self,
        reqs: Vec<ScanRequest>,
    ) -> Result<Vec<Result<ScanResult, StoreError>>, Arc<StoreError>> {
        let (reply, rx) = oneshot::channel();
        self.read_tx
            .send_async(ReadOp { reqs, reply })
            .await
            .map_err(|_| Arc::new(StoreError::Closed))?;
        if self.stopping() {
            return Err(Arc::new(StoreError::Closed));
        }
        rx.await.map_err(|_| Arc::new(StoreError::Closed))?
    }
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;

    /// The admin thread answers reads, survives one that panics, and `join` stops the threads
    /// even while a handle is still held (which then gets `Closed`).
    #[test]
    fn admin_reads_and_a_join_with_a_handle_still_held() {
        let (svc, threads) = StoreService::start(&StoreMode::Memory).unwrap();
        let n = block_on(svc.admin(|s| s.topic_counts(10).map(|c| c.rest))).unwrap();
        assert_eq!(n.unwrap(), 0);
        let panicked = block_on(svc.admin(|_| -> u8 { panic!("a bad read") }));
        assert!(matches!(panicked, Err(StoreError::Closed)), "{panicked:?}");
        assert_eq!(block_on(svc.admin(|_| 7)).unwrap(), 7, "serves on");
        let kept = svc.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            threads.join();
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("join returned with a handle held");
        assert!(matches!(
            block_on(kept.admin(|_| 1)),
            Err(StoreError::Closed)
        ));
        drop(svc);
    }
}
