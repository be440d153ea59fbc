//! What other tasks and threads tell the dispatcher ([`HubCmd`]), the consumers' delivery
//! queues ([`ConsumerSink`]), and how applies reach it without blocking the write core
//! ([`HubFeed`]).
//!
//! # Invariants
//! - A notice from an apply is never dropped and never overtakes an earlier one (a deleted
//!   key must not be delivered again).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futureq_core::hub::{ConsumerId, Delivery, Sink, Subscription};
use futureq_core::refusal::WriteError;
use futureq_core::EventKey;
use futures::channel::oneshot;

/// Capacity of the dispatcher's command queue.
pub const HUB_QUEUE_MAX: usize = 65_536;
/// A consumer's delivery queue, bounded by its `max_in_flight`. Dropped by the hub when the
/// consumer is removed: the stream then sees its queue end, and [`ConsumerSink::group_deleted`]
/// says whether that was because its group was deleted.
pub struct ConsumerSink {
    tx: flume::Sender<Delivery>,
    /// The queue's bound, read once: flume's `capacity()` takes the queue's lock, and the hub
    /// asks for room before every delivery.
    capacity: usize,
    group_deleted: Arc<AtomicBool>,
}

impl ConsumerSink {
    /// A sink over `tx`, and the flag set before it is dropped because the consumer's group
    /// was deleted.
    #[must_use]
    pub fn new(tx: flume::Sender<Delivery>) -> (ConsumerSink, Arc<AtomicBool>) {
        let flag = Arc::new(AtomicBool::new(false));
        let sink = ConsumerSink {
            capacity: tx.capacity().unwrap_or(usize::MAX),
            tx,
            group_deleted: Arc::clone(&flag),
        };
        (sink, flag)
    }

    /// Says, before the hub drops it, that the consumer's group was deleted.
    pub(super) fn mark_group_deleted(&self) {
        self.group_deleted
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Sink for ConsumerSink {
    fn try_send(&self, d: Delivery) -> bool {
        self.tx.try_send(d).is_ok()
    }

    fn room(&self) -> usize {
        if self.tx.is_disconnected() {
            return 0;
        }
        self.capacity.saturating_sub(self.tx.len())
    }
}

/// Why the dispatcher did not register a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegisterRefused {
    /// The durable group registry could not be read.
    #[error("cannot read the topic's consumer groups; retry")]
    RegistryUnreadable,
    /// The group is not in the registry: it was deleted after the stream registered it.
    #[error("the consumer group was deleted while subscribing; subscribe again")]
    GroupDeleted,
    /// A deletion of the group is in progress.
    #[error("the consumer group is being deleted; subscribe again (a new group)")]
    GroupDeleting,
}

impl RegisterRefused {
    /// Why, for the client.
    #[must_use]
    pub fn reason(&self) -> futureq_core::refusal::Reason {
        use futureq_core::refusal::Reason;
        match self {
            RegisterRefused::RegistryUnreadable => Reason::Internal,
            RegisterRefused::GroupDeleted | RegisterRefused::GroupDeleting => Reason::Conflict,
        }
    }
}

/// The answer of [`HubCmd::DeleteGroup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupDeleted {
    /// The group was registered.
    pub found: bool,
    /// Its members' streams ended by the deletion.
    pub consumers_ended: u32,
}

/// Per topic, the consumer groups the hub knows ([`HubCmd::Groups`]).
pub type GroupsByTopic = std::collections::HashMap<
    futureq_core::TopicHash,
    std::collections::BTreeMap<String, futureq_core::hub::GroupActivity>,
>;

