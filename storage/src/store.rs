//! The synchronous redb store.
//!
//! Tables:
//!
//! | table | key | value |
//! |---|---|---|
//! | `messages` | 24-byte event key | encoded [`StoredMessage`] |
//! | `indexes` | index key ([`futureq_core::IndexValue::index_key`]) · event key | () |
//! | `expiry` | expires-at (u64 BE ms) · event key | () |
//! | `meta` | name | u64 (`last-id`, `digest`, applied log id) |
//! | `groups` | topic hash (u64 BE) · group name | () |
//! | `topics` | topic hash (u64 BE) | [`TopicRow`]: stored (u64 LE) · dead-lettered (u64 LE) · name |
//! | `dedup` | topic hash (u64 BE) · dedup id | key of the message stored first (24) · until (i64 LE ms) |
//! | `dedup-expiry` | until (u64 BE ms) · `dedup` key | () |
//!
//! A message with a dedup id ([`futureq_core::Extras`]) is stored only when its
//! `(topic, dedup id)` has no `dedup` row whose until lies after the message's enqueue time;
//! otherwise the apply answers the first message's key. Rows past their until are removed by
//! later applies of dedup ids (a few per item, oldest first, by `dedup-expiry`). Every
//! decision reads only the entry and the applied state: replicas agree.
//!
//! `topics` holds per topic the exact number of rows in `messages` (kept by every write that
//! adds or removes one, in the same transaction) and the dead letters moved out of it since
//! the store was created; a topic's row exists while either is non-zero. A store written
//! before the table existed is counted once at open.
//!
//! The **digest** is the XOR of one hash per row of `messages`, `indexes`, `expiry`,
//! `groups`, `topics`, `dedup` and `dedup-expiry`: a function of the stored state alone, whatever the order of the writes that led
//! to it, kept in `meta` by every transaction that changes those tables. Replicas that applied
//! the same log have the same digest ([`Store::digest`]).
//!
//! Every method is blocking: call them only off the executors (the write core's blocking
//! threads, the reader and admin threads in [`crate::service`]).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futureq_core::hub::{ScanRequest, ScanResult};
use futureq_core::{EventKey, StoredMessage, TopicHash, KEY_LEN};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use crate::snapshot::{
    SnapshotReader, SNAPSHOT_MAGIC, TAG_DEDUP, TAG_EXPIRY, TAG_GROUP, TAG_INDEX, TAG_MESSAGE,
    TAG_RAFT_META, TAG_TOPIC,
};
use crate::StoreError;

pub(crate) const MESSAGES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("messages");
pub(crate) const INDEXES: TableDefinition<&[u8], ()> = TableDefinition::new("indexes");
pub(crate) const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The durable group registry: topic hash (u64 BE) · group name → ().
pub(crate) const GROUPS: TableDefinition<&[u8], ()> = TableDefinition::new("groups");
/// Per-topic counts: topic hash (u64 BE) → [`TopicRow`] (see the module docs).
pub(crate) const TOPICS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("topics");
/// Remembered dedup ids (see the module docs).
pub(crate) const DEDUP: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dedup");
/// `dedup` rows by when they are forgotten.
pub(crate) const DEDUP_EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("dedup-expiry");
/// Most expired `dedup` rows one item with a dedup id removes.
const DEDUP_SWEEP: usize = 8;
/// How far a writer's clock may run ahead of another's (or step forward and back) without
/// making a dedup id forgotten early: the check judges each message by its own enqueue
/// time, and the sweep removes a row only once a message's clock passed its window's end by
/// this much more. The rule: a message is a duplicate when a message with the same
/// `(topic, dedup id)` was stored and `its enqueue time < that message's enqueue time +
/// publish.dedupWindow`. A clock stepped back keeps ids longer; one ahead by up to this much
/// forgets none early; ahead by more, ids whose window would still be open by the other
/// clocks can be forgotten (they are then stored again).
pub const DEDUP_CLOCK_SKEW_MAX_MS: i64 = 60_000;
/// Opaque state of the replication layer (applied log id, membership), written with the
/// data it describes.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft-meta");
pub(crate) const LAST_ID: &str = "last-id";
pub(crate) const APPLIED_INDEX: &str = "applied-index";
pub(crate) const APPLIED_TERM: &str = "applied-term";
/// The digest of the data tables (see the module docs).
const DIGEST: &str = "digest";
/// Meta key set once `topics` counts every stored message (a store written before it
/// existed is counted at open).
const TOPICS_COUNTED: &str = "topics-counted";
/// Raft-meta key written by [`Store::sync`] so that its transaction has a change to commit.
const SYNC_MARK: &str = "sync";

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
    db: Arc<Database>,
    /// The digest as of the last commit (see the module docs).
    digest: Arc<AtomicU64>,
    /// Held from a commit until its digest is published.
    commit_order: Arc<std::sync::Mutex<()>>,
    stats: Arc<ApplyStats>,
    /// `last-id` as of the last commit that wrote it (read without I/O by the writers that
    /// bound the ids they hand out beyond it).
    last_id: Arc<AtomicU64>,
}

/// What [`Store::apply_entries`] committed since the store was opened (for the metrics).
#[derive(Debug, Default)]
pub struct ApplyStats {
    /// Apply transactions committed.
    pub transactions: AtomicU64,
    /// Log entries they applied.
    pub entries: AtomicU64,
}

/// Table tags of the digest's row hashes.
const ROW_MESSAGE: u64 = 1;
const ROW_INDEX: u64 = 2;
const ROW_EXPIRY: u64 = 3;
const ROW_GROUP: u64 = 5;
const ROW_TOPIC: u64 = 6;
const ROW_DEDUP: u64 = 7;
const ROW_DEDUP_EXPIRY: u64 = 8;

fn dedup_key(topic_hash: TopicHash, dedup_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + dedup_id.len());
    k.extend_from_slice(&topic_hash.0.to_be_bytes());
    k.extend_from_slice(dedup_id.as_bytes());
    k
}

/// The start of the dedup keys that remember the dead letters of `original` (on its
/// dead-letter topic `dlq`), one per recipient after it.
fn once_prefix(dlq: &str, original: &EventKey) -> Vec<u8> {
    dedup_key(
        futureq_core::topic_hash(dlq),
        &format!("\0dead-letter\0{original}\0"),
    )
}

