//! openraft's [`AsyncRuntime`] on glommio: the Raft core's executor.
//!
//! - `spawn` is `glommio::spawn_local(..).detach()`: openraft drops join handles and expects
//!   the task to go on (dropping a glommio `Task` would cancel it).
//! - `sleep`/`timeout` are built on glommio's `Timer` (glommio's own `timeout` wants a
//!   future returning `glommio::Result`).
//! - Channels, watch, oneshot, mutex and `Instant` are tokio's `sync`/`time` types through
//!   `openraft-rt-tokio`: they need no tokio runtime and wake any executor.
//!
//! A panicked task and a cancelled one look the same to glommio, so `is_panic` is false.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use glommio::timer::Timer;
use glommio::{LocalExecutor, LocalExecutorBuilder, Placement};
use openraft_rt::{AsyncRuntime, Instant as _, OptionalSend};
use openraft_rt_tokio::{TokioInstant, TokioMpsc, TokioMutex, TokioOneshot, TokioWatch};

/// io_uring buffer memory of an executor created by [`AsyncRuntime::new`] (tests).
const TEST_IO_MEMORY: usize = 512 << 10;

/// The glommio runtime for openraft.
pub struct GlommioRuntime {
    executor: LocalExecutor,
}

impl fmt::Debug for GlommioRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlommioRuntime").finish_non_exhaustive()
    }
}

/// A spawned task ended without a result (cancelled or panicked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinError;

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("task was cancelled or panicked")
    }
}

/// Join handle of a detached glommio task.
pub struct JoinHandle<T>(glommio::task::JoinHandle<T>);

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.ok_or(JoinError))
    }
}

/// A sleep on glommio's timer.
pub struct Sleep(Timer);

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// The deadline passed before the future completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

/// A future with a deadline.
pub struct Timeout<F> {
    future: Pin<Box<F>>,
    timer: Timer,
}

impl<R, F: Future<Output = R>> Future for Timeout<F> {
    type Output = Result<R, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(v) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        Pin::new(&mut self.timer).poll(cx).map(|_| Err(Elapsed))
    }
}

fn until(deadline: TokioInstant) -> Duration {
    deadline.saturating_duration_since(TokioInstant::now())
}

impl AsyncRuntime for GlommioRuntime {
    type JoinError = JoinError;
    type JoinHandle<T: OptionalSend + 'static> = JoinHandle<T>;
    type Sleep = Sleep;
    type Instant = TokioInstant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<T>;
    type ThreadLocalRng = rand::rngs::ThreadRng;
    type Mpsc = TokioMpsc;
    type Watch = TokioWatch;
    type Oneshot = TokioOneshot;
    type Mutex<T: OptionalSend + 'static> = TokioMutex<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        JoinHandle(glommio::spawn_local(future).detach())
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Sleep(Timer::new(duration))
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Sleep(Timer::new(until(deadline)))
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Timeout {
            future: Box::pin(future),
            timer: Timer::new(duration),
        }
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Timeout {
            future: Box::pin(future),
            timer: Timer::new(until(deadline)),
        }
    }

    fn is_panic(_: &Self::JoinError) -> bool {
        false
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        rand::rng()
    }

    fn new(_threads: usize) -> Self {
        let executor = LocalExecutorBuilder::new(Placement::Unbound)
            .io_memory(TEST_IO_MEMORY)
            .make()
            .expect("glommio executor (check RLIMIT_MEMLOCK)");
        GlommioRuntime { executor }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.executor.run(future)
    }
}
