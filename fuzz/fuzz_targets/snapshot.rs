//! Snapshot installation from arbitrary bytes (snapshots arrive over the network): never
//! panics, a rejected stream leaves the store as it was, and an installed one keeps the
//! digest (which covers the per-topic counts) in step with the rows.
#![no_main]

use futureq_storage::{Store, StoreMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = Store::open(&StoreMode::Memory).expect("memory store");
    if s.install_snapshot(&mut &data[..], None).is_err() {
        assert_eq!(s.counts().expect("counts"), (0, 0, 0));
        assert!(s.topic_stats(None, usize::MAX).expect("stats").is_empty());
    } else {
        assert_eq!(s.digest(), s.computed_digest().expect("digest"));
    }
});
