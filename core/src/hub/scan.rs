//! Scans: which topics and ranges to read now, and what a read brings (new entries, catch-up,
//! read-ahead, expiry); the delete batches and the next wake-up.

use super::*;

impl<S: Sink> Hub<S> {
    /// The scans to run now: head scans of topics with consumers that have room and whose next
    /// work is due, and catch-up scans of recipients that fell behind and have room. A scan
    /// reads what its recipients can take now, at least `scan_limit` keys and at most
    /// [`SCAN_BATCH_MAX`], so a large due backlog goes out in few round trips. Makes room
    /// first where recipients that do not keep up fill a topic's entry cap.
    pub fn scans_due(&mut self, now_ms: i64) -> Vec<ScanRequest> {
        if self.deletes.len() < SETTLE_DELETES_MAX / 2 {
            let unsettled: Vec<TopicHash> = self
                .topics
                .iter()
                .filter(|(_, t)| t.unsettled)
                .map(|(h, _)| *h)
                .collect();
            for h in unsettled {
                self.settle_parked(h, false);
            }
        }
        self.shed_lagging();
        for t in self.topics.values_mut() {
            // What lies at or after the head cursor, the head scan reads for everyone.
            let head = t.resume;
            t.lag.retain(|_, from| *from < head);
        }
        let horizon = now_ms.saturating_add(self.cfg.lookahead_ms);
        let upper_bucket = bucket_of(horizon, self.cfg.bucket_ms).next();
        let limit = |room: usize| room.max(self.cfg.scan_limit).clamp(1, SCAN_BATCH_MAX);
        let mut scans = Vec::new();
        for (h, t) in &self.topics {
            if t.next_scan_ms.is_some_and(|n| n <= horizon) && self.topic_has_room(t) {
                scans.push(ScanRequest {
                    topic_hash: *h,
                    from: t.resume,
                    upper: EventKey::bucket_start(*h, upper_bucket),
                    limit: limit(self.topic_room(t)),
                    catch_up: None,
                });
            }
            if self.cap_room(t) == 0 {
                continue;
            }
            for (r, from) in &t.lag {
                let free = self.recipient_free(t, r);
                if free > 0 {
                    scans.push(ScanRequest {
                        topic_hash: *h,
                        from: *from,
                        upper: t.resume,
                        // What the recipient can take (it alone is behind), with a little
                        // slack for the keys it skips (acked, in memory).
                        limit: free
                            .saturating_mul(2)
                            .clamp(CATCH_UP_SCAN_MIN, SCAN_BATCH_MAX),
                        catch_up: Some(CatchUp(r.clone())),
                    });
                }
            }
        }
        scans
    }

    /// Feeds a catch-up scan's result: sends `r` (and whoever else still needs them) the
    /// messages it is owed, and moves its cursor; the cursor ends once it reaches the head.
    pub(super) fn apply_catch_up(
        &mut self,
        req: &ScanRequest,
        r: RecipientId,
        res: ScanResult,
        now_ms: i64,
    ) {
        let h = req.topic_hash;
        let Some(t) = self.topics.get_mut(&h) else {
            return;
        };
        if !t.present(&r) {
            return;
        }
        // Taken out for the pass: whatever falls behind meanwhile lowers it again.
        let before = t.lag.remove(&r);
        let mut stop = None;
        let mut last = None;
        for (key, msg) in res.items {
            let t = &self.topics[&h];
            if self.recipient_free(t, &r) == 0 {
                stop = Some(key);
                break;
            }
            last = Some(key);
            if self.handled_already(h, key, &msg, now_ms) {
                continue;
            }
            let due = msg.due_at_ms();
            if due > now_ms {
                // Not due (the clock went back): the head scan takes it from here when it is.
                let t = self.topics.get_mut(&h).expect("present");
                t.resume = t.resume.min(key);
                t.next_scan_ms = Some(t.next_scan_ms.map_or(due, |n| n.min(due)));
                break;
            }
            match self.dispatch_new(h, key, msg, now_ms) {
                Dispatch::Sent | Dispatch::Passed => {}
                Dispatch::NoRoom => {
                    stop = Some(key);
                    break;
                }
            }
        }
        // A scan that reached its range's end leaves the cursor at `upper` (the head as of the
        // request), not gone: meanwhile the head may have moved back and passed messages `r`
        // still needs at or after `upper` (their `fell_behind` only lowered the cursor this
        // scan was for). `scans_due` drops the cursor once the head is at or before it.
        let next = match stop {
            Some(key) => key,
            None if !res.exhausted => last.and_then(|k| k.successor()).unwrap_or(req.upper),
            None => req.upper,
        };
        let t = self.topics.get_mut(&h).expect("present");
        let head = t.resume;
        for at in before.filter(|b| *b < req.from).into_iter().chain([next]) {
            // At or after the head, the head scan covers it.
            if at < head {
                t.fell_behind(r.clone(), at);
            }
        }
    }

