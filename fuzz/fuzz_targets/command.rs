//! Replicated command validation (event shard and metadata group, and metadata snapshots)
//! over arbitrary entry bytes: never panics; whatever validates can be read field by field.
#![no_main]

use futureq_core::command::{decode, CommandRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(CommandRef::Store(b)) => {
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
        Err(_) => {}
    }
    if let Ok(c) = futureq_core::metadata::MetaCommand::decode(data) {
        let mut s = futureq_core::metadata::MetaState::default();
        s.apply(c);
        let _ = s.cluster_view(1);
    }
    let _ = futureq_core::metadata::MetaState::restore(data);
});
