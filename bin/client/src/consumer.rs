//! The consumer: one `Subscribe` stream on the leader, resubscribed on the new leader after a
//! failover; each message handed out as a [`Delivery`] to ack or nack.
//!
//! At least once: a delivery whose ACK did not reach the leader that delivered it (the stream
//! broke, the leader changed) comes again. An ACK for a delivery of an earlier stream is not
//! sent (that leader is gone; the message comes again on the new stream).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc as fmpsc;
use tokio::sync::mpsc;

use crate::pb::future_q_consumer_client::FutureQConsumerClient;
use crate::pb::{self, consumer_frame, AckRequest, ConsumerFrame, SubscribeInit};
use crate::refusal::leader_named;
use crate::{Client, Error, Tag};

/// What to subscribe to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The topic.
    pub topic: String,
    /// The consumer group ("" = a universal consumer: every message of the topic).
    pub group: String,
    /// Most deliveries not yet acked or nacked (0 = the server's default).
    pub max_in_flight: u32,
}

impl Subscription {
    /// A universal consumer of `topic`.
    #[must_use]
    pub fn new(topic: impl Into<String>) -> Subscription {
        Subscription {
            topic: topic.into(),
            group: String::new(),
            max_in_flight: 0,
        }
    }

    /// As a member of `group` (each message goes to one member of each group).
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Subscription {
        self.group = group.into();
        self
    }

    /// At most `n` deliveries in flight.
    #[must_use]
    pub fn max_in_flight(mut self, n: u32) -> Subscription {
        self.max_in_flight = n;
        self
    }
}

enum Control {
    Ack {
        tag: Vec<u8>,
        success: bool,
        stream: u64,
    },
    Drain,
    /// End the stream once the answers sent before this are on it.
    Close,
}

/// One message delivered: [`Delivery::ack`] deletes it (for this recipient),
/// [`Delivery::nack`] has it delivered again at once; dropping it unanswered nacks it.
pub struct Delivery {
    message: pb::QueueMessage,
    stream: u64,
    control: mpsc::UnboundedSender<Control>,
    outstanding: Arc<AtomicUsize>,
    answered: bool,
}

impl Delivery {
    /// The message.
    #[must_use]
    pub fn message(&self) -> &pb::QueueMessage {
        &self.message
    }

    /// Its delivery tag (`None` if the server sent a malformed one).
    #[must_use]
    pub fn tag(&self) -> Option<Tag> {
        Tag::from_slice(&self.message.delivery_tag).ok()
    }

    /// Acknowledges it: never delivered to this recipient again.
    pub fn ack(mut self) {
        self.answer(true);
    }

    /// Refuses it: delivered again (to this recipient) at once.
    pub fn nack(mut self) {
        self.answer(false);
    }

