//! `FutureQConsumer.Subscribe`: the first frame subscribes, later frames ACK or NACK, and due
//! messages are pushed as they come from the dispatcher.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futureq_core::hub::{ConsumerId, Delivery, Subscription};
use futureq_core::message::TOPIC_LEN_MAX;
use futureq_core::refusal::{Outcome, Reason, Refusal, WriteError};
use futureq_core::EventKey;
use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb::{consumer_frame, AckRequest, ConsumerFrame, QueueMessage, SubscribeInit};
use futures::channel::oneshot;
use futures_lite::future;

use super::context::Ctx;
use crate::clock::now_ms;
use crate::dispatcher::{ConsumerSink, HubCmd};
use crate::replication::WriteReq;

/// Most queued deliveries written to the stream in one go.
const SEND_BATCH_MAX: usize = 64;
/// Most ACK and NACK frames taken into one dispatcher command (the rest of a long read go in
/// the next). The hub's inbox is bounded in commands (`dispatcher::HUB_QUEUE_MAX`, 65,536):
/// with 64 tags of 24 bytes each it holds at most ~100 MiB of them.
const ACKS_PER_COMMAND_MAX: u64 = 64;

/// How often a stream waiting for its lease looks again while the Raft core has not yet
/// seen that the lease ran out (see `Stream::lease_held`).
const LEASE_RECHECK: Duration = Duration::from_millis(5);

/// Largest `max_in_flight` a consumer may ask for.
pub const MAX_IN_FLIGHT_MAX: u32 = 65_536;

/// Unregisters the consumer however the stream ends (also when the task is dropped).
struct Registration<'a> {
    ctx: &'a Ctx,
    id: ConsumerId,
    /// This stream's executor's series of `futureq_consumer_streams`.
    on_core: prometheus_client::metrics::gauge::Gauge,
}

impl<'a> Registration<'a> {
    fn new(ctx: &'a Ctx, id: ConsumerId) -> Self {
        // Streams run on executors only (each marks its thread).
        let core = crate::mailbox::current_core().map_or_else(String::new, |c| c.to_string());
        let on_core = ctx
            .metrics
            .consumer_streams
            .get_or_create(&vec![("core", core)])
            .clone();
        ctx.metrics.active_consumers.inc();
        on_core.inc();
        Registration { ctx, id, on_core }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.ctx.metrics.active_consumers.dec();
        self.on_core.dec();
        let cmd = HubCmd::Unregister(self.id);
        if let Err(flume::TrySendError::Full(cmd)) = self.ctx.hub.try_send(cmd) {
            let hub = self.ctx.hub.clone();
            glommio::spawn_local(async move {
                let _ = hub.send_async(cmd).await;
            })
            .detach();
        }
    }
}

/// A stored message as the API shows it (a delivery, a peeked message: `attempt` 0).
pub(super) fn queue_message(
    key: &futureq_core::EventKey,
    m: &futureq_core::StoredMessage,
    attempt: u32,
) -> QueueMessage {
    QueueMessage {
        topic: m.topic.clone(),
        payload: m.payload.clone(),
        delivery_tag: Bytes::copy_from_slice(&key.0),
        enqueued_at_unix_ms: m.enqueued_at_ms,
        delay_ms: m.delay.0,
        attempt,
        origin_topic: m.extras.origin_topic.clone(),
        origin_group: m.extras.origin_group.clone(),
    }
}

enum Event {
    Deliver(Delivery),
    Reloaded,
    Frame(Result<Option<ConsumerFrame>, Status>),
    Stop,
    Lost,
    Gone,
}

/// Makes sure `group` is in the durable group registry of `topic` before its first member
/// takes messages: from then on the group is owed every message of the topic, also across
/// disconnects, restarts and failovers (a `RegisterGroup` command: durable in the journal
/// standalone, committed by a quorum in a cluster).
async fn register_group(ctx: &Ctx, topic: &str, group: &str) -> Result<(), WriteError> {
    let deadline = std::time::Instant::now() + ctx.settings.proposal_timeout;
    ctx.repl
        .request(|reply| WriteReq::RegisterGroup {
            topic_hash: futureq_core::topic_hash(topic),
            group: group.to_owned(),
            deadline,
            reply,
        })
        .await
}

