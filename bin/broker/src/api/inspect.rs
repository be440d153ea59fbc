//! Reading the leader's state: `FutureQAdmin.TopicStats` and `Peek`. Both are read only
//! (nothing is delivered, no attempt changes) and bounded: O(topics) and O(limit).

use std::collections::HashMap;

use futureq_core::refusal::Reason;
use futureq_core::{topic_hash, TopicHash};
use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb;
use futures::channel::oneshot;
use prost::Message as _;

use super::context::tag_of;
use super::context::{read, unary_request, Ctx};
use crate::dispatcher::HubCmd;

/// Most messages one `Peek` returns.
pub const PEEK_LIMIT_MAX: u32 = 1000;
/// Fewest bytes one topic takes in a `TopicStatsResponse` (a name of 1 byte, each field set):
/// more topics than the send limit over this cannot be answered, and are not read.
const TOPIC_STATS_BYTES_MIN: usize = 16;

/// Checks a topic name as publish does; `field` names it in the error.
fn check_topic(topic: &str) -> Result<(), Status> {
    futureq_core::publish::check_topic(topic)
        .map_err(|why| Status::invalid(format!("topic: {why}")))
}

/// `TopicStats`: per topic (or the one asked for) its stored count (exact, kept by the state
/// machine), deliveries in flight and consumer streams (this leader's dispatcher), earliest
/// due time, dead letters, and its registered groups (from the registry) with what this
/// leader's dispatcher knows of each: members, deliveries in flight, and pending (stored
/// less what the group is done with); sorted by topic name, groups by name; with principals,
/// only the topics the caller may publish to or consume from. A topic with no stored message and no
/// consumer is not listed, unless asked for by name (then all zeros).
pub async fn topic_stats(
    ctx: &Ctx,
    access: &crate::auth::Access,
    mut call: Call,
    out: &mut Outbound,
) -> Status {
    let req = match unary_request::<pb::TopicStatsRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    if !req.topic.is_empty() {
        if let Err(s) = check_topic(&req.topic) {
            return s;
        }
        if let Err(r) = access.see(&req.topic) {
            return r.into();
        }
    }
    if let Err(s) = super::context::recovered(ctx).await {
        return s;
    }
    if !ctx.repl.leading() {
        return super::context::not_leader(ctx);
    }
    let only = (!req.topic.is_empty()).then(|| topic_hash(&req.topic));
    let (rows, registered) = match stored_stats(ctx, only).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    let mut topics = with_activity(ctx, rows, only).await;
    if topics.is_empty() && only.is_some() {
        topics.insert(
            topic_hash(&req.topic),
            pb::TopicStats {
                topic: req.topic,
                ..pb::TopicStats::default()
            },
        );
    }
    with_groups(ctx, &mut topics, registered, only).await;
    // A principal sees the topics it may publish to or consume from.
    let mut topics: Vec<pb::TopicStats> = topics
        .into_values()
        .filter(|t| access.sees(&t.topic))
        .collect();
    topics.sort_by(|a, b| a.topic.cmp(&b.topic));
    let resp = pb::TopicStatsResponse { topics };
    let len = resp.encoded_len();
    if len > ctx.settings.max_send_message_len {
        return Status::refused(Reason::TooLarge, format!(
                "the stats of {} topics take {len} bytes, over api.grpc.maxSendMessageSize ({} bytes); ask for one topic at a time",
                resp.topics.len(),
                ctx.settings.max_send_message_len
            ),
        );
    }
    match out.send(&resp).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}

/// What the store knows: per topic its counts and next due time, and the registered groups;
/// refused when more than fit one response.
async fn stored_stats(
    ctx: &Ctx,
    only: Option<TopicHash>,
) -> Result<(Vec<futureq_storage::TopicStat>, Vec<(TopicHash, String)>), Status> {
    let limit = ctx.settings.max_send_message_len / TOPIC_STATS_BYTES_MIN;
    let (rows, registered) = read(ctx, move |s| {
        Ok((
            s.topic_stats(only, limit)?,
            s.groups(only, limit.saturating_add(1))?,
        ))
    })
    .await?;
    if rows.len() > limit || registered.len() > limit {
        return Err(Status::refused(Reason::TooLarge, format!(
                "more than {limit} topics or groups: their stats cannot fit api.grpc.maxSendMessageSize ({} bytes); ask for one topic at a time, or raise the limit",
                ctx.settings.max_send_message_len
            ),
        ));
    }
    Ok((rows, registered))
}

