//! Every change to the data tables of one write transaction, keeping the digest and the
//! per-topic counts in step with the rows (see the store's module docs).
//!
//! # Invariants
//! - A message's index and expiry entries are written and removed with it, always.
//! - Every row added or removed XORs its [`row_hash`] into the digest exactly once.

use std::collections::HashMap;

use bytes::Bytes;
use futureq_core::{EventKey, StoredMessage, TopicHash};
use redb::ReadableTable;

use super::schema::{
    dedup_key, dedup_value, expiry_key, index_entry, once_prefix, parse_dedup_value, push_swept,
    row_hash, sweep_key, sweep_key_until, swept_keys, TopicRow, DEDUP, DEDUP_CLOCK_SKEW_MAX_MS,
    DEDUP_SWEEP, DEDUP_SWEEP_MIN, DIGEST, EXPIRY, GROUPS, INDEXES, MESSAGES, META, ROW_DEDUP,
    ROW_DEDUP_SWEEP, ROW_EXPIRY, ROW_GROUP, ROW_INDEX, ROW_MESSAGE, ROW_TOPIC, TOPICS,
};
use crate::StoreError;

/// The data tables and `meta` of one write transaction. Every change to the data tables goes
/// through it, which keeps the digest (see the module docs) in step; [`Tables::finish`]
/// records it. A message's index and expiry entries are written and removed with it, always.
pub(super) struct Tables<'t> {
    pub(super) messages: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(super) indexes: redb::Table<'t, &'static [u8], ()>,
    pub(super) expiry: redb::Table<'t, &'static [u8], ()>,
    pub(super) groups: redb::Table<'t, &'static [u8], ()>,
    pub(super) topics: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(super) dedup: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(super) dedup_sweep: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(super) meta: redb::Table<'t, &'static str, u64>,
    /// Changes to `topics` not yet written: per topic, stored (+/-) and dead letters (+), and
    /// the name of a message added (written by [`Tables::finish`]).
    pub(super) topic_deltas: HashMap<TopicHash, (i64, u64, String)>,
    /// The `dedup` rows the current store command remembered, listed by
    /// [`Tables::list_remembered`].
    pub(super) listed: SweepList,
    pub(super) digest: u64,
    /// The digest `meta` holds (as of `open`, or the last write).
    pub(super) kept: u64,
}

/// The key-only data tables (their rows are a key and no value).
#[derive(Clone, Copy)]
pub(super) enum KeyTable {
    Index,
    Expiry,
}

/// What [`Tables::deduplicate`] found for one message.
pub(super) enum Deduplicated {
    /// The message has no dedup id.
    NoId,
    /// Its id is remembered: the key of the message stored first.
    Duplicate(EventKey),
    /// Its id is now remembered (the message's enqueue time).
    Remembered(i64),
}

/// The `dedup` keys one store command remembered, in chunks of at most
/// [`SWEEP_LIST_KEYS_MAX`] (each the first listed message's event id and its keys; a
/// `dedup-sweep` row each once written), and the latest until among them.
#[derive(Default)]
pub(super) struct SweepList {
    chunks: Vec<(u64, Vec<u8>)>,
    /// Keys in the last chunk.
    last_len: usize,
    count: usize,
    until_ms: i64,
}

/// Most keys in one `dedup-sweep` row: a sweep that cuts a list rewrites its rest, so a row
/// is kept short (one rewrite costs at most this many keys whatever the command's size).
const SWEEP_LIST_KEYS_MAX: usize = 64;

impl KeyTable {
    /// Its rows' tag in the digest.
    pub(super) fn tag(self) -> u64 {
        match self {
            KeyTable::Index => ROW_INDEX,
            KeyTable::Expiry => ROW_EXPIRY,
        }
    }
}

impl<'t> Tables<'t> {
    pub(super) fn open(txn: &'t redb::WriteTransaction) -> Result<Self, StoreError> {
        let meta = txn.open_table(META)?;
        let digest = meta.get(DIGEST)?.map_or(0, |v| v.value());
        Ok(Tables {
            messages: txn.open_table(MESSAGES)?,
            indexes: txn.open_table(INDEXES)?,
            expiry: txn.open_table(EXPIRY)?,
            groups: txn.open_table(GROUPS)?,
            topics: txn.open_table(TOPICS)?,
            dedup: txn.open_table(DEDUP)?,
            dedup_sweep: txn.open_table(DEDUP_SWEEP)?,
            meta,
            topic_deltas: HashMap::new(),
            listed: SweepList::default(),
            digest,
            kept: digest,
        })
    }

