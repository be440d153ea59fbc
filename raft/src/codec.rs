//! Byte encodings of openraft's entries and votes, for our log and vote file.
//!
//! Entry, version 1 (integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version = 1 |
//! | 8 + 8 + 8 | log id: term, leader node id, index |
//! | 1 | payload kind: 0 blank, 1 normal, 2 membership |
//! | … | normal: the command bytes (to the end); membership: u32 config count, each a u32 count of u64 voter ids; u32 node count, each u64 id · u32 length · address |
//!
//! Vote, version 1: `version · term · node id · committed (u8)`.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use openraft::impls::leader_id_adv::LeaderId;
use openraft::{BasicNode, EntryPayload, LogId, Membership, StoredMembership};

use crate::types::{Command, Entry, Vote};

/// Format version of encoded entries and votes.
pub const CODEC_VERSION: u8 = 1;

/// Bytes that are not an entry or a vote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable {what}: {reason}")]
pub struct CodecError {
    what: &'static str,
    reason: String,
}

impl CodecError {
    /// Input that ended too early.
    pub(crate) fn truncated(what: &'static str) -> Self {
        CodecError {
            what,
            reason: "truncated".into(),
        }
    }
}

pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn err(&self, reason: impl Into<String>) -> CodecError {
        CodecError {
            what: self.what,
            reason: reason.into(),
        }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.b.len() < n {
            return Err(self.err("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, CodecError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, CodecError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A count of items of at least `min_item` bytes each, checked against what is left
    /// before anything is allocated.
    pub(crate) fn count(&mut self, min_item: usize) -> Result<usize, CodecError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.b.len() {
            return Err(self.err("count larger than the input"));
        }
        Ok(n)
    }
}

/// A reader positioned after a checked version byte.
pub(crate) fn start<'a>(what: &'static str, b: &'a [u8]) -> Result<Reader<'a>, CodecError> {
    let mut r = Reader { b, what };
    let v = r.u8()?;
    if v != CODEC_VERSION {
        return Err(r.err(format!("version {v}")));
    }
    Ok(r)
}

/// Refuses bytes left after a complete value.
pub(crate) fn finish(r: &Reader<'_>) -> Result<(), CodecError> {
    if r.b.is_empty() {
        Ok(())
    } else {
        Err(r.err("trailing bytes"))
    }
}

pub(crate) fn put_vote(out: &mut Vec<u8>, v: &Vote) {
    out.extend_from_slice(&v.leader_id.term.to_le_bytes());
    out.extend_from_slice(&v.leader_id.node_id.to_le_bytes());
    out.push(u8::from(v.committed));
}

pub(crate) fn get_vote(r: &mut Reader<'_>) -> Result<Vote, CodecError> {
    let term = r.u64()?;
    let node_id = r.u64()?;
    let committed = match r.u8()? {
        0 => false,
        1 => true,
        x => return Err(r.err(format!("committed flag {x}"))),
    };
    Ok(Vote {
        leader_id: LeaderId { term, node_id },
        committed,
    })
}

/// Encodes an entry.
#[must_use]
pub fn encode_entry(e: &Entry) -> Vec<u8> {
    let mut out = Vec::new();
    put_entry(&mut out, e);
    out
}

/// Appends an encoded entry to `out`.
pub(crate) fn put_entry(out: &mut Vec<u8>, e: &Entry) {
    let command = match &e.payload {
        EntryPayload::Normal(c) => c.0.len(),
        _ => 64,
    };
    out.reserve(ENTRY_HEADER_LEN + command);
    out.push(CODEC_VERSION);
    out.extend_from_slice(&e.log_id.leader_id.term.to_le_bytes());
    out.extend_from_slice(&e.log_id.leader_id.node_id.to_le_bytes());
    out.extend_from_slice(&e.log_id.index.to_le_bytes());
    match &e.payload {
        EntryPayload::Blank => out.push(0),
        EntryPayload::Normal(c) => {
            out.push(1);
            out.extend_from_slice(&c.0);
        }
        EntryPayload::Membership(m) => {
            out.push(2);
            put_membership(out, m);
        }
    }
}

pub(crate) fn put_membership(out: &mut Vec<u8>, m: &Membership<u64, BasicNode>) {
    {
        {
            let configs = m.get_joint_config();
            out.extend_from_slice(
                &u32::try_from(configs.len())
                    .unwrap_or(u32::MAX)
                    .to_le_bytes(),
            );
            for c in configs {
                out.extend_from_slice(&u32::try_from(c.len()).unwrap_or(u32::MAX).to_le_bytes());
                for id in c {
                    out.extend_from_slice(&id.to_le_bytes());
                }
            }
            let nodes: Vec<_> = m.nodes().collect();
            out.extend_from_slice(&u32::try_from(nodes.len()).unwrap_or(u32::MAX).to_le_bytes());
            for (id, n) in nodes {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(
                    &u32::try_from(n.addr.len())
                        .unwrap_or(u32::MAX)
                        .to_le_bytes(),
                );
                out.extend_from_slice(n.addr.as_bytes());
            }
        }
    }
}

pub(crate) fn get_membership(r: &mut Reader<'_>) -> Result<Membership<u64, BasicNode>, CodecError> {
    let n_configs = r.count(4)?;
    let mut configs = Vec::with_capacity(n_configs);
    for _ in 0..n_configs {
        let n = r.count(8)?;
        let mut set = BTreeSet::new();
        for _ in 0..n {
            set.insert(r.u64()?);
        }
        configs.push(set);
    }
    let n_nodes = r.count(12)?;
    let mut nodes = BTreeMap::new();
    for _ in 0..n_nodes {
        let id = r.u64()?;
        let len = r.u32()? as usize;
        let addr =
            String::from_utf8(r.take(len)?.to_vec()).map_err(|_| r.err("address is not UTF-8"))?;
        nodes.insert(id, BasicNode { addr });
    }
    Membership::new(configs, nodes).map_err(|e| r.err(e.to_string()))
}

/// Bytes of an entry before a normal entry's command: version, term, node id, index, kind.
const ENTRY_HEADER_LEN: usize = 1 + 8 + 8 + 8 + 1;

/// The term and the command of an encoded normal entry, read at fixed offsets (no decode);
/// `None` for other entries and for bytes too short to be one.
#[must_use]
pub fn normal_entry_command(b: &[u8]) -> Option<(u64, &[u8])> {
    if b.len() < ENTRY_HEADER_LEN || b[0] != CODEC_VERSION || b[ENTRY_HEADER_LEN - 1] != 1 {
        return None;
    }
    let term = u64::from_le_bytes(b[1..9].try_into().ok()?);
    Some((term, &b[ENTRY_HEADER_LEN..]))
}

/// Decodes an entry from untrusted bytes; a command is a slice of `b` (no copy).
///
/// # Errors
/// [`CodecError`] for anything but a complete, well-formed entry.
pub fn decode_entry(b: &Bytes) -> Result<Entry, CodecError> {
    let mut r = start("entry", b)?;
    let term = r.u64()?;
    let node_id = r.u64()?;
    let index = r.u64()?;
    let payload = match r.u8()? {
        0 => EntryPayload::Blank,
        1 => {
            let rest = std::mem::take(&mut r.b);
            EntryPayload::Normal(Command(b.slice_ref(rest)))
        }
        2 => EntryPayload::Membership(get_membership(&mut r)?),
        k => return Err(r.err(format!("payload kind {k}"))),
    };
    finish(&r)?;
    Ok(Entry {
        log_id: LogId {
            leader_id: LeaderId { term, node_id },
            index,
        },
        payload,
    })
}

/// A log id of [`crate::types::TypeConfig`].
pub type RaftLogId = LogId<LeaderId<u64, u64>>;
/// A stored membership of [`crate::types::TypeConfig`].
pub type RaftMembership = StoredMembership<LeaderId<u64, u64>, u64, BasicNode>;

pub(crate) fn put_log_id(out: &mut Vec<u8>, id: Option<&RaftLogId>) {
    match id {
        None => out.push(0),
        Some(id) => {
            out.push(1);
            out.extend_from_slice(&id.leader_id.term.to_le_bytes());
            out.extend_from_slice(&id.leader_id.node_id.to_le_bytes());
            out.extend_from_slice(&id.index.to_le_bytes());
        }
    }
}

pub(crate) fn get_log_id(r: &mut Reader<'_>) -> Result<Option<RaftLogId>, CodecError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(LogId {
            leader_id: LeaderId {
                term: r.u64()?,
                node_id: r.u64()?,
            },
            index: r.u64()?,
        })),
        x => Err(r.err(format!("log id flag {x}"))),
    }
}