    /// Whether a scanned message needs nothing from the scan: it is in memory, being deleted or
    /// read ahead, or it expired (then its delete is queued).
    pub(super) fn handled_already(
        &mut self,
        h: TopicHash,
        key: EventKey,
        msg: &StoredMessage,
        now_ms: i64,
    ) -> bool {
        if self.entries.contains_key(&key)
            || self.deletes.contains(&key)
            || self.topics[&h].ahead.contains_key(&(msg.due_at_ms(), key))
        {
            return true;
        }
        if msg.is_expired(now_ms) {
            if self.deletes.push(key).is_ok() {
                self.unpark(key);
                self.counters.expired += 1;
            }
            return true;
        }
        false
    }

    /// Feeds a scan's result: delivers what is due, queues expired keys for deletion, and
    /// moves the topic's cursor and next scan time.
    pub fn apply_scan(&mut self, req: &ScanRequest, res: ScanResult, now_ms: i64) {
        if let Some(CatchUp(r)) = &req.catch_up {
            self.apply_catch_up(req, r.clone(), res, now_ms);
            return;
        }
        let h = req.topic_hash;
        let Some(t) = self.topics.get(&h) else { return };
        let resume_at_start = t.resume;
        let mut stop: Option<(EventKey, i64)> = None;
        let mut last = None;
        for (key, msg) in res.items {
            last = Some(key);
            if self.handled_already(h, key, &msg, now_ms) {
                continue;
            }
            let due = msg.due_at_ms();
            if due > now_ms {
                let t = &self.topics[&h];
                if due <= now_ms.saturating_add(self.cfg.lookahead_ms) && self.topic_has_room(t) {
                    self.topics
                        .get_mut(&h)
                        .expect("present")
                        .ahead
                        .insert((due, key), msg);
                    continue;
                }
                // Not due yet (beyond the read-ahead window, or no room): come back then.
                stop = Some((key, due));
                break;
            }
            match self.dispatch_new(h, key, msg, now_ms) {
                Dispatch::Sent | Dispatch::Passed => {}
                Dispatch::NoRoom => {
                    // No recipient has room (or the entry cap is full): retry from this key
                    // once one does.
                    stop = Some((key, now_ms));
                    break;
                }
            }
        }
        let bucket_ms = self.cfg.bucket_ms;
        let t = self.topics.get_mut(&h).expect("checked above");
        let (resume, next) = match stop {
            Some((key, at)) => (key, Some(at)),
            None if !res.exhausted => (
                last.and_then(|k| k.successor()).unwrap_or(req.upper),
                Some(now_ms),
            ),
            None => (
                req.upper,
                res.next_key.map(|k| bucket_start_ms(k.bucket(), bucket_ms)),
            ),
        };
        if t.resume == resume_at_start {
            t.resume = resume;
            t.next_scan_ms = next;
        } else {
            // A rewind (release, publish) happened while the scan ran: keep the lower cursor.
            t.resume = t.resume.min(resume);
            t.next_scan_ms = match (t.next_scan_ms, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }

    /// Creates the entry for a newly due message and sends it to every connected recipient
    /// that has room and has not acked it (a parked message goes to the recipients still owed
    /// it). A parked message whose connected recipients are all full is passed: they get it
    /// from their catch-up cursors.
    pub(super) fn dispatch_new(
        &mut self,
        h: TopicHash,
        key: EventKey,
        msg: Arc<StoredMessage>,
        now_ms: i64,
    ) -> Dispatch {
        // The module's rule: a message enters delivery only once due and before its TTL
        // (every caller checked both against this `now_ms`).
        debug_assert!(
            msg.due_at_ms() <= now_ms && !msg.is_expired(now_ms),
            "{key}: due {} or expired at {now_ms}",
            msg.due_at_ms()
        );
        let Some(t) = self.topics.get(&h) else {
            return Dispatch::Passed;
        };
        let acked = t.parked.get(&key);
        let open: Vec<RecipientId> = t
            .recipients()
            .filter(|r| acked.is_none_or(|a| !a.contains(r)))
            .collect();
        if open.iter().all(|r| !t.present(r)) {
            if open.is_empty() && acked.is_some() {
                // Every recipient acked it (a group was forgotten meanwhile): delete it.
                self.deletes.push_accepted(key);
                self.unpark(key);
                self.attempts_kept.remove(&key);
            }
            return Dispatch::Passed;
        }
        if self.cap_room(t) == 0 {
            return Dispatch::NoRoom;
        }
        let kept = self.attempts_kept.remove(&key).unwrap_or_default();
        let recipients: Vec<Recipient> = open
            .into_iter()
            .map(|id| Recipient {
                attempts: kept.iter().find(|(r, _)| *r == id).map_or(0, |(_, n)| *n),
                id,
                state: RState::Waiting,
            })
            .collect();
        let n = recipients.len();
        self.entries.insert(
            key,
            Entry {
                message: msg,
                recipients,
            },
        );
        self.topics.get_mut(&h).expect("present").entries += 1;
        let mut sent = 0;
        let mut unsent_present = false;
        for ri in 0..n {
            if self.try_deliver(key, ri, now_ms) {
                sent += 1;
            } else {
                let t = &self.topics[&h];
                unsent_present |= t.present(&self.entries[&key].recipients[ri].id);
            }
        }
        let giving_up = self.entries[&key]
            .recipients
            .iter()
            .any(|r| r.state == RState::DeadLettering);
        if sent == 0 && !giving_up {
            let e = self.entries.remove(&key).expect("just inserted");
            self.drop_entry_tracking(key, &e);
            self.keep_attempts(key, &e);
            let t = self.topics.get_mut(&h).expect("present");
            if !t.parked.contains_key(&key) {
                return Dispatch::NoRoom;
            }
            for r in e.recipients.into_iter().map(|r| r.id) {
                if t.present(&r) {
                    t.fell_behind(r, key);
                }
            }
            return Dispatch::Passed;
        }
        if unsent_present {
            self.topics
                .get_mut(&h)
                .expect("present")
                .waiting
                .push_back(key);
        }
        Dispatch::Sent
    }

    /// The earliest instant the dispatcher has work: a scan, a waiting recipient with room, or
    /// an in-flight deadline. `None` = nothing until an event arrives.
    #[must_use]
    pub fn next_wakeup(&self, now_ms: i64) -> Option<i64> {
        let mut at = self.timeouts.first();
        let mut merge = |v: i64| at = Some(at.map_or(v, |a| a.min(v)));
        for t in self.topics.values() {
            if self.waiting_deliverable(t) {
                merge(now_ms);
            }
            if let Some(((due, _), _)) = t.ahead.first_key_value() {
                if self.waiting_servable(t) {
                    merge(*due);
                }
            }
            if let Some(n) = t.next_scan_ms {
                if self.topic_has_room(t) {
                    merge(n.saturating_sub(self.cfg.lookahead_ms));
                }
            }
            if self.cap_room(t) > 0
                && t.lag
                    .iter()
                    .any(|(r, from)| *from < t.resume && self.recipient_free(t, r) > 0)
            {
                merge(now_ms);
            }
        }
        at
    }

    /// Sends the read-ahead messages whose instant has come (expired ones are deleted).
    pub fn deliver_read_ahead(&mut self, now_ms: i64) {
        let hashes: Vec<TopicHash> = self
            .topics
            .iter()
            .filter(|(_, t)| {
                t.ahead
                    .first_key_value()
                    .is_some_and(|((d, _), _)| *d <= now_ms)
            })
            .map(|(h, _)| *h)
            .collect();
        for h in hashes {
            while let Some(entry) = self.topics.get_mut(&h).and_then(|t| t.ahead.first_entry()) {
                if entry.key().0 > now_ms {
                    break;
                }
                let ((due, key), msg) = entry.remove_entry();
                if msg.is_expired(now_ms) {
                    if self.deletes.push(key).is_ok() {
                        self.unpark(key);
                        self.counters.expired += 1;
                    }
                    continue;
                }
                // Its slot in the entry cap passes to the entry dispatch_new creates.
                if self.dispatch_new(h, key, Arc::clone(&msg), now_ms) == Dispatch::NoRoom {
                    if let Some(t) = self.topics.get_mut(&h) {
                        t.ahead.insert((due, key), msg);
                    }
                    break;
                }
            }
        }
    }

    /// Whether a waiting recipient of one of the topic's entries has room now (then
    /// [`Hub::drain_waiting`] has work). Recipients that are full do not count: a topic whose
    /// waiting entries are all for a slow recipient must not keep the dispatcher awake.
    pub(super) fn waiting_deliverable(&self, t: &Topic) -> bool {
        if t.waiting.is_empty() {
            return false;
        }
        let free: Vec<RecipientId> = t
            .recipients()
            .filter(|r| self.recipient_free(t, r) > 0)
            .collect();
        !free.is_empty()
            && t.waiting.iter().any(|k| {
                self.entries.get(k).is_some_and(|e| {
                    e.recipients
                        .iter()
                        .any(|r| r.state == RState::Waiting && free.contains(&r.id))
                })
            })
    }

    pub(super) fn waiting_servable(&self, t: &Topic) -> bool {
        let room = |c: &ConsumerId| self.consumers.get(c).is_some_and(Consumer::has_room);
        t.universal.iter().any(room) || t.groups.values().any(|g| g.members.iter().any(room))
    }

    /// Starts a delete flush: the keys to delete now, if any and none is running.
    pub fn take_delete_batch(&mut self) -> Option<Vec<EventKey>> {
        self.deletes.take_batch()
    }

    /// Ends the running delete flush.
    pub fn finish_delete_batch(&mut self, committed: bool) {
        self.deletes.finish_batch(committed);
    }
}
