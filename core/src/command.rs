//! Replicated event-shard commands: one Raft log entry each, as rkyv archives behind a
//! leading type/version byte, validated (bytecheck) before any field is touched.
//!
//! | bytes | field |
//! |---|---|
//! | 1 | tag: 1 = `StoreBatch` v1, 2 = `DeleteBatch` v1, 3 = `RegisterGroup` v1, 4 = `Cancel` v1, 5 = `Reschedule` v1, 6 = `DeadLetter` v1, 7 = `DeleteGroup` v1 |
//! | 4 | archive length (u32 LE): the rest of the entry, exactly |
//! | n | rkyv archive of the command |
//!
//! The archive format is pinned (little-endian, 32-bit relative pointers, unaligned), so the
//! bytes are the same on every replica and readable in place from any buffer offset.
//!
//! # Invariants
//! - Every item carries its own, leader-assigned event id; a store command's first id is
//!   readable in place ([`first_event_id`]), which the leader-persist tracker keys on.
//! - A command that fails validation is rejected whole; nothing of it is applied.

use rkyv::rancor::Error as RkyvError;
use rkyv::{Archive, Deserialize, Serialize};

use crate::envelope::frame;

use crate::key::{Bucket, EventId, EventKey, TopicHash, KEY_LEN};

/// Largest command a write may append (bytes). A log record must fit in one segment
/// (64 MiB); a batch whose encoding could pass this is refused at the API edge, before any id
/// is assigned.
pub const ENTRY_BYTES_MAX: usize = 32 << 20;

/// Tag of a v1 [`StoreBatch`].
pub const TAG_STORE_V1: u8 = 1;
/// Tag of a v1 [`DeleteBatch`].
pub const TAG_DELETE_V1: u8 = 2;
/// Tag of a v1 [`RegisterGroup`].
pub const TAG_REGISTER_GROUP_V1: u8 = 3;
/// Tag of a v1 [`Cancel`].
pub const TAG_CANCEL_V1: u8 = 4;
/// Tag of a v1 [`Reschedule`].
pub const TAG_RESCHEDULE_V1: u8 = 5;
/// Tag of a v1 [`DeadLetter`].
pub const TAG_DEAD_LETTER_V1: u8 = 6;
/// Tag of a v1 [`DeleteGroup`]. A replica of a version before it refuses the entry as
/// undecodable (skipped, never fatal) and keeps the group: delete groups once every node runs
/// a version that knows the command.
pub const TAG_DELETE_GROUP_V1: u8 = 7;

/// Event ids a writer (a leader, the journal) may have handed out beyond the highest id
/// applied on it: ids in entries written and not yet applied. The writer refuses (or waits)
/// before going further, so whatever it handed out and lost (entries cut by a crash or by a
/// new leader) lies at most this far above the highest id applied anywhere: a writer that
/// takes over first reserves this many ids above that mark ([`ReserveIds`]) and never hands
/// any of them out. 2^32: a pipeline far deeper than any load keeps (also with the ids that
/// proposals refused while leadership settles use up), and 2^32 takeovers before the id
/// space ends.
pub const IDS_UNAPPLIED_MAX: u64 = 1 << 32;

/// Raises the store's highest event id (`last-id`) to `floor`: the ids up to it are never
/// handed out again. A new leader commits one before it assigns ids, [`IDS_UNAPPLIED_MAX`]
/// above the mark it found, so that no id a former leader handed out for an entry that was
/// lost can name a second message (the journal raises its store directly).
///
/// It is written as a [`Reschedule`] of [`RESERVATION_KEY`] with `floor` as its event id:
/// every version that applies Reschedule takes its id as the new `last-id` and finds nothing
/// to move, so replicas of the previous version apply it alike during a rolling upgrade (a
/// command of its own would be refused by them, and their `last-id` would stay behind: an
/// old leader would then hand out ids the upgraded replicas refuse as stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReserveIds {
    /// The new lowest bound of the ids to assign (exclusive).
    pub floor: u64,
}

