//! After a delivery: ACKs and NACKs, in-flight timeouts, dead letters, parking, and the
//! store's notices (published, deleted).

use super::*;

impl<S: Sink> Hub<S> {
    /// A storage commit stored messages of topic `h`, the smallest key being `min_key`: make
    /// sure the scan cursor has not passed it and the topic is scanned when it falls due.
    pub fn on_published(&mut self, min_key: EventKey) {
        let bucket_ms = self.cfg.bucket_ms;
        if let Some(t) = self.topics.get_mut(&min_key.topic_hash()) {
            if min_key < t.resume {
                t.resume = min_key;
            }
            let due = bucket_start_ms(min_key.bucket(), bucket_ms);
            t.next_scan_ms = Some(t.next_scan_ms.map_or(due, |n| n.min(due)));
        }
    }

    /// Keys were deleted by someone else (TTL sweep): forget them.
    pub fn on_deleted(&mut self, keys: &[EventKey]) {
        let gone: HashSet<&EventKey> = keys.iter().collect();
        for t in self.topics.values_mut() {
            if !t.ahead.is_empty() {
                t.ahead.retain(|(_, k), _| !gone.contains(k));
            }
        }
        for key in keys {
            self.unpark(*key);
        }
        for key in keys {
            self.attempts_kept.remove(key);
            if let Some(e) = self.entries.remove(key) {
                self.drop_entry_tracking(*key, &e);
            }
        }
    }

    pub(super) fn drop_entry_tracking(&mut self, key: EventKey, e: &Entry) {
        for r in &e.recipients {
            if let RState::Pending {
                consumer,
                deadline_ms,
            } = r.state
            {
                self.timeouts.remove(deadline_ms, (key, consumer));
                if let Some(c) = self.consumers.get_mut(&consumer) {
                    c.in_flight.remove(&key);
                }
            }
        }
        if let Some(t) = self.topics.get_mut(&key.topic_hash()) {
            t.entries -= 1;
        }
    }

    /// Remembers the attempts of `key`'s entry, which leaves memory while the message stays
    /// stored, if the message has an attempt limit and someone had attempts.
    pub(super) fn keep_attempts(&mut self, key: EventKey, e: &Entry) {
        if attempt_limit(&self.cfg, &e.message) == 0 {
            return;
        }
        let kept: Vec<(RecipientId, u32)> = e
            .recipients
            .iter()
            .filter(|r| r.attempts > 0)
            .map(|r| (r.id.clone(), r.attempts))
            .collect();
        if kept.is_empty() {
            self.attempts_kept.remove(&key);
        } else if self.attempts_kept.len() < ATTEMPTS_KEPT_MAX
            || self.attempts_kept.contains_key(&key)
        {
            self.attempts_kept.insert(key, kept);
        }
    }

    /// The recipients that gave up since the last call (see the module docs): each one to be
    /// answered through [`Hub::dead_lettered`].
    pub fn take_dead_letters(&mut self) -> Vec<DeadLetter> {
        std::mem::take(&mut self.dead_letters)
    }

    /// The outcome of a dead letter's command: committed (the copy is stored, or the message
    /// was gone), the recipient is done; else it waits again and gives up again at its next
    /// turn. Ignored when the entry or the recipient moved on meanwhile.
    pub fn dead_lettered(&mut self, dl: &DeadLetter, committed: bool, now_ms: i64) {
        let Some(e) = self.entries.get_mut(&dl.key) else {
            return;
        };
        let Some(r) = e
            .recipients
            .iter_mut()
            .find(|r| r.id == dl.recipient && r.state == RState::DeadLettering)
        else {
            return;
        };
        if committed {
            r.state = RState::Acked;
        } else {
            r.state = RState::Waiting;
            if let Some(t) = self.topics.get_mut(&dl.key.topic_hash()) {
                t.waiting.push_back(dl.key);
            }
        }
        self.finish_if_done(dl.key, now_ms);
    }

    /// Handles an ACK (`success`) or NACK frame of consumer `id` for `key`.
    pub fn ack(&mut self, id: ConsumerId, key: EventKey, success: bool, now_ms: i64) -> AckOutcome {
        let Some(c) = self.consumers.get_mut(&id) else {
            return AckOutcome::Ignored;
        };
        if !c.in_flight.remove(&key) {
            return AckOutcome::Ignored;
        }
        let Some(e) = self.entries.get_mut(&key) else {
            return AckOutcome::Ignored;
        };
        let Some(r) = e
            .recipients
            .iter_mut()
            .find(|r| matches!(r.state, RState::Pending { consumer, .. } if consumer == id))
        else {
            return AckOutcome::Ignored;
        };
        if let RState::Pending { deadline_ms, .. } = r.state {
            self.timeouts.remove(deadline_ms, (key, id));
        }
        // An ACK is only recorded when its delete can be queued; otherwise redeliver.
        let outcome = if success && self.deletes.len() < crate::deleter::DELETE_PENDING_MAX {
            r.state = RState::Acked;
            AckOutcome::Acked
        } else {
            r.state = RState::Waiting;
            if let Some(t) = self.topics.get_mut(&key.topic_hash()) {
                t.waiting.push_front(key);
            }
            if success {
                AckOutcome::Refused
            } else {
                AckOutcome::Nacked
            }
        };
        self.finish_if_done(key, now_ms);
        outcome
    }

