//! Who receives: consumers and groups subscribing, leaving and being deleted, and the
//! parked messages their departures settle.

use super::*;

impl<S: Sink> Hub<S> {
    /// Adds a consumer; its topic is scanned from the start at the next pass.
    pub fn register(&mut self, sub: &Subscription, sink: S, now_ms: i64) -> ConsumerId {
        let id = ConsumerId(self.next_consumer);
        self.next_consumer += 1;
        let h = topic_hash(&sub.topic);
        let t = self
            .topics
            .entry(h)
            .or_insert_with(|| Topic::new(h, now_ms));
        let start = EventKey::topic_start(h);
        if sub.group.is_empty() {
            t.universal.push(id);
            // A new recipient wants every stored message: those in memory now, and those the
            // head scan passed.
            let rid = RecipientId::Universal(id);
            Self::join_entries(&mut self.entries, t, h, &rid);
            t.fell_behind(rid, start);
        } else {
            let name: Arc<str> = sub.group.as_str().into();
            let rid = RecipientId::Group(Arc::clone(&name));
            let known = t.groups.contains_key(&name);
            if !known {
                // New to the topic: it joins the entries in memory (as waiting).
                Self::join_entries(&mut self.entries, t, h, &rid);
            }
            let g = t.groups.entry(name).or_default();
            g.members.push(id);
            if g.members.len() == 1 {
                // The group was away (or is new): its waiting deliveries in memory can go out
                // now, and it catches up on what the head scan passed meanwhile.
                // (A new group's waiting entries were queued as it joined them.)
                if known {
                    for (k, e) in &self.entries {
                        if k.topic_hash() == h
                            && e.recipients
                                .iter()
                                .any(|r| r.id == rid && r.state == RState::Waiting)
                        {
                            t.waiting.push_back(*k);
                        }
                    }
                }
                t.fell_behind(rid, start);
            }
        }
        let max = sub.max_in_flight.max(1);
        t.capacity += max as usize;
        t.next_scan_ms = Some(now_ms);
        self.consumers.insert(
            id,
            Consumer {
                topic_hash: h,
                topic: Arc::from(sub.topic.as_str()),
                group: sub.group.clone(),
                max_in_flight: max,
                in_flight: FastSet::default(),
                sink,
            },
        );
        id
    }

    /// Removes a consumer. Its in-flight deliveries become due again at once (to its group's
    /// other members); a universal consumer that is gone is dropped from entries, a group
    /// without members stays a recipient (its messages wait for it).
    pub fn unregister(&mut self, id: ConsumerId, now_ms: i64) {
        let _ = self.remove_consumer(id, now_ms);
    }