/// The key a [`ReserveIds`] "moves": event id 0, which no message has (ids start at 1).
pub const RESERVATION_KEY: [u8; KEY_LEN] = [0; KEY_LEN];

impl ReserveIds {
    /// The command's bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        encode_reschedule(&Reschedule {
            key: RESERVATION_KEY,
            event_id: self.floor,
            bucket: 0,
            due_at_ms: 0,
            now_ms: 0,
        })
    }
}

/// Most keys of one [`Cancel`] (the API's limit per request).
pub const CANCEL_KEYS_MAX: usize = 1000;

/// Cancels stored messages for every recipient (the `Cancel` RPC): like a [`DeleteBatch`],
/// and the apply answers which keys were stored ([`Answer::Cancelled`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct Cancel {
    /// 24-byte event keys.
    pub keys: Vec<[u8; KEY_LEN]>,
}

/// Moves a stored message to a new due time (the `Reschedule` RPC): the apply replaces it by
/// the same message (topic, payload, indexes, extras, absolute expiry) enqueued at `now_ms`
/// and due at `due_at_ms`, under a new key with a leader-assigned id; the apply answers the
/// new key ([`Answer::Rescheduled`]).
///
/// Every value the apply needs is in the command (the leader's clock reading included), so
/// every replica decides the same.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct Reschedule {
    /// The stored message's 24-byte key.
    pub key: [u8; KEY_LEN],
    /// Leader-assigned event id of the new key (above every earlier id, like a store's).
    pub event_id: u64,
    /// Time bucket of the new key (the bucket of `due_at_ms`).
    pub bucket: u64,
    /// The new due instant (Unix ms).
    pub due_at_ms: i64,
    /// The leader's clock when it built the command (Unix ms): a message whose TTL passed by
    /// then is not moved (it is not found).
    pub now_ms: i64,
}

impl ArchivedReschedule {
    /// The key of the moved message: the old key's topic, the new bucket and id.
    #[must_use]
    pub fn new_key(&self) -> EventKey {
        EventKey::new(
            EventKey(self.key).topic_hash(),
            Bucket(self.bucket.to_native()),
            EventId(self.event_id.to_native()),
        )
    }
}

/// A recipient gave up on a message (it got it `max_attempts` times without an ACK): the
/// apply stores a copy on the message's dead-letter topic (its `dead_letter_topic`, or
/// `<topic>.dlq`), due at `now_ms`, with the origin set, under a new key (that topic's hash,
/// `bucket`, `event_id`), and counts it on the origin topic. The original stays for the other
/// recipients (the recipient's done mark deletes it like an ACK). The copy of a (message,
/// recipient) is stored once for as long as the original is stored: a repeated command (a
/// retry after an unknown outcome, the same recipient giving up again after a failover)
/// answers the first copy's key. The apply answers the copy's key ([`Answer::DeadLettered`]); `None` when the
/// message is not stored or expired at `now_ms`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct DeadLetter {
    /// The message's key.
    pub key: [u8; KEY_LEN],
    /// Leader-assigned event id of the copy (above every earlier id).
    pub event_id: u64,
    /// Time bucket of `now_ms`.
    pub bucket: u64,
    /// The leader's clock (Unix ms): the copy's enqueue and due time.
    pub now_ms: i64,
    /// The group that gave up ("" = a universal consumer).
    pub group: String,
    /// The universal consumer that gave up (its stream's id + 1 on the leader; ids are unique
    /// across processes, see `Hub::first_consumer_id`), 0 for a group: universal consumers
    /// are recipients each.
    pub consumer: u64,
}

/// A command that takes one leader-assigned event id, given when it is proposed (so ids
/// follow log order) and answered with the key it stored, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WithId {
    /// Move a message.
    Reschedule(Reschedule),
    /// Copy a message to its dead-letter topic.
    DeadLetter(DeadLetter),
}

