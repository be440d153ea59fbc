//! Encodings of the Raft RPCs carried by the peer transport (`futureq_net::peer` frames:
//! the frame's `kind` byte is one of the `KIND_*` constants, its payload one of these
//! encodings). Version 1, little-endian, decoded with bounds checked before any allocation.

use bytes::Bytes;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};

use crate::codec::{
    decode_entry, finish, get_log_id, get_vote, put_entry, put_log_id, put_vote, start, CodecError,
    CODEC_VERSION,
};
use crate::types::TypeConfig;

/// AppendEntries request.
pub const KIND_APPEND: u8 = 1;
/// Vote request.
pub const KIND_VOTE: u8 = 2;
/// End of a snapshot transfer: the vote, the snapshot's metadata and the data's length; the
/// data came before in [`KIND_SNAPSHOT_CHUNK`] frames.
pub const KIND_SNAPSHOT: u8 = 3;
/// One piece of a snapshot's data.
pub const KIND_SNAPSHOT_CHUNK: u8 = 5;
/// Pre-vote request (encoded as a vote request): would this peer vote for the candidate? It
/// answers without changing its term, so a node that missed heartbeats for a while (a stalled
/// core) cannot depose a leader the others still follow.
pub const KIND_PRE_VOTE: u8 = 6;
/// Response to a request (same request id).
pub const KIND_RESPONSE: u8 = 128;

/// Encodes an AppendEntries request.
#[must_use]
pub fn encode_append(req: &AppendEntriesRequest<TypeConfig>) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    put_vote(&mut out, &req.vote);
    put_log_id(&mut out, req.prev_log_id.as_ref());
    put_log_id(&mut out, req.leader_commit.as_ref());
    out.extend_from_slice(
        &u32::try_from(req.entries.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    for e in &req.entries {
        // Length-prefixed, encoded in place: the prefix is patched after the entry.
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        put_entry(&mut out, e);
        let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    out
}

/// Decodes an AppendEntries request.
///
/// # Errors
/// [`CodecError`] for anything but a well-formed request.
pub fn decode_append(b: &Bytes) -> Result<AppendEntriesRequest<TypeConfig>, CodecError> {
    let mut r = start("append request", b)?;
    let vote = get_vote(&mut r)?;
    let prev_log_id = get_log_id(&mut r)?;
    let leader_commit = get_log_id(&mut r)?;
    let n = r.count(4)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.u32()? as usize;
        entries.push(decode_entry(&b.slice_ref(r.take(len)?))?);
    }
    finish(&r)?;
    Ok(AppendEntriesRequest {
        vote,
        prev_log_id,
        entries,
        leader_commit,
    })
}

/// Encodes an AppendEntries response.
#[must_use]
pub fn encode_append_response(resp: &AppendEntriesResponse<TypeConfig>) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    match resp {
        AppendEntriesResponse::Success => out.push(0),
        AppendEntriesResponse::PartialSuccess(id) => {
            out.push(1);
            put_log_id(&mut out, id.as_ref());
        }
        AppendEntriesResponse::Conflict => out.push(2),
        AppendEntriesResponse::HigherVote(v) => {
            out.push(3);
            put_vote(&mut out, v);
        }
    }
    out
}

/// Decodes an AppendEntries response.
///
/// # Errors
/// [`CodecError`] for anything but a well-formed response.
pub fn decode_append_response(b: &[u8]) -> Result<AppendEntriesResponse<TypeConfig>, CodecError> {
    let mut r = start("append response", b)?;
    let resp = match r.u8()? {
        0 => AppendEntriesResponse::Success,
        1 => AppendEntriesResponse::PartialSuccess(get_log_id(&mut r)?),
        2 => AppendEntriesResponse::Conflict,
        3 => AppendEntriesResponse::HigherVote(get_vote(&mut r)?),
        k => return Err(r.err(format!("response kind {k}"))),
    };
    finish(&r)?;
    Ok(resp)
}

