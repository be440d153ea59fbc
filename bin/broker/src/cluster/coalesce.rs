//! Coalescing publishes into Raft entries: the publish batches that arrive while entries are
//! in flight become one `StoreBatch` entry, bounded by [`GROUP_ITEMS_MAX`] messages and
//! [`GROUP_BYTES_MAX`] bytes, so that openraft's per-entry costs (its bookkeeping, the log
//! record, the replication message, the apply call) are paid once per group. Each batch
//! keeps its own ack level: its reply goes out at its level's stage of the group's entry
//! (NO_ACK when handed to Raft, LEADER when fsynced in this leader's log, QUORUM when applied).
//!
//! # Invariants
//! - A batch is never split: all of its messages are in one entry, with contiguous ids in
//!   the order given (a batch is atomic, and its reply names its first id).
//! - Ids are assigned when the group is proposed, at each attempt (see
//!   `futureq_raft::node::Node::propose_event`), so ids follow log order.
//! - At most [`GROUPS_IN_FLIGHT`] groups, and [`IN_FLIGHT_BYTES_MAX`] bytes of groups (or one
//!   larger group), are proposed and not yet applied; what arrives meanwhile waits, and goes
//!   into the next group.
//! - A retry (Raft refused the entry while leadership settled) leaves out the NO_ACK batches:
//!   they were answered with the ids of the first attempt, and may be lost.

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::time::Instant;

use crate::budget::Admitted;
use crate::replication::Stored;
use futureq_core::command::{encode_store, store_len_bound, Answer, StoreBatch, StoreItem};
use futureq_core::refusal::WriteError;
use futureq_core::AckLevel;
use futureq_raft::node::{EventWrite, Proposal};
use futures::channel::oneshot;

use super::core::{Core, Pending};

/// Most messages in one group's entry (a single larger batch goes alone): what binds for small
/// messages (8,192 of 1 byte are ~530 KB).
pub(crate) const GROUP_ITEMS_MAX: usize = 8_192;
/// Most bytes of one group's entry, encoded (a single larger batch goes alone). Each entry is
/// copied whole on the reactors (encoded, appended to the log, read and framed for each
/// follower, read for the apply). With 4 MiB, a fill made groups of ~3 MB (16,384 messages
/// of 100 B, the cap then), and each copy held the Raft core's reactor for milliseconds:
/// 140–227 of its 10 ms ticks ran ≥ 15 ms late per 2 M messages, at most 53 ms; with 1 MiB
/// 40–127, at most 31 ms, at the same fill rate (docs/benchmarks.md). 1 MiB is still ~5,000
/// such messages per entry.
pub(crate) const GROUP_BYTES_MAX: usize = 1 << 20;
const _: () = assert!(GROUP_BYTES_MAX <= futureq_core::command::ENTRY_BYTES_MAX);
/// Groups proposed and not yet applied at once, when they are small. With 2, a publish at
/// one message per request waited a round for a place (a place comes back when a group is
/// applied on the leader); 8 measured 1.26× at QUORUM 1/request (`ab --cluster`, 178 → 140 µs
/// CPU per message). Large groups are bounded by [`IN_FLIGHT_BYTES_MAX`] instead.
pub(crate) const GROUPS_IN_FLIGHT: u64 = 8;
/// Bytes of the groups proposed and not yet applied, at most (a larger group goes alone):
/// what a leader holds for replication and each follower takes per round. 8 groups of up to
/// 4 MiB each (`GROUP_BYTES_MAX` was 4 MiB then) saw leadership move in every pending fill
/// after the compare's failovers (3 of 3 runs, when each group was still copied whole on the
/// Raft core; docs/benchmarks.md, issue 29); 2 MiB is two full groups of 1 MiB.
pub(crate) const IN_FLIGHT_BYTES_MAX: usize = 2 * GROUP_BYTES_MAX;
/// Publishes waiting for a group, at most (as many as the write core serves at once).
pub(crate) const QUEUE_MAX: usize = crate::replication::REQUESTS_IN_SERVICE_MAX as usize;

/// One batch of a group.
struct Part {
    len: usize,
    deadline: Instant,
    _admitted: Admitted,
    level: AckLevel,
    reply: Option<oneshot::Sender<Result<Stored, WriteError>>>,
    /// Left out of the entry (a NO_ACK batch, after the first attempt).
    left_out: bool,
}

