//! Opening a node's logs: the Raft configuration, the disk layer (with fault injection in
//! test builds), and the check that the store did not fall behind a purged log.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futureq_storage::log::uring::DmaLogIo;
use futureq_storage::log::LogConfig;
use futureq_storage::Store;
use openraft::SnapshotPolicy;

use super::config::NodeError;
use crate::log_store::LogStore;
use crate::network::SNAPSHOT_RPC_TIMEOUT;

pub(super) fn raft_config(
    cluster: &str,
    rtt: Duration,
    policy: SnapshotPolicy,
    keep: u64,
) -> Result<Arc<openraft::Config>, NodeError> {
    let rtt_ms = u64::try_from(rtt.as_millis()).unwrap_or(u64::MAX).max(1);
    let c = openraft::Config {
        cluster_name: cluster.into(),
        heartbeat_interval: rtt_ms,
        election_timeout_min: 10 * rtt_ms,
        // openraft's leader lease is election_timeout_max: followers refuse votes until it
        // ran out, so a narrow range shortens failover (a candidate that times out early
        // is refused and tries again one timeout later).
        election_timeout_max: 15 * rtt_ms,
        snapshot_policy: policy,
        max_in_snapshot_log_to_keep: keep,
        // Purge as soon as a snapshot covers entries (snapshots are already the batching).
        purge_batch_size: 1,
        install_snapshot_timeout: u64::try_from(SNAPSHOT_RPC_TIMEOUT.as_millis()).unwrap_or(60_000),
        // A candidate first asks whether a quorum would vote for it, without raising its term:
        // a follower whose core stalled past its election timeout on a loaded machine no
        // longer deposes a leader the others still hear (every such term bump made the leader
        // step down: a spurious election under load).
        enable_pre_vote: Some(true),
        // A leader that restarts must not lead its old term again: entries it had sent to
        // followers but not yet fsynced itself are gone from its log, and new entries of the
        // same term would reuse their (term, index) — followers that hold the old ones take
        // the new ones for them, and acked messages are lost (found by the disk-fault test).
        // It rejoins as a follower; leading again takes an election in a higher term.
        enable_leader_restore: Some(false),
        ..Default::default()
    };
    c.validate()
        .map(Arc::new)
        .map_err(|e| NodeError::Raft(e.to_string()))
}

/// The files under the Raft logs: io_uring, with the disk-fault seam in fault-injection
/// builds.
#[cfg(not(feature = "fault-injection"))]
pub(super) type DiskIo = DmaLogIo;
#[cfg(feature = "fault-injection")]
pub(super) type DiskIo = futureq_storage::log::faults::FaultyIo<DmaLogIo>;

fn disk_io(dir: &std::path::Path) -> DiskIo {
    // The trigger is in the Raft data directory (the parent of both log directories).
    #[cfg(feature = "fault-injection")]
    {
        futureq_storage::log::faults::dma_in_dir(dir)
    }
    #[cfg(not(feature = "fault-injection"))]
    DmaLogIo::in_dir(dir.to_path_buf())
}

/// Record bytes of the newest event-shard entries each node keeps in memory: replication and
/// apply read entries right after they were written (16 MiB is more than half a second of
/// entries at 150k msgs/s of 100 B).
pub const EVENT_LOG_CACHE_BYTES: usize = 16 << 20;
/// The same for the metadata group (a few small entries per leadership change).
pub const META_LOG_CACHE_BYTES: usize = 256 << 10;

pub(super) async fn open_log(
    dir: PathBuf,
    (segment_bytes, cache_bytes): (u64, usize),
    hook: futureq_storage::log::segmented::PersistHook,
) -> Result<LogStore<DiskIo>, NodeError> {
    let err = |cause| NodeError::Log {
        path: dir.display().to_string(),
        cause,
    };
    std::fs::create_dir_all(&dir).map_err(err)?;
    let d = dir.clone();
    LogStore::open(
        move || disk_io(&d),
        LogConfig {
            segment_bytes,
            cache_bytes,
        },
        hook,
    )
    .await
    .map_err(err)
}

/// Refuses a store that applied less than the log purged (see [`NodeError::BehindPurge`]):
/// openraft would apply the entries after the purge point over the gap and serve a replica
/// that silently lacks messages.
pub(super) async fn check_not_behind_purge(
    log: &mut LogStore<DiskIo>,
    store: &Store,
    dir: &std::path::Path,
) -> Result<(), NodeError> {
    use openraft::storage::RaftLogStorage as _;
    let err = |cause| NodeError::Log {
        path: dir.display().to_string(),
        cause,
    };
    let purged = log
        .get_log_state()
        .await
        .map_err(err)?
        .last_purged_log_id
        .map_or(0, |l| l.index);
    let s = store.clone();
    let applied = glommio::executor()
        .spawn_blocking(move || s.applied())
        .await
        .map_err(|e| err(io::Error::other(e.to_string())))?
        .map_or(0, |(i, _)| i);
    if purged > 0 && applied < purged {
        return Err(NodeError::BehindPurge {
            applied,
            purged,
            dir: dir.display().to_string(),
        });
    }
    Ok(())
}

/// Record bytes of the event shard's log past which a node snapshots and purges it
/// ([`bound_log_bytes`]); `cluster.raft.snapshotEntries` counts entries, and a coalesced entry
/// can be megabytes.
pub const EVENT_LOG_BYTES_MAX: u64 = 512 << 20;
/// How often [`bound_log_bytes`] looks at the log.
const LOG_BYTES_CHECK: Duration = Duration::from_millis(500);

/// Keeps the event log within `max` record bytes (plus a segment, the purge granularity):
/// past it, the newest `max / 2` bytes are kept and what is older is purged once a snapshot
/// covers it (a snapshot is built first when none does). A follower that is further behind
/// gets a snapshot instead of the log, as with the entry policy.
pub(super) async fn bound_log_bytes(
    raft: super::config::EventRaft,
    log: LogStore<DiskIo>,
    max: u64,
    stop: futureq_net::Shutdown,
) {
    use openraft_rt::watch::WatchReceiver as _;
    loop {
        let tick = async {
            glommio::timer::sleep(LOG_BYTES_CHECK).await;
            true
        };
        let stopped = async {
            stop.wait().await;
            false
        };
        if !futures_lite::future::or(stopped, tick).await {
            return;
        }
        let bytes = log.record_bytes();
        if bytes <= max {
            continue;
        }
        let Some(upto) = log
            .newest_within(max / 2)
            .and_then(|first| first.checked_sub(1))
        else {
            continue;
        };
        let (applied, snapshot, purged) = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            let index = |l: Option<&crate::codec::RaftLogId>| l.map_or(0, |l| l.index);
            (
                index(m.last_applied.as_ref()),
                index(m.snapshot.as_ref()),
                index(m.purged.as_ref()),
            )
        };
        tracing::debug!(target: "raft", bytes, max, upto, applied, snapshot, purged, "event log past its byte bound");
        // Purge what the snapshot covers now, and ask for a newer snapshot when it does not
        // cover all of it (when snapshots take longer than half the bound takes to write, each
        // one still lets the log go up to where it reached).
        let mut result = Ok(());
        if purged < upto.min(snapshot) {
            result = raft.trigger().purge_log(upto.min(snapshot)).await;
        }
        if result.is_ok() && snapshot < upto && applied > snapshot {
            result = raft.trigger().snapshot().await;
        }
        if let Err(e) = result {
            tracing::debug!(target: "raft", error = %e, "the event log's byte bound: raft stopped");
            return;
        }
    }
}
