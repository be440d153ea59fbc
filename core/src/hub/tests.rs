use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::key::{Bucket, EventId};

/// A sink that records deliveries; `open = false` simulates a gone consumer.
#[derive(Clone, Default)]
struct MemSink {
    got: Rc<RefCell<Vec<Delivery>>>,
    open: Rc<RefCell<bool>>,
}

impl MemSink {
    fn new() -> Self {
        let s = MemSink::default();
        *s.open.borrow_mut() = true;
        s
    }
    fn take(&self) -> Vec<Delivery> {
        std::mem::take(&mut self.got.borrow_mut())
    }
}

impl Sink for MemSink {
    fn try_send(&self, d: Delivery) -> bool {
        if *self.open.borrow() {
            self.got.borrow_mut().push(d);
        }
        *self.open.borrow()
    }

    fn room(&self) -> usize {
        if *self.open.borrow() {
            usize::MAX
        } else {
            0
        }
    }
}

const CFG: HubConfig = HubConfig {
    in_flight_timeout_ms: 1000,
    bucket_ms: 1,
    scan_limit: 7,
    lookahead_ms: 0,
    max_attempts: 0,
};

fn msg(topic: &str, enq: i64, delay: i64, ttl: i64) -> Arc<StoredMessage> {
    Arc::new(StoredMessage {
        topic: topic.into(),
        payload: Bytes::from_static(b"x"),
        enqueued_at_ms: enq,
        delay: crate::DelayMs(delay),
        ttl: crate::TtlMs(ttl),
        indexes: vec![],
        extras: Default::default(),
    })
}

fn key(topic: &str, due: i64, id: u64) -> EventKey {
    EventKey::new(topic_hash(topic), bucket_of(due, 1), EventId(id))
}

fn sub(topic: &str, group: &str, max: u32) -> Subscription {
    Subscription {
        topic: topic.into(),
        group: group.into(),
        max_in_flight: max,
    }
}

/// A tiny in-memory store that answers scans like the real one.
#[derive(Default)]
struct Store(BTreeMap<EventKey, Arc<StoredMessage>>);

impl Store {
    fn put(&mut self, id: u64, m: Arc<StoredMessage>) -> EventKey {
        let k = key(&m.topic, m.due_at_ms(), id);
        self.0.insert(k, m);
        k
    }
    fn scan(&self, r: &ScanRequest) -> ScanResult {
        let mut items: Vec<_> = self
            .0
            .range(r.from..r.upper)
            .take(r.limit + 1)
            .map(|(k, m)| (*k, m.clone()))
            .collect();
        let exhausted = items.len() <= r.limit;
        items.truncate(r.limit);
        let end = EventKey::topic_start(TopicHash(r.topic_hash.0.wrapping_add(1)));
        let next_key = self.0.range(r.upper..).next().map(|(k, _)| *k).filter(|k| {
            k.topic_hash() == r.topic_hash && (r.topic_hash == TopicHash(u64::MAX) || *k < end)
        });
        ScanResult {
            items,
            exhausted,
            next_key,
        }
    }
}

/// Runs the dispatcher's pass at `now`: timeouts, waiting recipients, then due scans.
fn pass(hub: &mut Hub<MemSink>, store: &mut Store, now: i64) {
    hub.expire_in_flight(now);
    hub.drain_waiting(now);
    hub.deliver_read_ahead(now);
    for _ in 0..100 {
        let reqs = hub.scans_due(now);
        if reqs.is_empty() {
            break;
        }
        for r in reqs {
            let res = store.scan(&r);
            hub.apply_scan(&r, res, now);
        }
    }
    if let Some(keys) = hub.take_delete_batch() {
        for k in &keys {
            store.0.remove(k);
        }
        hub.finish_delete_batch(true);
    }
}

#[test]
fn delivers_only_when_due_and_wakes_at_due_time() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 10), s.clone(), 1000);
    store.put(1, msg("t", 1000, 500, 0));
    pass(&mut hub, &mut store, 1000);
    assert!(s.take().is_empty());
    assert_eq!(hub.next_wakeup(1000), Some(1500));
    pass(&mut hub, &mut store, 1499);
    assert!(s.take().is_empty());
    pass(&mut hub, &mut store, 1500);
    let got = s.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].attempt, 1);
}

#[test]
fn coarse_bucket_never_delivers_early() {
    let mut hub = Hub::new(HubConfig {
        bucket_ms: 1000,
        ..CFG
    });
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 10), s.clone(), 0);
    let m = msg("t", 1000, 700, 0);
    store
        .0
        .insert(EventKey::new(topic_hash("t"), Bucket(1), EventId(1)), m);
    pass(&mut hub, &mut store, 1200);
    assert!(
        s.take().is_empty(),
        "bucket 1 is due at 1000 but the message at 1700"
    );
    assert_eq!(hub.next_wakeup(1200), Some(1700));
    pass(&mut hub, &mut store, 1700);
    assert_eq!(s.take().len(), 1);
}

#[test]
fn groups_compete_and_universals_each_get_everything() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (a1, a2, b, u1, u2) = (
        MemSink::new(),
        MemSink::new(),
        MemSink::new(),
        MemSink::new(),
        MemSink::new(),
    );
    hub.register(&sub("t", "a", 100), a1.clone(), 0);
    hub.register(&sub("t", "a", 100), a2.clone(), 0);
    hub.register(&sub("t", "b", 100), b.clone(), 0);
    hub.register(&sub("t", "", 100), u1.clone(), 0);
    hub.register(&sub("t", "", 100), u2.clone(), 0);
    for i in 0..10 {
        store.put(i + 1, msg("t", 0, 0, 0));
    }
    pass(&mut hub, &mut store, 10);
    let activity = hub.topic_activity();
    let t = &activity[&topic_hash("t")];
    assert_eq!((&*t.topic, t.consumers, t.in_flight), ("t", 5, 40));
    assert_eq!(a1.take().len(), 5, "round-robin within a group");
    assert_eq!(a2.take().len(), 5);
    assert_eq!(b.take().len(), 10);
    assert_eq!(u1.take().len(), 10);
    assert_eq!(u2.take().len(), 10);
}

