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

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::channel::mpsc as fmpsc;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};

use crate::client::millis;
use crate::pb::future_q_producer_client::FutureQProducerClient;
use crate::pb::{self, AckLevel};
use crate::refusal;
use crate::{Client, Error, Outcome, Reason, Tag};

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
    /// Most encoded message bytes per batch (a larger message goes alone).
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
    /// message can be retried after an unknown outcome. Costs two more rows per message on
    /// the broker, kept for `publish.dedupWindow` (default 10m: at 40,000 messages/s, 24
    /// million of each), and a QUORUM wait (docs/benchmarks.md: about a third of the
    /// throughput at 100 messages per request). Turn it off when duplicates are harmless.
    pub idempotent: bool,
    /// Largest encoded message sent (the broker's `api.grpc.maxReceiveMessageSize`, 4 MiB by
    /// default): a larger one is refused here, before it could end the stream.
    pub max_message_bytes: usize,
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
            max_message_bytes: (4 << 20) - 1024,
        }
    }
}

struct Item {
    msg: pb::PublishMessage,
    reply: oneshot::Sender<Result<Tag, Error>>,
    /// When it was first sent (retries stop `retry_for` after it).
    first_sent: Option<Instant>,
    /// A send of it may have been stored (its outcome was unknown).
    maybe_stored: bool,
    /// Sent in a batch of its own (its shared batch was refused as invalid: the refusal
    /// belongs to one message of it).
    alone: bool,
    /// Its dedup id was given by the publisher (named when its outcome stays unknown).
    auto_id: bool,
}

impl Item {
    /// Answers an item whose last send may have been stored.
    fn unknown(self, why: &Error) {
        let hint = if self.auto_id {
            format!(
                "; publish it again with dedup id {:?} to store it at most once",
                self.msg.dedup_id
            )
        } else {
            String::new()
        };
        let _ = self
            .reply
            .send(Err(Error::OutcomeUnknown(format!("{why}{hint}"))));
    }

    /// Answers an item that failed: unknown if a send of it may have been stored.
    fn fail(self, why: &Error) {
        if self.maybe_stored {
            self.unknown(why);
        } else {
            let _ = self.reply.send(Err(why.clone()));
        }
    }
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
                maybe_stored: false,
                alone: false,
                auto_id: false,
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
    /// A batch was refused ABORTED (the leader refused its command, e.g. while its leadership
    /// changes): send nothing more before then.
    paused_until: Option<tokio::time::Instant>,
}

/// How long a publisher waits after an ABORTED refusal, or an OVERLOADED one without a retry
/// hint, before it sends again.
const ABORTED_PAUSE: Duration = Duration::from_millis(100);
/// The longest retry hint a publisher follows (a hint is the server's estimate; a bad one must
/// not stop a publisher for long).
const RETRY_AFTER_MAX: Duration = Duration::from_secs(10);

/// The pause after a refusal the leader may get over: the server's retry hint
/// (`retry_after_ms`, OVERLOADED) when it gave one, else [`ABORTED_PAUSE`].
fn pause_after(ack: &pb::PublishBatchAck) -> Duration {
    match ack.retry_after_ms {
        0 => ABORTED_PAUSE,
        ms => Duration::from_millis(u64::from(ms)).min(RETRY_AFTER_MAX),
    }
}

/// Whether a failure to open a stream is final: a server without the API, a refused
/// credential or request. Anything else (the node went away or is restarting, an election, a
/// refusal naming the leader; h2 resets come as INTERNAL or CANCELLED) is tried again.
fn refused_for_good(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unimplemented
            | tonic::Code::Unauthenticated
            | tonic::Code::PermissionDenied
            | tonic::Code::InvalidArgument
    )
}

