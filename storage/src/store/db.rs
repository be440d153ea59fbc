//! Opening the database, the [`Store`] handle, and the commits that publish the digest.
//!
//! # Invariants
//! - Commits and digests are published in the same order ([`Store::commit_with_digest`]).
//! - `last-id` is raised in the same transaction as the messages that carry the ids, or by a
//!   durable reservation ([`Store::reserve_ids`]); it never goes down.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futureq_core::{EventKey, StoredMessage, TopicHash};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableHandle};

use super::schema::{
    parse_dedup_value, row_hash, APPLIED_INDEX, APPLIED_TERM, DEDUP, DEDUP_SWEEP, DIGEST, EXPIRY,
    GROUPS, INDEXES, LAST_ID, LEGACY_DEDUP_EXPIRY, MESSAGES, META, RAFT_META, ROW_DEDUP,
    ROW_DEDUP_SWEEP, ROW_EXPIRY, ROW_GROUP, ROW_INDEX, ROW_LEGACY_DEDUP_EXPIRY, ROW_MESSAGE,
    ROW_TOPIC, SYNC_MARK, TOPICS, TOPICS_COUNTED,
};
use super::tables::Tables;
use crate::StoreError;

/// Whether the database, as `txn` sees it, still holds the earlier version's sweep index.
fn holds_legacy_sweep_index(txn: &redb::ReadTransaction) -> Result<bool, StoreError> {
    Ok(txn
        .list_tables()?
        .any(|h| h.name() == LEGACY_DEDUP_EXPIRY.name()))
}

/// Where the store keeps its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreMode {
    /// One redb file in this directory, with a page cache of this many bytes.
    Disk(PathBuf, usize),
    /// In memory; lost at exit.
    Memory,
}

/// The store. Cheap to clone (shares the database).
#[derive(Clone)]
pub struct Store {
    pub(super) db: Arc<Database>,
    /// The digest as of the last commit (see the module docs).
    pub(super) digest: Arc<AtomicU64>,
    /// Held from a commit until its digest is published.
    pub(super) commit_order: Arc<std::sync::Mutex<()>>,
    pub(super) stats: Arc<ApplyStats>,
    /// `last-id` as of the last commit that wrote it (read without I/O by the writers that
    /// bound the ids they hand out beyond it).
    pub(super) last_id: Arc<AtomicU64>,
}

/// What [`Store::apply_entries`] committed since the store was opened (for the metrics).
#[derive(Debug, Default)]
pub struct ApplyStats {
    /// Apply transactions committed.
    pub transactions: AtomicU64,
    /// Log entries they applied.
    pub entries: AtomicU64,
}

