//! Taking snapshots of the store and installing one in its place.
//!
//! # Invariants
//! - An install is one durable transaction: a malformed or unexpected snapshot leaves the
//!   store as it was.
//! - A snapshot taken for a log purge holds only durable state ([`Store::durable_snapshot`]).

use std::sync::atomic::Ordering;

use futureq_core::{TopicHash, KEY_LEN};
use redb::{Durability, ReadableDatabase};

use super::db::Store;
use super::schema::{
    parse_dedup_value, swept_keys, TopicRow, APPLIED_INDEX, APPLIED_TERM, LAST_ID, RAFT_META,
};
use super::tables::{KeyTable, Tables};
use crate::snapshot::{
    SnapshotInfo, SnapshotReader, SNAPSHOT_MAGIC, TAG_DEDUP, TAG_DEDUP_SWEEP, TAG_EXPIRY,
    TAG_GROUP, TAG_INDEX, TAG_MESSAGE, TAG_RAFT_META, TAG_TOPIC,
};
use crate::StoreError;

impl Store {
    /// A snapshot for the replication layer, which purges its log behind it: everything the
    /// snapshot contains is durable when this returns (see [`Store::snapshot`]).
    ///
    /// # Invariants
    /// The snapshot's read transaction begins *before* the durable commit: a commit made
    /// between a sync and a later read would be in the snapshot without being durable, and a
    /// crash would leave the store behind the log's purge point.
    ///
    /// # Errors
    /// A storage error.
    pub fn durable_snapshot(&self) -> Result<SnapshotReader, StoreError> {
        let txn = self.db.begin_read()?;
        self.sync()?;
        SnapshotReader::new(txn)
    }

    /// A snapshot of the whole store as a stream read piece by piece (one read transaction,
    /// so it is consistent and never blocks writers; format in [`crate::snapshot`]).
    ///
    /// # Errors
    /// A storage error.
    pub fn snapshot(&self) -> Result<SnapshotReader, StoreError> {
        SnapshotReader::new(self.db.begin_read()?)
    }

    /// Writes a whole snapshot (see [`Store::snapshot`]) and returns what it holds.
    ///
    /// # Errors
    /// Storage or write failure.
    pub fn write_snapshot(&self, w: &mut impl std::io::Write) -> Result<SnapshotInfo, StoreError> {
        let mut r = self.snapshot()?;
        std::io::copy(&mut r, w)?;
        Ok(r.info().clone())
    }

