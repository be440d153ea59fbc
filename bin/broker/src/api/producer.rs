//! `FutureQProducer.PublishStream`: batches in, one ack per batch out.
//!
//! Batches are pipelined: up to [`PIPELINE_MAX`] batches and [`PIPELINE_BYTES_MAX`] bytes may
//! be outstanding per stream, and all streams of a node together take a batch in only while
//! less than [`crate::budget::IN_SERVICE_BYTES_MAX`] is in service. Acks of the
//! durable levels (QUORUM, LEADER) come back in the order their batches arrived, and so do
//! NO_ACK acks; a NO_ACK ack is never ordered behind a durable commit (its batch does share
//! the node's budget with the durable ones).

use std::cell::Cell;
use std::rc::Rc;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use futureq_core::command::StoreItem;
use futureq_core::message::TOPIC_LEN_MAX;
use futureq_core::publish::{validate_batch, validate_message, validate_options};
use futureq_core::refusal::{Outcome as WriteOutcome, Reason, Refusal, WriteError};
use futureq_core::{
    bucket_of, topic_hash, AckLevel, Bucket, DelayMs, EventId, EventKey, Extras, IndexValue,
    StoredMessage, TopicHash, TtlMs, ValidationError,
};
use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb::{self, index, PublishBatchAck};
use futures::channel::oneshot;
use futures::stream::{FuturesOrdered, StreamExt};
use futures_lite::future;

use super::context::Ctx;
use crate::auth::Access;
use crate::budget::Admitted;
use crate::clock::now_ms;
use crate::replication::{Stored, WriteReq};

/// Most batches outstanding (received, not yet acked) on one stream. Beyond it the stream
/// stops reading, and HTTP/2 flow control pushes back on the client.
pub const PIPELINE_MAX: usize = 1024;
/// Most encoded batch bytes outstanding on one stream, from read until its write returns (same
/// back-pressure as [`PIPELINE_MAX`]): a quarter of the node's
/// [`crate::budget::IN_SERVICE_BYTES_MAX`], so that one stream cannot take it all.
pub const PIPELINE_BYTES_MAX: usize = 4 << 20;
// A stream's whole pipeline is never shed by the queue-delay limit of an idle node.
const _: () = assert!(crate::budget::BATCHES_IN_SERVICE_MIN >= PIPELINE_MAX as u64);

type AckFuture = std::pin::Pin<Box<dyn std::future::Future<Output = PublishBatchAck>>>;

/// The ack of a batch refused: its code, reason and outcome from the one table
/// ([`futureq_net::grpc::status`]).
fn reject(batch_id: u64, r: Refusal) -> PublishBatchAck {
    let (error_code, error_reason, write_outcome) = futureq_net::grpc::status::wire(&r);
    PublishBatchAck {
        success: false,
        error_message: r.message,
        batch_id,
        error_code,
        delivery_tags: Vec::new(),
        leader_address: r.leader,
        error_reason,
        write_outcome,
        retry_after_ms: r.retry_after.map_or(0, |d| {
            u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
        }),
    }
}

fn index_value(i: usize, j: usize, idx: pb::Index) -> Result<IndexValue, ValidationError> {
    match idx.value {
        Some(index::Value::Int64Value(v)) => Ok(IndexValue::Int64(v)),
        Some(index::Value::StringValue(s)) => Ok(IndexValue::String(s)),
        None => Err(ValidationError::Field {
            index: i,
            field: "indexes",
            reason: format!("indexes[{j}] has no value (set int64_value or string_value)"),
        }),
    }
}

