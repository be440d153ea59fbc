//! The apply of committed log entries: one write transaction per group of entries.
//!
//! # Invariants
//! - **Event ids never regress** (see [`Store::apply_entries`]).
//! - **The apply is deterministic**: every decision reads only the entries and the applied
//!   state, so replicas that apply the same log hold the same rows and digest.

use std::sync::atomic::Ordering;

use futureq_core::{EventKey, TopicHash};
use redb::ReadableTable;

use super::db::Store;
use super::schema::{group_key, APPLIED_INDEX, APPLIED_TERM, LAST_ID, RAFT_META};
use super::tables::{Deduplicated, Tables};
use crate::StoreError;

impl Store {
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
        use futureq_core::command::decode;
        let applied = self.applied()?.map(|(i, _)| i);
        let fresh: Vec<&(u64, u64, &[u8])> = entries
            .iter()
            .filter(|(i, _, _)| applied.is_none_or(|a| *i > a))
            .collect();
        // Entries come in log order, each once: the deterministic apply depends on it.
        if !fresh.windows(2).all(|w| w[0].0 < w[1].0) {
            return Err(StoreError::Invariant(
                "entries to apply are not in ascending log order".into(),
            ));
        }
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
                apply_command(&mut t, *index, c, &mut out, &mut stored)?;
            }
            // `last-id` never goes down: checked against what this transaction reads, before
            // anything of it is committed.
            let before = t.meta.get(LAST_ID)?.map_or(0, |v| v.value());
            if out.max_event_id < before {
                return Err(StoreError::Invariant(format!(
                    "last-id would go down: {} below {before}",
                    out.max_event_id
                )));
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
}

/// Applies one decoded command of the entry at `index` inside the group's transaction: what
/// it answers and refuses goes to `out`, the keys it stores to `stored`.
fn apply_command(
    t: &mut Tables<'_>,
    index: u64,
    c: &futureq_core::command::CommandRef<'_>,
    out: &mut ApplyOutcome,
    stored: &mut Vec<EventKey>,
) -> Result<(), StoreError> {
    use futureq_core::command::CommandRef;
    match c {
        CommandRef::Store(b) => apply_store(t, index, b, out, stored)?,
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
                .push((index, futureq_core::command::Answer::Cancelled(cancelled)));
        }
        CommandRef::Reschedule(r) => {
            if let Err(refusal) = take_id(r.event_id.to_native(), out) {
                out.refused.push((index, refusal));
                return Ok(());
            }
            let moved = t.reschedule(r)?;
            if let Some(key) = moved {
                out.deleted.push(EventKey(r.key));
                stored.push(key);
            }
            out.answers
                .push((index, futureq_core::command::Answer::Rescheduled(moved)));
        }
        CommandRef::DeadLetter(d) => {
            // A leader never builds a longer group (consumers' group ids are
            // checked); the copy could not be encoded: refused, never fatal.
            if d.group.len() > futureq_core::message::TOPIC_LEN_MAX {
                out.refused.push((
                    index,
                    Refusal::Undecodable {
                        reason: format!("a dead letter's group of {} bytes", d.group.len()),
                    },
                ));
                return Ok(());
            }
            if let Err(refusal) = take_id(d.event_id.to_native(), out) {
                out.refused.push((index, refusal));
                return Ok(());
            }
            let (copy, new) = t.dead_letter(d)?;
            if new {
                stored.extend(copy);
            }
            out.answers
                .push((index, futureq_core::command::Answer::DeadLettered(copy)));
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
                .push((index, futureq_core::command::Answer::GroupDeleted(found)));
        }
    }
    Ok(())
}

/// Stores the items of a store command (`index`): refused whole unless its ids ascend above
/// every applied one; an item whose dedup id is remembered is answered with the first key.
fn apply_store(
    t: &mut Tables<'_>,
    index: u64,
    b: &futureq_core::command::ArchivedStoreBatch,
    out: &mut ApplyOutcome,
    stored: &mut Vec<EventKey>,
) -> Result<(), StoreError> {
    if let Err(r) = ids_above(b, out.max_event_id) {
        out.refused.push((index, r));
        return Ok(());
    }
    let mut dups = Vec::new();
    // The latest enqueue time of the command's messages: the sweep's clock.
    let mut now_ms = i64::MIN;
    for item in b.items.iter() {
        let key = item.key();
        // Event ids never regress: `ids_above` let only ascending ids above every applied
        // one through.
        if key.event_id().0 <= out.max_event_id {
            return Err(StoreError::Invariant(format!(
                "{key}: its id is not above {}",
                out.max_event_id
            )));
        }
        out.max_event_id = key.event_id().0;
        match t.deduplicate(&key, item.message.as_slice())? {
            Deduplicated::Duplicate(first) => {
                dups.push((key.event_id().0, first));
                continue;
            }
            Deduplicated::Remembered(enqueued_at_ms) => now_ms = now_ms.max(enqueued_at_ms),
            Deduplicated::NoId => {}
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
    t.list_remembered(now_ms)?;
    if !dups.is_empty() {
        out.answers
            .push((index, futureq_core::command::Answer::Deduplicated(dups)));
    }
    Ok(())
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
