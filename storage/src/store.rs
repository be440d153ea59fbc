//! The synchronous redb store.
//!
//! Tables:
//!
//! | table | key | value |
//! |---|---|---|
//! | `messages` | 24-byte event key | encoded [`StoredMessage`] |
//! | `indexes` | index key ([`futureq_core::IndexValue::index_key`]) · event key | () |
//! | `expiry` | expires-at (u64 BE ms) · event key | () |
//! | `meta` | name | u64 (`last-id`) |
//!
//! Every method is blocking: call them only from the threads in [`crate::service`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futureq_core::hub::{ScanRequest, ScanResult};
use futureq_core::{EventKey, StoredMessage, KEY_LEN};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use crate::StoreError;

const MESSAGES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("messages");
const INDEXES: TableDefinition<&[u8], ()> = TableDefinition::new("indexes");
const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LAST_ID: &str = "last-id";

/// Where the store keeps its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreMode {
    /// One redb file in this directory, with a page cache of this many bytes.
    Disk(PathBuf, usize),
    /// In memory; lost at exit.
    Memory,
}

/// A message ready to store, encoded by the ingress core (which also assigned its id).
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The event key: topic hash, time bucket, event id.
    pub key: EventKey,
    /// Expiry instant (Unix ms) when the message has a TTL.
    pub expires_at_ms: Option<i64>,
    /// Index keys ([`futureq_core::IndexValue::index_key`]).
    pub index_keys: Vec<Vec<u8>>,
    /// The encoded [`StoredMessage`].
    pub value: Bytes,
}

/// The store. Cheap to clone (shares the database).
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
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
                Database::builder()
                    .set_cache_size(*cache_bytes)
                    .create(dir.join("futureq.redb"))?
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
        }
        txn.commit()?;
        Ok(Store { db: Arc::new(db) })
    }

    /// The highest event id ever stored (0 for a new store).
    ///
    /// # Errors
    /// A storage error.
    pub fn last_id(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        Ok(meta.get(LAST_ID)?.map_or(0, |v| v.value()))
    }

    /// Commits a group of operations in one transaction: publish batches, then deletes, then
    /// a TTL sweep. `last_id` is the persisted id high-water mark: it is raised (in the same
    /// transaction) to the largest id stored, and never lowered.
    ///
    /// # Errors
    /// Any storage error; then nothing of the group is committed.
    pub fn commit_group(
        &self,
        batches: &[&[NewMessage]],
        deletes: &[EventKey],
        sweep: Option<(i64, usize)>,
        last_id: &mut u64,
        durable: bool,
    ) -> Result<GroupOutcome, StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        })?;
        let mut out = GroupOutcome::default();
        {
            let mut messages = txn.open_table(MESSAGES)?;
            let mut indexes = txn.open_table(INDEXES)?;
            let mut expiry = txn.open_table(EXPIRY)?;
            let mut max_id = *last_id;
            for batch in batches {
                let mut keys = Vec::with_capacity(batch.len());
                for m in *batch {
                    let key = m.key;
                    max_id = max_id.max(key.event_id());
                    messages.insert(key.0.as_slice(), m.value.as_ref())?;
                    for ik in &m.index_keys {
                        indexes.insert(index_entry(ik, &key).as_slice(), ())?;
                    }
                    if let Some(e) = m.expires_at_ms {
                        expiry.insert(expiry_key(e, &key).as_slice(), ())?;
                    }
                    keys.push(key);
                }
                out.published.push(keys);
            }
            for key in deletes {
                if remove_message(&mut messages, &mut indexes, &mut expiry, key)? {
                    out.deleted.push(*key);
                }
            }
            if let Some((now_ms, limit)) = sweep {
                let upper = expiry_key(now_ms.saturating_add(1), &EventKey([0; KEY_LEN]));
                let due: Vec<EventKey> = expiry
                    .range(..upper.as_slice())?
                    .take(limit)
                    .map(|r| {
                        r.map(|(k, _)| {
                            let mut e = [0u8; KEY_LEN];
                            e.copy_from_slice(&k.value()[8..]);
                            EventKey(e)
                        })
                    })
                    .collect::<Result<_, _>>()?;
                for key in due {
                    remove_message(&mut messages, &mut indexes, &mut expiry, &key)?;
                    out.expired.push(key);
                }
            }
            if max_id > *last_id {
                let mut meta = txn.open_table(META)?;
                meta.insert(LAST_ID, max_id)?;
            }
            out.last_id = max_id;
        }
        txn.commit()?;
        *last_id = out.last_id;
        Ok(out)
    }

    /// Reads the due range of one topic.
    ///
    /// # Errors
    /// A storage error. Values that fail to decode are skipped and logged.
    pub fn scan(&self, req: &ScanRequest) -> Result<ScanResult, StoreError> {
        let txn = self.db.begin_read()?;
        let messages = txn.open_table(MESSAGES)?;
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
            let next = match h.checked_add(1) {
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

/// What one group commit did.
#[derive(Debug, Default)]
pub struct GroupOutcome {
    /// Keys of each publish batch, in order.
    pub published: Vec<Vec<EventKey>>,
    /// Keys deleted on request (those that still existed).
    pub deleted: Vec<EventKey>,
    /// Keys removed by the TTL sweep.
    pub expired: Vec<EventKey>,
    /// The id high-water mark after this commit.
    pub last_id: u64,
}

impl GroupOutcome {
    /// The smallest published key per topic: what the dispatcher must not have scanned past.
    #[must_use]
    pub fn min_key_per_topic(&self) -> Vec<EventKey> {
        let mut m: HashMap<u64, EventKey> = HashMap::new();
        for k in self.published.iter().flatten() {
            m.entry(k.topic_hash())
                .and_modify(|v| *v = (*v).min(*k))
                .or_insert(*k);
        }
        m.into_values().collect()
    }
}

/// Removes a message and its index and expiry entries; false if it did not exist.
fn remove_message(
    messages: &mut redb::Table<&[u8], &[u8]>,
    indexes: &mut redb::Table<&[u8], ()>,
    expiry: &mut redb::Table<&[u8], ()>,
    key: &EventKey,
) -> Result<bool, StoreError> {
    let Some(v) = messages.remove(key.0.as_slice())? else {
        return Ok(false);
    };
    let bytes = Bytes::copy_from_slice(v.value());
    drop(v);
    match StoredMessage::decode(&bytes) {
        Ok(m) => {
            for i in &m.indexes {
                indexes.remove(index_entry(&i.index_key(), key).as_slice())?;
            }
            if let Some(e) = m.expires_at_ms() {
                expiry.remove(expiry_key(e, key).as_slice())?;
            }
        }
        Err(e) => {
            tracing::error!(target: "storage", ?key, error = %e, "deleted an undecodable message; its index entries may remain");
        }
    }
    Ok(true)
}
