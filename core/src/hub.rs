//! The consumer hub: who is subscribed, what is in flight, what to scan next.
//!
//! The hub is a synchronous state machine driven by the dispatcher task. It never reads a
//! clock (every call takes `now_ms`) and never does I/O: storage scans are described by
//! [`ScanRequest`] and their results fed back through [`Hub::apply_scan`]; deliveries go to
//! each consumer's [`Sink`], which must not block.
//!
//! # Delivery model
//! - Each due message is offered once to every *recipient* of its topic: each consumer group
//!   (one member, round-robin among members with room) and each universal consumer.
//! - A group, once known for a topic (it subscribed there, or the durable registry says so:
//!   [`Hub::add_known_groups`]), stays a recipient of every message of the topic while it has
//!   no members: at-least-once per recipient, also for a group that reconnects later.
//!   Universal consumers are recipients only while connected.
//! - A group starts receiving when it is first known: it gets the topic's backlog (every
//!   message still stored, due or not) and everything published later. A delay queue is not
//!   a log read from a position: a message published before the group existed can still be
//!   due in its future, and one stored copy serves every group.
//! - A deleted group ([`Hub::forget_group`]) is a recipient no more: its members are
//!   removed (their in-flight deliveries end, their ACKs are ignored), its ACKs no longer
//!   count, and what only it still needed (every other recipient acked it) is deleted; what
//!   nobody acked stays stored for the others, or for whoever subscribes next.
//! - A message in memory is an *entry*; each recipient of an entry is pending (sent to one
//!   consumer, with a deadline), waiting (needs a (re)delivery), acked, or dropped (its
//!   universal consumer went away).
//! - An entry ends when no recipient is pending and none that is connected waits: if every
//!   group acked (and anyone acked at all), the key goes to the delete queue; if groups
//!   without members still wait, the entry is *parked* — out of memory, with who acked it —
//!   and the message stays stored for them; if nobody acked, it is released and rescanned.
//! - Each topic has one *head* cursor for messages that never went out, and each recipient
//!   that fell behind has a *catch-up* cursor of its own: a new recipient (a universal
//!   consumer, a group's first member) starts one at the topic's start; a recipient that
//!   cannot take a message the others are done with gets one at that message.
//! - A recipient that does not keep up never holds the others back: the head scan passes
//!   messages only it (or groups without members) still needs, and when the topic's entries
//!   fill its entry cap, entries that only full or away recipients still need are parked (or,
//!   if nobody acked them, released) to make room. The recipient gets them later from its
//!   catch-up cursor, at its own pace.
//! - NACK and in-flight timeout make that recipient waiting again (attempt + 1 on resend).
//! - A recipient that got a message `max_attempts` times (the message's own, else
//!   [`HubConfig::max_attempts`]; 0 = no limit) without acking it gives up instead of a
//!   further delivery: it is *dead-lettering* until the dispatcher's replicated command that
//!   copies the message to its dead-letter topic is answered ([`Hub::take_dead_letters`],
//!   [`Hub::dead_lettered`]); then it is done (as if acked), or, if the command failed,
//!   waiting again (it gives up again at its next turn). A dead-lettered copy itself is never
//!   dead-lettered: nothing loops.
//!
//! # Invariants
//! - A consumer never holds more than its `max_in_flight` unacknowledged deliveries.
//! - A key that is in memory or pending deletion is never offered again by a scan.
//! - A message is never delivered before it is due nor once its TTL has passed.
//! - Memory per topic is bounded by [`Hub::entry_cap`], whatever the number of pending messages;
//!   parked records are bounded by [`PARKED_MAX`] in all (beyond it entries stay in memory and
//!   the entry cap holds the topic back: no loss).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::deleter::DeleteQueue;
use crate::key::{bucket_of, bucket_start_ms, topic_hash, EventKey, TopicHash};
use crate::message::StoredMessage;

/// Identifies one subscription (one Subscribe stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerId(pub u64);