/// Encodes an optional log id (the applied position).
#[must_use]
pub fn encode_log_id(id: Option<&RaftLogId>) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    put_log_id(&mut out, id);
    out
}

/// Decodes an optional log id.
///
/// # Errors
/// [`CodecError`] for anything else.
pub fn decode_log_id(b: &[u8]) -> Result<Option<RaftLogId>, CodecError> {
    let mut r = start("log id", b)?;
    let id = get_log_id(&mut r)?;
    finish(&r)?;
    Ok(id)
}

/// Encodes the last applied membership with the log id that carried it.
#[must_use]
pub fn encode_membership(m: &RaftMembership) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    put_log_id(&mut out, m.log_id().as_ref());
    put_membership(&mut out, m.membership());
    out
}

/// Decodes a stored membership.
///
/// # Errors
/// [`CodecError`] for anything else.
pub fn decode_membership(b: &[u8]) -> Result<RaftMembership, CodecError> {
    let mut r = start("membership", b)?;
    let id = get_log_id(&mut r)?;
    let m = get_membership(&mut r)?;
    finish(&r)?;
    Ok(StoredMembership::new(id, m))
}

/// Encodes a vote.
#[must_use]
pub fn encode_vote(v: &Vote) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    put_vote(&mut out, v);
    out
}

