//! The pipelined publisher: one `PublishStream` on the leader, batches by count, size and
//! linger, several batches in flight, a tag per message.
//!
//! # Retries
//! - A batch the server refused before storing anything (FAILED_PRECONDITION from a
//!   follower, ABORTED) is sent again, on the leader.
//! - A batch whose outcome is unknown (DEADLINE_EXCEEDED, UNAVAILABLE, the stream lost) is
//!   sent again only for its messages that carry a dedup id: the broker answers a repeated
//!   dedup id with the first message's tag and stores nothing twice. The others are answered
//!   [`Error::OutcomeUnknown`].
//! - Retries stop after [`crate::ClientConfig::retry_for`] from a message's first send.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::channel::mpsc as fmpsc;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};

use crate::pb::future_q_producer_client::FutureQProducerClient;
use crate::pb::{self, AckLevel};
use crate::{millis, Client, Error, Tag};

/// A message to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Message(pb::PublishMessage);

impl Message {
    /// A message for `topic`, due at once, never expiring.
    #[must_use]
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Message {
        Message(pb::PublishMessage {
            topic: topic.into(),
            payload: payload.into(),
            ..pb::PublishMessage::default()
        })
    }

    /// Due `d` after the broker receives it (whole milliseconds; at most `publish.maxDelay`).
    #[must_use]
    pub fn delay(mut self, d: Duration) -> Message {
        self.0.delay_ms = millis(d).unwrap_or(i64::MAX);
        self
    }

    /// Expires `d` after the broker receives it.
    #[must_use]
    pub fn ttl(mut self, d: Duration) -> Message {
        self.0.ttl_ms = millis(d).unwrap_or(i64::MAX);
        self
    }

    /// An idempotency key: a repeated publish of it within `publish.dedupWindow` stores
    /// nothing and answers the first message's tag.
    #[must_use]
    pub fn dedup_id(mut self, id: impl Into<String>) -> Message {
        self.0.dedup_id = id.into();
        self
    }

    /// Deliveries per recipient before it gives up and the message goes to its dead-letter
    /// topic.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Message {
        self.0.max_attempts = n;
        self
    }

    /// Where a recipient that gives up sends its copy (default `<topic>.dlq`).
    #[must_use]
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Message {
        self.0.dead_letter_topic = topic.into();
        self
    }

    /// The wire message.
    #[must_use]
    pub fn into_proto(self) -> pb::PublishMessage {
        self.0
    }
}

impl From<pb::PublishMessage> for Message {
    fn from(m: pb::PublishMessage) -> Message {
        Message(m)
    }
}

/// How a [`Publisher`] batches and acknowledges.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// Most messages per batch.
    pub max_batch_messages: usize,
    /// Most payload bytes per batch (a larger message goes alone).
    pub max_batch_bytes: usize,
    /// How long a batch waits for more messages before it is sent.
    pub linger: Duration,
    /// Batches sent and not yet answered, at most.
    pub max_in_flight_batches: usize,
    /// Messages queued in the publisher, at most (then [`Publisher::send`] waits).
    pub queue: usize,
    /// The ack level asked for (a batch with dedup ids is answered at QUORUM).
    pub ack_level: AckLevel,
    /// Give each message without a dedup id one (unique to this publisher), so that every
    /// message can be retried after an unknown outcome. Costs a dedup row per message on the
    /// broker and a QUORUM wait.
    pub idempotent: bool,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            max_batch_messages: 256,
            max_batch_bytes: 1 << 20,
            linger: Duration::from_millis(1),
            max_in_flight_batches: 32,
            queue: 8192,
            ack_level: AckLevel::Quorum,
            idempotent: true,
        }
    }
}

struct Item {
    msg: pb::PublishMessage,
    reply: oneshot::Sender<Result<Tag, Error>>,
    /// When it was first sent (retries stop `retry_for` after it).
    first_sent: Option<Instant>,
}

/// A message's answer: its delivery tag once the broker acknowledged it.
pub struct Pending(oneshot::Receiver<Result<Tag, Error>>);

impl Future for Pending {
    type Output = Result<Tag, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(Error::Closed)))
    }
}

