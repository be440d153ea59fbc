//! futureq-client: a Rust client for the futureq broker (tokio + tonic).
//!
//! - [`Client::connect`] takes seed addresses (`host:port`), finds the leader with
//!   `GetClusterInfo`, and follows it: a call refused by a follower (FAILED_PRECONDITION with
//!   the leader's address) goes to the leader named; a node that went away makes the client
//!   ask the seeds and the nodes it knows again, until [`ClientConfig::retry_for`] passes.
//! - [`Publisher`] batches messages by count, size and linger, keeps several batches in
//!   flight on one stream, and answers each message with its delivery tag. A message with a
//!   dedup id (its own, or one the publisher gives it: [`PublisherConfig::idempotent`]) is
//!   retried after an unknown outcome (a timeout, a lost connection, a failover): the broker
//!   stores it at most once.
//! - [`Consumer`] subscribes on the leader, hands out [`Delivery`] handles to ack or nack,
//!   resubscribes on the new leader after a failover, and drains gracefully.
//! - [`Client::cancel`], [`Client::reschedule`], [`Client::topic_stats`], [`Client::peek`].
//!
//! ```no_run
//! # async fn run() -> Result<(), futureq_client::Error> {
//! use std::time::Duration;
//! use futureq_client::{Client, Message, PublisherConfig, Subscription};
//!
//! let client = Client::connect(["127.0.0.1:8443"]).await?;
//! let publisher = client.publisher(PublisherConfig::default());
//! let tag = publisher
//!     .publish(Message::new("orders", "hello").delay(Duration::from_secs(2)))
//!     .await?;
//! println!("stored as {tag}");
//! let mut consumer = client.subscribe(Subscription::new("orders")).await?;
//! if let Some(d) = consumer.next().await {
//!     println!("{:?}", d.message().payload);
//!     d.ack();
//! }
//! # Ok(()) }
//! ```
//!
//! Runnable examples: `cargo run -p futureq-client --example publish` and `--example consume`.

mod client;
mod consumer;
mod error;
mod proto;
mod publisher;
pub mod refusal;

pub use client::{Client, ClientConfig, TlsConfig};
pub use consumer::{Consumer, Delivery, Subscription};
pub use error::Error;
pub use futureq_core::refusal::{Outcome, Reason};
pub use futureq_core::EventKey as Tag;
pub use proto::{health, pb, reflection};
pub use publisher::{Message, Pending, Publisher, PublisherConfig};
pub use refusal::LEADER_HEADER;