/// Validates a batch and encodes its messages as store items without ids (ids are assigned
/// only to a valid batch, by the write core as the batch enters its log). Also returns the
/// metrics' `topic` label: the batch's topic, or "" for a batch of several.
fn prepare(
    ctx: &Ctx,
    access: &Access,
    batch: pb::PublishBatch,
    level: AckLevel,
    enqueued_at_ms: i64,
) -> Result<(Vec<StoreItem>, String), Refusal> {
    let limits = ctx.settings.publish_limits();
    validate_batch(batch.messages.len(), level, &limits)
        .map_err(|e| Refusal::invalid(e.to_string()))?;
    for (i, m) in batch.messages.iter().enumerate() {
        check_message(ctx, access, i, m, enqueued_at_ms)?;
    }
    // The batch's one topic for the metrics label ("" once a second one shows).
    let mut label: Option<String> = None;
    let mut items = Vec::with_capacity(batch.messages.len());
    for (i, m) in batch.messages.into_iter().enumerate() {
        let item = store_item(&ctx.settings, i, m, enqueued_at_ms)?;
        match &label {
            None => label = Some(item.1),
            Some(t) if !t.is_empty() && *t != item.1 => label = Some(String::new()),
            Some(_) => {}
        }
        items.push(item.0);
    }
    // The batch is one log entry, and a log record must fit in a segment.
    let entry = futureq_core::command::store_len_bound(&items);
    if entry > futureq_core::command::ENTRY_BYTES_MAX {
        return Err(Refusal::new(
            Reason::TooLarge,
            format!(
                "PublishBatch: its {} messages would make a log entry of up to {entry} bytes, over the limit of {} bytes; split the batch (nothing of it was stored)",
                items.len(),
                futureq_core::command::ENTRY_BYTES_MAX
            ),
        ));
    }
    Ok((items, label.unwrap_or_default()))
}

/// Checks message `i` of a batch: its fields, the caller's right to publish to its topic and
/// to its dead-letter topic, and that a consumer stream can carry its delivery.
fn check_message(
    ctx: &Ctx,
    access: &Access,
    i: usize,
    m: &pb::PublishMessage,
    enqueued_at_ms: i64,
) -> Result<(), Refusal> {
    let invalid = |e: ValidationError| Refusal::invalid(e.to_string());
    let s = &ctx.settings;
    let limits = s.publish_limits();
    validate_message(i, &m.topic, m.delay_ms, m.ttl_ms, m.indexes.len(), &limits)
        .map_err(invalid)?;
    validate_options(i, &m.topic, &m.dedup_id, &m.dead_letter_topic).map_err(invalid)?;
    let denied = |r: Refusal| {
        Refusal::new(
            r.reason,
            format!(
                "PublishBatch.messages[{i}]: {}; nothing of the batch was stored",
                r.message
            ),
        )
    };
    access.publish(&m.topic).map_err(denied)?;
    // Its dead letters are published to their topic in the publisher's name.
    access
        .publish_dead_letters(&m.topic, &m.dead_letter_topic)
        .map_err(denied)?;
    let dead_letters = m.max_attempts > 0 || s.max_attempts > 0;
    let dlq = futureq_core::message::dead_letter_topic_len(&m.topic, &m.dead_letter_topic);
    if dead_letters && dlq > TOPIC_LEN_MAX {
        return Err(Refusal::invalid(format!(
            "PublishBatch.messages[{i}].dead_letter_topic: the default \"<topic>.dlq\" would be {dlq} bytes, over the limit of {TOPIC_LEN_MAX}; name one"
        )));
    }
    // A message no consumer stream could carry would block its topic forever.
    let delivery = delivery_len(m, enqueued_at_ms);
    if delivery > s.max_send_message_len {
        return Err(Refusal::new(
            Reason::TooLarge,
            format!(
                "PublishBatch.messages[{i}]: its delivery would be {delivery} bytes, over api.grpc.maxSendMessageSize ({} bytes); nothing of the batch was stored",
                s.max_send_message_len
            ),
        ));
    }
    Ok(())
}