    /// Replaces the whole store with a snapshot, durably, in one transaction. The snapshot's
    /// applied log id must be `expect`; anything malformed or unexpected leaves the store as
    /// it was.
    ///
    /// # Errors
    /// [`StoreError::BadSnapshot`], a read failure, or a storage error.
    pub fn install_snapshot(
        &self,
        r: &mut impl std::io::Read,
        expect: Option<(u64, u64)>,
    ) -> Result<(), StoreError> {
        let (applied, last) = read_header(r)?;
        if applied != expect {
            return Err(StoreError::BadSnapshot(format!(
                "applied log id {applied:?}, expected {expect:?}"
            )));
        }
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let digest;
        {
            let mut t = Tables::open(&txn)?;
            t.messages.retain(|_, _| false)?;
            t.indexes.retain(|_, _| false)?;
            t.expiry.retain(|_, _| false)?;
            t.groups.retain(|_, _| false)?;
            t.topics.retain(|_, _| false)?;
            t.dedup.retain(|_, _| false)?;
            t.dedup_sweep.retain(|_, _| false)?;
            // A stream from the earlier version has no sweep lists: each dedup row is then
            // listed on its own (as a store of that version is at open).
            let mut listed = false;
            t.digest = 0;
            let mut rm = txn.open_table(RAFT_META)?;
            rm.retain(|_, _| false)?;
            loop {
                let mut id = [0u8; 1];
                r.read_exact(&mut id)
                    .map_err(|_| bad("truncated: no end marker"))?;
                if id[0] == 0 {
                    break;
                }
                let key = read_chunk(r, SNAPSHOT_KEY_MAX)
                    .ok_or_else(|| bad("truncated or oversized key"))?;
                let value = read_chunk(r, SNAPSHOT_VALUE_MAX)
                    .ok_or_else(|| bad("truncated or oversized value"))?;
                match id[0] {
                    TAG_MESSAGE if key.len() == KEY_LEN => t.put_message(&key, &value)?,
                    TAG_INDEX => t.put_row(KeyTable::Index, &key)?,
                    TAG_EXPIRY => t.put_row(KeyTable::Expiry, &key)?,
                    TAG_GROUP if key.len() >= 8 => {
                        t.add_group(&key)?;
                    }
                    TAG_TOPIC if key.len() == 8 => {
                        // The stored counts follow from the messages installed; the row
                        // brings what they cannot tell (dead letters, the name).
                        let row = TopicRow::decode(&value).ok_or_else(|| bad("bad topic row"))?;
                        let h = TopicHash(u64::from_be_bytes(
                            key.as_slice().try_into().unwrap_or_default(),
                        ));
                        t.topic_delta(h, &row.name).1 += row.dead_lettered;
                    }
                    TAG_DEDUP_SWEEP if key.len() == 16 => {
                        swept_keys(&value).ok_or_else(|| bad("a dedup-sweep list not whole"))?;
                        t.add_sweep_row(&key, &value)?;
                        listed = true;
                    }
                    TAG_DEDUP if key.len() >= 8 => install_dedup_row(&mut t, &key, &value, listed)?,
                    TAG_RAFT_META => {
                        let k = std::str::from_utf8(&key)
                            .map_err(|_| bad("raft meta key is not UTF-8"))?;
                        rm.insert(k, value.as_slice()).map(|_| ())?;
                    }
                    _ => return Err(bad("unknown table or bad message key")),
                }
            }
            t.meta.insert(LAST_ID, last)?;
            match applied {
                Some((index, term)) => {
                    t.meta.insert(APPLIED_INDEX, index)?;
                    t.meta.insert(APPLIED_TERM, term)?;
                }
                None => {
                    t.meta.remove(APPLIED_INDEX)?;
                    t.meta.remove(APPLIED_TERM)?;
                }
            }
            digest = t.finish()?;
        }
        // An error above drops `txn` uncommitted: nothing of the snapshot is visible.
        self.commit_with_digest(txn, digest)?;
        self.last_id.store(last, Ordering::Release);
        Ok(())
    }
}

/// A snapshot's header: its applied log id and last-id.
fn read_header(r: &mut impl std::io::Read) -> Result<(Option<(u64, u64)>, u64), StoreError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)
        .map_err(|_| bad("truncated header"))?;
    if &magic != SNAPSHOT_MAGIC {
        return Err(bad("not a futureq snapshot (magic)"));
    }
    let mut u = [0u64; 3];
    for v in &mut u {
        *v = read_u64(r).map_err(|_| bad("truncated header"))?;
    }
    let [index_plus_one, term, last] = u;
    Ok((index_plus_one.checked_sub(1).map(|i| (i, term)), last))
}

/// Installs one `dedup` row; unless the stream `listed` its rows (it is from the earlier
/// version), lists it for the sweep on its own.
fn install_dedup_row(
    t: &mut Tables<'_>,
    key: &[u8],
    value: &[u8],
    listed: bool,
) -> Result<(), StoreError> {
    let (first, until) = parse_dedup_value(value).ok_or_else(|| bad("bad dedup row"))?;
    t.remember(key, &first, until)?;
    if !listed {
        t.list_alone(key, &first, until)?;
    }
    Ok(())
}

/// Largest key in a snapshot record (index keys are bounded by the message size).
const SNAPSHOT_KEY_MAX: usize = 64 << 20;
/// Largest value in a snapshot record.
const SNAPSHOT_VALUE_MAX: usize = 256 << 20;

fn read_u64(r: &mut impl std::io::Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_chunk(r: &mut impl std::io::Read, max: usize) -> Option<Vec<u8>> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n).ok()?;
    let n = u32::from_le_bytes(n) as usize;
    if n > max {
        return None;
    }
    let mut v = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut *r, n as u64), &mut v).ok()?;
    (v.len() == n).then_some(v)
}

/// A snapshot stream refused for `why`.
fn bad(why: &str) -> StoreError {
    StoreError::BadSnapshot(why.to_owned())
}
