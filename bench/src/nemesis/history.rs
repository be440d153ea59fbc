//! What a pass records (publishes acked, deliveries, faults) and how it is judged: the checks
//! of the module docs over the history, into the report.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

/// Fault-free time after an ACK within which it must have committed: a delivery after that
/// is a resurrection.
pub(super) const ACK_SETTLE: Duration = Duration::from_secs(5);

/// A small seeded generator (splitmix64): the schedule depends on the seed only.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (ms).
    pub(super) fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo).max(1))
    }
}

/// The wall clock in Unix ms (the bench's one clock, [`crate::stats::now_us`]).
pub(super) fn now_ms() -> i64 {
    crate::stats::now_us() / 1000
}

/// One delivery the consumer saw.
#[derive(Clone)]
pub(super) struct Delivered {
    pub(super) payload: String,
    pub(super) tag: Vec<u8>,
    pub(super) at_ms: i64,
    pub(super) due_ms: i64,
}

/// One injected fault: `[start, end)` in Unix ms.
#[derive(Clone, Serialize)]
pub(super) struct FaultRec {
    pub(super) kind: &'static str,
    pub(super) node: usize,
    pub(super) leader: bool,
    pub(super) start_ms: i64,
    pub(super) end_ms: i64,
}

/// What the clients and the nemesis recorded.
#[derive(Default)]
pub(super) struct History {
    /// Payloads whose publish was attempted (acked or not).
    pub(super) attempted: HashMap<String, ()>,
    /// QUORUM-acked payloads: their tags and when the ack came (Unix ms).
    pub(super) acked: HashMap<String, (Vec<u8>, i64)>,
    pub(super) deliveries: Vec<Delivered>,
    /// First ACK sent per payload (Unix ms).
    pub(super) acks: HashMap<String, i64>,
    pub(super) faults: Vec<FaultRec>,
}

pub(super) type Shared = Arc<Mutex<History>>;

pub(super) fn lock(h: &Shared) -> std::sync::MutexGuard<'_, History> {
    h.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The summary a run prints and writes.
#[derive(Serialize, Default)]
pub(crate) struct Report {
    pub(super) seed: u64,
    pub(super) duration_s: u64,
    pub(super) faults: BTreeMap<&'static str, usize>,
    /// Enabled fault classes that never ran (the pass was too short): the pass fails.
    pub(super) classes_not_run: Vec<&'static str>,
    pub(super) published_attempted: usize,
    pub(super) acked: usize,
    pub(super) deliveries: usize,
    pub(super) redeliveries: usize,
    pub(super) lost: Vec<String>,
    pub(super) unexpected: Vec<String>,
    pub(super) early: Vec<String>,
    pub(super) tag_reuse: Vec<String>,
    pub(super) resurrected: Vec<String>,
    pub(super) liveness: Option<String>,
    pub(super) liveness_after_ms: u64,
    pub(super) convergence: Option<String>,
    pub(super) fault_log: Vec<FaultRec>,
}

impl Report {
    /// The pass's summary: what ran, and each check's count.
    pub(super) fn print(&self) {
        println!(
            "nemesis seed {}: faults {:?}; {} publishes attempted, {} acked, {} deliveries ({} redeliveries)",
            self.seed, self.faults, self.published_attempted, self.acked, self.deliveries, self.redeliveries
        );
        println!(
            "lost {} · unexpected {} · early {} · tag reuse {} · resurrected {} · liveness {} · convergence {}",
            self.lost.len(),
            self.unexpected.len(),
            self.early.len(),
            self.tag_reuse.len(),
            self.resurrected.len(),
            self.liveness.as_deref().map_or_else(|| format!("ok ({} ms)", self.liveness_after_ms), str::to_owned),
            self.convergence.as_deref().unwrap_or("ok"),
        );
    }

    pub(super) fn violations(&self) -> usize {
        self.lost.len()
            + self.unexpected.len()
            + self.early.len()
            + self.tag_reuse.len()
            + self.resurrected.len()
            + usize::from(self.liveness.is_some())
            + usize::from(self.convergence.is_some())
    }
}

/// Checks the history (see the module doc).
pub(super) fn check(h: &History, r: &mut Report) {
    let mut by_payload: HashMap<&str, Vec<&Delivered>> = HashMap::new();
    let mut tags: HashMap<&[u8], &str> = HashMap::new();
    for d in &h.deliveries {
        by_payload.entry(&d.payload).or_default().push(d);
        if !h.attempted.contains_key(&d.payload) {
            r.unexpected.push(d.payload.clone());
        }
        if d.at_ms < d.due_ms {
            r.early
                .push(format!("{} {} ms early", d.payload, d.due_ms - d.at_ms));
        }
        match tags.insert(&d.tag, &d.payload) {
            Some(other) if other != d.payload => {
                r.tag_reuse.push(format!("{} and {}", other, d.payload));
            }
            _ => {}
        }
    }
    for (p, (tag, at)) in &h.acked {
        if !by_payload.contains_key(p.as_str()) {
            let id = tag
                .get(16..24)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_be_bytes);
            r.lost.push(format!("{p} (event id {id}, acked at {at})"));
        }
        if let Some(Some(d)) = by_payload.get(p.as_str()).map(|v| v.first()) {
            if d.tag != *tag {
                r.tag_reuse
                    .push(format!("{p}: acked with one tag, delivered with another"));
            }
        }
    }
    let settle = i64::try_from(ACK_SETTLE.as_millis()).unwrap_or(i64::MAX);
    let fault_free = |from: i64, to: i64| {
        !h.faults
            .iter()
            .any(|f| f.start_ms < to && f.end_ms + 1000 > from)
    };
    for (p, ds) in &by_payload {
        r.redeliveries += ds.len().saturating_sub(1);
        let Some(&acked_at) = h.acks.get(*p) else {
            continue;
        };
        for d in ds.iter().skip(1) {
            if d.at_ms > acked_at + settle && fault_free(acked_at, acked_at + settle) {
                r.resurrected.push(format!(
                    "{p}: acked at {acked_at}, delivered again {} ms later",
                    d.at_ms - acked_at
                ));
            }
        }
    }
    r.deliveries = h.deliveries.len();
    r.acked = h.acked.len();
    r.published_attempted = h.attempted.len();
    for f in &h.faults {
        *r.faults.entry(f.kind).or_default() += 1;
    }
    r.fault_log = h.faults.clone();
    for v in [
        &mut r.lost,
        &mut r.unexpected,
        &mut r.early,
        &mut r.tag_reuse,
        &mut r.resurrected,
    ] {
        v.sort();
    }
}
