//! openraft's `RaftLogStorage` over our segmented log (`futureq_storage::log`).
//!
//! - `append` returns as soon as the entries are queued; the log's flusher task makes whatever
//!   was appended meanwhile durable and only then fires openraft's `IOFlushed` callback.
//! - The vote and the last purged log id live in their own two-slot files, fsynced before the
//!   call returns.
//! - Entries at or below the purge marker are never returned, even while their segment is
//!   still on disk.

use std::cell::RefCell;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::rc::Rc;

use futureq_storage::log::io::LogIo;
use futureq_storage::log::vote::VoteFile;
use futureq_storage::log::{Log, LogConfig, LogIndex, Term};
use futures::StreamExt;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;

use crate::codec::{
    decode_entry, decode_log_id, decode_vote, encode_entry, encode_log_id, encode_vote, RaftLogId,
};
use crate::types::{Entry, TypeConfig, Vote};

/// Name of the purge-marker file.
pub const PURGED_FILE: &str = "purged";
/// Name of the vote file (the storage log's vote file, also the Raft vote's home).
pub use futureq_storage::log::vote::VOTE_FILE;

/// Most record bytes the state machine's entry stream reads at a time (see
/// [`LogStore::entries_stream`]); one entry larger than this is read alone.
pub const APPLY_READ_BYTES: usize = 8 << 20;

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

struct Shared<I: LogIo> {
    log: Log<I>,
    vote: VoteFile<I>,
    /// The saved vote (what the vote file holds).
    vote_value: RefCell<Option<Vote>>,
    purged_file: VoteFile<I>,
    purged: RefCell<Option<RaftLogId>>,
    /// One purge's file removals at a time: each may hold a blocking thread for seconds (a
    /// directory fsync), and the broker's few are also the log's and the store's.
    removing: glommio::sync::Semaphore,
    /// Dropped with the last handle: stops the flusher.
    _stop: futures::channel::oneshot::Sender<()>,
}

/// The log store (cheap to clone; every clone shares the log).
pub struct LogStore<I: LogIo + 'static> {
    shared: Rc<Shared<I>>,
}

impl<I: LogIo + 'static> Clone for LogStore<I> {
    fn clone(&self) -> Self {
        LogStore {
            shared: Rc::clone(&self.shared),
        }
    }
}

impl<I: LogIo + 'static> LogStore<I> {
    /// Opens the log (recovering it) and starts its flusher on the current glommio executor.
    /// `make_io` gives each file set its own handle on the same directory.
    ///
    /// # Errors
    /// Recovery or I/O failure.
    pub async fn open(
        make_io: impl Fn() -> I,
        cfg: LogConfig,
        on_persisted: futureq_storage::log::segmented::PersistHook,
    ) -> io::Result<Self> {
        // The purge marker first: segments a purge left behind (their files go in the
        // background) are dropped before the log's scan, which would take a gap after them
        // for lost entries.
        let (purged_file, purged) = VoteFile::open(make_io(), PURGED_FILE)
            .await
            .map_err(io_err)?;
        let purged = match purged {
            Some(b) => decode_log_id(&b).map_err(io_err)?,
            None => None,
        };
        let log = Log::open_purged(
            make_io(),
            cfg,
            Some(on_persisted),
            purged.map(|p| LogIndex(p.index)),
        )
        .await
        .map_err(io_err)?;
        let (vote, saved) = VoteFile::open(make_io(), VOTE_FILE).await.map_err(io_err)?;
        let vote_value = RefCell::new(saved.map(|b| decode_vote(&b)).transpose().map_err(io_err)?);
        if let Some(p) = purged {
            // A purge a crash cut short (the marker is saved first) is finished: the log
            // never reports a last entry below what it purged.
            log.purge(LogIndex(p.index)).await.map_err(io_err)?;
        }
        let (stop, stopped) = futures::channel::oneshot::channel::<()>();
        let shared = Rc::new(Shared {
            log,
            vote,
            vote_value,
            purged_file,
            purged: RefCell::new(purged),
            removing: glommio::sync::Semaphore::new(1),
            _stop: stop,
        });
        let weak = Rc::downgrade(&shared);
        glommio::spawn_local(async move {
            let Some(s) = weak.upgrade() else { return };
            // The task holds a strong handle only while it runs; `stopped` fires when every
            // LogStore is gone (its sender is dropped).
            let s2 = Rc::clone(&s);
            drop(s);
            // Beside the flusher: a durable mark left behind by a burst that went idle is
            // saved within MARK_INTERVAL, so recovery refuses (not cuts) damage there.
            let marks = async {
                loop {
                    glommio::timer::sleep(futureq_storage::log::segmented::MARK_INTERVAL).await;
                    if s2.log.mark_lags() {
                        if let Err(e) = s2.log.save_mark().await {
                            tracing::warn!(target: "raft.log", error = %e, "saving the durable mark failed");
                        }
                    }
                }
            };
            s2.log
                .run_flusher(
                    async {
                        futures::future::select(std::pin::pin!(stopped), std::pin::pin!(marks))
                            .await;
                    },
                    glommio::timer::sleep,
                )
                .await;
        })
        .detach();
        Ok(LogStore { shared })
    }

    /// Bytes of the records in the log (see [`futureq_storage::log::Log::record_bytes`]).
    #[must_use]
    pub fn record_bytes(&self) -> u64 {
        self.shared.log.record_bytes()
    }

    /// The first index of the newest records within `bytes` (see
    /// [`futureq_storage::log::Log::newest_within`]).
    #[must_use]
    pub fn newest_within(&self, bytes: u64) -> Option<u64> {
        self.shared.log.newest_within(bytes).map(|LogIndex(i)| i)
    }

    async fn last_log_id(&self) -> io::Result<Option<RaftLogId>> {
        let Some((_, last)) = self.shared.log.bounds() else {
            return Ok(*self.shared.purged.borrow());
        };
        let rec = self
            .shared
            .log
            .read(last)
            .await
            .map_err(io_err)?
            .ok_or_else(|| io_err("last entry vanished"))?;
        Ok(Some(
            decode_entry(&rec.payload.into()).map_err(io_err)?.log_id,
        ))
    }
}