/// Serves one Subscribe stream: its init (validated), the consumer registered with the
/// dispatcher, then the delivery loop until the stream or the leadership ends.
pub async fn subscribe(
    ctx: &Ctx,
    (access, mut session): (&crate::auth::Access, super::context::Session),
    mut call: Call,
    out: &mut Outbound,
) -> Status {
    let init = match read_init(&mut call, access).await {
        Ok(Some(init)) => init,
        Ok(None) => return Status::ok(),
        Err(s) => return s,
    };
    // Only the leader delivers; the stream ends when its leadership does (standalone:
    // never).
    let view = ctx.repl.view();
    if !ctx.repl.leading() {
        return Refusal::not_leader(&ctx.repl.leader_addr()).into();
    }
    let lost = view.lost.clone();
    drop(view);
    let consumer = match join(ctx, &init).await {
        Ok(c) => c,
        Err(s) => return s,
    };
    let _registration = Registration::new(ctx, consumer.id);
    tracing::debug!(target: "consumer", consumer = consumer.id.0, topic = %init.topic, group = %init.group_id, "consumer connected");
    // Open the response now so the client knows it is subscribed.
    if let Err(s) = out.start() {
        return s;
    }
    let stream = Stream {
        ctx,
        init: &init,
        consumer: &consumer,
        lost: &lost,
    };
    stream.run(&mut session, &mut call, out).await
}

/// Reads and checks the stream's first frame (`None`: the client sent none).
async fn read_init(
    call: &mut Call,
    access: &crate::auth::Access,
) -> Result<Option<SubscribeInit>, Status> {
    let init = match call.inbound.next::<ConsumerFrame>().await? {
        None => return Ok(None),
        Some(ConsumerFrame {
            frame: Some(consumer_frame::Frame::Init(init)),
        }) => init,
        Some(_) => {
            return Err(Status::invalid(
                "the first ConsumerFrame must be init (SubscribeInit)",
            ));
        }
    };
    if init.topic.is_empty() {
        return Err(Status::invalid("SubscribeInit.topic must not be empty"));
    }
    for (field, value) in [("topic", &init.topic), ("group_id", &init.group_id)] {
        if value.len() > TOPIC_LEN_MAX {
            return Err(Status::invalid(format!(
                "SubscribeInit.{field} is {} bytes, the limit is {TOPIC_LEN_MAX}",
                value.len()
            )));
        }
    }
    access.consume(&init.topic)?;
    if init.max_in_flight > MAX_IN_FLIGHT_MAX {
        return Err(Status::invalid(format!(
            "SubscribeInit.max_in_flight {} exceeds {MAX_IN_FLIGHT_MAX}",
            init.max_in_flight
        )));
    }
    Ok(Some(init))
}

/// A consumer the dispatcher registered: its id, its delivery queue, and the flag set when
/// its group is deleted.
struct Joined {
    id: ConsumerId,
    deliveries: flume::Receiver<Delivery>,
    group_deleted: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Registers the stream's group durably (when it names one), then the consumer with the
/// dispatcher.
async fn join(ctx: &Ctx, init: &SubscribeInit) -> Result<Joined, Status> {
    let max_in_flight = if init.max_in_flight == 0 {
        ctx.settings.consumer_queue_size
    } else {
        init.max_in_flight
    };
    if !init.group_id.is_empty() {
        if let Err(e) = register_group(ctx, &init.topic, &init.group_id).await {
            tracing::warn!(target: "consumer", topic = %init.topic, group = %init.group_id, error = %e, "group registration failed");
            let mut r = super::context::write_refusal(ctx, "the group's registration", &e);
            r.message = format!(
                "cannot register consumer group {:?} of topic {:?}: {}",
                init.group_id, init.topic, r.message
            );
            return Err(r.into());
        }
    }
    let (tx, deliveries) = flume::bounded::<Delivery>(max_in_flight as usize);
    let (sink, group_deleted) = ConsumerSink::new(tx);
    let (reply, answer) = oneshot::channel();
    let sub = Subscription {
        topic: init.topic.clone(),
        group: init.group_id.clone(),
        max_in_flight,
    };
    let cmd = HubCmd::Register { sub, sink, reply };
    if ctx.hub.send_async(cmd).await.is_err() {
        return Err(Status::shutting_down());
    }
    match answer.await {
        Ok(Ok(id)) => Ok(Joined {
            id,
            deliveries,
            group_deleted,
        }),
        Ok(Err(why)) => {
            let whose = if init.group_id.is_empty() {
                format!("topic {:?}", init.topic)
            } else {
                format!(
                    "consumer group {:?} of topic {:?}",
                    init.group_id, init.topic
                )
            };
            Err(Refusal::new(why.reason(), format!("{whose}: {why}"))
                .with_outcome(Outcome::NotStored)
                .into())
        }
        Err(_) => Err(Status::shutting_down()),
    }
}

/// A second `SubscribeInit` on a stream.
fn init_again() -> Status {
    Status::invalid("SubscribeInit may only be the first ConsumerFrame")
}

/// A subscribed stream's delivery loop.
struct Stream<'a> {
    ctx: &'a Ctx,
    init: &'a SubscribeInit,
    consumer: &'a Joined,
    lost: &'a futureq_net::Shutdown,
}