impl WithId {
    /// The command with `event_id`, encoded.
    #[must_use]
    pub fn encode(&mut self, event_id: u64) -> Vec<u8> {
        match self {
            WithId::Reschedule(r) => {
                r.event_id = event_id;
                encode_reschedule(r)
            }
            WithId::DeadLetter(d) => {
                d.event_id = event_id;
                frame(TAG_DEAD_LETTER_V1, &*d, 64 + KEY_LEN + d.group.len())
            }
        }
    }

    /// The key its apply answered (`Some(None)`: nothing stored); `None` when `answer` is not
    /// this command's kind of answer.
    #[must_use]
    pub fn stored_key(&self, answer: &Answer) -> Option<Option<EventKey>> {
        match (self, answer) {
            (WithId::Reschedule(_), Answer::Rescheduled(k))
            | (WithId::DeadLetter(_), Answer::DeadLettered(k)) => Some(*k),
            _ => None,
        }
    }
}

/// What applying a command answers its proposer beyond "applied" (decided from the entry and
/// the applied state only, so every replica decides the same).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Answer {
    /// Nothing more (stores, deletes, registrations).
    #[default]
    None,
    /// A [`Cancel`]: per key, in order, whether it was stored.
    Cancelled(Vec<bool>),
    /// A [`Reschedule`]: the new key, or `None` when the message was not stored (or its TTL
    /// had passed).
    Rescheduled(Option<EventKey>),
    /// A [`StoreBatch`] some of whose items repeated a dedup id still remembered: per such
    /// item, its event id (assigned, not stored) and the key of the message stored first.
    Deduplicated(Vec<(u64, EventKey)>),
    /// A [`DeadLetter`]: the copy's key, or `None` when the message was not stored.
    DeadLettered(Option<EventKey>),
    /// A [`DeleteGroup`]: whether the group was registered.
    GroupDeleted(bool),
}

/// Records that a consumer group subscribed to a topic: from then on it is a recipient of
/// every message of the topic, also while it has no members (durable registry).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct RegisterGroup {
    /// Topic hash.
    pub topic_hash: u64,
    /// The group name.
    pub group: String,
}

/// Removes a consumer group from the durable registry (the `DeleteGroup` RPC): from then on
/// it is no recipient of the topic's messages; a member that subscribes again registers a new
/// group. What only that group still needed is deleted by the leader's dispatcher (its ACKs
/// live there), through ordinary [`DeleteBatch`]es. The apply answers whether the group was
/// registered ([`Answer::GroupDeleted`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct DeleteGroup {
    /// Topic hash.
    pub topic_hash: u64,
    /// The group name.
    pub group: String,
}

/// One message of a publish batch, ready to store on every replica.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct StoreItem {
    /// Leader-assigned event id (applied verbatim).
    pub event_id: u64,
    /// Time bucket of the key.
    pub bucket: u64,
    /// Topic hash of the key.
    pub topic_hash: u64,
    /// Expiry instant (Unix ms), or 0 for none.
    pub expires_at_ms: i64,
    /// Secondary index keys.
    pub index_keys: Vec<Vec<u8>>,
    /// The encoded [`crate::StoredMessage`].
    pub message: Vec<u8>,
}

impl StoreItem {
    /// An upper bound of this item's share of an encoded [`StoreBatch`]: the fixed fields,
    /// each vector's header and alignment, and the bytes.
    #[must_use]
    pub fn encoded_len_bound(&self) -> usize {
        64 + self.message.len() + self.index_keys.iter().map(|k| k.len() + 16).sum::<usize>()
    }
}

/// An upper bound of [`encode_store`]'s output for these items.
#[must_use]
pub fn store_len_bound(items: &[StoreItem]) -> usize {
    64 + items
        .iter()
        .map(StoreItem::encoded_len_bound)
        .sum::<usize>()
}

impl ArchivedStoreItem {
    /// The item's event key.
    #[must_use]
    pub fn key(&self) -> EventKey {
        EventKey::new(
            TopicHash(self.topic_hash.to_native()),
            Bucket(self.bucket.to_native()),
            EventId(self.event_id.to_native()),
        )
    }
}