fn dedup_value(first: &EventKey, until_ms: i64) -> [u8; KEY_LEN + 8] {
    let mut v = [0u8; KEY_LEN + 8];
    v[..KEY_LEN].copy_from_slice(&first.0);
    v[KEY_LEN..].copy_from_slice(&until_ms.to_le_bytes());
    v
}

/// A `dedup` row's value: the first key and until (`None` for bytes the store never writes).
fn parse_dedup_value(v: &[u8]) -> Option<(EventKey, i64)> {
    let key = EventKey::from_slice(v.get(..KEY_LEN)?).ok()?;
    let until = i64::from_le_bytes(v.get(KEY_LEN..KEY_LEN + 8)?.try_into().ok()?);
    Some((key, until))
}

fn dedup_expiry_key(until_ms: i64, dedup_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + dedup_key.len());
    k.extend_from_slice(&u64::try_from(until_ms.max(0)).unwrap_or(0).to_be_bytes());
    k.extend_from_slice(dedup_key);
    k
}

/// One topic's counts (a `topics` row).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicRow {
    /// Messages stored for the topic.
    pub stored: u64,
    /// Copies moved to its dead-letter topic since the store was created.
    pub dead_lettered: u64,
    /// The topic's name.
    pub name: String,
}

impl TopicRow {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16 + self.name.len());
        v.extend_from_slice(&self.stored.to_le_bytes());
        v.extend_from_slice(&self.dead_lettered.to_le_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v
    }

    /// Decodes a row the store wrote (`None` for bytes it could not have written).
    fn decode(v: &[u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(v.get(at..at + 8)?.try_into().ok()?))
        };
        Some(TopicRow {
            stored: word(0)?,
            dead_lettered: word(8)?,
            name: std::str::from_utf8(v.get(16..)?).ok()?.to_owned(),
        })
    }
}

/// What [`Store::topic_stats`] reads for one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicStat {
    /// The topic's hash.
    pub topic_hash: TopicHash,
    /// Its counts.
    pub row: TopicRow,
    /// The earliest due instant among its stored messages (Unix ms), if any is stored.
    pub next_due_ms: Option<i64>,
}

/// What [`Store::topic_counts`] reads: the topics with the most stored messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicCounts {
    /// Up to the asked number of topics with stored messages: (name, stored), most first
    /// (ties by name).
    pub top: Vec<(String, u64)>,
    /// Messages stored for every other topic.
    pub rest: u64,
}

/// One row's share of the digest.
fn row_hash(table: u64, key: &[u8], value: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh64::Xxh64::new(table);
    h.update(&(key.len() as u64).to_le_bytes());
    h.update(key);
    h.update(value);
    h.digest()
}

fn expiry_key(expires_at_ms: i64, key: &EventKey) -> [u8; 8 + KEY_LEN] {
    let mut k = [0u8; 8 + KEY_LEN];
    k[..8].copy_from_slice(
        &u64::try_from(expires_at_ms.max(0))
            .unwrap_or(0)
            .to_be_bytes(),
    );
    k[8..].copy_from_slice(&key.0);
    k
}

/// The event key of an expiry-table key (`expires-at · event key`; the store writes only
/// full-length keys, a short one reads as zeros rather than panicking).
fn expiry_entry_key(k: &[u8]) -> EventKey {
    let mut e = [0u8; KEY_LEN];
    if let Some(key) = k.get(8..8 + KEY_LEN) {
        e.copy_from_slice(key);
    }
    EventKey(e)
}

fn group_key(topic_hash: TopicHash, group: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + group.len());
    k.extend_from_slice(&topic_hash.0.to_be_bytes());
    k.extend_from_slice(group.as_bytes());
    k
}

