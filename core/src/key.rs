//! The 24-byte event key: `topicHash (u64 BE) · bucket (u64 BE) · eventId (u64 BE)`.
//!
//! The key is also the opaque `delivery_tag` handed to consumers. Byte-wise order is
//! topic → bucket → id, so "every due message of a topic" is one contiguous range.

use std::fmt;

/// Length of an event key in bytes.
pub const KEY_LEN: usize = 24;

/// A topic's hash: the first part of every key of the topic ([`topic_hash`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TopicHash(pub u64);

/// A time bucket: the second part of a key ([`bucket_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bucket(pub u64);

/// An event id: the last part of a key, assigned by the write core in log order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventId(pub u64);

impl fmt::Display for TopicHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Bucket {
    /// The next bucket (the last one stays last).
    #[must_use]
    pub fn next(self) -> Bucket {
        Bucket(self.0.saturating_add(1))
    }
}

impl TopicHash {
    /// The next topic's hash in key order (`None` after the last).
    #[must_use]
    pub fn next(self) -> Option<TopicHash> {
        self.0.checked_add(1).map(TopicHash)
    }
}

/// xxHash64 (seed 0) of the topic's UTF-8 bytes.
#[must_use]
pub fn topic_hash(topic: &str) -> TopicHash {
    TopicHash(xxhash_rust::xxh64::xxh64(topic.as_bytes(), 0))
}

/// The time bucket of an instant: `fire_at_ms / bucket_ms`; non-positive instants map to 0
/// and a bucket size of 0 means raw milliseconds.
#[must_use]
pub fn bucket_of(fire_at_ms: i64, bucket_ms: u64) -> Bucket {
    if fire_at_ms <= 0 {
        return Bucket(0);
    }
    // fire_at_ms > 0 here, so the cast is lossless.
    let t = fire_at_ms as u64;
    Bucket(t.checked_div(bucket_ms).unwrap_or(t))
}

/// The first instant (Unix ms) that falls in `bucket`.
#[must_use]
pub fn bucket_start_ms(bucket: Bucket, bucket_ms: u64) -> i64 {
    let ms = bucket.0.saturating_mul(bucket_ms.max(1));
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// A 24-byte event key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventKey(pub [u8; KEY_LEN]);

/// A slice that is not a 24-byte key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("key length must be 24, got {0}")]
pub struct BadKeyLength(pub usize);

impl EventKey {
    /// Builds a key from its three parts.
    #[must_use]
    pub fn new(topic_hash: TopicHash, bucket: Bucket, event_id: EventId) -> Self {
        let mut k = [0u8; KEY_LEN];
        k[0..8].copy_from_slice(&topic_hash.0.to_be_bytes());
        k[8..16].copy_from_slice(&bucket.0.to_be_bytes());
        k[16..24].copy_from_slice(&event_id.0.to_be_bytes());
        EventKey(k)
    }

    /// Parses a key from untrusted bytes (a delivery tag from a client).
    ///
    /// # Errors
    /// [`BadKeyLength`] when `b` is not exactly 24 bytes.
    pub fn from_slice(b: &[u8]) -> Result<Self, BadKeyLength> {
        let arr: [u8; KEY_LEN] = b.try_into().map_err(|_| BadKeyLength(b.len()))?;
        Ok(EventKey(arr))
    }

    fn part(&self, i: usize) -> u64 {
        let mut p = [0u8; 8];
        p.copy_from_slice(&self.0[i * 8..i * 8 + 8]);
        u64::from_be_bytes(p)
    }

    /// The topic hash part.
    #[must_use]
    pub fn topic_hash(&self) -> TopicHash {
        TopicHash(self.part(0))
    }

    /// The bucket part.
    #[must_use]
    pub fn bucket(&self) -> Bucket {
        Bucket(self.part(1))
    }

    /// The event id part.
    #[must_use]
    pub fn event_id(&self) -> EventId {
        EventId(self.part(2))
    }

    /// The smallest key of a topic.
    #[must_use]
    pub fn topic_start(topic_hash: TopicHash) -> Self {
        EventKey::new(topic_hash, Bucket(0), EventId(0))
    }

    /// The smallest key of `topic_hash` whose bucket is `bucket`: every key below it (and at
    /// or above [`EventKey::topic_start`]) has a bucket `< bucket`.
    #[must_use]
    pub fn bucket_start(topic_hash: TopicHash, bucket: Bucket) -> Self {
        EventKey::new(topic_hash, bucket, EventId(0))
    }

    /// The key immediately after this one in byte order, or `None` at the very end.
    #[must_use]
    pub fn successor(&self) -> Option<Self> {
        let mut k = self.0;
        for i in (0..KEY_LEN).rev() {
            if k[i] == u8::MAX {
                k[i] = 0;
            } else {
                k[i] += 1;
                return Some(EventKey(k));
            }
        }
        None
    }
}

/// A delivery tag's text form: 48 lowercase hex digits, the key's bytes in order (what logs
/// and the CLI print, and what [`EventKey::from_hex`] reads back).
impl fmt::Display for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Text that is not a key's hex form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a delivery tag is 48 hex digits, got {0:?}")]
pub struct BadKeyText(pub String);

impl EventKey {
    /// Parses the [`fmt::Display`] form (upper- or lowercase hex).
    ///
    /// # Errors
    /// [`BadKeyText`] for anything else (the text, cut to 64 characters).
    pub fn from_hex(s: &str) -> Result<Self, BadKeyText> {
        let bad = || BadKeyText(s.chars().take(64).collect());
        let b = s.as_bytes();
        if b.len() != KEY_LEN * 2 {
            return Err(bad());
        }
        let digit = |c: u8| char::from(c).to_digit(16).ok_or_else(bad);
        let mut k = [0u8; KEY_LEN];
        for (i, out) in k.iter_mut().enumerate() {
            // Two hex digits are below 256.
            *out = u8::try_from(digit(b[2 * i])? * 16 + digit(b[2 * i + 1])?).map_err(|_| bad())?;
        }
        Ok(EventKey(k))
    }
}

impl fmt::Debug for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EventKey({}/{}/{})",
            self.topic_hash(),
            self.bucket(),
            self.event_id()
        )
    }
}

