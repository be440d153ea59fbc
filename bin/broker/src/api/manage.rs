//! Managing scheduled messages: `FutureQProducer.Cancel`.

use futureq_core::command::CANCEL_KEYS_MAX;
use futureq_core::EventKey;
use futureq_net::grpc::{Call, Code, Outbound, Status};
use futureq_net::pb;
use futureq_raft::node::WriteError;
use futures::channel::oneshot;

use super::{unary_request, Ctx};
use crate::dispatcher::HubCmd;
use crate::replication::RaftReq;

/// The tags of a request as keys: 1..=[`CANCEL_KEYS_MAX`] tags of 24 bytes each.
fn keys_of(tags: &[bytes::Bytes]) -> Result<Vec<EventKey>, Status> {
    if tags.is_empty() || tags.len() > CANCEL_KEYS_MAX {
        return Err(Status::new(
            Code::InvalidArgument,
            format!(
                "delivery_tags: {} tags; give 1 to {CANCEL_KEYS_MAX}",
                tags.len()
            ),
        ));
    }
    tags.iter()
        .enumerate()
        .map(|(i, t)| {
            EventKey::from_slice(t).map_err(|_| {
                Status::new(
                    Code::InvalidArgument,
                    format!(
                        "delivery_tags[{i}]: {} bytes; a delivery tag is {} bytes, as received",
                        t.len(),
                        futureq_core::KEY_LEN
                    ),
                )
            })
        })
        .collect()
}

/// A write that did not happen (or whose outcome is unknown), as the client sees it.
fn write_failed(ctx: &Ctx, e: WriteError) -> Status {
    match e {
        WriteError::NotLeader { .. } => {
            Status::new(Code::FailedPrecondition, "node is not the cluster leader")
                .with_leader(&ctx.repl.leader_addr())
        }
        WriteError::Timeout => Status::new(
            Code::DeadlineExceeded,
            format!(
                "not committed within publish.proposalTimeout ({} ms); outcome unknown",
                ctx.settings.proposal_timeout.as_millis()
            ),
        ),
        WriteError::Refused(why) => Status::new(Code::Internal, format!("refused: {why}")),
        WriteError::Failed(why) => Status::new(Code::Unavailable, why),
    }
}

/// `Cancel`: deletes the stored messages for every recipient, durably (the journal's fsync
/// standalone, a quorum's commit clustered) before the answer. Once answered, none of them is
/// delivered again: the dispatcher has dropped them and finished every scan that read the
/// store before the commit ([`HubCmd::Barrier`]).
pub async fn cancel(ctx: &Ctx, mut call: Call, out: &mut Outbound) -> Status {
    let req = match unary_request::<pb::CancelRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    let keys = match keys_of(&req.delivery_tags) {
        Ok(k) => k,
        Err(s) => return s,
    };
    if !ctx.repl.leading() {
        return write_failed(ctx, WriteError::NotLeader { leader: None });
    }
    let deadline = std::time::Instant::now() + ctx.settings.proposal_timeout;
    let cancelled = match ctx
        .repl
        .request(|reply| RaftReq::Cancel {
            keys,
            deadline,
            reply,
        })
        .await
    {
        Ok(c) => c,
        Err(e) => return write_failed(ctx, e),
    };
    let (done, barrier) = oneshot::channel();
    if ctx.hub.send_async(HubCmd::Barrier(done)).await.is_ok() {
        // A dispatcher that stopped (shutdown) delivers nothing more either way.
        let _ = barrier.await;
    }
    let n = cancelled.iter().filter(|c| **c).count() as u64;
    ctx.metrics
        .messages_cancelled
        .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    match out.send(&pb::CancelResponse { cancelled }).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}
