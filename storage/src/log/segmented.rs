//! The segmented log: append (returns at once), group-committed flush, reads, truncate,
//! purge, and recovery on open.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};

use futures::StreamExt as _;

use super::error::LogError;
use super::format::{decode, encode, Decoded, LogIndex, Record, Term, BLOCK, HEADER_LEN};
use super::io::LogIo;
use super::vote::{newest_slot, slot_image};

/// How long [`Log::run_flusher`] waits before it tries again a flush that found no space for
/// a new segment.
pub const NO_SPACE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Log configuration.
#[derive(Debug, Clone, Copy)]
pub struct LogConfig {
    /// Segment size in bytes (a multiple of [`BLOCK`]).
    pub segment_bytes: u64,
    /// Most record bytes of the newest flushed entries kept in memory for reads (0: none).
    /// Replication and apply read entries right after they were written; without the cache
    /// each such read is a direct read from the disk.
    pub cache_bytes: usize,
}

/// The segment size of both logs (the journal's and the Raft groups'): preallocated and
/// zero-filled; a purge keeps the newest.
pub const SEGMENT_BYTES: u64 = 64 << 20;
// A command at the API's entry limit fits in one record of a segment, with room for the
// envelope a Raft entry adds (openraft's entry, a few dozen bytes).
const _: () = assert!(
    (futureq_core::command::ENTRY_BYTES_MAX + super::format::HEADER_LEN + 4096) as u64
        <= SEGMENT_BYTES - super::format::BLOCK
);

/// A sensible [`LogConfig::cache_bytes`]: enough for the entries in flight at full load.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// Most bytes of one write of a flush (a multiple of [`BLOCK`]). A flush copies its records
/// into block-aligned buffers on the reactor: at 53 MB in one buffer (a leader behind its
/// disk), the copy held the reactor for 175 ms and the followers elected another leader
/// (issue 29). In pieces, the reactor runs between them.
pub const WRITE_BYTES_MAX: usize = 1 << 20;
const _: () = assert!((WRITE_BYTES_MAX as u64).is_multiple_of(BLOCK));

/// Writes of one flush in flight at once: pieces of at most [`WRITE_BYTES_MAX`], block-aligned
/// and not overlapping, so they may complete (and reach the disk) in any order; nothing is
/// reported durable before all are written and synced.
pub const WRITES_IN_FLIGHT: usize = 4;

/// A write of a flush in flight.
type Write<'a> = futures::future::LocalBoxFuture<'a, std::io::Result<()>>;

/// The writes of one flush in flight, at most [`WRITES_IN_FLIGHT`], and the first error.
#[derive(Default)]
struct Writes<'a> {
    in_flight: futures::stream::FuturesUnordered<Write<'a>>,
    failed: Option<std::io::Error>,
}

impl<'a> Writes<'a> {
    /// Starts `write` (polled once, so that its I/O is queued), first waiting while the most are in
    /// flight, and takes those done; then lets the executor run its other tasks once, so that
    /// the pieces' copies leave room between them (heartbeats, the Raft core's messages).
    async fn start(&mut self, write: Write<'a>) {
        while self.in_flight.len() >= WRITES_IN_FLIGHT {
            let done = self.in_flight.next().await;
            self.take(done);
        }
        self.in_flight.push(write);
        while let std::task::Poll::Ready(Some(done)) = futures::poll!(self.in_flight.next()) {
            self.take(Some(done));
        }
        super::io::yield_once().await;
    }

    fn take(&mut self, done: Option<std::io::Result<()>>) {
        if let Some(Err(e)) = done {
            self.failed.get_or_insert(e);
        }
    }

    /// Waits for every write in flight; the first error of all.
    async fn finish(mut self) -> std::io::Result<()> {
        while let Some(done) = self.in_flight.next().await {
            self.take(Some(done));
        }
        self.failed.map_or(Ok(()), Err)
    }
}

/// What one flush writes to one segment, from `start` (block-aligned): `head` (the segment's
/// last partial block, rewritten), then the records `pending[records]`, `len` bytes in all,
/// then zeros to the next block.
struct SegmentWrite {
    name: String,
    create: bool,
    start: u64,
    head: Vec<u8>,
    records: std::ops::Range<usize>,
    len: u64,
}

/// Sees each entry's payload once its flush made it durable (the leader-persist hook).
pub type PersistHook = Box<dyn Fn(&[u8])>;

/// Called once per flushed batch with its outcome (openraft's "IO flushed" callback).
pub type Flushed = Box<dyn FnOnce(Result<(), FlushError>)>;

/// The write or fsync of a flush failed (the log is poisoned); every waiting callback gets
/// the same error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("log write or fsync failed: {0}")]
pub struct FlushError(pub std::sync::Arc<std::io::Error>);

#[derive(Debug)]
struct Segment {
    name: String,
    first: u64,
    /// End of data placed in this segment (flushed or pending).
    end: u64,
    /// End of durable data.
    flushed_end: u64,
    /// Bytes `[floor(flushed_end), flushed_end)`: the partial block each flush rewrites.
    tail: Vec<u8>,
    /// Whether the file exists yet.
    created: bool,
}

struct Pending {
    segment: u64,
    index: u64,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct State {
    segments: Vec<Segment>,
    /// index → (segment first index, offset, length) of every record.
    locs: BTreeMap<u64, (u64, u64, usize)>,
    pending: Vec<Pending>,
    /// The newest flushed records `(index, record bytes)`, contiguous and ascending, at most
    /// `cache_bytes` of them; every index in it is also in `locs` (truncate and purge drop
    /// what they remove from the log).
    cache: VecDeque<(u64, Vec<u8>)>,
    cache_bytes: usize,
    callbacks: Vec<Flushed>,
    poisoned: bool,
}

impl State {
    fn cached(&self, index: u64) -> Option<&[u8]> {
        let front = self.cache.front()?.0;
        let (i, bytes) = self
            .cache
            .get(usize::try_from(index.checked_sub(front)?).ok()?)?;
        (*i == index).then_some(bytes.as_slice())
    }

