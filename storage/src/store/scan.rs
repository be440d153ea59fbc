//! The dispatcher's reads: due ranges of topics and keys whose TTL passed.
//!
//! # Invariants
//! - A scan returns at most `limit` rows and about [`futureq_core::hub::SCAN_BYTES_MAX`]
//!   bytes; `exhausted` is true only when the range holds nothing more.

use std::sync::Arc;

use bytes::Bytes;
use futureq_core::hub::{ScanRequest, ScanResult};
use futureq_core::{EventKey, StoredMessage, TopicHash, KEY_LEN};
use redb::ReadableDatabase;

use super::db::Store;
use super::schema::{expiry_entry_key, expiry_key, EXPIRY, MESSAGES};
use crate::StoreError;

impl Store {
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
pub(super) fn next_due(
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