#[test]
fn other_topics_are_not_delivered() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 10), s.clone(), 0);
    store.put(1, msg("other", 0, 0, 0));
    pass(&mut hub, &mut store, 10);
    assert!(s.take().is_empty());
}

#[test]
fn full_consumer_is_skipped_without_blocking_others() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (slow, fast) = (MemSink::new(), MemSink::new());
    let slow_id = hub.register(&sub("t", "g", 2), slow.clone(), 0);
    let fast_id = hub.register(&sub("t", "g", 100), fast.clone(), 0);
    for i in 0..20 {
        store.put(i + 1, msg("t", 0, 0, 0));
    }
    pass(&mut hub, &mut store, 1);
    let s = slow.take();
    let f = fast.take();
    assert_eq!(s.len(), 2, "bounded by max_in_flight");
    assert_eq!(f.len(), 18);
    // Acks free room; nothing is delivered twice.
    for d in &f {
        assert_eq!(hub.ack(fast_id, d.key, true, 2), AckOutcome::Acked);
    }
    pass(&mut hub, &mut store, 3);
    assert!(slow.take().is_empty() && fast.take().is_empty());
    assert_eq!(hub.ack(slow_id, s[0].key, true, 4), AckOutcome::Acked);
    pass(&mut hub, &mut store, 5);
    assert_eq!(store.0.len(), 1, "acked messages are deleted");
}

#[test]
fn nack_timeout_and_disconnect_redeliver() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (a, b) = (MemSink::new(), MemSink::new());
    let ida = hub.register(&sub("t", "g", 1), a.clone(), 0);
    store.put(1, msg("t", 0, 0, 0));
    pass(&mut hub, &mut store, 1);
    let d = a.take().pop().unwrap();
    // NACK: due again at once, attempt + 1.
    assert_eq!(hub.ack(ida, d.key, false, 2), AckOutcome::Nacked);
    pass(&mut hub, &mut store, 2);
    let d2 = a.take().pop().unwrap();
    assert_eq!((d2.key, d2.attempt), (d.key, 2));
    // Timeout after in_flight_timeout_ms.
    pass(&mut hub, &mut store, 2 + 999);
    assert!(a.take().is_empty());
    assert_eq!(hub.next_wakeup(1001), Some(1002));
    pass(&mut hub, &mut store, 1002);
    assert_eq!(a.take().pop().unwrap().attempt, 3);
    // Disconnect: the other member gets it at once.
    let idb = hub.register(&sub("t", "g", 1), b.clone(), 1003);
    hub.unregister(ida, 1003);
    pass(&mut hub, &mut store, 1003);
    let d4 = b.take().pop().unwrap();
    assert_eq!((d4.key, d4.attempt), (d.key, 4));
    assert_eq!(hub.ack(idb, d4.key, true, 1004), AckOutcome::Acked);
    pass(&mut hub, &mut store, 1005);
    assert!(store.0.is_empty());
    assert_eq!(hub.counters().timeouts, 1);
}

/// A message with these extras.
fn msg_with(topic: &str, extras: crate::Extras) -> Arc<StoredMessage> {
    let mut m = (*msg(topic, 0, 0, 0)).clone();
    m.extras = extras;
    Arc::new(m)
}

/// Delivers `key` to the consumer behind `sink` and NACKs it, `n` times; the attempts seen.
fn nack_times(
    hub: &mut Hub<MemSink>,
    store: &mut Store,
    id: ConsumerId,
    sink: &MemSink,
    n: usize,
    now: &mut i64,
) -> Vec<u32> {
    let mut seen = Vec::new();
    for _ in 0..n {
        pass(hub, store, *now);
        *now += 1;
        for d in sink.take() {
            seen.push(d.attempt);
            hub.ack(id, d.key, false, *now);
        }
    }
    seen
}

/// A recipient that got a message `max_attempts` times without acking it gives up: one dead
/// letter; once committed the entry ends and the key is deleted (as if acked); a failed
/// command makes it give up again.
#[test]
fn a_recipient_gives_up_after_its_attempts() {
    let mut hub = Hub::new(HubConfig {
        max_attempts: 2,
        ..CFG
    });
    let mut store = Store::default();
    let s = MemSink::new();
    let id = hub.register(&sub("t", "", 10), s.clone(), 0);
    let k = store.put(1, msg("t", 0, 0, 0));
    let mut now = 1;
    assert_eq!(
        nack_times(&mut hub, &mut store, id, &s, 3, &mut now),
        vec![1, 2]
    );
    let dl = hub.take_dead_letters();
    assert_eq!(dl.len(), 1);
    assert_eq!((dl[0].key, dl[0].group()), (k, ""));
    assert!(hub.take_dead_letters().is_empty());
    // The command failed: it gives up again at its next turn (no delivery).
    hub.dead_lettered(&dl[0], false, now);
    pass(&mut hub, &mut store, now);
    assert!(s.take().is_empty());
    let again = hub.take_dead_letters();
    assert_eq!(again, dl);
    hub.dead_lettered(&again[0], true, now);
    pass(&mut hub, &mut store, now + 1);
    assert!(store.0.is_empty(), "done: the key is deleted");
    assert!(s.take().is_empty());
    assert_eq!(hub.in_flight(), 0);
}

/// Per group: the group that gives up is the dead letter's origin; a group still owed the
/// message keeps it, and it is deleted once every group is done.
#[test]
fn dead_letters_are_per_group() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (a, b) = (MemSink::new(), MemSink::new());
    let ida = hub.register(&sub("t", "a", 10), a.clone(), 0);
    let idb = hub.register(&sub("t", "b", 10), b.clone(), 0);
    let extras = crate::Extras {
        max_attempts: 1,
        ..crate::Extras::default()
    };
    let k = store.put(1, msg_with("t", extras));
    pass(&mut hub, &mut store, 1);
    let (da, db) = (a.take(), b.take());
    assert_eq!((da.len(), db.len()), (1, 1));
    hub.ack(idb, k, false, 2);
    pass(&mut hub, &mut store, 2);
    let dl = hub.take_dead_letters();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].group(), "b");
    hub.dead_lettered(&dl[0], true, 3);
    assert!(b.take().is_empty());
    assert_eq!(hub.ack(ida, k, true, 4), AckOutcome::Acked);
    pass(&mut hub, &mut store, 5);
    assert!(store.0.is_empty(), "deleted once every group is done");
    assert!(hub.take_dead_letters().is_empty());
}