/// Batches proposed as one entry.
struct Group {
    items: Vec<StoreItem>,
    bytes: usize,
    parts: Vec<Part>,
    deadline: Instant,
}

impl Group {
    fn new() -> Self {
        Group {
            items: Vec::new(),
            bytes: 0,
            parts: Vec::new(),
            deadline: Instant::now(),
        }
    }

    /// Whether `p` may join (a group takes its first batch whatever its size).
    fn fits(&self, p: &Pending) -> bool {
        self.parts.is_empty()
            || (self.items.len() + p.items.len() <= GROUP_ITEMS_MAX
                && self.bytes + store_len_bound(&p.items) <= GROUP_BYTES_MAX)
    }

    fn push(&mut self, mut p: Pending) {
        self.bytes += store_len_bound(&p.items);
        self.deadline = self.deadline.max(p.deadline);
        self.parts.push(Part {
            len: p.items.len(),
            deadline: p.deadline,
            _admitted: p.admitted,
            level: p.level,
            reply: Some(p.reply),
            left_out: false,
        });
        self.items.append(&mut p.items);
    }
}

impl Group {
    /// Leaves out the batches whose publish gave up or whose deadline passed (answered
    /// `Timeout`) while the group waited for room, with their items.
    fn prune(&mut self, now: Instant) {
        if self
            .parts
            .iter()
            .all(|p| p.deadline > now && !p.reply.as_ref().is_some_and(|r| r.is_canceled()))
        {
            return;
        }
        let mut items = std::mem::take(&mut self.items).into_iter();
        let mut kept = Group::new();
        for mut p in std::mem::take(&mut self.parts) {
            let part_items: Vec<StoreItem> = items.by_ref().take(p.len).collect();
            if p.reply.as_ref().is_some_and(|r| r.is_canceled()) {
                continue;
            }
            if p.deadline <= now {
                if let Some(reply) = p.reply.take() {
                    let _ = reply.send(Err(WriteError::Timeout));
                }
                continue;
            }
            kept.bytes += store_len_bound(&part_items);
            kept.deadline = kept.deadline.max(p.deadline);
            kept.items.extend(part_items);
            kept.parts.push(p);
        }
        *self = kept;
    }
}

/// Takes the publishes of `rx` and proposes them in groups (see the module docs) until `rx`
/// closes or the core is gone.
pub(super) async fn run(core: Weak<Core>, rx: flume::Receiver<Pending>) {
    let in_flight = Rc::new(glommio::sync::Semaphore::new(GROUPS_IN_FLIGHT));
    let bytes_in_flight = Rc::new(glommio::sync::Semaphore::new(IN_FLIGHT_BYTES_MAX as u64));
    let mut carry: Option<Pending> = None;
    loop {
        let Ok(permit) = Rc::clone(&in_flight).acquire_static_permit(1).await else {
            return;
        };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv_async().await {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let mut group = Group::new();
        for p in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            if p.reply.is_canceled() {
                // Its publish gave up (timed out): nobody waits for it.
            } else if p.deadline <= Instant::now() {
                let _ = p.reply.send(Err(WriteError::Timeout));
            } else if group.fits(&p) {
                group.push(p);
            } else {
                carry = Some(p);
                break;
            }
        }
        if group.parts.is_empty() {
            continue;
        }
        // What comes meanwhile waits in `rx` and joins the next group.
        let Ok(bytes) = Rc::clone(&bytes_in_flight)
            .acquire_static_permit(group.bytes.min(IN_FLIGHT_BYTES_MAX) as u64)
            .await
        else {
            return;
        };
        // The permit was sized before: a pruned group holds a little more than it needs
        // until its proposal ends.
        group.prune(Instant::now());
        if group.parts.is_empty() {
            continue;
        }
        let Some(core) = core.upgrade() else { return };
        #[allow(clippy::cast_precision_loss)]
        core.metrics
            .raft
            .entry_batches
            .observe(group.parts.len() as f64);
        glommio::spawn_local(async move {
            propose(&core, group).await;
            drop((permit, bytes));
        })
        .detach();
    }
}

/// The first id of each part, as of the last attempt (`None`: not proposed).
type Firsts = Rc<RefCell<Vec<Option<u64>>>>;

