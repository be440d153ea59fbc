//! Framing of the Raft transport between nodes (clustering milestone, in progress): one TCP
//! connection per peer carries both groups, multiplexed by group id, with requests and
//! responses matched by id.
//!
//! | bytes | field |
//! |---|---|
//! | 4 | length of the rest (u32 LE) |
//! | 1 | version = 1 |
//! | 1 | group: 0 = metadata, 1 = event shard |
//! | 1 | kind (RPC or response type, owned by the Raft adapter) |
//! | 8 | request id (u64 LE; a response echoes it) |
//! | n | payload |
//!
//! [`PeerFrameDecoder`] takes untrusted bytes in arbitrary chunks and never buffers more than
//! one frame of at most its limit plus one chunk.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Frame format version.
pub const PEER_FRAME_VERSION: u8 = 1;
/// Bytes of the header after the length.
const HEAD: usize = 11;

/// One transport frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFrame {
    /// Raft group.
    pub group: u8,
    /// Message kind.
    pub kind: u8,
    /// Request id.
    pub request_id: u64,
    /// Payload.
    pub payload: Bytes,
}

/// Why a peer's bytes were refused (the connection is then closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerFrameError {
    /// Declared length over the limit.
    #[error("peer frame of {0} bytes exceeds the limit of {1}")]
    TooLarge(usize, usize),
    /// Declared length below the header size.
    #[error("peer frame of {0} bytes is shorter than its header")]
    TooShort(usize),
    /// Unknown format version.
    #[error("unknown peer frame version {0}")]
    Version(u8),
}

impl PeerFrame {
    /// Appends the encoded frame to `out`.
    ///
    /// # Panics
    /// If the payload is 4 GiB or more (callers bound payloads far below).
    pub fn encode(&self, out: &mut BytesMut) {
        let len = u32::try_from(HEAD + self.payload.len()).expect("payload below 4 GiB");
        out.reserve(4 + HEAD + self.payload.len());
        out.put_u32_le(len);
        out.put_u8(PEER_FRAME_VERSION);
        out.put_u8(self.group);
        out.put_u8(self.kind);
        out.put_u64_le(self.request_id);
        out.put_slice(&self.payload);
    }
}

/// Decodes a stream of peer frames.
#[derive(Debug)]
pub struct PeerFrameDecoder {
    buf: BytesMut,
    max_len: usize,
}

impl PeerFrameDecoder {
    /// A decoder refusing frames longer than `max_len` bytes.
    #[must_use]
    pub fn new(max_len: usize) -> Self {
        PeerFrameDecoder {
            buf: BytesMut::new(),
            max_len,
        }
    }

    /// Changes the largest frame accepted from now on.
    pub fn set_max_len(&mut self, max_len: usize) {
        self.max_len = max_len;
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete frame, if buffered.
    ///
    /// # Errors
    /// [`PeerFrameError`]; the stream cannot be trusted after one.
    pub fn decode(&mut self) -> Result<Option<PeerFrame>, PeerFrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.max_len {
            return Err(PeerFrameError::TooLarge(len, self.max_len));
        }
        if len < HEAD {
            return Err(PeerFrameError::TooShort(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        self.buf.advance(4);
        let mut f = self.buf.split_to(len);
        let version = f.get_u8();
        if version != PEER_FRAME_VERSION {
            return Err(PeerFrameError::Version(version));
        }
        let group = f.get_u8();
        let kind = f.get_u8();
        let request_id = f.get_u64_le();
        Ok(Some(PeerFrame {
            group,
            kind,
            request_id,
            payload: f.freeze(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_frame() -> impl Strategy<Value = PeerFrame> {
        (
            any::<u8>(),
            any::<u8>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(group, kind, request_id, p)| PeerFrame {
                group,
                kind,
                request_id,
                payload: Bytes::from(p),
            })
    }

    proptest! {
        #[test]
        fn frames_survive_any_chunking(frames in proptest::collection::vec(arb_frame(), 1..6), cut in 1usize..23) {
            let mut wire = BytesMut::new();
            for f in &frames {
                f.encode(&mut wire);
            }
            let mut d = PeerFrameDecoder::new(1 << 10);
            let mut out = Vec::new();
            for chunk in wire.chunks(cut) {
                d.push(chunk);
                while let Some(f) = d.decode().unwrap() {
                    out.push(f);
                }
            }
            prop_assert_eq!(out, frames);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut d = PeerFrameDecoder::new(32);
            d.push(&b);
            while let Ok(Some(_)) = d.decode() {}
        }
    }

    #[test]
    fn bad_lengths_and_versions_are_refused() {
        let mut d = PeerFrameDecoder::new(16);
        d.push(&100u32.to_le_bytes());
        assert_eq!(d.decode(), Err(PeerFrameError::TooLarge(100, 16)));
        let mut d = PeerFrameDecoder::new(16);
        d.push(&3u32.to_le_bytes());
        assert_eq!(d.decode(), Err(PeerFrameError::TooShort(3)));
        let mut d = PeerFrameDecoder::new(64);
        let mut w = BytesMut::new();
        PeerFrame {
            group: 1,
            kind: 2,
            request_id: 3,
            payload: Bytes::new(),
        }
        .encode(&mut w);
        w[4] = 9;
        d.push(&w);
        assert_eq!(d.decode(), Err(PeerFrameError::Version(9)));
    }
}