/// What other tasks and threads tell the dispatcher.
pub enum HubCmd {
    /// A Subscribe stream started.
    Register {
        /// What it asked for.
        sub: Subscription,
        /// Where its deliveries go.
        sink: ConsumerSink,
        /// Its id, or why it was not registered.
        reply: oneshot::Sender<Result<ConsumerId, RegisterRefused>>,
    },
    /// The ACK and NACK frames one read of a stream held, in their order.
    Acks {
        /// The stream.
        consumer: ConsumerId,
        /// Each delivery tag, ACK (true) or NACK.
        acks: Vec<(EventKey, bool)>,
    },
    /// A Subscribe stream ended.
    Unregister(ConsumerId),
    /// A commit stored messages; the smallest key per topic.
    Published(Vec<EventKey>),
    /// The TTL sweeper deleted these keys.
    Expired(Vec<EventKey>),
    /// A delete flush finished.
    DeleteFlushed {
        /// Whether it committed.
        committed: bool,
    },
    /// Keys a cancel deleted: dropped from memory (read-ahead copies, waiting recipients,
    /// deliveries in flight) like [`HubCmd::Expired`], then answered. Commands are handled
    /// between passes, so once answered no scan that read the store before the commit can
    /// deliver them. Carries its own keys: the apply's notice may reach the hub later (it
    /// goes through a task when the queue is full).
    Revoke {
        /// The keys.
        keys: Vec<EventKey>,
        /// Answered once they are dropped.
        done: oneshot::Sender<()>,
    },
    /// A dead letter's command ended: committed or not.
    DeadLettered {
        /// The recipient that gave up.
        dl: futureq_core::hub::DeadLetter,
        /// Whether the command committed.
        committed: bool,
    },
    /// Delete a consumer group (`DeleteGroup`): its registration goes through the write
    /// path, then [`HubCmd::GroupGone`] ends its members and drops it from the hub. Run by the
    /// dispatcher, not the caller, so a caller that goes away midway leaves no group whose
    /// registration is gone while the hub still holds messages for it.
    DeleteGroup {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// What was done, or why the deletion did not commit.
        reply: oneshot::Sender<Result<GroupDeleted, WriteError>>,
    },
    /// A group's deletion ended: committed (`Some(found)`: drop it from the hub and answer),
    /// or failed with an unknown outcome a proposal timeout ago (`None`: drop it if the
    /// registry no longer has it, a commit that came late).
    GroupGone {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// Committed, and whether it was registered.
        committed: Option<bool>,
        /// Where the answer goes (answered already when the deletion failed).
        reply: Option<oneshot::Sender<Result<GroupDeleted, WriteError>>>,
    },
    /// Per topic (or only one), the consumer groups the hub knows (`TopicStats`).
    Groups {
        /// Only this topic.
        only: Option<futureq_core::TopicHash>,
        /// The answer.
        reply: oneshot::Sender<GroupsByTopic>,
    },
    /// Per topic with consumers: its streams and deliveries in flight (`TopicStats`).
    Activity(
        oneshot::Sender<
            std::collections::HashMap<futureq_core::TopicHash, futureq_core::hub::TopicActivity>,
        >,
    ),
}

/// What an apply tells the dispatcher (on every replica, and standalone): the smallest new
/// key per topic (a scan cursor that passed it moves back) and the deleted keys (never
/// delivered again). Called on the write core's executor, never blocking it (see
/// [`HubFeed`]).
pub fn applied_to_hub(hub: crate::mailbox::Mailbox<HubCmd>) -> impl Fn(&[EventKey], &[EventKey]) {
    let feed = HubFeed::new(hub);
    move |published: &[EventKey], deleted: &[EventKey]| {
        if !published.is_empty() {
            feed.send(HubCmd::Published(published.to_vec()));
        }
        if !deleted.is_empty() {
            feed.send(HubCmd::Expired(deleted.to_vec()));
        }
    }
}

/// Sends the applies' notices to the dispatcher in order without blocking the write core:
/// when the hub's queue is full they wait in an overflow queue that one task forwards (never
/// one task per notice). A notice is never dropped (a deleted key must not be delivered
/// again). The overflow holds what the applies produced while the dispatcher was behind:
/// consecutive `Published` notices are merged into one (only the smallest key per topic
/// matters), so it grows with the deleted keys alone, which the applies bound.
pub(crate) struct HubFeed {
    hub: crate::mailbox::Mailbox<HubCmd>,
    overflow: Rc<RefCell<VecDeque<HubCmd>>>,
    forwarding: Rc<Cell<bool>>,
}

