//! Ack levels, publish limits and the validation every batch passes before anything is stored.

use crate::message::{INDEXES_MAX, TOPIC_LEN_MAX};

/// How durable a batch must be before it is acknowledged. The numeric value grows as
/// durability weakens (`QUORUM=0 < LEADER=1 < NO_ACK=2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AckLevel {
    /// Standalone: fsynced. Cluster: committed by a majority and applied.
    Quorum = 0,
    /// Standalone: fsynced. Cluster: fsynced to the leader's Raft log.
    Leader = 1,
    /// Acknowledged once submitted; may be lost on a crash.
    NoAck = 2,
}

impl AckLevel {
    /// Maps the wire value; a value this build does not know counts as QUORUM.
    #[must_use]
    pub fn from_wire(v: i32) -> Self {
        match v {
            1 => AckLevel::Leader,
            2 => AckLevel::NoAck,
            _ => AckLevel::Quorum,
        }
    }

    /// The configuration spelling (`quorum`, `leader`, `noAck`).
    #[must_use]
    pub fn config_name(self) -> &'static str {
        match self {
            AckLevel::Quorum => "quorum",
            AckLevel::Leader => "leader",
            AckLevel::NoAck => "noAck",
        }
    }

    /// The metrics label (`quorum`, `leader`, `no_ack`).
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            AckLevel::Quorum => "quorum",
            AckLevel::Leader => "leader",
            AckLevel::NoAck => "no_ack",
        }
    }

    /// True when the level requires the batch to be durable before the ack.
    #[must_use]
    pub fn is_durable(self) -> bool {
        self != AckLevel::NoAck
    }
}

/// Limits a publish batch is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishLimits {
    /// Longest accepted `delay_ms`.
    pub max_delay_ms: i64,
    /// The weakest ack level the broker accepts.
    pub min_ack_level: AckLevel,
}

/// A client-caused reason to reject a batch. Its `Display` names the message and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// The batch holds no messages.
    #[error("PublishBatch.messages must not be empty")]
    NoMessages,
    /// The requested ack level is weaker than `publish.minAckLevel`.
    #[error("PublishBatch.ack_level {requested:?} is weaker than the broker minimum {floor:?} (publish.minAckLevel)")]
    AckLevelTooWeak {
        /// What the client asked for.
        requested: AckLevel,
        /// The configured floor.
        floor: AckLevel,
    },
    /// One field of one message is invalid.
    #[error("PublishBatch.messages[{index}].{field}: {reason}")]
    Field {
        /// Position of the message in the batch.
        index: usize,
        /// Field name as in the proto.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Checks the batch-level rules: at least one message, ack level not below the floor.
///
/// # Errors
/// The first rule broken.
pub fn validate_batch(
    message_count: usize,
    ack_level: AckLevel,
    limits: &PublishLimits,
) -> Result<(), ValidationError> {
    if message_count == 0 {
        return Err(ValidationError::NoMessages);
    }
    if ack_level > limits.min_ack_level {
        return Err(ValidationError::AckLevelTooWeak {
            requested: ack_level,
            floor: limits.min_ack_level,
        });
    }
    Ok(())
}

/// Checks a requested delay (a message's, a reschedule's): `0..=publish.maxDelay`.
///
/// # Errors
/// What is wrong, for a message naming the field.
pub fn check_delay(delay_ms: i64, limits: &PublishLimits) -> Result<(), String> {
    if delay_ms < 0 {
        return Err(format!("must be >= 0, got {delay_ms}"));
    }
    if delay_ms > limits.max_delay_ms {
        return Err(format!(
            "{delay_ms} exceeds publish.maxDelay ({} ms)",
            limits.max_delay_ms
        ));
    }
    Ok(())
}

/// Longest `dedup_id` in bytes.
pub const DEDUP_ID_LEN_MAX: usize = 256;

/// Checks a message's publish options: a dedup id of at most [`DEDUP_ID_LEN_MAX`] bytes; a
/// dead-letter topic that is a valid topic and not the message's own (its dead letters would
/// come back to it).
///
/// # Errors
/// The first invalid field, as [`ValidationError::Field`].
pub fn validate_options(
    index: usize,
    topic: &str,
    dedup_id: &str,
    dead_letter_topic: &str,
) -> Result<(), ValidationError> {
    let err = |field, reason: String| {
        Err(ValidationError::Field {
            index,
            field,
            reason,
        })
    };
    if dedup_id.starts_with('\0') {
        // Ids that start with NUL are the broker's own (dead letters' once-rows).
        return err("dedup_id", "must not start with a NUL character".into());
    }
    if let Err(reason) = check_len(dedup_id, DEDUP_ID_LEN_MAX) {
        return err("dedup_id", reason);
    }
    if let Err(reason) = check_len(dead_letter_topic, TOPIC_LEN_MAX) {
        return err("dead_letter_topic", reason);
    }
    if dead_letter_topic == topic {
        return err(
            "dead_letter_topic",
            "must not be the message's own topic".into(),
        );
    }
    Ok(())
}

/// Checks a topic name: 1..=[`TOPIC_LEN_MAX`] bytes.
///
/// # Errors
/// What is wrong, for a message naming the field.
pub fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("must not be empty".into());
    }
    check_len(topic, TOPIC_LEN_MAX)
}