/// Opens a `PublishStream` on the leader, looking for it again (a node that went away, one
/// that stopped leading) for up to `retry_for`.
async fn open(client: &Client) -> Result<Stream, Error> {
    let started = Instant::now();
    loop {
        let ch = client.leader().await?;
        let (batches, rx) = fmpsc::unbounded();
        match FutureQProducerClient::with_interceptor(ch, client.auth())
            .publish_stream(rx)
            .await
        {
            Ok(r) => {
                return Ok(Stream {
                    batches,
                    acks: r.into_inner(),
                    moving: false,
                    paused_until: None,
                })
            }
            Err(s) => {
                if refused_for_good(s.code()) || started.elapsed() >= client.config().retry_for {
                    return Err(Error::status(&s));
                }
                client.leader_moved(None);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// How a batch's messages are answered after a failed ack or a lost stream: sent again (at
/// the front of the queue, in order) when that is safe and time is left, else answered.
fn settle(
    items: Vec<Item>,
    stored_nothing: bool,
    why: &Error,
    retry_for: Duration,
    queue: &mut VecDeque<Item>,
) {
    let mut retry = Vec::new();
    for mut it in items {
        let in_time = it.first_sent.is_none_or(|t| t.elapsed() < retry_for);
        if in_time && (stored_nothing || !it.msg.dedup_id.is_empty()) {
            it.maybe_stored |= !stored_nothing;
            retry.push(it);
        } else if stored_nothing {
            it.fail(why);
        } else {
            it.unknown(why);
        }
    }
    for it in retry.into_iter().rev() {
        queue.push_front(it);
    }
}

/// The next batch from the front of the queue: up to the configured count and size (an item
/// refused in a shared batch goes alone).
fn next_batch(
    queue: &mut VecDeque<Item>,
    cfg: &PublisherConfig,
    prefix: &str,
    seq: &mut u64,
) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    let mut bytes = 0;
    while let Some(it) = queue.front() {
        let len = it.msg.encoded_len();
        if !items.is_empty()
            && (it.alone
                || items[0].alone
                || items.len() >= cfg.max_batch_messages
                || bytes + len > cfg.max_batch_bytes)
        {
            break;
        }
        bytes += len;
        let mut it = queue.pop_front().expect("front exists");
        if cfg.idempotent && it.msg.dedup_id.is_empty() {
            *seq += 1;
            it.msg.dedup_id = format!("{prefix}-{seq}");
            it.auto_id = true;
        }
        it.first_sent.get_or_insert_with(Instant::now);
        items.push(it);
    }
    items
}

impl Client {
    /// A publisher on this client's leader (see [`Publisher`]).
    #[must_use]
    pub fn publisher(&self, cfg: PublisherConfig) -> Publisher {
        Publisher::start(self.clone(), cfg)
    }
}

/// The publisher's task: takes messages from the channel, sends them in batches on one
/// stream to the leader, answers each from its batch's ack, and retries what is safe to
/// (see the module docs) until the publisher is closed and everything is answered.
async fn run(client: Client, cfg: PublisherConfig, rx: mpsc::Receiver<Item>) {
    let window = cfg.max_in_flight_batches.max(1);
    let mut task = Task {
        retry_for: client.config().retry_for,
        ack_timeout: client.config().request_timeout,
        prefix: format!(
            "fqc-{:x}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ),
        seq: 0,
        queue: VecDeque::new(),
        waiting_since: None,
        in_flight: BTreeMap::new(),
        next_id: 1,
        stream: None,
        reopen_pause: Duration::ZERO,
        closed: false,
        window,
        hold: cfg.max_batch_messages.max(1) * (window + 1),
        client,
        cfg,
        rx,
    };
    task.run().await;
}

/// The publisher task's state.
struct Task {
    client: Client,
    cfg: PublisherConfig,
    rx: mpsc::Receiver<Item>,
    retry_for: Duration,
    /// A batch not answered within this is taken for lost with its connection (the server
    /// answers every batch within its publish.proposalTimeout).
    ack_timeout: Duration,
    /// Generated dedup ids: this prefix and a sequence number.
    prefix: String,
    seq: u64,
    queue: VecDeque<Item>,
    /// Since when the queue's oldest message waits (a partial batch goes after `linger`).
    waiting_since: Option<tokio::time::Instant>,
    /// Batches sent and not answered, by id (ascending: send order), with when they were sent.
    in_flight: BTreeMap<u64, (tokio::time::Instant, Vec<Item>)>,
    next_id: u64,
    stream: Option<Stream>,
    /// The pause before the next reopen after a refusal (zero after a stored batch).
    reopen_pause: Duration,
    /// The publisher was closed: no more messages come.
    closed: bool,
    /// Batches in flight at most.
    window: usize,
    /// Messages the task holds at most (queued and in flight): the rest wait in the channel,
    /// so `send` waits when the publisher is behind.
    hold: usize,
}

/// What the task waits for.
enum TaskEvent {
    /// An ack, or how the stream ended (`Ok(None)`: it ended cleanly).
    Ack(Result<Option<pb::PublishBatchAck>, tonic::Status>),
    /// The oldest batch in flight went unanswered past the ack timeout.
    Silent,
    /// A message from the publisher, or its close (`None`).
    Message(Option<Item>),
    /// A pause or the linger ended.
    Linger,
}

impl Task {
    /// Until the publisher is closed and everything it was given is answered.
    async fn run(&mut self) {
        loop {
            let held = self.take_queued();
            self.refuse_oversized();
            // After the queue read and the refusals: a close the read saw is acted on here
            // (the wait below would not see it again, and could wait on nothing).
            if self.closed && self.queue.is_empty() && self.in_flight.is_empty() {
                return;
            }
            if self.queue.is_empty() {
                self.waiting_since = None;
            } else {
                self.waiting_since
                    .get_or_insert_with(tokio::time::Instant::now);
            }
            if self.stream.is_none() && !self.queue.is_empty() {
                match open(&self.client).await {
                    Ok(s) => self.stream = Some(s),
                    Err(e) => {
                        for it in self.queue.drain(..) {
                            it.fail(&e);
                        }
                        continue;
                    }
                }
            }
            self.send_ready();
            if self.stream.as_ref().is_some_and(|s| s.moving) && self.in_flight.is_empty() {
                // Refused by a follower, or the connection went away: reopen on the leader,
                // after a pause that grows while refusals go on (a leader that has not
                // confirmed its term yet refuses naming itself: without it, open and refusal
                // would spin).
                self.stream = None;
                self.reopen_pause = next_reopen_pause(self.reopen_pause);
                tokio::time::sleep(self.reopen_pause).await;
                continue;
            }
            let event = self.next_event(!self.closed && held < self.hold).await;
            self.handle(event).await;
        }
    }

    /// Moves messages from the channel to the queue while the task holds fewer than `hold`;
    /// what it held before.
    fn take_queued(&mut self) -> usize {
        let held = self.queue.len() + self.in_flight.values().map(|(_, v)| v.len()).sum::<usize>();
        for _ in held..self.hold {
            match self.rx.try_recv() {
                Ok(it) => self.queue.push_back(it),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.closed = true;
                    break;
                }
            }
        }
        held
    }

    /// Refuses what can never be sent (over the server's frame limit) before it can take a
    /// batch down with it.
    fn refuse_oversized(&mut self) {
        let max = self.cfg.max_message_bytes;
        if !self.queue.iter().any(|it| it.msg.encoded_len() > max) {
            return;
        }
        for it in std::mem::take(&mut self.queue) {
            let len = it.msg.encoded_len();
            if len > max {
                it.fail(&Error::InvalidArgument(format!(
                    "the message is {len} bytes encoded, over max_message_bytes ({max})"
                )));
            } else {
                self.queue.push_back(it);
            }
        }
    }

    /// Sends the batches that may go now: a partial batch waits for more messages while
    /// others are in flight, up to the linger; a full one (or the last, at close) goes at
    /// once.
    fn send_ready(&mut self) {
        let due = self
            .waiting_since
            .is_some_and(|t| t.elapsed() >= self.cfg.linger);
        let Some(s) = self.stream.as_mut() else {
            return;
        };
        if s.paused_until
            .is_some_and(|t| t <= tokio::time::Instant::now())
        {
            s.paused_until = None;
        }
        while !s.moving
            && s.paused_until.is_none()
            && !self.queue.is_empty()
            && self.in_flight.len() < self.window
            && (self.queue.len() >= self.cfg.max_batch_messages
                || self.in_flight.is_empty()
                || due
                || self.closed)
        {
            let items = next_batch(&mut self.queue, &self.cfg, &self.prefix, &mut self.seq);
            let batch_id = self.next_id;
            self.next_id += 1;
            let batch = pb::PublishBatch {
                messages: items.iter().map(|it| it.msg.clone()).collect(),
                ack_level: self.cfg.ack_level as i32,
                batch_id,
            };
            if s.batches.unbounded_send(batch).is_err() {
                // The connection went away: nothing of this batch was sent.
                settle(items, true, &Error::Closed, self.retry_for, &mut self.queue);
                s.moving = true;
                break;
            }
            self.in_flight
                .insert(batch_id, (tokio::time::Instant::now(), items));
        }
        if self.queue.is_empty() {
            self.waiting_since = None;
        }
    }

    /// Waits for an ack, the oldest batch's ack timeout, a message (while there is `room`),
    /// or the end of a pause or of the linger (then a partial batch goes) when a batch could
    /// go: not while the window is full or the stream moves (an ack wakes).
    async fn next_event(&mut self, room: bool) -> TaskEvent {
        let can_send =
            self.stream.as_ref().is_some_and(|s| !s.moving) && self.in_flight.len() < self.window;
        let linger = match self.stream.as_ref().and_then(|s| s.paused_until) {
            Some(t) => Some(t),
            None if can_send => self.waiting_since.map(|t| t + self.cfg.linger),
            None => None,
        };
        let (stream, in_flight, rx) = (&mut self.stream, &self.in_flight, &mut self.rx);
        let ack_timeout = self.ack_timeout;
        let queued = !self.queue.is_empty();
        let ack = async {
            match stream.as_mut() {
                Some(s) => s.acks.message().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ack = ack => TaskEvent::Ack(ack),
            () = async {
                match in_flight.values().next() {
                    Some((sent, _)) => tokio::time::sleep_until(*sent + ack_timeout).await,
                    None => std::future::pending().await,
                }
            } => TaskEvent::Silent,
            it = rx.recv(), if room => TaskEvent::Message(it),
            () = async {
                match linger {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            }, if queued => TaskEvent::Linger,
        }
    }

    /// Acts on one event.
    async fn handle(&mut self, event: TaskEvent) {
        match event {
            TaskEvent::Ack(Ok(Some(ack))) => {
                let Some((_, items)) = self.in_flight.remove(&ack.batch_id) else {
                    return;
                };
                if ack.success {
                    self.reopen_pause = Duration::ZERO;
                }
                if let Some(s) = self.stream.as_mut() {
                    answer(&self.client, ack, items, self.retry_for, &mut self.queue, s);
                }
            }
            TaskEvent::Ack(end) => {
                let why = match &end {
                    Err(st) => Error::status(st),
                    _ => Error::OutcomeUnknown("the stream ended".into()),
                };
                // A deposed leader answers every batch it read, then ends its stream
                // FAILED_PRECONDITION naming the new leader: what is still unanswered was
                // never read, so nothing of it was stored.
                let named = match end.as_ref().err().map(|st| refusal::next_step(st, false)) {
                    Some(refusal::Next::Leader(named)) => Some(named.unwrap_or_default()),
                    _ => None,
                };
                let unread = named.is_some();
                lost(
                    &self.client,
                    &why,
                    unread,
                    &mut self.in_flight,
                    &mut self.queue,
                    self.retry_for,
                );
                self.client.leader_moved(named.as_deref());
                self.stream = None;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            TaskEvent::Linger => {}
            TaskEvent::Silent => {
                // The connection went silent: start again on a new one.
                let why = Error::OutcomeUnknown(format!("no answer within {:?}", self.ack_timeout));
                lost(
                    &self.client,
                    &why,
                    false,
                    &mut self.in_flight,
                    &mut self.queue,
                    self.retry_for,
                );
                self.stream = None;
            }
            TaskEvent::Message(Some(it)) => self.queue.push_back(it),
            TaskEvent::Message(None) => self.closed = true,
        }
    }
}

/// Shortest and longest pause before reopening a stream after a refusal.
const REOPEN_PAUSE: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// The pause after `last` (zero: none yet): doubled, within [`REOPEN_PAUSE`].
fn next_reopen_pause(last: Duration) -> Duration {
    (last * 2).clamp(REOPEN_PAUSE.0, REOPEN_PAUSE.1)
}

/// The stream was lost with `in_flight`: each batch's messages are queued again (oldest first
/// at the front) when that is safe (`stored_nothing`: the server read none of them), else
/// answered.
fn lost(
    client: &Client,
    why: &Error,
    stored_nothing: bool,
    in_flight: &mut BTreeMap<u64, (tokio::time::Instant, Vec<Item>)>,
    queue: &mut VecDeque<Item>,
    retry_for: Duration,
) {
    client.leader_moved(None);
    for (_, (_, items)) in std::mem::take(in_flight).into_iter().rev() {
        settle(items, stored_nothing, why, retry_for, queue);
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
        let mut tags = ack.delivery_tags.iter();
        for it in items {
            let tag = tags
                .next()
                .ok_or_else(|| "no tag".to_owned())
                .and_then(|t| Tag::from_slice(t).map_err(|e| e.to_string()));
            match tag {
                Ok(t) => {
                    let _ = it.reply.send(Ok(t));
                }
                Err(e) => it.unknown(&Error::OutcomeUnknown(format!(
                    "the server answered a bad tag: {e}"
                ))),
            }
        }
        return;
    }
    let code = tonic::Code::from_i32(i32::try_from(ack.error_code).unwrap_or(2));
    // A server older than typed refusals sends neither: then what its code says.
    let (reason, outcome) = match refusal::of_ack(&ack) {
        Some((r, o)) => (Some(r), Some(o)),
        None => (None, None),
    };
    let why = Error::Status {
        code,
        message: ack.error_message.clone(),
        reason,
        outcome,
    };
    let stored_nothing = outcome.is_some_and(Outcome::retry_is_safe);
    match (reason, code) {
        (Some(Reason::NotLeader), _) | (None, tonic::Code::FailedPrecondition)
            if reason.is_some() || !ack.leader_address.is_empty() =>
        {
            // Refused by a node that does not lead: nothing stored; on to the leader.
            client.leader_moved(Some(&ack.leader_address));
            s.moving = true;
            settle(items, true, &why, retry_for, queue);
        }
        (Some(Reason::NotApplied | Reason::Conflict | Reason::Overloaded), _)
        | (None, tonic::Code::Aborted) => {
            // The leader refused the command (its leadership changing, its ids or budget
            // full, its write path behind): a pause (the server's hint when it gave one),
            // then again.
            // A later, shorter hint never shortens a pause already decided.
            let until = tokio::time::Instant::now() + pause_after(&ack);
            s.paused_until = Some(s.paused_until.map_or(until, |p| p.max(until)));
            settle(
                items,
                reason.is_none() || stored_nothing,
                &why,
                retry_for,
                queue,
            );
        }
        (
            Some(
                Reason::Timeout
                | Reason::WriteFailed
                | Reason::ShuttingDown
                | Reason::Recovering
                | Reason::Internal,
            ),
            _,
        )
        | (
            None,
            tonic::Code::DeadlineExceeded | tonic::Code::Unavailable | tonic::Code::Internal,
        ) => {
            settle(items, stored_nothing, &why, retry_for, queue);
        }
        (Some(Reason::InvalidArgument | Reason::TooLarge | Reason::PermissionDenied), _)
        | (
            None,
            tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted | tonic::Code::OutOfRange,
        ) if items.len() > 1 => {
            // A batch is refused whole for one message: send each alone to find it.
            for mut it in items.into_iter().rev() {
                it.alone = true;
                queue.push_front(it);
            }
        }
        _ => {
            for it in items {
                it.fail(&why);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_pauses_for_the_servers_hint_within_bounds() {
        let ack = |retry_after_ms| pb::PublishBatchAck {
            retry_after_ms,
            ..pb::PublishBatchAck::default()
        };
        assert_eq!(pause_after(&ack(0)), ABORTED_PAUSE, "no hint");
        assert_eq!(pause_after(&ack(250)), Duration::from_millis(250));
        assert_eq!(pause_after(&ack(u32::MAX)), RETRY_AFTER_MAX);
    }
}
