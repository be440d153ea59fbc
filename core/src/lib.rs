//! futureq-core: the broker's logic with no I/O, no clock and no runtime.
//!
//! Everything here is synchronous and deterministic; time is passed in as Unix
//! milliseconds. The glommio/redb/h2 glue lives in other crates and calls into this one.
//!
//! Layout:
//! - [`command`]: replicated event-shard commands (rkyv archives, validated on access).
//! - [`key`]: the 24-byte event key (`topicHash · bucket · eventId`) and its range bounds.
//! - [`metadata`]: the metadata group's state machine (topology, address registry).
//! - [`message`]: the stored message and its versioned binary encoding.
//! - [`publish`]: ack levels, publish limits and per-message validation.
//! - [`hub`]: consumers, groups, in-flight tracking, redelivery and the scan cursor per topic.
//! - [`deleter`]: the batched, retry-safe queue of acknowledged keys awaiting deletion.
//! - [`refusal`]: why a request was refused and what became of its write, typed to the wire.
//!
//! # Invariants
//! - A message is never handed to a consumer before `enqueued_at + delay` nor after its TTL.
//! - Keys sort byte-wise as topic → bucket → id; a scan of due messages never needs a key
//!   of a later bucket than `bucket(now)`.
//! - Every queue and map that grows with traffic has a named bound.

pub mod command;
pub mod deleter;
mod envelope;
mod fast;
pub mod hub;
pub mod key;
pub mod message;
pub mod metadata;
pub mod publish;
pub mod refusal;

pub use envelope::EnvelopeError;
pub use key::{bucket_of, topic_hash, BadKeyText, Bucket, EventId, EventKey, TopicHash, KEY_LEN};
pub use message::{DecodeError, DelayMs, Extras, IndexValue, StoredMessage, TtlMs};
pub use publish::{AckLevel, ValidationError};
