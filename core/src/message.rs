//! The stored message and its versioned binary encoding.
//!
//! Layout of version 1 (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version = 1 |
//! | 8 | `enqueued_at_ms` (i64) |
//! | 8 | `delay_ms` (i64) |
//! | 8 | `ttl_ms` (i64, 0 = never expires) |
//! | 2 + n | topic: u16 length, UTF-8 bytes |
//! | 2 | index count (u16) |
//! | … | per index: u8 kind (1 = int64, 2 = string); int64: 8 bytes; string: u32 length + UTF-8 |
//! | 4 + n | payload: u32 length, bytes |
//!
//! Version 2 is version 1 with the [`Extras`] between the indexes and the payload:
//!
//! | bytes | field |
//! |---|---|
//! | 2 + n | `dedup_id`: u16 length, UTF-8 |
//! | 8 | `dedup_until_ms` (i64) |
//! | 4 | `max_attempts` (u32) |
//! | 2 + n | `dead_letter_topic`: u16 length, UTF-8 |
//! | 2 + n | `origin_topic`: u16 length, UTF-8 |
//! | 2 + n | `origin_group`: u16 length, UTF-8 |
//!
//! A message whose extras are all default is encoded as version 1, byte for byte as before
//! version 2 existed. Nothing may follow the payload. Decoding never panics and never
//! allocates more than the input holds.

use bytes::{BufMut, Bytes, BytesMut};

/// Encoding version of a message without extras.
pub const FORMAT_VERSION: u8 = 1;
/// Encoding version of a message with [`Extras`].
pub const FORMAT_VERSION_EXTRAS: u8 = 2;
/// Longest dedup id, dead-letter topic or origin field in bytes (each has a u16 length; the
/// API's own limits are lower).
pub const EXTRA_LEN_MAX: usize = u16::MAX as usize;
/// Longest topic in bytes (the API contract says 1..=255).
pub const TOPIC_LEN_MAX: usize = 255;
/// Most indexes one message may carry (bounded by the u16 count).
pub const INDEXES_MAX: usize = u16::MAX as usize;

const KIND_INT64: u8 = 1;
const KIND_STRING: u8 = 2;

/// A secondary index value carried with a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IndexValue {
    /// `Index.int64_value`.
    Int64(i64),
    /// `Index.string_value`.
    String(String),
}

impl IndexValue {
    /// The bytes this index contributes to an index-table key: a kind byte, then an
    /// order-preserving encoding of the value (sign-flipped big-endian for integers).
    #[must_use]
    pub fn index_key(&self) -> Vec<u8> {
        match self {
            IndexValue::Int64(v) => {
                let mut out = Vec::with_capacity(9);
                out.push(KIND_INT64);
                out.extend_from_slice(&((*v as u64) ^ (1 << 63)).to_be_bytes());
                out
            }
            IndexValue::String(s) => {
                let mut out = Vec::with_capacity(1 + s.len());
                out.push(KIND_STRING);
                out.extend_from_slice(s.as_bytes());
                out
            }
        }
    }
}

/// A message's requested delay in milliseconds (>= 0 once validated): it falls due this
/// long after it was enqueued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DelayMs(pub i64);

/// A message's time to live in milliseconds (>= 0 once validated); [`TtlMs::NEVER`] (0):
/// it never expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TtlMs(pub i64);

impl TtlMs {
    /// No expiry.
    pub const NEVER: TtlMs = TtlMs(0);

    /// The expiry instant (Unix ms) of a message enqueued at `enqueued_at_ms`, if it has one.
    #[must_use]
    pub fn expiry(self, enqueued_at_ms: i64) -> Option<i64> {
        (self.0 > 0).then(|| enqueued_at_ms.saturating_add(self.0))
    }
}

/// Suffix of a message's default dead-letter topic.
const DEAD_LETTER_SUFFIX: &str = ".dlq";

