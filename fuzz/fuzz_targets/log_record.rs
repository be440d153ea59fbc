//! Raft log record decoding and recovery over arbitrary bytes: decoding never panics and
//! whatever decodes re-encodes to the same bytes; opening a log whose segment (and durable
//! mark) hold arbitrary bytes never panics, and what it keeps reads back.
#![no_main]

use futureq_storage::log::format::{decode, encode, Decoded, BLOCK};
use futureq_storage::log::io::MemLogIo;
use futureq_storage::log::segmented::MARK_FILE;
use futureq_storage::log::{Log, LogConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Decoded::Record(r, n) = decode(data) {
        let mut again = Vec::new();
        encode(&mut again, r.term, r.index, &r.payload);
        assert_eq!(&again[..], &data[..n]);
    }
    // First 8 KiB: the mark file; the rest: one segment.
    let split = data.len().min(2 * BLOCK as usize);
    let io = MemLogIo::new();
    io.set_file(MARK_FILE, data[..split].to_vec());
    io.set_file("00000000000000000001.log", data[split..].to_vec());
    let cfg = LogConfig {
        segment_bytes: 64 * 1024,
        cache_bytes: 0,
    };
    if let Ok(log) = futures::executor::block_on(Log::open(io, cfg, Box::new(|_| {}))) {
        if let Some((first, last)) = log.bounds() {
            for i in first.0..=last.0 {
                let i = futureq_storage::log::LogIndex(i);
                assert!(futures::executor::block_on(log.read(i)).is_ok());
            }
        }
    }
});