    /// Forgets `key`'s parked record; returns the recipients it says acked.
    pub(super) fn unpark(&mut self, key: EventKey) -> Vec<RecipientId> {
        match self
            .topics
            .get_mut(&key.topic_hash())
            .and_then(|t| t.parked.remove(&key))
        {
            Some(acked) => {
                self.parked -= 1;
                acked
            }
            None => Vec::new(),
        }
    }

    /// Ends `key`'s entry if no recipient is pending and no connected one waits: deletes it
    /// when every group acked, parks it while groups without members still wait, releases it
    /// when nobody acked.
    pub(super) fn finish_if_done(&mut self, key: EventKey, now_ms: i64) {
        let h = key.topic_hash();
        let (Some(e), Some(t)) = (self.entries.get(&key), self.topics.get(&h)) else {
            return;
        };
        let open = e.recipients.iter().any(|r| match r.state {
            // Its dead letter's outcome decides (done, or waiting again).
            RState::Pending { .. } | RState::DeadLettering => true,
            RState::Waiting => t.present(&r.id),
            RState::Acked | RState::Dropped => false,
        });
        if open {
            return;
        }
        if e.recipients.iter().any(|r| r.state == RState::Waiting) {
            // Only groups without members still need it.
            self.shelve(key);
            return;
        }
        let acked_now = e.recipients.iter().any(|r| r.state == RState::Acked);
        let e = self.entries.remove(&key).expect("entry present");
        self.drop_entry_tracking(key, &e);
        let acked = !self.unpark(key).is_empty() || acked_now;
        if acked {
            self.attempts_kept.remove(&key);
        } else {
            self.keep_attempts(key, &e);
        }
        let t = self.topics.get_mut(&h).expect("checked above");
        if acked {
            self.deletes.push_accepted(key);
        } else {
            // Nobody took it: leave it in storage and let the scan find it again.
            if key < t.resume {
                t.resume = key;
            }
            t.next_scan_ms = Some(t.next_scan_ms.map_or(now_ms, |n| n.min(now_ms)));
        }
    }

    /// Takes `key`'s entry out of memory; the recipients that still wait get the message from
    /// storage later (a connected one from its catch-up cursor, a group without members when
    /// one comes back). Parks it with who acked (nothing to remember if nobody did). False,
    /// and the entry stays, when [`PARKED_MAX`] records leave no room to remember who acked.
    pub(super) fn shelve(&mut self, key: EventKey) -> bool {
        let h = key.topic_hash();
        let (Some(e), Some(t)) = (self.entries.get(&key), self.topics.get(&h)) else {
            return false;
        };
        let acked_now: Vec<RecipientId> = e
            .recipients
            .iter()
            .filter(|r| r.state == RState::Acked)
            .map(|r| r.id.clone())
            .collect();
        let behind: Vec<RecipientId> = e
            .recipients
            .iter()
            .filter(|r| r.state == RState::Waiting && t.present(&r.id))
            .map(|r| r.id.clone())
            .collect();
        if !acked_now.is_empty() && !t.parked.contains_key(&key) && self.parked >= PARKED_MAX {
            return false;
        }
        let e = self.entries.remove(&key).expect("entry present");
        self.drop_entry_tracking(key, &e);
        self.keep_attempts(key, &e);
        let mut acked = self.unpark(key);
        acked.extend(acked_now);
        let t = self.topics.get_mut(&h).expect("checked above");
        for r in behind {
            t.fell_behind(r, key);
        }
        if !acked.is_empty() {
            t.parked.insert(key, acked);
            self.parked += 1;
        }
        true
    }

    /// Makes room in topics whose entries fill their entry cap while a recipient could take
    /// more: entries that only full or away recipients still need are shelved, so that a
    /// recipient that does not keep up never holds the topic for the others.
    pub(super) fn shed_lagging(&mut self) {
        if self.parked >= PARKED_MAX {
            // Nothing can be parked: the entry cap holds such topics back (documented limit).
            return;
        }
        let pressed: HashSet<TopicHash> = self
            .topics
            .iter()
            .filter(|(_, t)| t.entries > 0 && self.cap_room(t) == 0 && self.best_free(t) > 0)
            .map(|(h, _)| *h)
            .collect();
        if pressed.is_empty() {
            return;
        }
        let keys: Vec<EventKey> = self
            .entries
            .iter()
            .filter(|(k, e)| {
                let t = &self.topics[&k.topic_hash()];
                pressed.contains(&k.topic_hash())
                    && e.recipients.iter().any(|r| r.state == RState::Waiting)
                    && e.recipients.iter().all(|r| match r.state {
                        RState::Pending { .. } | RState::DeadLettering => false,
                        RState::Waiting => self.recipient_free(t, &r.id) == 0,
                        RState::Acked | RState::Dropped => true,
                    })
            })
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            self.shelve(k);
        }
    }

    /// Moves deliveries whose ACK deadline passed back to waiting.
    pub fn expire_in_flight(&mut self, now_ms: i64) {
        for (deadline, (key, consumer)) in self.timeouts.take_due(now_ms) {
            if let Some(c) = self.consumers.get_mut(&consumer) {
                c.in_flight.remove(&key);
            }
            let Some(e) = self.entries.get_mut(&key) else {
                continue;
            };
            for r in &mut e.recipients {
                if r.state
                    == (RState::Pending {
                        consumer,
                        deadline_ms: deadline,
                    })
                {
                    r.state = RState::Waiting;
                    self.counters.timeouts += 1;
                    if let Some(t) = self.topics.get_mut(&key.topic_hash()) {
                        t.waiting.push_back(key);
                    }
                }
            }
        }
    }
}