/// Publishes messages in batches on the leader (see the module docs). Dropping it (or
/// [`Publisher::close`]) sends what is queued and answers every message first.
pub struct Publisher {
    tx: mpsc::Sender<Item>,
    task: tokio::task::JoinHandle<()>,
}

impl Publisher {
    pub(crate) fn start(client: Client, cfg: PublisherConfig) -> Publisher {
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let task = tokio::spawn(run(client, cfg, rx));
        Publisher { tx, task }
    }

    /// Queues a message (waiting while the queue is full); the returned [`Pending`] resolves
    /// to its tag.
    ///
    /// # Errors
    /// [`Error::Closed`] when the publisher stopped.
    pub async fn send(&self, m: Message) -> Result<Pending, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Item {
                msg: m.0,
                reply,
                first_sent: None,
            })
            .await
            .map_err(|_| Error::Closed)?;
        Ok(Pending(rx))
    }

    /// Publishes one message and waits for its tag.
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn publish(&self, m: Message) -> Result<Tag, Error> {
        self.send(m).await?.await
    }

    /// Sends everything queued, waits for every answer, and stops.
    pub async fn close(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

/// One open `PublishStream`.
struct Stream {
    batches: fmpsc::UnboundedSender<pb::PublishBatch>,
    acks: tonic::Streaming<pb::PublishBatchAck>,
    /// A batch was refused by a follower: send nothing more here, reopen on the leader once
    /// the batches in flight are answered.
    moving: bool,
}

async fn open(client: &Client) -> Result<Stream, Error> {
    let ch = client.leader().await?;
    let (batches, rx) = fmpsc::unbounded();
    let acks = FutureQProducerClient::new(ch)
        .publish_stream(rx)
        .await
        .map_err(|s| {
            client.leader_moved(None);
            Error::status(&s)
        })?
        .into_inner();
    Ok(Stream {
        batches,
        acks,
        moving: false,
    })
}

/// How a batch's messages are answered after a failed ack or a lost stream.
fn settle(
    items: Vec<Item>,
    stored_nothing: bool,
    why: &Error,
    retry_for: Duration,
    queue: &mut VecDeque<Item>,
) {
    let mut retry = Vec::new();
    for it in items {
        let in_time = it.first_sent.is_none_or(|t| t.elapsed() < retry_for);
        if in_time && (stored_nothing || !it.msg.dedup_id.is_empty()) {
            retry.push(it);
        } else if stored_nothing {
            let _ = it.reply.send(Err(why.clone()));
        } else {
            let _ = it.reply.send(Err(Error::OutcomeUnknown(why.to_string())));
        }
    }
    for it in retry.into_iter().rev() {
        queue.push_front(it);
    }
}

async fn run(client: Client, cfg: PublisherConfig, mut rx: mpsc::Receiver<Item>) {
    let retry_for = client.config().retry_for;
    let prefix = format!(
        "fqc-{:x}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let mut seq = 0u64;
    let mut queue: VecDeque<Item> = VecDeque::new();
    let mut in_flight: HashMap<u64, Vec<Item>> = HashMap::new();
    let mut next_batch = 1u64;
    let mut stream: Option<Stream> = None;
    let mut closed = false;
    loop {
        if queue.is_empty() && in_flight.is_empty() {
            if closed {
                return;
            }
            match rx.recv().await {
                Some(it) => queue.push_back(it),
                None => return,
            }
        }
        while let Ok(it) = rx.try_recv() {
            queue.push_back(it);
        }
        if !closed && queue.len() < cfg.max_batch_messages && in_flight.is_empty() {
            // Linger for more messages before a partial batch goes out.
            let until = tokio::time::Instant::now() + cfg.linger;
            while queue.len() < cfg.max_batch_messages {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(it)) => queue.push_back(it),
                    Ok(None) => {
                        closed = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        if stream.is_none() && !queue.is_empty() {
            match open(&client).await {
                Ok(s) => stream = Some(s),
                Err(e) => {
                    // The client already looked for a leader for `retry_for`.
                    for it in queue.drain(..) {
                        let _ = it.reply.send(Err(e.clone()));
                    }
                    continue;
                }
            }
        }
        let Some(s) = stream.as_mut() else {
            continue;
        };
        while !s.moving && !queue.is_empty() && in_flight.len() < cfg.max_in_flight_batches {
            let mut items = Vec::new();
            let mut bytes = 0;
            while let Some(it) = queue.front() {
                let len = it.msg.encoded_len();
                if !items.is_empty()
                    && (items.len() >= cfg.max_batch_messages || bytes + len > cfg.max_batch_bytes)
                {
                    break;
                }
                bytes += len;
                let mut it = queue.pop_front().expect("front exists");
                if cfg.idempotent && it.msg.dedup_id.is_empty() {
                    seq += 1;
                    it.msg.dedup_id = format!("{prefix}-{seq}");
                }
                it.first_sent.get_or_insert_with(Instant::now);
                items.push(it);
            }
            let batch_id = next_batch;
            next_batch += 1;
            let batch = pb::PublishBatch {
                messages: items.iter().map(|it| it.msg.clone()).collect(),
                ack_level: cfg.ack_level as i32,
                batch_id,
            };
            if s.batches.unbounded_send(batch).is_err() {
                settle(
                    items,
                    true,
                    &Error::OutcomeUnknown("stream closed".into()),
                    retry_for,
                    &mut queue,
                );
                break;
            }
            in_flight.insert(batch_id, items);
        }
        if in_flight.is_empty() {
            if s.moving {
                stream = None;
            }
            continue;
        }
        let more = !closed && !s.moving && in_flight.len() < cfg.max_in_flight_batches;
        tokio::select! {
            ack = s.acks.message() => match ack {
                Ok(Some(ack)) => {
                    let Some(items) = in_flight.remove(&ack.batch_id) else {
                        continue;
                    };
                    answer(&client, ack, items, retry_for, &mut queue, s);
                }
                Ok(None) | Err(_) => {
                    let why = match ack {
                        Err(st) => Error::status(&st),
                        _ => Error::OutcomeUnknown("the stream ended".into()),
                    };
                    client.leader_moved(None);
                    for (_, items) in in_flight.drain() {
                        settle(items, false, &why, retry_for, &mut queue);
                    }
                    stream = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            it = rx.recv(), if more => match it {
                Some(it) => queue.push_back(it),
                None => closed = true,
            },
        }
        if stream.as_ref().is_some_and(|s| s.moving) && in_flight.is_empty() {
            stream = None;
        }
    }
}

/// Answers a batch's messages from its ack (or queues them again).
fn answer(
    client: &Client,
    ack: pb::PublishBatchAck,
    items: Vec<Item>,
    retry_for: Duration,
    queue: &mut VecDeque<Item>,
    s: &mut Stream,
) {
    if ack.success {
        for (it, tag) in items.into_iter().zip(ack.delivery_tags.iter()) {
            let _ =
                it.reply.send(Tag::from_slice(tag).map_err(|e| {
                    Error::OutcomeUnknown(format!("the server answered a bad tag: {e}"))
                }));
        }
        return;
    }
    let why = Error::Status {
        code: tonic::Code::from_i32(i32::try_from(ack.error_code).unwrap_or(2)),
        message: ack.error_message.clone(),
    };
    match tonic::Code::from_i32(i32::try_from(ack.error_code).unwrap_or(2)) {
        tonic::Code::FailedPrecondition
            if !ack.leader_address.is_empty()
                || ack.error_message.contains("not the cluster leader") =>
        {
            // Refused by a node that does not lead: nothing stored; on to the leader.
            client.leader_moved(Some(&ack.leader_address));
            s.moving = true;
            settle(items, true, &why, retry_for, queue);
        }
        tonic::Code::Aborted => settle(items, true, &why, retry_for, queue),
        tonic::Code::DeadlineExceeded | tonic::Code::Unavailable => {
            settle(items, false, &why, retry_for, queue);
        }
        _ => {
            for it in items {
                let _ = it.reply.send(Err(why.clone()));
            }
        }
    }
}