/// Message `i` (checked) as a store item without its id, and its topic.
fn store_item(
    s: &crate::config::Settings,
    i: usize,
    m: pb::PublishMessage,
    enqueued_at_ms: i64,
) -> Result<(StoreItem, String), Refusal> {
    let indexes = m
        .indexes
        .into_iter()
        .enumerate()
        .map(|(j, x)| index_value(i, j, x))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Refusal::invalid(e.to_string()))?;
    let dedup_until_ms = if m.dedup_id.is_empty() {
        0
    } else {
        enqueued_at_ms.saturating_add(i64::try_from(s.dedup_window.as_millis()).unwrap_or(i64::MAX))
    };
    let stored = StoredMessage {
        topic: m.topic,
        payload: m.payload,
        enqueued_at_ms,
        delay: DelayMs(m.delay_ms),
        ttl: TtlMs(m.ttl_ms),
        indexes,
        extras: Extras {
            dedup_id: m.dedup_id,
            dedup_until_ms,
            max_attempts: m.max_attempts,
            dead_letter_topic: m.dead_letter_topic,
            ..Extras::default()
        },
    };
    let item = StoreItem {
        event_id: 0,
        bucket: bucket_of(stored.due_at_ms(), s.time_bucket_ms).0,
        topic_hash: topic_hash(&stored.topic).0,
        expires_at_ms: stored.expires_at_ms().unwrap_or(0),
        index_keys: stored.indexes.iter().map(IndexValue::index_key).collect(),
        message: Vec::from(stored.encode()),
    };
    Ok((item, stored.topic))
}

/// The encoded size of the largest `QueueMessage` that delivers `m` (every field at its
/// widest: a 24-byte tag, the largest attempt counter), counted field by field as prost
/// encodes them (a field at its default value is left out), without building the message:
/// this runs for every published message.
fn delivery_len(m: &pb::PublishMessage, enqueued_at_ms: i64) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    let bytes = |tag, len: usize| {
        if len == 0 {
            0
        } else {
            key_len(tag) + encoded_len_varint(len as u64) + len
        }
    };
    #[allow(clippy::cast_sign_loss)] // prost encodes an int64 as its two's complement u64
    let int64 = |tag, v: i64| {
        if v == 0 {
            0
        } else {
            key_len(tag) + encoded_len_varint(v as u64)
        }
    };
    // Delivered on its own topic, or as a dead-lettered copy on a topic of up to
    // TOPIC_LEN_MAX bytes.
    let dlq = futureq_core::message::dead_letter_topic_len(&m.topic, &m.dead_letter_topic);
    let topic_len = m.topic.len().max(dlq.min(TOPIC_LEN_MAX));
    bytes(1, topic_len)
        + bytes(2, m.payload.len())
        + bytes(3, futureq_core::KEY_LEN)
        + int64(4, enqueued_at_ms)
        + int64(5, m.delay_ms)
        + key_len(6)
        + encoded_len_varint(u64::from(u32::MAX))
        // As a dead-lettered copy (the longest group name a consumer may give).
        + bytes(7, m.topic.len())
        + bytes(8, TOPIC_LEN_MAX)
}

/// How a batch ended, before it becomes an ack.
enum Outcome {
    /// Stored: the ids, and the items a dedup id matched.
    Stored(Stored),
    /// Refused or failed.
    Failed(Refusal),
}

/// Stores a batch: the write core (the Raft core, or the local journal standalone) assigns
/// its ids and appends it to its log.
async fn store_batch(
    ctx: &Ctx,
    items: Vec<StoreItem>,
    level: AckLevel,
    dedup: bool,
    admitted: Admitted,
) -> Outcome {
    if !ctx.repl.leading() {
        return Outcome::Failed(Refusal::not_leader(&ctx.repl.leader_addr()));
    }
    let (reply, rx) = oneshot::channel();
    let req = WriteReq::Publish {
        items,
        admitted,
        level,
        dedup,
        deadline: Instant::now() + ctx.settings.proposal_timeout,
        reply,
    };
    if ctx.repl.writes().send_async(req).await.is_err() {
        return Outcome::Failed(Refusal::shutting_down());
    }
    match rx.await {
        Ok(Ok(stored)) => Outcome::Stored(stored),
        Ok(Err(e)) => {
            if !matches!(e, WriteError::NotLeader { .. } | WriteError::Timeout) {
                tracing::warn!(target: "producer", error = %e, "batch not stored or failed");
            }
            Outcome::Failed(super::context::write_refusal(ctx, "batch", &e))
        }
        // The write core dropped the request unanswered (it stopped while holding it).
        Err(_) => Outcome::Failed(Refusal::shutting_down().with_outcome(WriteOutcome::Unknown)),
    }
}