/// The topic a message's dead letters go to: the one it names, else `<topic>.dlq` (which may
/// be longer than [`TOPIC_LEN_MAX`]: callers check, with [`dead_letter_topic_len`]).
#[must_use]
pub fn dead_letter_topic(topic: &str, named: &str) -> String {
    if named.is_empty() {
        format!("{topic}{DEAD_LETTER_SUFFIX}")
    } else {
        named.to_owned()
    }
}

/// The length of [`dead_letter_topic`], without building it (the dispatcher asks on every
/// delivery).
#[must_use]
pub fn dead_letter_topic_len(topic: &str, named: &str) -> usize {
    if named.is_empty() {
        topic.len() + DEAD_LETTER_SUFFIX.len()
    } else {
        named.len()
    }
}

/// What a message may carry beyond version 1: publish options and a dead letter's origin.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Extras {
    /// The publisher's idempotency key ("" = none).
    pub dedup_id: String,
    /// Until when (Unix ms) a publish of the same dedup id stores nothing (0 = no dedup id).
    pub dedup_until_ms: i64,
    /// Deliveries per recipient before it gives up (0 = `delivery.maxAttempts`).
    pub max_attempts: u32,
    /// Where a recipient that gives up sends its copy ("" = `<topic>.dlq`).
    pub dead_letter_topic: String,
    /// On a dead-lettered copy: the topic it came from ("" otherwise).
    pub origin_topic: String,
    /// On a dead-lettered copy: the group that gave up ("" = the universal consumer).
    pub origin_group: String,
}

impl Extras {
    fn is_default(&self) -> bool {
        *self == Extras::default()
    }

    fn encoded_len(&self) -> usize {
        2 + self.dedup_id.len()
            + 8
            + 4
            + 2
            + self.dead_letter_topic.len()
            + 2
            + self.origin_topic.len()
            + 2
            + self.origin_group.len()
    }
}

/// A message as the broker stores it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredMessage {
    /// Topic, 1..=255 bytes of UTF-8.
    pub topic: String,
    /// Opaque payload.
    pub payload: Bytes,
    /// Broker wall clock (Unix ms) when the batch was received.
    pub enqueued_at_ms: i64,
    /// Requested delay.
    pub delay: DelayMs,
    /// Time to live.
    pub ttl: TtlMs,
    /// Secondary indexes.
    pub indexes: Vec<IndexValue>,
    /// Publish options and dead-letter origin (all default for most messages).
    pub extras: Extras,
}