    fn cache_push(&mut self, index: u64, bytes: Vec<u8>, limit: usize) {
        if self.cache.back().is_some_and(|(last, _)| last + 1 != index) {
            self.cache_clear();
        }
        self.cache_bytes += bytes.len();
        self.cache.push_back((index, bytes));
        while self.cache_bytes > limit {
            match self.cache.pop_front() {
                Some((_, b)) => self.cache_bytes -= b.len(),
                None => break,
            }
        }
    }

    /// Drops cached records with index `>= from` (truncate).
    fn cache_truncate(&mut self, from: u64) {
        while self.cache.back().is_some_and(|(i, _)| *i >= from) {
            if let Some((_, b)) = self.cache.pop_back() {
                self.cache_bytes -= b.len();
            }
        }
    }

    /// Drops cached records with index `< below` (purge).
    fn cache_purge(&mut self, below: u64) {
        while self.cache.front().is_some_and(|(i, _)| *i < below) {
            if let Some((_, b)) = self.cache.pop_front() {
                self.cache_bytes -= b.len();
            }
        }
    }

    fn cache_clear(&mut self) {
        self.cache.clear();
        self.cache_bytes = 0;
    }
}

fn floor(x: u64) -> u64 {
    x - x % BLOCK
}

fn ceil(x: u64) -> u64 {
    x.div_ceil(BLOCK) * BLOCK
}

/// The durable-mark file: two 4 KiB slots (see [`super::vote`]) holding the last index
/// known fsynced, + 1 (0 = none), as u64 LE. Saved at most every [`MARK_INTERVAL`] by a
/// flush (under load beside the next group's write, naming the groups before it) or by an
/// idle saver, so it lags the log a little: damage after it is taken for a torn write, which
/// may cut acknowledged entries of the last interval. Lowered before a truncate removes
/// entries below it, cleared before a truncate or a purge empties the log.
pub const MARK_FILE: &str = "durable.mark";
/// Least time between two saves of the durable mark after flushes.
pub const MARK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

fn decode_mark(v: &[u8]) -> Option<u64> {
    let b: [u8; 8] = v.get(..8)?.try_into().ok()?;
    u64::from_le_bytes(b).checked_sub(1)
}

/// Writes `mark` into the slot of save `seq` of [`MARK_FILE`] and makes it durable.
async fn write_mark_file(io: &impl LogIo, seq: u64, mark: Option<u64>) -> Result<(), LogError> {
    let value = mark.map_or(0, |m| m.saturating_add(1)).to_le_bytes();
    io.write_at(MARK_FILE, (seq % 2) * BLOCK, slot_image(seq, &value))
        .await?;
    io.sync_writes(MARK_FILE).await?;
    Ok(())
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.log")
}

/// The log. Single-threaded: it lives on the Raft core.
///
/// # Invariants
/// - Indexes are contiguous from the first kept index to the last.
/// - A segment named `N` holds entries from index `N` on; an empty log has no segment, so
///   its next append, at any index, starts a segment named after that index (a segment left
///   behind would take that entry at its offset 0 under the wrong name, refused or cut at the
///   next open). Enforced by [`Log::truncate`], [`Log::purge`] and [`Log::open`].
/// - A flush callback and the persist hook run only after the flush (the `O_DSYNC` write, or
///   the write and its fsync) covering the entry.
/// - After a failed fsync every later append and flush fails (`Poisoned`).
pub struct Log<I: LogIo> {
    io: I,
    cfg: LogConfig,
    st: RefCell<State>,
    /// `None`: nobody listens (the journal).
    on_persisted: Option<PersistHook>,
    /// Notified by every append (wakes the flusher).
    appended: event_listener::Event,
    /// A flush is writing: another one waits for it (one writer per segment tail at a time).
    flushing: std::cell::Cell<bool>,
    flushed: event_listener::Event,
    /// The durable mark as saved in [`MARK_FILE`] (never above what is on disk).
    mark: std::cell::Cell<Option<u64>>,
    mark_seq: std::cell::Cell<u64>,
    mark_saved_at: std::cell::Cell<Option<std::time::Instant>>,
    /// When the last flush ended (the idle mark saver waits for a quiet log).
    flushed_at: std::cell::Cell<Option<std::time::Instant>>,
    /// The flusher waits for space for the next segment.
    waiting_for_space: std::cell::Cell<bool>,
}

/// Holds the log's write side (see [`Log::exclusive`]); releases it on drop, also when the
/// holding future is cancelled.
struct WriteGuard<'a, I: LogIo>(&'a Log<I>);

impl<I: LogIo> Drop for WriteGuard<'_, I> {
    fn drop(&mut self) {
        self.0.flushing.set(false);
        self.0.flushed.notify(usize::MAX);
    }
}

impl<I: LogIo> Log<I> {
    /// Opens the log, scanning every segment. The durable mark ([`MARK_FILE`]: an index
    /// every entry up to which was fsynced) decides what a damaged record means:
    /// - before the mark, it is corruption of acknowledged data: the log refuses to open
    ///   ([`LogError::Corrupt`]), also for entries missing at the end or a zeroed block;
    /// - after it, it is a torn tail: an O_DIRECT flush that did not finish may have
    ///   persisted later blocks and not earlier ones, so everything from the first bad
    ///   record on is cut durably (zeroed, later segments removed), however valid it looks.
    ///
    /// `on_persisted` sees each entry's payload after the fsync that made it durable.
    ///
    /// # Errors
    /// I/O failure or [`LogError::Corrupt`].
    pub async fn open(io: I, cfg: LogConfig, on_persisted: PersistHook) -> Result<Self, LogError> {
        Self::open_with(io, cfg, Some(on_persisted), None).await
    }

