//! The standalone store's write-ahead log: what makes a group durable without a redb durable
//! commit.
//!
//! A redb durable commit costs one `fdatasync` of the database file with its scattered dirty
//! B-tree pages (~0.5–1 ms on a virtio disk) — per group commit, that bounded QUORUM
//! publishing at one message per request. Instead the writer commits each group to redb
//! without fsync, appends one record of the group's changes here (a single sequential write
//! into a pre-zeroed file) and fsyncs that (~0.2 ms); every
//! [`crate::service::CHECKPOINT_INTERVAL`] (or when the log is half full) it makes a redb
//! durable commit — a checkpoint — and starts the log over at offset 0 in a new cycle.
//!
//! Record: `len u32 LE · crc32c u32 LE (of the fields after it and the body) · cycle u64 LE ·
//! seq u64 LE · synced u64 LE · body`, body = the puts (key, expiry, index keys, value) and the
//! deleted keys of one group; `synced` is the last record fsynced before this one was written;
//! `cycle` is the random id the last checkpoint gave the log ([`WalMark`]). Records start at
//! multiples of 8 bytes (zero padding after the body, not counted in `len`).
//!
//! # Invariants
//! - A record is fsynced before any operation of its group is acknowledged as durable.
//! - Records carry consecutive sequence numbers; redb's `wal-seq` (written by checkpoints
//!   only) is the last record the durable database contains. Recovery replays exactly the
//!   records after it, from offset 0 while the numbers stay consecutive.
//! - After a checkpoint the log restarts at offset 0 with the next number and a new cycle id
//!   (stored with `wal-seq` in the same durable commit); bytes of earlier cycles are never
//!   read as records of this one — nor are record-like bytes a client put in a payload, since
//!   nobody outside the data directory knows the id.
//! - Torn or corrupt: a record that does not read back ends the replay when it was never
//!   fsynced (a crash cut it; nothing of it or after it was acknowledged as durable). When a
//!   later record of the cycle says it was (its `synced` reaches it), the log is corrupt and
//!   [`Wal::open`] refuses it rather than drop acknowledged records.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use futureq_core::{EventKey, KEY_LEN};

use crate::store::NewMessage;
use crate::StoreError;

/// The log's file in the data directory.
pub const WAL_FILE: &str = "futureq.wal";
/// Its size (allocated and zero-filled once, at creation).
pub const WAL_BYTES: u64 = 64 << 20;
/// Bytes before a record's body.
const HEADER: usize = 32;
/// Records start at multiples of this.
const ALIGN: usize = 8;

/// Bytes a record with a body of `len` bytes takes, padding included.
fn footprint(len: usize) -> usize {
    (HEADER + len).next_multiple_of(ALIGN)
}

/// One group's changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WalRecord {
    /// Messages stored.
    pub puts: Vec<NewMessage>,
    /// Keys removed (acks, TTL expiry).
    pub deletes: Vec<EventKey>,
}

/// Why a record's bytes do not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed write-ahead log record")]
pub struct BadRecord;

/// A record that was fsynced does not read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the write-ahead log is corrupt: record {seq} (byte {at}) was made durable (record {witness} \
     at byte {witness_at} was written after its fsync) but does not read back"
)]
pub struct Corrupt {
    /// The record that does not read back.
    pub seq: u64,
    /// Where it should start.
    pub at: usize,
    /// A later record whose `synced` covers it.
    pub witness: u64,
    /// Where that record starts.
    pub witness_at: usize,
}

/// Where the log's current cycle starts: every record up to `seq` is in the durable database
/// (the checkpoint), and the records written since carry `cycle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalMark {
    /// The last record the durable database contains.
    pub seq: u64,
    /// The cycle's id; 0 in a new database or one from before cycle ids (see [`Wal::open`]).
    pub cycle: u64,
}