    /// The pending change of a topic's row (`name` kept if it has none yet).
    pub(super) fn topic_delta(&mut self, h: TopicHash, name: &str) -> &mut (i64, u64, String) {
        let d = self.topic_deltas.entry(h).or_default();
        if d.2.is_empty() {
            name.clone_into(&mut d.2);
        }
        d
    }

    /// Writes the pending topic counts (a row goes when both counts are 0).
    pub(super) fn write_topics(&mut self) -> Result<(), StoreError> {
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
    pub(super) fn finish(mut self) -> Result<u64, StoreError> {
        self.write_topics()?;
        if self.digest != self.kept {
            self.meta.insert(DIGEST, self.digest)?;
            self.kept = self.digest;
        }
        Ok(self.digest)
    }

    pub(super) fn insert<'k>(
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
    pub(super) fn put_message(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
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

    pub(super) fn key_table(&mut self, table: KeyTable) -> &mut redb::Table<'t, &'static [u8], ()> {
        match table {
            KeyTable::Index => &mut self.indexes,
            KeyTable::Expiry => &mut self.expiry,
        }
    }

    /// Adds one row of a key-only table.
    pub(super) fn put_row(&mut self, table: KeyTable, key: &[u8]) -> Result<(), StoreError> {
        if self.key_table(table).insert(key, ())?.is_none() {
            self.digest ^= row_hash(table.tag(), key, &[]);
        }
        Ok(())
    }

    /// Removes one row of a key-only table.
    pub(super) fn remove_row(&mut self, table: KeyTable, key: &[u8]) -> Result<(), StoreError> {
        if self.key_table(table).remove(key)?.is_some() {
            self.digest ^= row_hash(table.tag(), key, &[]);
        }
        Ok(())
    }

    /// Stores a copy of a message on its dead-letter topic ([`futureq_core::command::DeadLetter`])
    /// and counts it on the origin topic: the copy's key and whether it is new (a repeat of
    /// the same message and group answers the first copy); `None` when the message is not
    /// stored or expired (then nothing changes).
    pub(super) fn dead_letter(
        &mut self,
        d: &futureq_core::command::ArchivedDeadLetter,
    ) -> Result<(Option<EventKey>, bool), StoreError> {
        let old = EventKey(d.key);
        let now_ms = d.now_ms.to_native();
        // Its once-rows are dedup rows: forgotten ones go here too (a store may dead-letter
        // without ever seeing a dedup id).
        self.sweep_dedup(now_ms, DEDUP_SWEEP_MIN)?;
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
        if let Some(first) = self.remembered(&once, now_ms)? {
            return Ok((Some(first), false));
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

    /// The first key a `dedup` row remembers, while its window is open at `now_ms`.
    fn remembered(&self, dk: &[u8], now_ms: i64) -> Result<Option<EventKey>, StoreError> {
        let row = self
            .dedup
            .get(dk)?
            .and_then(|v| parse_dedup_value(v.value()));
        Ok(row.and_then(|(first, until)| (until > now_ms).then_some(first)))
    }

    /// Writes (or replaces) a `dedup` row. It is not listed for the sweep: a row with an
    /// until is listed by whoever remembers it first ([`Tables::deduplicate`], a snapshot's
    /// install); a once-row (until `i64::MAX`) is never swept.
    pub(super) fn remember(
        &mut self,
        dk: &[u8],
        first: &EventKey,
        until_ms: i64,
    ) -> Result<(), StoreError> {
        let v = dedup_value(first, until_ms);
        if let Some(old) = self.dedup.insert(dk, v.as_slice())? {
            self.digest ^= row_hash(ROW_DEDUP, dk, old.value());
        }
        self.digest ^= row_hash(ROW_DEDUP, dk, &v);
        Ok(())
    }

    /// Removes a `dedup` row, if there.
    pub(super) fn forget(&mut self, dk: &[u8]) -> Result<(), StoreError> {
        if let Some(old) = self.dedup.remove(dk)? {
            self.digest ^= row_hash(ROW_DEDUP, dk, old.value());
        }
        Ok(())
    }

    /// For a message with a dedup id: the key of the message stored first under the same
    /// `(topic, dedup id)` while it is remembered at this message's enqueue time (then this
    /// one is not stored); else remembers this one as the first, listed for the sweep of
    /// the current command.
    ///
    /// One B-tree descent for an id not remembered (the common case): the new row goes in
    /// and the row it replaced, if its window is still open, is put back.
    pub(super) fn deduplicate(
        &mut self,
        key: &EventKey,
        message: &[u8],
    ) -> Result<Deduplicated, StoreError> {
        if message.first() != Some(&futureq_core::message::FORMAT_VERSION_EXTRAS) {
            return Ok(Deduplicated::NoId);
        }
        let Ok((m, _)) = StoredMessage::decode_borrowed(message) else {
            return Ok(Deduplicated::NoId);
        };
        if m.extras.dedup_id.is_empty() {
            return Ok(Deduplicated::NoId);
        }
        let dk = dedup_key(key.topic_hash(), &m.extras.dedup_id);
        let until = m.extras.dedup_until_ms;
        let v = dedup_value(key, until);
        let old = self
            .dedup
            .insert(dk.as_slice(), v.as_slice())?
            .map(|g| g.value().to_vec());
        if let Some(old) = old {
            match parse_dedup_value(&old) {
                Some((first, old_until)) if old_until > m.enqueued_at_ms => {
                    self.dedup.insert(dk.as_slice(), old.as_slice())?;
                    return Ok(Deduplicated::Duplicate(first));
                }
                _ => self.digest ^= row_hash(ROW_DEDUP, &dk, &old),
            }
        }
        self.digest ^= row_hash(ROW_DEDUP, &dk, &v);
        let l = &mut self.listed;
        if l.chunks.is_empty() || l.last_len == SWEEP_LIST_KEYS_MAX {
            l.chunks.push((key.event_id().0, Vec::new()));
            l.last_len = 0;
        }
        if let Some((_, keys)) = l.chunks.last_mut() {
            push_swept(keys, &dk);
        }
        l.last_len += 1;
        l.count += 1;
        l.until_ms = l.until_ms.max(until);
        Ok(Deduplicated::Remembered(m.enqueued_at_ms))
    }

    /// Writes the `dedup-sweep` rows of the rows the current command remembered (if any), then
    /// sweeps at `now_ms` (see [`Tables::sweep_dedup`]: about twice as many listed rows)
    /// (a clock the command carries). Per command, so every replica lists and sweeps alike.
    pub(super) fn list_remembered(&mut self, now_ms: i64) -> Result<(), StoreError> {
        let l = std::mem::take(&mut self.listed);
        if l.chunks.is_empty() {
            return Ok(());
        }
        for (first_id, keys) in &l.chunks {
            self.add_sweep_row(&sweep_key(l.until_ms, *first_id), keys)?;
        }
        self.sweep_dedup(now_ms, l.count.saturating_mul(2))
    }

    /// Lists one `dedup` row for the sweep on its own (a row of the earlier version, which
    /// kept no lists); a once-row (until `i64::MAX`) is never swept, so never listed. True
    /// when listed.
    pub(super) fn list_alone(
        &mut self,
        dk: &[u8],
        first: &EventKey,
        until_ms: i64,
    ) -> Result<bool, StoreError> {
        if until_ms == i64::MAX {
            return Ok(false);
        }
        let mut list = Vec::new();
        push_swept(&mut list, dk);
        self.add_sweep_row(&sweep_key(until_ms, first.event_id().0), &list)?;
        Ok(true)
    }

    /// Adds a `dedup-sweep` row (appended to a row already under the same key, which the
    /// apply never writes twice: one descent then).
    pub(super) fn add_sweep_row(&mut self, key: &[u8], list: &[u8]) -> Result<(), StoreError> {
        let old = self
            .dedup_sweep
            .insert(key, list)?
            .map(|old| old.value().to_vec());
        match old {
            None => self.digest ^= row_hash(ROW_DEDUP_SWEEP, key, list),
            Some(mut v) => {
                self.digest ^= row_hash(ROW_DEDUP_SWEEP, key, &v);
                v.extend_from_slice(list);
                self.dedup_sweep.insert(key, v.as_slice())?;
                self.digest ^= row_hash(ROW_DEDUP_SWEEP, key, &v);
            }
        }
        Ok(())
    }

    /// Forgets, oldest list first, the `dedup` rows listed in `dedup-sweep` lists whose until
    /// lies [`DEDUP_CLOCK_SKEW_MAX_MS`] or more before `now_ms` (a clock reading one command
    /// carries) and whose window ended by then: exactly `max(at_least, DEDUP_SWEEP_MIN)`
    /// listed rows are looked at, or fewer when no more are due. A list cut there keeps the
    /// rest of its keys under its key, so one call's work is bounded whatever the lists' sizes.
    /// A listed row remembered again since (a later until) stays: its later list forgets it.
    ///
    /// # Errors
    /// [`StoreError::CorruptMeta`] for a list that is not whole (nothing of the call is kept:
    /// the caller's transaction fails).
    pub(super) fn sweep_dedup(&mut self, now_ms: i64, at_least: usize) -> Result<(), StoreError> {
        let bound = now_ms.saturating_sub(DEDUP_CLOCK_SKEW_MAX_MS);
        let want = at_least.max(DEDUP_SWEEP_MIN);
        let mut looked = 0;
        while looked < want {
            let (k, list) = {
                let Some(r) = self.dedup_sweep.first()? else {
                    break;
                };
                let (k, v) = r;
                if sweep_key_until(k.value()) > bound {
                    break;
                }
                (k.value().to_vec(), v.value().to_vec())
            };
            self.dedup_sweep.remove(k.as_slice())?;
            self.digest ^= row_hash(ROW_DEDUP_SWEEP, &k, &list);
            let keys = swept_keys(&list).ok_or_else(|| StoreError::CorruptMeta {
                key: "dedup-sweep",
                reason: format!("a list of {} bytes that is not whole", list.len()),
            })?;
            let take = keys.len().min(want - looked);
            if take < keys.len() {
                let mut rest = Vec::new();
                for dk in &keys[take..] {
                    push_swept(&mut rest, dk);
                }
                self.add_sweep_row(&k, &rest)?;
            }
            for &dk in &keys[..take] {
                looked += 1;
                let Some(old) = self.dedup.remove(dk)?.map(|g| g.value().to_vec()) else {
                    continue;
                };
                match parse_dedup_value(&old) {
                    Some((_, until)) if until > bound => {
                        self.dedup.insert(dk, old.as_slice())?;
                    }
                    _ => self.digest ^= row_hash(ROW_DEDUP, dk, &old),
                }
            }
        }
        Ok(())
    }

    /// Registers a group (`groups` key); true when it was new.
    pub(super) fn add_group(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        let new = self.groups.insert(key, ())?.is_none();
        if new {
            self.digest ^= row_hash(ROW_GROUP, key, &[]);
        }
        Ok(new)
    }

    /// Removes a group registration; false if it was not registered.
    pub(super) fn remove_group(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        let found = self.groups.remove(key)?.is_some();
        if found {
            self.digest ^= row_hash(ROW_GROUP, key, &[]);
        }
        Ok(found)
    }

    /// Removes a message and its index and expiry entries; false if it did not exist. Nothing
    /// of its payload is copied.
    pub(super) fn remove(&mut self, key: &EventKey) -> Result<bool, StoreError> {
        Ok(self.unlink(key, false)?.is_some())
    }

    /// Removes a message and its index and expiry entries; the message, if it existed and
    /// decoded (its payload copied out of the table).
    pub(super) fn take(&mut self, key: &EventKey) -> Result<Option<StoredMessage>, StoreError> {
        Ok(self.unlink(key, true)?.flatten())
    }

    /// Removes a message and its index, expiry and once-rows: `None` when it was not stored;
    /// else the message when `keep` and it decoded. An undecodable one is removed too, and
    /// logged: its index entries may remain. The rows to remove are read from the stored
    /// bytes in place; only `keep` copies the payload.
    fn unlink(
        &mut self,
        key: &EventKey,
        keep: bool,
    ) -> Result<Option<Option<StoredMessage>>, StoreError> {
        let Some(v) = self.messages.remove(key.0.as_slice())? else {
            return Ok(None);
        };
        self.digest ^= row_hash(ROW_MESSAGE, &key.0, v.value());
        let decoded = StoredMessage::decode_borrowed(v.value()).map(|(mut m, payload)| {
            if keep {
                m.payload = Bytes::copy_from_slice(payload);
            }
            m
        });
        drop(v);
        self.topic_delta(key.topic_hash(), "").0 -= 1;
        let m = match decoded {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(target: "storage", key = %key, error = %e, "deleted an undecodable message; its index entries may remain");
                return Ok(Some(None));
            }
        };
        for i in &m.indexes {
            self.remove_row(KeyTable::Index, &index_entry(&i.index_key(), key))?;
        }
        if let Some(e) = m.expires_at_ms() {
            self.remove_row(KeyTable::Expiry, &expiry_key(e, key))?;
        }
        // Its dead letters' once-rows go with it (one seek when it has none).
        let dlq = futureq_core::message::dead_letter_topic(&m.topic, &m.extras.dead_letter_topic);
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
        Ok(Some(keep.then_some(m)))
    }

    /// Moves a stored message to a new key and due time ([`futureq_core::command::Reschedule`]):
    /// the new key, or `None` when it was not stored or had expired by the command's clock
    /// (then nothing changes).
    pub(super) fn reschedule(
        &mut self,
        r: &futureq_core::command::ArchivedReschedule,
    ) -> Result<Option<EventKey>, StoreError> {
        let old = EventKey(r.key);
        let now_ms = r.now_ms.to_native();
        let live = match self.messages.get(old.0.as_slice())? {
            Some(v) => {
                StoredMessage::decode_borrowed(v.value()).is_ok_and(|(m, _)| !m.is_expired(now_ms))
            }
            None => false,
        };
        if !live {
            return Ok(None);
        }
        let Some(mut m) = self.take(&old)? else {
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