/// Decodes a vote.
///
/// # Errors
/// [`CodecError`] for anything but a well-formed vote.
pub fn decode_vote(b: &[u8]) -> Result<Vote, CodecError> {
    let mut r = start("vote", b)?;
    let v = get_vote(&mut r)?;
    finish(&r)?;
    Ok(v)
}

/// Appends `part` with a u32 LE length prefix.
pub fn put_part(out: &mut Vec<u8>, part: &[u8]) {
    out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(part);
}

/// Takes one length-prefixed part off the front of `rest`.
///
/// # Errors
/// [`CodecError`] if `rest` is shorter than the prefix says.
pub fn take_part<'a>(rest: &mut &'a [u8], what: &'static str) -> Result<&'a [u8], CodecError> {
    let (len, tail) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| CodecError::truncated(what))?;
    let n = u32::from_le_bytes(*len) as usize;
    if tail.len() < n {
        return Err(CodecError::truncated(what));
    }
    let (part, tail) = tail.split_at(n);
    *rest = tail;
    Ok(part)
}

/// Encodes snapshot metadata (`last_log_id`, `last_membership`) followed by the data.
#[must_use]
pub fn encode_snapshot_meta(meta: &crate::types::Meta, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + data.len());
    put_part(&mut out, &encode_log_id(meta.last_log_id.as_ref()));
    put_part(&mut out, &encode_membership(&meta.last_membership));
    out.extend_from_slice(data);
    out
}