impl WalMark {
    /// A checkpoint after record `seq` that starts a new cycle (a random, non-zero id).
    #[must_use]
    pub fn after(seq: u64) -> WalMark {
        use std::hash::BuildHasher;
        // RandomState is keyed from the OS's randomness (per thread, then incremented).
        let cycle = std::collections::hash_map::RandomState::new()
            .hash_one(seq)
            .max(1);
        WalMark { seq, cycle }
    }
}

/// Reads the little-endian u64 at `at` (the caller checked the bounds).
fn u64_at(log: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&log[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A record of cycle `cycle` at `at`, if its bytes are whole (length, CRC, decode): its
/// sequence number, `synced`, body length and contents.
fn record_at(log: &[u8], at: usize, cycle: u64) -> Option<(u64, u64, usize, WalRecord)> {
    let header = log.get(at..at.checked_add(HEADER)?)?;
    if u64_at(header, 8) != cycle {
        return None;
    }
    let (len, crc) = (
        u64_at(header, 0) as u32 as usize,
        (u64_at(header, 0) >> 32) as u32,
    );
    let (seq, synced) = (u64_at(header, 16), u64_at(header, 24));
    let body = log.get(at + HEADER..(at + HEADER).checked_add(len)?)?;
    if len == 0 || crc32c::crc32c_append(crc32c::crc32c(&header[8..HEADER]), body) != crc {
        return None;
    }
    let rec = WalRecord::decode(body).ok()?;
    Some((seq, synced, len, rec))
}

/// Appends the body encoding of the puts in `batches` and the keys in `deletes` to `out`.
fn encode_parts(batches: &[&[NewMessage]], deletes: &[&[EventKey]], out: &mut Vec<u8>) {
    let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    out.extend_from_slice(&len32(batches.iter().map(|b| b.len()).sum()));
    for m in batches.iter().flat_map(|b| b.iter()) {
        out.extend_from_slice(&m.key.0);
        out.extend_from_slice(&m.expires_at_ms.unwrap_or(i64::MIN).to_le_bytes());
        out.extend_from_slice(&len32(m.index_keys.len()));
        for k in &m.index_keys {
            out.extend_from_slice(&len32(k.len()));
            out.extend_from_slice(k);
        }
        out.extend_from_slice(&len32(m.value.len()));
        out.extend_from_slice(&m.value);
    }
    out.extend_from_slice(&len32(deletes.iter().map(|d| d.len()).sum()));
    for k in deletes.iter().flat_map(|d| d.iter()) {
        out.extend_from_slice(&k.0);
    }
}

impl WalRecord {
    /// Appends the body encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_parts(&[&self.puts], &[&self.deletes], out);
    }

    /// Decodes a body (untrusted bytes: every length is checked against what is left).
    ///
    /// # Errors
    /// [`BadRecord`] when the bytes are not exactly one encoded record.
    pub fn decode(mut b: &[u8]) -> Result<WalRecord, BadRecord> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], BadRecord> {
            if b.len() < n {
                return Err(BadRecord);
            }
            let (head, rest) = b.split_at(n);
            *b = rest;
            Ok(head)
        }
        fn count(b: &mut &[u8], min_item: usize) -> Result<usize, BadRecord> {
            let n = u32::from_le_bytes(take(b, 4)?.try_into().map_err(|_| BadRecord)?);
            let n = usize::try_from(n).map_err(|_| BadRecord)?;
            // Each item needs at least `min_item` bytes: no allocation beyond the input.
            if n.saturating_mul(min_item) > b.len() {
                return Err(BadRecord);
            }
            Ok(n)
        }
        fn key(b: &mut &[u8]) -> Result<EventKey, BadRecord> {
            Ok(EventKey(
                take(b, KEY_LEN)?.try_into().map_err(|_| BadRecord)?,
            ))
        }
        let mut rec = WalRecord::default();
        let puts = count(&mut b, KEY_LEN + 16)?;
        rec.puts.reserve(puts);
        for _ in 0..puts {
            let k = key(&mut b)?;
            let exp = i64::from_le_bytes(take(&mut b, 8)?.try_into().map_err(|_| BadRecord)?);
            let n_index = count(&mut b, 4)?;
            let mut index_keys = Vec::with_capacity(n_index);
            for _ in 0..n_index {
                let n = count(&mut b, 1)?;
                index_keys.push(take(&mut b, n)?.to_vec());
            }
            let n = count(&mut b, 1)?;
            let value = Bytes::copy_from_slice(take(&mut b, n)?);
            rec.puts.push(NewMessage {
                key: k,
                expires_at_ms: (exp != i64::MIN).then_some(exp),
                index_keys,
                value,
            });
        }
        let deletes = count(&mut b, KEY_LEN)?;
        rec.deletes.reserve(deletes);
        for _ in 0..deletes {
            rec.deletes.push(key(&mut b)?);
        }
        if b.is_empty() {
            Ok(rec)
        } else {
            Err(BadRecord)
        }
    }
}