/// Most keys one scan may return; bounds the work of one dispatcher pass per topic.
pub const SCAN_BATCH_MAX: usize = 1024;
/// Most value bytes one scan may return (the storage side stops after the value that
/// crosses it); bounds the memory of one scan whatever the message size.
pub const SCAN_BYTES_MAX: usize = 8 << 20;
/// Fewest keys a catch-up scan reads (see [`Hub::scans_due`]).
pub const CATCH_UP_SCAN_MIN: usize = 16;
/// Lower bound of a topic's entry cap, so a topic with small consumers still pipelines.
pub const TOPIC_ENTRIES_MIN: usize = 1024;
/// Most parked messages (acked by some recipients, still owed to groups without members or to
/// connected recipients that fell behind) the hub remembers, over all topics; beyond it such
/// entries stay in memory under their topic's entry cap, which then holds the topic back.
pub const PARKED_MAX: usize = 1_000_000;
/// Most deletes queued at once by settling parked messages (after a recipient left or a
/// group was deleted); ACKs are refused from [`crate::deleter::DELETE_PENDING_MAX`] on.
pub const SETTLE_DELETES_MAX: usize = crate::deleter::DELETE_PENDING_MAX / 2;
/// Most messages whose attempts the hub remembers while they are out of memory (see
/// `Hub::attempts_kept`); beyond it, such a message's attempts start again when it is read
/// again.
pub const ATTEMPTS_KEPT_MAX: usize = 1_000_000;

/// One delivery of a message to a consumer.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The storage key, sent as the delivery tag.
    pub key: EventKey,
    /// The message.
    pub message: Arc<StoredMessage>,
    /// 1 on first delivery to this recipient, +1 on each redelivery.
    pub attempt: u32,
}

/// Where the hub puts a consumer's deliveries. Must not block.
pub trait Sink {
    /// Hands `d` to the consumer; `false` when it cannot take it now (the consumer is gone or
    /// its queue is full), in which case the hub keeps the delivery for later.
    fn try_send(&self, d: Delivery) -> bool;

    /// How many deliveries `try_send` would take now (a queue's free slots). A consumer whose
    /// queue is full counts as full whatever its in-flight budget (deliveries that timed out
    /// may still sit in its queue), so the dispatcher does not wake for it.
    fn room(&self) -> usize {
        usize::MAX
    }
}

/// What [`Hub::topic_activity`] reports for one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicActivity {
    /// The topic's name.
    pub topic: Arc<str>,
    /// Connected consumer streams.
    pub consumers: u32,
    /// Their deliveries in flight.
    pub in_flight: u64,
}

/// What [`Hub::groups`] reports for one consumer group known on this leader.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupActivity {
    /// Its connected members (consumer streams).
    pub consumers: u32,
    /// Their deliveries in flight.
    pub in_flight: u64,
    /// Messages of the topic still stored that the group is done with (it acked them, or
    /// gave up and dead-lettered them), as far as this leader knows: held for other
    /// recipients, or waiting for their delete to commit. The group's pending messages are
    /// the topic's stored ones less these.
    pub done: u64,
}

/// Timing configuration of the hub.
#[derive(Debug, Clone, Copy)]
pub struct HubConfig {
    /// How long a delivery may stay unacknowledged before it is redelivered.
    pub in_flight_timeout_ms: i64,
    /// Size of a storage time bucket in ms (`delivery.timeBucket`).
    pub bucket_ms: u64,
    /// Keys read per topic per scan (`delivery.scanMaxKeys`), at most [`SCAN_BATCH_MAX`].
    pub scan_limit: usize,
    /// How far ahead of their due time messages are read into memory (0 = not at all), so
    /// that storage latency is off the delivery path: a read-ahead message is sent from
    /// memory when its instant comes.
    pub lookahead_ms: i64,
    /// Deliveries per recipient before it gives up on a message that sets no limit of its
    /// own (`delivery.maxAttempts`; 0 = no limit).
    pub max_attempts: u32,
}

/// What a subscriber asked for.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Topic name.
    pub topic: String,
    /// Group; empty = universal consumer.
    pub group: String,
    /// Most unacknowledged deliveries at once (>= 1).
    pub max_in_flight: u32,
}

/// A storage range the hub wants read: due keys of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanRequest {
    /// Topic hash.
    pub topic_hash: TopicHash,
    /// First key to examine (inclusive).
    pub from: EventKey,
    /// End of the range (exclusive): for the head scan the start of the bucket after
    /// `bucket(now)`, for a catch-up scan the head cursor.
    pub upper: EventKey,
    /// Most keys to return.
    pub limit: usize,
    /// `None` for the topic's head scan; the recipient whose catch-up cursor this scan
    /// advances otherwise.
    pub catch_up: Option<CatchUp>,
}

