//! Delivering an entry: which consumer of a recipient takes it, and how much room a topic
//! and its recipients have.

use super::*;

impl<S: Sink> Hub<S> {
    /// Picks the consumer for a recipient: a universal consumer itself, or the next group
    /// member (round-robin) with room.
    pub(super) fn pick(
        topics: &mut FastMap<TopicHash, Topic>,
        consumers: &FastMap<ConsumerId, Consumer<S>>,
        h: TopicHash,
        rid: &RecipientId,
    ) -> Option<ConsumerId> {
        match rid {
            RecipientId::Universal(c) => consumers.get(c).filter(|c| c.has_room()).map(|_| *c),
            RecipientId::Group(name) => {
                let g = topics.get_mut(&h)?.groups.get_mut(name)?;
                let n = g.members.len();
                for i in 0..n {
                    let m = g.members[(g.next + i) % n];
                    if consumers.get(&m).is_some_and(Consumer::has_room) {
                        g.next = (g.next + i + 1) % n;
                        return Some(m);
                    }
                }
                None
            }
        }
    }

    /// Sends recipient `ri` of `key`'s entry if a consumer has room; true when sent. A
    /// recipient that had its attempts gives up instead (see the module docs).
    pub(super) fn try_deliver(&mut self, key: EventKey, ri: usize, now_ms: i64) -> bool {
        let h = key.topic_hash();
        let Some(e) = self.entries.get_mut(&key) else {
            return false;
        };
        let limit = attempt_limit(&self.cfg, &e.message);
        if limit > 0 && e.recipients[ri].attempts >= limit {
            let r = &mut e.recipients[ri];
            r.state = RState::DeadLettering;
            self.dead_letters.push(DeadLetter {
                key,
                recipient: r.id.clone(),
            });
            return false;
        }
        let Some(cid) = Self::pick(&mut self.topics, &self.consumers, h, &e.recipients[ri].id)
        else {
            return false;
        };
        let c = self
            .consumers
            .get_mut(&cid)
            .expect("picked consumer exists");
        let r = &mut e.recipients[ri];
        let d = Delivery {
            key,
            message: Arc::clone(&e.message),
            attempt: r.attempts + 1,
        };
        if !c.sink.try_send(d) {
            return false;
        }
        r.attempts += 1;
        let deadline_ms = now_ms.saturating_add(self.cfg.in_flight_timeout_ms);
        r.state = RState::Pending {
            consumer: cid,
            deadline_ms,
        };
        c.in_flight.insert(key);
        debug_assert!(
            c.in_flight.len() <= c.max_in_flight as usize,
            "a consumer holds at most max_in_flight deliveries"
        );
        self.timeouts.insert(deadline_ms, (key, cid));
        self.counters.dispatched += 1;
        if r.attempts > 1 {
            self.counters.redelivered += 1;
        }
        true
    }

    /// Retries every waiting recipient that can be served now; expired messages are deleted.
    pub fn drain_waiting(&mut self, now_ms: i64) {
        let hashes: Vec<TopicHash> = self
            .topics
            .iter()
            .filter(|(_, t)| !t.waiting.is_empty())
            .map(|(h, _)| *h)
            .collect();
        for h in hashes {
            let queue = std::mem::take(&mut self.topics.get_mut(&h).expect("listed").waiting);
            let mut keep = VecDeque::new();
            let mut seen = HashSet::new();
            for key in queue {
                if !seen.insert(key) {
                    continue;
                }
                let Some(e) = self.entries.get(&key) else {
                    continue;
                };
                if e.message.is_expired(now_ms) {
                    self.expire_entry(key);
                    continue;
                }
                let waiting: Vec<usize> = e
                    .recipients
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.state == RState::Waiting)
                    .map(|(i, _)| i)
                    .collect();
                let mut left = false;
                for ri in waiting {
                    if !self.try_deliver(key, ri, now_ms) {
                        let t = &self.topics[&h];
                        // A group without members is pushed again when one registers.
                        left |= self.entries[&key]
                            .recipients
                            .get(ri)
                            .is_some_and(|r| t.present(&r.id));
                    }
                }
                if left {
                    keep.push_back(key);
                }
            }
            if let Some(t) = self.topics.get_mut(&h) {
                keep.extend(t.waiting.drain(..));
                t.waiting = keep;
            }
        }
    }

    pub(super) fn expire_entry(&mut self, key: EventKey) {
        self.attempts_kept.remove(&key);
        if let Some(e) = self.entries.remove(&key) {
            self.drop_entry_tracking(key, &e);
        }
        self.unpark(key);
        if self.deletes.push(key).is_ok() {
            self.counters.expired += 1;
        }
    }

    pub(super) fn topic_has_room(&self, t: &Topic) -> bool {
        self.topic_room(t) > 0
    }

    /// How many new messages the topic's recipients could take now: the best recipient's free
    /// in-flight budget, within the topic's entry cap.
    pub(super) fn topic_room(&self, t: &Topic) -> usize {
        self.best_free(t).min(self.cap_room(t))
    }

    /// The free in-flight budget of the topic's best recipient.
    pub(super) fn best_free(&self, t: &Topic) -> usize {
        t.recipients()
            .map(|r| self.recipient_free(t, &r))
            .max()
            .unwrap_or(0)
    }

    /// A recipient's free in-flight budget (a group's is its members' sum; 0 when away).
    pub(super) fn recipient_free(&self, t: &Topic, r: &RecipientId) -> usize {
        let free = |c: &ConsumerId| self.consumers.get(c).map_or(0, Consumer::free);
        match r {
            RecipientId::Universal(c) => free(c),
            RecipientId::Group(g) => t
                .groups
                .get(g)
                .map_or(0, |g| g.members.iter().map(free).sum()),
        }
    }

    /// How many more entries (in memory or read ahead) the topic's entry cap allows.
    pub(super) fn cap_room(&self, t: &Topic) -> usize {
        Self::entry_cap(t.capacity).saturating_sub(t.entries + t.ahead.len())
    }
}