    fn answer(&mut self, success: bool) {
        if std::mem::replace(&mut self.answered, true) {
            return;
        }
        let _ = self.control.send(Control::Ack {
            tag: self.message.delivery_tag.clone(),
            success,
            stream: self.stream,
        });
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.answer(false);
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

/// A subscription (see the module docs). Dropping it ends the stream; deliveries not acked
/// by then come again (to another member of the group, or on the next subscription).
pub struct Consumer {
    deliveries: mpsc::Receiver<Delivery>,
    control: mpsc::UnboundedSender<Control>,
    outstanding: Arc<AtomicUsize>,
    /// Why the subscription ended, if it ended on its own.
    ended: Arc<std::sync::Mutex<Option<Error>>>,
    task: tokio::task::JoinHandle<()>,
}

type Opened = (
    fmpsc::UnboundedSender<ConsumerFrame>,
    tonic::Streaming<pb::QueueMessage>,
);

/// Opens a `Subscribe` stream on the leader, following redirects, for up to `retry_for`.
async fn open(client: &Client, sub: &Subscription) -> Result<Opened, Error> {
    let started = Instant::now();
    loop {
        let ch = client.leader().await?;
        let (frames, rx) = fmpsc::unbounded();
        let init = ConsumerFrame {
            frame: Some(consumer_frame::Frame::Init(SubscribeInit {
                topic: sub.topic.clone(),
                group_id: sub.group.clone(),
                read_from_replica: false,
                max_in_flight: sub.max_in_flight,
            })),
        };
        frames.unbounded_send(init).map_err(|_| Error::Closed)?;
        match FutureQConsumerClient::with_interceptor(ch, client.auth())
            .subscribe(rx)
            .await
        {
            Ok(r) => return Ok((frames, r.into_inner())),
            Err(s) => {
                // Subscribing twice changes nothing: safe to send again.
                let leader = match crate::refusal::next_step(&s, true) {
                    crate::refusal::Next::Leader(named) => named,
                    crate::refusal::Next::Again { .. } => None,
                    crate::refusal::Next::Fail => return Err(Error::status(&s)),
                };
                if started.elapsed() >= client.config().retry_for {
                    return Err(Error::status(&s));
                }
                client.leader_moved(leader.as_deref());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

impl Consumer {
    pub(crate) async fn start(client: Client, sub: Subscription) -> Result<Consumer, Error> {
        if sub.topic.is_empty() {
            return Err(Error::InvalidArgument("the topic must not be empty".into()));
        }
        let first = open(&client, &sub).await?;
        let queue = match sub.max_in_flight {
            0 => 1024,
            n => usize::try_from(n).unwrap_or(4096),
        }
        .clamp(1, 4096);
        let (tx, deliveries) = mpsc::channel(queue);
        let (control, control_rx) = mpsc::unbounded_channel();
        let outstanding = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(std::sync::Mutex::new(None));
        let task = tokio::spawn(run(
            Session {
                client,
                sub,
                tx,
                control: control.clone(),
                outstanding: Arc::clone(&outstanding),
                ended: Arc::clone(&ended),
            },
            first,
            control_rx,
        ));
        Ok(Consumer {
            deliveries,
            control,
            outstanding,
            ended,
            task,
        })
    }

    /// The next delivery; `None` once the consumer stopped (it was drained, or the
    /// subscription ended: see [`Consumer::error`]).
    pub async fn next(&mut self) -> Option<Delivery> {
        self.deliveries.recv().await
    }

    /// Why the subscription ended on its own (no leader found again within
    /// [`crate::ClientConfig::retry_for`], the server refused it, or its group was deleted:
    /// a NOT_FOUND status), if it did.
    #[must_use]
    pub fn error(&self) -> Option<Error> {
        crate::client::lock(&self.ended).clone()
    }

    /// The next delivery within `within`, or `None`.
    pub async fn next_within(&mut self, within: Duration) -> Option<Delivery> {
        tokio::time::timeout(within, self.next())
            .await
            .ok()
            .flatten()
    }

    /// Deliveries handed out and not yet acked or nacked.
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Stops taking messages (those that arrive from now on are nacked, so another member
    /// gets them at once), waits up to `within` for the deliveries handed out to be acked or
    /// nacked, then ends the stream. Returns how many were still unanswered.
    pub async fn drain(mut self, within: Duration) -> usize {
        let _ = self.control.send(Control::Drain);
        let until = Instant::now() + within;
        loop {
            // Deliveries already queued for the application are refused as well.
            while let Ok(d) = self.deliveries.try_recv() {
                d.nack();
            }
            if self.outstanding() == 0 || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let left = self.outstanding();
        // The answers sent so far go out before the stream ends.
        let _ = self.control.send(Control::Close);
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.task).await;
        left
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the subscription task works with.
struct Session {
    client: Client,
    sub: Subscription,
    tx: mpsc::Sender<Delivery>,
    control: mpsc::UnboundedSender<Control>,
    outstanding: Arc<AtomicUsize>,
    ended: Arc<std::sync::Mutex<Option<Error>>>,
}

impl Session {
    fn delivery(&self, message: pb::QueueMessage, stream: u64) -> Delivery {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        Delivery {
            message,
            stream,
            control: self.control.clone(),
            outstanding: Arc::clone(&self.outstanding),
            answered: false,
        }
    }
}

fn ack_frame(tag: Vec<u8>, success: bool) -> ConsumerFrame {
    ConsumerFrame {
        frame: Some(consumer_frame::Frame::Ack(AckRequest {
            success,
            delivery_tag: tag,
        })),
    }
}

/// Runs the subscription: forwards deliveries (held in a backlog while the application is
/// behind, so answers keep flowing), sends answers on the stream they belong to, subscribes
/// again after the stream ends, until drained and closed (or the consumer is dropped).
async fn run(s: Session, first: Opened, mut control_rx: mpsc::UnboundedReceiver<Control>) {
    let mut opened = Some(first);
    let mut stream_no = 0u64;
    let mut draining = false;
    loop {
        let (frames, mut messages) = match opened.take() {
            Some(o) => o,
            None => match open(&s.client, &s.sub).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(target: "futureq_client", topic = %s.sub.topic, error = %e, "subscription lost and not renewed");
                    *crate::client::lock(&s.ended) = Some(e);
                    return;
                }
            },
        };
        stream_no += 1;
        let mut backlog: VecDeque<pb::QueueMessage> = VecDeque::new();
        loop {
            tokio::select! {
                m = messages.message(), if backlog.len() < BACKLOG_MAX => match m {
                    Ok(Some(m)) if draining => {
                        let _ = frames.unbounded_send(ack_frame(m.delivery_tag, false));
                    }
                    Ok(Some(m)) => backlog.push_back(m),
                    Err(st) if st.code() == tonic::Code::NotFound => {
                        // The group was deleted: subscribing again would create a new one.
                        tracing::warn!(target: "futureq_client", topic = %s.sub.topic, group = %s.sub.group, "the consumer group was deleted; subscription ended");
                        *crate::client::lock(&s.ended) = Some(Error::status(&st));
                        return;
                    }
                    Ok(None) | Err(_) => {
                        let next = m.err().and_then(|st| leader_named(&st));
                        tracing::debug!(target: "futureq_client", topic = %s.sub.topic, "subscription ended; subscribing again");
                        s.client.leader_moved(next.as_deref());
                        break;
                    }
                },
                permit = s.tx.reserve(), if !backlog.is_empty() && !draining => match permit {
                    Ok(p) => {
                        if let Some(m) = backlog.pop_front() {
                            p.send(s.delivery(m, stream_no));
                        }
                    }
                    // The application dropped the consumer.
                    Err(_) => return,
                },
                c = control_rx.recv() => match c {
                    Some(Control::Ack { tag, success, stream }) => {
                        if stream == stream_no {
                            let _ = frames.unbounded_send(ack_frame(tag, success));
                        }
                    }
                    Some(Control::Drain) => {
                        draining = true;
                        for m in backlog.drain(..) {
                            let _ = frames.unbounded_send(ack_frame(m.delivery_tag, false));
                        }
                    }
                    Some(Control::Close) | None => {
                        // Half-close, then let the stream send what is queued on it.
                        drop(frames);
                        let _ = tokio::time::timeout(Duration::from_millis(200), async {
                            while let Ok(Some(_)) = messages.message().await {}
                        })
                        .await;
                        return;
                    }
                },
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deliveries a subscription holds while the application is behind, at most (the server sends
/// no more than `max_in_flight` unanswered ones anyway).
const BACKLOG_MAX: usize = 65_536;

impl Client {
    /// Subscribes (see [`Consumer`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty topic; the first subscription's failure.
    pub async fn subscribe(&self, sub: Subscription) -> Result<Consumer, Error> {
        Consumer::start(self.clone(), sub).await
    }
}