/// A recipient that joins while another's dead letter is in flight still gets the message:
/// the dead letter never deletes it (the done mark does, once nobody needs it).
#[test]
fn a_recipient_joining_during_a_dead_letter_still_gets_the_message() {
    let mut hub = Hub::new(HubConfig {
        max_attempts: 1,
        ..CFG
    });
    let mut store = Store::default();
    let a = MemSink::new();
    let ida = hub.register(&sub("t", "a", 10), a.clone(), 0);
    let k = store.put(1, msg("t", 0, 0, 0));
    pass(&mut hub, &mut store, 1);
    assert_eq!(a.take().len(), 1);
    hub.ack(ida, k, false, 2);
    pass(&mut hub, &mut store, 2);
    let dl = hub.take_dead_letters();
    assert_eq!(dl.len(), 1);
    let b = MemSink::new();
    let idb = hub.register(&sub("t", "b", 10), b.clone(), 3);
    hub.dead_lettered(&dl[0], true, 3);
    pass(&mut hub, &mut store, 4);
    let got = b.take();
    assert_eq!(got.len(), 1, "the newcomer gets it");
    hub.ack(idb, k, true, 5);
    pass(&mut hub, &mut store, 6);
    assert!(store.0.is_empty());
}

/// A group member that goes away with the message in flight (a consumer that crashes on it)
/// spends an attempt: the attempts go on from there on the next member, though the entry left
/// memory in between, and the group gives up at its limit.
#[test]
fn attempts_survive_the_entry_leaving_memory() {
    let mut hub = Hub::new(HubConfig {
        max_attempts: 3,
        ..CFG
    });
    let mut store = Store::default();
    let k = store.put(1, msg("t", 0, 0, 0));
    for attempt in 1..=3 {
        let s = MemSink::new();
        let id = hub.register(&sub("t", "g", 10), s.clone(), i64::from(attempt));
        pass(&mut hub, &mut store, i64::from(attempt));
        let d = s.take().pop().expect("delivered");
        assert_eq!((d.key, d.attempt), (k, attempt));
        hub.unregister(id, i64::from(attempt));
    }
    let s = MemSink::new();
    hub.register(&sub("t", "g", 10), s.clone(), 10);
    pass(&mut hub, &mut store, 10);
    assert!(s.take().is_empty(), "no fourth attempt");
    assert_eq!(hub.take_dead_letters().len(), 1);
}

/// A dead-lettered copy is never dead-lettered again, whatever the limits; a universal
/// consumer that goes away while its dead letter is in flight leaves nothing behind.
#[test]
fn dead_letter_copies_never_loop_and_a_gone_consumer_leaves_nothing() {
    let mut hub = Hub::new(HubConfig {
        max_attempts: 1,
        ..CFG
    });
    let mut store = Store::default();
    let s = MemSink::new();
    let id = hub.register(&sub("t.dlq", "", 10), s.clone(), 0);
    store.put(
        1,
        msg_with(
            "t.dlq",
            crate::Extras {
                origin_topic: "t".into(),
                max_attempts: 1,
                ..crate::Extras::default()
            },
        ),
    );
    let mut now = 1;
    assert_eq!(
        nack_times(&mut hub, &mut store, id, &s, 4, &mut now),
        vec![1, 2, 3, 4]
    );
    assert!(hub.take_dead_letters().is_empty());
    hub.unregister(id, now);

    let u = MemSink::new();
    let idu = hub.register(&sub("u", "", 10), u.clone(), now);
    store.put(2, msg("u", 0, 0, 0));
    assert_eq!(
        nack_times(&mut hub, &mut store, idu, &u, 2, &mut now),
        vec![1]
    );
    let dl = hub.take_dead_letters();
    assert_eq!(dl.len(), 1);
    hub.unregister(idu, now);
    hub.dead_lettered(&dl[0], true, now);
    assert_eq!(hub.in_flight(), 0);
}

#[test]
fn acks_for_foreign_or_repeated_tags_are_ignored() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (a, b) = (MemSink::new(), MemSink::new());
    let ida = hub.register(&sub("t", "", 5), a.clone(), 0);
    let idb = hub.register(&sub("t", "x", 5), b.clone(), 0);
    let k = store.put(1, msg("t", 0, 0, 0));
    let never_sent = key("t", 0, 99);
    pass(&mut hub, &mut store, 1);
    assert_eq!(hub.ack(ida, never_sent, true, 1), AckOutcome::Ignored);
    assert_eq!(hub.ack(ConsumerId(999), k, true, 1), AckOutcome::Ignored);
    assert_eq!(hub.ack(ida, k, true, 1), AckOutcome::Acked);
    assert_eq!(hub.ack(ida, k, true, 1), AckOutcome::Ignored, "duplicate");
    pass(&mut hub, &mut store, 2);
    assert_eq!(store.0.len(), 1, "group x has not acked yet");
    assert_eq!(hub.ack(idb, k, true, 3), AckOutcome::Acked);
    pass(&mut hub, &mut store, 4);
    assert!(store.0.is_empty());
}

#[test]
fn expired_messages_are_never_delivered_and_get_deleted() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 5), s.clone(), 0);
    store.put(1, msg("t", 0, 100, 50));
    pass(&mut hub, &mut store, 100);
    assert!(s.take().is_empty());
    assert!(store.0.is_empty());
    assert_eq!(hub.counters().expired, 1);
}