/// At most `max` bytes.
fn check_len(s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!("is {} bytes, the limit is {max}", s.len()));
    }
    Ok(())
}

/// Checks one message of a batch.
///
/// # Errors
/// The first invalid field, as [`ValidationError::Field`].
pub fn validate_message(
    index: usize,
    topic: &str,
    delay_ms: i64,
    ttl_ms: i64,
    index_count: usize,
    limits: &PublishLimits,
) -> Result<(), ValidationError> {
    let err = |field, reason: String| {
        Err(ValidationError::Field {
            index,
            field,
            reason,
        })
    };
    if let Err(reason) = check_topic(topic) {
        return err("topic", reason);
    }
    if let Err(reason) = check_delay(delay_ms, limits) {
        return err("delay_ms", reason);
    }
    if ttl_ms < 0 {
        return err("ttl_ms", format!("must be >= 0, got {ttl_ms}"));
    }
    if index_count > INDEXES_MAX {
        return err(
            "indexes",
            format!("{index_count} indexes, the limit is {INDEXES_MAX}"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PublishLimits = PublishLimits {
        max_delay_ms: 1000,
        min_ack_level: AckLevel::Leader,
    };

    #[test]
    fn publish_options_are_checked() {
        let field = |r: Result<(), ValidationError>| match r {
            Err(ValidationError::Field { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert!(validate_options(0, "t", "order-1", "t.failed").is_ok());
        assert_eq!(field(validate_options(0, "t", "\0x", "")), "dedup_id");
        assert_eq!(
            field(validate_options(0, "t", &"d".repeat(257), "")),
            "dedup_id"
        );
        assert_eq!(
            field(validate_options(0, "t", "", "t")),
            "dead_letter_topic"
        );
        assert_eq!(
            field(validate_options(0, "t", "", &"q".repeat(256))),
            "dead_letter_topic"
        );
    }

    #[test]
    fn wire_mapping_defaults_to_quorum() {
        assert_eq!(AckLevel::from_wire(0), AckLevel::Quorum);
        assert_eq!(AckLevel::from_wire(1), AckLevel::Leader);
        assert_eq!(AckLevel::from_wire(2), AckLevel::NoAck);
        assert_eq!(AckLevel::from_wire(7), AckLevel::Quorum);
        assert_eq!(AckLevel::from_wire(-1), AckLevel::Quorum);
    }

    #[test]
    fn batch_rules() {
        assert_eq!(
            validate_batch(0, AckLevel::Quorum, &LIMITS),
            Err(ValidationError::NoMessages)
        );
        assert!(validate_batch(1, AckLevel::Leader, &LIMITS).is_ok());
        let e = validate_batch(1, AckLevel::NoAck, &LIMITS).unwrap_err();
        assert!(e.to_string().contains("publish.minAckLevel"), "{e}");
    }

    #[test]
    fn field_rules_name_index_and_field() {
        let cases = [
            ("", 0, 0, "messages[3].topic"),
            (&"x".repeat(256)[..], 0, 0, "messages[3].topic"),
            ("t", -1, 0, "messages[3].delay_ms"),
            ("t", 1001, 0, "messages[3].delay_ms"),
            ("t", 0, -5, "messages[3].ttl_ms"),
        ];
        for (topic, d, t, want) in cases {
            let e = validate_message(3, topic, d, t, 0, &LIMITS).unwrap_err();
            assert!(e.to_string().contains(want), "{e} should name {want}");
        }
        assert!(validate_message(0, &"x".repeat(255), 1000, 0, 3, &LIMITS).is_ok());
    }
}
