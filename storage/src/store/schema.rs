//! The store's tables and the layout of their keys and values.
//!
//! # Invariants
//! - Keys sort as the readers walk them: big-endian numbers first, so a range read is a
//!   time or topic order.
//! - A row's share of the digest is [`row_hash`] of its table tag, key and value; the tags
//!   never change meaning (a stored digest would no longer match its rows).

use futureq_core::{EventKey, TopicHash, KEY_LEN};
use redb::TableDefinition;

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
/// Lists of the `dedup` rows one store command remembered, by when the last of them is
/// forgotten: the sweep's index (see the module docs), one row per command instead of one per
/// dedup id.
pub(crate) const DEDUP_SWEEP: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dedup-sweep");
/// The earlier version's sweep index, one row per dedup id (until (u64 BE) · `dedup` key):
/// read once at open into `dedup-sweep`, then deleted.
pub(super) const LEGACY_DEDUP_EXPIRY: TableDefinition<&[u8], ()> =
    TableDefinition::new("dedup-expiry");
/// Fewest `dedup` rows a sweep looks at (it looks at twice those its command remembered; a
/// list cut there keeps its rest).
pub(super) const DEDUP_SWEEP_MIN: usize = 8;
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
pub(super) const DIGEST: &str = "digest";
/// Meta key set once `topics` counts every stored message (a store written before it
/// existed is counted at open).
pub(super) const TOPICS_COUNTED: &str = "topics-counted";
/// Raft-meta key written by [`Store::sync`] so that its transaction has a change to commit.
pub(super) const SYNC_MARK: &str = "sync";

/// Table tags of the digest's row hashes.
pub(super) const ROW_MESSAGE: u64 = 1;
pub(super) const ROW_INDEX: u64 = 2;
pub(super) const ROW_EXPIRY: u64 = 3;
pub(super) const ROW_GROUP: u64 = 5;
pub(super) const ROW_TOPIC: u64 = 6;
pub(super) const ROW_DEDUP: u64 = 7;
/// The earlier `dedup-expiry` rows' tag (read only to move them to `dedup-sweep` at open).
pub(super) const ROW_LEGACY_DEDUP_EXPIRY: u64 = 8;
pub(super) const ROW_DEDUP_SWEEP: u64 = 9;

pub(super) fn dedup_key(topic_hash: TopicHash, dedup_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + dedup_id.len());
    k.extend_from_slice(&topic_hash.0.to_be_bytes());
    k.extend_from_slice(dedup_id.as_bytes());
    k
}

/// The start of the dedup keys that remember the dead letters of `original` (on its
/// dead-letter topic `dlq`), one per recipient after it.
///
/// Built without the formatting machinery (every delete looks for these rows; the profile of
/// a burst of ACKs showed the key's `Display` in the apply): the same bytes as
/// `format!("\0dead-letter\0{original}\0")` after the topic hash.
pub(super) fn once_prefix(dlq: &str, original: &EventKey) -> Vec<u8> {
    const HEAD: &[u8] = b"\0dead-letter\0";
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut k = Vec::with_capacity(8 + HEAD.len() + 2 * original.0.len() + 1);
    k.extend_from_slice(&futureq_core::topic_hash(dlq).0.to_be_bytes());
    k.extend_from_slice(HEAD);
    for b in original.0 {
        k.push(HEX[usize::from(b >> 4)]);
        k.push(HEX[usize::from(b & 0xf)]);
    }
    k.push(0);
    k
}

pub(super) fn dedup_value(first: &EventKey, until_ms: i64) -> [u8; KEY_LEN + 8] {
    let mut v = [0u8; KEY_LEN + 8];
    v[..KEY_LEN].copy_from_slice(&first.0);
    v[KEY_LEN..].copy_from_slice(&until_ms.to_le_bytes());
    v
}

/// A `dedup` row's value: the first key and until (`None` for bytes the store never writes).
pub(super) fn parse_dedup_value(v: &[u8]) -> Option<(EventKey, i64)> {
    let key = EventKey::from_slice(v.get(..KEY_LEN)?).ok()?;
    let until = i64::from_le_bytes(v.get(KEY_LEN..KEY_LEN + 8)?.try_into().ok()?);
    Some((key, until))
}

/// A `dedup-sweep` key: the list's until (the latest of its rows') and the event id of the
/// first message it lists (unique: each message is listed at most once).
pub(super) fn sweep_key(until_ms: i64, event_id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&u64::try_from(until_ms.max(0)).unwrap_or(0).to_be_bytes());
    k[8..].copy_from_slice(&event_id.to_be_bytes());
    k
}

