//! Reads for the API and tools: topics and their counts, peek, groups, table sizes.
//!
//! # Invariants
//! - Every read is bounded by its caller's limit (rows or bytes), except [`Store::topic_counts`],
//!   O(topics) by design (the metrics' per-topic gauges keep only the top ones).

use bytes::Bytes;
use futureq_core::{EventKey, StoredMessage, TopicHash};
use redb::{ReadableDatabase, ReadableTableMetadata};

use super::db::Store;
use super::scan::next_due;
use super::schema::{group_key, TopicRow, DEDUP, EXPIRY, GROUPS, INDEXES, MESSAGES, TOPICS};
use crate::StoreError;

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

impl Store {
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