/// The consecutive records of cycle `mark.cycle` at the start of `log` (sequence number and
/// record), first ones first, up to the first zero, torn or out-of-sequence record or one of
/// another cycle.
///
/// # Errors
/// [`Corrupt`] when a later record of the cycle was written after the missing one's fsync.
pub fn scan(log: &[u8], mark: WalMark) -> Result<Vec<(u64, WalRecord)>, Corrupt> {
    let mut out: Vec<(u64, WalRecord)> = Vec::new();
    let mut at = 0usize;
    while let Some((seq, _, len, rec)) = record_at(log, at, mark.cycle) {
        if out
            .last()
            .is_some_and(|(prev, _)| seq != prev.wrapping_add(1))
        {
            break;
        }
        out.push((seq, rec));
        at += footprint(len);
    }
    // What should come next: was it ever fsynced? A whole later record of the cycle says so.
    let missing = out
        .last()
        .map_or(mark.seq, |(s, _)| *s)
        .max(mark.seq)
        .wrapping_add(1);
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut from = at + ALIGN;
    while from + HEADER <= log.len() {
        if log.get(from..from + ZEROS.len()) == Some(&ZEROS[..]) {
            // Zero-filled: no header starts in it before its last HEADER bytes.
            from += ZEROS.len() - HEADER + ALIGN;
            continue;
        }
        // Cheap filters first: this cycle's id, then a `synced` that covers `missing`.
        if u64_at(log, from + 8) == mark.cycle && u64_at(log, from + 24) >= missing {
            if let Some((seq, synced, _, _)) = record_at(log, from, mark.cycle) {
                if synced >= missing && seq > synced {
                    return Err(Corrupt {
                        seq: missing,
                        at,
                        witness: seq,
                        witness_at: from,
                    });
                }
            }
        }
        from += ALIGN;
    }
    Ok(out)
}

/// The records of a log written before cycle ids (`len u32 · crc32c u32 (of seq and body) ·
/// seq u64 · body`, unaligned), consecutive from offset 0: read once, to replay what the
/// database lacks after an upgrade; the checkpoint that follows starts a cycle.
#[must_use]
pub fn scan_unversioned(log: &[u8]) -> Vec<(u64, WalRecord)> {
    const OLD_HEADER: usize = 16;
    let mut out: Vec<(u64, WalRecord)> = Vec::new();
    let mut at = 0usize;
    while let Some(header) = log.get(at..at.saturating_add(OLD_HEADER)) {
        let (len, crc) = (
            u64_at(header, 0) as u32 as usize,
            (u64_at(header, 0) >> 32) as u32,
        );
        let seq = u64_at(header, 8);
        let Some(body) = log.get(at + OLD_HEADER..(at + OLD_HEADER).saturating_add(len)) else {
            break;
        };
        if len == 0
            || crc32c::crc32c_append(crc32c::crc32c(&header[8..OLD_HEADER]), body) != crc
            || out
                .last()
                .is_some_and(|(prev, _)| seq != prev.wrapping_add(1))
        {
            break;
        }
        let Ok(rec) = WalRecord::decode(body) else {
            break;
        };
        out.push((seq, rec));
        at += OLD_HEADER + len;
    }
    out
}