/// Whether any message of `b` carries a dedup id.
fn has_dedup_ids(b: &pb::PublishBatch) -> bool {
    b.messages.iter().any(|m| !m.dedup_id.is_empty())
}

/// The level `b` is answered at, served or refused: QUORUM for a batch with dedup ids (which of
/// its messages were stored before is known once applied), else the level it asks for.
fn ack_level(b: &pb::PublishBatch) -> AckLevel {
    if has_dedup_ids(b) {
        AckLevel::Quorum
    } else {
        AckLevel::from_wire(b.ack_level)
    }
}

fn process(
    ctx: &Rc<Ctx>,
    access: &Access,
    batch: pb::PublishBatch,
    admitted: Admitted,
    received: Instant,
) -> (AckLevel, AckFuture) {
    // A batch with dedup ids is answered once applied: which of its messages were stored
    // before is known then.
    let dedup = has_dedup_ids(&batch);
    let level = ack_level(&batch);
    let batch_id = batch.batch_id;
    let n = batch.messages.len();
    let metrics = std::sync::Arc::clone(&ctx.metrics);
    let prepared = match ctx.disk.as_deref().filter(|d| d.low()) {
        Some(d) => Err(Refusal::new(Reason::DiskLow, d.refusal())),
        None => prepare(ctx, access, batch, level, now_ms()),
    };
    let (items, topics) = match prepared {
        Ok(x) => x,
        Err(r) => {
            metrics
                .publish_requests
                .add(&["", level.label(), "rejected"], 1);
            return (level, Box::pin(future::ready(reject(batch_id, r))));
        }
    };
    let keys: Vec<(u64, u64)> = items.iter().map(|it| (it.topic_hash, it.bucket)).collect();
    let ctx = Rc::clone(ctx);
    let fut = async move {
        let outcome = store_batch(&ctx, items, level, dedup, admitted).await;
        let ack = match outcome {
            Outcome::Stored(Stored { first_id, dups }) => {
                metrics
                    .messages_published
                    .add(&[&topics, level.label()], (n - dups.len()) as u64);
                metrics.messages_deduplicated.inc_by(dups.len() as u64);
                let first_of = |id: u64| {
                    dups.binary_search_by_key(&id, |(i, _)| *i)
                        .ok()
                        .map(|at| dups[at].1)
                };
                PublishBatchAck {
                    success: true,
                    error_message: String::new(),
                    batch_id,
                    error_code: 0,
                    error_reason: 0,
                    write_outcome: 0,
                    delivery_tags: keys
                        .iter()
                        .enumerate()
                        .map(|(i, (t, b))| {
                            let id = first_id + i as u64;
                            let key = first_of(id).unwrap_or_else(|| {
                                EventKey::new(TopicHash(*t), Bucket(*b), EventId(id))
                            });
                            Bytes::copy_from_slice(&key.0)
                        })
                        .collect(),
                    leader_address: String::new(),
                    retry_after_ms: 0,
                }
            }
            Outcome::Failed(r) => reject(batch_id, r),
        };
        let result = if ack.success { "success" } else { "error" };
        metrics
            .publish_requests
            .add(&[&topics, level.label(), result], 1);
        #[allow(clippy::cast_precision_loss)]
        metrics.publish_batch_size.observe(n as f64);
        metrics.publish_latency_seconds[level as usize].observe(received.elapsed().as_secs_f64());
        ack
    };
    (level, Box::pin(fut))
}

enum Event {
    Batch(Result<Option<pb::PublishBatch>, Status>),
    Admitted(Admitted),
    /// The waiting batch found no room within `publish.maxQueueDelay`.
    NotAdmitted,
    Ack(PublishBatchAck),
    Stop,
    /// The leadership this stream was opened under ended.
    Lost,
    /// Nothing outstanding and no batch for `publish.streamIdleTimeout`.
    Idle,
}