/// Why stored bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended inside a field.
    #[error("stored message truncated while reading {0}")]
    Truncated(&'static str),
    /// The version byte is not one this build knows.
    #[error("unknown stored message version {0}")]
    UnknownVersion(u8),
    /// A string field is not UTF-8.
    #[error("stored message {0} is not valid UTF-8")]
    BadUtf8(&'static str),
    /// An index kind byte is unknown.
    #[error("unknown index kind {0}")]
    BadIndexKind(u8),
    /// Bytes follow the payload.
    #[error("{0} trailing bytes after stored message")]
    Trailing(usize),
}

impl StoredMessage {
    /// The instant (Unix ms) at which the message falls due.
    #[must_use]
    pub fn due_at_ms(&self) -> i64 {
        self.enqueued_at_ms.saturating_add(self.delay.0)
    }

    /// The instant (Unix ms) at which the message expires, if it has a TTL.
    #[must_use]
    pub fn expires_at_ms(&self) -> Option<i64> {
        self.ttl.expiry(self.enqueued_at_ms)
    }

    /// True when the TTL has passed at `now_ms`.
    #[must_use]
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms().is_some_and(|e| now_ms >= e)
    }

    /// Encodes the message.
    ///
    /// # Panics
    /// When the topic or an index string exceeds its length field; validation
    /// ([`crate::publish::validate_message`]) rules this out for every accepted message.
    #[must_use]
    pub fn encode(&self) -> Bytes {
        let idx_len: usize = self
            .indexes
            .iter()
            .map(|i| match i {
                IndexValue::Int64(_) => 9,
                IndexValue::String(s) => 5 + s.len(),
            })
            .sum();
        let v2 = !self.extras.is_default();
        let extras_len = if v2 { self.extras.encoded_len() } else { 0 };
        let mut b = BytesMut::with_capacity(
            1 + 24 + 2 + self.topic.len() + 2 + idx_len + extras_len + 4 + self.payload.len(),
        );
        b.put_u8(if v2 {
            FORMAT_VERSION_EXTRAS
        } else {
            FORMAT_VERSION
        });
        b.put_i64_le(self.enqueued_at_ms);
        b.put_i64_le(self.delay.0);
        b.put_i64_le(self.ttl.0);
        let tl = u16::try_from(self.topic.len()).expect("topic length validated");
        b.put_u16_le(tl);
        b.put_slice(self.topic.as_bytes());
        let n = u16::try_from(self.indexes.len()).expect("index count validated");
        b.put_u16_le(n);
        for i in &self.indexes {
            match i {
                IndexValue::Int64(v) => {
                    b.put_u8(KIND_INT64);
                    b.put_i64_le(*v);
                }
                IndexValue::String(s) => {
                    b.put_u8(KIND_STRING);
                    b.put_u32_le(u32::try_from(s.len()).expect("index length validated"));
                    b.put_slice(s.as_bytes());
                }
            }
        }
        if v2 {
            let x = &self.extras;
            let short = |b: &mut BytesMut, s: &str| {
                b.put_u16_le(u16::try_from(s.len()).expect("extra field length validated"));
                b.put_slice(s.as_bytes());
            };
            short(&mut b, &x.dedup_id);
            b.put_i64_le(x.dedup_until_ms);
            b.put_u32_le(x.max_attempts);
            short(&mut b, &x.dead_letter_topic);
            short(&mut b, &x.origin_topic);
            short(&mut b, &x.origin_group);
        }
        b.put_u32_le(u32::try_from(self.payload.len()).expect("payload length validated"));
        b.put_slice(&self.payload);
        b.freeze()
    }

    /// The due instant of encoded bytes (enqueue time + delay), read in place without
    /// decoding the rest (`None` when the bytes are not a record of a known version that far).
    #[must_use]
    pub fn due_of(buf: &[u8]) -> Option<i64> {
        if !matches!(buf.first(), Some(&(FORMAT_VERSION | FORMAT_VERSION_EXTRAS))) {
            return None;
        }
        let word = |at: usize| -> Option<i64> {
            Some(i64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
        };
        Some(word(1)?.saturating_add(word(9)?))
    }

    /// The topic of encoded bytes, read in place without decoding the rest (`None` when the
    /// bytes are not a record of a known version that far).
    #[must_use]
    pub fn topic_of(buf: &[u8]) -> Option<&str> {
        const AT: usize = 1 + 24;
        if !matches!(buf.first(), Some(&(FORMAT_VERSION | FORMAT_VERSION_EXTRAS))) {
            return None;
        }
        let len = u16::from_le_bytes(buf.get(AT..AT + 2)?.try_into().ok()?);
        std::str::from_utf8(buf.get(AT + 2..AT + 2 + usize::from(len))?).ok()
    }

    /// Decodes untrusted stored bytes; the payload shares `buf`'s memory.
    ///
    /// # Errors
    /// [`DecodeError`] for anything but a complete, well-formed version-1 record.
    pub fn decode(buf: &Bytes) -> Result<Self, DecodeError> {
        let (mut m, payload) = Self::decode_borrowed(buf)?;
        m.payload = buf.slice_ref(payload);
        Ok(m)
    }

    /// Decodes untrusted stored bytes without copying them: the message with an empty
    /// payload, and its payload as a slice of `buf` (for readers that need everything but
    /// the payload, such as the store's deletes).
    ///
    /// # Errors
    /// As [`StoredMessage::decode`].
    pub fn decode_borrowed(buf: &[u8]) -> Result<(Self, &[u8]), DecodeError> {
        let mut r = Reader { buf, pos: 0 };
        let version = r.u8("version")?;
        if version != FORMAT_VERSION && version != FORMAT_VERSION_EXTRAS {
            return Err(DecodeError::UnknownVersion(version));
        }
        let enqueued_at_ms = r.i64("enqueued_at")?;
        let delay = DelayMs(r.i64("delay")?);
        let ttl = TtlMs(r.i64("ttl")?);
        let tl = usize::from(r.u16("topic length")?);
        let topic = r.string(tl, "topic")?;
        let n = usize::from(r.u16("index count")?);
        // Each index takes at least 5 bytes: never reserve more than the input could hold.
        let mut indexes = Vec::with_capacity(n.min(r.remaining() / 5));
        for _ in 0..n {
            match r.u8("index kind")? {
                KIND_INT64 => indexes.push(IndexValue::Int64(r.i64("index value")?)),
                KIND_STRING => {
                    let len = r.u32("index length")? as usize;
                    indexes.push(IndexValue::String(r.string(len, "index value")?));
                }
                k => return Err(DecodeError::BadIndexKind(k)),
            }
        }
        let extras = if version == FORMAT_VERSION_EXTRAS {
            let mut short = |what| -> Result<String, DecodeError> {
                let n = usize::from(r.u16(what)?);
                r.string(n, what)
            };
            let dedup_id = short("dedup id")?;
            let dedup_until_ms = r.i64("dedup until")?;
            let max_attempts = r.u32("max attempts")?;
            let mut short = |what| -> Result<String, DecodeError> {
                let n = usize::from(r.u16(what)?);
                r.string(n, what)
            };
            let x = Extras {
                dedup_id,
                dedup_until_ms,
                max_attempts,
                dead_letter_topic: short("dead letter topic")?,
                origin_topic: short("origin topic")?,
                origin_group: short("origin group")?,
            };
            if x.is_default() {
                // Version 2 is only written for a message with extras: one encoding each.
                return Err(DecodeError::UnknownVersion(version));
            }
            x
        } else {
            Extras::default()
        };
        let pl = r.u32("payload length")? as usize;
        let payload = r.take(pl, "payload")?;
        if r.remaining() != 0 {
            return Err(DecodeError::Trailing(r.remaining()));
        }
        let m = StoredMessage {
            topic,
            payload: Bytes::new(),
            enqueued_at_ms,
            delay,
            ttl,
            indexes,
            extras,
        };
        Ok((m, payload))
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(i64::from_le_bytes(a))
    }

    fn string(&mut self, n: usize, what: &'static str) -> Result<String, DecodeError> {
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| DecodeError::BadUtf8(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_topics_length_is_known_without_building_it() {
        for (topic, named) in [("orders", ""), ("orders", "poison"), ("", "")] {
            assert_eq!(
                dead_letter_topic_len(topic, named),
                dead_letter_topic(topic, named).len()
            );
        }
    }
    use proptest::prelude::*;

    fn arb_index() -> impl Strategy<Value = IndexValue> {
        prop_oneof![
            any::<i64>().prop_map(IndexValue::Int64),
            ".{0,20}".prop_map(IndexValue::String),
        ]
    }

    fn arb_msg() -> impl Strategy<Value = StoredMessage> {
        (
            "[a-z./-]{1,40}",
            proptest::collection::vec(any::<u8>(), 0..300),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            proptest::collection::vec(arb_index(), 0..5),
            proptest::option::of(arb_extras()),
        )
            .prop_map(|(topic, payload, e, d, t, indexes, extras)| StoredMessage {
                topic,
                payload: Bytes::from(payload),
                enqueued_at_ms: e,
                delay: DelayMs(d),
                ttl: TtlMs(t),
                indexes,
                extras: extras.unwrap_or_default(),
            })
    }

    fn arb_extras() -> impl Strategy<Value = Extras> {
        (
            ".{0,12}",
            any::<i64>(),
            any::<u32>(),
            ".{0,12}",
            ".{0,12}",
            ".{0,12}",
        )
            .prop_map(
                |(dedup_id, dedup_until_ms, max_attempts, dl, ot, og)| Extras {
                    dedup_id,
                    dedup_until_ms,
                    max_attempts,
                    dead_letter_topic: dl,
                    origin_topic: ot,
                    origin_group: og,
                },
            )
    }

    proptest! {
        #[test]
        fn round_trip(m in arb_msg()) {
            let enc = m.encode();
            let v1 = m.extras == Extras::default();
            prop_assert_eq!(enc[0], if v1 { FORMAT_VERSION } else { FORMAT_VERSION_EXTRAS });
            prop_assert_eq!(StoredMessage::topic_of(&enc), Some(m.topic.as_str()));
            prop_assert_eq!(StoredMessage::due_of(&enc), Some(m.due_at_ms()));
            prop_assert_eq!(StoredMessage::decode(&enc).unwrap(), m.clone());
            let (mut borrowed, payload) = StoredMessage::decode_borrowed(&enc).unwrap();
            prop_assert_eq!(payload, &m.payload[..]);
            prop_assert!(borrowed.payload.is_empty());
            borrowed.payload = m.payload.clone();
            prop_assert_eq!(borrowed, m);
        }

        #[test]
        fn every_truncation_is_an_error(m in arb_msg()) {
            let enc = m.encode();
            for cut in 0..enc.len() {
                prop_assert!(StoredMessage::decode(&enc.slice(..cut)).is_err());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = (StoredMessage::topic_of(&b), StoredMessage::due_of(&b));
            let _ = StoredMessage::decode(&Bytes::from(b));
        }

        #[test]
        fn int_index_keys_keep_order(a: i64, b: i64) {
            let ka = IndexValue::Int64(a).index_key();
            let kb = IndexValue::Int64(b).index_key();
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }
    }

    #[test]
    fn trailing_and_version_are_rejected() {
        let m = StoredMessage {
            topic: "t".into(),
            payload: Bytes::from_static(b"p"),
            enqueued_at_ms: 1,
            delay: DelayMs(2),
            ttl: TtlMs::NEVER,
            indexes: vec![],
            extras: Extras::default(),
        };
        let mut v = m.encode().to_vec();
        v.push(0);
        assert_eq!(
            StoredMessage::decode(&Bytes::from(v.clone())),
            Err(DecodeError::Trailing(1))
        );
        v[0] = 9;
        assert_eq!(
            StoredMessage::decode(&Bytes::from(v.clone())),
            Err(DecodeError::UnknownVersion(9))
        );
        // Version 2 with every extra at its default is not an encoding anyone writes.
        v.pop();
        v[0] = FORMAT_VERSION_EXTRAS;
        let at = v.len() - 5;
        v.splice(at..at, vec![0u8; 2 + 8 + 4 + 2 + 2 + 2]);
        assert_eq!(
            StoredMessage::decode(&Bytes::from(v)),
            Err(DecodeError::UnknownVersion(2))
        );
    }

    #[test]
    fn due_and_expiry() {
        let m = StoredMessage {
            topic: "t".into(),
            payload: Bytes::new(),
            enqueued_at_ms: 1000,
            delay: DelayMs(50),
            ttl: TtlMs(100),
            indexes: vec![],
            extras: Extras::default(),
        };
        assert_eq!(m.due_at_ms(), 1050);
        assert_eq!(m.expires_at_ms(), Some(1100));
        assert!(!m.is_expired(1099));
        assert!(m.is_expired(1100));
        let forever = StoredMessage {
            ttl: TtlMs::NEVER,
            ..m
        };
        assert!(!forever.is_expired(i64::MAX));
    }
}
