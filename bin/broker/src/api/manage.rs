//! Managing scheduled messages: `FutureQProducer.Cancel` and `Reschedule`.

use futureq_core::command::{Reschedule, WithId, CANCEL_KEYS_MAX};
use futureq_core::publish::check_delay;
use futureq_core::{bucket_of, EventKey, TopicHash};
use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb;
use futures::channel::oneshot;

use super::context::{tag_of, unary_request, Ctx};
use crate::auth::Access;
use crate::dispatcher::HubCmd;
use crate::replication::WriteReq;

/// The tags of a request as keys: 1..=[`CANCEL_KEYS_MAX`] tags of 24 bytes each.
fn keys_of(tags: &[bytes::Bytes]) -> Result<Vec<EventKey>, Status> {
    if tags.is_empty() || tags.len() > CANCEL_KEYS_MAX {
        return Err(Status::invalid(format!(
            "delivery_tags: {} tags; give 1 to {CANCEL_KEYS_MAX}",
            tags.len()
        )));
    }
    tags.iter()
        .enumerate()
        .map(|(i, t)| tag_of(&format!("delivery_tags[{i}]"), t))
        .collect()
}

/// The `keys` (sorted) whose message the caller may cancel or reschedule: all of them without
/// principals; with one, those of stored topics it may publish to. A key of a topic with no
/// row after a barrier write (below) is left out: nothing of it is stored to act on.
///
/// A publish may be acked before it is applied (LEADER and NO_ACK; QUORUM standalone), so a
/// topic without a row yet may be on its way: an empty Cancel goes through the write path
/// first, and its answer comes once everything logged before it is applied.
///
/// # Errors
/// PERMISSION_DENIED naming the first stored topic the principal may not publish to (nothing
/// of the request is done); INTERNAL when the store cannot be read; the barrier's refusal.
async fn permitted(
    ctx: &Ctx,
    access: &Access,
    keys: Vec<EventKey>,
) -> Result<Vec<EventKey>, Status> {
    if matches!(access, Access::Open) {
        return Ok(keys);
    }
    let mut hashes: Vec<TopicHash> = keys.iter().map(EventKey::topic_hash).collect();
    hashes.dedup(); // sorted keys: equal hashes are adjacent
    let asked = hashes.clone();
    let mut names = super::context::read(ctx, move |s| s.topic_names(&asked)).await?;
    if names.len() < hashes.len() {
        let deadline = std::time::Instant::now() + ctx.settings.proposal_timeout;
        ctx.repl
            .request(|reply| WriteReq::Cancel {
                keys: Vec::new(),
                deadline,
                reply,
            })
            .await
            // Whatever became of the barrier, nothing of the caller's request was sent.
            .map_err(|e| {
                Status::from(
                    super::context::write_refusal(ctx, "the write path's barrier", &e)
                        .with_outcome(futureq_core::refusal::Outcome::NotStored),
                )
            })?;
        names = super::context::read(ctx, move |s| s.topic_names(&hashes)).await?;
    }
    for (_, topic) in &names {
        access.publish(topic)?;
    }
    Ok(keys
        .into_iter()
        .filter(|k| names.iter().any(|(h, _)| *h == k.topic_hash()))
        .collect())
}

/// Drops `keys` from the dispatcher's memory (read-ahead copies, waiting recipients,
/// deliveries in flight, whose ACK/NACK is then ignored) once their deletion committed;
/// returns when no scan that read the store before the commit can deliver them any more
/// ([`HubCmd::Revoke`]).
async fn revoke(ctx: &Ctx, keys: Vec<EventKey>) {
    let (done, revoked) = oneshot::channel();
    if ctx
        .hub
        .send_async(HubCmd::Revoke { keys, done })
        .await
        .is_ok()
    {
        // A dispatcher that stopped (shutdown) delivers nothing more either way.
        let _ = revoked.await;
    }
}