impl Stream<'_> {
    /// Delivers, takes ACKs and NACKs, until the stream, the broker or the leadership ends.
    async fn run(
        &self,
        session: &mut super::context::Session,
        call: &mut Call,
        out: &mut Outbound,
    ) -> Status {
        let (ctx, init, id) = (self.ctx, self.init, self.consumer.id);
        let mut half_closed = false;
        loop {
            // A reload that revokes the caller (or its right to the topic) ends the stream;
            // looked at first, so that a busy stream does not put it off.
            if let Some(again) = session.recheck(ctx, call) {
                if let Err(r) = again.and_then(|a| a.consume(&init.topic)) {
                    tracing::info!(target: "consumer", consumer = id.0, topic = %init.topic, error = %r.message, "ending a subscription: its caller lost the right after a reload");
                    return r.into();
                }
            }
            let ended = match self.next_event(session, call, out, half_closed).await {
                // Looked at by the next turn.
                Event::Reloaded => None,
                Event::Deliver(d) => self.deliver(d, out).await.err(),
                Event::Frame(Ok(Some(ConsumerFrame {
                    frame: Some(consumer_frame::Frame::Ack(a)),
                }))) => self.acks(a, call).await.err(),
                Event::Frame(Ok(Some(ConsumerFrame {
                    frame: Some(consumer_frame::Frame::Init(_)),
                }))) => Some(init_again()),
                Event::Frame(Ok(Some(ConsumerFrame { frame: None }))) => None,
                // The client will send no more frames (e.g. grpcurl, or a request iterator
                // that ended): keep delivering until it cancels. It can no longer ACK, so what
                // it receives is redelivered after delivery.inFlightTimeout.
                Event::Frame(Ok(None)) => {
                    half_closed = true;
                    None
                }
                Event::Frame(Err(s)) => Some(s),
                Event::Stop => Some(self.stopped()),
                Event::Lost => Some(self.lost_leadership()),
                Event::Gone => Some(Status::refused(
                    Reason::Cancelled,
                    "client cancelled the stream",
                )),
            };
            if let Some(s) = ended {
                return s;
            }
        }
    }

    /// The next thing that happens to the stream.
    async fn next_event(
        &self,
        session: &mut super::context::Session,
        call: &mut Call,
        out: &mut Outbound,
        half_closed: bool,
    ) -> Event {
        let deliver = async {
            match self.consumer.deliveries.recv_async().await {
                Ok(d) => Event::Deliver(d),
                Err(_) => Event::Stop,
            }
        };
        let frame = async {
            if half_closed {
                future::pending::<()>().await;
            }
            Event::Frame(call.inbound.next::<ConsumerFrame>().await)
        };
        let stop = future::or(
            async {
                self.ctx.shutdown.wait().await;
                Event::Stop
            },
            async {
                self.lost.wait().await;
                Event::Lost
            },
        );
        let gone = async {
            out.closed().await;
            Event::Gone
        };
        let reloaded = async {
            session.reloaded(self.ctx).await;
            Event::Reloaded
        };
        future::or(
            future::or(deliver, frame),
            future::or(stop, future::or(gone, reloaded)),
        )
        .await
    }

    /// Sends `first` and whatever else is already queued, in one write, once the lease is
    /// held.
    async fn deliver(&self, first: Delivery, out: &mut Outbound) -> Result<(), Status> {
        self.lease_held().await?;
        let mut batch = vec![first];
        while batch.len() < SEND_BATCH_MAX {
            match self.consumer.deliveries.try_recv() {
                Ok(d) => batch.push(d),
                Err(_) => break,
            }
        }
        let now = now_ms();
        let metrics = &self.ctx.metrics;
        let msgs: Vec<QueueMessage> = batch
            .iter()
            .map(|d| {
                let lateness = now - d.message.due_at_ms();
                #[allow(clippy::cast_precision_loss)]
                metrics
                    .delivery_send_lateness_seconds
                    .observe(lateness.max(0) as f64 / 1e3);
                queue_message(&d.key, &d.message, d.attempt)
            })
            .collect();
        out.send_all(&msgs).await?;
        metrics.delivery_grpc_sends.inc_by(msgs.len() as u64);
        Ok(())
    }

    /// Hands `first` and the ACK and NACK frames that came with it (those
    /// [`Inbound::next_ready`] gives, up to [`ACKS_PER_COMMAND_MAX`] frames) to the dispatcher
    /// as one command, not one per ACK. A malformed tag is ignored; another frame among them
    /// ends the batch and is handled as it would be alone, after the batch (an error too).
    ///
    /// [`Inbound::next_ready`]: futureq_net::grpc::server::Inbound::next_ready
    async fn acks(&self, first: AckRequest, call: &mut Call) -> Result<(), Status> {
        let ctx = self.ctx;
        let mut acks = Vec::new();
        let (mut taken, mut nacks) = (0u64, 0u64);
        let mut next = Some(first);
        // What ends the batch: another frame, or the stream's error (h2 hands out the data
        // it holds before a reset, so ACKs come first and still count).
        let mut after = Ok(None);
        while let Some(a) = next.take() {
            taken += 1;
            nacks += u64::from(!a.success);
            match EventKey::from_slice(&a.delivery_tag) {
                Ok(key) => acks.push((key, a.success)),
                Err(e) => {
                    tracing::debug!(target: "consumer", consumer = self.consumer.id.0, error = %e, "ignoring ACK with a malformed delivery tag");
                }
            }
            if taken >= ACKS_PER_COMMAND_MAX {
                break;
            }
            match call.inbound.next_ready::<ConsumerFrame>().await {
                Ok(Some(ConsumerFrame {
                    frame: Some(consumer_frame::Frame::Ack(a)),
                })) => next = Some(a),
                other => after = other,
            }
        }
        for (label, n) in [("true", taken - nacks), ("false", nacks)] {
            if n > 0 {
                ctx.metrics.consumer_acks.add(&[label], n);
            }
        }
        if !acks.is_empty() {
            let cmd = HubCmd::Acks {
                consumer: self.consumer.id,
                acks,
            };
            if ctx.hub.send_async(cmd).await.is_err() {
                return Err(Status::shutting_down());
            }
        }
        match after? {
            Some(ConsumerFrame {
                frame: Some(consumer_frame::Frame::Init(_)),
            }) => Err(init_again()),
            _ => Ok(()),
        }
    }

    /// Returns once this node holds its lease: at once, or after a lapse in the same term
    /// (deliveries held: a deposed leader must not hand out what the new one will deliver).
    /// Bounded: a leader that hears no quorum stops leading by its deadline (13 rtt), and then
    /// this ends with NOT_LEADER, even while the Raft core does not run; the broker's stop
    /// ends it too. A lease past its deadline that the Raft core
    /// has not yet seen ended (it did not run since) is looked at again every
    /// [`LEASE_RECHECK`]: that core's next look ends the lapse or the leadership.
    async fn lease_held(&self) -> Result<(), Status> {
        while !self.ctx.repl.lease() {
            // Past its own deadline the leadership is over, whether or not the Raft core
            // (perhaps wedged) has said so.
            if self.lost.is_triggered() || !self.ctx.repl.leading() {
                return Err(self.lost_leadership());
            }
            if self.ctx.shutdown.is_triggered() {
                return Err(self.stopped());
            }
            let view = self.ctx.repl.view();
            // Fired when the lease is back, unless the view still holds it (then it is
            // the last lapse's signal, fired already).
            let back = (!view.lease).then(|| view.lease_back.clone());
            drop(view);
            let lost = async {
                self.lost.wait().await;
                Err(self.lost_leadership())
            };
            let stop = async {
                self.ctx.shutdown.wait().await;
                Err(self.stopped())
            };
            let back = async {
                match back {
                    Some(back) => back.wait().await,
                    None => glommio::timer::sleep(LEASE_RECHECK).await,
                }
                Ok(())
            };
            future::or(back, future::or(lost, stop)).await?;
        }
        Ok(())
    }

    /// The status a stream ends with when this node's leadership ends.
    fn lost_leadership(&self) -> Status {
        Refusal::new(
            Reason::NotLeader,
            "this node is no longer the cluster leader; reconnect to the leader",
        )
        .with_leader(&self.ctx.repl.leader_addr())
        .into()
    }

    /// How the stream ends when its delivery queue closed or the broker stops.
    fn stopped(&self) -> Status {
        if self.consumer.group_deleted.load(Ordering::Acquire) {
            return Status::refused(
                Reason::NotFound,
                format!(
                    "consumer group {:?} of topic {:?} was deleted",
                    self.init.group_id, self.init.topic
                ),
            );
        }
        Status::shutting_down()
    }
}
