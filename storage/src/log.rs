//! The Raft log (clustering milestone, in progress): record format and the leader-persist
//! tracker. The segment files on io_uring (`DmaFile`) build on these.
//!
//! # Invariants
//! - A record is valid only with a matching CRC-32C; an all-zero header ends a segment.
//! - The persist hook fires only after a successful fsync, and never after a failed one.

pub mod format;
pub mod tracker;
