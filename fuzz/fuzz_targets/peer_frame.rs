//! Raft transport framing over arbitrary bytes and chunking: never panics, never yields more
//! than was received.
#![no_main]

use futureq_net::peer::PeerFrameDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let mut d = PeerFrameDecoder::new(4096);
    let mut out = 0usize;
    for chunk in rest.chunks(usize::from(cut).max(1)) {
        d.push(chunk);
        loop {
            match d.decode() {
                Ok(Some(f)) => out += 15 + f.payload.len(),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    assert!(out <= rest.len());
});
