//! Open-loop publishing at a fixed offered rate, corrected for coordinated omission.
//!
//! Each connection sends request `k` at its scheduled instant `start + k·interval` whatever
//! the acks are doing (the sender and the ack reader are separate tasks), so a slow system
//! cannot slow the load down and hide its own queueing. Latency runs from the instant the
//! request was *meant* to go out whenever the sender fell more than [`SLACK`] behind its
//! schedule (the system, or the machine it shares with us, held us up: coordinated-omission
//! correction); within `SLACK` it runs from the actual send, since that much is tokio's 1 ms
//! timer wheel and not the system under test. Requests scheduled in the measured window
//! count, however late their ack comes (up to [`GRACE`] after the schedule ends).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::stats::{hist, StreamTask};

/// How long acks may still come after the schedule ends. A system that has not acknowledged a
/// request by then is overloaded: each such request is recorded as late as it is at that
/// moment (a lower bound) and does not count as acknowledged.
const GRACE: Duration = Duration::from_secs(10);

/// How far behind schedule the sender may wake before latency is measured from the schedule.
const SLACK: Duration = Duration::from_millis(2);

/// The sending half of one connection.
pub(crate) trait Sender: Send + 'static {
    /// Sends request `seq` (one batch, or one message for systems without batches).
    fn send(&mut self, seq: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// The ack-reading half of one connection.
pub(crate) trait Acks: Send + 'static {
    /// Waits for the next answer and returns the `seq` it answers, and whether the request
    /// was stored (`false`: refused as overloaded, nothing stored: shed load).
    fn recv(&mut self) -> impl Future<Output = anyhow::Result<(u64, bool)>> + Send;
}

/// The schedule of one open-loop measurement.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    /// Offered messages per second over all connections.
    pub(crate) rate: f64,
    pub(crate) streams: usize,
    /// Messages per request.
    pub(crate) batch: usize,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
}

impl Schedule {
    /// Time between two requests of one connection.
    fn interval(&self) -> Duration {
        #[allow(clippy::cast_precision_loss)]
        let per_stream = self.rate / (self.streams * self.batch) as f64;
        Duration::from_secs_f64(1.0 / per_stream.max(1e-3))
    }
}

/// Runs every connection's halves on the schedule `s`, starting now, and joins the results.
pub(crate) async fn run<S: Sender, A: Acks>(
    halves: Vec<(S, A)>,
    s: Schedule,
) -> anyhow::Result<crate::stats::PublishOut> {
    let start = Instant::now();
    let tasks = halves
        .into_iter()
        .map(|(tx, rx)| stream(tx, rx, s, start))
        .collect();
    crate::stats::collect(tasks, s.measure).await
}

/// Runs one connection's halves against the schedule that starts at `start`; the task yields
/// the messages acknowledged among those scheduled in the measured window and their latency.
fn stream(tx: impl Sender, mut rx: impl Acks, s: Schedule, start: Instant) -> StreamTask {
    let interval = s.interval();
    let (warm, end) = (start + s.warmup, start + s.warmup + s.measure);
    let total = u64::try_from(
        (end - start)
            .as_nanos()
            .div_ceil(interval.as_nanos().max(1)),
    )
    .unwrap_or(u64::MAX);
    let pending: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let sender = tokio::spawn(send_all(tx, Arc::clone(&pending), start, interval, total));
    tokio::spawn(async move {
        let (mut latency, mut c) = (hist(), crate::stats::StreamCounts::default());
        let deadline = end + GRACE;
        for _ in 0..total {
            let Ok(seq) = tokio::time::timeout_at(deadline.into(), rx.recv()).await else {
                // Overloaded: what is still unacknowledged is at least this late.
                let now = Instant::now();
                let pending = pending
                    .lock()
                    .map_err(|_| anyhow::anyhow!("open-loop sender panicked"))?;
                for &t0 in pending.values().filter(|&&t0| t0 >= warm && t0 < end) {
                    latency.record(u64::try_from((now - t0).as_micros())?.max(1))?;
                }
                break;
            };
            let (seq, stored) = seq?;
            let now = Instant::now();
            let t0 = pending
                .lock()
                .map_err(|_| anyhow::anyhow!("open-loop sender panicked"))?
                .remove(&seq);
            let Some(t0) = t0 else {
                bail!("ack for request {seq}, which is not outstanding");
            };
            let measured = t0 >= warm && t0 < end;
            if !stored {
                if measured {
                    c.refused += s.batch as u64;
                }
                continue;
            }
            c.acked += s.batch as u64;
            if measured {
                latency.record(u64::try_from((now - t0).as_micros())?.max(1))?;
                c.msgs += s.batch as u64;
            }
        }
        drop(sender.await??);
        Ok((c, latency))
    })
}

/// Sends every request on schedule; returns the sending half, which must outlive the acks
/// (dropping a TCP write half shuts the connection's sending side, and some servers then
/// close before answering everything).
async fn send_all<S: Sender>(
    mut tx: S,
    pending: Arc<Mutex<HashMap<u64, Instant>>>,
    start: Instant,
    interval: Duration,
    total: u64,
) -> anyhow::Result<S> {
    for seq in 0..total {
        let due = start + interval.saturating_mul(u32::try_from(seq).unwrap_or(u32::MAX));
        tokio::time::sleep_until(due.into()).await;
        let now = Instant::now();
        let t0 = if now - due > SLACK { due } else { now };
        pending
            .lock()
            .map_err(|_| anyhow::anyhow!("open-loop reader panicked"))?
            .insert(seq, t0);
        tx.send(seq).await?;
    }
    Ok(tx)
}