/// `Cancel`: deletes the stored messages for every recipient, durably (the journal's fsync
/// standalone, a quorum's commit clustered) before the answer. Once answered, none of them is
/// delivered again: the dispatcher has dropped them and finished every scan that read the
/// store before the commit ([`HubCmd::Revoke`]). A tag given twice is cancelled once and
/// answered alike at both places. A message whose TTL passed but that the sweep has not
/// deleted yet is still stored: `true`.
pub async fn cancel(ctx: &Ctx, access: &Access, mut call: Call, out: &mut Outbound) -> Status {
    let req = match unary_request::<pb::CancelRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    let asked = match keys_of(&req.delivery_tags) {
        Ok(k) => k,
        Err(s) => return s,
    };
    let mut keys = asked.clone();
    keys.sort_unstable();
    keys.dedup();
    if let Err(s) = super::context::recovered(ctx).await {
        return s;
    }
    if !ctx.repl.leading() {
        return super::context::not_leader(ctx);
    }
    let keys = match permitted(ctx, access, keys).await {
        Ok(k) => k,
        Err(s) => return s,
    };
    let deadline = std::time::Instant::now() + ctx.settings.proposal_timeout;
    let found = if keys.is_empty() {
        Vec::new()
    } else {
        match ctx
            .repl
            .request(|reply| WriteReq::Cancel {
                keys: keys.clone(),
                deadline,
                reply,
            })
            .await
        {
            Ok(c) => c,
            Err(e) => return super::context::write_refusal(ctx, "cancel", &e).into(),
        }
    };
    let n = found.iter().filter(|c| **c).count() as u64;
    revoke(ctx, keys.clone()).await;
    let cancelled = asked
        .iter()
        .map(|k| {
            keys.binary_search(k)
                .ok()
                .and_then(|at| found.get(at).copied())
                .unwrap_or(false)
        })
        .collect();
    ctx.metrics.messages_cancelled.inc_by(n);
    match out.send(&pb::CancelResponse { cancelled }).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}

/// `Reschedule`: replaces the stored message by the same one due at now + `delay_ms` (topic,
/// payload, indexes, dedup id and absolute expiry kept; enqueued now; attempts start again)
/// under a new tag, in one replicated command, durable before the answer. The old tag is revoked as a
/// cancel's is: never delivered again, an ACK/NACK of it in flight is ignored. Every recipient
/// gets the moved message, also one that acked the old copy already. `found = false` when the
/// tag is not stored or its TTL has passed.
pub async fn reschedule(ctx: &Ctx, access: &Access, mut call: Call, out: &mut Outbound) -> Status {
    let req = match unary_request::<pb::RescheduleRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    let key = match tag_of("delivery_tag", &req.delivery_tag) {
        Ok(k) => k,
        Err(s) => return s,
    };
    if let Err(why) = check_delay(req.delay_ms, &ctx.settings.publish_limits()) {
        return Status::invalid(format!("delay_ms: {why}"));
    }
    if let Err(s) = super::context::recovered(ctx).await {
        return s;
    }
    if !ctx.repl.leading() {
        return super::context::not_leader(ctx);
    }
    match permitted(ctx, access, vec![key]).await {
        Ok(k) if k.is_empty() => {
            // No topic of it is stored: nothing to move.
            return match out.send(&pb::RescheduleResponse::default()).await {
                Ok(()) => Status::ok(),
                Err(s) => s,
            };
        }
        Ok(_) => {}
        Err(s) => return s,
    }
    let now_ms = crate::clock::now_ms();
    let due_at_ms = now_ms.saturating_add(req.delay_ms);
    let to = Reschedule {
        key: key.0,
        event_id: 0,
        bucket: bucket_of(due_at_ms, ctx.settings.time_bucket_ms).0,
        due_at_ms,
        now_ms,
    };
    let deadline = std::time::Instant::now() + ctx.settings.proposal_timeout;
    let moved = match ctx
        .repl
        .request(|reply| WriteReq::WithId {
            cmd: WithId::Reschedule(to),
            deadline,
            reply,
        })
        .await
    {
        Ok(m) => m,
        Err(e) => return super::context::write_refusal(ctx, "reschedule", &e).into(),
    };
    if moved.is_some() {
        revoke(ctx, vec![key]).await;
        ctx.metrics.messages_rescheduled.inc();
    }
    let resp = pb::RescheduleResponse {
        found: moved.is_some(),
        delivery_tag: moved.map(|k| k.0.to_vec().into()).unwrap_or_default(),
    };
    match out.send(&resp).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}