impl<I: LogIo + 'static> RaftLogReader<TypeConfig> for LogStore<I> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        self.read_entries(range, usize::MAX).await
    }

    /// What replication reads: at most [`crate::network::APPEND_BYTES_MAX`] record bytes (at
    /// least one entry), what one AppendEntries frame carries. Without the bound openraft
    /// reads `max_payload_entries` entries (300 coalesced entries can be a GB) to send a
    /// frame's worth.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, io::Error> {
        self.read_entries(start..end, crate::network::APPEND_BYTES_MAX)
            .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(*self.shared.vote_value.borrow())
    }

    /// What the state machine applies from: the range read [`APPLY_READ_BYTES`] of records at
    /// a time, as the stream is consumed. openraft's default reads the whole range into one
    /// `Vec` first: a node restarting behind a long log (up to the log's byte bound) would
    /// hold all of it at once.
    async fn entries_stream<RB>(
        &mut self,
        range: RB,
    ) -> impl futures::Stream<Item = Result<Entry, io::Error>> + OptionalSend
    where
        RB: RangeBounds<u64> + Clone + Debug + OptionalSend,
    {
        let start = match range.start_bound() {
            Bound::Included(s) => Some(*s),
            Bound::Excluded(s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(e) => Some(*e),
            Bound::Excluded(e) => e.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        let next = start.zip(end).filter(|(s, e)| s <= e);
        let store = self.clone();
        futures::stream::unfold(next, move |next| {
            let store = store.clone();
            async move {
                let (from, to) = next?;
                let chunk = match store.read_entries(from..=to, APPLY_READ_BYTES).await {
                    Ok(chunk) => chunk,
                    Err(e) => return Some((vec![Err(e)], None)),
                };
                // The range past the log's last entry ends the stream; a gap inside it (an
                // entry purged or missing) is an error, never a silent skip.
                let purged = store.shared.purged.borrow().map_or(0, |p| p.index + 1);
                let (first, last) = match (chunk.first(), chunk.last()) {
                    (Some(f), Some(l)) => (Some(f.log_id.index), l.log_id.index),
                    _ if from >= purged
                        && store.shared.log.bounds().is_none_or(|(_, l)| from > l.0) =>
                    {
                        return None
                    }
                    _ => (None, 0),
                };
                if first != Some(from) || last < from {
                    let e = io_err(format!(
                        "log entry {from} is not in the log (the read started at {first:?})"
                    ));
                    return Some((vec![Err(e)], None));
                }
                let rest = last.checked_add(1).filter(|n| *n <= to).map(|n| (n, to));
                Some((chunk.into_iter().map(Ok).collect::<Vec<_>>(), rest))
            }
        })
        .flat_map(futures::stream::iter)
    }
}

impl<I: LogIo + 'static> LogStore<I> {
    /// The entries of `range` that are in the log, stopping once `max_bytes` record bytes
    /// were read (at least one entry).
    async fn read_entries<RB: RangeBounds<u64>>(
        &self,
        range: RB,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, io::Error> {
        let Some((LogIndex(first), LogIndex(last))) = self.shared.log.bounds() else {
            return Ok(Vec::new());
        };
        let purged = self.shared.purged.borrow().map_or(0, |p| p.index + 1);
        let start = match range.start_bound() {
            Bound::Included(s) => *s,
            Bound::Excluded(s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        }
        .max(first)
        .max(purged);
        let end = match range.end_bound() {
            Bound::Included(e) => *e,
            Bound::Excluded(e) => e.saturating_sub(1),
            Bound::Unbounded => u64::MAX,
        }
        .min(last);
        if matches!(range.end_bound(), Bound::Excluded(0)) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let (mut i, mut bytes) = (start, 0usize);
        while i <= end {
            match self.shared.log.read(LogIndex(i)).await.map_err(io_err)? {
                // At least one entry; none that would take the read past `max_bytes`.
                Some(r) if !out.is_empty() && bytes + r.payload.len() > max_bytes => break,
                Some(r) => {
                    bytes += r.payload.len();
                    out.push(decode_entry(&r.payload.into()).map_err(io_err)?);
                }
                None => break,
            }
            i += 1;
        }
        Ok(out)
    }
}

impl<I: LogIo + 'static> RaftLogStorage<TypeConfig> for LogStore<I> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged_log_id = *self.shared.purged.borrow();
        Ok(LogState {
            last_purged_log_id,
            last_log_id: self.last_log_id().await?,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.shared
            .vote
            .save(&encode_vote(vote))
            .await
            .map_err(io_err)?;
        *self.shared.vote_value.borrow_mut() = Some(*vote);
        Ok(())
    }

    async fn append<It>(
        &mut self,
        entries: It,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        It: IntoIterator<Item = Entry> + OptionalSend,
        It::IntoIter: OptionalSend,
    {
        let records: Vec<(Term, LogIndex, Vec<u8>)> = entries
            .into_iter()
            .map(|e| {
                let (term, index) = (Term(e.log_id.leader_id.term), LogIndex(e.log_id.index));
                (term, index, encode_entry(&e))
            })
            .collect();
        tracing::trace!(target: "raft.log", first = ?records.first().map(|r| r.1), n = records.len(), bounds = ?self.shared.log.bounds(), "append");
        self.shared
            .log
            .append(
                records,
                Box::new(move |r| callback.io_completed(r.map_err(io::Error::other))),
            )
            .map_err(io_err)
    }

    async fn truncate_after(&mut self, last_log_id: Option<RaftLogId>) -> Result<(), io::Error> {
        tracing::trace!(target: "raft.log", ?last_log_id, bounds = ?self.shared.log.bounds(), "truncate_after");
        let from = match last_log_id {
            Some(id) => LogIndex(id.index + 1),
            None => match self.shared.log.bounds() {
                Some((first, _)) => first,
                None => return Ok(()),
            },
        };
        self.shared.log.truncate(from).await.map_err(io_err)
    }

    async fn purge(&mut self, log_id: RaftLogId) -> Result<(), io::Error> {
        tracing::trace!(target: "raft.log", ?log_id, bounds = ?self.shared.log.bounds(), "purge");
        // Persist the marker first: after a crash nothing at or below it is served again.
        self.shared
            .purged_file
            .save(&encode_log_id(Some(&log_id)))
            .await
            .map_err(io_err)?;
        *self.shared.purged.borrow_mut() = Some(log_id);
        if self.shared.log.has_pending() {
            self.shared.log.flush().await.map_err(io_err)?;
        }
        let doomed = self
            .shared
            .log
            .forget(LogIndex(log_id.index))
            .await
            .map_err(io_err)?;
        if !doomed.is_empty() {
            // openraft awaits a purge in its core, where AppendEntries (heartbeats too) are
            // answered: the files go in the background. Each removal is a directory fsync,
            // which can wait behind seconds of the file system's dirty data (a follower that
            // answered nothing meanwhile let its leader's lease lapse, issue 29). A crash
            // before they are gone leaves segments the next open drops
            // (`Log::open_purged`).
            let shared = Rc::clone(&self.shared);
            glommio::spawn_local(async move {
                let Ok(_one) = shared.removing.acquire_permit(1).await else {
                    return;
                };
                if let Err(e) = shared.log.remove_files(&doomed).await {
                    tracing::warn!(target: "raft.log", error = %e, "removing purged log segments failed; the next start removes them");
                }
            })
            .detach();
        }
        Ok(())
    }
}