#[test]
fn released_message_waits_for_the_next_subscriber() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let a = MemSink::new();
    let ida = hub.register(&sub("t", "g", 5), a.clone(), 0);
    store.put(1, msg("t", 0, 0, 0));
    pass(&mut hub, &mut store, 1);
    assert_eq!(a.take().len(), 1);
    hub.unregister(ida, 2);
    assert_eq!(store.0.len(), 1);
    let b = MemSink::new();
    hub.register(&sub("t", "g", 5), b.clone(), 3);
    pass(&mut hub, &mut store, 3);
    assert_eq!(b.take().len(), 1);
}

/// Issue 10.5: a group whose last member left still gets every message stored while it was
/// away — also one it had in flight — however fast another group acks; and the away group
/// never holds the topic's scan for the others.
#[test]
fn a_group_that_comes_back_gets_everything_it_missed() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (a, b) = (MemSink::new(), MemSink::new());
    let ida = hub.register(&sub("t", "a", 100), a.clone(), 0);
    let idb = hub.register(&sub("t", "b", 100), b.clone(), 0);
    let first = store.put(1, msg("t", 0, 0, 0));
    pass(&mut hub, &mut store, 1);
    assert_eq!(b.take().len(), 1, "b has the first one in flight");
    hub.unregister(idb, 2);
    for id in 2..=50 {
        let k = store.put(id, msg("t", 2, 0, 0));
        hub.on_published(k);
    }
    // Group a takes and acks everything, several passes over the backlog.
    for now in 3..10 {
        pass(&mut hub, &mut store, now);
        for d in a.take() {
            assert_eq!(hub.ack(ida, d.key, true, now), AckOutcome::Acked);
        }
    }
    assert_eq!(store.0.len(), 50, "nothing deleted while group b is away");
    assert_eq!(hub.parked(), 50);
    assert!(hub.entries.is_empty(), "parked messages leave memory");
    // b comes back: it gets all 50, a gets nothing again; then everything is deleted.
    let b2 = MemSink::new();
    let idb2 = hub.register(&sub("t", "b", 100), b2.clone(), 10);
    pass(&mut hub, &mut store, 10);
    let got = b2.take();
    assert_eq!(got.len(), 50);
    assert!(got.iter().any(|d| d.key == first));
    assert!(a.take().is_empty(), "a already acked them");
    for d in got {
        hub.ack(idb2, d.key, true, 11);
    }
    pass(&mut hub, &mut store, 12);
    assert!(store.0.is_empty());
    assert_eq!(hub.parked(), 0);
}

/// Known groups from the durable registry (after a restart or failover) are recipients
/// before they reconnect.
#[test]
fn groups_from_the_registry_hold_messages_until_they_ack() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    hub.add_known_groups("t", ["late".to_owned()], 0);
    let a = MemSink::new();
    let ida = hub.register(&sub("t", "a", 10), a.clone(), 0);
    let k = store.put(1, msg("t", 0, 0, 0));
    hub.on_published(k);
    pass(&mut hub, &mut store, 1);
    let d = a.take().pop().unwrap();
    hub.ack(ida, d.key, true, 2);
    pass(&mut hub, &mut store, 3);
    assert_eq!(store.0.len(), 1, "group late has not had it");
    let l = MemSink::new();
    hub.register(&sub("t", "late", 10), l.clone(), 4);
    pass(&mut hub, &mut store, 4);
    assert_eq!(l.take().len(), 1);
}

/// Issue 26 (group lifecycle): a deleted group that never came back no longer holds the
/// messages every other group acked; `groups` counts what each group is done with.
#[test]
fn a_deleted_group_releases_what_only_it_needed() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    hub.add_known_groups("t", ["gone".to_owned()], 0);
    let a = MemSink::new();
    let ida = hub.register(&sub("t", "a", 10), a.clone(), 0);
    for i in 1..=3 {
        let k = store.put(i, msg("t", 0, 0, 0));
        hub.on_published(k);
    }
    pass(&mut hub, &mut store, 1);
    let got = a.take();
    assert_eq!(got.len(), 3);
    hub.ack(ida, got[0].key, true, 2);
    let h = topic_hash("t");
    let gs = &hub.groups(Some(h))[&h];
    assert_eq!(
        gs["a"],
        GroupActivity {
            consumers: 1,
            in_flight: 2,
            done: 1
        }
    );
    assert_eq!(gs["gone"], GroupActivity::default());
    for d in &got[1..] {
        hub.ack(ida, d.key, true, 2);
    }
    pass(&mut hub, &mut store, 3);
    assert_eq!(store.0.len(), 3, "group gone has not had them");
    assert_eq!(hub.groups(Some(h))[&h]["a"].done, 3, "parked for gone");
    assert!(hub.forget_group("t", "gone", 4).is_empty(), "no members");
    pass(&mut hub, &mut store, 4);
    assert!(store.0.is_empty(), "only gone still needed them");
    assert_eq!(hub.parked(), 0);
    assert_eq!(
        hub.groups(None)[&h].keys().collect::<Vec<_>>(),
        ["a"],
        "gone is no group any more"
    );
}

/// Issue 26 (group lifecycle): deleting a group with members ends them (their sinks are
/// handed back, their deliveries in flight end, a later ACK is ignored) and keeps what no
/// other recipient acked; a group created later under the same name is a new group that gets
/// the backlog still stored.
#[test]
fn deleting_a_group_ends_its_members_and_keeps_what_nobody_acked() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    hub.add_known_groups("t", ["away".to_owned()], 0);
    let g = MemSink::new();
    let idg = hub.register(&sub("t", "g", 2), g.clone(), 0);
    for i in 1..=3 {
        let k = store.put(i, msg("t", 0, 0, 0));
        hub.on_published(k);
    }
    pass(&mut hub, &mut store, 1);
    let got = g.take();
    assert_eq!(got.len(), 2);
    hub.ack(idg, got[0].key, true, 1);
    assert_eq!(hub.in_flight(), 1);
    let ended = hub.forget_group("t", "g", 2);
    assert_eq!(ended.len(), 1, "its member");
    assert_eq!(hub.in_flight(), 0);
    assert_eq!(hub.consumer_count(), 0);
    assert_eq!(hub.ack(idg, got[1].key, true, 3), AckOutcome::Ignored);
    pass(&mut hub, &mut store, 3);
    assert_eq!(store.0.len(), 3, "away acked none of them");
    assert_eq!(hub.parked(), 0, "g's ACK no longer counts");
    // The only group left goes too: the topic's messages stay for whoever subscribes next.
    hub.forget_group("t", "away", 4);
    pass(&mut hub, &mut store, 4);
    assert_eq!(store.0.len(), 3);
    let again = MemSink::new();
    hub.register(&sub("t", "g", 10), again.clone(), 5);
    pass(&mut hub, &mut store, 5);
    assert_eq!(again.take().len(), 3, "a new group g gets the backlog");
}

