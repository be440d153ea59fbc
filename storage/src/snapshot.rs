//! The store's snapshot stream, read piece by piece from one redb read transaction.
//!
//! Stream: magic `FQSNAP1\0`, applied index + 1 (0 = none), applied term, last-id (u64 LE
//! each), then records `table (u8: 1 messages, 2 indexes, 3 expiry, 4 raft meta, 5 groups,
//! 6 topics, 8 dedup-sweep, 7 dedup, in this order; a stream without dedup-sweep records, from
//! the earlier version, lists each dedup row for the sweep on its own) ·
//! key length (u32 LE) · key · value length (u32 LE) · value`, then a 0 byte.
//!
//! # Invariants
//! - A [`SnapshotReader`] holds at most one piece in memory (about the size asked for, plus
//!   one record): a snapshot of any size is sent, spooled or installed in bounded memory.
//! - Every piece comes from the reader's one read transaction, so the stream is the store as
//!   of one commit, whatever commits while it is read. The transaction pins that version's
//!   pages until the reader is dropped (redb cannot reuse them meanwhile).

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;

use redb::{ReadTransaction, TableDefinition};

use crate::store::schema::{
    APPLIED_INDEX, APPLIED_TERM, DEDUP, DEDUP_SWEEP, EXPIRY, GROUPS, INDEXES, LAST_ID, MESSAGES,
    META, RAFT_META, TOPICS,
};
use crate::StoreError;

pub(crate) const SNAPSHOT_MAGIC: &[u8; 8] = b"FQSNAP1\0";
/// Table tags of the records.
pub(crate) const TAG_MESSAGE: u8 = 1;
pub(crate) const TAG_INDEX: u8 = 2;
pub(crate) const TAG_EXPIRY: u8 = 3;
pub(crate) const TAG_RAFT_META: u8 = 4;
pub(crate) const TAG_GROUP: u8 = 5;
pub(crate) const TAG_TOPIC: u8 = 6;
pub(crate) const TAG_DEDUP: u8 = 7;
pub(crate) const TAG_DEDUP_SWEEP: u8 = 8;
/// Size of the pieces [`SnapshotReader`]'s `Read` implementation fills at a time.
pub const SNAPSHOT_PIECE_BYTES: usize = 1 << 20;

pub(crate) fn write_record(
    w: &mut impl io::Write,
    table: u8,
    key: &[u8],
    value: &[u8],
) -> io::Result<()> {
    w.write_all(&[table])?;
    for part in [key, value] {
        let n = u32::try_from(part.len()).map_err(|_| io::Error::other("record too large"))?;
        w.write_all(&n.to_le_bytes())?;
        w.write_all(part)?;
    }
    Ok(())
}

/// Where a reader is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Messages,
    Indexes,
    Expiry,
    Groups,
    Topics,
    DedupSweep,
    Dedup,
    RaftMeta,
    End,
    Finished,
}

/// A snapshot of the store as a byte stream, produced as it is read (see the module docs).
/// Blocking: read it off the executors.
pub struct SnapshotReader {
    txn: ReadTransaction,
    info: SnapshotInfo,
    stage: Stage,
    /// The last key written of the current table (the next piece starts after it).
    after: Option<Vec<u8>>,
    /// The piece being read through `Read`, and how much of it was read.
    piece: Vec<u8>,
    at: usize,
    /// A read failed: the stream is broken for good (a later read would skip records).
    failed: bool,
}

impl SnapshotReader {
    /// A reader of the store as `txn` sees it; the header is the first piece.
    pub(crate) fn new(txn: ReadTransaction) -> Result<Self, StoreError> {
        let meta = txn.open_table(META)?;
        let get =
            |k: &str| -> Result<u64, StoreError> { Ok(meta.get(k)?.map_or(0, |v| v.value())) };
        let applied = meta.get(APPLIED_INDEX)?.map(|v| v.value());
        let (term, last) = (get(APPLIED_TERM)?, get(LAST_ID)?);
        let mut raft_meta = BTreeMap::new();
        for r in txn.open_table(RAFT_META)?.range::<&str>(..)? {
            let (k, v) = r?;
            raft_meta.insert(k.value().to_owned(), v.value().to_vec());
        }
        let mut piece = Vec::with_capacity(SNAPSHOT_MAGIC.len() + 24);
        piece.extend_from_slice(SNAPSHOT_MAGIC);
        // The applied index is written + 1 so that 0 means "nothing applied".
        for v in [applied.map_or(0, |i| i + 1), term, last] {
            piece.extend_from_slice(&v.to_le_bytes());
        }
        drop(meta);
        Ok(SnapshotReader {
            txn,
            info: SnapshotInfo {
                applied: applied.map(|i| (i, term)),
                raft_meta,
            },
            stage: Stage::Messages,
            after: None,
            piece,
            at: 0,
            failed: false,
        })
    }

