//! Histograms, clocks and the markdown rows every report prints.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;

pub(crate) fn now_us() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros(),
    )
    .unwrap_or(i64::MAX)
}

pub(crate) fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

pub(crate) fn row(name: &str, h: &Histogram<u64>) -> String {
    #[allow(clippy::cast_precision_loss)]
    let ms = |v: u64| v as f64 / 1000.0;
    format!(
        "| {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
        h.len(),
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.9)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max())
    )
}

pub(crate) const HEADER: &str =
    "| series | n | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |\n|---|---|---|---|---|---|---|";

/// What one publishing connection counted.
#[derive(Default)]
pub(crate) struct StreamCounts {
    /// Messages acked in the measured window.
    pub(crate) msgs: u64,
    /// Messages acked in the whole run.
    pub(crate) acked: u64,
    /// Messages of the measured window refused as OVERLOADED (nothing stored; retry hint).
    pub(crate) refused: u64,
}

/// One publishing connection's task: its counts and its latency histogram.
pub(crate) type StreamTask =
    tokio::task::JoinHandle<anyhow::Result<(StreamCounts, Histogram<u64>)>>;

/// What a publish measurement found.
pub(crate) struct PublishOut {
    pub(crate) msgs_per_s: f64,
    /// Per-batch ack latency, µs.
    pub(crate) latency: Histogram<u64>,
    /// Messages acked in the whole run, warm-up included (for costs per message).
    pub(crate) acked: u64,
    /// Messages of the measured window refused as OVERLOADED: the load the system shed.
    pub(crate) refused: u64,
}

/// Joins publishing tasks into one result.
pub(crate) async fn collect(
    tasks: Vec<StreamTask>,
    measure: Duration,
) -> anyhow::Result<PublishOut> {
    let (mut total, mut acked, mut refused, mut latency) = (0, 0, 0, hist());
    for t in tasks {
        let (c, h) = t.await??;
        total += c.msgs;
        acked += c.acked;
        refused += c.refused;
        latency.add(&h)?;
    }
    #[allow(clippy::cast_precision_loss)]
    let msgs_per_s = total as f64 / measure.as_secs_f64();
    Ok(PublishOut {
        msgs_per_s,
        latency,
        acked,
        refused,
    })
}
