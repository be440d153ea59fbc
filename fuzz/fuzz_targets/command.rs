//! Replicated command validation (event shard and metadata group, and metadata snapshots)
//! over arbitrary entry bytes: never panics; whatever validates can be read field by field,
//! and a valid store command's first event id read in place is the validated one.
#![no_main]

use futureq_core::command::{decode, first_event_id, CommandRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let in_place = first_event_id(data);
    match decode(data) {
        Ok(CommandRef::Store(b)) => {
            assert_eq!(in_place, b.items.first().map(|i| i.event_id.to_native()));
            for item in b.items.iter() {
                let _ = item.key();
                let _ = item.message.len() + item.index_keys.iter().map(|k| k.len()).sum::<usize>();
            }
        }
        Ok(CommandRef::Delete(d)) => {
            let _ = d.keys.iter().map(|k| k[0]).count();
        }
        Ok(CommandRef::RegisterGroup(r)) => {
            let _ = (r.topic_hash.to_native(), r.group.len());
        }
        Ok(CommandRef::DeleteGroup(d)) => {
            assert_eq!(in_place, None, "a group deletion has no first event id");
            let _ = (d.topic_hash.to_native(), d.group.len());
        }
        Ok(CommandRef::Cancel(c)) => {
            assert_eq!(in_place, None, "a cancel has no first event id");
            let _ = c.keys.iter().map(|k| k[23]).count();
        }
        Ok(CommandRef::DeadLetter(d)) => {
            assert_eq!(in_place, None, "a dead letter has no first event id");
            let _ = (d.group.len(), d.now_ms.to_native());
        }
        Ok(CommandRef::Reschedule(r)) => {
            assert_eq!(in_place, None, "a reschedule has no first event id");
            assert_eq!(r.new_key().topic_hash(), futureq_core::EventKey(r.key).topic_hash());
            let _ = (r.due_at_ms.to_native(), r.now_ms.to_native());
        }
        Err(_) => {}
    }
    if let Ok(c) = futureq_core::metadata::MetaCommand::decode(data) {
        let mut s = futureq_core::metadata::MetaState::default();
        s.apply(c);
        let _ = s.cluster_view(1);
    }
    let _ = futureq_core::metadata::MetaState::restore(data);
});