/// Review of issue 26: deleting a group that holds a backlog larger than the delete queue
/// settles it in chunks, so an ACK taken meanwhile is still accepted (it was refused while the
/// whole backlog sat in the queue: a redelivery storm), and the backlog goes over the passes.
#[test]
fn deleting_a_group_with_a_large_backlog_settles_in_chunks_and_keeps_taking_acks() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    hub.add_known_groups("t", ["gone".to_owned()], 0);
    let a = MemSink::new();
    let ida = hub.register(&sub("t", "a", 4096), a.clone(), 0);
    let n = crate::deleter::DELETE_PENDING_MAX as u64 + 5000;
    for i in 1..=n {
        store.put(i, msg("t", 0, 0, 0));
    }
    let mut now = 1;
    let mut acked = 0;
    while acked < n && now < 1000 {
        pass(&mut hub, &mut store, now);
        for d in a.take() {
            hub.ack(ida, d.key, true, now);
            acked += 1;
        }
        now += 1;
    }
    assert_eq!(hub.parked(), usize::try_from(n).unwrap());
    let k = store.put(n + 1, msg("t", now, 0, 0));
    hub.on_published(k);
    pass(&mut hub, &mut store, now);
    let held = a.take();
    assert_eq!(held.len(), 1);
    hub.forget_group("t", "gone", now);
    assert!(hub.pending_deletes() <= SETTLE_DELETES_MAX);
    assert_eq!(hub.ack(ida, k, true, now), AckOutcome::Acked);
    for step in 1..=10 {
        pass(&mut hub, &mut store, now + step);
    }
    assert!(store.0.is_empty(), "{} left", store.0.len());
    assert_eq!(hub.parked(), 0);
}

/// Issue 10.5: a connected group that does not keep up (here: never acks) does not hold the
/// topic's scan for a group that does, and memory stays within the entry cap; once it acks, it
/// gets every message it is owed.
#[test]
fn a_slow_group_does_not_hold_the_topic_for_a_fast_one() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (fast, slow) = (MemSink::new(), MemSink::new());
    let idf = hub.register(&sub("t", "fast", 10), fast.clone(), 0);
    let ids = hub.register(&sub("t", "slow", 1), slow.clone(), 0);
    let n = 3000;
    for i in 0..n {
        store.put(i + 1, msg("t", 0, 0, 0));
    }
    let mut fast_got = BTreeSet::new();
    let mut slow_held = Vec::new();
    for now in 1..=(n as i64) {
        pass(&mut hub, &mut store, now);
        for d in fast.take() {
            fast_got.insert(d.key);
            hub.ack(idf, d.key, true, now);
        }
        slow_held.extend(slow.take());
        assert!(hub.entries.len() <= Hub::<MemSink>::entry_cap(11));
        if fast_got.len() == n as usize {
            break;
        }
    }
    assert_eq!(fast_got.len(), n as usize, "the fast group got everything");
    assert_eq!(
        store.0.len(),
        n as usize,
        "nothing deleted before slow had it"
    );
    // The slow group catches up, one at a time.
    let mut slow_got = BTreeSet::new();
    let mut now = 10_000;
    while slow_got.len() < n as usize && now < 10_000 + 4 * n as i64 {
        for d in slow_held.drain(..) {
            slow_got.insert(d.key);
            hub.ack(ids, d.key, true, now);
        }
        now += 1;
        pass(&mut hub, &mut store, now);
        slow_held.extend(slow.take());
        assert!(fast.take().is_empty(), "fast acked them all already");
    }
    assert_eq!(slow_got, fast_got);
    pass(&mut hub, &mut store, now + 1);
    assert!(store.0.is_empty());
    assert_eq!(hub.parked(), 0);
}

/// Issue 10.5: a group that comes back to a large backlog and takes it slowly does not hold
/// new messages back from a group that keeps up.
#[test]
fn a_group_back_to_a_backlog_does_not_hold_new_messages_for_others() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    hub.add_known_groups("t", ["late".to_owned()], 0);
    let fast = MemSink::new();
    let idf = hub.register(&sub("t", "fast", 10), fast.clone(), 0);
    for i in 0..2000 {
        store.put(i + 1, msg("t", 0, 0, 0));
    }
    for now in 1..1000 {
        pass(&mut hub, &mut store, now);
        for d in fast.take() {
            hub.ack(idf, d.key, true, now);
        }
    }
    assert_eq!(hub.parked(), 2000);
    let late = MemSink::new();
    hub.register(&sub("t", "late", 1), late.clone(), 1000);
    let mut fresh = BTreeSet::new();
    for i in 0..100 {
        let k = store.put(5000 + i, msg("t", 1000, 0, 0));
        hub.on_published(k);
        fresh.insert(k);
    }
    for now in 1001..1020 {
        pass(&mut hub, &mut store, now);
        for d in fast.take() {
            fresh.remove(&d.key);
            hub.ack(idf, d.key, true, now);
        }
    }
    assert!(fresh.is_empty(), "{} new messages held back", fresh.len());
    assert_eq!(late.take().len(), 1, "late got the first of its backlog");
}