/// Encodes a vote request.
#[must_use]
pub fn encode_vote_request(req: &VoteRequest<TypeConfig>) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    put_vote(&mut out, &req.vote);
    put_log_id(&mut out, req.last_log_id.as_ref());
    out.push(u8::from(req.leadership_transfer));
    out
}

/// Decodes a vote request.
///
/// # Errors
/// [`CodecError`] for anything but a well-formed request.
pub fn decode_vote_request(b: &[u8]) -> Result<VoteRequest<TypeConfig>, CodecError> {
    let mut r = start("vote request", b)?;
    let vote = get_vote(&mut r)?;
    let last_log_id = get_log_id(&mut r)?;
    let leadership_transfer = match r.u8()? {
        0 => false,
        1 => true,
        x => return Err(r.err(format!("transfer flag {x}"))),
    };
    finish(&r)?;
    Ok(VoteRequest {
        vote,
        last_log_id,
        leadership_transfer,
    })
}

/// Encodes a vote response.
#[must_use]
pub fn encode_vote_response(resp: &VoteResponse<TypeConfig>) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    put_vote(&mut out, &resp.vote);
    out.push(u8::from(resp.vote_granted));
    put_log_id(&mut out, resp.last_log_id.as_ref());
    out
}

/// Decodes a vote response.
///
/// # Errors
/// [`CodecError`] for anything but a well-formed response.
pub fn decode_vote_response(b: &[u8]) -> Result<VoteResponse<TypeConfig>, CodecError> {
    let mut r = start("vote response", b)?;
    let vote = get_vote(&mut r)?;
    let vote_granted = match r.u8()? {
        0 => false,
        1 => true,
        x => return Err(r.err(format!("granted flag {x}"))),
    };
    let last_log_id = get_log_id(&mut r)?;
    finish(&r)?;
    Ok(VoteResponse {
        vote,
        vote_granted,
        last_log_id,
    })
}

/// Encodes a snapshot response.
#[must_use]
pub fn encode_snapshot_response(resp: &SnapshotResponse<TypeConfig>) -> Vec<u8> {
    let mut out = vec![CODEC_VERSION];
    put_vote(&mut out, &resp.vote);
    out
}

/// Decodes a snapshot response.
///
/// # Errors
/// [`CodecError`] for anything but a well-formed response.
pub fn decode_snapshot_response(b: &[u8]) -> Result<SnapshotResponse<TypeConfig>, CodecError> {
    let mut r = start("snapshot response", b)?;
    let vote = get_vote(&mut r)?;
    finish(&r)?;
    Ok(SnapshotResponse::new(vote))
}

/// A piece of a snapshot's data: bytes `[offset, offset + data.len())` (the sender streams
/// the data and learns its length at the end: the transfer's last frame carries it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotChunk<'a> {
    /// Names the snapshot (the sender's choice; the receiver checks the pieces match).
    pub snapshot_id: &'a [u8],
    /// Where the piece starts in the data.
    pub offset: u64,
    /// The piece.
    pub data: &'a [u8],
}

/// Encodes a snapshot chunk.
#[must_use]
pub fn encode_snapshot_chunk(c: &SnapshotChunk<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + c.snapshot_id.len() + c.data.len());
    out.push(CODEC_VERSION);
    out.extend_from_slice(&c.offset.to_le_bytes());
    crate::codec::put_part(&mut out, c.snapshot_id);
    crate::codec::put_part(&mut out, c.data);
    out
}

/// Decodes a snapshot chunk (borrowing from `b`).
///
/// # Errors
/// [`CodecError`] for anything but a well-formed chunk whose end fits in a u64.
pub fn decode_snapshot_chunk(b: &[u8]) -> Result<SnapshotChunk<'_>, CodecError> {
    let mut r = start("snapshot chunk", b)?;
    let offset = r.u64()?;
    let id_len = r.u32()? as usize;
    let snapshot_id = r.take(id_len)?;
    let data_len = r.u32()? as usize;
    let data = r.take(data_len)?;
    finish(&r)?;
    if offset.checked_add(data.len() as u64).is_none() {
        return Err(r.err("chunk beyond the largest offset"));
    }
    Ok(SnapshotChunk {
        snapshot_id,
        offset,
        data,
    })
}