/// Proposes `group` as one entry and answers each batch at its level's stage.
async fn propose(core: &Rc<Core>, group: Group) {
    let Group {
        items,
        parts,
        deadline,
        ..
    } = group;
    let parts = Rc::new(RefCell::new(parts));
    let firsts: Firsts = Rc::new(RefCell::new(vec![None; parts.borrow().len()]));
    let wants_persisted = parts.borrow().iter().any(|p| p.level == AckLevel::Leader);
    let make = {
        let (core, parts, firsts) = (Rc::clone(core), Rc::clone(&parts), Rc::clone(&firsts));
        let mut batch = StoreBatch { items };
        let mut attempts = 0u32;
        move || {
            attempts += 1;
            if attempts > 1 {
                leave_out_no_ack(&mut batch, &mut parts.borrow_mut());
            }
            let l = core.node.leadership();
            if batch.items.is_empty() {
                return Err(WriteError::NotLeader { leader: l.leader });
            }
            let start = core.assign(batch.items.len() as u64)?;
            for (i, it) in batch.items.iter_mut().enumerate() {
                it.event_id = start + i as u64;
            }
            let mut at = start;
            for (first, p) in firsts.borrow_mut().iter_mut().zip(parts.borrow().iter()) {
                if !p.left_out {
                    *first = Some(at);
                    at += p.len as u64;
                }
            }
            let cmd = encode_store(&batch);
            // A group fits in one log record: groups stop at GROUP_BYTES_MAX, and a batch
            // larger than that alone was bounded by the API at ENTRY_BYTES_MAX. Refused (not
            // proposed, nothing stored) rather than a panic of the Raft core if a bound is off.
            if cmd.len() > futureq_core::command::ENTRY_BYTES_MAX {
                tracing::error!(target: "raft", bytes = cmd.len(), "a coalesced entry is over ENTRY_BYTES_MAX (a defect); refused");
                return Err(WriteError::not_taken(format!(
                    "an entry of {} bytes, over the limit of {}",
                    cmd.len(),
                    futureq_core::command::ENTRY_BYTES_MAX
                )));
            }
            Ok(Proposal::store(cmd.into(), l.term))
        }
    };
    let answer = |levels: Option<AckLevel>, r: &Result<Answer, WriteError>| {
        // Each part's reply is its first id, and the items of it dedup matched (known at the
        // apply: QUORUM).
        let firsts = firsts.borrow();
        for (p, first) in parts.borrow_mut().iter_mut().zip(firsts.iter()) {
            if levels.is_some_and(|l| l != p.level) {
                continue;
            }
            if let Some(tx) = p.reply.take() {
                let _ = tx.send(
                    r.as_ref()
                        .map(|a| Stored::of(first.unwrap_or(0), p.len, a))
                        .map_err(Clone::clone),
                );
            }
        }
    };
    let w: EventWrite = match core
        .node
        .propose_event(make, wants_persisted, deadline)
        .await
    {
        Ok(w) => w,
        Err(e) => return answer(None, &Err(e)),
    };
    let has = |level| parts.borrow().iter().any(|p| p.level == level);
    if has(AckLevel::NoAck) && w.submitted.await.is_ok() {
        answer(Some(AckLevel::NoAck), &Ok(Answer::None));
    }
    if let Some(persisted) = w.persisted {
        if persisted.await.is_ok() {
            answer(Some(AckLevel::Leader), &Ok(Answer::None));
        }
    }
    let r = w
        .done
        .await
        .unwrap_or_else(|_| Err(WriteError::failed("raft stopped")));
    answer(None, &r);
}