/// The recipient a catch-up scan is for (opaque to the storage side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUp(RecipientId);

/// What storage found for a [`ScanRequest`].
#[derive(Debug, Clone, Default)]
pub struct ScanResult {
    /// Keys in `[from, upper)`, in order, with their messages.
    pub items: Vec<(EventKey, Arc<StoredMessage>)>,
    /// True when the range held no more keys than `items`.
    pub exhausted: bool,
    /// The first key of the topic at or after `upper`, if any (the next bucket with work).
    pub next_key: Option<EventKey>,
}

/// Result of an ACK or NACK frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// The tag was not in flight on this consumer: ignored.
    Ignored,
    /// ACK accepted.
    Acked,
    /// NACK accepted: the message is due again at once.
    Nacked,
    /// ACK could not be recorded (delete queue full): treated as a NACK.
    Refused,
}

/// Counters the glue exports as metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct HubCounters {
    /// Deliveries handed to consumers (first deliveries and redeliveries).
    pub dispatched: u64,
    /// Of those, redeliveries.
    pub redelivered: u64,
    /// Redeliveries caused by in-flight timeouts.
    pub timeouts: u64,
    /// Messages found expired by the dispatcher.
    pub expired: u64,
}

/// A recipient that gave up on a message: what the dispatcher turns into one replicated
/// command, and hands back to [`Hub::dead_lettered`] with its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message.
    pub key: EventKey,
    recipient: RecipientId,
}

impl DeadLetter {
    /// The group that gave up ("" = a universal consumer).
    #[must_use]
    pub fn group(&self) -> &str {
        match &self.recipient {
            RecipientId::Group(g) => g,
            RecipientId::Universal(_) => "",
        }
    }

