//! The hub alone (no I/O): a burst of N messages due at one instant, delivered to one
//! consumer (universal, or a group's member) and acked in frames of 64, as the dispatcher
//! drives it. Prints the wall time per message of each round (the hub's calls and the
//! in-memory store's range reads; setup and teardown are not timed) and their median.
//!
//! `cargo run --release -p futureq-core --example hub_bench [-- N ROUNDS GROUP]` (100000, 7,
//! "": a universal consumer)

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futureq_core::hub::{
    AckOutcome, Delivery, Hub, HubConfig, ScanRequest, ScanResult, Sink, Subscription,
};
use futureq_core::{bucket_of, topic_hash, DelayMs, EventId, EventKey, StoredMessage, TtlMs};

/// A consumer's queue: what the hub sent, taken by the "stream" in order.
#[derive(Clone, Default)]
struct Queue(Rc<RefCell<Vec<EventKey>>>);

impl Sink for Queue {
    fn try_send(&self, d: Delivery) -> bool {
        self.0.borrow_mut().push(d.key);
        true
    }
}

fn scan(store: &BTreeMap<EventKey, Arc<StoredMessage>>, r: &ScanRequest) -> ScanResult {
    let mut items: Vec<_> = store
        .range(r.from..r.upper)
        .take(r.limit + 1)
        .map(|(k, m)| (*k, Arc::clone(m)))
        .collect();
    let exhausted = items.len() <= r.limit;
    items.truncate(r.limit);
    ScanResult {
        items,
        exhausted,
        next_key: None,
    }
}

fn round(n: u64, group: &str) -> f64 {
    let cfg = HubConfig {
        in_flight_timeout_ms: 30_000,
        bucket_ms: 1000,
        scan_limit: 1024,
        lookahead_ms: 0,
        max_attempts: 0,
    };
    let mut hub = Hub::new(cfg);
    let q = Queue::default();
    let sub = Subscription {
        topic: "burst".into(),
        group: group.to_owned(),
        max_in_flight: 65_536,
    };
    let id = hub.register(&sub, q.clone(), 0);
    let h = topic_hash("burst");
    let due = 1_000_000;
    let mut store = BTreeMap::new();
    for i in 1..=n {
        let m = StoredMessage {
            topic: "burst".into(),
            payload: Bytes::from_static(&[0; 100]),
            enqueued_at_ms: due,
            delay: DelayMs(0),
            ttl: TtlMs(0),
            indexes: vec![],
            extras: Default::default(),
        };
        store.insert(
            EventKey::new(h, bucket_of(due, 1000), EventId(i)),
            Arc::new(m),
        );
    }
    let now = due;
    let start = Instant::now();
    let mut acked = 0u64;
    while acked < n {
        hub.expire_in_flight(now);
        hub.drain_waiting(now);
        for r in hub.scans_due(now) {
            let res = scan(&store, &r);
            hub.apply_scan(&r, res, now);
        }
        let sent = std::mem::take(&mut *q.0.borrow_mut());
        assert!(!sent.is_empty(), "a pass delivered nothing");
        for frame in sent.chunks(64) {
            for k in frame {
                assert_eq!(hub.ack(id, *k, true, now), AckOutcome::Acked);
            }
        }
        acked += sent.len() as u64;
        while hub.take_delete_batch().is_some() {
            hub.finish_delete_batch(true);
        }
    }
    let took = start.elapsed();
    assert_eq!(hub.in_flight(), 0);
    took.as_nanos() as f64 / n as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let group = args.next().unwrap_or_default();
    let mut per: Vec<f64> = (0..rounds).map(|_| round(n, &group)).collect();
    println!("ns per message (deliver + ack), each round: {per:.0?}");
    per.sort_by(f64::total_cmp);
    println!("median {:.0} ns per message", per[per.len() / 2]);
}
