//! Tasks whose output is awaited: [`spawn_owned`], instead of awaiting glommio's `Task` handle.
//!
//! glommio 0.9 frees a task from its handle's `Drop` when a plain load of the task's reference
//! count reads zero. Another thread that drops the task's last waker takes that count to zero
//! and then back to one (to queue a final wake on the task's executor); a handle dropped in
//! between frees the task under that thread, whose queued wake then writes into freed memory.
//! The next task allocated there has its count off by one and is freed while its own waker is
//! still held, and the wake of that waker crashes the process. A standalone broker died so in
//! `do_wake`, with the freed task's memory reused for a publish's payload, about once per
//! 10 s of NO_ACK publishes of one message per request from 8 streams: each batch's task was
//! awaited through its handle, and the write core on the other executor answered it (and
//! dropped its waker) from its thread.
//!
//! # Invariant
//! A task spawned here is only scheduled at its spawn, not run, and its glommio handle is
//! dropped right then: the handle's drop finds the task exactly scheduled and holding its
//! handle, and takes glommio's path that reads no reference count. So only the count's atomic
//! steps (a waker's or a run's last drop) ever free it, never a handle's load. Every task of
//! ours whose output is awaited is spawned here, and a background task whose handle was kept
//! with [`spawn_detached`]. (`glommio::spawn_local(..).detach()` drops the handle right after
//! the task's first poll, before this executor runs anything else: a wake another thread
//! queued meanwhile cannot have been taken yet, so the count holds that waker's share and the
//! load does not read zero. Only a handle kept past that point is exposed. One is kept on
//! purpose: `runtime::KeepAwake`'s task never completes, and its handle is dropped only when
//! its executor stops, after the ticker's waker was taken out of the slot under its lock.)

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::channel::oneshot;
use futures::future::Either;

/// The output of a task spawned with [`spawn_owned`]; dropping it cancels the task (at the
/// task's next turn, as a glommio `Task` handle's drop does).
#[must_use = "dropping it cancels the task"]
pub struct Owned<T> {
    rx: oneshot::Receiver<T>,
}

impl<T> Future for Owned<T> {
    /// `None` when the task ended without an output: its executor stopped (it was dropped).
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        Pin::new(&mut self.rx).poll(cx).map(Result::ok)
    }
}

/// Runs `fut` on a task of the current executor's running task queue (from its next turn);
/// its output comes through the returned [`Owned`], on this executor. See the module docs for
/// why not through glommio's handle.
pub fn spawn_owned<T: 'static>(fut: impl Future<Output = T> + 'static) -> Owned<T> {
    spawn_owned_into(fut, glommio::executor().current_task_queue())
}

/// Runs `fut` in the background on a task of the current executor's running task queue
/// (from its next turn), its handle dropped at once (see the module docs); it is not
/// cancelled, it ends when `fut` does.
pub fn spawn_detached(fut: impl Future<Output = ()> + 'static) {
    schedule(fut, glommio::executor().current_task_queue());
}

/// Schedules `fut` in `queue` of the current executor, not run at once as `spawn_local`
/// does, and drops its handle right then (see the module docs: the handle's drop then reads
/// no reference count).
///
/// # Panics
/// `queue` is not a task queue of the current executor (a caller's defect).
fn schedule(fut: impl Future<Output = ()> + 'static, queue: glommio::TaskQueueHandle) {
    drop(
        glommio::executor()
            .spawn_local_into(fut, queue)
            .expect("a task queue of this executor")
            .detach(),
    );
}

/// [`spawn_owned`] into the task queue `queue` of the current executor.
///
/// # Panics
/// `queue` is not a task queue of the current executor (a caller's defect).
pub fn spawn_owned_into<T: 'static>(
    fut: impl Future<Output = T> + 'static,
    queue: glommio::TaskQueueHandle,
) -> Owned<T> {
    let (mut tx, rx) = oneshot::channel();
    let task = async move {
        let out = {
            let fut = std::pin::pin!(fut);
            // The cancellation first: once the `Owned` is gone, `fut` is not polled again.
            match futures::future::select(tx.cancellation(), fut).await {
                Either::Right((out, _)) => out,
                // The `Owned` was dropped: nobody wants the output.
                Either::Left(((), _)) => return,
            }
        };
        let _ = tx.send(out);
    };
    schedule(task, queue);
    Owned { rx }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    use futures::channel::oneshot;
    use glommio::LocalExecutorBuilder;

    use super::spawn_owned;

    /// Sets its flag when dropped (the future that holds it was dropped).
    struct Dropped(Rc<Cell<bool>>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }

    #[test]
    fn an_owned_task_answered_from_another_executor_yields_its_output_and_dropping_it_cancels_it() {
        // Each request carries a oneshot the other executor answers from its thread, as the
        // write core answers the ingress cores' publishes.
        let (requests, served) = flume::bounded::<oneshot::Sender<u64>>(64);
        let answerer = LocalExecutorBuilder::default()
            .spawn(move || async move {
                while let Ok(reply) = served.recv_async().await {
                    let _ = reply.send(7);
                }
            })
            .expect("an executor");
        let asker = LocalExecutorBuilder::default()
            .spawn(move || async move {
                // Many in flight at once, their outputs awaited in order.
                let mut sum = 0;
                let mut in_flight = std::collections::VecDeque::new();
                for _ in 0..20_000 {
                    let (reply, answer) = oneshot::channel();
                    requests.send_async(reply).await.expect("the answerer runs");
                    in_flight.push_back(spawn_owned(async move { answer.await.unwrap_or(0) }));
                    if in_flight.len() == 32 {
                        sum += in_flight.pop_front().expect("32").await.expect("an output");
                    }
                }
                for o in in_flight {
                    sum += o.await.expect("an output");
                }
                assert_eq!(sum, 7 * 20_000);

                // Dropped before its output: the task stops at its next turn.
                let dropped = Rc::new(Cell::new(false));
                let guard = Dropped(Rc::clone(&dropped));
                let owned = spawn_owned(async move {
                    let _guard = guard;
                    glommio::timer::sleep(Duration::from_secs(60)).await;
                });
                drop(owned);
                glommio::timer::sleep(Duration::from_millis(10)).await;
                assert!(
                    dropped.get(),
                    "the task's future was dropped with its Owned"
                );
            })
            .expect("an executor");
        asker.join().expect("the asker's checks");
        answerer
            .join()
            .expect("the answerer ends when the asker drops its sender");
    }
}