#[cfg(test)]
mod tests {
    use openraft::impls::leader_id_adv::LeaderId;
    use openraft::{EntryPayload, LogId};

    use super::*;
    use crate::types::{Command, Entry, Vote};

    fn lid(term: u64, node: u64, index: u64) -> LogId<LeaderId<u64, u64>> {
        LogId {
            leader_id: LeaderId {
                term,
                node_id: node,
            },
            index,
        }
    }

    fn vote(term: u64, node: u64, committed: bool) -> Vote {
        Vote {
            leader_id: LeaderId {
                term,
                node_id: node,
            },
            committed,
        }
    }

    #[test]
    fn rpcs_round_trip() {
        let entries: Vec<Entry> = (5..8)
            .map(|i| Entry {
                log_id: lid(2, 1, i),
                payload: if i == 6 {
                    EntryPayload::Blank
                } else {
                    EntryPayload::Normal(Command(vec![i as u8; 9].into()))
                },
            })
            .collect();
        for req in [
            AppendEntriesRequest {
                vote: vote(2, 1, true),
                prev_log_id: Some(lid(2, 1, 4)),
                entries,
                leader_commit: Some(lid(1, 3, 2)),
            },
            AppendEntriesRequest {
                vote: vote(1, 2, false),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            },
        ] {
            let b = encode_append(&req);
            let back = decode_append(&Bytes::copy_from_slice(&b)).unwrap();
            assert_eq!(encode_append(&back), b);
            assert_eq!(back.entries, req.entries);
            for cut in 0..b.len() {
                assert!(
                    decode_append(&Bytes::copy_from_slice(&b[..cut])).is_err(),
                    "cut {cut}"
                );
            }
        }
        for resp in [
            AppendEntriesResponse::Success,
            AppendEntriesResponse::PartialSuccess(Some(lid(3, 2, 9))),
            AppendEntriesResponse::PartialSuccess(None),
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(vote(4, 3, true)),
        ] {
            assert_eq!(
                decode_append_response(&encode_append_response(&resp)).unwrap(),
                resp
            );
        }
        let vr = VoteRequest {
            vote: vote(5, 2, false),
            last_log_id: Some(lid(4, 1, 77)),
            leadership_transfer: true,
        };
        let back = decode_vote_request(&encode_vote_request(&vr)).unwrap();
        assert_eq!(
            (back.vote, back.last_log_id, back.leadership_transfer),
            (vr.vote, vr.last_log_id, true)
        );
        let resp = VoteResponse {
            vote: vote(5, 2, true),
            vote_granted: true,
            last_log_id: None,
        };
        assert_eq!(
            decode_vote_response(&encode_vote_response(&resp)).unwrap(),
            resp
        );
        let sr = SnapshotResponse::new(vote(6, 1, true));
        assert_eq!(
            decode_snapshot_response(&encode_snapshot_response(&sr))
                .unwrap()
                .vote,
            sr.vote
        );
    }

    #[test]
    fn hostile_counts_are_refused_before_allocating() {
        let mut b = encode_append(&AppendEntriesRequest {
            vote: vote(1, 1, false),
            prev_log_id: None,
            entries: vec![],
            leader_commit: None,
        });
        let n = b.len();
        b[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_append(&Bytes::copy_from_slice(&b)).is_err());
        assert!(decode_vote_response(&[1, 0]).is_err());
        assert!(decode_append_response(&[1, 9]).is_err());
    }

    #[test]
    fn snapshot_chunks_round_trip_and_end_within_a_u64() {
        let c = SnapshotChunk {
            snapshot_id: b"1-2-3",
            offset: 10,
            data: b"abcd",
        };
        let b = encode_snapshot_chunk(&c);
        assert_eq!(decode_snapshot_chunk(&b).unwrap(), c);
        assert!(decode_snapshot_chunk(&b[..b.len() - 1]).is_err());
        let overflow = encode_snapshot_chunk(&SnapshotChunk {
            offset: u64::MAX,
            ..c
        });
        assert!(decode_snapshot_chunk(&overflow).is_err());
    }
}