/// Removes the items of the NO_ACK parts from `batch` and marks those parts left out.
fn leave_out_no_ack(batch: &mut StoreBatch, parts: &mut [Part]) {
    let mut keep = Vec::with_capacity(batch.items.len());
    for p in parts.iter_mut().filter(|p| !p.left_out) {
        let out = p.level == AckLevel::NoAck;
        p.left_out = out;
        keep.extend(std::iter::repeat_n(!out, p.len));
    }
    let mut k = keep.into_iter();
    batch.items.retain(|_| k.next().unwrap_or(false));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: u8, bytes: usize) -> StoreItem {
        StoreItem {
            event_id: 0,
            bucket: 0,
            topic_hash: 0,
            expires_at_ms: 0,
            index_keys: vec![],
            message: vec![id; bytes],
        }
    }

    fn pending(ids: &[u8], bytes: usize, level: AckLevel) -> Pending {
        let (reply, _) = oneshot::channel();
        let budget = crate::budget::Budget::new(
            u64::MAX,
            std::time::Duration::from_secs(5),
            std::sync::Arc::default(),
        );
        Pending {
            items: ids.iter().map(|&i| item(i, bytes)).collect(),
            admitted: budget.try_admit(bytes).expect("an unbounded budget"),
            level,
            deadline: Instant::now() + std::time::Duration::from_secs(5),
            reply,
        }
    }

    #[test]
    fn a_group_takes_whole_batches_within_its_bounds() {
        let mut g = Group::new();
        let big = pending(&[1; 3], GROUP_BYTES_MAX, AckLevel::Quorum);
        assert!(g.fits(&big), "the first batch goes whatever its size");
        g.push(big);
        assert!(!g.fits(&pending(&[2], 10, AckLevel::Quorum)));

        let mut g = Group::new();
        let n = GROUP_ITEMS_MAX - 1;
        g.push(pending(&vec![1; n], 1, AckLevel::Quorum));
        assert!(g.fits(&pending(&[2], 1, AckLevel::Quorum)));
        assert!(
            !g.fits(&pending(&[2, 3], 1, AckLevel::Quorum)),
            "never split"
        );
        g.push(pending(&[2], 1, AckLevel::Leader));
        assert_eq!(g.items.len(), GROUP_ITEMS_MAX);
        assert_eq!(g.parts.len(), 2);
        assert_eq!(g.items.last().map(|i| i.message[0]), Some(2), "in order");
    }

    #[test]
    fn batches_that_timed_out_or_gave_up_while_the_group_waited_are_left_out() {
        // A batch whose publish still waits for its reply.
        let waiting = |ids: &[u8], level| {
            let (reply, rx) = oneshot::channel();
            let mut p = pending(ids, 1, level);
            p.reply = reply;
            (p, rx)
        };
        let mut g = Group::new();
        let (first, _first_rx) = waiting(&[1, 1], AckLevel::Quorum);
        g.push(first);
        let (reply, mut timed_out) = oneshot::channel();
        let mut late = pending(&[2], 1, AckLevel::Quorum);
        late.reply = reply;
        late.deadline = Instant::now() + std::time::Duration::from_millis(1);
        g.push(late);
        let (reply, gave_up) = oneshot::channel();
        let mut gone = pending(&[3, 3, 3], 1, AckLevel::Leader);
        gone.reply = reply;
        drop(gave_up);
        g.push(gone);
        let (last, _last_rx) = waiting(&[4], AckLevel::NoAck);
        g.push(last);
        g.prune(Instant::now() + std::time::Duration::from_millis(2));
        let left: Vec<u8> = g.items.iter().map(|i| i.message[0]).collect();
        assert_eq!(
            left,
            vec![1, 1, 4],
            "the others, in order, with their items"
        );
        assert_eq!(
            g.parts.iter().map(|p| p.len).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert_eq!(
            g.bytes,
            store_len_bound(&g.items[..2]) + store_len_bound(&g.items[2..]),
            "the bytes of the batches left"
        );
        assert!(
            g.deadline >= g.parts[0].deadline && g.deadline >= g.parts[1].deadline,
            "the latest deadline of the batches left"
        );
        assert!(matches!(
            timed_out.try_recv(),
            Ok(Some(Err(WriteError::Timeout)))
        ));
    }

    #[test]
    fn a_retry_leaves_out_the_no_ack_batches_and_keeps_the_others_in_order() {
        let mut g = Group::new();
        g.push(pending(&[1, 1], 1, AckLevel::Quorum));
        g.push(pending(&[2, 2, 2], 1, AckLevel::NoAck));
        g.push(pending(&[3], 1, AckLevel::Leader));
        g.push(pending(&[4, 4], 1, AckLevel::NoAck));
        let mut batch = StoreBatch { items: g.items };
        let mut parts = g.parts;
        leave_out_no_ack(&mut batch, &mut parts);
        let left: Vec<u8> = batch.items.iter().map(|i| i.message[0]).collect();
        assert_eq!(left, vec![1, 1, 3]);
        let out: Vec<bool> = parts.iter().map(|p| p.left_out).collect();
        assert_eq!(out, vec![false, true, false, true]);
        // Again (a second retry): nothing more goes.
        leave_out_no_ack(&mut batch, &mut parts);
        assert_eq!(batch.items.len(), 3);
    }
}