fn index_entry(index_key: &[u8], key: &EventKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(index_key.len() + KEY_LEN);
    k.extend_from_slice(index_key);
    k.extend_from_slice(&key.0);
    k
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
            txn.open_table(DEDUP_EXPIRY)?;
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
        Ok(store)
    }

    /// Fills `topics` from `messages` once, for a store written before the table existed
    /// (one pass over the messages; a no-op afterwards).
    fn count_topics(&self) -> Result<(), StoreError> {
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
    fn commit_with_digest(
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
            (ROW_DEDUP_EXPIRY, DEDUP_EXPIRY),
        ] {
            for r in txn.open_table(def)?.range::<&[u8]>(..)? {
                d ^= row_hash(tag, r?.0.value(), &[]);
            }
        }
        Ok(d)
    }

    /// A write transaction that fsyncs on commit when `durable`.
    fn begin_write(&self, durable: bool) -> Result<redb::WriteTransaction, StoreError> {
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

    /// The groups registered for a topic (`RegisterGroup` commands applied, `DeleteGroup`
    /// not), by name.
    ///
    /// # Errors
    /// A storage error.
    pub fn groups_of(&self, topic_hash: TopicHash) -> Result<Vec<String>, StoreError> {
        Ok(self
            .groups(Some(topic_hash), usize::MAX)?
            .into_iter()
            .map(|(_, g)| g)
            .collect())
    }

    /// The registered groups of every topic (or only `only`), by topic hash then name; at
    /// most `limit`.
    ///
    /// # Errors
    /// A storage error.
    pub fn groups(
        &self,
        only: Option<TopicHash>,
        limit: usize,
    ) -> Result<Vec<(TopicHash, String)>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(GROUPS)?;
        let start = only.map_or([0; 8], |h| h.0.to_be_bytes());
        let mut out = Vec::new();
        for r in t.range(start.as_slice()..)?.take(limit) {
            let (k, _) = r?;
            let k = k.value();
            let Some((h, name)) = k.split_first_chunk::<8>() else {
                continue;
            };
            if only.is_some() && *h != start {
                break;
            }
            out.push((
                TopicHash(u64::from_be_bytes(*h)),
                String::from_utf8_lossy(name).into_owned(),
            ));
        }
        Ok(out)
    }

    /// Whether `group` is registered for the topic.
    ///
    /// # Errors
    /// A storage error.
    pub fn has_group(&self, topic_hash: TopicHash, group: &str) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(GROUPS)?;
        Ok(t.get(group_key(topic_hash, group).as_slice())?.is_some())
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

    /// Applies committed Raft entries `(index, term, command)` in one write transaction,
    /// together with the new applied log id and the raised `last-id`. Entries at or below
    /// the applied index are skipped (replay after a restart); an empty command is a no-op
    /// that only advances the applied index.
    ///
    /// # Invariants
    /// - **Event ids never regress**: a store command is applied only when its ids are
    ///   strictly increasing and all above the highest id applied so far (`last-id`);
    ///   otherwise the whole batch is refused (its ids were assigned by a leader of an
    ///   earlier term and may collide with stored messages). Nothing of it is written.
    /// - A command that fails validation is refused and skipped, never fatal.
    ///
    /// Both decisions depend only on the entries and the applied state, so every replica
    /// takes the same one; they are reported in [`ApplyOutcome::refused`].
    ///
    /// `durable` = false commits without fsync: allowed because the log (the Raft log or the
    /// journal) holds the entries, as long as it is not purged past the last durably applied
    /// index.
    ///
    /// # Errors
    /// A storage error; then nothing changed.
    pub fn apply_entries(
        &self,
        entries: &[(u64, u64, &[u8])],
        raft_meta: &[(&str, &[u8])],
        durable: bool,
    ) -> Result<ApplyOutcome, StoreError> {
        use futureq_core::command::{decode, CommandRef};
        let applied = self.applied()?.map(|(i, _)| i);
        let fresh: Vec<&(u64, u64, &[u8])> = entries
            .iter()
            .filter(|(i, _, _)| applied.is_none_or(|a| *i > a))
            .collect();
        let mut out = ApplyOutcome {
            max_event_id: self.last_id()?,
            ..ApplyOutcome::default()
        };
        let Some(&&(last_index, last_term, _)) = fresh.last() else {
            return Ok(out);
        };
        let mut commands = Vec::with_capacity(fresh.len());
        for (index, _, bytes) in &fresh {
            if !bytes.is_empty() {
                match decode(bytes) {
                    Ok(c) => commands.push((*index, c)),
                    Err(e) => out.refused.push((
                        *index,
                        Refusal::Undecodable {
                            reason: e.to_string(),
                        },
                    )),
                }
            }
        }
        let txn = self.begin_write(durable)?;
        let mut stored = Vec::new();
        let digest;
        {
            let mut t = Tables::open(&txn)?;
            for (index, c) in &commands {
                match c {
                    CommandRef::Store(b) => {
                        if let Err(r) = ids_above(b, out.max_event_id) {
                            out.refused.push((*index, r));
                            continue;
                        }
                        let mut dups = Vec::new();
                        for item in b.items.iter() {
                            let key = item.key();
                            out.max_event_id = out.max_event_id.max(key.event_id().0);
                            if let Some(first) = t.deduplicate(&key, item.message.as_slice())? {
                                dups.push((key.event_id().0, first));
                                continue;
                            }
                            stored.push(key);
                            let exp = item.expires_at_ms.to_native();
                            t.insert(
                                &key,
                                (exp != 0).then_some(exp),
                                item.index_keys.iter().map(|k| k.as_slice()),
                                item.message.as_slice(),
                            )?;
                            out.stored += 1;
                        }
                        if !dups.is_empty() {
                            out.answers
                                .push((*index, futureq_core::command::Answer::Deduplicated(dups)));
                        }
                    }
                    CommandRef::Delete(d) => {
                        for k in d.keys.iter() {
                            let key = EventKey(*k);
                            t.remove(&key)?;
                            out.deleted.push(key);
                        }
                    }
                    CommandRef::Cancel(c) => {
                        let mut cancelled = Vec::with_capacity(c.keys.len());
                        for k in c.keys.iter() {
                            let key = EventKey(*k);
                            cancelled.push(t.remove(&key)?);
                            out.deleted.push(key);
                        }
                        out.answers
                            .push((*index, futureq_core::command::Answer::Cancelled(cancelled)));
                    }
                    CommandRef::Reschedule(r) => {
                        if let Err(refusal) = take_id(r.event_id.to_native(), &mut out) {
                            out.refused.push((*index, refusal));
                            continue;
                        }
                        let moved = t.reschedule(r)?;
                        if let Some(key) = moved {
                            out.deleted.push(EventKey(r.key));
                            stored.push(key);
                        }
                        out.answers
                            .push((*index, futureq_core::command::Answer::Rescheduled(moved)));
                    }
                    CommandRef::DeadLetter(d) => {
                        // A leader never builds a longer group (consumers' group ids are
                        // checked); the copy could not be encoded: refused, never fatal.
                        if d.group.len() > futureq_core::message::TOPIC_LEN_MAX {
                            out.refused.push((
                                *index,
                                Refusal::Undecodable {
                                    reason: format!(
                                        "a dead letter's group of {} bytes",
                                        d.group.len()
                                    ),
                                },
                            ));
                            continue;
                        }
                        if let Err(refusal) = take_id(d.event_id.to_native(), &mut out) {
                            out.refused.push((*index, refusal));
                            continue;
                        }
                        let (copy, new) = t.dead_letter(d)?;
                        if new {
                            stored.extend(copy);
                        }
                        out.answers
                            .push((*index, futureq_core::command::Answer::DeadLettered(copy)));
                    }
                    CommandRef::RegisterGroup(r) => {
                        t.add_group(&group_key(
                            TopicHash(r.topic_hash.to_native()),
                            r.group.as_str(),
                        ))?;
                    }
                    CommandRef::DeleteGroup(d) => {
                        let found = t.remove_group(&group_key(
                            TopicHash(d.topic_hash.to_native()),
                            d.group.as_str(),
                        ))?;
                        out.answers
                            .push((*index, futureq_core::command::Answer::GroupDeleted(found)));
                    }
                }
            }
            t.meta.insert(LAST_ID, out.max_event_id)?;
            t.meta.insert(APPLIED_INDEX, last_index)?;
            t.meta.insert(APPLIED_TERM, last_term)?;
            digest = t.finish()?;
            let mut rm = txn.open_table(RAFT_META)?;
            for (k, v) in raft_meta {
                rm.insert(*k, *v)?;
            }
        }
        self.commit_with_digest(txn, digest)?;
        self.last_id.store(out.max_event_id, Ordering::Release);
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        self.stats
            .entries
            .fetch_add(fresh.len() as u64, Ordering::Relaxed);
        out.refused.sort_by_key(|(i, _)| *i);
        out.applied = Some((last_index, last_term));
        out.published = futureq_core::key::min_key_per_topic(stored);
        Ok(out)
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

    /// Up to `limit` keys whose TTL passed at `now_ms`, oldest expiry first (read only: in a
    /// cluster their deletion is a replicated command).
    ///
    /// # Errors
    /// A storage error.
    pub fn expired_keys(&self, now_ms: i64, limit: usize) -> Result<Vec<EventKey>, StoreError> {
        let txn = self.db.begin_read()?;
        let expiry = txn.open_table(EXPIRY)?;
        let upper = expiry_key(now_ms.saturating_add(1), &EventKey([0; KEY_LEN]));
        let keys = expiry
            .range(..upper.as_slice())?
            .take(limit)
            .map(|r| r.map(|(k, _)| expiry_entry_key(k.value())))
            .collect::<Result<_, _>>()?;
        Ok(keys)
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
        let bad = |m: &str| StoreError::BadSnapshot(m.to_owned());
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
        let applied = index_plus_one.checked_sub(1).map(|i| (i, term));
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
            t.dedup_expiry.retain(|_, _| false)?;
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
                    TAG_DEDUP if key.len() >= 8 => {
                        let (first, until) =
                            parse_dedup_value(&value).ok_or_else(|| bad("bad dedup row"))?;
                        t.remember(&key, &first, until)?;
                    }
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

    /// Reads the due range of one topic.
    ///
    /// # Errors
    /// A storage error. Values that fail to decode are skipped and logged.
    pub fn scan(&self, req: &ScanRequest) -> Result<ScanResult, StoreError> {
        let txn = self.db.begin_read()?;
        let messages = txn.open_table(MESSAGES)?;
        scan_table(&messages, req)
    }

    /// Reads the due ranges of several topics from one read transaction (one snapshot):
    /// one result per request, in order.
    ///
    /// # Errors
    /// The transaction could not start; a failed range is its own result's error.
    pub fn scan_all(
        &self,
        reqs: &[ScanRequest],
    ) -> Result<Vec<Result<ScanResult, StoreError>>, StoreError> {
        let txn = self.db.begin_read()?;
        let messages = txn.open_table(MESSAGES)?;
        Ok(reqs.iter().map(|r| scan_table(&messages, r)).collect())
    }
}

/// Most rows [`next_due`] reads: the first bucket's rows are due within the bucket, so with
/// `delivery.timeBucket` at 1 ms (the default) they are all due at the same instant.
const NEXT_DUE_ROWS: usize = 64;

/// The earliest due instant among a topic's first rows: those of its first bucket (at most
/// [`NEXT_DUE_ROWS`]).
fn next_due(
    messages: &redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    h: TopicHash,
) -> Result<Option<i64>, StoreError> {
    let mut due: Option<i64> = None;
    let mut first_bucket = None;
    for r in messages
        .range(EventKey::topic_start(h).0.as_slice()..)?
        .take(NEXT_DUE_ROWS)
    {
        let (k, v) = r?;
        let Ok(key) = EventKey::from_slice(k.value()) else {
            break;
        };
        if key.topic_hash() != h || *first_bucket.get_or_insert(key.bucket()) != key.bucket() {
            break;
        }
        if let Some(d) = StoredMessage::due_of(v.value()) {
            due = Some(due.map_or(d, |m| m.min(d)));
        }
    }
    Ok(due)
}

/// [`Store::scan`] within an open table.
fn scan_table(
    messages: &redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    req: &ScanRequest,
) -> Result<ScanResult, StoreError> {
    {
        let mut res = ScanResult::default();
        let mut seen = 0usize;
        let mut bytes = 0usize;
        for r in messages.range(req.from.0.as_slice()..req.upper.0.as_slice())? {
            let (k, v) = r?;
            seen += 1;
            if seen > req.limit || bytes >= futureq_core::hub::SCAN_BYTES_MAX {
                // Not exhausted: the caller continues from after the last returned key.
                seen = req.limit + 1;
                break;
            }
            bytes += v.value().len();
            let Ok(key) = EventKey::from_slice(k.value()) else {
                continue;
            };
            match StoredMessage::decode(&Bytes::copy_from_slice(v.value())) {
                Ok(m) => res.items.push((key, Arc::new(m))),
                Err(e) => {
                    tracing::error!(target: "storage", ?key, error = %e, "skipping undecodable message")
                }
            }
        }
        res.exhausted = seen <= req.limit;
        if res.exhausted {
            let h = req.topic_hash;
            let next = match h.next() {
                Some(n) => messages
                    .range(req.upper.0.as_slice()..EventKey::topic_start(n).0.as_slice())?
                    .next(),
                None => messages.range(req.upper.0.as_slice()..)?.next(),
            };
            if let Some(r) = next {
                let (k, _) = r?;
                res.next_key = EventKey::from_slice(k.value()).ok();
            }
        }
        Ok(res)
    }
}

impl Store {
    /// Reads one message (tests and tools).
    ///
    /// # Errors
    /// A storage error.
    pub fn get(&self, key: &EventKey) -> Result<Option<Bytes>, StoreError> {
        let txn = self.db.begin_read()?;
        let messages = txn.open_table(MESSAGES)?;
        Ok(messages
            .get(key.0.as_slice())?
            .map(|v| Bytes::copy_from_slice(v.value())))
    }

    /// The names of the topics of `hashes` that have a row (a topic with a message stored
    /// has one), in one read transaction; hashes without a row are left out.
    ///
    /// # Errors
    /// A storage error.
    pub fn topic_names(
        &self,
        hashes: &[TopicHash],
    ) -> Result<Vec<(TopicHash, String)>, StoreError> {
        let txn = self.db.begin_read()?;
        let topics = txn.open_table(TOPICS)?;
        let mut out = Vec::with_capacity(hashes.len());
        for h in hashes {
            if let Some(v) = topics.get(h.0.to_be_bytes().as_slice())? {
                if let Some(row) = TopicRow::decode(v.value()) {
                    out.push((*h, row.name));
                }
            }
        }
        Ok(out)
    }

    /// Per topic: its counts and the earliest due instant of its stored messages, sorted by
    /// hash; only `only` when given; at most `limit` + 1 topics (more than `limit` tells the
    /// caller there are too many). O(topics): one row and one short range read per topic.
    ///
    /// # Errors
    /// A storage error.
    pub fn topic_stats(
        &self,
        only: Option<TopicHash>,
        limit: usize,
    ) -> Result<Vec<TopicStat>, StoreError> {
        let txn = self.db.begin_read()?;
        let topics = txn.open_table(TOPICS)?;
        let messages = txn.open_table(MESSAGES)?;
        let mut out = Vec::new();
        let mut add = |k: &[u8], v: &[u8]| -> Result<(), StoreError> {
            let (Ok(h), Some(row)) = (<[u8; 8]>::try_from(k), TopicRow::decode(v)) else {
                return Ok(());
            };
            let topic_hash = TopicHash(u64::from_be_bytes(h));
            out.push(TopicStat {
                topic_hash,
                next_due_ms: next_due(&messages, topic_hash)?,
                row,
            });
            Ok(())
        };
        match only {
            Some(h) => {
                if let Some(v) = topics.get(h.0.to_be_bytes().as_slice())? {
                    add(&h.0.to_be_bytes(), v.value())?;
                }
            }
            None => {
                for r in topics.range::<&[u8]>(..)?.take(limit.saturating_add(1)) {
                    let (k, v) = r?;
                    add(k.value(), v.value())?;
                }
            }
        }
        Ok(out)
    }

    /// The `top` topics with the most stored messages and the sum over the others (the
    /// per-topic gauges of the metrics). O(topics) rows read, O(`top`) kept; topics with
    /// nothing stored are left out.
    ///
    /// # Errors
    /// A storage error.
    pub fn topic_counts(&self, top: usize) -> Result<TopicCounts, StoreError> {
        use std::cmp::Reverse;
        let txn = self.db.begin_read()?;
        let topics = txn.open_table(TOPICS)?;
        // The least of the kept on top: it leaves first when a larger one comes.
        let mut kept: std::collections::BinaryHeap<Reverse<(u64, Reverse<String>)>> =
            std::collections::BinaryHeap::with_capacity(top.saturating_add(1));
        let mut rest = 0u64;
        for r in topics.range::<&[u8]>(..)? {
            let (_, v) = r?;
            let Some(row) = TopicRow::decode(v.value()) else {
                continue;
            };
            if row.stored == 0 {
                continue;
            }
            kept.push(Reverse((row.stored, Reverse(row.name))));
            if kept.len() > top {
                if let Some(Reverse((n, _))) = kept.pop() {
                    rest = rest.saturating_add(n);
                }
            }
        }
        let mut top: Vec<(String, u64)> = kept
            .into_iter()
            .map(|Reverse((n, Reverse(name)))| (name, n))
            .collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(TopicCounts { top, rest })
    }

    /// Up to `limit` stored messages of a topic in key order (due order, to the bucket),
    /// starting after `after` (or at the topic's start); stops before the message whose value
    /// would bring the total past `max_bytes` (the first one always comes). Messages whose TTL
    /// passed are stored until the sweep deletes them, and listed (they are never delivered).
    /// Read only; O(limit) rows.
    ///
    /// # Errors
    /// A storage error. Values that fail to decode are skipped and logged.
    pub fn peek(
        &self,
        topic_hash: TopicHash,
        after: Option<EventKey>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(EventKey, StoredMessage)>, StoreError> {
        let txn = self.db.begin_read()?;
        let messages = txn.open_table(MESSAGES)?;
        let from = match after {
            Some(k) => match k.successor() {
                Some(s) => s,
                None => return Ok(Vec::new()),
            },
            None => EventKey::topic_start(topic_hash),
        };
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for r in messages.range(from.0.as_slice()..)? {
            let (k, v) = r?;
            let Ok(key) = EventKey::from_slice(k.value()) else {
                continue;
            };
            if key.topic_hash() != topic_hash || out.len() >= limit {
                break;
            }
            bytes += v.value().len();
            if bytes > max_bytes && !out.is_empty() {
                break;
            }
            match StoredMessage::decode(&Bytes::copy_from_slice(v.value())) {
                Ok(m) => out.push((key, m)),
                Err(e) => {
                    tracing::error!(target: "storage", key = %key, error = %e, "skipping undecodable message");
                }
            }
        }
        Ok(out)
    }

    /// Number of `dedup` rows (dedup ids and dead letters remembered).
    ///
    /// # Errors
    /// A storage error.
    pub fn dedup_rows(&self) -> Result<u64, StoreError> {
        Ok(self.db.begin_read()?.open_table(DEDUP)?.len()?)
    }

    /// Number of stored messages, index entries and expiry entries.
    ///
    /// # Errors
    /// A storage error.
    pub fn counts(&self) -> Result<(u64, u64, u64), StoreError> {
        let txn = self.db.begin_read()?;
        Ok((
            txn.open_table(MESSAGES)?.len()?,
            txn.open_table(INDEXES)?.len()?,
            txn.open_table(EXPIRY)?.len()?,
        ))
    }
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

/// What a snapshot holds besides the data, read in the same transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Applied `(index, term)`.
    pub applied: Option<(u64, u64)>,
    /// The replication layer's state at that point.
    pub raft_meta: BTreeMap<String, Vec<u8>>,
}

/// What [`Store::apply_entries`] did.
#[derive(Debug, Default)]
pub struct ApplyOutcome {
    /// Messages stored.
    pub stored: u64,
    /// Keys deleted (reported even when already gone, so every replica clears its in-flight
    /// state for them).
    pub deleted: Vec<EventKey>,
    /// The smallest stored key per topic: what a dispatcher must not have scanned past.
    pub published: Vec<EventKey>,
    /// The id high-water mark after the call.
    pub max_event_id: u64,
    /// The applied log id after the call, if anything was applied.
    pub applied: Option<(u64, u64)>,
    /// Entries that changed nothing, by log index (ascending), and why.
    pub refused: Vec<(u64, Refusal)>,
    /// What entries answer beyond "applied", by log index (ascending); entries not listed
    /// answer [`futureq_core::command::Answer::None`].
    pub answers: Vec<(u64, futureq_core::command::Answer)>,
}

impl ApplyOutcome {
    /// The outcome of the entry at `index`: refused (why), or applied with its answer.
    ///
    /// # Errors
    /// The entry's [`Refusal`].
    pub fn outcome(&self, index: u64) -> Result<futureq_core::command::Answer, &Refusal> {
        if let Ok(at) = self.refused.binary_search_by_key(&index, |(i, _)| *i) {
            return Err(&self.refused[at].1);
        }
        Ok(self
            .answers
            .binary_search_by_key(&index, |(i, _)| *i)
            .map(|at| self.answers[at].1.clone())
            .unwrap_or_default())
    }
}

/// Why an applied log entry changed nothing. Every replica decides the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The entry is not a valid command (skipped; nothing of it applied).
    #[error("not a valid command ({reason}); skipped")]
    Undecodable {
        /// What is wrong.
        reason: String,
    },
    /// A store command whose ids are not strictly increasing above the highest applied id:
    /// they were assigned by a leader of an earlier term. Nothing of the batch is stored.
    #[error("event ids {first}..={last} are not above the highest stored id {max} (assigned in an earlier term); batch not stored")]
    StaleIds {
        /// The batch's first id.
        first: u64,
        /// The batch's last id.
        last: u64,
        /// The highest id applied before it.
        max: u64,
    },
}

/// Takes the one event id of a reschedule or dead letter: refused unless above every id
/// applied; used whether or not its message is found, so ids never regress on any replica.
fn take_id(id: u64, out: &mut ApplyOutcome) -> Result<(), Refusal> {
    if id <= out.max_event_id {
        return Err(Refusal::StaleIds {
            first: id,
            last: id,
            max: out.max_event_id,
        });
    }
    out.max_event_id = id;
    Ok(())
}

/// Checks that a store command's ids are strictly increasing and above `max`.
fn ids_above(b: &futureq_core::command::ArchivedStoreBatch, max: u64) -> Result<(), Refusal> {
    let mut prev = max;
    for item in b.items.iter() {
        let id = item.event_id.to_native();
        if id <= prev {
            let id_at = |i: Option<usize>| {
                i.and_then(|i| b.items.get(i))
                    .map_or(0, |it| it.event_id.to_native())
            };
            return Err(Refusal::StaleIds {
                first: id_at(Some(0)),
                last: id_at(b.items.len().checked_sub(1)),
                max,
            });
        }
        prev = id;
    }
    Ok(())
}

/// The data tables and `meta` of one write transaction. Every change to the data tables goes
/// through it, which keeps the digest (see the module docs) in step; [`Tables::finish`]
/// records it. A message's index and expiry entries are written and removed with it, always.
struct Tables<'t> {
    messages: redb::Table<'t, &'static [u8], &'static [u8]>,
    indexes: redb::Table<'t, &'static [u8], ()>,
    expiry: redb::Table<'t, &'static [u8], ()>,
    groups: redb::Table<'t, &'static [u8], ()>,
    topics: redb::Table<'t, &'static [u8], &'static [u8]>,
    dedup: redb::Table<'t, &'static [u8], &'static [u8]>,
    dedup_expiry: redb::Table<'t, &'static [u8], ()>,
    meta: redb::Table<'t, &'static str, u64>,
    /// Changes to `topics` not yet written: per topic, stored (+/-) and dead letters (+), and
    /// the name of a message added (written by [`Tables::finish`]).
    topic_deltas: HashMap<TopicHash, (i64, u64, String)>,
    digest: u64,
    /// The digest `meta` holds (as of `open`, or the last write).
    kept: u64,
}

