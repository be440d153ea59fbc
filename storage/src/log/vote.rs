//! The vote (Raft hard state) file: two 4 KiB slots written alternately, each with a sequence
//! number and a CRC-32C, durable before `save` returns (an `O_DSYNC` write, or a write and an
//! fsync). A torn write can only damage the slot being written; the other still holds the
//! previous vote.
//!
//! | offset in slot | size | field |
//! |---|---|---|
//! | 0 | 8 | sequence (u64 LE, > 0) |
//! | 8 | 4 | length `n` (u32 LE) |
//! | 12 | 4 | CRC-32C of bytes 0..12 and the value |
//! | 16 | n | value (opaque bytes from the Raft adapter) |

use std::cell::Cell;

use super::error::LogError;
use super::format::BLOCK;
use super::io::LogIo;

/// File name of the vote.
pub const VOTE_FILE: &str = "vote";
/// Largest vote value.
pub const VOTE_MAX: usize = BLOCK as usize - 16;

/// A small durable value (the vote, the purge marker) in its own two-slot file.
pub struct VoteFile<I: LogIo> {
    io: I,
    name: String,
    seq: Cell<u64>,
}

fn slot_crc(head: &[u8], value: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(head), value)
}

fn parse(slot: &[u8]) -> Option<(u64, Vec<u8>)> {
    if slot.len() < 16 {
        return None;
    }
    let seq = u64::from_le_bytes(slot[0..8].try_into().ok()?);
    let n = u32::from_le_bytes(slot[8..12].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(slot[12..16].try_into().ok()?);
    if seq == 0 || n > VOTE_MAX || slot.len() < 16 + n {
        return None;
    }
    let value = &slot[16..16 + n];
    (slot_crc(&slot[0..12], value) == crc).then(|| (seq, value.to_vec()))
}

/// The newest valid slot of a two-slot file image: `(sequence, value)`.
pub(crate) fn newest_slot(bytes: &[u8]) -> Option<(u64, Vec<u8>)> {
    bytes
        .chunks(BLOCK as usize)
        .filter_map(parse)
        .max_by_key(|(seq, _)| *seq)
}

/// The slot image holding `value` as sequence `seq` (written at `(seq % 2) * BLOCK`).
pub(crate) fn slot_image(seq: u64, value: &[u8]) -> Vec<u8> {
    let mut slot = Vec::with_capacity(BLOCK as usize);
    slot.extend_from_slice(&seq.to_le_bytes());
    slot.extend_from_slice(&u32::try_from(value.len()).expect("bounded").to_le_bytes());
    let crc = slot_crc(&slot[0..12], value);
    slot.extend_from_slice(&crc.to_le_bytes());
    slot.extend_from_slice(value);
    slot.resize(BLOCK as usize, 0);
    slot
}

impl<I: LogIo> VoteFile<I> {
    /// Opens the file `name` (creating it) and returns it with the saved value, if any.
    ///
    /// # Errors
    /// I/O failure.
    pub async fn open(io: I, name: &str) -> Result<(Self, Option<Vec<u8>>), LogError> {
        io.open(name, 2 * BLOCK).await?;
        let bytes = io.read_at(name, 0, 2 * BLOCK as usize).await?;
        let best = newest_slot(&bytes);
        let seq = best.as_ref().map_or(0, |(s, _)| *s);
        Ok((
            VoteFile {
                io,
                name: name.to_owned(),
                seq: Cell::new(seq),
            },
            best.map(|(_, v)| v),
        ))
    }

    /// Saves `value` durably (returns once the write, or its fsync, did).
    ///
    /// # Errors
    /// I/O failure, or a value over [`VOTE_MAX`] (as [`LogError::TooLarge`]).
    pub async fn save(&self, value: &[u8]) -> Result<(), LogError> {
        if value.len() > VOTE_MAX {
            return Err(LogError::TooLarge(value.len()));
        }
        let seq = self.seq.get() + 1;
        let slot = slot_image(seq, value);
        self.io
            .write_at(&self.name, (seq % 2) * BLOCK, slot)
            .await?;
        self.io.sync_writes(&self.name).await?;
        self.seq.set(seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;
    use crate::log::io::MemLogIo;

    #[test]
    fn saves_survive_crashes_and_torn_slots() {
        let io = MemLogIo::new();
        let (v, none) = block_on(VoteFile::open(io.clone(), VOTE_FILE)).unwrap();
        assert!(none.is_none());
        block_on(v.save(b"term=1")).unwrap();
        block_on(v.save(b"term=2 voted=3")).unwrap();
        let crashed = io.crash();
        let (v2, got) = block_on(VoteFile::open(crashed.clone(), VOTE_FILE)).unwrap();
        assert_eq!(got.as_deref(), Some(&b"term=2 voted=3"[..]));
        // A torn write of the next save damages its slot only: the previous vote remains.
        block_on(v2.save(b"term=3")).unwrap();
        let mut img = crashed.file(VOTE_FILE).unwrap();
        img[BLOCK as usize + 20] ^= 0xff; // seq 3 lives in slot 1
        let torn = MemLogIo::new();
        torn.set_file(VOTE_FILE, img);
        let (_, got) = block_on(VoteFile::open(torn.clone(), VOTE_FILE)).unwrap();
        assert_eq!(got.as_deref(), Some(&b"term=2 voted=3"[..]));
    }

    #[test]
    fn oversized_votes_are_refused() {
        let io = MemLogIo::new();
        let (v, _) = block_on(VoteFile::open(io.clone(), VOTE_FILE)).unwrap();
        assert!(matches!(
            block_on(v.save(&vec![0; VOTE_MAX + 1])),
            Err(LogError::TooLarge(_))
        ));
    }
}
