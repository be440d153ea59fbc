//! Publishes a few delayed messages and prints their tags.
//!
//! `cargo run -p futureq-client --example publish -- [host:port] [topic]`
//! (defaults: 127.0.0.1:8443, `orders`). Start a broker first: `cargo run -p futureq -- start`.

use std::time::Duration;

use futureq_client::{Client, Message, PublisherConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let server = args.next().unwrap_or_else(|| "127.0.0.1:8443".into());
    let topic = args.next().unwrap_or_else(|| "orders".into());
    let client = Client::connect([server]).await?;
    let publisher = client.publisher(PublisherConfig::default());
    // Queue all five first (one batch), then wait for each tag.
    let mut pending = Vec::new();
    for i in 1..=5u64 {
        let m = Message::new(topic.clone(), format!("order {i}"))
            .delay(Duration::from_secs(i))
            .dedup_id(format!("order-{i}"));
        pending.push(publisher.send(m).await?);
    }
    for (i, p) in pending.into_iter().enumerate() {
        println!("order {} -> {}", i + 1, p.await?);
    }
    publisher.close().await;
    for t in client.topic_stats(Some(&topic)).await? {
        println!(
            "{}: {} stored, next due at {} ms",
            t.topic, t.stored, t.next_due_unix_ms
        );
    }
    Ok(())
}
