//! The envelope around every replicated archive: `tag (u8) · length (u32 LE) · archive`,
//! where the length must be exactly the rest of the bytes (a truncated or padded entry is
//! refused before the archive is even looked at).

/// Archives `value` behind its envelope header, in one buffer of at least `capacity` bytes
/// (the archive is written in place after the header: no second copy).
///
/// # Panics
/// If rkyv cannot serialize the value (plain data always serializes) or the archive is
/// 4 GiB or more (commands are bounded far below).
#[must_use]
pub(crate) fn frame<T>(tag: u8, value: &T, capacity: usize) -> Vec<u8>
where
    T: for<'a> rkyv::Serialize<
        rkyv::api::high::HighSerializer<
            Vec<u8>,
            rkyv::ser::allocator::ArenaHandle<'a>,
            rkyv::rancor::Error,
        >,
    >,
{
    let mut out = Vec::with_capacity(capacity.max(HEADER_LEN));
    out.push(tag);
    out.extend_from_slice(&[0; 4]);
    // Relative pointers and the unaligned format make the archive position-independent,
    // so it may start after the header.
    let mut out = rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(value, out)
        .expect("serializing plain data");
    let len = u32::try_from(out.len() - HEADER_LEN).expect("an archive is far below 4 GiB");
    out[1..HEADER_LEN].copy_from_slice(&len.to_le_bytes());
    out
}

/// Bytes before the archive: the tag and the archive length.
pub(crate) const HEADER_LEN: usize = 5;

/// Bytes that are not an envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Fewer bytes than the header.
    #[error("{0} bytes, shorter than the 5-byte header")]
    Short(usize),
    /// The length in the header is not the rest of the bytes.
    #[error("archive length {declared} but {actual} bytes follow (truncated or padded)")]
    Length {
        /// The header's length.
        declared: usize,
        /// The bytes after the header.
        actual: usize,
    },
}

/// Splits an envelope into its tag and archive.
///
/// # Errors
/// The header is missing or the length does not match.
pub(crate) fn unframe(bytes: &[u8]) -> Result<(u8, &[u8]), EnvelopeError> {
    if bytes.len() < HEADER_LEN {
        return Err(EnvelopeError::Short(bytes.len()));
    }
    let len = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    let rest = &bytes[HEADER_LEN..];
    if len != rest.len() {
        return Err(EnvelopeError::Length {
            declared: len,
            actual: rest.len(),
        });
    }
    Ok((bytes[0], rest))
}
