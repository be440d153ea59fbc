//! The TTL sweeper: deletes messages whose TTL passed, through the write path, found by the
//! expiry index (no full scan). Only the leader (or a standalone broker) sweeps; every
//! replica's apply tells its dispatcher.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futureq_core::refusal::WriteError;
use futureq_core::EventKey;
use futureq_net::Shutdown;
use futureq_storage::StoreService;

use super::delete_logged;
use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::replication::Replication;

/// Keys per TTL sweep transaction.
pub const SWEEP_BATCH_MAX: usize = 10_000;
/// Why a TTL sweep step failed (retried next interval).
#[derive(Debug, thiserror::Error)]
enum SweepError {
    /// Reading the expiry index.
    #[error("reading expired keys: {0}")]
    Store(futureq_storage::StoreError),
    /// Deleting them.
    #[error("deleting expired keys: {0}")]
    Write(WriteError),
}

impl From<futureq_storage::StoreError> for SweepError {
    fn from(e: futureq_storage::StoreError) -> Self {
        SweepError::Store(e)
    }
}

impl From<WriteError> for SweepError {
    fn from(e: WriteError) -> Self {
        SweepError::Write(e)
    }
}

/// One sweep step: the leader (or the standalone broker) reads expired keys from its store
/// and deletes them through the log (every replica's apply tells its dispatcher). Followers
/// do nothing.
async fn sweep_step(
    repl: &Replication,
    store: &StoreService,
    timeout: Duration,
) -> Result<Vec<EventKey>, SweepError> {
    if !repl.leading() {
        return Ok(Vec::new());
    }
    let s = store.store().clone();
    let now = now_ms();
    let keys = glommio::executor()
        .spawn_blocking(move || s.expired_keys(now, SWEEP_BATCH_MAX))
        .await?;
    if !keys.is_empty() {
        delete_logged(repl.writes(), keys.clone(), Instant::now() + timeout).await?;
    }
    Ok(keys)
}

/// Deletes expired messages every `interval` (expiry index: no full scan) and tells the
/// dispatcher which keys went away. Started as [`super::run`] is.
pub async fn sweep_ttl(
    interval: Duration,
    store: StoreService,
    repl: Arc<Replication>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
    timeout: Duration,
) {
    loop {
        if crate::runtime::sleep_or_shutdown(interval, &shutdown).await {
            return;
        }
        loop {
            let swept = sweep_step(&repl, &store, timeout).await;
            match swept {
                Ok(keys) => {
                    let n = keys.len();
                    if n > 0 {
                        metrics.messages_expired.add(&["sweeper"], n as u64);
                        // The apply hook tells the dispatcher.
                        tracing::info!(target: "ttl_sweeper", expired = n, "deleted expired messages");
                    }
                    if n < SWEEP_BATCH_MAX {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!(target: "ttl_sweeper", error = %e, "TTL sweep failed; retrying next interval");
                    break;
                }
            }
        }
    }
}