    /// [`Log::open`] (with a persist hook or none) of a log purged up to `purged` (its
    /// owner's durable record): first, the files of segments wholly at or below it (the next
    /// segment starts at or below `purged + 1`; never the last one) are removed. Purges
    /// remove their files after the log forgot them (see [`Log::forget`]), so a crash or a
    /// failed removal can leave some of them behind, also with a later one gone: a gap the
    /// scan would take for lost entries.
    ///
    /// # Errors
    /// As [`Log::open`].
    pub async fn open_purged(
        io: I,
        cfg: LogConfig,
        on_persisted: Option<PersistHook>,
        purged: Option<LogIndex>,
    ) -> Result<Self, LogError> {
        Self::open_with(io, cfg, on_persisted, purged.map(|LogIndex(p)| p)).await
    }

    async fn open_with(
        io: I,
        cfg: LogConfig,
        on_persisted: Option<PersistHook>,
        purged: Option<u64>,
    ) -> Result<Self, LogError> {
        assert!(
            cfg.segment_bytes.is_multiple_of(BLOCK) && cfg.segment_bytes >= 2 * BLOCK,
            "segment size"
        );
        let (mut mark_seq, mut mark) = read_mark(&io).await?;
        let mut names = segment_names(&io).await?;
        if let Some(p) = purged {
            drop_purged(&io, &mut names, p).await?;
        }
        let mut st = State::default();
        let mut expected: Option<u64> = None;
        // Entries up to `mark` were fsynced: damage there is corruption, not a torn write.
        let torn_ok = |st: &State| -> bool {
            let Some(m) = mark else { return true };
            match (st.locs.keys().next(), st.locs.keys().next_back()) {
                (Some(first), Some(last)) => *last >= m || *first > m,
                _ => names.first().is_some_and(|(f, _)| *f > m),
            }
        };
        let mut cut = false;
        for (first, name) in &names {
            if cut {
                // After a torn point: nothing here was acknowledged.
                tracing::warn!(target: "storage.recovery", segment = %name, "removing a segment after the torn tail");
                io.remove(name).await?;
                continue;
            }
            // One segment in memory at a time.
            let len = io.len(name).await?;
            let img = io
                .read_at(name, 0, usize::try_from(len).unwrap_or(usize::MAX))
                .await?;
            let (offset, next, problem) = if expected.is_some_and(|e| e != *first) {
                (0, *first, Some("segment does not follow the previous one"))
            } else {
                scan_segment(&img, *first, expected.unwrap_or(*first), &mut st.locs)
            };
            if let Some(reason) = problem {
                if !torn_ok(&st) {
                    return Err(LogError::Corrupt {
                        segment: name.clone(),
                        offset: offset as u64,
                        reason,
                    });
                }
                tracing::warn!(target: "storage.recovery", segment = %name, offset, reason, "cutting torn tail");
                cut_torn_tail(&io, name, &img, offset).await?;
                cut = true;
                if offset == 0 {
                    // Nothing of this segment survives.
                    io.remove(name).await?;
                    continue;
                }
            }
            expected = Some(next);
            let end = offset as u64;
            st.segments.push(Segment {
                name: name.clone(),
                first: *first,
                end,
                flushed_end: end,
                tail: img[floor(end) as usize..offset].to_vec(),
                created: true,
            });
        }
        if !torn_ok(&st) {
            return Err(LogError::Corrupt {
                segment: names
                    .last()
                    .map_or_else(|| "(none)".to_owned(), |(_, n)| n.clone()),
                offset: st.segments.last().map_or(0, |s| s.end),
                reason: "entries up to the durable mark are missing",
            });
        }
        // Empty trailing segments (a crash right after a roll) carry nothing: drop them; a
        // log without entries keeps no segment at all (see the invariants), nor a mark.
        // (A mark with no segment left at all was refused above, unless the torn cut just
        // removed them: it must go too.)
        if st.locs.is_empty() && mark.is_some() {
            write_mark_file(&io, mark_seq + 1, None).await?;
            mark_seq += 1;
            mark = None;
        }
        drop_empty_tail(&io, &mut st).await?;
        // Records beyond the durable mark may have been written by a process that died
        // before their fsync: they are made durable before the log reports them (Raft counts
        // what a log holds as persisted, and the durable mark may name them from the first
        // flush on).
        sync_beyond_mark(&io, &st, mark).await?;
        Ok(Self::recovered(io, cfg, st, on_persisted, (mark, mark_seq)))
    }

    /// The log as recovery left it: its segments and records, and the durable mark.
    fn recovered(
        io: I,
        cfg: LogConfig,
        st: State,
        on_persisted: Option<PersistHook>,
        (mark, mark_seq): (Option<u64>, u64),
    ) -> Self {
        Log {
            io,
            cfg,
            st: RefCell::new(st),
            on_persisted,
            appended: event_listener::Event::new(),
            flushing: std::cell::Cell::new(false),
            flushed: event_listener::Event::new(),
            mark: std::cell::Cell::new(mark),
            mark_seq: std::cell::Cell::new(mark_seq),
            mark_saved_at: std::cell::Cell::new(None),
            flushed_at: std::cell::Cell::new(None),
            waiting_for_space: std::cell::Cell::new(false),
        }
    }

    /// The durable mark as saved (see [`MARK_FILE`]).
    #[must_use]
    pub fn durable_mark(&self) -> Option<LogIndex> {
        self.mark.get().map(LogIndex)
    }

    /// Whether the log is quiet (nothing waits for a flush, none is running, and none ended
    /// within [`MARK_INTERVAL`]) with entries flushed beyond the saved durable mark: then
    /// [`Log::save_mark`] is due (after a burst the flusher goes idle and saves nothing
    /// more). Under load the flusher saves the mark itself; a save from outside would hold
    /// the next group behind its fsync.
    #[must_use]
    pub fn mark_lags(&self) -> bool {
        !self.has_pending()
            && !self.flushing.get()
            && self
                .flushed_at
                .get()
                .is_none_or(|t| t.elapsed() >= MARK_INTERVAL)
            && self.last_flushed() > self.mark.get()
    }

    /// Saves the durable mark now: the last flushed index.
    ///
    /// # Errors
    /// I/O failure.
    pub async fn save_mark(&self) -> Result<(), LogError> {
        let _io = self.exclusive().await;
        let last = self.last_flushed();
        self.write_mark(last).await
    }