    /// The universal consumer that gave up (its id + 1), 0 for a group.
    #[must_use]
    pub fn consumer(&self) -> u64 {
        match &self.recipient {
            RecipientId::Group(_) => 0,
            RecipientId::Universal(c) => c.0 + 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum RecipientId {
    Group(String),
    Universal(ConsumerId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RState {
    Pending {
        consumer: ConsumerId,
        deadline_ms: i64,
    },
    Waiting,
    /// Gave up: its dead letter's command is in flight.
    DeadLettering,
    Acked,
    Dropped,
}

#[derive(Debug)]
struct Recipient {
    id: RecipientId,
    state: RState,
    attempts: u32,
}

#[derive(Debug)]
struct Entry {
    message: Arc<StoredMessage>,
    recipients: Vec<Recipient>,
}

#[derive(Debug, Default)]
struct Group {
    members: Vec<ConsumerId>,
    next: usize,
}

#[derive(Debug)]
struct Topic {
    groups: BTreeMap<String, Group>,
    universal: Vec<ConsumerId>,
    /// Next key a scan examines (inclusive).
    resume: EventKey,
    /// When the topic should be scanned next; `None` = nothing known to fall due.
    next_scan_ms: Option<i64>,
    /// Keys with waiting recipients (may hold keys whose entry has since ended).
    waiting: VecDeque<EventKey>,
    /// Entries of this topic in memory.
    entries: usize,
    /// Sum of the topic's consumers' `max_in_flight`.
    capacity: usize,
    /// Messages read ahead of their due instant, by (due, key); they count against the
    /// topic's entry cap.
    ahead: BTreeMap<(i64, EventKey), Arc<StoredMessage>>,
    /// Parked messages: the recipients that acked them (the rest are groups without
    /// members or recipients that fell behind, which still get them).
    parked: BTreeMap<EventKey, Vec<RecipientId>>,
    /// Parked messages every recipient acked are left to settle (see `Hub::settle_parked`).
    unsettled: bool,
    /// Catch-up cursors of connected recipients that fell behind. Invariant: every stored
    /// message below `resume` that a connected recipient `r` still needs is in memory (an
    /// entry where `r` waits or is pending) or at or after `lag[r]`.
    lag: BTreeMap<RecipientId, EventKey>,
}

impl Topic {
    fn new(h: TopicHash, now_ms: i64) -> Topic {
        Topic {
            groups: BTreeMap::new(),
            universal: Vec::new(),
            resume: EventKey::topic_start(h),
            next_scan_ms: Some(now_ms),
            waiting: VecDeque::new(),
            entries: 0,
            capacity: 0,
            ahead: BTreeMap::new(),
            parked: BTreeMap::new(),
            unsettled: false,
            lag: BTreeMap::new(),
        }
    }

    /// Moves `r`'s catch-up cursor back to `key` (starts one there if it had none).
    fn fell_behind(&mut self, r: RecipientId, key: EventKey) {
        let at = self.lag.entry(r).or_insert(key);
        *at = (*at).min(key);
    }

    /// Whether a recipient can be served at all now (a connected universal consumer, or a
    /// group with members).
    fn present(&self, r: &RecipientId) -> bool {
        match r {
            RecipientId::Universal(c) => self.universal.contains(c),
            RecipientId::Group(g) => self.groups.get(g).is_some_and(|g| !g.members.is_empty()),
        }
    }

    /// Every recipient of the topic's messages now: all known groups, connected universals.
    fn recipients(&self) -> impl Iterator<Item = RecipientId> + '_ {
        self.groups
            .keys()
            .map(|g| RecipientId::Group(g.clone()))
            .chain(self.universal.iter().map(|u| RecipientId::Universal(*u)))
    }
}

/// Deliveries per recipient before it gives up on `m`: the message's own limit, else the
/// configured one; 0 (none) for a dead-lettered copy, and for a message whose default
/// dead-letter topic (`<topic>.dlq`) would not be a valid topic name.
fn attempt_limit(cfg: &HubConfig, m: &StoredMessage) -> u32 {
    let x = &m.extras;
    let unnamable = crate::message::dead_letter_topic_len(&m.topic, &x.dead_letter_topic)
        > crate::message::TOPIC_LEN_MAX;
    if !x.origin_topic.is_empty() || unnamable {
        return 0;
    }
    match x.max_attempts {
        0 => cfg.max_attempts,
        n => n,
    }
}

/// Counts a stored message `r` is done with, if `r` is one of the groups `gs`.
fn count_done(gs: &mut BTreeMap<String, GroupActivity>, r: &RecipientId) {
    if let RecipientId::Group(name) = r {
        if let Some(g) = gs.get_mut(name) {
            g.done += 1;
        }
    }
}

/// What [`Hub::dispatch_new`] did with a due message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dispatch {
    /// Sent to at least one recipient.
    Sent,
    /// Nothing to do now (no connected recipient still needs it, or every one acked): the
    /// scan goes on.
    Passed,
    /// Not sent, and the scan stops here: the topic's entries fill its entry cap, or the
    /// message (nobody acked it yet) is needed by every connected recipient and all are full.
    NoRoom,
}

struct Consumer<S> {
    topic_hash: TopicHash,
    topic: Arc<str>,
    group: String,
    max_in_flight: u32,
    in_flight: HashSet<EventKey>,
    sink: S,
}

impl<S: Sink> Consumer<S> {
    /// Deliveries it can take now: its free in-flight budget, at most its queue's free slots.
    fn free(&self) -> usize {
        (self.max_in_flight as usize)
            .saturating_sub(self.in_flight.len())
            .min(self.sink.room())
    }

    fn has_room(&self) -> bool {
        self.free() > 0
    }
}

/// The hub. `S` is the per-consumer delivery sink.
pub struct Hub<S> {
    cfg: HubConfig,
    topics: HashMap<TopicHash, Topic>,
    consumers: HashMap<ConsumerId, Consumer<S>>,
    entries: HashMap<EventKey, Entry>,
    timeouts: BTreeSet<(i64, EventKey, ConsumerId)>,
    deletes: DeleteQueue,
    next_consumer: u64,
    counters: HubCounters,
    /// Parked records over all topics.
    parked: usize,
    /// Recipients that gave up, not yet taken by the dispatcher.
    dead_letters: Vec<DeadLetter>,
    /// Attempts of messages with an attempt limit whose entries left memory while they stay
    /// stored (released, shelved), so that a recipient that never acks, such as a consumer
    /// that crashes on a message, still reaches its limit; at most [`ATTEMPTS_KEPT_MAX`].
    attempts_kept: HashMap<EventKey, Vec<(RecipientId, u32)>>,
}

impl<S: Sink> Hub<S> {
    /// The first consumer id this hub gives (default 1). Universal consumers are dead-letter
    /// recipients by id, remembered by the store as long as the message is: a hub started
    /// later (a restart, another leader) must not give an id an earlier hub gave, or its
    /// consumer would be taken for one that already dead-lettered (and get no copy).
    #[must_use]
    pub fn first_consumer_id(mut self, first: u64) -> Self {
        self.next_consumer = first.max(1);
        self
    }

    /// An empty hub.
    #[must_use]
    pub fn new(cfg: HubConfig) -> Self {
        Hub {
            cfg,
            topics: HashMap::new(),
            consumers: HashMap::new(),
            entries: HashMap::new(),
            timeouts: BTreeSet::new(),
            deletes: DeleteQueue::default(),
            next_consumer: 1,
            counters: HubCounters::default(),
            parked: 0,
            dead_letters: Vec::new(),
            attempts_kept: HashMap::new(),
        }
    }

    /// Messages parked for groups without members or recipients that fell behind.
    #[must_use]
    pub fn parked(&self) -> usize {
        self.parked
    }

    /// Adds groups known for `topic` from the durable registry: recipients of its messages
    /// even without members. Call it before the first consumer of a topic registers (after a
    /// restart or a leadership change), so that no message is deleted before they got it.
    pub fn add_known_groups(
        &mut self,
        topic: &str,
        groups: impl IntoIterator<Item = String>,
        now_ms: i64,
    ) {
        let h = topic_hash(topic);
        let mut groups = groups.into_iter().peekable();
        if groups.peek().is_none() {
            // No topic without recipients is kept (see `Hub::recipient_left`).
            return;
        }
        let t = self
            .topics
            .entry(h)
            .or_insert_with(|| Topic::new(h, now_ms));
        for g in groups {
            if !t.groups.contains_key(&g) {
                Self::join_entries(&mut self.entries, t, h, &RecipientId::Group(g.clone()));
                t.groups.insert(g, Group::default());
            }
        }
    }

    /// Makes a recipient new to topic `h` a (waiting) recipient of the topic's entries in
    /// memory: the catch-up scan skips keys in memory, and the entry may end before it.
    fn join_entries(
        entries: &mut HashMap<EventKey, Entry>,
        t: &mut Topic,
        h: TopicHash,
        rid: &RecipientId,
    ) {
        for (k, e) in entries.iter_mut() {
            if k.topic_hash() == h && e.recipients.iter().all(|r| r.id != *rid) {
                e.recipients.push(Recipient {
                    id: rid.clone(),
                    state: RState::Waiting,
                    attempts: 0,
                });
                t.waiting.push_back(*k);
            }
        }
    }

    /// Counters since start.
    #[must_use]
    pub fn counters(&self) -> HubCounters {
        self.counters
    }

    /// Deliveries currently unacknowledged, over all consumers.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.consumers.values().map(|c| c.in_flight.len()).sum()
    }

    /// Connected consumers.
    #[must_use]
    pub fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// Keys waiting for (or in) a delete flush.
    #[must_use]
    pub fn pending_deletes(&self) -> usize {
        self.deletes.len()
    }

    /// Most entries a topic keeps in memory: twice its consumers' combined in-flight budget,
    /// at least [`TOPIC_ENTRIES_MIN`].
    #[must_use]
    pub fn entry_cap(capacity: usize) -> usize {
        (capacity * 2).max(TOPIC_ENTRIES_MIN)
    }

    /// Per topic with connected consumers: its name, the consumer streams, and their
    /// deliveries in flight (sent, not yet acked, nacked or timed out). O(consumers).
    #[must_use]
    pub fn topic_activity(&self) -> HashMap<TopicHash, TopicActivity> {
        let mut out: HashMap<TopicHash, TopicActivity> = HashMap::new();
        for c in self.consumers.values() {
            let a = out.entry(c.topic_hash).or_insert_with(|| TopicActivity {
                topic: Arc::clone(&c.topic),
                ..TopicActivity::default()
            });
            a.consumers += 1;
            a.in_flight += c.in_flight.len() as u64;
        }
        out
    }

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
            let rid = RecipientId::Group(sub.group.clone());
            let known = t.groups.contains_key(&sub.group);
            if !known {
                // New to the topic: it joins the entries in memory (as waiting).
                Self::join_entries(&mut self.entries, t, h, &rid);
            }
            let g = t.groups.entry(sub.group.clone()).or_default();
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
                in_flight: HashSet::new(),
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
    fn remove_consumer(&mut self, id: ConsumerId, now_ms: i64) -> Option<S> {
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
            if let Some(g) = t.groups.get_mut(&c.group) {
                g.members.retain(|m| *m != id);
                if g.members.is_empty() {
                    // It catches up from the topic's start when a member comes back.
                    t.lag.remove(&RecipientId::Group(c.group.clone()));
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
                        self.timeouts.remove(&(deadline_ms, key, id));
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
    fn recipient_left(&mut self, h: TopicHash, owed: bool) {
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
        let rid = RecipientId::Group(group.to_owned());
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
                    name.clone(),
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
    fn settle_parked(&mut self, h: TopicHash, all: bool) {
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

    fn drop_entry_tracking(&mut self, key: EventKey, e: &Entry) {
        for r in &e.recipients {
            if let RState::Pending {
                consumer,
                deadline_ms,
            } = r.state
            {
                self.timeouts.remove(&(deadline_ms, key, consumer));
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
    fn keep_attempts(&mut self, key: EventKey, e: &Entry) {
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
            self.timeouts.remove(&(deadline_ms, key, id));
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
    fn unpark(&mut self, key: EventKey) -> Vec<RecipientId> {
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
    fn finish_if_done(&mut self, key: EventKey, now_ms: i64) {
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
    fn shelve(&mut self, key: EventKey) -> bool {
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
    fn shed_lagging(&mut self) {
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
        while let Some(&(deadline, key, consumer)) = self.timeouts.first() {
            if deadline > now_ms {
                break;
            }
            self.timeouts.pop_first();
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

    /// Picks the consumer for a recipient: a universal consumer itself, or the next group
    /// member (round-robin) with room.
    fn pick(
        topics: &mut HashMap<TopicHash, Topic>,
        consumers: &HashMap<ConsumerId, Consumer<S>>,
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
    fn try_deliver(&mut self, key: EventKey, ri: usize, now_ms: i64) -> bool {
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
        self.timeouts.insert((deadline_ms, key, cid));
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

    fn expire_entry(&mut self, key: EventKey) {
        self.attempts_kept.remove(&key);
        if let Some(e) = self.entries.remove(&key) {
            self.drop_entry_tracking(key, &e);
        }
        self.unpark(key);
        if self.deletes.push(key).is_ok() {
            self.counters.expired += 1;
        }
    }

    fn topic_has_room(&self, t: &Topic) -> bool {
        self.topic_room(t) > 0
    }

    /// How many new messages the topic's recipients could take now: the best recipient's free
    /// in-flight budget, within the topic's entry cap.
    fn topic_room(&self, t: &Topic) -> usize {
        self.best_free(t).min(self.cap_room(t))
    }

    /// The free in-flight budget of the topic's best recipient.
    fn best_free(&self, t: &Topic) -> usize {
        t.recipients()
            .map(|r| self.recipient_free(t, &r))
            .max()
            .unwrap_or(0)
    }

    /// A recipient's free in-flight budget (a group's is its members' sum; 0 when away).
    fn recipient_free(&self, t: &Topic, r: &RecipientId) -> usize {
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
    fn cap_room(&self, t: &Topic) -> usize {
        Self::entry_cap(t.capacity).saturating_sub(t.entries + t.ahead.len())
    }

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
    fn apply_catch_up(&mut self, req: &ScanRequest, r: RecipientId, res: ScanResult, now_ms: i64) {
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
    fn handled_already(
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
    fn dispatch_new(
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
        let mut at = self.timeouts.first().map(|(d, _, _)| *d);
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
    fn waiting_deliverable(&self, t: &Topic) -> bool {
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

    fn waiting_servable(&self, t: &Topic) -> bool {
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

#[cfg(test)]
mod tests;