/// The until of a `dedup-sweep` or legacy `dedup-expiry` key (0 for a short key).
pub(super) fn sweep_key_until(k: &[u8]) -> i64 {
    k.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .map_or(0, |u| i64::try_from(u).unwrap_or(i64::MAX))
}

/// Appends one `dedup` key to a `dedup-sweep` value (u32 LE length · key: the message format
/// bounds a dedup id only by its own u16 length, the API by
/// [`futureq_core::publish::DEDUP_ID_LEN_MAX`]).
pub(super) fn push_swept(list: &mut Vec<u8>, dedup_key: &[u8]) {
    let n = u32::try_from(dedup_key.len()).unwrap_or(u32::MAX);
    list.extend_from_slice(&n.to_le_bytes());
    list.extend_from_slice(dedup_key);
}

/// The `dedup` keys of a `dedup-sweep` value; `None` when it is not a whole, non-empty list
/// (the store writes none such: corrupt bytes).
pub(super) fn swept_keys(list: &[u8]) -> Option<Vec<&[u8]>> {
    let mut keys = Vec::new();
    let mut rest = list;
    while !rest.is_empty() {
        let n = usize::try_from(u32::from_le_bytes(rest.get(..4)?.try_into().ok()?)).ok()?;
        keys.push(rest.get(4..4usize.checked_add(n)?)?);
        rest = &rest[4 + n..];
    }
    (!keys.is_empty()).then_some(keys)
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
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16 + self.name.len());
        v.extend_from_slice(&self.stored.to_le_bytes());
        v.extend_from_slice(&self.dead_lettered.to_le_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v
    }

    /// Decodes a row the store wrote (`None` for bytes it could not have written).
    pub(super) fn decode(v: &[u8]) -> Option<Self> {
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

/// One row's share of the digest.
pub(super) fn row_hash(table: u64, key: &[u8], value: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh64::Xxh64::new(table);
    h.update(&(key.len() as u64).to_le_bytes());
    h.update(key);
    h.update(value);
    h.digest()
}

pub(super) fn expiry_key(expires_at_ms: i64, key: &EventKey) -> [u8; 8 + KEY_LEN] {
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
pub(super) fn expiry_entry_key(k: &[u8]) -> EventKey {
    let mut e = [0u8; KEY_LEN];
    if let Some(key) = k.get(8..8 + KEY_LEN) {
        e.copy_from_slice(key);
    }
    EventKey(e)
}

pub(super) fn group_key(topic_hash: TopicHash, group: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + group.len());
    k.extend_from_slice(&topic_hash.0.to_be_bytes());
    k.extend_from_slice(group.as_bytes());
    k
}

pub(super) fn index_entry(index_key: &[u8], key: &EventKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(index_key.len() + KEY_LEN);
    k.extend_from_slice(index_key);
    k.extend_from_slice(&key.0);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The once-rows' prefix is part of the store's format: the same bytes the formatted form
    /// gave before it was built by hand.
    #[test]
    fn once_prefix_is_the_formatted_dedup_key() {
        for key in [
            EventKey([0; 24]),
            EventKey([0xff; 24]),
            EventKey(std::array::from_fn(|i| (i * 37) as u8)),
        ] {
            let formatted = dedup_key(
                futureq_core::topic_hash("t.dlq"),
                &format!("\0dead-letter\0{key}\0"),
            );
            assert_eq!(once_prefix("t.dlq", &key), formatted);
        }
    }

    /// A sweep list gives back the keys pushed, in order; a truncated one or an empty one is
    /// not a list.
    #[test]
    fn a_sweep_list_reads_back_its_keys() {
        let keys: Vec<Vec<u8>> = vec![vec![], b"x".to_vec(), vec![7; 8 + usize::from(u16::MAX)]];
        let mut list = Vec::new();
        for k in &keys {
            push_swept(&mut list, k);
        }
        assert_eq!(
            swept_keys(&list),
            Some(keys.iter().map(Vec::as_slice).collect())
        );
        list.truncate(list.len() - 1);
        assert_eq!(swept_keys(&list), None);
        assert_eq!(swept_keys(&[]), None);
        assert_eq!(swept_keys(&[1, 0, 0]), None);
        assert_eq!(sweep_key_until(&sweep_key(42, 7)), 42);
        assert_eq!(sweep_key_until(&sweep_key(-5, 7)), 0);
    }
}