/// Review finding: the head scan passed parked messages a returning group still needs (it
/// was full) after a late publish had moved the head back, while the group's catch-up scan
/// of the range below ran empty and ended its cursor: the group never got them.
#[test]
fn a_catch_up_cursor_survives_a_head_that_moved_back() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    hub.add_known_groups("t", ["g".to_owned()], 0);
    let f = MemSink::new();
    let idf = hub.register(&sub("t", "f", 10), f.clone(), 0);
    let parked: BTreeSet<EventKey> = (1..=2).map(|i| store.put(i, msg("t", 5, 0, 0))).collect();
    for now in 6..9 {
        pass(&mut hub, &mut store, now);
        for d in f.take() {
            hub.ack(idf, d.key, true, now);
        }
    }
    assert_eq!(hub.parked(), 2, "f acked both, g is away");
    // A message stamped earlier commits late: the head moves back before the parked ones.
    let late = store.put(3, msg("t", 3, 0, 0));
    hub.on_published(late);
    let g = MemSink::new();
    let idg = hub.register(&sub("t", "g", 1), g.clone(), 10);
    let mut got = BTreeSet::new();
    for now in 10..20 {
        pass(&mut hub, &mut store, now);
        for d in g.take() {
            got.insert(d.key);
            hub.ack(idg, d.key, true, now);
        }
        for d in f.take() {
            hub.ack(idf, d.key, true, now);
        }
    }
    let mut want = parked;
    want.insert(late);
    assert_eq!(got, want, "g got the late one and both parked ones");
    pass(&mut hub, &mut store, 21);
    assert!(store.0.is_empty());
}

/// Review finding: messages parked for a slow universal consumer stayed stored (and counted
/// against PARKED_MAX) after it left, though every recipient left had acked them; so did the
/// parked count of a topic whose last consumer left.
#[test]
fn a_slow_universal_consumer_that_leaves_releases_what_the_others_acked() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (fast, slow) = (MemSink::new(), MemSink::new());
    let idf = hub.register(&sub("t", "", 10), fast.clone(), 0);
    let ids = hub.register(&sub("t", "", 1), slow.clone(), 0);
    for i in 0..2000 {
        store.put(i + 1, msg("t", 0, 0, 0));
    }
    for now in 1..=400 {
        pass(&mut hub, &mut store, now);
        for d in fast.take() {
            hub.ack(idf, d.key, true, now);
        }
    }
    assert!(hub.parked() > 0, "parked for the slow one");
    hub.unregister(ids, 500);
    for now in 501..=600 {
        pass(&mut hub, &mut store, now);
        for d in fast.take() {
            hub.ack(idf, d.key, true, now);
        }
    }
    assert_eq!(hub.parked(), 0);
    assert!(store.0.is_empty(), "{} left stored", store.0.len());
    // A topic whose last consumer leaves forgets its parked records.
    let late = MemSink::new();
    let idl = hub.register(&sub("t", "", 1), late.clone(), 700);
    for i in 0..1500 {
        let k = store.put(10_000 + i, msg("t", 700, 0, 0));
        hub.on_published(k);
    }
    for now in 701..=900 {
        pass(&mut hub, &mut store, now);
        for d in fast.take() {
            hub.ack(idf, d.key, true, now);
        }
    }
    assert!(hub.parked() > 0);
    hub.unregister(idl, 901);
    hub.unregister(idf, 901);
    assert_eq!(hub.parked(), 0);
}

/// Review finding: a consumer whose queue is full (its client stopped reading) while its
/// in-flight budget has room again (the deliveries timed out) kept the dispatcher awake.
#[test]
fn a_consumer_with_a_full_queue_does_not_keep_the_dispatcher_awake() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 5), s.clone(), 0);
    for i in 0..20 {
        let k = store.put(i + 1, msg("t", 0, 0, 0));
        hub.on_published(k);
    }
    pass(&mut hub, &mut store, 1);
    assert_eq!(s.take().len(), 5);
    *s.open.borrow_mut() = false;
    // The deliveries time out: the budget is free, the queue is not.
    pass(&mut hub, &mut store, 1 + CFG.in_flight_timeout_ms);
    let now = 2 + CFG.in_flight_timeout_ms;
    pass(&mut hub, &mut store, now);
    assert_ne!(
        hub.next_wakeup(now),
        Some(now),
        "nothing can be sent: sleep"
    );
}

/// Review finding: a recipient that subscribes while a message is in memory (in flight to
/// another) was never offered it: the catch-up scan skips keys in memory.
#[test]
fn a_new_recipient_gets_messages_in_memory_when_it_joins() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (a, b, g) = (MemSink::new(), MemSink::new(), MemSink::new());
    let ida = hub.register(&sub("t", "", 5), a.clone(), 0);
    let k = store.put(1, msg("t", 0, 0, 0));
    hub.on_published(k);
    pass(&mut hub, &mut store, 1);
    assert_eq!(a.take().len(), 1, "in flight to a");
    let idb = hub.register(&sub("t", "", 5), b.clone(), 2);
    let idg = hub.register(&sub("t", "g", 5), g.clone(), 2);
    hub.ack(ida, k, true, 3);
    pass(&mut hub, &mut store, 3);
    let (gb, gg) = (b.take(), g.take());
    assert_eq!(gb.iter().map(|d| d.key).collect::<Vec<_>>(), vec![k]);
    assert_eq!(gg.iter().map(|d| d.key).collect::<Vec<_>>(), vec![k]);
    hub.ack(idb, k, true, 4);
    hub.ack(idg, k, true, 4);
    pass(&mut hub, &mut store, 5);
    assert!(store.0.is_empty());
}

#[test]
fn publish_behind_the_cursor_is_found() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 50), s.clone(), 0);
    pass(&mut hub, &mut store, 100);
    assert_eq!(
        hub.next_wakeup(100),
        None,
        "nothing pending: sleep until an event"
    );
    // A message stamped at 90 (before the last scan) commits late.
    let k = store.put(5, msg("t", 90, 0, 0));
    hub.on_published(k);
    assert_eq!(hub.next_wakeup(100), Some(90));
    pass(&mut hub, &mut store, 101);
    assert_eq!(s.take().len(), 1);
}

#[test]
fn memory_is_bounded_by_consumer_capacity_not_backlog() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 4), s.clone(), 0);
    for i in 0..5000 {
        store.put(i + 1, msg("t", 0, 0, 0));
    }
    pass(&mut hub, &mut store, 1);
    assert_eq!(s.take().len(), 4);
    assert!(hub.entries.len() <= 4);
}

