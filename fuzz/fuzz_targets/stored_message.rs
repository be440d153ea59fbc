//! Stored message decoding from arbitrary bytes: never panics; whatever decodes re-encodes
//! to the same bytes.
#![no_main]

use bytes::Bytes;
use futureq_core::StoredMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    let topic = StoredMessage::topic_of(data);
    if let Ok(m) = StoredMessage::decode(&b) {
        assert_eq!(m.encode(), b);
        assert_eq!(topic, Some(m.topic.as_str()));
    }
});