fn io_err(what: &str, path: &Path, e: &std::io::Error) -> StoreError {
    StoreError::Wal(format!("{what} {}: {e}", path.display()))
}

/// `records` in the format of [`scan_unversioned`] (to test upgrades).
#[cfg(test)]
pub(crate) fn unversioned_log(records: &[(u64, WalRecord)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (seq, r) in records {
        let mut body = Vec::new();
        r.encode(&mut body);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), &body);
        out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// The open log.
pub struct Wal {
    file: File,
    offset: u64,
    capacity: u64,
    buf: Vec<u8>,
    /// The last record appended.
    appended: u64,
    /// The last record fsynced (written into each record appended after it).
    synced: u64,
    /// The current cycle's id (written into each record).
    cycle: u64,
}

impl Wal {
    /// Opens the log in `dir` (creating and zero-filling it on first use) and returns it with
    /// the records of the cycle the database's last checkpoint `mark` started (see [`scan`];
    /// [`scan_unversioned`] when the database is from before cycle ids). Appends start after
    /// [`Wal::restart`].
    ///
    /// # Errors
    /// The file cannot be created, filled or read, or it is corrupt.
    pub fn open(
        dir: &Path,
        capacity: u64,
        mark: WalMark,
    ) -> Result<(Wal, Vec<(u64, WalRecord)>), StoreError> {
        let path = dir.join(WAL_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err("opening", &path, &e))?;
        let len = file
            .metadata()
            .map_err(|e| io_err("reading", &path, &e))?
            .len();
        if len < capacity {
            // Written once with zeros, so that appends never allocate or convert extents
            // (an fdatasync then writes data only, no file-system metadata).
            let zeros = vec![0u8; 1 << 20];
            let mut at = len;
            while at < capacity {
                let n = usize::try_from((capacity - at).min(zeros.len() as u64)).unwrap_or(0);
                file.write_all_at(&zeros[..n], at)
                    .map_err(|e| io_err("filling", &path, &e))?;
                at += n as u64;
            }
            file.sync_all().map_err(|e| io_err("syncing", &path, &e))?;
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err("syncing the directory of", &path, &e))?;
        }
        let mut log = Vec::new();
        file.read_to_end(&mut log)
            .map_err(|e| io_err("reading", &path, &e))?;
        let records = if mark.cycle == 0 {
            scan_unversioned(&log)
        } else {
            scan(&log, mark).map_err(|e| {
                StoreError::Wal(format!(
                    "{e}; refusing to start without acknowledged records ({}): restore the data \
                     directory from a backup",
                    path.display()
                ))
            })?
        };
        Ok((
            Wal {
                file,
                offset: 0,
                capacity,
                buf: Vec::new(),
                appended: mark.seq,
                synced: mark.seq,
                cycle: mark.cycle,
            },
            records,
        ))
    }

    /// Appends record `seq` (not yet durable: see [`Wal::sync`]). `Ok(false)` when it does not
    /// fit in what is left of the log; then nothing was written.
    ///
    /// # Errors
    /// The write failed.
    pub fn append(&mut self, seq: u64, rec: &WalRecord) -> Result<bool, StoreError> {
        self.append_parts(seq, &[&rec.puts], &[&rec.deletes])
    }

    /// [`Wal::append`] of the record made of the puts in `batches` and the keys in `deletes`.
    ///
    /// # Errors
    /// The write failed.
    pub fn append_parts(
        &mut self,
        seq: u64,
        batches: &[&[NewMessage]],
        deletes: &[&[EventKey]],
    ) -> Result<bool, StoreError> {
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; 8]);
        self.buf.extend_from_slice(&self.cycle.to_le_bytes());
        self.buf.extend_from_slice(&seq.to_le_bytes());
        self.buf.extend_from_slice(&self.synced.to_le_bytes());
        encode_parts(batches, deletes, &mut self.buf);
        let body_len = self.buf.len() - HEADER;
        let Ok(len) = u32::try_from(body_len) else {
            return Ok(false);
        };
        self.buf.resize(footprint(body_len), 0);
        if self.offset + self.buf.len() as u64 > self.capacity {
            return Ok(false);
        }
        let crc = crc32c::crc32c_append(
            crc32c::crc32c(&self.buf[8..HEADER]),
            &self.buf[HEADER..HEADER + body_len],
        );
        self.buf[0..4].copy_from_slice(&len.to_le_bytes());
        self.buf[4..8].copy_from_slice(&crc.to_le_bytes());
        self.file
            .write_all_at(&self.buf, self.offset)
            .map_err(|e| StoreError::Wal(format!("appending: {e}")))?;
        self.offset += self.buf.len() as u64;
        self.appended = seq;
        Ok(true)
    }

    /// Makes every appended record durable (`fdatasync`).
    ///
    /// # Errors
    /// The sync failed: what was appended since the last sync may be lost.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        self.file
            .sync_data()
            .map_err(|e| StoreError::Wal(format!("fdatasync: {e}")))?;
        self.synced = self.appended;
        Ok(())
    }

    /// Bytes appended since the last restart.
    #[must_use]
    pub fn used(&self) -> u64 {
        self.offset
    }

    /// The log's size.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Starts over at offset 0, in the cycle `mark` of a checkpoint that made every record up
    /// to `mark.seq` durable in redb.
    pub fn restart(&mut self, mark: WalMark) {
        self.offset = 0;
        self.appended = mark.seq;
        self.synced = mark.seq;
        self.cycle = mark.cycle;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(id: u8, exp: Option<i64>, idx: Vec<Vec<u8>>, value: Vec<u8>) -> NewMessage {
        NewMessage {
            key: EventKey([id; KEY_LEN]),
            expires_at_ms: exp,
            index_keys: idx,
            value: Bytes::from(value),
        }
    }

    fn rec(n: u8) -> WalRecord {
        WalRecord {
            puts: vec![msg(n, Some(7), vec![b"ix".to_vec()], vec![n; 10])],
            deletes: vec![EventKey([n.wrapping_add(100); KEY_LEN])],
        }
    }

    proptest! {
        #[test]
        fn records_round_trip(
            puts in proptest::collection::vec(
                (any::<u8>(), proptest::option::of(any::<i64>().prop_filter("not the none marker", |v| *v != i64::MIN)),
                 proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..3),
                 proptest::collection::vec(any::<u8>(), 0..200)),
                0..8),
            deletes in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let r = WalRecord {
                puts: puts.into_iter().map(|(id, e, i, v)| msg(id, e, i, v)).collect(),
                deletes: deletes.into_iter().map(|d| EventKey([d; KEY_LEN])).collect(),
            };
            let mut b = Vec::new();
            r.encode(&mut b);
            prop_assert_eq!(WalRecord::decode(&b), Ok(r));
        }

        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = WalRecord::decode(&b);
            let _ = scan(&b, WalMark { seq: 0, cycle: 1 });
            let _ = scan_unversioned(&b);
        }
    }

    /// A whole record of `cycle` (the writer's format, for forging one by hand).
    fn raw_record(cycle: u64, seq: u64, synced: u64, r: &WalRecord) -> Vec<u8> {
        let mut body = Vec::new();
        r.encode(&mut body);
        let mut out = vec![0u8; 8];
        for v in [cycle, seq, synced] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&out[8..]), &body);
        out[0..4].copy_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&body);
        out.resize(footprint(body.len()), 0);
        out
    }

    #[test]
    fn replay_stops_at_torn_stale_or_out_of_sequence_records() {
        let dir = tempfile::tempdir().unwrap();
        let first = WalMark::after(0);
        let (mut w, found) = Wal::open(dir.path(), 1 << 16, first).unwrap();
        assert!(found.is_empty());
        for s in 1..=4 {
            assert!(w.append(s, &rec(u8::try_from(s).unwrap())).unwrap());
            w.sync().unwrap();
        }
        let seqs = |d: &Path, mark: WalMark| {
            Wal::open(d, 1 << 16, mark)
                .map(|(_, found)| found.into_iter().map(|(s, _)| s).collect::<Vec<_>>())
        };
        assert_eq!(seqs(dir.path(), first).unwrap(), [1, 2, 3, 4]);
        // After a checkpoint the log restarts in a new cycle: record 5 at offset 0 hides the
        // old ones (fsynced records of another cycle, which prove nothing about this one).
        let second = WalMark::after(4);
        w.restart(second);
        assert!(w.append(5, &rec(5)).unwrap());
        w.sync().unwrap();
        assert_eq!(seqs(dir.path(), second).unwrap(), [5]);
        // A torn record (body cut short by zeros) ends the replay.
        let at_6 = w.used();
        assert!(w.append(6, &rec(6)).unwrap());
        w.file
            .write_all_at(&[0u8; 4], at_6 + HEADER as u64 + 4)
            .unwrap();
        assert_eq!(seqs(dir.path(), second).unwrap(), [5]);
        // A record-like thing after it that claims record 6 was fsynced proves corruption only
        // when it is of this cycle: bytes a client put in a payload cannot know the id.
        let later = at_6 + 4096;
        let forged = raw_record(second.cycle ^ 1, 7, 6, &rec(7));
        w.file.write_all_at(&forged, later).unwrap();
        assert_eq!(seqs(dir.path(), second).unwrap(), [5]);
        let witness = raw_record(second.cycle, 7, 6, &rec(7));
        w.file.write_all_at(&witness, later).unwrap();
        let err = seqs(dir.path(), second).expect_err("record 6 was fsynced");
        assert!(err.to_string().contains("record 6"), "{err}");
    }

    /// A record of an earlier cycle that happens to follow a new one with the next number
    /// (same sizes) is not part of the new cycle.
    #[test]
    fn records_of_another_cycle_never_chain() {
        let dir = tempfile::tempdir().unwrap();
        let first = WalMark::after(0);
        let (mut w, _) = Wal::open(dir.path(), 1 << 16, first).unwrap();
        for s in 1..=3 {
            assert!(w.append(s, &rec(u8::try_from(s).unwrap())).unwrap());
        }
        w.sync().unwrap();
        // A restart that did not get past record 0 (records 1..=3 were never checkpointed).
        let again = WalMark::after(0);
        w.restart(again);
        assert!(w.append(1, &rec(9)).unwrap());
        w.sync().unwrap();
        let (_, found) = Wal::open(dir.path(), 1 << 16, again).unwrap();
        assert_eq!(found, vec![(1, rec(9))]);
    }

    #[test]
    fn a_log_from_before_cycle_ids_is_replayed_once() {
        let dir = tempfile::tempdir().unwrap();
        let old = unversioned_log(&[(1, rec(1)), (2, rec(2))]);
        std::fs::write(dir.path().join(WAL_FILE), &old).unwrap();
        let unversioned = WalMark { seq: 0, cycle: 0 };
        let (_, found) = Wal::open(dir.path(), 1 << 16, unversioned).unwrap();
        assert_eq!(found, vec![(1, rec(1)), (2, rec(2))]);
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, _) = Wal::open(dir.path(), 256, WalMark::after(0)).unwrap();
        let big = WalRecord {
            puts: vec![msg(1, None, vec![], vec![0; 300])],
            deletes: vec![],
        };
        assert!(!w.append(1, &big).unwrap());
        assert_eq!(w.used(), 0);
        assert!(w.append(1, &rec(1)).unwrap());
    }
}