/// The queues of one stream: its bytes outstanding, its durable and its NO_ACK acks.
type StreamQueues<'a> = (
    &'a Rc<Cell<usize>>,
    &'a mut FuturesOrdered<AckFuture>,
    &'a mut FuturesOrdered<AckFuture>,
);

/// Starts serving a batch `(batch, encoded size, when it was read)` admitted into the node's
/// budget. Its write goes out at once, on its own task, whatever the stream's acks are doing
/// (a client slow to read acks never delays writes, or holds their bytes in the budget); the
/// write request carries the bytes while the write core holds the items.
fn serve(
    ctx: &Rc<Ctx>,
    access: &Access,
    (b, bytes, received): (pb::PublishBatch, usize, Instant),
    admitted: Admitted,
    (outstanding_bytes, durable, no_ack): StreamQueues<'_>,
) {
    outstanding_bytes.set(outstanding_bytes.get() + bytes);
    let batch_id = b.batch_id;
    let (level, fut) = process(ctx, access, b, admitted, received);
    let counter = Rc::clone(outstanding_bytes);
    // Dropping the task (the stream ends) cancels the write's wait, as dropping the future did
    // (a batch whose task had not had its first turn is then never sent; it had no ack). Its
    // output comes through `spawn_owned`, not glommio's handle: the write core answers from
    // another executor's thread (see `crate::task`).
    let task = crate::task::spawn_owned(async move {
        let ack = fut.await;
        counter.set(counter.get() - bytes);
        ack
    });
    let fut: AckFuture = Box::pin(async move {
        task.await.unwrap_or_else(|| {
            reject(
                batch_id,
                Refusal::shutting_down().with_outcome(WriteOutcome::Unknown),
            )
        })
    });
    if level.is_durable() {
        durable.push_back(fut);
    } else {
        no_ack.push_back(fut);
    }
}

/// Acks a batch that was read but not served (nothing of it stored), in its level's order.
fn refuse(
    b: &pb::PublishBatch,
    refusal: Refusal,
    (durable, no_ack): (
        &mut FuturesOrdered<AckFuture>,
        &mut FuturesOrdered<AckFuture>,
    ),
) {
    debug_assert_eq!(
        refusal.outcome,
        WriteOutcome::NotStored,
        "a batch not served stored nothing"
    );
    let ack: AckFuture = Box::pin(future::ready(reject(b.batch_id, refusal)));
    if ack_level(b).is_durable() {
        durable.push_back(ack);
    } else {
        no_ack.push_back(ack);
    }
}

