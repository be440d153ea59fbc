//! Raft log record decoding and the torn-tail/corruption scan over arbitrary bytes: never
//! panics; whatever decodes re-encodes to the same bytes.
#![no_main]

use futureq_storage::log::format::{decode, encode, valid_record_follows, Decoded};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Decoded::Record(r, n) = decode(data) {
        let mut again = Vec::new();
        encode(&mut again, r.term, r.index, &r.payload);
        assert_eq!(&again[..], &data[..n]);
    }
    let _ = valid_record_follows(data, 0, u64::MAX / 2);
});