    /// The applied log id and the replication layer's state the stream holds.
    #[must_use]
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// Appends the next records to `out` until it holds at least `max` bytes (so it may end
    /// one record beyond) or the stream ends. False when nothing is left.
    ///
    /// # Errors
    /// A storage error.
    fn fill(&mut self, out: &mut Vec<u8>, max: usize) -> Result<bool, StoreError> {
        let start = out.len();
        while out.len() < max {
            let table_done = match self.stage {
                Stage::Messages => self.fill_rows(MESSAGES, TAG_MESSAGE, out, max, |_| true)?,
                Stage::Indexes => self.fill_keys(INDEXES, TAG_INDEX, out, max)?,
                Stage::Expiry => self.fill_keys(EXPIRY, TAG_EXPIRY, out, max)?,
                Stage::Groups => self.fill_keys(GROUPS, TAG_GROUP, out, max)?,
                // Stored counts follow from the messages installed: only rows with dead
                // letters carry more (so a store that never dead-lettered nor deduplicated
                // sends what a node of the version before reads).
                Stage::Topics => self.fill_rows(TOPICS, TAG_TOPIC, out, max, |v| {
                    v.get(8..16).is_some_and(|d| d.iter().any(|b| *b != 0))
                })?,
                // Before `dedup`: an installer then knows whether the sender listed its rows.
                Stage::DedupSweep => {
                    self.fill_rows(DEDUP_SWEEP, TAG_DEDUP_SWEEP, out, max, |_| true)?
                }
                Stage::Dedup => self.fill_rows(DEDUP, TAG_DEDUP, out, max, |_| true)?,
                Stage::RaftMeta => {
                    // A few small rows: read once, in `new`.
                    for (k, v) in &self.info.raft_meta {
                        write_record(out, TAG_RAFT_META, k.as_bytes(), v)?;
                    }
                    true
                }
                Stage::End => {
                    out.push(0);
                    true
                }
                Stage::Finished => break,
            };
            if table_done {
                self.after = None;
                self.stage = match self.stage {
                    Stage::Messages => Stage::Indexes,
                    Stage::Indexes => Stage::Expiry,
                    Stage::Expiry => Stage::Groups,
                    Stage::Groups => Stage::Topics,
                    Stage::Topics => Stage::DedupSweep,
                    Stage::DedupSweep => Stage::Dedup,
                    Stage::Dedup => Stage::RaftMeta,
                    Stage::RaftMeta => Stage::End,
                    Stage::End | Stage::Finished => Stage::Finished,
                };
            }
        }
        Ok(out.len() > start)
    }

    fn range_start(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        match &self.after {
            Some(k) => (Bound::Excluded(k.as_slice()), Bound::Unbounded),
            None => (Bound::Unbounded, Bound::Unbounded),
        }
    }

    /// The rows of a key-value table (messages, topics, dedup-sweep, dedup) whose value `keep`s, from
    /// where the last piece stopped; true when the table is done.
    fn fill_rows(
        &mut self,
        def: TableDefinition<&[u8], &[u8]>,
        tag: u8,
        out: &mut Vec<u8>,
        max: usize,
        keep: impl Fn(&[u8]) -> bool,
    ) -> Result<bool, StoreError> {
        let t = self.txn.open_table(def)?;
        for r in t.range::<&[u8]>(self.range_start())? {
            let (k, v) = r?;
            if !keep(v.value()) {
                continue;
            }
            write_record(out, tag, k.value(), v.value())?;
            if out.len() >= max {
                self.after = Some(k.value().to_vec());
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The keys of a key-only table from where the last piece stopped; true when it is done.
    fn fill_keys(
        &mut self,
        def: TableDefinition<&[u8], ()>,
        tag: u8,
        out: &mut Vec<u8>,
        max: usize,
    ) -> Result<bool, StoreError> {
        let t = self.txn.open_table(def)?;
        for r in t.range::<&[u8]>(self.range_start())? {
            let (k, _) = r?;
            write_record(out, tag, k.value(), &[])?;
            if out.len() >= max {
                self.after = Some(k.value().to_vec());
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl io::Read for SnapshotReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::other("the snapshot stream failed earlier"));
        }
        if self.at == self.piece.len() {
            // The buffer is reused: one piece's capacity for the whole stream.
            let mut piece = std::mem::take(&mut self.piece);
            piece.clear();
            self.at = 0;
            let filled = self.fill(&mut piece, SNAPSHOT_PIECE_BYTES);
            if let Err(e) = filled {
                self.failed = true;
                return Err(io::Error::other(e));
            }
            self.piece = piece;
        }
        let n = buf.len().min(self.piece.len() - self.at);
        buf[..n].copy_from_slice(&self.piece[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// What a snapshot holds besides the data, read in the same transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Applied `(index, term)`.
    pub applied: Option<(u64, u64)>,
    /// The replication layer's state at that point.
    pub raft_meta: BTreeMap<String, Vec<u8>>,
}
