//! The per-topic gauges: stored counts from the store's admin thread, deliveries in flight
//! from the dispatcher, refreshed on an interval.

use std::sync::Arc;
use std::time::Duration;

use futureq_net::Shutdown;
use futureq_storage::StoreService;
use futures::channel::oneshot;

use super::inbox::HubCmd;
use crate::metrics::Metrics;

/// Refreshes the per-topic gauges every `interval` until shutdown: the store's exact topic
/// counts (read on its admin thread, off every executor) and this dispatcher's deliveries in
/// flight, each cut to the largest [`crate::metrics::TOPIC_LABELS_MAX`] topics and the rest.
pub async fn refresh_topic_gauges(
    interval: Duration,
    store: StoreService,
    hub: crate::mailbox::Mailbox<HubCmd>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    loop {
        match store
            .admin(|s| s.topic_counts(crate::metrics::TOPIC_LABELS_MAX))
            .await
        {
            Ok(Ok(c)) => metrics.topic_messages_stored.set(c.top, c.rest),
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(target: "metrics", error = %e, "reading the topic counts failed");
            }
        }
        let (tx, rx) = oneshot::channel();
        if hub.send_async(HubCmd::Activity(tx)).await.is_ok() {
            if let Ok(activity) = rx.await {
                metrics.topic_messages_in_flight.set_all(
                    activity
                        .into_values()
                        .map(|a| (a.topic.to_string(), a.in_flight))
                        .collect(),
                );
            }
        }
        if crate::runtime::sleep_or_shutdown(interval, &shutdown).await {
            return;
        }
    }
}
