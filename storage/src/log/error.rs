//! The log's error type, shared by the segmented log and the vote file.

use super::format::LogIndex;

/// Log errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The file layer failed.
    #[error("log I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Committed data is damaged; the log refuses to open rather than drop it.
    #[error("log corrupt in {segment} at byte {offset}: {reason}")]
    Corrupt {
        /// Segment file.
        segment: String,
        /// Byte offset of the bad record.
        offset: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// An earlier fsync failed: the log accepts no more writes.
    #[error("log poisoned by an earlier fsync failure; restart the node")]
    Poisoned,
    /// Appended indexes must follow the last one.
    #[error("append of index {got} does not follow the last index {last}")]
    Gap {
        /// Last index in the log.
        last: LogIndex,
        /// Index offered.
        got: LogIndex,
    },
    /// A record larger than a segment.
    #[error("entry of {0} bytes does not fit in a segment")]
    TooLarge(usize),
    /// The disk had no room for the next segment: the flush wrote nothing durable that it
    /// reported, the log is not poisoned, and its entries wait (callbacks unanswered) for a
    /// later flush ([`super::Log::run_flusher`] retries).
    #[error("no space left on the device for the next log segment {segment}")]
    NoSpace {
        /// The segment that could not be created.
        segment: String,
    },
}