/// How long a deposed leader's stream waits to learn who leads before it ends without
/// naming anyone.
const LEADER_UNKNOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The leader's client address once known, within [`LEADER_UNKNOWN_WAIT`] ("" after it or at
/// shutdown).
async fn known_leader(ctx: &Ctx) -> String {
    let until = Instant::now() + LEADER_UNKNOWN_WAIT;
    loop {
        let leader = ctx.repl.leader_addr();
        if !leader.is_empty() || Instant::now() >= until || ctx.shutdown.is_triggered() {
            return leader;
        }
        glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Serves one PublishStream until the client half-closes (OK), a protocol fault, shutdown
/// (UNAVAILABLE), the end of the leadership it was opened under (FAILED_PRECONDITION naming
/// the leader), or `publish.streamIdleTimeout` (UNAVAILABLE).
///
/// # Invariants
/// - Every batch read is answered before the stream ends (stored, not stored, or outcome
///   unknown), except when the client stops reading its acks for the idle timeout.
/// - Every wait is bounded: a write by `publish.proposalTimeout` (the write core answers by
///   then), an ack's send and an idle stream by `publish.streamIdleTimeout`.
pub async fn publish_stream(
    ctx: &Rc<Ctx>,
    (access, mut session): (&Access, super::context::Session),
    mut call: Call,
    out: &mut Outbound,
) -> Status {
    let mut stream = PublishStream {
        ctx,
        durable: FuturesOrdered::new(),
        no_ack: FuturesOrdered::new(),
        outstanding_bytes: Rc::new(Cell::new(0usize)),
        admitting: None,
        reading: true,
        end: Status::ok(),
        last_activity: Instant::now(),
        deposed: false,
        // A reload that revokes the caller ends the stream at its next batch (one that only
        // takes a topic away denies that topic's batches).
        access: access.clone(),
        // A stream opened on the leader ends with its leadership (on a follower, each batch
        // is refused naming the leader).
        lost: {
            let view = ctx.repl.view();
            view.leading.then(|| view.lost.clone())
        },
    };
    // Response headers go out at once: clients such as tonic wait for them before sending.
    if let Err(s) = out.start() {
        return s;
    }
    loop {
        if let Some(end) = stream.finished().await {
            return end;
        }
        let event = stream.next_event(&mut call).await;
        if let Err(end) = stream.handle(event, &mut session, &call, out).await {
            return end;
        }
    }
}

/// One PublishStream's state (see [`publish_stream`]).
struct PublishStream<'a> {
    ctx: &'a Rc<Ctx>,
    /// Acks of QUORUM and LEADER batches, in the order read.
    durable: FuturesOrdered<AckFuture>,
    /// Acks of NO_ACK batches, in the order read.
    no_ack: FuturesOrdered<AckFuture>,
    /// Encoded bytes of the batches being served.
    outstanding_bytes: Rc<Cell<usize>>,
    /// A batch read and waiting for the node's budget: (batch, encoded size, when read).
    admitting: Option<(pb::PublishBatch, usize, Instant)>,
    /// The stream still reads batches.
    reading: bool,
    /// How the stream ends once everything read is answered.
    end: Status,
    /// The last batch read or ack sent: the idle timeout counts from it.
    last_activity: Instant,
    /// The leadership the stream was opened under ended.
    deposed: bool,
    access: Access,
    lost: Option<futureq_net::Shutdown>,
}

impl PublishStream<'_> {
    fn outstanding(&self) -> usize {
        self.durable.len() + self.no_ack.len()
    }

    /// How the stream ends, once it reads no more and every batch read was answered.
    async fn finished(&self) -> Option<Status> {
        if self.reading || self.outstanding() > 0 || self.admitting.is_some() {
            return None;
        }
        if self.deposed {
            // Named as late as possible: right after the loss the new leader may not be
            // known yet.
            let leader = known_leader(self.ctx).await;
            return Some(
                Refusal::new(
                    Reason::NotLeader,
                    "this node is no longer the cluster leader; every batch read was answered; publish to the leader",
                )
                .with_leader(&leader)
                .into(),
            );
        }
        Some(self.end.clone())
    }

    /// The next thing that happens: an ack ready, a batch read (while there is room), the
    /// budget admitting the waiting batch, shutdown, the leadership's end, or idleness.
    async fn next_event(&mut self, call: &mut Call) -> Event {
        let ctx = self.ctx;
        let outstanding = self.outstanding();
        let room = self.admitting.is_none()
            && outstanding < PIPELINE_MAX
            && self.outstanding_bytes.get() < PIPELINE_BYTES_MAX;
        let PublishStream {
            durable,
            no_ack,
            admitting,
            reading,
            last_activity,
            lost,
            ..
        } = self;
        let idle_timeout = ctx.settings.stream_idle_timeout;
        let acks = future::poll_fn(|cx| {
            for q in [&mut *durable, &mut *no_ack] {
                if let Poll::Ready(Some(a)) = q.poll_next_unpin(cx) {
                    return Poll::Ready(Event::Ack(a));
                }
            }
            Poll::Pending
        });
        let recv = async {
            if let Some((_, bytes, received)) = &admitting {
                // A batch waits for the bytes budget no longer than it may wait in line.
                let timeout = async {
                    let end = *received + ctx.settings.max_queue_delay;
                    glommio::timer::sleep(end.saturating_duration_since(Instant::now())).await;
                    Event::NotAdmitted
                };
                let admit = async { Event::Admitted(ctx.publish_budget.admit(*bytes).await) };
                future::or(admit, timeout).await
            } else if *reading && room {
                Event::Batch(call.inbound.next::<pb::PublishBatch>().await)
            } else {
                future::pending().await
            }
        };
        let stop = async {
            if !*reading {
                future::pending::<()>().await;
            }
            let lost = async {
                match &lost {
                    Some(l) => l.wait().await,
                    None => future::pending().await,
                }
                Event::Lost
            };
            let shutdown = async {
                ctx.shutdown.wait().await;
                Event::Stop
            };
            future::or(shutdown, lost).await
        };
        let idle = async {
            if outstanding > 0 || admitting.is_some() {
                future::pending::<()>().await;
            }
            let end = *last_activity + idle_timeout;
            glommio::timer::sleep(end.saturating_duration_since(Instant::now())).await;
            Event::Idle
        };
        future::or(future::or(acks, recv), future::or(stop, idle)).await
    }

    /// Acts on one event; `Err` ends the stream with that status at once.
    async fn handle(
        &mut self,
        event: Event,
        session: &mut super::context::Session,
        call: &Call,
        out: &mut Outbound,
    ) -> Result<(), Status> {
        let ctx = self.ctx;
        let idle_timeout = ctx.settings.stream_idle_timeout;
        match event {
            Event::Ack(a) => self.send_ack(&a, out).await?,
            Event::Idle => {
                return Err(Status::refused(
                    Reason::StreamIdle,
                    format!(
                        "no batch for publish.streamIdleTimeout ({} ms) and nothing outstanding; stream ended (open a new one)",
                        idle_timeout.as_millis()
                    ),
                ));
            }
            Event::Lost => {
                self.reading = false;
                self.deposed = true;
                let leader = ctx.repl.leader_addr();
                tracing::debug!(target: "producer", leader = %leader, outstanding = self.outstanding(), "leadership lost: ending a publish stream once its batches are answered");
                self.refuse_waiting(Refusal::not_leader(&leader));
            }
            Event::Batch(Ok(Some(b))) => self.take_batch(b, session, call),
            Event::Admitted(admitted) => {
                if let Some(batch) = self.admitting.take() {
                    let streams = (&self.outstanding_bytes, &mut self.durable, &mut self.no_ack);
                    serve(ctx, &self.access, batch, admitted, streams);
                }
            }
            Event::NotAdmitted => {
                let message = format!(
                    "the node's publish budget ({} MiB in service) had no room within publish.maxQueueDelay ({} ms); batch not stored, send it again after retry_after_ms",
                    crate::budget::IN_SERVICE_BYTES_MAX >> 20,
                    ctx.settings.max_queue_delay.as_millis()
                );
                if let Some((b, _, _)) = self.admitting.take() {
                    let after = ctx.publish_budget.expected_wait();
                    self.shed(&b, Refusal::overloaded(message, after));
                }
            }
            Event::Batch(Ok(None)) => self.reading = false,
            Event::Batch(Err(s)) => {
                self.reading = false;
                self.end = s;
            }
            Event::Stop => {
                self.reading = false;
                self.end = Status::shutting_down();
                // A batch still waiting for the budget is not stored: say so now rather
                // than wait for bytes that a stopping write core may never return.
                self.refuse_waiting(Refusal::shutting_down());
            }
        }
        Ok(())
    }

    /// Sends an ack, within the idle timeout: a client that reads no ack holds no stream for
    /// good.
    async fn send_ack(&mut self, a: &PublishBatchAck, out: &mut Outbound) -> Result<(), Status> {
        let idle_timeout = self.ctx.settings.stream_idle_timeout;
        let sent = future::or(async { Some(out.send(a).await) }, async {
            glommio::timer::sleep(idle_timeout).await;
            None
        })
        .await;
        match sent {
            Some(Ok(())) => {
                self.last_activity = Instant::now();
                Ok(())
            }
            Some(Err(s)) => Err(s),
            None => Err(Status::refused(
                Reason::StreamIdle,
                format!(
                    "the client read no ack for publish.streamIdleTimeout ({} ms); stream ended",
                    idle_timeout.as_millis()
                ),
            )),
        }
    }

    /// A batch read: served at once when the node's budget has room, else it waits for room.
    fn take_batch(
        &mut self,
        b: pb::PublishBatch,
        session: &mut super::context::Session,
        call: &Call,
    ) {
        self.last_activity = Instant::now();
        match session.recheck(self.ctx, call) {
            Some(Ok(a)) => self.access = a,
            Some(Err(r)) => {
                // Revoked: this batch is refused, those read before are answered, then the
                // stream ends.
                refuse(&b, r.clone(), (&mut self.durable, &mut self.no_ack));
                self.reading = false;
                self.end = r.into();
                return;
            }
            None => {}
        }
        let (bytes, read) = (prost::Message::encoded_len(&b), Instant::now());
        if let Err(after) = self.ctx.publish_budget.queue_delay_check(read) {
            let message = format!(
                "the node's write path is behind by about {} ms, more than publish.maxQueueDelay ({} ms); batch not stored, send it again after retry_after_ms",
                after.as_millis(),
                self.ctx.settings.max_queue_delay.as_millis()
            );
            self.shed(&b, Refusal::overloaded(message, after));
            return;
        }
        match self.ctx.publish_budget.try_admit(bytes) {
            Some(admitted) => {
                let streams = (&self.outstanding_bytes, &mut self.durable, &mut self.no_ack);
                serve(self.ctx, &self.access, (b, bytes, read), admitted, streams);
            }
            None => self.admitting = Some((b, bytes, read)),
        }
    }

    /// Refuses `b` as OVERLOADED (counted as such): nothing of it stored.
    fn shed(&mut self, b: &pb::PublishBatch, refusal: Refusal) {
        let level = ack_level(b);
        self.ctx
            .metrics
            .publish_requests
            .add(&["", level.label(), "overloaded"], 1);
        refuse(b, refusal, (&mut self.durable, &mut self.no_ack));
    }

    /// Refuses the batch waiting for the budget, if any.
    fn refuse_waiting(&mut self, refusal: Refusal) {
        if let Some((b, _, _)) = self.admitting.take() {
            refuse(&b, refusal, (&mut self.durable, &mut self.no_ack));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    /// The message [`delivery_len`] counts, built (what it did before, on every message).
    fn widest_delivery(m: &pb::PublishMessage, enqueued_at_ms: i64) -> pb::QueueMessage {
        let dlq = futureq_core::message::dead_letter_topic_len(&m.topic, &m.dead_letter_topic);
        pb::QueueMessage {
            topic: "t".repeat(m.topic.len().max(dlq.min(TOPIC_LEN_MAX))),
            payload: m.payload.clone(),
            delivery_tag: Bytes::from_static(&[0xff; futureq_core::KEY_LEN]),
            enqueued_at_unix_ms: enqueued_at_ms,
            delay_ms: m.delay_ms,
            attempt: u32::MAX,
            origin_topic: m.topic.clone(),
            origin_group: "g".repeat(TOPIC_LEN_MAX),
        }
    }

    #[test]
    fn delivery_len_is_the_encoded_size_of_the_widest_delivery() {
        for topic_len in [0, 1, 100, TOPIC_LEN_MAX - 4, TOPIC_LEN_MAX] {
            for dead_letter_topic in ["", "dlq", &"d".repeat(TOPIC_LEN_MAX)] {
                for payload_len in [0, 1, 127, 128, 16_383, 16_384, 1 << 20] {
                    for (delay_ms, at) in [
                        (0, 0),
                        (1, 1_700_000_000_000),
                        (-5, -1),
                        (i64::MAX, i64::MIN),
                    ] {
                        let m = pb::PublishMessage {
                            topic: "x".repeat(topic_len),
                            payload: vec![7; payload_len].into(),
                            delay_ms,
                            dead_letter_topic: dead_letter_topic.to_owned(),
                            ..pb::PublishMessage::default()
                        };
                        assert_eq!(
                            delivery_len(&m, at),
                            widest_delivery(&m, at).encoded_len(),
                            "topic {topic_len} B, dlq {} B, payload {payload_len} B, delay {delay_ms}, at {at}",
                            dead_letter_topic.len()
                        );
                    }
                }
            }
        }
    }
}
