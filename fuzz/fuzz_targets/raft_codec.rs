//! openraft entry and vote decoding from arbitrary bytes (they arrive from peers and disk):
//! never panics; whatever decodes re-encodes to the same bytes.
#![no_main]

use futureq_raft::codec::{decode_entry, decode_vote, encode_entry, encode_vote};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = decode_entry(data) {
        assert_eq!(decode_entry(&encode_entry(&e)).ok(), Some(e));
    }
    if let Ok(v) = decode_vote(data) {
        assert_eq!(encode_vote(&v), data);
    }
});
