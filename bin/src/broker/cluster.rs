//! `FutureQCluster` in standalone mode, and the gRPC health service.

use futureq_net::grpc::{Call, Code, Outbound, Status};
use futureq_net::pb;
use futureq_net::pb::health::{
    health_check_response::ServingStatus, HealthCheckRequest, HealthCheckResponse,
};

use super::{unary_request, Ctx};

/// Services the health check knows.
const SERVICES: [&str; 4] = [
    "",
    "futureq.FutureQProducer",
    "futureq.FutureQConsumer",
    "futureq.FutureQCluster",
];

/// Standalone answers a one-node topology with itself as leader.
pub async fn get_cluster_info(ctx: &Ctx, mut call: Call, out: &mut Outbound) -> Status {
    if let Err(s) = unary_request::<pb::ClusterInfoRequest>(&mut call).await {
        return s;
    }
    let s = &ctx.settings;
    let resp = pb::ClusterInfoResponse {
        leader_node_id: s.node_id,
        leader_address: s.grpc_advertise.clone(),
        nodes: vec![pb::NodeInfo {
            node_id: s.node_id,
            address: s.grpc_advertise.clone(),
            is_leader: true,
            is_alive: true,
            raft_address: String::new(),
            is_voter: true,
        }],
    };
    match out.send(&resp).await {
        Ok(()) => Status::ok(),
        Err(s) => s,
    }
}

/// Join/Leave RPCs need clustering.
pub async fn standalone_membership(mut call: Call) -> Status {
    // Drain the request so the client sees the status, not a reset.
    let _ = call.inbound.next_raw().await;
    Status::new(
        Code::FailedPrecondition,
        "node is not running in cluster mode (cluster.enabled is false): membership changes need a cluster",
    )
}

/// `grpc.health.v1.Health/Check`: SERVING once the broker takes writes.
pub async fn health_check(ctx: &Ctx, mut call: Call, out: &mut Outbound) -> Status {
    let req = match unary_request::<HealthCheckRequest>(&mut call).await {
        Ok(r) => r,
        Err(s) => return s,
    };
    if !SERVICES.contains(&req.service.as_str()) {
        return Status::new(Code::NotFound, format!("unknown service {:?}", req.service));
    }
    let status = if ctx.shutdown.is_triggered() {
        ServingStatus::NotServing
    } else {
        ServingStatus::Serving
    };
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