    /// [`Hub::unregister`], handing back the consumer's sink.
    pub(super) fn remove_consumer(&mut self, id: ConsumerId, now_ms: i64) -> Option<S> {
        let c = self.consumers.remove(&id)?;
        let h = c.topic_hash;
        let Some(t) = self.topics.get_mut(&h) else {
            return Some(c.sink);
        };
        t.capacity -= c.max_in_flight as usize;
        let mut was_behind = false;
        let gone = if c.group.is_empty() {
            t.universal.retain(|u| *u != id);
            was_behind = t.lag.remove(&RecipientId::Universal(id)).is_some();
            Some(RecipientId::Universal(id))
        } else {
            if let Some(g) = t.groups.get_mut(c.group.as_str()) {
                g.members.retain(|m| *m != id);
                if g.members.is_empty() {
                    // It catches up from the topic's start when a member comes back.
                    t.lag.remove(&RecipientId::Group(c.group.as_str().into()));
                }
            }
            None
        };
        for key in c.in_flight {
            let Some(e) = self.entries.get_mut(&key) else {
                continue;
            };
            for r in &mut e.recipients {
                if let RState::Pending {
                    consumer,
                    deadline_ms,
                } = r.state
                {
                    if consumer == id {
                        self.timeouts.remove(deadline_ms, (key, id));
                        if gone.is_some() {
                            r.state = RState::Dropped;
                        } else {
                            r.state = RState::Waiting;
                            t.waiting.push_back(key);
                        }
                    }
                }
            }
        }
        if let Some(gone) = &gone {
            for key in &t.waiting {
                if let Some(e) = self.entries.get_mut(key) {
                    for r in &mut e.recipients {
                        if r.id == *gone && r.state == RState::Waiting {
                            r.state = RState::Dropped;
                        }
                    }
                }
            }
        }
        let keys: Vec<EventKey> = self
            .entries
            .iter()
            .filter(|(k, _)| k.topic_hash() == h)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let (Some(gone), Some(e)) = (&gone, self.entries.get_mut(&k)) {
                // A universal consumer that gave up and went: its dead letter's outcome no
                // longer matters to the entry.
                for r in &mut e.recipients {
                    if r.id == *gone && r.state == RState::DeadLettering {
                        r.state = RState::Dropped;
                    }
                }
            }
            self.finish_if_done(k, now_ms);
        }
        self.recipient_left(h, was_behind);
        Some(c.sink)
    }

    /// After a recipient of topic `h` left: parked messages it was still owed (`owed`) may
    /// now be acked by every recipient left; a topic with no recipient left is forgotten.
    pub(super) fn recipient_left(&mut self, h: TopicHash, owed: bool) {
        let last = self
            .topics
            .get(&h)
            .is_some_and(|t| t.groups.is_empty() && t.universal.is_empty());
        if owed || last {
            self.settle_parked(h, last);
        }
        if last {
            if let Some(t) = self.topics.remove(&h) {
                debug_assert_eq!(
                    t.entries, 0,
                    "every entry ends when its topic has no recipients"
                );
                debug_assert!(
                    t.parked.is_empty(),
                    "settled: no recipient left to wait for"
                );
                self.parked -= t.parked.len();
            }
        }
    }

    /// Deletes consumer group `group` of `topic` (its registration is gone): its members are
    /// removed, their sinks handed back so the caller can end their streams (a member's
    /// in-flight deliveries end, its later ACKs are ignored); it is no recipient of the
    /// topic's messages any more, its ACKs no longer count, and what only it still needed
    /// (every other recipient acked it) goes to the delete queue. What nobody acked stays
    /// stored. A group this hub does not know: nothing to do.
    pub fn forget_group(&mut self, topic: &str, group: &str, now_ms: i64) -> Vec<S> {
        let h = topic_hash(topic);
        let members = self
            .topics
            .get(&h)
            .and_then(|t| t.groups.get(group))
            .map(|g| g.members.clone())
            .unwrap_or_default();
        // Their deliveries in flight become waiting for the group, which then goes.
        let sinks = members
            .into_iter()
            .filter_map(|m| self.remove_consumer(m, now_ms))
            .collect();
        let Some(t) = self.topics.get_mut(&h) else {
            return sinks;
        };
        if t.groups.remove(group).is_none() {
            return sinks;
        }
        let rid = RecipientId::Group(group.into());
        t.lag.remove(&rid);
        let mut unacked = Vec::new();
        for (k, acked) in &mut t.parked {
            acked.retain(|r| *r != rid);
            if acked.is_empty() {
                unacked.push(*k);
            }
        }
        // Nobody else acked them: no record to keep (the recipients still owed them get them
        // from storage, as before).
        for k in unacked {
            t.parked.remove(&k);
            self.parked -= 1;
        }
        // Its give-ups not yet taken by the dispatcher are void (those taken end as they will).
        self.dead_letters
            .retain(|dl| dl.recipient != rid || dl.key.topic_hash() != h);
        self.attempts_kept.retain(|k, kept| {
            if k.topic_hash() == h {
                kept.retain(|(r, _)| *r != rid);
            }
            !kept.is_empty()
        });
        let keys: Vec<EventKey> = self
            .entries
            .iter_mut()
            .filter(|(k, _)| k.topic_hash() == h)
            .map(|(k, e)| {
                debug_assert!(
                    e.recipients
                        .iter()
                        .all(|r| r.id != rid || !matches!(r.state, RState::Pending { .. })),
                    "a group without members has nothing in flight"
                );
                e.recipients.retain(|r| r.id != rid);
                *k
            })
            .collect();
        for k in keys {
            self.finish_if_done(k, now_ms);
        }
        self.recipient_left(h, true);
        sinks
    }

    /// Per topic (or only `only`), the consumer groups this hub knows: their members, their
    /// deliveries in flight, and the stored messages they are done with. O(groups + entries
    /// in memory + parked records + pending deletes).
    #[must_use]
    pub fn groups(
        &self,
        only: Option<TopicHash>,
    ) -> HashMap<TopicHash, BTreeMap<String, GroupActivity>> {
        let wanted = |h: &TopicHash| only.is_none_or(|o| o == *h);
        let mut out: HashMap<TopicHash, BTreeMap<String, GroupActivity>> = HashMap::new();
        for (h, t) in self.topics.iter().filter(|(h, _)| wanted(h)) {
            let gs = out.entry(*h).or_default();
            for (name, g) in &t.groups {
                let in_flight = g
                    .members
                    .iter()
                    .filter_map(|m| self.consumers.get(m))
                    .map(|c| c.in_flight.len() as u64)
                    .sum();
                gs.insert(
                    name.to_string(),
                    GroupActivity {
                        consumers: u32::try_from(g.members.len()).unwrap_or(u32::MAX),
                        in_flight,
                        done: 0,
                    },
                );
            }
            for r in t.parked.values().flatten() {
                count_done(gs, r);
            }
        }
        for (k, e) in self.entries.iter().filter(|(k, _)| wanted(&k.topic_hash())) {
            let Some(gs) = out.get_mut(&k.topic_hash()) else {
                continue;
            };
            for r in e.recipients.iter().filter(|r| r.state == RState::Acked) {
                count_done(gs, &r.id);
            }
        }
        // Queued deletes: done for everyone.
        for k in self.deletes.keys().filter(|k| wanted(&k.topic_hash())) {
            if let Some(gs) = out.get_mut(&k.topic_hash()) {
                for g in gs.values_mut() {
                    g.done += 1;
                }
            }
        }
        out
    }

    /// Deletes the parked messages of topic `h` that no recipient still needs: all of them
    /// (`all`: the topic is about to be forgotten), or as many as keep the delete queue within
    /// [`SETTLE_DELETES_MAX`] — the rest on later passes ([`Hub::scans_due`]), so that a
    /// recipient leaving a large backlog (a deleted group) does not fill the queue and make
    /// every ACK meanwhile refused.
    pub(super) fn settle_parked(&mut self, h: TopicHash, all: bool) {
        let room = if all {
            usize::MAX
        } else {
            SETTLE_DELETES_MAX.saturating_sub(self.deletes.len())
        };
        let Some(t) = self.topics.get_mut(&h) else {
            return;
        };
        let recipients: Vec<RecipientId> = t.recipients().collect();
        let mut done = t
            .parked
            .iter()
            .filter(|(_, acked)| recipients.iter().all(|r| acked.contains(r)))
            .map(|(k, _)| *k);
        let now: Vec<EventKey> = done.by_ref().take(room).collect();
        t.unsettled = done.next().is_some();
        for key in now {
            self.deletes.push_accepted(key);
            self.unpark(key);
        }
    }
}