    /// The last index whose record is on disk (flushed), if any.
    fn last_flushed(&self) -> Option<u64> {
        let st = self.st.borrow();
        let last = *st.locs.keys().next_back()?;
        match st.pending.first() {
            Some(p) => p.index.checked_sub(1).filter(|i| st.locs.contains_key(i)),
            None => Some(last),
        }
    }

    /// Writes the mark file (two slots, fsynced). Callers hold the write side.
    async fn write_mark(&self, mark: Option<u64>) -> Result<(), LogError> {
        if self.mark.get() == mark && self.mark_seq.get() > 0 {
            return Ok(());
        }
        let seq = self.mark_seq.get() + 1;
        write_mark_file(&self.io, seq, mark).await?;
        self.mark_seq.set(seq);
        self.mark.set(mark);
        self.mark_saved_at.set(Some(std::time::Instant::now()));
        Ok(())
    }

    /// Bytes of the records in the log (flushed or pending): what its segments hold.
    #[must_use]
    pub fn record_bytes(&self) -> u64 {
        self.st
            .borrow()
            .locs
            .values()
            .map(|&(_, _, len)| len as u64)
            .sum()
    }

    /// The first index of the newest records whose bytes add up to at most `bytes` (the last
    /// record counts even when it alone is larger); `None` for an empty log. Purging up to
    /// the index before it leaves at most `bytes` of records, plus what shares a segment with
    /// them ([`Log::purge`] drops whole segments).
    #[must_use]
    pub fn newest_within(&self, bytes: u64) -> Option<LogIndex> {
        let st = self.st.borrow();
        let mut total = 0u64;
        let mut first = None;
        for (&index, &(_, _, len)) in st.locs.iter().rev() {
            total += len as u64;
            if total > bytes && first.is_some() {
                break;
            }
            first = Some(LogIndex(index));
        }
        first
    }

    /// First and last index in the log, if any.
    #[must_use]
    pub fn bounds(&self) -> Option<(LogIndex, LogIndex)> {
        let st = self.st.borrow();
        Some((
            LogIndex(*st.locs.keys().next()?),
            LogIndex(*st.locs.keys().next_back()?),
        ))
    }

    /// Appends entries `(term, index, payload)` and returns at once; `done` runs after the
    /// fsync that covers them (or with the error that poisoned the log).
    ///
    /// # Errors
    /// [`LogError::Poisoned`], [`LogError::Gap`], [`LogError::TooLarge`]; nothing is
    /// appended then.
    pub fn append<P: AsRef<[u8]>>(
        &self,
        entries: Vec<(Term, LogIndex, P)>,
        done: Flushed,
    ) -> Result<(), LogError> {
        let mut st = self.st.borrow_mut();
        if st.poisoned {
            return Err(LogError::Poisoned);
        }
        let mut last = st.locs.keys().next_back().copied();
        for (_, LogIndex(index), payload) in &entries {
            if let Some(l) = last {
                if *index != l + 1 {
                    return Err(LogError::Gap {
                        last: LogIndex(l),
                        got: LogIndex(*index),
                    });
                }
            }
            let len = payload.as_ref().len();
            if (HEADER_LEN + len) as u64 > self.cfg.segment_bytes - BLOCK {
                return Err(LogError::TooLarge(len));
            }
            last = Some(*index);
        }
        for (term, log_index, payload) in entries {
            let payload = payload.as_ref();
            let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
            encode(&mut bytes, term, log_index, payload);
            let LogIndex(index) = log_index;
            let n = bytes.len() as u64;
            let roll = st
                .segments
                .last()
                .is_none_or(|s| s.end + n > self.cfg.segment_bytes);
            if roll {
                st.segments.push(Segment {
                    name: segment_name(index),
                    first: index,
                    end: 0,
                    flushed_end: 0,
                    tail: Vec::new(),
                    created: false,
                });
            }
            let seg = st.segments.last_mut().expect("present");
            let offset = seg.end;
            seg.end += n;
            let first = seg.first;
            st.locs.insert(index, (first, offset, bytes.len()));
            st.pending.push(Pending {
                segment: first,
                index,
                bytes,
            });
        }
        st.callbacks.push(done);
        drop(st);
        self.appended.notify(1);
        Ok(())
    }

    /// The flusher: whenever entries are pending, flush them all (one durable flush); appends made
    /// while a flush runs go into the next one. A flush that found no space for a new segment
    /// is tried again after `pause(`[`NO_SPACE_RETRY`]`)` (the entries wait: a full disk
    /// stalls this log's writes, it does not stop the node), as long as the entries waiting
    /// take at most a segment's bytes; past that (a Raft leader whose followers commit on
    /// while its own log waits) the log gives up: it is poisoned and every waiter gets the
    /// error, as for any failed write. Returns when the log is poisoned or `stop` resolves.
    pub async fn run_flusher<P: std::future::Future<Output = ()>>(
        &self,
        stop: impl std::future::Future<Output = ()>,
        pause: impl Fn(std::time::Duration) -> P,
    ) {
        let work = async {
            loop {
                while !self.has_pending() {
                    let l = self.appended.listen();
                    if self.has_pending() {
                        break;
                    }
                    l.await;
                }
                match self.flush().await {
                    Ok(()) => {
                        if self.waiting_for_space.replace(false) {
                            tracing::info!(target: "storage.log", "space for the next log segment found: writes go on");
                        }
                    }
                    Err(LogError::NoSpace { segment }) => {
                        if self.pending_bytes() > self.cfg.segment_bytes {
                            self.give_up(&segment);
                            return;
                        }
                        if !self.waiting_for_space.replace(true) {
                            tracing::error!(target: "storage.log", %segment, retry_ms = NO_SPACE_RETRY.as_millis(), "no space left on the device for the next log segment: this log's writes wait until space returns");
                        }
                        pause(NO_SPACE_RETRY).await;
                    }
                    Err(_) => return,
                }
            }
        };
        futures::future::select(std::pin::pin!(work), std::pin::pin!(stop)).await;
    }