#[test]
fn read_ahead_delivers_from_memory_at_the_due_instant() {
    let mut hub = Hub::new(HubConfig {
        lookahead_ms: 100,
        ..CFG
    });
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 10), s.clone(), 1000);
    let k = store.put(1, msg("t", 1000, 500, 0));
    let far = store.put(2, msg("t", 1000, 900, 0));
    pass(&mut hub, &mut store, 1000);
    assert_eq!(
        hub.next_wakeup(1000),
        Some(1400),
        "scan the window 100 ms early"
    );
    pass(&mut hub, &mut store, 1400);
    assert!(s.take().is_empty(), "read ahead, not delivered early");
    assert_eq!(
        hub.next_wakeup(1400),
        Some(1500),
        "wake exactly at the due instant"
    );
    // Storage is not on the delivery path any more.
    store.0.remove(&k);
    pass(&mut hub, &mut store, 1499);
    assert!(s.take().is_empty());
    pass(&mut hub, &mut store, 1500);
    let got = s.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, k);
    // The message beyond the window is still read from storage later.
    assert_eq!(hub.next_wakeup(1500), Some(1800));
    pass(&mut hub, &mut store, 1900);
    assert_eq!(s.take()[0].key, far);
}

#[test]
fn read_ahead_messages_deleted_or_expired_are_never_sent() {
    let mut hub = Hub::new(HubConfig {
        lookahead_ms: 100,
        ..CFG
    });
    let mut store = Store::default();
    let s = MemSink::new();
    hub.register(&sub("t", "", 10), s.clone(), 1000);
    let swept = store.put(1, msg("t", 1000, 50, 0));
    store.put(2, msg("t", 1000, 60, 55));
    pass(&mut hub, &mut store, 1000);
    hub.on_deleted(&[swept]);
    store.0.remove(&swept);
    pass(&mut hub, &mut store, 1100);
    assert!(s.take().is_empty());
    assert_eq!(hub.counters().expired, 1);
    assert!(store.0.is_empty(), "the expired one was deleted");
}

proptest! {
    /// Random schedules of publishes, acks, nacks, disconnects, dead letters (committed or
    /// failed) and time: no delivery is early or expired or beyond the attempts, no consumer
    /// exceeds its budget, a recipient's dead letter commits at most once, and acked or
    /// dead-lettered messages leave the store.
    #[test]
    fn random_schedules_keep_the_invariants(ops in proptest::collection::vec((0u8..7, 0u64..40, 0i64..30), 1..120)) {
        const MAX_ATTEMPTS: u32 = 3;
        let mut hub = Hub::new(HubConfig { in_flight_timeout_ms: 50, bucket_ms: 10, scan_limit: 3, lookahead_ms: 7, max_attempts: MAX_ATTEMPTS });
        let mut store = Store::default();
        let mut sinks: Vec<(ConsumerId, MemSink, u32)> = Vec::new();
        let mut now = 0i64;
        let mut id = 0u64;
        // Per (message, recipient): its dead letter committed.
        type Dead = std::collections::HashSet<(EventKey, String, u64)>;
        let mut dead = Dead::new();
        fn answer(hub: &mut Hub<MemSink>, dead: &mut Dead, committed: bool, now: i64) -> Result<(), TestCaseError> {
            for dl in hub.take_dead_letters() {
                if committed {
                    let once = dead.insert((dl.key, dl.group().to_owned(), dl.consumer()));
                    prop_assert!(once, "{dl:?} committed twice");
                }
                hub.dead_lettered(&dl, committed, now);
            }
            Ok(())
        }
        for (op, a, b) in ops {
            match op {
                0 => { id += 1; store.put(id, msg("t", now, b * 3, if a % 4 == 0 { b } else { 0 })); }
                1 => {
                    let s = MemSink::new();
                    let max = (a % 3 + 1) as u32;
                    let group = ["", "g", "h"][(a % 3) as usize];
                    let c = hub.register(&sub("t", group, max), s.clone(), now);
                    sinks.push((c, s, max));
                }
                2 if !sinks.is_empty() => {
                    let (c, s, _) = sinks.remove((a as usize) % sinks.len());
                    s.take();
                    hub.unregister(c, now);
                }
                3 => now += b,
                4 => answer(&mut hub, &mut dead, a % 3 != 0, now)?,
                5 if a % 4 == 0 => {
                    // A group deleted: its members end; the name, used again, is a new group.
                    let group = ["g", "h"][(b % 2) as usize];
                    let ended = hub.forget_group("t", group, now);
                    let before = sinks.len();
                    sinks.retain(|(c, _, _)| hub.consumers.contains_key(c));
                    prop_assert_eq!(before - sinks.len(), ended.len());
                    dead.retain(|(_, g, _)| g != group);
                }
                _ => {}
            }
            pass(&mut hub, &mut store, now);
            for (c, s, max) in &sinks {
                for d in s.take() {
                    prop_assert!(d.message.due_at_ms() <= now, "early delivery");
                    prop_assert!(!d.message.is_expired(now), "expired delivery");
                    prop_assert!(d.attempt <= MAX_ATTEMPTS, "attempt {} of {MAX_ATTEMPTS}", d.attempt);
                    // Every fifth message is a poison one (always NACKed: its recipients give
                    // up), others are NACKed now and then.
                    let poison = d.key.event_id().0 % 5 == 0;
                    let ok = !poison && (d.key.event_id().0 + u64::from(d.attempt)) % 3 != 0;
                    hub.ack(*c, d.key, ok, now);
                }
                prop_assert!(hub.consumers[c].in_flight.len() <= *max as usize);
            }
        }
        // Everyone leaves; then one consumer per group and a universal one come back, time
        // passes, they ack everything but the poison messages, and every dead letter commits:
        // everything drains (each recipient got what was owed to it, or gave up).
        for (c, s, _) in sinks.drain(..) { s.take(); hub.unregister(c, now); }
        answer(&mut hub, &mut dead, true, now)?;
        prop_assert_eq!(hub.in_flight(), 0);
        prop_assert!(hub.entries.is_empty());
        let back: Vec<(ConsumerId, MemSink)> = ["", "g", "h"]
            .iter()
            .map(|g| {
                let s = MemSink::new();
                (hub.register(&sub("t", g, 1000), s.clone(), now), s)
            })
            .collect();
        now += 10_000;
        let poisoned: Vec<EventKey> = store
            .0
            .iter()
            .filter(|(k, m)| {
                k.event_id().0 % 5 == 0
                    && !m.is_expired(now)
                    && !dead.iter().any(|(d, _, _)| d == *k)
            })
            .map(|(k, _)| *k)
            .collect();
        for step in 0..8 {
            pass(&mut hub, &mut store, now + step);
            answer(&mut hub, &mut dead, true, now + step)?;
            for (c, s) in &back {
                for d in s.take() {
                    prop_assert!(d.attempt <= MAX_ATTEMPTS, "attempt {} of {MAX_ATTEMPTS}", d.attempt);
                    hub.ack(*c, d.key, d.key.event_id().0 % 5 != 0, now + step);
                }
            }
        }
        pass(&mut hub, &mut store, now + 8);
        prop_assert!(store.0.is_empty(), "left: {:?}", store.0.keys().collect::<Vec<_>>());
        // A poison message still deliverable then, and given up by nobody yet, was given up
        // by each group (poison messages are never acked).
        for k in &poisoned {
            for g in ["g", "h"] {
                prop_assert!(dead.contains(&(*k, g.to_owned(), 0)), "{k:?} not dead-lettered by {g}");
            }
        }
        prop_assert_eq!(hub.parked(), 0);
    }
}

