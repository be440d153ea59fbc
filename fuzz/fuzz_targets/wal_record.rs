//! The standalone write-ahead log's record body decoder and its replay scan over arbitrary
//! bytes: never panics; whatever decodes re-encodes to the same bytes.
#![no_main]

use futureq_storage::wal::{scan, WalRecord};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = WalRecord::decode(data) {
        let mut again = Vec::new();
        r.encode(&mut again);
        assert_eq!(&again[..], data);
    }
    let _ = scan(data);
});
