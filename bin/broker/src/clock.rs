//! The broker's wall clock (Unix ms), which stamps enqueue times and due times, and the
//! instant it reaches a given reading.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Current wall clock in Unix ms.
#[must_use]
pub fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(i64::MAX)
}

/// The instant at which the wall clock reads `at_ms`.
pub(crate) fn instant_of(at_ms: i64) -> Instant {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let target = Duration::from_millis(u64::try_from(at_ms).unwrap_or(0));
    Instant::now() + target.saturating_sub(now)
}