impl Store {
    /// Opens (or creates) the store.
    ///
    /// # Errors
    /// The data directory cannot be created, or redb cannot open the file.
    pub fn open(mode: &StoreMode) -> Result<Self, StoreError> {
        let db = match mode {
            StoreMode::Disk(dir, cache_bytes) => {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
                    path: dir.display().to_string(),
                    source,
                })?;
                let builder = {
                    let mut b = Database::builder();
                    b.set_cache_size(*cache_bytes);
                    b
                };
                #[cfg(feature = "fault-injection")]
                let db =
                    builder.create_with_backend(crate::store_faults::FaultyBackend::create(
                        &dir.join("futureq.redb"),
                        dir.join(crate::log::faults::TRIGGER_FILE),
                    )?)?;
                #[cfg(not(feature = "fault-injection"))]
                let db = builder.create(dir.join("futureq.redb"))?;
                db
            }
            StoreMode::Memory => {
                Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?
            }
        };
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            txn.open_table(MESSAGES)?;
            txn.open_table(INDEXES)?;
            txn.open_table(EXPIRY)?;
            txn.open_table(META)?;
            txn.open_table(RAFT_META)?;
            txn.open_table(GROUPS)?;
            txn.open_table(TOPICS)?;
            txn.open_table(DEDUP)?;
            txn.open_table(DEDUP_SWEEP)?;
        }
        txn.commit()?;
        let store = Store {
            db: Arc::new(db),
            digest: Arc::new(AtomicU64::new(0)),
            commit_order: Arc::default(),
            stats: Arc::default(),
            last_id: Arc::default(),
        };
        let kept = store
            .db
            .begin_read()?
            .open_table(META)?
            .get(DIGEST)?
            .map(|v| v.value());
        let digest = match kept {
            Some(d) => d,
            None => {
                // A store written before the digest existed: compute it once.
                let d = store.computed_digest()?;
                let txn = store.begin_write(true)?;
                txn.open_table(META)?.insert(DIGEST, d)?;
                txn.commit()?;
                d
            }
        };
        store.digest.store(digest, Ordering::Relaxed);
        store.last_id.store(store.last_id()?, Ordering::Relaxed);
        store.count_topics()?;
        store.list_legacy_dedup_rows()?;
        Ok(store)
    }

    /// Moves a store of the earlier version's sweep index (`dedup-expiry`, one row per dedup
    /// id) to `dedup-sweep`, one list per row (the same lists on every replica with the same
    /// rows), and deletes the old table; a no-op when it is gone.
    pub(super) fn list_legacy_dedup_rows(&self) -> Result<(), StoreError> {
        if !holds_legacy_sweep_index(&self.db.begin_read()?)? {
            return Ok(());
        }
        let txn = self.begin_write(true)?;
        let digest;
        {
            let mut t = Tables::open(&txn)?;
            let legacy = txn.open_table(LEGACY_DEDUP_EXPIRY)?;
            let mut moved = 0u64;
            for r in legacy.range::<&[u8]>(..)? {
                let (k, _) = r?;
                let k = k.value();
                t.digest ^= row_hash(ROW_LEGACY_DEDUP_EXPIRY, k, &[]);
                let dk = k.get(8..).unwrap_or_default();
                let first = t.dedup.get(dk)?.and_then(|v| parse_dedup_value(v.value()));
                // A row gone needs no list.
                if let Some((first, until)) = first {
                    moved += u64::from(t.list_alone(dk, &first, until)?);
                }
            }
            drop(legacy);
            tracing::info!(target: "storage", rows = moved, "listed the remembered dedup ids for the sweep once (a store from an earlier version)");
            digest = t.finish()?;
        }
        txn.delete_table(LEGACY_DEDUP_EXPIRY)?;
        self.commit_with_digest(txn, digest)
    }

    /// Fills `topics` from `messages` once, for a store written before the table existed
    /// (one pass over the messages; a no-op afterwards).
    pub(super) fn count_topics(&self) -> Result<(), StoreError> {
        let txn = self.begin_write(true)?;
        let digest;
        {
            let mut t = Tables::open(&txn)?;
            if t.meta.get(TOPICS_COUNTED)?.is_some() {
                return Ok(());
            }
            let mut counts: HashMap<u64, (u64, String)> = HashMap::new();
            for r in t.messages.range::<&[u8]>(..)? {
                let (k, v) = r?;
                let Ok(key) = EventKey::from_slice(k.value()) else {
                    continue;
                };
                let c = counts.entry(key.topic_hash().0).or_default();
                c.0 += 1;
                if c.1.is_empty() {
                    c.1 = StoredMessage::topic_of(v.value()).unwrap_or("").to_owned();
                }
            }
            if !counts.is_empty() {
                tracing::info!(target: "storage", topics = counts.len(), "counted the stored messages per topic once (a store from an earlier version)");
            }
            for (h, (n, name)) in counts {
                let d = t.topic_delta(TopicHash(h), &name);
                d.0 += i64::try_from(n).unwrap_or(i64::MAX);
            }
            t.meta.insert(TOPICS_COUNTED, 1)?;
            digest = t.finish()?;
        }
        self.commit_with_digest(txn, digest)
    }

    /// Commits a transaction that wrote the data tables and publishes its digest. Commits and
    /// digests are published in the same order.
    pub(super) fn commit_with_digest(
        &self,
        txn: redb::WriteTransaction,
        digest: u64,
    ) -> Result<(), StoreError> {
        let _order = self
            .commit_order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        txn.commit()?;
        self.digest.store(digest, Ordering::Relaxed);
        Ok(())
    }

    /// The digest of the stored state as of the last commit (see the module docs).
    #[must_use]
    pub fn digest(&self) -> u64 {
        self.digest.load(Ordering::Relaxed)
    }

    /// Apply statistics, shared by every clone of the store.
    #[must_use]
    pub fn stats(&self) -> Arc<ApplyStats> {
        Arc::clone(&self.stats)
    }

    /// A handle on [`Store::digest`] for readers that must not touch the database (metrics).
    #[must_use]
    pub fn digest_cell(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.digest)
    }

    /// The digest computed from every row (the kept one must always equal it).
    ///
    /// # Errors
    /// A storage error.
    pub fn computed_digest(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        let mut d = 0;
        for (tag, def) in [
            (ROW_MESSAGE, MESSAGES),
            (ROW_TOPIC, TOPICS),
            (ROW_DEDUP, DEDUP),
            (ROW_DEDUP_SWEEP, DEDUP_SWEEP),
        ] {
            for r in txn.open_table(def)?.range::<&[u8]>(..)? {
                let (k, v) = r?;
                d ^= row_hash(tag, k.value(), v.value());
            }
        }
        for (tag, def) in [
            (ROW_INDEX, INDEXES),
            (ROW_EXPIRY, EXPIRY),
            (ROW_GROUP, GROUPS),
        ] {
            for r in txn.open_table(def)?.range::<&[u8]>(..)? {
                d ^= row_hash(tag, r?.0.value(), &[]);
            }
        }
        if holds_legacy_sweep_index(&txn)? {
            for r in txn.open_table(LEGACY_DEDUP_EXPIRY)?.range::<&[u8]>(..)? {
                d ^= row_hash(ROW_LEGACY_DEDUP_EXPIRY, r?.0.value(), &[]);
            }
        }
        Ok(d)
    }

    /// A write transaction that fsyncs on commit when `durable`.
    pub(super) fn begin_write(&self, durable: bool) -> Result<redb::WriteTransaction, StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        })?;
        Ok(txn)
    }

    /// `last-id` as of the last commit, without I/O: the highest event id applied or
    /// reserved ([`futureq_core::command::ReserveIds`], [`Store::reserve_ids`]).
    #[must_use]
    pub fn applied_last_id(&self) -> u64 {
        self.last_id.load(Ordering::Acquire)
    }

    /// Reserves [`futureq_core::command::IDS_UNAPPLIED_MAX`] ids above `last-id` in one
    /// durable commit and returns the new `last-id`: the journal's writer hands out ids from
    /// above it only, so that no id it handed out before a crash (for an entry the crash cut)
    /// is handed out again. A replicated store is raised by a committed `ReserveIds` instead.
    ///
    /// # Errors
    /// A storage error; then nothing changed.
    pub fn reserve_ids(&self) -> Result<u64, StoreError> {
        let txn = self.begin_write(true)?;
        let floor = {
            let mut meta = txn.open_table(META)?;
            let last = meta.get(LAST_ID)?.map_or(0, |v| v.value());
            let floor = last.saturating_add(futureq_core::command::IDS_UNAPPLIED_MAX);
            meta.insert(LAST_ID, floor)?;
            floor
        };
        // No data table changed: the digest stays.
        self.commit_with_digest(txn, self.digest())?;
        self.last_id.store(floor, Ordering::Release);
        Ok(floor)
    }

    /// The highest event id ever stored or reserved (0 for a new store).
    ///
    /// # Errors
    /// A storage error.
    pub fn last_id(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        Ok(meta.get(LAST_ID)?.map_or(0, |v| v.value()))
    }

    /// The last applied Raft log id `(index, term)`, if any entry was applied.
    ///
    /// # Errors
    /// A storage error.
    pub fn applied(&self) -> Result<Option<(u64, u64)>, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let index = meta.get(APPLIED_INDEX)?.map(|v| v.value());
        let term = meta.get(APPLIED_TERM)?.map(|v| v.value());
        Ok(index.zip(term))
    }

    /// Makes every earlier commit durable (one fsynced commit). Callers that apply without
    /// fsync call it before anything may rely on the applied state surviving a crash, such as
    /// purging the Raft log behind a snapshot.
    ///
    /// # Errors
    /// A storage error.
    pub fn sync(&self) -> Result<(), StoreError> {
        let txn = self.begin_write(true)?;
        {
            // A write makes sure redb really commits (and fsyncs) this transaction.
            let mut rm = txn.open_table(RAFT_META)?;
            rm.insert(SYNC_MARK, [].as_slice())?;
        }
        txn.commit()?;
        Ok(())
    }

    /// A value of the replication layer's state (see [`Store::apply_entries`]).
    ///
    /// # Errors
    /// A storage error.
    pub fn raft_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(RAFT_META)?;
        Ok(t.get(key)?.map(|v| v.value().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futureq_core::command::{encode_store, StoreBatch, StoreItem};

    fn item(topic: &str, id: u64) -> StoreItem {
        let m = StoredMessage {
            topic: topic.into(),
            payload: Bytes::from_static(b"x"),
            enqueued_at_ms: 1000,
            delay: futureq_core::DelayMs(0),
            ttl: futureq_core::TtlMs(0),
            indexes: vec![],
            extras: Default::default(),
        };
        StoreItem {
            event_id: id,
            bucket: 1000,
            topic_hash: futureq_core::topic_hash(topic).0,
            expires_at_ms: 0,
            index_keys: vec![],
            message: m.encode().to_vec(),
        }
    }

    /// A message of `topic` enqueued at `enq_ms` whose dedup id `dedup_id` is remembered for
    /// 10 s.
    fn deduped(topic: &str, id: u64, dedup_id: &str, enq_ms: i64) -> StoreItem {
        let mut it = item(topic, id);
        let mut m = StoredMessage::decode(&Bytes::from(it.message.clone())).unwrap();
        m.enqueued_at_ms = enq_ms;
        m.extras.dedup_id = dedup_id.into();
        m.extras.dedup_until_ms = enq_ms + 10_000;
        it.message = m.encode().to_vec();
        it
    }

    /// Every row of a key-value table.
    fn all_rows(t: &impl ReadableTable<&'static [u8], &'static [u8]>) -> Vec<(Vec<u8>, Vec<u8>)> {
        t.range::<&[u8]>(..)
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.value().to_vec(), v.value().to_vec())
            })
            .collect()
    }

    /// A store from before the `topics` table (no rows, no mark, a digest without them) is
    /// counted once at open, digest included.
    #[test]
    fn a_store_without_topic_counts_is_counted_once() {
        let s = Store::open(&StoreMode::Memory).unwrap();
        let cmd = encode_store(&StoreBatch {
            items: vec![item("a", 1), item("a", 2), item("b", 3)],
        });
        s.apply_entries(&[(1, 1, &cmd)], &[], true).unwrap();
        let counted = s.topic_stats(None, usize::MAX).unwrap();
        assert_eq!(counted.len(), 2);
        // Back to the earlier version's state.
        let txn = s.begin_write(true).unwrap();
        {
            let mut t = Tables::open(&txn).unwrap();
            let rows = all_rows(&t.topics);
            for (k, v) in rows {
                t.topics.remove(k.as_slice()).unwrap();
                t.digest ^= row_hash(ROW_TOPIC, &k, &v);
            }
            t.meta.remove(TOPICS_COUNTED).unwrap();
            let d = t.finish().unwrap();
            s.digest.store(d, Ordering::Relaxed);
        }
        txn.commit().unwrap();
        assert!(s.topic_stats(None, usize::MAX).unwrap().is_empty());
        assert_eq!(s.digest(), s.computed_digest().unwrap());
        s.count_topics().unwrap();
        assert_eq!(s.topic_stats(None, usize::MAX).unwrap(), counted);
        assert_eq!(s.digest(), s.computed_digest().unwrap());
        let before = s.digest();
        s.count_topics().unwrap();
        assert_eq!(s.digest(), before, "counted once");
    }

    /// A store of the earlier version (one `dedup-expiry` row per dedup id, no lists) is
    /// listed once at open: the old table gone, the digest kept in step, and the id swept
    /// after its window as before.
    #[test]
    fn a_store_with_the_earlier_sweep_index_is_listed_once() {
        use super::super::schema::{dedup_key, sweep_key_until, DEDUP_CLOCK_SKEW_MAX_MS};
        let s = Store::open(&StoreMode::Memory).unwrap();
        let cmd = encode_store(&StoreBatch {
            items: vec![deduped("a", 1, "x", 1000)],
        });
        s.apply_entries(&[(1, 1, &cmd)], &[], true).unwrap();
        let dk = dedup_key(futureq_core::topic_hash("a"), "x");
        // Back to the earlier version's state: its row in `dedup-expiry`, no lists.
        let txn = s.begin_write(true).unwrap();
        {
            let mut t = Tables::open(&txn).unwrap();
            let lists = all_rows(&t.dedup_sweep);
            assert_eq!(lists.len(), 1);
            for (k, v) in lists {
                t.dedup_sweep.remove(k.as_slice()).unwrap();
                t.digest ^= row_hash(ROW_DEDUP_SWEEP, &k, &v);
            }
            let mut legacy_key = 11_000u64.to_be_bytes().to_vec();
            legacy_key.extend_from_slice(&dk);
            let mut legacy = txn.open_table(LEGACY_DEDUP_EXPIRY).unwrap();
            legacy.insert(legacy_key.as_slice(), ()).unwrap();
            t.digest ^= row_hash(ROW_LEGACY_DEDUP_EXPIRY, &legacy_key, &[]);
            let d = t.finish().unwrap();
            s.digest.store(d, Ordering::Relaxed);
        }
        txn.commit().unwrap();
        assert_eq!(s.digest(), s.computed_digest().unwrap());
        s.list_legacy_dedup_rows().unwrap();
        assert!(!holds_legacy_sweep_index(&s.db.begin_read().unwrap()).unwrap());
        assert_eq!(s.digest(), s.computed_digest().unwrap());
        let txn = s.db.begin_read().unwrap();
        let lists: Vec<i64> = txn
            .open_table(DEDUP_SWEEP)
            .unwrap()
            .range::<&[u8]>(..)
            .unwrap()
            .map(|r| sweep_key_until(r.unwrap().0.value()))
            .collect();
        assert_eq!(lists, vec![11_000]);
        drop(txn);
        // A later command past the window and the allowance forgets it.
        let later = deduped("a", 2, "y", 11_000 + DEDUP_CLOCK_SKEW_MAX_MS);
        let cmd = encode_store(&StoreBatch { items: vec![later] });
        s.apply_entries(&[(2, 1, &cmd)], &[], true).unwrap();
        let txn = s.db.begin_read().unwrap();
        assert!(txn
            .open_table(DEDUP)
            .unwrap()
            .get(dk.as_slice())
            .unwrap()
            .is_none());
        drop(txn);
        assert_eq!(s.digest(), s.computed_digest().unwrap());
        let before = (
            s.digest(),
            all_rows(&s.db.begin_read().unwrap().open_table(DEDUP_SWEEP).unwrap()),
        );
        s.list_legacy_dedup_rows().unwrap();
        let after = (
            s.digest(),
            all_rows(&s.db.begin_read().unwrap().open_table(DEDUP_SWEEP).unwrap()),
        );
        assert_eq!(after, before, "listed once");
    }

    /// A sweep list that is not whole (corrupt bytes) fails the apply that meets it, by type,
    /// instead of being dropped with the rows it names left behind; nothing of that apply is
    /// kept.
    #[test]
    fn a_corrupt_sweep_list_fails_the_apply_that_meets_it() {
        use super::super::schema::DEDUP_CLOCK_SKEW_MAX_MS;
        let s = Store::open(&StoreMode::Memory).unwrap();
        let first = encode_store(&StoreBatch {
            items: vec![deduped("a", 1, "x", 1000)],
        });
        s.apply_entries(&[(1, 1, &first)], &[], true).unwrap();
        let txn = s.begin_write(true).unwrap();
        {
            let mut t = Tables::open(&txn).unwrap();
            let (k, v) = all_rows(&t.dedup_sweep).remove(0);
            t.dedup_sweep
                .insert(k.as_slice(), &v[..v.len() - 1])
                .unwrap();
        }
        txn.commit().unwrap();
        let later = encode_store(&StoreBatch {
            items: vec![deduped("a", 2, "y", 11_000 + DEDUP_CLOCK_SKEW_MAX_MS)],
        });
        let e = s.apply_entries(&[(2, 1, &later)], &[], true).unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::CorruptMeta {
                    key: "dedup-sweep",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(s.applied().unwrap(), Some((1, 1)), "nothing of it kept");
    }

    /// A command's list is written in rows of at most 64 keys: a sweep that cuts one rewrites
    /// at most that many (a row of a whole 8,192-id command was rewritten by every small
    /// command after it, review of issue 29).
    #[test]
    fn a_commands_sweep_list_is_written_in_short_rows() {
        use super::super::schema::swept_keys;
        let s = Store::open(&StoreMode::Memory).unwrap();
        let items = (0..1000)
            .map(|i| deduped("a", i + 1, &format!("id-{i}"), 1000))
            .collect();
        let cmd = encode_store(&StoreBatch { items });
        s.apply_entries(&[(1, 1, &cmd)], &[], true).unwrap();
        let rows = all_rows(&s.db.begin_read().unwrap().open_table(DEDUP_SWEEP).unwrap());
        let sizes: Vec<usize> = rows
            .iter()
            .map(|(_, v)| swept_keys(v).unwrap().len())
            .collect();
        assert_eq!(sizes.len(), 16, "{sizes:?}");
        assert!(sizes.iter().all(|&n| n <= 64), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 1000);
        assert_eq!(s.digest(), s.computed_digest().unwrap());
    }
}
