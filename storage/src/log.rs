//! The log of both write paths (the Raft log and the standalone journal): record format,
//! segmented log with group commit and recovery over the [`io::LogIo`] seam, and the vote
//! file. Its persist hook is where the Raft crate's leader-persist tracker listens.
//! [`uring::DmaLogIo`] implements the seam on io_uring (glommio `DmaFile`, feature `glommio`).
//!
//! # Invariants
//! - A record is valid only with a matching CRC-32C; an all-zero header ends a segment.
//! - The persist hook fires only after a successful fsync, and never after a failed one.

mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod format;
pub mod io;
pub mod segmented;
#[cfg(feature = "glommio")]
pub mod uring;
pub mod vote;

pub use error::LogError;
pub use format::{LogIndex, Term};
pub use segmented::{FlushError, Log, LogConfig, SEGMENT_BYTES};
