//! Byte layout of the Raft log (see docs/log-format.md).
//!
//! Record, packed back to back in a segment, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | payload length `n` |
//! | 4 | 4 | CRC-32C of bytes 8 .. 24 + n |
//! | 8 | 8 | term |
//! | 16 | 8 | index |
//! | 24 | n | payload |
//!
//! Segments are preallocated with zeros: an all-zero header marks the end of the data.

/// Record header length.
pub const HEADER_LEN: usize = 24;
/// Alignment of every write (O_DIRECT block size).
pub const BLOCK: u64 = 4096;
/// Largest payload one record may carry (bounds reads of untrusted lengths).
pub const PAYLOAD_MAX: usize = 64 << 20;

/// A Raft term (the journal writes [`Term::JOURNAL`] for ever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Term(pub u64);

impl Term {
    /// The term of every journal entry: a standalone broker has one writer.
    pub const JOURNAL: Term = Term(1);
}

/// The index of an entry in the log: contiguous from the first kept entry to the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogIndex(pub u64);

impl std::fmt::Display for LogIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A record read back from a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Raft term.
    pub term: Term,
    /// Raft index.
    pub index: LogIndex,
    /// Entry bytes.
    pub payload: Vec<u8>,
}

/// Appends the encoding of one record to `out`.
pub fn encode(out: &mut Vec<u8>, Term(term): Term, LogIndex(index): LogIndex, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("payload bounded by PAYLOAD_MAX");
    let start = out.len();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&term.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// What is at an offset of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A valid record of `len` bytes in total.
    Record(Record, usize),
    /// An all-zero header: no data from here on.
    End,
    /// Not a valid record (torn write or corruption), with the reason.
    Bad(&'static str),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes the record at the start of `b` (untrusted bytes; never panics).
#[must_use]
pub fn decode(b: &[u8]) -> Decoded {
    if b.len() < HEADER_LEN {
        return if b.iter().all(|x| *x == 0) {
            Decoded::End
        } else {
            Decoded::Bad("truncated header")
        };
    }
    if b[..HEADER_LEN].iter().all(|x| *x == 0) {
        return Decoded::End;
    }
    let len = u32_at(b, 0) as usize;
    if len > PAYLOAD_MAX {
        return Decoded::Bad("length out of range");
    }
    if b.len() < HEADER_LEN + len {
        return Decoded::Bad("truncated payload");
    }
    if crc32c::crc32c(&b[8..HEADER_LEN + len]) != u32_at(b, 4) {
        return Decoded::Bad("checksum mismatch");
    }
    Decoded::Record(
        Record {
            term: Term(u64_at(b, 8)),
            index: LogIndex(u64_at(b, 16)),
            payload: b[HEADER_LEN..HEADER_LEN + len].to_vec(),
        },
        HEADER_LEN + len,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(term: u64, index: u64, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut b = Vec::new();
            let (term, index) = (Term(term), LogIndex(index));
            encode(&mut b, term, index, &payload);
            prop_assert_eq!(decode(&b), Decoded::Record(Record { term, index, payload: payload.clone() }, b.len()));
        }

        #[test]
        fn any_flipped_bit_is_detected(payload in proptest::collection::vec(any::<u8>(), 1..64), bit in 0usize..8) {
            let mut b = Vec::new();
            encode(&mut b, Term(3), LogIndex(9), &payload);
            let at = 4 + (bit * 7919) % (b.len() - 4);
            b[at] ^= 1 << bit;
            prop_assert!(!matches!(decode(&b), Decoded::Record(r, _) if r.payload == payload && r.index == LogIndex(9) && r.term == Term(3)));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = decode(&b);
        }
    }

    #[test]
    fn zeros_are_the_end() {
        assert_eq!(decode(&[0; 40]), Decoded::End);
        assert_eq!(decode(&[0; 3]), Decoded::End);
    }
}