/// Review follow-up (a busy dispatcher in the slow-group test): entries waiting only for a
/// full recipient must not make the dispatcher wake at once while another recipient has
/// room; nothing could be sent, and the dispatcher spun.
#[test]
fn waiting_entries_of_a_full_recipient_do_not_keep_the_dispatcher_awake() {
    let mut hub = Hub::new(CFG);
    let mut store = Store::default();
    let (fast, slow) = (MemSink::new(), MemSink::new());
    let idf = hub.register(&sub("t", "fast", 10), fast.clone(), 0);
    let ids = hub.register(&sub("t", "slow", 1), slow.clone(), 0);
    for i in 0..3000 {
        store.put(i + 1, msg("t", 0, 0, 0));
    }
    let mut held = Vec::new();
    let mut idle_wakeups = 0;
    for now in 1..=4000i64 {
        pass(&mut hub, &mut store, now);
        for d in fast.take() {
            hub.ack(idf, d.key, true, now);
        }
        held.extend(slow.take());
        if now > 1000 {
            for d in held.drain(..) {
                hub.ack(ids, d.key, true, now);
            }
        }
        pass(&mut hub, &mut store, now);
        held.extend(slow.take());
        if hub.next_wakeup(now) == Some(now) {
            // Woken at once: the next pass must send something.
            pass(&mut hub, &mut store, now);
            let (f, s) = (fast.take(), slow.take());
            if f.is_empty() && s.is_empty() {
                idle_wakeups += 1;
            }
            for d in f {
                hub.ack(idf, d.key, true, now);
            }
            held.extend(s);
        }
    }
    assert_eq!(
        idle_wakeups, 0,
        "passes with nothing to do that woke at once"
    );
}

/// Review finding: an ACK was accepted while the delete queue had room, but the delete was
/// queued only when the entry's last recipient finished. If expiries had filled the queue
/// meanwhile, the delete was dropped: the acked message stayed stored and came back.
#[test]
fn an_accepted_ack_keeps_its_delete_when_the_queue_fills_meanwhile() {
    let cfg = HubConfig {
        scan_limit: 100_000,
        ..CFG
    };
    let mut hub = Hub::new(cfg);
    let mut store = Store::default();
    let (g, u) = (MemSink::new(), MemSink::new());
    let idg = hub.register(&sub("t", "g", 10), g.clone(), 0);
    let idu = hub.register(&sub("t", "", 10), u.clone(), 0);
    let m = store.put(1, msg("t", 0, 0, 0));
    pass(&mut hub, &mut store, 1);
    let got = g.take();
    assert_eq!(got.len(), 1);
    assert_eq!(u.take().len(), 1);
    assert_eq!(hub.ack(idg, got[0].key, true, 2), AckOutcome::Acked);

    // Expired messages of another topic fill the delete queue to its bound.
    hub.register(&sub("e", "", 10), MemSink::new(), 0);
    for i in 0..crate::deleter::DELETE_PENDING_MAX as u64 {
        store.put(100 + i, msg("e", 0, 0, 1));
    }
    for now in 10..200 {
        for r in hub.scans_due(now) {
            let res = store.scan(&r);
            hub.apply_scan(&r, res, now);
        }
    }
    assert_eq!(hub.pending_deletes(), crate::deleter::DELETE_PENDING_MAX);

    // The universal consumer leaves: the group's ACK is all the entry has left.
    hub.unregister(idu, 201);
    let mut deleted = Vec::new();
    while let Some(keys) = hub.take_delete_batch() {
        deleted.extend(keys);
        hub.finish_delete_batch(true);
    }
    assert!(
        deleted.contains(&m),
        "the acked message's delete was dropped"
    );
}

/// Issue 26.2: a hub gives consumer ids from the first one it is told (a restarted process or
/// another leader starts above every id an earlier one gave: universal consumers are
/// dead-letter recipients by id).
#[test]
fn consumer_ids_start_where_the_hub_is_told() {
    let mut hub = Hub::new(CFG).first_consumer_id((7 << 22) | 1);
    let a = hub.register(&sub("t", "", 10), MemSink::new(), 0);
    let b = hub.register(&sub("t", "", 10), MemSink::new(), 0);
    assert_eq!((a.0, b.0), ((7 << 22) | 1, (7 << 22) | 2));
    let mut hub = Hub::new(CFG).first_consumer_id(0);
    assert_eq!(
        hub.register(&sub("t", "", 10), MemSink::new(), 0).0,
        1,
        "never 0"
    );
}