/// A whole publish batch: one log entry, applied atomically.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct StoreBatch {
    /// The messages.
    pub items: Vec<StoreItem>,
}

/// Keys to delete (ACKs, TTL expiry), replicated so no replica redelivers them.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct DeleteBatch {
    /// 24-byte event keys.
    pub keys: Vec<[u8; KEY_LEN]>,
}

/// A validated command, borrowed from the entry bytes.
#[derive(Debug)]
pub enum CommandRef<'a> {
    /// Store messages.
    Store(&'a ArchivedStoreBatch),
    /// Delete keys.
    Delete(&'a ArchivedDeleteBatch),
    /// Register a consumer group.
    RegisterGroup(&'a ArchivedRegisterGroup),
    /// Cancel messages.
    Cancel(&'a ArchivedCancel),
    /// Move a message to a new due time.
    Reschedule(&'a ArchivedReschedule),
    /// Copy a message to its dead-letter topic.
    DeadLetter(&'a ArchivedDeadLetter),
    /// Remove a consumer group from the registry.
    DeleteGroup(&'a ArchivedDeleteGroup),
}

/// Why entry bytes are not a command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// No bytes at all.
    #[error("empty command")]
    Empty,
    /// The leading byte names no known command version.
    #[error("unknown command tag {0}")]
    UnknownTag(u8),
    /// The envelope around the archive is damaged.
    #[error("invalid command envelope: {0}")]
    Envelope(crate::envelope::EnvelopeError),
    /// The archive failed validation.
    #[error("invalid command archive: {0}")]
    Invalid(String),
}

/// Encodes a store command.
///
/// # Panics
/// Only if rkyv cannot serialize plain vectors (it always can).
#[must_use]
pub fn encode_store(b: &StoreBatch) -> Vec<u8> {
    let bound = store_len_bound(&b.items);
    let out = frame(TAG_STORE_V1, b, bound);
    // The API refuses a batch by this bound before any id is assigned (ENTRY_BYTES_MAX): it
    // must hold, or a batch it let through could not be appended.
    debug_assert!(
        out.len() <= bound,
        "{} bytes over the bound {bound}",
        out.len()
    );
    out
}

/// Encodes a delete command.
///
/// # Panics
/// Only if rkyv cannot serialize plain vectors (it always can).
#[must_use]
pub fn encode_delete(b: &DeleteBatch) -> Vec<u8> {
    frame(TAG_DELETE_V1, b, 64 + b.keys.len() * KEY_LEN)
}

/// Encodes a cancel command.
///
/// # Panics
/// Only if rkyv cannot serialize plain vectors (it always can).
#[must_use]
pub fn encode_cancel(c: &Cancel) -> Vec<u8> {
    frame(TAG_CANCEL_V1, c, 64 + c.keys.len() * KEY_LEN)
}

/// Encodes a reschedule command.
///
/// # Panics
/// Only if rkyv cannot serialize plain data (it always can).
#[must_use]
pub fn encode_reschedule(r: &Reschedule) -> Vec<u8> {
    frame(TAG_RESCHEDULE_V1, r, 64 + KEY_LEN)
}

/// Encodes a group registration.
///
/// # Panics
/// Only if rkyv cannot serialize plain data (it always can).
#[must_use]
pub fn encode_register_group(r: &RegisterGroup) -> Vec<u8> {
    frame(TAG_REGISTER_GROUP_V1, r, 64 + r.group.len())
}

/// Encodes a group deletion.
///
/// # Panics
/// Only if rkyv cannot serialize plain data (it always can).
#[must_use]
pub fn encode_delete_group(d: &DeleteGroup) -> Vec<u8> {
    frame(TAG_DELETE_GROUP_V1, d, 64 + d.group.len())
}

/// The first event id of a store command, read at fixed offsets without validating the
/// archive (O(1), for the leader-persist tracker): `None` for other commands, an empty batch
/// or bytes too short for the positions read.
///
/// The root of an archive is its last bytes; a [`StoreBatch`]'s root is the items vector (a
/// 32-bit relative pointer and a 32-bit length), and the event id is the first field of an
/// item. Every position read is bounds-checked, so damaged bytes give a wrong id or `None`,
/// never a panic; only a [`decode`]d command is trusted.
#[must_use]
pub fn first_event_id(bytes: &[u8]) -> Option<u64> {
    const ROOT: usize = std::mem::size_of::<ArchivedStoreBatch>();
    const ID_AT: usize = std::mem::offset_of!(ArchivedStoreItem, event_id);
    // The layout read here: the root is the items vector alone, a 32-bit relative pointer
    // then a 32-bit length (the pinned rkyv format: pointer_width_32, unaligned).
    const _: () = assert!(ROOT == 8 && std::mem::offset_of!(ArchivedStoreBatch, items) == 0);
    let (TAG_STORE_V1, archive) = crate::envelope::unframe(bytes).ok()? else {
        return None;
    };
    let root = archive.len().checked_sub(ROOT)?;
    let word = |at: usize| -> Option<[u8; 4]> { archive.get(at..at + 4)?.try_into().ok() };
    let offset = i32::from_le_bytes(word(root)?);
    if u32::from_le_bytes(word(root + 4)?) == 0 {
        return None;
    }
    let item = root.checked_add_signed(isize::try_from(offset).ok()?)?;
    let id = archive.get(item + ID_AT..item + ID_AT + 8)?;
    Some(u64::from_le_bytes(id.try_into().ok()?))
}

/// Validates entry bytes and returns the command, borrowed in place.
///
/// # Errors
/// [`CommandError`] for anything but a well-formed command.
pub fn decode(bytes: &[u8]) -> Result<CommandRef<'_>, CommandError> {
    if bytes.is_empty() {
        return Err(CommandError::Empty);
    }
    let (tag, archive) = crate::envelope::unframe(bytes).map_err(CommandError::Envelope)?;
    match tag {
        TAG_STORE_V1 => rkyv::access::<ArchivedStoreBatch, RkyvError>(archive)
            .map(CommandRef::Store)
            .map_err(|e| CommandError::Invalid(e.to_string())),
        TAG_DELETE_V1 => rkyv::access::<ArchivedDeleteBatch, RkyvError>(archive)
            .map(CommandRef::Delete)
            .map_err(|e| CommandError::Invalid(e.to_string())),
        TAG_REGISTER_GROUP_V1 => rkyv::access::<ArchivedRegisterGroup, RkyvError>(archive)
            .map(CommandRef::RegisterGroup)
            .map_err(|e| CommandError::Invalid(e.to_string())),
        TAG_CANCEL_V1 => rkyv::access::<ArchivedCancel, RkyvError>(archive)
            .map(CommandRef::Cancel)
            .map_err(|e| CommandError::Invalid(e.to_string())),
        TAG_RESCHEDULE_V1 => rkyv::access::<ArchivedReschedule, RkyvError>(archive)
            .map(CommandRef::Reschedule)
            .map_err(|e| CommandError::Invalid(e.to_string())),
        TAG_DEAD_LETTER_V1 => rkyv::access::<ArchivedDeadLetter, RkyvError>(archive)
            .map(CommandRef::DeadLetter)
            .map_err(|e| CommandError::Invalid(e.to_string())),
        TAG_DELETE_GROUP_V1 => rkyv::access::<ArchivedDeleteGroup, RkyvError>(archive)
            .map(CommandRef::DeleteGroup)
            .map_err(|e| CommandError::Invalid(e.to_string())),
        t => Err(CommandError::UnknownTag(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_item() -> impl Strategy<Value = StoreItem> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..12), 0..3),
            proptest::collection::vec(any::<u8>(), 0..200),
        )
            .prop_map(
                |(event_id, bucket, topic_hash, expires_at_ms, index_keys, message)| StoreItem {
                    event_id,
                    bucket,
                    topic_hash,
                    expires_at_ms,
                    index_keys,
                    message,
                },
            )
    }

    proptest! {
        #[test]
        fn store_round_trips_in_place(items in proptest::collection::vec(arb_item(), 0..8), pad in 0usize..16) {
            let b = StoreBatch { items };
            // Any offset in any buffer works (unaligned archive).
            let mut buf = vec![0u8; pad];
            buf.extend(encode_store(&b));
            let CommandRef::Store(a) = decode(&buf[pad..]).unwrap() else { panic!("store") };
            let back: StoreBatch = rkyv::deserialize::<StoreBatch, RkyvError>(a).unwrap();
            prop_assert_eq!(&back, &b);
            for (x, y) in a.items.iter().zip(&b.items) {
                prop_assert_eq!(
                    x.key(),
                    EventKey::new(TopicHash(y.topic_hash), Bucket(y.bucket), EventId(y.event_id))
                );
            }
        }

        #[test]
        fn the_first_id_is_read_in_place(items in proptest::collection::vec(arb_item(), 0..8), pad in 0usize..16) {
            let b = StoreBatch { items };
            let mut buf = vec![0u8; pad];
            buf.extend(encode_store(&b));
            prop_assert_eq!(first_event_id(&buf[pad..]), b.items.first().map(|i| i.event_id));
        }

        #[test]
        fn the_first_id_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = first_event_id(&b);
            // A well-formed envelope around arbitrary bytes reaches the reads in the archive.
            let mut framed = vec![TAG_STORE_V1];
            framed.extend(u32::try_from(b.len()).unwrap().to_le_bytes());
            framed.extend(&b);
            let _ = first_event_id(&framed);
        }

        #[test]
        fn a_damaged_archive_never_panics(items in proptest::collection::vec(arb_item(), 1..4), at: usize, bits: u8) {
            let mut enc = encode_store(&StoreBatch { items });
            let at = 5 + at % (enc.len() - 5);
            enc[at] ^= bits | 1;
            let _ = first_event_id(&enc);
        }

        #[test]
        fn the_length_bound_holds(items in proptest::collection::vec(arb_item(), 0..40)) {
            let b = StoreBatch { items };
            prop_assert!(encode_store(&b).len() <= store_len_bound(&b.items));
        }

        #[test]
        fn delete_round_trips(keys in proptest::collection::vec(any::<[u8; 24]>(), 0..20)) {
            let b = DeleteBatch { keys };
            let enc = encode_delete(&b);
            let CommandRef::Delete(a) = decode(&enc).unwrap() else { panic!("delete") };
            prop_assert_eq!(a.keys.len(), b.keys.len());
            for (x, y) in a.keys.iter().zip(&b.keys) {
                prop_assert_eq!(x, y);
            }
        }

        #[test]
        fn cancel_round_trips(keys in proptest::collection::vec(any::<[u8; 24]>(), 0..20), pad in 0usize..16) {
            let c = Cancel { keys };
            let mut buf = vec![0u8; pad];
            buf.extend(encode_cancel(&c));
            let CommandRef::Cancel(a) = decode(&buf[pad..]).unwrap() else { panic!("cancel") };
            let back: Cancel = rkyv::deserialize::<Cancel, RkyvError>(a).unwrap();
            prop_assert_eq!(&back, &c);
            prop_assert_eq!(first_event_id(&buf[pad..]), None);
        }

        #[test]
        fn reschedule_round_trips(key: [u8; 24], event_id: u64, bucket: u64, due_at_ms: i64, now_ms: i64, pad in 0usize..16) {
            let r = Reschedule { key, event_id, bucket, due_at_ms, now_ms };
            let mut buf = vec![0u8; pad];
            buf.extend(encode_reschedule(&r));
            let CommandRef::Reschedule(a) = decode(&buf[pad..]).unwrap() else { panic!("reschedule") };
            let back: Reschedule = rkyv::deserialize::<Reschedule, RkyvError>(a).unwrap();
            prop_assert_eq!(&back, &r);
            let old = EventKey(key);
            prop_assert_eq!(a.new_key(), EventKey::new(old.topic_hash(), Bucket(bucket), EventId(event_id)));
            prop_assert_eq!(first_event_id(&buf[pad..]), None);
        }

        #[test]
        fn dead_letter_round_trips(key: [u8; 24], event_id: u64, bucket: u64, now_ms: i64, group in ".{0,20}", consumer: u64, pad in 0usize..16) {
            let d = DeadLetter { key, event_id: 0, bucket, now_ms, group, consumer };
            let mut buf = vec![0u8; pad];
            buf.extend(WithId::DeadLetter(d.clone()).encode(event_id));
            let CommandRef::DeadLetter(a) = decode(&buf[pad..]).unwrap() else { panic!("dead letter") };
            let back: DeadLetter = rkyv::deserialize::<DeadLetter, RkyvError>(a).unwrap();
            prop_assert_eq!(back, DeadLetter { event_id, ..d });
            prop_assert_eq!(first_event_id(&buf[pad..]), None);
        }

        #[test]
        fn distinct_ids_never_encode_alike(item in arb_item(), other_id: u64) {
            prop_assume!(other_id != item.event_id);
            let a = encode_store(&StoreBatch { items: vec![item.clone()] });
            let b = encode_store(&StoreBatch { items: vec![StoreItem { event_id: other_id, ..item }] });
            prop_assert_ne!(a, b);
        }

        #[test]
        fn register_group_round_trips(topic_hash: u64, group in ".{0,40}") {
            let r = RegisterGroup { topic_hash, group };
            let enc = encode_register_group(&r);
            let CommandRef::RegisterGroup(a) = decode(&enc).unwrap() else { panic!("register") };
            prop_assert_eq!(a.topic_hash.to_native(), r.topic_hash);
            prop_assert_eq!(a.group.as_str(), r.group.as_str());
        }

        #[test]
        fn delete_group_round_trips(topic_hash: u64, group in ".{0,40}") {
            let d = DeleteGroup { topic_hash, group };
            let enc = encode_delete_group(&d);
            prop_assert_eq!(enc[0], TAG_DELETE_GROUP_V1);
            let CommandRef::DeleteGroup(a) = decode(&enc).unwrap() else { panic!("delete group") };
            prop_assert_eq!(a.topic_hash.to_native(), d.topic_hash);
            prop_assert_eq!(a.group.as_str(), d.group.as_str());
        }

        #[test]
        fn a_reservation_is_a_reschedule_of_the_key_no_message_has(floor: u64) {
            let enc = ReserveIds { floor }.encode();
            let CommandRef::Reschedule(a) = decode(&enc).unwrap() else { panic!("reserve") };
            prop_assert_eq!(a.event_id.to_native(), floor);
            prop_assert_eq!(a.key, RESERVATION_KEY);
            prop_assert_eq!(EventKey(a.key).event_id().0, 0);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&b);
        }

        #[test]
        fn truncations_are_rejected(items in proptest::collection::vec(arb_item(), 1..4)) {
            let enc = encode_store(&StoreBatch { items });
            for cut in 1..enc.len() {
                prop_assert!(decode(&enc[..cut]).is_err(), "cut at {}", cut);
            }
        }
    }

    #[test]
    fn only_store_commands_have_a_first_id() {
        let delete = encode_delete(&DeleteBatch {
            keys: vec![[7; 24]],
        });
        assert_eq!(first_event_id(&delete), None);
        assert_eq!(
            first_event_id(&encode_store(&StoreBatch { items: vec![] })),
            None
        );
    }

    #[test]
    fn unknown_and_empty_are_rejected() {
        assert!(matches!(decode(&[]), Err(CommandError::Empty)));
        assert!(matches!(
            decode(&[9, 0, 0, 0, 0]),
            Err(CommandError::UnknownTag(9))
        ));
    }
}
