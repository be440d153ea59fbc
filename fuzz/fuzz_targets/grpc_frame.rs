//! gRPC length-prefixed framing over arbitrary chunking: never panics, never yields more
//! than was sent, never buffers past the limit plus one chunk.
#![no_main]

use futureq_net::grpc::FrameDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut d = FrameDecoder::new(1024);
    let mut out = 0usize;
    for chunk in rest.chunks(step) {
        d.push(chunk);
        loop {
            match d.decode() {
                Ok(Some(m)) => {
                    assert!(m.len() <= 1024);
                    out += m.len() + 5;
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    assert!(out <= rest.len());
});
