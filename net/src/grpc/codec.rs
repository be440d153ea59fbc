//! gRPC length-prefixed message framing: `compressed flag (u8) · length (u32 BE) · message`.
//!
//! [`FrameDecoder`] takes untrusted bytes in arbitrary chunks (messages straddle DATA frames)
//! and yields whole messages; it never buffers more than one message of at most `max_len`
//! bytes plus one chunk.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::status::Status;
use futureq_core::refusal::Reason;

/// Length of the message prefix.
pub const PREFIX_LEN: usize = 5;

/// Decodes a stream of gRPC messages.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max_len: usize,
}

impl FrameDecoder {
    /// A decoder that refuses messages longer than `max_len` bytes.
    #[must_use]
    pub fn new(max_len: usize) -> Self {
        FrameDecoder {
            buf: BytesMut::new(),
            max_len,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// True when part of a message is buffered.
    #[must_use]
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next complete message, if buffered.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED for a message over the limit; INTERNAL for a compressed message
    /// (the server negotiates no compression).
    pub fn decode(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buf.len() < PREFIX_LEN {
            return Ok(None);
        }
        let flag = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if flag != 0 {
            return Err(Status::refused(
                Reason::Malformed,
                format!("compressed flag {flag} set but no grpc-encoding was negotiated"),
            ));
        }
        check_len(
            "received",
            len,
            self.max_len,
            "api.grpc.maxReceiveMessageSize",
        )?;
        if self.buf.len() < PREFIX_LEN + len {
            self.buf.reserve(PREFIX_LEN + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(PREFIX_LEN);
        Ok(Some(self.buf.split_to(len).freeze()))
    }
}

/// RESOURCE_EXHAUSTED when a message of `len` bytes exceeds `max` (named by `setting`).
///
/// # Errors
/// The status above.
pub fn check_len(direction: &str, len: usize, max: usize, setting: &str) -> Result<(), Status> {
    if len > max {
        return Err(Status::refused(
            Reason::TooLarge,
            format!(
                "{direction} message of {len} bytes exceeds the limit of {max} bytes ({setting})"
            ),
        ));
    }
    Ok(())
}

/// Encodes one message with its prefix.
pub fn encode_message<M: prost::Message>(m: &M) -> Bytes {
    let mut b = BytesMut::with_capacity(PREFIX_LEN + m.encoded_len());
    encode_into(&mut b, m);
    b.freeze()
}

/// Appends one prefixed message to `b`.
pub fn encode_into<M: prost::Message>(b: &mut BytesMut, m: &M) {
    let len = m.encoded_len();
    b.reserve(PREFIX_LEN + len);
    b.put_u8(0);
    b.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Encoding into a buffer with enough capacity cannot fail.
    m.encode(b).expect("buffer reserved for encoded_len");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::Code;
    use proptest::prelude::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    proptest! {
        #[test]
        fn messages_survive_any_chunking(
            msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..50), 1..6),
            cut in 1usize..17,
        ) {
            let wire: Vec<u8> = msgs.iter().flat_map(|m| frame(m)).collect();
            let mut d = FrameDecoder::new(64);
            let mut out = Vec::new();
            for chunk in wire.chunks(cut) {
                d.push(chunk);
                while let Some(m) = d.decode().unwrap() {
                    out.push(m.to_vec());
                }
            }
            prop_assert_eq!(out, msgs);
            prop_assert!(!d.has_partial());
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut d = FrameDecoder::new(16);
            d.push(&b);
            while let Ok(Some(_)) = d.decode() {}
        }
    }

    #[test]
    fn oversize_and_compressed_are_rejected() {
        let mut d = FrameDecoder::new(3);
        d.push(&frame(b"abcd"));
        assert_eq!(d.decode().unwrap_err().code, Code::ResourceExhausted);
        let mut d = FrameDecoder::new(3);
        d.push(&[1, 0, 0, 0, 1, 9]);
        assert_eq!(d.decode().unwrap_err().code, Code::Internal);
    }
}
