//! Stored message decoding from arbitrary bytes: never panics; whatever decodes re-encodes
//! to the same bytes; the borrowed decode agrees with it.
#![no_main]

use bytes::Bytes;
use futureq_core::StoredMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    let topic = StoredMessage::topic_of(data);
    let borrowed = StoredMessage::decode_borrowed(data);
    assert_eq!(borrowed.is_ok(), StoredMessage::decode(&b).is_ok());
    if let Ok(m) = StoredMessage::decode(&b) {
        assert_eq!(m.encode(), b);
        assert_eq!(topic, Some(m.topic.as_str()));
        if let Ok((mut rest, payload)) = borrowed {
            assert_eq!(payload, &m.payload[..]);
            rest.payload = m.payload.clone();
            assert_eq!(rest, m);
        }
    }
});
