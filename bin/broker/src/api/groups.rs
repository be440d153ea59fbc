//! The consumer-group lifecycle: `FutureQAdmin.DeleteGroup`. (Groups are created by their
//! first member's Subscribe, and listed by `TopicStats`.)

use futureq_core::message::TOPIC_LEN_MAX;
use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb;
use futures::channel::oneshot;

use super::context::{unary_request, Ctx};
use crate::dispatcher::HubCmd;

/// `DeleteGroup`: removes the group's registration through the write path (durable before
/// the answer), then the dispatcher ends its members' streams (NOT_FOUND) and deletes what
/// only it still needed ([`HubCmd::DeleteGroup`]).
pub async fn delete_group(
    ctx: &Ctx,
    access: &crate::auth::Access,
    mut call: Call,
    out: &mut Outbound,
) -> Status {
    let req = match unary_request::<pb::DeleteGroupRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    if let Err(why) = futureq_core::publish::check_topic(&req.topic) {
        return Status::invalid(format!("topic: {why}"));
    }
    if req.group.is_empty() || req.group.len() > TOPIC_LEN_MAX {
        return Status::invalid(format!(
                "group: {} bytes; give 1 to {TOPIC_LEN_MAX} (a universal consumer has no group to delete)",
                req.group.len()
            ),
        );
    }
    if let Err(r) = access.admin("delete a consumer group") {
        return r.into();
    }
    if let Err(s) = super::context::recovered(ctx).await {
        return s;
    }
    if !ctx.repl.leading() {
        return super::context::not_leader(ctx);
    }
    let (reply, answer) = oneshot::channel();
    let cmd = HubCmd::DeleteGroup {
        topic: req.topic,
        group: req.group,
        reply,
    };
    if ctx.hub.send_async(cmd).await.is_err() {
        return Status::shutting_down();
    }
    let done = match answer.await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return super::context::write_refusal(ctx, "group deletion", &e).into(),
        // The dispatcher took the command and gave no answer: it may have been carried out.
        Err(_) => {
            return futureq_core::refusal::Refusal::shutting_down()
                .with_outcome(futureq_core::refusal::Outcome::Unknown)
                .into()
        }
    };
    let resp = pb::DeleteGroupResponse {
        found: done.found,
        consumers_ended: done.consumers_ended,
    };
    match out.send(&resp).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}
