//! The wire format of requests forwarded to a group's leader over the peer link, and of
//! their replies (see `forward` for who sends and serves them).
//!
//! # Invariants
//! - A decoder takes any bytes: anything malformed is `None` (a request) or a failed outcome
//!   (a reply), never a panic.

use futureq_core::refusal::{Outcome, WriteError};
use futureq_core::KEY_LEN;

/// Peer-frame group id of the metadata group.
pub const META_GROUP: u8 = 0;
/// Peer-frame group id of the event shard.
pub const EVENT_GROUP: u8 = 1;
/// Peer-frame kind of a request forwarded to a group's leader (see [`Forward`]).
pub const KIND_FORWARD: u8 = 4;
/// A request forwarded to a group's leader over the peer link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// `client_write(command)`.
    Write(Vec<u8>),
    /// Add a learner (non-blocking).
    AddLearner(u64, String),
    /// Promote a learner to voter.
    AddVoter(u64),
    /// Remove a node (voter or learner) from the group.
    Remove(u64),
    /// Delete these event keys (ACKs and TTL expiry of a node that stopped leading): the
    /// only request the event shard takes over the peer port. The leader builds the delete
    /// command itself, so a peer frame can never commit bytes of its own choosing.
    Delete(Vec<[u8; KEY_LEN]>),
}

impl Forward {
    /// Encodes the request (op byte, then its fields, little-endian).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Forward::Write(c) => {
                out.push(1);
                out.extend_from_slice(c);
            }
            Forward::AddLearner(id, addr) => {
                out.push(2);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(addr.as_bytes());
            }
            Forward::AddVoter(id) => {
                out.push(3);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Forward::Remove(id) => {
                out.push(4);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Forward::Delete(keys) => {
                out.push(5);
                for k in keys {
                    out.extend_from_slice(k);
                }
            }
        }
        out
    }

    /// Decodes a forwarded request; `None` for anything malformed.
    #[must_use]
    pub fn decode(b: &[u8]) -> Option<Forward> {
        let (&op, rest) = b.split_first()?;
        let id = || {
            rest.get(..8)
                .map(|x| u64::from_le_bytes(x.try_into().unwrap_or([0; 8])))
        };
        match op {
            1 => Some(Forward::Write(rest.to_vec())),
            2 => Some(Forward::AddLearner(
                id()?,
                String::from_utf8(rest.get(8..)?.to_vec()).ok()?,
            )),
            3 if rest.len() == 8 => Some(Forward::AddVoter(id()?)),
            4 if rest.len() == 8 => Some(Forward::Remove(id()?)),
            5 if !rest.is_empty() && rest.len() % KEY_LEN == 0 => Some(Forward::Delete(
                rest.chunks_exact(KEY_LEN)
                    .map(|k| {
                        let mut key = [0u8; KEY_LEN];
                        key.copy_from_slice(k);
                        key
                    })
                    .collect(),
            )),
            _ => None,
        }
    }
}

pub(super) fn encode_outcome(r: &Result<(), WriteError>) -> Vec<u8> {
    match r {
        Ok(()) => vec![0],
        Err(WriteError::NotLeader { leader }) => {
            let mut v = vec![1];
            v.extend_from_slice(&leader.unwrap_or(0).to_le_bytes());
            v
        }
        Err(WriteError::Timeout) => vec![2],
        Err(WriteError::Failed { outcome, cause }) => {
            // 3: outcome unknown (what every version reads); 5 and 6 name the others.
            let mut v = vec![match outcome {
                Outcome::Unknown => 3,
                Outcome::NotStored => 5,
                Outcome::Stored => 6,
            }];
            v.extend_from_slice(cause.as_bytes());
            v
        }
        Err(WriteError::Refused(m)) => {
            let mut v = vec![4];
            v.extend_from_slice(m.as_bytes());
            v
        }
    }
}

pub(super) fn decode_outcome(b: &[u8]) -> Result<(), WriteError> {
    match b.split_first() {
        Some((0, _)) => Ok(()),
        Some((1, rest)) if rest.len() == 8 => {
            let id = u64::from_le_bytes(rest.try_into().unwrap_or([0; 8]));
            Err(WriteError::NotLeader {
                leader: (id != 0).then_some(id),
            })
        }
        Some((2, _)) => Err(WriteError::Timeout),
        Some((4, m)) => Err(WriteError::Refused(String::from_utf8_lossy(m).into_owned())),
        Some((code @ (3 | 5 | 6), m)) => Err(WriteError::Failed {
            outcome: match code {
                5 => Outcome::NotStored,
                6 => Outcome::Stored,
                _ => Outcome::Unknown,
            },
            cause: String::from_utf8_lossy(m).into_owned(),
        }),
        _ => Err(WriteError::failed("malformed forwarded reply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_round_trips_and_rejects_garbage() {
        for f in [
            Forward::Write(vec![1, 2, 3]),
            Forward::Write(vec![]),
            Forward::AddLearner(7, "127.0.0.1:5000".into()),
            Forward::AddVoter(u64::MAX),
            Forward::Remove(3),
            Forward::Delete(vec![[7; KEY_LEN], [9; KEY_LEN]]),
        ] {
            assert_eq!(Forward::decode(&f.encode()), Some(f));
        }
        for bad in [
            &[][..],
            &[0],
            &[2, 1],
            &[3, 1, 2],
            &[4; 10],
            &[9, 0],
            &[5],
            &[5; 24],
        ] {
            assert_eq!(Forward::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn outcomes_round_trip() {
        for r in [
            Ok(()),
            Err(WriteError::NotLeader { leader: Some(3) }),
            Err(WriteError::NotLeader { leader: None }),
            Err(WriteError::Timeout),
            Err(WriteError::failed("boom")),
            Err(WriteError::not_taken("not taken")),
            Err(WriteError::Failed {
                outcome: Outcome::Stored,
                cause: "stored".into(),
            }),
            Err(WriteError::Refused("stale ids".into())),
        ] {
            assert_eq!(decode_outcome(&encode_outcome(&r)), r);
        }
        assert!(decode_outcome(&[]).is_err());
        assert!(decode_outcome(&[1, 0]).is_err());
    }
}