/// The smallest key per topic of `keys` (what a scan cursor needs to hear of new keys).
#[must_use]
pub fn min_key_per_topic(keys: impl IntoIterator<Item = EventKey>) -> Vec<EventKey> {
    let mut m: std::collections::HashMap<TopicHash, EventKey> = std::collections::HashMap::new();
    for k in keys {
        m.entry(k.topic_hash())
            .and_modify(|v| *v = (*v).min(k))
            .or_insert(k);
    }
    m.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bucket_rules() {
        assert_eq!(bucket_of(-5, 10), Bucket(0));
        assert_eq!(bucket_of(0, 10), Bucket(0));
        assert_eq!(bucket_of(1234, 0), Bucket(1234));
        assert_eq!(bucket_of(1234, 1), Bucket(1234));
        assert_eq!(bucket_of(1234, 100), Bucket(12));
        assert_eq!(bucket_start_ms(Bucket(12), 100), 1200);
    }

    #[test]
    fn topic_hash_is_xxh64_seed0() {
        // Reference value of XXH64("", 0).
        assert_eq!(topic_hash(""), TopicHash(0xef46_db37_51d8_e999));
    }

    proptest! {
        #[test]
        fn the_hex_form_round_trips(k: [u8; 24]) {
            let key = EventKey(k);
            let text = key.to_string();
            prop_assert_eq!(text.len(), 48);
            prop_assert_eq!(EventKey::from_hex(&text), Ok(key));
            prop_assert_eq!(EventKey::from_hex(&text.to_uppercase()), Ok(key));
        }

        #[test]
        fn only_48_hex_digits_parse(s in "[0-9a-fA-F]{46,50}", bad in "[^0-9a-fA-F]", at: usize) {
            // The right length parses, any other length does not.
            prop_assert_eq!(EventKey::from_hex(&s).is_ok(), s.len() == 48);
            // One character that is not a hex digit spoils it.
            let mut chars: Vec<char> = s.chars().collect();
            let at = at % chars.len();
            chars[at] = bad.chars().next().unwrap_or('g');
            let spoiled: String = chars.into_iter().collect();
            prop_assert!(EventKey::from_hex(&spoiled).is_err());
        }
    }

    #[test]
    fn parse_rejects_wrong_lengths() {
        assert_eq!(EventKey::from_slice(&[0; 23]), Err(BadKeyLength(23)));
        assert_eq!(EventKey::from_slice(&[0; 25]), Err(BadKeyLength(25)));
        assert!(EventKey::from_slice(&[7; 24]).is_ok());
    }

    #[test]
    fn successor_carries() {
        let k = EventKey::new(TopicHash(1), Bucket(2), EventId(u64::MAX));
        assert_eq!(
            k.successor(),
            Some(EventKey::new(TopicHash(1), Bucket(3), EventId(0)))
        );
        assert_eq!(EventKey([0xff; 24]).successor(), None);
    }

    proptest! {
        #[test]
        fn parts_round_trip(h: u64, b: u64, id: u64) {
            let k = EventKey::new(TopicHash(h), Bucket(b), EventId(id));
            prop_assert_eq!((k.topic_hash().0, k.bucket().0, k.event_id().0), (h, b, id));
            prop_assert_eq!(EventKey::from_slice(&k.0).unwrap(), k);
        }

        #[test]
        fn order_is_topic_bucket_id(a: (u64, u64, u64), b: (u64, u64, u64)) {
            let ka = EventKey::new(TopicHash(a.0), Bucket(a.1), EventId(a.2));
            let kb = EventKey::new(TopicHash(b.0), Bucket(b.1), EventId(b.2));
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }

        #[test]
        fn due_range_holds_exactly_due_buckets(h: u64, b in 0u64..u64::MAX - 1, x: u64, id: u64) {
            // A key of topic h is below bucket_start(h, b + 1) iff its bucket is <= b.
            let k = EventKey::new(TopicHash(h), Bucket(x), EventId(id));
            let upper = EventKey::bucket_start(TopicHash(h), Bucket(b + 1));
            prop_assert_eq!(k < upper, x <= b);
            prop_assert!(k >= EventKey::topic_start(TopicHash(h)));
        }

        #[test]
        fn successor_is_next(k: [u8; 24]) {
            let k = EventKey(k);
            if let Some(s) = k.successor() {
                prop_assert!(s > k);
            }
        }
    }
}
