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
//! # Files
//! This file holds the hub's state and its public types; its methods live by job in
//! `consumers` (who receives), `deliver` (which consumer takes an entry, and room), `acks`
//! (acks, timeouts, dead letters, parking, the store's notices) and `scan` (what to read and
//! what a read brings).
//!
//! # Invariants
//! - A consumer never holds more than its `max_in_flight` unacknowledged deliveries.
//! - A key that is in memory or pending deletion is never offered again by a scan.
//! - A message is never delivered before it is due nor once its TTL has passed.
//! - Memory per topic is bounded by [`Hub::entry_cap`], whatever the number of pending messages;
//!   parked records are bounded by [`PARKED_MAX`] in all (beyond it entries stay in memory and
//!   the entry cap holds the topic back: no loss).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use self::deadlines::Deadlines;
use crate::deleter::DeleteQueue;
pub(crate) use crate::fast::{FastMap, FastSet};
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
    /// A consumer group, by name (shared: every entry of the topic names it).
    Group(Arc<str>),
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
    groups: BTreeMap<Arc<str>, Group>,
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
            .map(|g| RecipientId::Group(Arc::clone(g)))
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
        if let Some(g) = gs.get_mut(&**name) {
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
    in_flight: FastSet<EventKey>,
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
    topics: FastMap<TopicHash, Topic>,
    consumers: FastMap<ConsumerId, Consumer<S>>,
    entries: FastMap<EventKey, Entry>,
    timeouts: Deadlines<(EventKey, ConsumerId)>,
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
    attempts_kept: FastMap<EventKey, Vec<(RecipientId, u32)>>,
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
            topics: FastMap::default(),
            consumers: FastMap::default(),
            entries: FastMap::default(),
            timeouts: Deadlines::default(),
            deletes: DeleteQueue::default(),
            next_consumer: 1,
            counters: HubCounters::default(),
            parked: 0,
            dead_letters: Vec::new(),
            attempts_kept: FastMap::default(),
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
            if !t.groups.contains_key(g.as_str()) {
                let g: Arc<str> = g.into();
                Self::join_entries(&mut self.entries, t, h, &RecipientId::Group(Arc::clone(&g)));
                t.groups.insert(g, Group::default());
            }
        }
    }

    /// Makes a recipient new to topic `h` a (waiting) recipient of the topic's entries in
    /// memory: the catch-up scan skips keys in memory, and the entry may end before it.
    fn join_entries(
        entries: &mut FastMap<EventKey, Entry>,
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
}

mod acks;
mod consumers;
mod deadlines;
mod deliver;
mod scan;

#[cfg(test)]
mod tests;
