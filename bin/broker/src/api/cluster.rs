//! `FutureQCluster` (clustered, or the standalone answers) and the gRPC health service.

use futureq_core::refusal::{Reason, Refusal};
use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb;
use futureq_net::pb::health::{
    health_check_response::ServingStatus, HealthCheckRequest, HealthCheckResponse,
};

use std::time::Duration;

use futures::channel::oneshot;

use super::context::{unary_request, Ctx};
use crate::replication::{MembershipError, MembershipOp, Replication, WriteReq};

/// Whether the health check knows `service`: the server as a whole (""), or one of its API
/// services.
fn known_service(service: &str) -> bool {
    service.is_empty() || super::context::API_SERVICES.contains(&service)
}

/// How long a follower waits for the leader's answer to a `GetClusterInfo` it passes on.
const INFO_FROM_LEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// Header of a `GetClusterInfo` a follower passed on: answered locally, never passed on again
/// (two nodes that each name the other as leader for a moment would bounce it).
const FORWARDED: &str = "futureq-forwarded";

/// Clustered: the topology from the metadata replica (UNAVAILABLE before it is known), with
/// liveness as the leader knows it (heard from within an election timeout). A follower asks
/// the leader; when it cannot reach it, it answers its own view with only itself alive.
/// Standalone: the one-node topology [`Replication::standalone`] holds.
pub async fn get_cluster_info(ctx: &Ctx, mut call: Call, out: &mut Outbound) -> Status {
    let req = match unary_request::<pb::ClusterInfoRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    let s = &ctx.settings;
    let view = ctx.repl.view();
    let Some(info) = &view.info else {
        return Status::refused(Reason::Recovering, "topology not yet available");
    };
    let forwarded = call.headers.contains_key(FORWARDED);
    let from_leader = if view.leading || view.leader_addr.is_empty() || forwarded {
        None
    } else {
        // The caller's credential goes along: the leader authenticates it too.
        let mut headers = vec![(FORWARDED, "1")];
        if let Some(a) = call
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
        {
            headers.push(("authorization", a));
        }
        futureq_net::grpc::client::unary_with_headers::<_, pb::ClusterInfoResponse>(
            futureq_net::grpc::client::Dial {
                addr: &view.leader_addr,
                tls: s.cluster.as_ref().and_then(|c| c.tls.as_deref()),
            },
            "/futureq.FutureQCluster/GetClusterInfo",
            &req,
            &headers,
            INFO_FROM_LEADER_TIMEOUT,
        )
        .await
        .map_err(|e| tracing::debug!(target: "grpc", leader = %view.leader_addr, error = %e.message, "cluster info from the leader failed; answering locally"))
        .ok()
    };
    let resp = from_leader.unwrap_or_else(|| {
        let alive = |id: u64| match &view.alive {
            Some(alive) => alive.contains(&id),
            None => id == s.node_id,
        };
        // The leader as Raft knows it now: the topology in the metadata group names the
        // leader that last published it, which lags (or stays stale while the metadata
        // group has no leader).
        // Not this node once its leadership ran out (the Raft core has not looked since).
        let (leader, leader_address) = ctx.repl.leader();
        let leader = leader.unwrap_or(0);
        pb::ClusterInfoResponse {
            leader_node_id: leader,
            leader_address,
            term: view.term,
            nodes: info
                .nodes
                .iter()
                .map(|n| pb::NodeInfo {
                    node_id: n.node_id,
                    address: n.address.clone(),
                    is_leader: n.node_id == leader,
                    is_alive: alive(n.node_id),
                    raft_address: n.raft_address.clone(),
                    is_voter: n.is_voter,
                })
                .collect(),
        }
    });
    match out.send(&resp).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}

/// Join/Leave RPCs need clustering.
pub async fn standalone_membership(mut call: Call) -> Status {
    // Drain the request so the client sees the status, not a reset.
    let _ = call.inbound.next_raw().await;
    Status::refused(
        Reason::Standalone,
        "node is not running in cluster mode (cluster.enabled is false): membership changes need a cluster",
    )
}

