//! Snapshot installation from arbitrary bytes (snapshots arrive over the network): never
//! panics, and a rejected stream leaves the store as it was.
#![no_main]

use futureq_storage::{Store, StoreMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = Store::open(&StoreMode::Memory).expect("memory store");
    if s.install_snapshot(&mut &data[..], None).is_err() {
        assert_eq!(s.counts().expect("counts"), (0, 0, 0));
    }
});