/// The stored rows as stats, with what the dispatcher knows of each topic: deliveries in
/// flight and consumer streams (a topic with consumers and nothing stored is listed too).
async fn with_activity(
    ctx: &Ctx,
    rows: Vec<futureq_storage::TopicStat>,
    only: Option<TopicHash>,
) -> HashMap<TopicHash, pb::TopicStats> {
    let (tx, rx) = oneshot::channel();
    let activity = match ctx.hub.send_async(HubCmd::Activity(tx)).await {
        Ok(()) => rx.await.unwrap_or_default(),
        Err(_) => HashMap::new(),
    };
    let mut topics: HashMap<TopicHash, pb::TopicStats> = rows
        .into_iter()
        .map(|r| {
            let stats = pb::TopicStats {
                topic: r.row.name,
                stored: r.row.stored,
                next_due_unix_ms: r.next_due_ms.unwrap_or(0),
                dead_lettered_total: r.row.dead_lettered,
                ..pb::TopicStats::default()
            };
            (r.topic_hash, stats)
        })
        .collect();
    for (h, a) in activity {
        if only.is_some_and(|o| o != h) {
            continue;
        }
        let t = topics.entry(h).or_insert_with(|| pb::TopicStats {
            topic: a.topic.to_string(),
            ..pb::TopicStats::default()
        });
        t.in_flight = a.in_flight;
        t.consumers = a.consumers;
    }
    topics
}

/// Each listed topic's registered groups, with what the dispatcher knows of each: members,
/// deliveries in flight, and pending (stored less what the group is done with).
async fn with_groups(
    ctx: &Ctx,
    topics: &mut HashMap<TopicHash, pb::TopicStats>,
    registered: Vec<(TopicHash, String)>,
    only: Option<TopicHash>,
) {
    let (reply, rx) = oneshot::channel();
    let mut hub_groups = match ctx.hub.send_async(HubCmd::Groups { only, reply }).await {
        Ok(()) => rx.await.unwrap_or_default(),
        Err(_) => HashMap::new(),
    };
    for (h, group) in registered {
        let Some(t) = topics.get_mut(&h) else {
            // A topic with groups, nothing stored and no consumer: listed when asked for.
            continue;
        };
        let known = hub_groups
            .get_mut(&h)
            .and_then(|gs| gs.remove(&group))
            .unwrap_or_default();
        t.groups.push(pb::GroupStats {
            pending: t.stored.saturating_sub(known.done),
            in_flight: known.in_flight,
            consumers: known.consumers,
            group,
        });
    }
}

/// `Peek`: up to `limit` stored messages of a topic in due order (to the time bucket), after
/// `after_tag`; a page ends early rather than exceed the send limit (the client pages on from
/// its last tag). Each message as a consumer would get it, with `attempt = 0`.
pub async fn peek(
    ctx: &Ctx,
    access: &crate::auth::Access,
    mut call: Call,
    out: &mut Outbound,
) -> Status {
    let req = match unary_request::<pb::PeekRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    if let Err(s) = check_topic(&req.topic) {
        return s;
    }
    if let Err(r) = access.consume(&req.topic) {
        return r.into();
    }
    if req.limit == 0 || req.limit > PEEK_LIMIT_MAX {
        return Status::invalid(format!("limit: {}; give 1 to {PEEK_LIMIT_MAX}", req.limit));
    }
    let h = topic_hash(&req.topic);
    let after = if req.after_tag.is_empty() {
        None
    } else {
        match tag_of("after_tag", &req.after_tag) {
            Ok(k) if k.topic_hash() == h => Some(k),
            Ok(_) => {
                return Status::invalid(format!(
                    "after_tag: not a delivery tag of topic {:?}",
                    req.topic
                ))
            }
            Err(s) => return s,
        }
    };
    if let Err(s) = super::context::recovered(ctx).await {
        return s;
    }
    if !ctx.repl.leading() {
        return super::context::not_leader(ctx);
    }
    let max_bytes = ctx.settings.max_send_message_len;
    let limit = req.limit as usize;
    let found = match read(ctx, move |s| s.peek(h, after, limit, max_bytes)).await {
        Ok(f) => f,
        Err(s) => return s,
    };
    let mut resp = pb::PeekResponse::default();
    let mut len = 0usize;
    for (key, m) in found {
        let qm = super::consumer::queue_message(&key, &m, 0);
        // Each message's field header: a tag byte and a length of at most 5 bytes.
        len += qm.encoded_len() + 6;
        if len > max_bytes && !resp.messages.is_empty() {
            break;
        }
        resp.messages.push(qm);
    }
    match out.send(&resp).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}
