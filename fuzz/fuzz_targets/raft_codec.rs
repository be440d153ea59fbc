//! openraft entry, vote and RPC decoding from arbitrary bytes (they arrive from peers and
//! disk): never panics; whatever decodes re-encodes canonically (encode · decode is stable).
#![no_main]

use futureq_raft::codec::{decode_entry, decode_vote, encode_entry, encode_vote};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let shared = bytes::Bytes::copy_from_slice(data);
    if let Ok(e) = decode_entry(&shared) {
        assert_eq!(decode_entry(&encode_entry(&e).into()).ok(), Some(e));
    }
    let _ = futureq_raft::codec::normal_entry_command(data);
    if let Ok((meta, rest)) = futureq_raft::codec::decode_snapshot_meta(data) {
        let again = futureq_raft::codec::encode_snapshot_meta(&meta, rest);
        let (m2, r2) = futureq_raft::codec::decode_snapshot_meta(&again).expect("re-decodes");
        assert_eq!((m2.last_log_id, r2), (meta.last_log_id, rest));
    }
    if let Some(f) = futureq_raft::node::Forward::decode(data) {
        assert_eq!(futureq_raft::node::Forward::decode(&f.encode()), Some(f));
    }
    if let Ok(v) = decode_vote(data) {
        assert_eq!(encode_vote(&v), data);
    }
    use futureq_raft::rpc::*;
    if let Ok(r) = decode_append(&shared) {
        let once = encode_append(&r);
        assert_eq!(
            encode_append(&decode_append(&once.clone().into()).expect("canonical bytes decode")),
            once
        );
    }
    if let Ok(r) = decode_append_response(data) {
        assert_eq!(encode_append_response(&r), data);
    }
    if let Ok(r) = decode_vote_request(data) {
        assert_eq!(encode_vote_request(&r), data);
    }
    if let Ok(r) = decode_vote_response(data) {
        assert_eq!(encode_vote_response(&r), data);
    }
    if let Ok(c) = decode_snapshot_chunk(data) {
        assert_eq!(encode_snapshot_chunk(&c), data);
    }
    let _ = decode_snapshot_response(data);
});
