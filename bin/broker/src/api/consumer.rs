//! `FutureQConsumer.Subscribe`: the first frame subscribes, later frames ACK or NACK, and due
//! messages are pushed as they come from the dispatcher.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futureq_core::hub::{ConsumerId, Delivery, Subscription};
use futureq_core::message::TOPIC_LEN_MAX;
use futureq_core::refusal::{Outcome, Reason, Refusal, WriteError};
use futureq_core::EventKey;
use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb::{consumer_frame, ConsumerFrame, QueueMessage};
use futures::channel::oneshot;
use futures_lite::future;

use super::context::Ctx;
use crate::clock::now_ms;
use crate::dispatcher::{ConsumerSink, HubCmd};
use crate::replication::WriteReq;

/// Most queued deliveries written to the stream in one go.
const SEND_BATCH_MAX: usize = 64;

/// Largest `max_in_flight` a consumer may ask for.
pub const MAX_IN_FLIGHT_MAX: u32 = 65_536;

/// Unregisters the consumer however the stream ends (also when the task is dropped).
struct Registration<'a> {
    ctx: &'a Ctx,
    id: ConsumerId,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.ctx
            .metrics
            .active_consumers
            .fetch_sub(1, Ordering::Relaxed);
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

/// Serves one Subscribe stream.
pub async fn subscribe(
    ctx: &Ctx,
    (access, mut session): (&crate::auth::Access, super::context::Session),
    mut call: Call,
    out: &mut Outbound,
) -> Status {
    let init = match call.inbound.next::<ConsumerFrame>().await {
        Ok(None) => return Status::ok(),
        Err(s) => return s,
        Ok(Some(ConsumerFrame {
            frame: Some(consumer_frame::Frame::Init(init)),
        })) => init,
        Ok(Some(_)) => {
            return Status::invalid("the first ConsumerFrame must be init (SubscribeInit)");
        }
    };
    if init.topic.is_empty() {
        return Status::invalid("SubscribeInit.topic must not be empty");
    }
    if init.topic.len() > TOPIC_LEN_MAX {
        return Status::invalid(format!(
            "SubscribeInit.topic is {} bytes, the limit is {TOPIC_LEN_MAX}",
            init.topic.len()
        ));
    }
    if init.group_id.len() > TOPIC_LEN_MAX {
        return Status::invalid(format!(
            "SubscribeInit.group_id is {} bytes, the limit is {TOPIC_LEN_MAX}",
            init.group_id.len()
        ));
    }
    if let Err(r) = access.consume(&init.topic) {
        return r.into();
    }
    if init.max_in_flight > MAX_IN_FLIGHT_MAX {
        return Status::invalid(format!(
            "SubscribeInit.max_in_flight {} exceeds {MAX_IN_FLIGHT_MAX}",
            init.max_in_flight
        ));
    }
    // Only the leader delivers; the stream ends when its leadership does (standalone:
    // never).
    let view = ctx.repl.view();
    if !view.leading {
        return Refusal::not_leader(&view.leader_addr).into();
    }
    let lost = view.lost.clone();
    drop(view);
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
            return r.into();
        }
    }
    let (tx, rx) = flume::bounded::<Delivery>(max_in_flight as usize);
    let (sink, group_deleted) = ConsumerSink::new(tx);
    let (reply_tx, reply_rx) = oneshot::channel();
    let sub = Subscription {
        topic: init.topic.clone(),
        group: init.group_id.clone(),
        max_in_flight,
    };
    if ctx
        .hub
        .send_async(HubCmd::Register {
            sub,
            sink,
            reply: reply_tx,
        })
        .await
        .is_err()
    {
        return Status::shutting_down();
    }
    let id = match reply_rx.await {
        Ok(Ok(id)) => id,
        Ok(Err(why)) => {
            let whose = if init.group_id.is_empty() {
                format!("topic {:?}", init.topic)
            } else {
                format!(
                    "consumer group {:?} of topic {:?}",
                    init.group_id, init.topic
                )
            };
            return Refusal::new(why.reason(), format!("{whose}: {why}"))
                .with_outcome(Outcome::NotStored)
                .into();
        }
        Err(_) => return Status::shutting_down(),
    };
    ctx.metrics.active_consumers.fetch_add(1, Ordering::Relaxed);
    let _registration = Registration { ctx, id };
    tracing::debug!(target: "consumer", consumer = id.0, topic = %init.topic, group = %init.group_id, "consumer connected");
    // Open the response now so the client knows it is subscribed.
    if let Err(s) = out.start() {
        return s;
    }
    let mut half_closed = false;
    loop {
        // A reload that revokes the caller (or its right to the topic) ends the stream; looked
        // at first, so that a busy stream does not put it off.
        if let Some(again) = session.recheck(ctx, &call) {
            if let Err(r) = again.and_then(|a| a.consume(&init.topic)) {
                tracing::info!(target: "consumer", consumer = id.0, topic = %init.topic, error = %r.message, "ending a subscription: its caller lost the right after a reload");
                return r.into();
            }
        }
        let event = {
            let deliver = async {
                match rx.recv_async().await {
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
                    ctx.shutdown.wait().await;
                    Event::Stop
                },
                async {
                    lost.wait().await;
                    Event::Lost
                },
            );
            let gone = async {
                out.closed().await;
                Event::Gone
            };
            let reloaded = async {
                session.reloaded(ctx).await;
                Event::Reloaded
            };
            future::or(
                future::or(deliver, frame),
                future::or(stop, future::or(gone, reloaded)),
            )
            .await
        };
        match event {
            // Looked at by the next turn.
            Event::Reloaded => {}
            Event::Deliver(d) => {
                // Send whatever else is already queued in the same write.
                let mut batch = vec![d];
                while batch.len() < SEND_BATCH_MAX {
                    match rx.try_recv() {
                        Ok(d) => batch.push(d),
                        Err(_) => break,
                    }
                }
                let now = now_ms();
                let msgs: Vec<QueueMessage> = batch
                    .iter()
                    .map(|d| {
                        let lateness = now - d.message.due_at_ms();
                        #[allow(clippy::cast_precision_loss)]
                        ctx.metrics
                            .delivery_send_lateness_seconds
                            .observe(lateness.max(0) as f64 / 1e3);
                        queue_message(&d.key, &d.message, d.attempt)
                    })
                    .collect();
                if let Err(s) = out.send_all(&msgs).await {
                    return s;
                }
                ctx.metrics
                    .delivery_grpc_sends
                    .fetch_add(msgs.len() as u64, Ordering::Relaxed);
            }
            Event::Frame(Ok(Some(ConsumerFrame {
                frame: Some(consumer_frame::Frame::Ack(a)),
            }))) => {
                ctx.metrics
                    .consumer_acks
                    .add(&[if a.success { "true" } else { "false" }], 1);
                match EventKey::from_slice(&a.delivery_tag) {
                    Ok(key) => {
                        let cmd = HubCmd::Ack {
                            consumer: id,
                            key,
                            success: a.success,
                        };
                        if ctx.hub.send_async(cmd).await.is_err() {
                            return Status::shutting_down();
                        }
                    }
                    Err(e) => {
                        tracing::debug!(target: "consumer", consumer = id.0, error = %e, "ignoring ACK with a malformed delivery tag");
                    }
                }
            }
            Event::Frame(Ok(Some(ConsumerFrame {
                frame: Some(consumer_frame::Frame::Init(_)),
            }))) => {
                return Status::invalid("SubscribeInit may only be the first ConsumerFrame");
            }
            Event::Frame(Ok(Some(ConsumerFrame { frame: None }))) => {}
            // The client will send no more frames (e.g. grpcurl, or a request iterator that
            // ended): keep delivering until it cancels. It can no longer ACK, so what it
            // receives is redelivered after delivery.inFlightTimeout.
            Event::Frame(Ok(None)) => half_closed = true,
            Event::Frame(Err(s)) => return s,
            Event::Stop if group_deleted.load(Ordering::Acquire) => {
                return Status::refused(
                    Reason::NotFound,
                    format!(
                        "consumer group {:?} of topic {:?} was deleted",
                        init.group_id, init.topic
                    ),
                );
            }
            Event::Stop => return Status::shutting_down(),
            Event::Lost => {
                return Refusal::new(
                    Reason::NotLeader,
                    "this node is no longer the cluster leader; reconnect to the leader",
                )
                .with_leader(&ctx.repl.leader_addr())
                .into();
            }
            Event::Gone => {
                return Status::refused(Reason::Cancelled, "client cancelled the stream")
            }
        }
    }
}