/// `grpc.health.v1.Health/Check`: SERVING once the broker takes writes.
pub async fn health_check(ctx: &Ctx, mut call: Call, out: &mut Outbound) -> Status {
    let req = match unary_request::<HealthCheckRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    if !known_service(&req.service) {
        return Status::refused(
            Reason::NotFound,
            format!("unknown service {:?}", req.service),
        );
    }
    let status = serving_status(ctx);
    match out
        .send(&HealthCheckResponse {
            status: status as i32,
        })
        .await
    {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}

/// SERVING once the write path is open and a leader is known, until shutdown.
fn serving_status(ctx: &Ctx) -> ServingStatus {
    let leader_known = ctx.repl.leader().0.is_some();
    if ctx.shutdown.is_triggered() || !leader_known || !ctx.writes_open.is_triggered() {
        ServingStatus::NotServing
    } else {
        ServingStatus::Serving
    }
}

/// How often a `Health/Watch` stream looks at the status again.
const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// `grpc.health.v1.Health/Watch`: the status at once, then each change, until the client goes
/// away or the server shuts down (after sending NOT_SERVING). An unknown service is
/// SERVICE_UNKNOWN on the stream (not an error), as the protocol has it.
pub async fn health_watch(ctx: &Ctx, mut call: Call, out: &mut Outbound) -> Status {
    let req = match unary_request::<HealthCheckRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    let known = known_service(&req.service);
    let mut last = None;
    loop {
        let status = if known {
            serving_status(ctx)
        } else {
            ServingStatus::ServiceUnknown
        };
        if last != Some(status) {
            if let Err(s) = out
                .send(&HealthCheckResponse {
                    status: status as i32,
                })
                .await
            {
                return s;
            }
            last = Some(status);
        }
        if ctx.shutdown.is_triggered() {
            return Status::shutting_down();
        }
        let tick = async {
            glommio::timer::sleep(WATCH_INTERVAL).await;
            true
        };
        let gone = async {
            out.closed().await;
            false
        };
        let stop = async {
            ctx.shutdown.wait().await;
            true
        };
        if !futures_lite::future::or(futures_lite::future::or(tick, stop), gone).await {
            return Status::refused(Reason::Cancelled, "the client went away");
        }
    }
}

/// Reads a unary request, runs a membership change on the Raft core and answers
/// `{success, error_message}` (status OK, as the API contract says for failures).
async fn change<Req, Resp>(
    cluster: &Replication,
    mut call: Call,
    out: &mut Outbound,
    op: impl FnOnce(Req) -> Result<MembershipOp, Status>,
    resp: impl FnOnce(bool, String) -> Resp,
) -> Status
where
    Req: prost::Message + Default,
    Resp: prost::Message,
{
    let req = match unary_request::<Req>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    let op = match op(req) {
        Ok(op) => op,
        Err(s) => return s,
    };
    let (reply, rx) = oneshot::channel();
    if cluster
        .writes()
        .send_async(WriteReq::Membership { op, reply })
        .await
        .is_err()
    {
        return Status::shutting_down();
    }
    let outcome = rx.await.unwrap_or(Err(MembershipError::Stopped));
    // A follower's refusal names the leader in a trailer (empty: not known yet): callers
    // follow it from there, or retry.
    let leader = match &outcome {
        Err(MembershipError::NotLeader { leader_addr }) => Some(leader_addr.clone()),
        _ => None,
    };
    let (ok, msg) = match outcome {
        Ok(()) => (true, String::new()),
        Err(e) => (false, e.to_string()),
    };
    match out.send(&resp(ok, msg)).await {
        Ok(()) => match leader {
            Some(l) => Status::ok().with_metadata(futureq_net::grpc::LEADER_ADDRESS, l),
            None => Status::ok(),
        },
        Err(s) => s,
    }
}

fn node_id(id: u64) -> Result<u64, Status> {
    if id == 0 {
        Err(Status::invalid("node_id must not be 0"))
    } else {
        Ok(id)
    }
}

fn raft_address(a: String) -> Result<String, Status> {
    match a.parse::<std::net::SocketAddr>() {
        Ok(s) if !s.ip().is_unspecified() && s.port() != 0 => Ok(a),
        _ => Err(Status::invalid(format!(
            "raft_address {a:?} must be a dialable host:port (no wildcard address)"
        ))),
    }
}

/// Why a membership call's caller may not change the membership, if it may not: without
/// the cluster secret (when one is set, and the caller is no admin), or without a node
/// certificate when `needs_certificate`.
fn refused_caller(
    secret: &futureq_net::peer_link::PeerSecret,
    admin: bool,
    needs_certificate: bool,
    call: &Call,
) -> Option<Refusal> {
    if !secret.is_open() && !admin {
        let offered = call
            .headers
            .get(crate::cluster::SECRET_HEADER)
            .map(|v| v.as_bytes().to_vec());
        if !offered.is_some_and(|o| secret.matches(&o)) {
            tracing::warn!(target: "grpc", method = %call.path, "membership call without the cluster secret refused");
            return Some(Refusal::new(Reason::Unauthenticated, "membership changes need the cluster secret (header futureq-cluster-secret): missing or wrong"));
        }
    }
    if needs_certificate {
        tracing::warn!(target: "grpc", method = %call.path, "membership call without a certificate of the cluster CA refused");
        return Some(Refusal::new(
            Reason::PermissionDenied,
            "membership changes need a client certificate of the cluster CA (cluster.tls) or an admin principal",
        ));
    }
    None
}

/// `JoinCluster`, `LeaveCluster`, `JoinMetadata`, `LeaveMetadata` on a clustered node; with a
/// cluster secret, only calls that carry it (header `futureq-cluster-secret`, compared in
/// constant time) or come from an `admin` principal are served, others get UNAUTHENTICATED;
/// with `needs_certificate` (cluster.tls on, the caller neither a node of the cluster by its
/// certificate nor an admin) PERMISSION_DENIED.
pub async fn membership(
    cluster: &Replication,
    secret: &futureq_net::peer_link::PeerSecret,
    admin: bool,
    needs_certificate: bool,
    call: Call,
    out: &mut Outbound,
) -> Status {
    if let Some(r) = refused_caller(secret, admin, needs_certificate, &call) {
        return super::context::drained(call, r).await;
    }
    match call.path.as_str() {
        "/futureq.FutureQCluster/JoinCluster" => {
            change(
                cluster,
                call,
                out,
                |r: pb::JoinRequest| {
                    Ok(MembershipOp::Join {
                        node_id: node_id(r.node_id)?,
                        raft_addr: raft_address(r.raft_address)?,
                    })
                },
                |success, error_message| pb::JoinResponse {
                    success,
                    error_message,
                },
            )
            .await
        }
        "/futureq.FutureQCluster/LeaveCluster" => {
            change(
                cluster,
                call,
                out,
                |r: pb::LeaveRequest| {
                    Ok(MembershipOp::Leave {
                        node_id: node_id(r.node_id)?,
                    })
                },
                |success, error_message| pb::LeaveResponse {
                    success,
                    error_message,
                },
            )
            .await
        }
        "/futureq.FutureQCluster/JoinMetadata" => {
            change(
                cluster,
                call,
                out,
                |r: pb::JoinMetadataRequest| {
                    Ok(MembershipOp::JoinMeta {
                        node_id: node_id(r.node_id)?,
                        raft_addr: raft_address(r.raft_address)?,
                    })
                },
                |success, error_message| pb::JoinMetadataResponse {
                    success,
                    error_message,
                },
            )
            .await
        }
        _ => {
            change(
                cluster,
                call,
                out,
                |r: pb::LeaveMetadataRequest| {
                    Ok(MembershipOp::LeaveMeta {
                        node_id: node_id(r.node_id)?,
                    })
                },
                |success, error_message| pb::LeaveMetadataResponse {
                    success,
                    error_message,
                },
            )
            .await
        }
    }
}
