//! Consumes messages as a group member, acks each, and drains on Ctrl-C or after `count`.
//!
//! `cargo run -p futureq-client --example consume -- [host:port] [topic] [group] [count]`
//! (defaults: 127.0.0.1:8443, `orders`, `workers`, 5).

use std::time::Duration;

use futureq_client::{Client, Subscription};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let server = args.next().unwrap_or_else(|| "127.0.0.1:8443".into());
    let topic = args.next().unwrap_or_else(|| "orders".into());
    let group = args.next().unwrap_or_else(|| "workers".into());
    let count: usize = args.next().map_or(Ok(5), |c| c.parse())?;
    let client = Client::connect([server]).await?;
    let mut consumer = client
        .subscribe(Subscription::new(topic).group(group).max_in_flight(16))
        .await?;
    for _ in 0..count {
        tokio::select! {
            d = consumer.next() => {
                let Some(d) = d else { break };
                let m = d.message();
                println!(
                    "{} attempt {}: {}",
                    m.topic,
                    m.attempt,
                    String::from_utf8_lossy(&m.payload)
                );
                d.ack();
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    let left = consumer.drain(Duration::from_secs(5)).await;
    println!("drained ({left} unanswered)");
    Ok(())
}