/// The key-only data tables (their rows are a key and no value).
#[derive(Clone, Copy)]
enum KeyTable {
    Index,
    Expiry,
    DedupExpiry,
}

impl KeyTable {
    /// Its rows' tag in the digest.
    fn tag(self) -> u64 {
        match self {
            KeyTable::Index => ROW_INDEX,
            KeyTable::Expiry => ROW_EXPIRY,
            KeyTable::DedupExpiry => ROW_DEDUP_EXPIRY,
        }
    }
}

impl<'t> Tables<'t> {
    fn open(txn: &'t redb::WriteTransaction) -> Result<Self, StoreError> {
        let meta = txn.open_table(META)?;
        let digest = meta.get(DIGEST)?.map_or(0, |v| v.value());
        Ok(Tables {
            messages: txn.open_table(MESSAGES)?,
            indexes: txn.open_table(INDEXES)?,
            expiry: txn.open_table(EXPIRY)?,
            groups: txn.open_table(GROUPS)?,
            topics: txn.open_table(TOPICS)?,
            dedup: txn.open_table(DEDUP)?,
            dedup_expiry: txn.open_table(DEDUP_EXPIRY)?,
            meta,
            topic_deltas: HashMap::new(),
            digest,
            kept: digest,
        })
    }

    /// The pending change of a topic's row (`name` kept if it has none yet).
    fn topic_delta(&mut self, h: TopicHash, name: &str) -> &mut (i64, u64, String) {
        let d = self.topic_deltas.entry(h).or_default();
        if d.2.is_empty() {
            name.clone_into(&mut d.2);
        }
        d
    }

