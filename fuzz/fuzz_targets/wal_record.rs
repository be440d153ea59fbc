//! The standalone write-ahead log's record body decoder and its replay scans over arbitrary
//! bytes: never panic; whatever decodes re-encodes to the same bytes.
#![no_main]

use futureq_storage::wal::{scan, scan_unversioned, WalMark, WalRecord};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = WalRecord::decode(data) {
        let mut again = Vec::new();
        r.encode(&mut again);
        assert_eq!(&again[..], data);
    }
    let _ = scan_unversioned(data);
    // The mark from the first 16 bytes, so that the input can hold records of its cycle.
    if let (Some(seq), Some(cycle)) = (data.get(..8), data.get(8..16)) {
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let mark = WalMark {
            seq: word(seq),
            cycle: word(cycle),
        };
        let _ = scan(&data[16..], mark);
    }
});