/// Decodes what [`encode_snapshot_meta`] wrote: the metadata and the data.
///
/// # Errors
/// [`CodecError`] for truncated or malformed bytes.
pub fn decode_snapshot_meta(b: &[u8]) -> Result<(crate::types::Meta, &[u8]), CodecError> {
    let mut rest = b;
    let id = take_part(&mut rest, "snapshot meta")?;
    let m = take_part(&mut rest, "snapshot meta")?;
    Ok((
        crate::types::Meta {
            last_log_id: decode_log_id(id)?,
            last_membership: decode_membership(m)?,
        },
        rest,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(payload: EntryPayload<Command, u64, BasicNode>) -> Entry {
        Entry {
            log_id: LogId {
                leader_id: LeaderId {
                    term: 7,
                    node_id: 3,
                },
                index: 42,
            },
            payload,
        }
    }

    #[test]
    fn entries_round_trip() {
        let nodes: BTreeMap<u64, BasicNode> = [
            (
                1,
                BasicNode {
                    addr: "127.0.0.1:50005".into(),
                },
            ),
            (
                2,
                BasicNode {
                    addr: "127.0.0.2:50005".into(),
                },
            ),
            (
                9,
                BasicNode {
                    addr: "learner:1".into(),
                },
            ),
        ]
        .into_iter()
        .collect();
        let m = Membership::new(vec![BTreeSet::from([1, 2])], nodes).unwrap();
        for e in [
            entry(EntryPayload::Blank),
            entry(EntryPayload::Normal(Command(vec![1, 2, 3].into()))),
            entry(EntryPayload::Normal(Command(bytes::Bytes::new()))),
            entry(EntryPayload::Membership(m)),
        ] {
            let b = encode_entry(&e);
            assert_eq!(decode_entry(&Bytes::copy_from_slice(&b)).unwrap(), e);
            for cut in 0..b.len() {
                if matches!(e.payload, EntryPayload::Normal(_)) && cut >= 26 {
                    continue; // a shorter command is still a command: the log's CRC guards length
                }
                assert!(
                    decode_entry(&Bytes::copy_from_slice(&b[..cut])).is_err(),
                    "cut {cut} of {e:?}"
                );
            }
        }
    }

    #[test]
    fn votes_round_trip_and_junk_is_refused() {
        for committed in [false, true] {
            let v = Vote {
                leader_id: LeaderId {
                    term: 5,
                    node_id: 2,
                },
                committed,
            };
            assert_eq!(decode_vote(&encode_vote(&v)).unwrap(), v);
        }
        assert!(decode_vote(&[1, 0, 0]).is_err());
        assert!(decode_vote(&[2; 18]).is_err());
        assert!(decode_entry(&Bytes::from_static(&[1; 8])).is_err());
        // A membership claiming billions of configs is refused before allocating.
        let mut b = encode_entry(&entry(EntryPayload::Blank));
        b[25] = 2;
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_entry(&Bytes::copy_from_slice(&b)).is_err());
    }

    #[test]
    fn parts_and_snapshot_meta_round_trip_and_reject_truncation() {
        let meta = crate::types::Meta {
            last_log_id: Some(LogId {
                leader_id: LeaderId {
                    term: 4,
                    node_id: 2,
                },
                index: 99,
            }),
            last_membership: StoredMembership::default(),
        };
        let bytes = encode_snapshot_meta(&meta, b"data");
        let (m, d) = decode_snapshot_meta(&bytes).unwrap();
        assert_eq!(m.last_log_id, meta.last_log_id);
        assert_eq!(d, b"data");
        for cut in 0..bytes.len() - 4 {
            assert!(
                decode_snapshot_meta(&bytes[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        let mut out = Vec::new();
        put_part(&mut out, b"ab");
        let mut rest = &out[..];
        assert_eq!(take_part(&mut rest, "x").unwrap(), b"ab");
        assert!(rest.is_empty());
        assert!(take_part(&mut &[9, 0, 0, 0, 1][..], "x").is_err());
    }
}