impl HubFeed {
    pub(crate) fn new(hub: crate::mailbox::Mailbox<HubCmd>) -> Self {
        HubFeed {
            hub,
            overflow: Rc::default(),
            forwarding: Rc::default(),
        }
    }

    /// Sends `cmd` after every notice sent before it.
    pub(crate) fn send(&self, cmd: HubCmd) {
        // While the forwarder runs (it may hold a notice in its send), later ones queue
        // behind it: the order does not rest on how the channel admits waiting senders.
        if self.overflow.borrow().is_empty() && !self.forwarding.get() {
            match self.hub.try_send(cmd) {
                Ok(()) | Err(flume::TrySendError::Disconnected(_)) => return,
                Err(flume::TrySendError::Full(cmd)) => self.overflow.borrow_mut().push_back(cmd),
            }
        } else {
            let mut q = self.overflow.borrow_mut();
            match (q.back_mut(), cmd) {
                (Some(HubCmd::Published(keys)), HubCmd::Published(more)) => {
                    keys.extend(more);
                    *keys = futureq_core::key::min_key_per_topic(std::mem::take(keys));
                }
                (_, cmd) => q.push_back(cmd),
            }
        }
        if !self.forwarding.replace(true) {
            let (hub, overflow, forwarding) = (
                self.hub.clone(),
                Rc::clone(&self.overflow),
                Rc::clone(&self.forwarding),
            );
            glommio::spawn_local(async move {
                loop {
                    let Some(cmd) = overflow.borrow_mut().pop_front() else {
                        break;
                    };
                    if hub.send_async(cmd).await.is_err() {
                        overflow.borrow_mut().clear();
                        break;
                    }
                }
                forwarding.set(false);
            })
            .detach();
        }
    }

    /// Notices waiting for room in the hub's queue.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.overflow.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futureq_core::{Bucket, EventId, TopicHash};

    fn key(topic: u64, id: u64) -> EventKey {
        EventKey::new(TopicHash(topic), Bucket(0), EventId(id))
    }

    /// Issue 26.8: notices sent while the hub's queue is full wait in one overflow queue (no
    /// task per notice), merged where they may be, and arrive in order, none lost.
    #[test]
    fn notices_past_a_full_hub_queue_wait_in_order_in_one_queue() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async {
                let (tx, rx) =
                    crate::mailbox::Mailbox::<HubCmd>::bounded(1, 0, std::sync::Arc::default());
                let feed = HubFeed::new(tx);
                for i in 0..1000u64 {
                    feed.send(HubCmd::Published(vec![key(i % 3, 10_000 - i)]));
                    if i % 100 == 99 {
                        feed.send(HubCmd::Expired(vec![key(1, i)]));
                    }
                }
                // The first went into the queue, the forwarder may hold the next; the rest
                // wait, each run of Published merged into one notice of the smallest key per
                // topic.
                assert!(feed.waiting() <= 20, "{} waiting", feed.waiting());
                let mut got = Vec::new();
                let mut deletes = 0;
                while deletes < 10 {
                    let cmd = rx.recv_async().await.expect("forwarded");
                    deletes += usize::from(matches!(cmd, HubCmd::Expired(_)));
                    got.push(cmd);
                }
                assert!(got.len() <= 22, "{} notices", got.len());
                assert_eq!(feed.waiting(), 0);
                assert!(rx.is_empty(), "nothing after the last delete");
                let mut deleted = Vec::new();
                let mut smallest = std::collections::BTreeMap::new();
                for cmd in got {
                    match cmd {
                        HubCmd::Published(keys) => {
                            for k in keys {
                                let m = smallest.entry(k.topic_hash()).or_insert(k);
                                *m = (*m).min(k);
                            }
                        }
                        HubCmd::Expired(keys) => deleted.extend(keys),
                        _ => panic!("unexpected notice"),
                    }
                }
                let want: Vec<EventKey> = (0..10).map(|n| key(1, n * 100 + 99)).collect();
                assert_eq!(deleted, want, "every delete, in order");
                assert_eq!(smallest.len(), 3);
                assert_eq!(smallest[&TopicHash(0)], key(0, 10_000 - 999));
            })
            .expect("executor")
            .join()
            .expect("test body");
    }
}
