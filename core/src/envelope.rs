//! The envelope around every replicated archive: `tag (u8) · length (u32 LE) · archive`,
//! where the length must be exactly the rest of the bytes (a truncated or padded entry is
//! refused before the archive is even looked at).

/// Wraps an archive.
///
/// # Panics
/// If the archive is 4 GiB or more (commands are bounded far below).
#[must_use]
pub(crate) fn frame(tag: u8, archive: &[u8]) -> Vec<u8> {
    let len = u32::try_from(archive.len()).expect("an archive is far below 4 GiB");
    let mut out = Vec::with_capacity(5 + archive.len());
    out.push(tag);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(archive);
    out
}

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
    if bytes.len() < 5 {
        return Err(EnvelopeError::Short(bytes.len()));
    }
    let len = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    let rest = &bytes[5..];
    if len != rest.len() {
        return Err(EnvelopeError::Length {
            declared: len,
            actual: rest.len(),
        });
    }
    Ok((bytes[0], rest))
}