    /// Writes the pending topic counts (a row goes when both counts are 0).
    fn write_topics(&mut self) -> Result<(), StoreError> {
        for (h, (stored, dead, name)) in std::mem::take(&mut self.topic_deltas) {
            if stored == 0 && dead == 0 {
                continue;
            }
            let key = h.0.to_be_bytes();
            let old = self.topics.get(key.as_slice())?.map(|v| v.value().to_vec());
            let mut row = old
                .as_deref()
                .and_then(TopicRow::decode)
                .unwrap_or_default();
            if let Some(v) = &old {
                self.digest ^= row_hash(ROW_TOPIC, &key, v);
            }
            let n = i64::try_from(row.stored)
                .unwrap_or(i64::MAX)
                .saturating_add(stored);
            if n < 0 {
                tracing::error!(target: "storage", topic = %row.name, count = row.stored, change = stored, "a topic's stored count would go below 0; kept at 0");
            }
            row.stored = u64::try_from(n).unwrap_or(0);
            row.dead_lettered = row.dead_lettered.saturating_add(dead);
            if row.name.is_empty() {
                row.name = name;
            }
            if row.stored == 0 && row.dead_lettered == 0 {
                self.topics.remove(key.as_slice())?;
            } else {
                let v = row.encode();
                self.digest ^= row_hash(ROW_TOPIC, &key, &v);
                self.topics.insert(key.as_slice(), v.as_slice())?;
            }
        }
        Ok(())
    }