    /// True when appended entries wait for a flush.
    #[must_use]
    pub fn has_pending(&self) -> bool {
        !self.st.borrow().callbacks.is_empty()
    }

    /// True while the flusher waits for space for the next segment ([`Log::run_flusher`]).
    #[must_use]
    pub fn waiting_for_space(&self) -> bool {
        self.waiting_for_space.get()
    }

    /// Bytes of the records appended and not yet written.
    fn pending_bytes(&self) -> u64 {
        self.st
            .borrow()
            .pending
            .iter()
            .map(|p| p.bytes.len() as u64)
            .sum()
    }

    /// Stops waiting for space: the log is poisoned and every waiting callback gets ENOSPC.
    fn give_up(&self, segment: &str) {
        let callbacks = {
            let mut st = self.st.borrow_mut();
            st.poisoned = true;
            std::mem::take(&mut st.callbacks)
        };
        self.waiting_for_space.set(false);
        tracing::error!(target: "storage.log", %segment, "no space for the next log segment, and more than a segment of entries waits: log poisoned, no more writes");
        let e = std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::StorageFull));
        for cb in callbacks {
            cb(Err(FlushError(std::sync::Arc::clone(&e))));
        }
    }

    /// Group commit: writes everything appended so far (aligned, rewriting each segment's
    /// partial tail block; `O_DSYNC` writes, or one fsync per touched segment after them),
    /// then the persist hook per entry and
    /// every waiting callback. On failure the log is poisoned and callbacks get the error.
    ///
    /// Every [`MARK_INTERVAL`] the durable mark is saved too. When earlier flushes advanced
    /// past it, it is saved up to them while this group is written (its own file, its own
    /// fsync, in parallel), so that under load no group waits behind a mark fsync; it then
    /// lags the log by one group. Otherwise it is saved after this group.
    ///
    /// # Errors
    /// The I/O error that poisoned the log, or [`LogError::Poisoned`].
    pub async fn flush(&self) -> Result<(), LogError> {
        let _io = self.exclusive().await;
        let due = self
            .mark_saved_at
            .get()
            .is_none_or(|t| t.elapsed() >= MARK_INTERVAL);
        if !due {
            return self.flush_once(u64::MAX).await;
        }
        let earlier = self.last_flushed();
        // Every flushed entry is durable (records found at open were synced by `open`).
        let saved = if earlier > self.mark.get() {
            let (flushed, saved) =
                futures::future::join(self.flush_once(u64::MAX), self.write_mark(earlier)).await;
            flushed?;
            saved
        } else {
            self.flush_once(u64::MAX).await?;
            self.write_mark(self.last_flushed()).await
        };
        if let Err(e) = saved {
            // The data is durable; only the mark lags. Retried after the next flush.
            tracing::warn!(target: "storage.log", error = %e, "saving the durable mark failed");
        }
        Ok(())
    }

    /// Waits until no flush, truncate or purge runs, then holds the log's write side until
    /// the guard drops. Every writer of segment bytes holds it: a truncate that ran while a
    /// flush was writing would have its cut undone by that flush's bookkeeping.
    async fn exclusive(&self) -> WriteGuard<'_, I> {
        while self.flushing.get() {
            let l = self.flushed.listen();
            if self.flushing.get() {
                l.await;
            }
        }
        self.flushing.set(true);
        WriteGuard(self)
    }

    /// Writes everything pending, then syncs each touched segment once; the persist hook sees
    /// the entries below `hook_below`. Each segment's bytes (its last partial block, the
    /// records, zero padding) go in block-aligned pieces of at most [`WRITE_BYTES_MAX`] that
    /// do not overlap, up to [`WRITES_IN_FLIGHT`] at once ([`Writes`]): a backlog costs about
    /// one durable write of its size, not one per piece, and never one long copy.
    async fn flush_once(&self, hook_below: u64) -> Result<(), LogError> {
        let (pending_count, callbacks) = {
            let mut st = self.st.borrow_mut();
            if st.poisoned {
                return Err(LogError::Poisoned);
            }
            (st.pending.len(), std::mem::take(&mut st.callbacks))
        };
        // Per written segment: (name, new flushed end, its last partial block).
        let mut written: Vec<(String, u64, Vec<u8>)> = Vec::new();
        let mut writes = Writes::default();
        let mut not_opened = None;
        let mut next = 0;
        while next < pending_count && writes.failed.is_none() {
            // Appends only push behind `pending_count`, and nothing else changes `pending` or
            // a segment's flushed state while this flush holds the write side.
            let seg = self.segment_write(next, pending_count);
            next = seg.records.end;
            if seg.create {
                if let Err(e) = self.io.open(&seg.name, self.cfg.segment_bytes).await {
                    not_opened = Some((seg.name, e));
                    break;
                }
            }
            let tail = self.write_segment(&seg, &mut writes).await;
            written.push((seg.name, seg.start + seg.len, tail));
        }
        let mut result = writes.finish().await;
        match (not_opened, &result) {
            (Some((segment, e)), Ok(())) if e.kind() == std::io::ErrorKind::StorageFull => {
                // Nothing was reported durable: the entries and their callbacks wait for the
                // next flush, which writes the same bytes at the same offsets (what this one
                // wrote before is written again).
                let mut st = self.st.borrow_mut();
                let later = std::mem::replace(&mut st.callbacks, callbacks);
                st.callbacks.extend(later);
                return Err(LogError::NoSpace { segment });
            }
            (Some((_, e)), Ok(())) => result = Err(e),
            _ => {}
        }
        if result.is_ok() {
            for (name, ..) in &written {
                if let Err(e) = self.io.sync_writes(name).await {
                    result = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = result {
            self.st.borrow_mut().poisoned = true;
            tracing::error!(target: "storage.log", error = %e, "log write or fsync failed: log poisoned, no more writes");
            let e = std::sync::Arc::new(e);
            for cb in callbacks {
                cb(Err(FlushError(std::sync::Arc::clone(&e))));
            }
            return Err(LogError::Io(std::io::Error::new(e.kind(), e.to_string())));
        }
        self.flushed(written, pending_count, hook_below, callbacks);
        Ok(())
    }

    /// What a flush writes to the segment of the pending record at `first`: that record and
    /// those after it in the same segment (below `end`), behind the segment's last partial
    /// block.
    fn segment_write(&self, first: usize, end: usize) -> SegmentWrite {
        let st = self.st.borrow();
        let segment = st.pending[first].segment;
        let seg = st
            .segments
            .iter()
            .find(|s| s.first == segment)
            .expect("a pending record's segment is in the log");
        let records = st.pending[first..end]
            .iter()
            .take_while(|p| p.segment == segment)
            .count();
        let bytes: usize = st.pending[first..first + records]
            .iter()
            .map(|p| p.bytes.len())
            .sum();
        SegmentWrite {
            name: seg.name.clone(),
            create: !seg.created,
            start: floor(seg.flushed_end),
            head: seg.tail.clone(),
            records: first..first + records,
            len: (seg.tail.len() + bytes) as u64,
        }
    }

    /// Starts the writes of `seg`'s pieces in `writes` (until one fails); returns the
    /// segment's new last partial block.
    async fn write_segment<'a>(&'a self, seg: &SegmentWrite, writes: &mut Writes<'a>) -> Vec<u8> {
        let padded = ceil(seg.start + seg.len) - seg.start;
        // Within the last piece: pieces are whole blocks.
        let tail_from = floor(seg.start + seg.len) - seg.start;
        let (mut cursor, mut tail, mut at) = ((0, 0), Vec::new(), 0);
        while at < padded && writes.failed.is_none() {
            let n = (padded - at).min(WRITE_BYTES_MAX as u64);
            let buf = self.copy_out(seg, &mut cursor, n);
            if at + n == padded {
                let part = |x: u64| usize::try_from(x - at).unwrap_or(0);
                tail = buf[part(tail_from)..part(seg.len)].to_vec();
            }
            let (name, offset) = (seg.name.clone(), seg.start + at);
            writes
                .start(Box::pin(async move {
                    self.io.write_at(&name, offset, buf).await
                }))
                .await;
            at += n;
        }
        tail
    }

    /// The next `n` bytes of what `seg` writes (its head, its records, then zeros) from
    /// `cursor` (a part: 0 the head, `k` the `k`th record; an offset in it), which it
    /// advances.
    fn copy_out(&self, seg: &SegmentWrite, cursor: &mut (usize, usize), n: u64) -> Vec<u8> {
        let st = self.st.borrow();
        let records = &st.pending[seg.records.clone()];
        let n = usize::try_from(n).unwrap_or(0);
        let mut buf = Vec::with_capacity(n);
        while buf.len() < n {
            let (part, offset) = *cursor;
            let bytes = match part {
                0 => seg.head.as_slice(),
                k => match records.get(k - 1) {
                    Some(p) => p.bytes.as_slice(),
                    None => break,
                },
            };
            let take = (bytes.len() - offset).min(n - buf.len());
            buf.extend_from_slice(&bytes[offset..offset + take]);
            *cursor = if offset + take == bytes.len() {
                (part + 1, 0)
            } else {
                (part, offset + take)
            };
        }
        buf.resize(n, 0);
        buf
    }

    /// After a flush's writes and fsyncs succeeded: the segments' new flushed ends, the
    /// records out of `pending` (into the read cache), the persist hook, then the callbacks.
    fn flushed(
        &self,
        written: Vec<(String, u64, Vec<u8>)>,
        pending_count: usize,
        hook_below: u64,
        callbacks: Vec<Flushed>,
    ) {
        {
            let mut st = self.st.borrow_mut();
            for (name, new_end, tail) in written {
                if let Some(seg) = st.segments.iter_mut().find(|s| s.name == name) {
                    seg.created = true;
                    seg.flushed_end = new_end;
                    seg.tail = tail;
                }
            }
        }
        let flushed: Vec<Pending> = self
            .st
            .borrow_mut()
            .pending
            .drain(..pending_count)
            .collect();
        // Indexes are contiguous (the log's invariants): what one flush made durable follows
        // on itself; a hole here would be acknowledged and then lost at the next open.
        assert!(
            flushed.windows(2).all(|w| w[1].index == w[0].index + 1),
            "a flush of non-contiguous log indexes"
        );
        if let Some(hook) = &self.on_persisted {
            // The records were encoded by this process: the payload follows the header.
            for p in flushed.iter().filter(|p| p.index < hook_below) {
                hook(&p.bytes[HEADER_LEN..]);
            }
        }
        self.flushed_at.set(Some(std::time::Instant::now()));
        if self.cfg.cache_bytes > 0 {
            let mut st = self.st.borrow_mut();
            for p in flushed {
                st.cache_push(p.index, p.bytes, self.cfg.cache_bytes);
            }
        }
        for cb in callbacks {
            cb(Ok(()));
        }
    }

    /// Reads one entry.
    ///
    /// # Errors
    /// I/O failure, or [`LogError::Corrupt`] if the bytes on disk do not decode.
    pub async fn read(&self, LogIndex(index): LogIndex) -> Result<Option<Record>, LogError> {
        let (name, offset, len, unflushed) = {
            let st = self.st.borrow();
            let Some(&(first, offset, len)) = st.locs.get(&index) else {
                return Ok(None);
            };
            if let Some(p) = st.pending.iter().find(|p| p.index == index) {
                (String::new(), 0, 0, Some(p.bytes.clone()))
            } else if let Some(b) = st.cached(index) {
                (String::new(), 0, 0, Some(b.to_vec()))
            } else {
                (segment_name(first), offset, len, None)
            }
        };
        let bytes = match unflushed {
            Some(b) => b,
            None => self.io.read_at(&name, offset, len).await?,
        };
        match decode(&bytes) {
            Decoded::Record(r, _) if r.index.0 == index => Ok(Some(r)),
            _ => Err(LogError::Corrupt {
                segment: name,
                offset,
                reason: "record changed on disk",
            }),
        }
    }

    /// Removes every entry with index `>= from` (durably, zeroing the bytes), flushing
    /// pending appends first.
    ///
    /// # Errors
    /// I/O failure; the log is poisoned if the zeroing cannot be made durable.
    pub async fn truncate(&self, LogIndex(from): LogIndex) -> Result<(), LogError> {
        let _io = self.exclusive().await;
        // The entries from `from` on are written and then cut: the persist hook never hears
        // of them (a LEADER ack must not answer an entry this truncation removes).
        self.flush_once(from).await?;
        if self
            .st
            .borrow()
            .locs
            .keys()
            .next()
            .is_some_and(|first| from <= *first)
        {
            return self.empty().await;
        }
        if !self.st.borrow().locs.contains_key(&from) {
            return Ok(());
        }
        // The mark first: after a crash mid-truncate, the entries it names must still exist.
        if self.mark.get().is_some_and(|m| m >= from) {
            if let Err(e) = self.write_mark(from.checked_sub(1)).await {
                self.st.borrow_mut().poisoned = true;
                return Err(e);
            }
        }
        let (cut, doomed) = {
            let mut st = self.st.borrow_mut();
            let Some(&(first, offset, _)) = st.locs.get(&from) else {
                return Ok(());
            };
            st.locs.split_off(&from);
            st.cache_truncate(from);
            let doomed: Vec<String> = st
                .segments
                .iter()
                .filter(|s| s.first > first)
                .map(|s| s.name.clone())
                .collect();
            st.segments.retain(|s| s.first <= first);
            let seg = st.segments.last_mut().expect("segment of a located entry");
            let start = floor(offset);
            let prefix_from = start
                .checked_sub(floor(seg.flushed_end))
                .and_then(|d| usize::try_from(d).ok());
            // The bytes before the cut in its block: from the tail when it is the last block.
            let prefix = prefix_from.and_then(|p| seg.tail.get(p..).map(<[u8]>::to_vec));
            let old_end = seg.flushed_end;
            seg.end = offset;
            seg.flushed_end = offset;
            (
                Some((seg.name.clone(), start, offset, old_end, prefix)),
                doomed,
            )
        };
        // Later segments go before the cut: a crash in between leaves a log that ends early
        // (the truncate is redone), never one whose segments do not follow each other.
        self.remove_segments(&doomed).await?;
        if let Some((name, start, offset, old_end, prefix)) = cut {
            let mut buf = match prefix {
                Some(mut p) => {
                    p.truncate(usize::try_from(offset - start).unwrap_or(0));
                    p
                }
                None => {
                    self.io
                        .read_at(&name, start, usize::try_from(offset - start).unwrap_or(0))
                        .await?
                }
            };
            buf.resize(
                usize::try_from(ceil(old_end.max(offset)) - start)
                    .unwrap_or(0)
                    .max(buf.len()),
                0,
            );
            let tail: Vec<u8> = buf[..usize::try_from(offset - start).unwrap_or(0)].to_vec();
            let res = async {
                self.io.write_at(&name, start, buf).await?;
                self.io.sync_writes(&name).await
            }
            .await;
            if let Err(e) = res {
                self.st.borrow_mut().poisoned = true;
                return Err(LogError::Io(e));
            }
            if let Some(seg) = self
                .st
                .borrow_mut()
                .segments
                .iter_mut()
                .find(|s| s.name == name)
            {
                seg.tail = tail;
            }
        }
        Ok(())
    }

    /// Drops whole segments whose entries are all `<= upto`; the last segment goes too when
    /// `upto` reaches the last entry (the log is then empty and the next append may start at
    /// any index): [`Log::forget`], then [`Log::remove_files`].
    ///
    /// # Errors
    /// I/O failure deleting a file.
    pub async fn purge(&self, upto: LogIndex) -> Result<(), LogError> {
        let doomed = self.forget(upto).await?;
        self.remove_files(&doomed).await
    }

    /// The first half of [`Log::purge`]: the log forgets the whole segments whose entries are
    /// all `<= upto`, under its write side, and returns their files, oldest first, for
    /// [`Log::remove_files`]. A removal (a directory fsync, which may wait behind seconds of
    /// the file system's dirty data) then holds back no flush, nor the caller if it removes
    /// them in the background. No other call touches those files again: a segment is named by
    /// its first index, and nothing at or below a purged index is appended again (Raft purges
    /// only what a snapshot covers). A crash or a failed removal can leave some of them
    /// behind, also with a later one gone: [`Log::open_purged`] drops them. When `upto`
    /// reaches the last entry the log is emptied here, every file removed under the write
    /// side (an emptied log takes any next index), and nothing is returned.
    ///
    /// # Errors
    /// Emptying the log failed.
    pub async fn forget(&self, LogIndex(upto): LogIndex) -> Result<Vec<String>, LogError> {
        let doomed = {
            let _io = self.exclusive().await;
            let all = {
                let st = self.st.borrow();
                st.locs.keys().next_back().is_none_or(|last| *last <= upto) && st.pending.is_empty()
            };
            if all {
                return self.empty().await.map(|()| Vec::new());
            }
            let mut st = self.st.borrow_mut();
            let keep = st
                .segments
                .iter()
                .rposition(|s| s.first <= upto + 1)
                .unwrap_or(0);
            if keep > 0 {
                let keep_from = st.segments[keep].first;
                st.locs = st.locs.split_off(&keep_from);
                st.cache_purge(keep_from);
            }
            st.segments
                .drain(..keep)
                .map(|s| s.name)
                .collect::<Vec<_>>()
        };
        Ok(doomed)
    }

    /// Removes the files [`Log::forget`] returned, oldest first.
    ///
    /// # Errors
    /// I/O failure deleting a file (the rest stay; [`Log::open_purged`] drops them).
    pub async fn remove_files(&self, names: &[String]) -> Result<(), LogError> {
        for name in names {
            self.io.remove(name).await?;
        }
        Ok(())
    }

    /// Removes every entry and every segment (callers hold the write side, nothing pending).
    /// The mark is cleared first: an emptied log must not look like one missing durable
    /// entries. The segments go last to first: a crash in between leaves a log that ends
    /// early, never one whose segments do not follow each other.
    async fn empty(&self) -> Result<(), LogError> {
        if let Err(e) = self.write_mark(None).await {
            self.st.borrow_mut().poisoned = true;
            return Err(e);
        }
        let doomed: Vec<String> = {
            let mut st = self.st.borrow_mut();
            if !st.pending.is_empty() {
                // An append while the mark was written (callers serialise their log calls,
                // so this is a bug): emptying would drop it unwritten yet acknowledged.
                st.poisoned = true;
                return Err(LogError::Poisoned);
            }
            st.locs.clear();
            st.cache_clear();
            st.segments.drain(..).map(|s| s.name).collect()
        };
        self.remove_segments(&doomed).await
    }

    /// Removes segment files the state no longer holds, last first. A file left behind
    /// would take the next append of its first index at its old bytes: a failure poisons the
    /// log (no more writes; a restart finishes the removal).
    async fn remove_segments(&self, names: &[String]) -> Result<(), LogError> {
        for name in names.iter().rev() {
            if let Err(e) = self.io.remove(name).await {
                self.st.borrow_mut().poisoned = true;
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// Reads a segment image's records from index `next` on into `locs` (segment `first`):
/// where the good records end, the index after the last, and what stopped the read before a
/// clean zeroed end (`None` at one).
fn scan_segment(
    img: &[u8],
    first: u64,
    mut next: u64,
    locs: &mut BTreeMap<u64, (u64, u64, usize)>,
) -> (usize, u64, Option<&'static str>) {
    let mut offset = 0usize;
    loop {
        match decode(&img[offset..]) {
            Decoded::Record(r, n) if r.index.0 == next => {
                locs.insert(r.index.0, (first, offset as u64, n));
                next += 1;
                offset += n;
            }
            Decoded::Record(..) => return (offset, next, Some("index out of sequence")),
            Decoded::End => {
                let problem = img[offset..]
                    .iter()
                    .any(|b| *b != 0)
                    .then_some("zeroed block before later data");
                return (offset, next, problem);
            }
            Decoded::Bad(reason) => return (offset, next, Some(reason)),
        }
    }
}

/// Zeroes a segment after its last good record (at `offset`), durably, so that the cut of a
/// torn tail holds across another crash.
async fn cut_torn_tail<I: LogIo>(
    io: &I,
    name: &str,
    img: &[u8],
    offset: usize,
) -> Result<(), LogError> {
    let dirty_end = img.iter().rposition(|b| *b != 0).map_or(offset, |p| p + 1) as u64;
    let start = floor(offset as u64);
    let mut buf = img[start as usize..offset].to_vec();
    buf.resize(usize::try_from(ceil(dirty_end) - start).unwrap_or(0), 0);
    if !buf.is_empty() {
        io.write_at(name, start, buf).await?;
        io.sync(name).await?;
    }
    Ok(())
}

/// Makes durable the segments holding records beyond the durable mark: a process that died
/// before their fsync may have written them, and Raft counts what a log holds as persisted
/// (the durable mark may name them from the first flush on).
async fn sync_beyond_mark<I: LogIo>(io: &I, st: &State, mark: Option<u64>) -> Result<(), LogError> {
    let last = st.locs.keys().next_back().copied();
    for (i, seg) in st.segments.iter().enumerate() {
        let seg_last = st
            .segments
            .get(i + 1)
            .map_or(last, |next| next.first.checked_sub(1));
        if seg.end > 0 && seg_last.is_some_and(|l| mark.is_none_or(|m| l > m)) {
            io.sync(&seg.name).await?;
        }
    }
    Ok(())
}

/// The log's segment files, `(first index, name)`, by first index.
async fn segment_names<I: LogIo>(io: &I) -> Result<Vec<(u64, String)>, LogError> {
    let mut names: Vec<(u64, String)> = io
        .list()
        .await?
        .into_iter()
        .filter_map(|n| {
            n.strip_suffix(".log")
                .and_then(|f| f.parse().ok())
                .map(|f| (f, n))
        })
        .collect();
    names.sort();
    Ok(names)
}

/// The durable mark's file (created if missing): its newest slot's sequence number and mark.
async fn read_mark<I: LogIo>(io: &I) -> Result<(u64, Option<u64>), LogError> {
    io.open(MARK_FILE, 2 * BLOCK).await?;
    Ok(
        match newest_slot(&io.read_at(MARK_FILE, 0, 2 * BLOCK as usize).await?) {
            Some((seq, v)) => (seq, decode_mark(&v)),
            None => (0, None),
        },
    )
}

/// Removes the files of the segments (`names`, in order) wholly at or below `purged` (the
/// next one starts at or below `purged + 1`), and their names.
async fn drop_purged<I: LogIo>(
    io: &I,
    names: &mut Vec<(u64, String)>,
    purged: u64,
) -> Result<(), LogError> {
    let gone = names
        .windows(2)
        .take_while(|w| w[1].0 <= purged.saturating_add(1))
        .count();
    for (_, name) in names.drain(..gone) {
        tracing::info!(target: "storage.recovery", segment = %name, purged, "removing a segment a purge left behind");
        match io.remove(&name).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    Ok(())
}

/// Removes empty trailing segments (a crash right after a roll): they carry nothing, and a
/// log without entries keeps no segment at all (see the invariants).
async fn drop_empty_tail<I: LogIo>(io: &I, st: &mut State) -> Result<(), LogError> {
    while st.segments.last().is_some_and(|s| s.end == 0)
        && (st.segments.len() > 1 || st.locs.is_empty())
    {
        if let Some(s) = st.segments.pop() {
            io.remove(&s.name).await?;
        }
    }
    Ok(())
}
