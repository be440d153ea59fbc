//! Protobuf decoding of every client-sent API message from arbitrary bytes, and delivery
//! tag parsing: never panics.
#![no_main]

use futureq_core::EventKey;
use futureq_net::pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = pb::PublishBatch::decode(data) {
        for m in &b.messages {
            let _ = futureq_core::publish::validate_message(
                0,
                &m.topic,
                m.delay_ms,
                m.ttl_ms,
                m.indexes.len(),
                &futureq_core::publish::PublishLimits {
                    max_delay_ms: i64::MAX,
                    min_ack_level: futureq_core::AckLevel::NoAck,
                },
            );
        }
    }
    if let Ok(f) = pb::ConsumerFrame::decode(data) {
        if let Some(pb::consumer_frame::Frame::Ack(a)) = f.frame {
            let _ = EventKey::from_slice(&a.delivery_tag);
        }
    }
    let _ = pb::ClusterInfoRequest::decode(data);
    let _ = pb::JoinRequest::decode(data);
    let _ = pb::health::HealthCheckRequest::decode(data);
    if let Ok(c) = pb::CancelRequest::decode(data) {
        for t in &c.delivery_tags {
            let _ = EventKey::from_slice(t);
        }
    }
    let _ = pb::TopicStatsRequest::decode(data);
    if let Ok(r) = pb::PeekRequest::decode(data) {
        let _ = (EventKey::from_slice(&r.after_tag), r.limit, r.topic.len());
    }
    if let Ok(r) = pb::RescheduleRequest::decode(data) {
        let _ = (EventKey::from_slice(&r.delivery_tag), r.delay_ms.checked_add(1));
    }
    if let Ok(s) = std::str::from_utf8(data) {
        // The tag's text form (CLI input).
        if let Ok(k) = EventKey::from_hex(s) {
            assert_eq!(k.to_string(), s.to_ascii_lowercase());
        }
    }
    if let Ok(r) = pb::reflection::ServerReflectionRequest::decode(data) {
        use std::sync::OnceLock;
        static INDEX: OnceLock<futureq_net::reflection::Reflection> = OnceLock::new();
        let index = INDEX.get_or_init(|| {
            futureq_net::reflection::Reflection::new(futureq_net::reflection::DESCRIPTORS, &[])
                .expect("the compiled descriptors")
        });
        let _ = index.answer(r);
    }
});