    /// Writes the pending topic counts and records the digest in `meta` (when it changed);
    /// returns it.
    fn finish(mut self) -> Result<u64, StoreError> {
        self.write_topics()?;
        if self.digest != self.kept {
            self.meta.insert(DIGEST, self.digest)?;
            self.kept = self.digest;
        }
        Ok(self.digest)
    }

    fn insert<'k>(
        &mut self,
        key: &EventKey,
        expires_at_ms: Option<i64>,
        index_keys: impl IntoIterator<Item = &'k [u8]>,
        value: &[u8],
    ) -> Result<(), StoreError> {
        self.put_message(&key.0, value)?;
        for ik in index_keys {
            self.put_row(KeyTable::Index, &index_entry(ik, key))?;
        }
        if let Some(e) = expires_at_ms {
            self.put_row(KeyTable::Expiry, &expiry_key(e, key))?;
        }
        Ok(())
    }

    /// Stores one `messages` row (replacing the value of an existing one); a new row counts
    /// for its topic.
    fn put_message(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let old = self
            .messages
            .insert(key, value)?
            .map(|old| row_hash(ROW_MESSAGE, key, old.value()));
        match old {
            Some(h) => self.digest ^= h,
            None => {
                if let Ok(k) = EventKey::from_slice(key) {
                    let name = StoredMessage::topic_of(value).unwrap_or("");
                    self.topic_delta(k.topic_hash(), name).0 += 1;
                }
            }
        }
        self.digest ^= row_hash(ROW_MESSAGE, key, value);
        Ok(())
    }

    fn key_table(&mut self, table: KeyTable) -> &mut redb::Table<'t, &'static [u8], ()> {
        match table {
            KeyTable::Index => &mut self.indexes,
            KeyTable::Expiry => &mut self.expiry,
            KeyTable::DedupExpiry => &mut self.dedup_expiry,
        }
    }

    /// Adds one row of a key-only table.
    fn put_row(&mut self, table: KeyTable, key: &[u8]) -> Result<(), StoreError> {
        if self.key_table(table).insert(key, ())?.is_none() {
            self.digest ^= row_hash(table.tag(), key, &[]);
        }
        Ok(())
    }

    /// Removes one row of a key-only table.
    fn remove_row(&mut self, table: KeyTable, key: &[u8]) -> Result<(), StoreError> {
        if self.key_table(table).remove(key)?.is_some() {
            self.digest ^= row_hash(table.tag(), key, &[]);
        }
        Ok(())
    }

    /// Stores a copy of a message on its dead-letter topic ([`futureq_core::command::DeadLetter`])
    /// and counts it on the origin topic: the copy's key and whether it is new (a repeat of
    /// the same message and group answers the first copy); `None` when the message is not
    /// stored or expired (then nothing changes).
    fn dead_letter(
        &mut self,
        d: &futureq_core::command::ArchivedDeadLetter,
    ) -> Result<(Option<EventKey>, bool), StoreError> {
        let old = EventKey(d.key);
        let now_ms = d.now_ms.to_native();
        // Its once-rows are dedup rows: forgotten ones go here too (a store may dead-letter
        // without ever seeing a dedup id).
        self.sweep_dedup(now_ms)?;
        let Some(m) = self
            .messages
            .get(old.0.as_slice())?
            .and_then(|v| StoredMessage::decode(&Bytes::copy_from_slice(v.value())).ok())
            .filter(|m| !m.is_expired(now_ms))
        else {
            return Ok((None, false));
        };
        let topic = futureq_core::message::dead_letter_topic(&m.topic, &m.extras.dead_letter_topic);
        // Once per message and recipient, for as long as the original is stored: the dedup
        // table remembers the copy under a key that names the original (a NUL-led id no
        // publish of this topic produces by accident), never swept; `take` forgets it with
        // the original.
        let mut once = once_prefix(&topic, &old);
        once.extend_from_slice(
            format!("{}\0{}", d.group.as_str(), d.consumer.to_native()).as_bytes(),
        );
        let remembered = self
            .dedup
            .get(once.as_slice())?
            .and_then(|v| parse_dedup_value(v.value()));
        if let Some((first, until)) = remembered {
            if until > now_ms {
                return Ok((Some(first), false));
            }
        }
        let copy = StoredMessage {
            topic,
            payload: m.payload.clone(),
            enqueued_at_ms: now_ms,
            delay: futureq_core::DelayMs(0),
            ttl: futureq_core::TtlMs::NEVER,
            indexes: m.indexes.clone(),
            extras: futureq_core::Extras {
                origin_topic: m.topic.clone(),
                origin_group: d.group.as_str().to_owned(),
                ..futureq_core::Extras::default()
            },
        };
        let key = EventKey::new(
            futureq_core::topic_hash(&copy.topic),
            futureq_core::Bucket(d.bucket.to_native()),
            futureq_core::EventId(d.event_id.to_native()),
        );
        let index_keys: Vec<Vec<u8>> = copy.indexes.iter().map(|i| i.index_key()).collect();
        self.insert(
            &key,
            None,
            index_keys.iter().map(Vec::as_slice),
            &copy.encode(),
        )?;
        self.topic_delta(old.topic_hash(), &m.topic).1 += 1;
        self.remember(&once, &key, i64::MAX)?;
        Ok((Some(key), true))
    }

    /// Writes (or replaces) a `dedup` row and its `dedup-expiry` row.
    fn remember(&mut self, dk: &[u8], first: &EventKey, until_ms: i64) -> Result<(), StoreError> {
        self.forget(dk)?;
        let v = dedup_value(first, until_ms);
        self.dedup.insert(dk, v.as_slice())?;
        self.digest ^= row_hash(ROW_DEDUP, dk, &v);
        self.put_row(KeyTable::DedupExpiry, &dedup_expiry_key(until_ms, dk))
    }

    /// Removes a `dedup` row and its `dedup-expiry` row, if there.
    fn forget(&mut self, dk: &[u8]) -> Result<(), StoreError> {
        let old = self.dedup.remove(dk)?.map(|v| v.value().to_vec());
        if let Some(v) = old {
            self.digest ^= row_hash(ROW_DEDUP, dk, &v);
            if let Some((_, until)) = parse_dedup_value(&v) {
                self.remove_row(KeyTable::DedupExpiry, &dedup_expiry_key(until, dk))?;
            }
        }
        Ok(())
    }

    /// For a message with a dedup id: the key of the message stored first under the same
    /// `(topic, dedup id)` while it is remembered at this message's enqueue time (then this
    /// one is not stored); else remembers this one as the first (`None`). Removes a few rows
    /// forgotten by then. `None` for a message without a dedup id.
    fn deduplicate(
        &mut self,
        key: &EventKey,
        message: &[u8],
    ) -> Result<Option<EventKey>, StoreError> {
        if message.first() != Some(&futureq_core::message::FORMAT_VERSION_EXTRAS) {
            return Ok(None);
        }
        let Ok(m) = StoredMessage::decode(&Bytes::copy_from_slice(message)) else {
            return Ok(None);
        };
        if m.extras.dedup_id.is_empty() {
            return Ok(None);
        }
        let now = m.enqueued_at_ms;
        self.sweep_dedup(now)?;
        let dk = dedup_key(key.topic_hash(), &m.extras.dedup_id);
        let remembered = self
            .dedup
            .get(dk.as_slice())?
            .and_then(|v| parse_dedup_value(v.value()));
        if let Some((first, until)) = remembered {
            if until > now {
                return Ok(Some(first));
            }
        }
        self.remember(&dk, key, m.extras.dedup_until_ms)?;
        Ok(None)
    }

    /// Removes up to [`DEDUP_SWEEP`] `dedup` rows whose window ended
    /// [`DEDUP_CLOCK_SKEW_MAX_MS`] or more before `now_ms` (a clock reading one message
    /// carries), oldest first.
    fn sweep_dedup(&mut self, now_ms: i64) -> Result<(), StoreError> {
        let now_ms = now_ms.saturating_sub(DEDUP_CLOCK_SKEW_MAX_MS);
        let mut gone = Vec::new();
        for r in self.dedup_expiry.range::<&[u8]>(..)?.take(DEDUP_SWEEP) {
            let (k, _) = r?;
            let k = k.value();
            let until = k
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_be_bytes);
            if i64::try_from(until).unwrap_or(i64::MAX) > now_ms {
                break;
            }
            gone.push(k.get(8..).unwrap_or_default().to_vec());
        }
        for dk in gone {
            self.forget(&dk)?;
        }
        Ok(())
    }

    /// Registers a group (`groups` key); true when it was new.
    fn add_group(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        let new = self.groups.insert(key, ())?.is_none();
        if new {
            self.digest ^= row_hash(ROW_GROUP, key, &[]);
        }
        Ok(new)
    }

    /// Removes a group registration; false if it was not registered.
    fn remove_group(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        let found = self.groups.remove(key)?.is_some();
        if found {
            self.digest ^= row_hash(ROW_GROUP, key, &[]);
        }
        Ok(found)
    }

    /// Removes a message and its index and expiry entries; false if it did not exist.
    fn remove(&mut self, key: &EventKey) -> Result<bool, StoreError> {
        Ok(self.take(key)?.is_some())
    }

    /// Removes a message and its index and expiry entries; its bytes, if it existed (an
    /// undecodable one is removed too, and logged: its index entries may remain).
    fn take(&mut self, key: &EventKey) -> Result<Option<Bytes>, StoreError> {
        let Some(v) = self.messages.remove(key.0.as_slice())? else {
            return Ok(None);
        };
        let bytes = Bytes::copy_from_slice(v.value());
        drop(v);
        self.digest ^= row_hash(ROW_MESSAGE, &key.0, &bytes);
        self.topic_delta(key.topic_hash(), "").0 -= 1;
        match StoredMessage::decode(&bytes) {
            Ok(m) => {
                for i in &m.indexes {
                    self.remove_row(KeyTable::Index, &index_entry(&i.index_key(), key))?;
                }
                if let Some(e) = m.expires_at_ms() {
                    self.remove_row(KeyTable::Expiry, &expiry_key(e, key))?;
                }
                // Its dead letters' once-rows go with it (one seek when it has none).
                let dlq =
                    futureq_core::message::dead_letter_topic(&m.topic, &m.extras.dead_letter_topic);
                let prefix = once_prefix(&dlq, key);
                let mut gone = Vec::new();
                for r in self.dedup.range::<&[u8]>(prefix.as_slice()..)? {
                    let (k, _) = r?;
                    if !k.value().starts_with(&prefix) {
                        break;
                    }
                    gone.push(k.value().to_vec());
                }
                for k in gone {
                    self.forget(&k)?;
                }
            }
            Err(e) => {
                tracing::error!(target: "storage", key = %key, error = %e, "deleted an undecodable message; its index entries may remain");
            }
        }
        Ok(Some(bytes))
    }

    /// Moves a stored message to a new key and due time ([`futureq_core::command::Reschedule`]):
    /// the new key, or `None` when it was not stored or had expired by the command's clock
    /// (then nothing changes).
    fn reschedule(
        &mut self,
        r: &futureq_core::command::ArchivedReschedule,
    ) -> Result<Option<EventKey>, StoreError> {
        let old = EventKey(r.key);
        let now_ms = r.now_ms.to_native();
        let live = match self.messages.get(old.0.as_slice())? {
            Some(v) => StoredMessage::decode(&Bytes::copy_from_slice(v.value()))
                .is_ok_and(|m| !m.is_expired(now_ms)),
            None => false,
        };
        if !live {
            return Ok(None);
        }
        let Some(mut m) = self
            .take(&old)?
            .and_then(|b| StoredMessage::decode(&b).ok())
        else {
            return Ok(None);
        };
        // Enqueued again at the command's clock, due at the asked time (so the key's bucket
        // and the stored due time agree whatever the clocks of earlier leaders), and the TTL
        // cut so that the absolute expiry stays (the message is not expired at `now_ms`).
        let expiry = m.expires_at_ms();
        m.enqueued_at_ms = now_ms;
        m.delay = futureq_core::DelayMs(r.due_at_ms.to_native().saturating_sub(now_ms).max(0));
        m.ttl = expiry.map_or(futureq_core::TtlMs::NEVER, |e| {
            futureq_core::TtlMs(e.saturating_sub(now_ms).max(1))
        });
        let key = r.new_key();
        if !m.extras.dedup_id.is_empty() {
            // A retried publish of its dedup id answers the moved message's key.
            let dk = dedup_key(old.topic_hash(), &m.extras.dedup_id);
            let remembered = self
                .dedup
                .get(dk.as_slice())?
                .and_then(|v| parse_dedup_value(v.value()));
            if let Some((first, until)) = remembered {
                if first == old {
                    self.remember(&dk, &key, until)?;
                }
            }
        }
        let index_keys: Vec<Vec<u8>> = m.indexes.iter().map(|i| i.index_key()).collect();
        self.insert(
            &key,
            m.expires_at_ms(),
            index_keys.iter().map(Vec::as_slice),
            &m.encode(),
        )?;
        Ok(Some(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            let rows: Vec<(Vec<u8>, Vec<u8>)> = t
                .topics
                .range::<&[u8]>(..)
                .unwrap()
                .map(|r| {
                    let (k, v) = r.unwrap();
                    (k.value().to_vec(), v.value().to_vec())
                })
                .collect();
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
}
