//! The broker's gRPC services, wired to the store and the dispatcher.
//!
//! Layout:
//! - `producer`: `FutureQProducer.PublishStream`.
//! - `manage`: `FutureQProducer.Cancel` and `Reschedule`.
//! - `consumer`: `FutureQConsumer.Subscribe`.
//! - `inspect`: `FutureQAdmin.TopicStats` and `Peek`.
//! - `groups`: `FutureQAdmin.DeleteGroup`.
//! - `cluster`: `FutureQCluster.*` and `grpc.health.v1.Health` (`Check`, `Watch`).
//! - `reflection`: `grpc.reflection.v1` and `v1alpha` `ServerReflection`.
//!
//! Every error the client caused is answered with the status the API contract names and a
//! message naming the message and field.

mod cluster;
mod consumer;
mod groups;
mod inspect;
mod manage;
mod producer;
mod reflection;

use std::rc::Rc;
use std::sync::Arc;

use futureq_net::grpc::{Call, Code, Handler, Outbound, Status};
use futureq_net::Shutdown;

use crate::config::Settings;
use crate::dispatcher::HubCmd;
use crate::metrics::Metrics;
use crate::replication::Replication;

/// The futureq services [`handler`] routes, as health checks and reflection name them (one
/// list; `reflection_lists_and_describes_the_services` calls every method they describe).
pub(crate) const API_SERVICES: [&str; 4] = [
    "futureq.FutureQProducer",
    "futureq.FutureQConsumer",
    "futureq.FutureQCluster",
    "futureq.FutureQAdmin",
];

/// What every request handler on a core can reach.
pub struct Ctx {
    /// Validated configuration.
    pub settings: Arc<Settings>,
    /// The store, for the operator's reads (TopicStats, Peek) on its admin thread.
    pub store: futureq_storage::StoreService,
    /// The dispatcher's command queue.
    pub hub: flume::Sender<HubCmd>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Process-wide shutdown.
    pub shutdown: Shutdown,
    /// Where writes go (publish, delete, group registration: to the Raft core in a
    /// cluster, to the local journal standalone; either assigns event ids at the moment the
    /// write enters its log, so ids follow log order) and who leads.
    pub repl: Arc<Replication>,
    /// Fires when the write path is open (the journal replayed, the Raft groups started).
    pub writes_open: Shutdown,
    /// The node's budget of publish bytes in service.
    pub publish_budget: Arc<crate::budget::Budget>,
    /// Server reflection's index of the API descriptors.
    pub reflection: Arc<futureq_net::reflection::Reflection>,
    /// The data disk's free space (`None`: memory storage): publishes are refused below
    /// `storage.minFreeBytes`.
    pub disk: Option<Arc<crate::disk::DiskSpace>>,
}

pub use reflection::index as reflection_index;

/// Builds the request router.
pub fn handler(ctx: Rc<Ctx>) -> Handler {
    Rc::new(move |call: Call, out: &mut Outbound| {
        let ctx = Rc::clone(&ctx);
        Box::pin(async move {
            match call.path.as_str() {
                "/futureq.FutureQProducer/PublishStream" => {
                    producer::publish_stream(&ctx, call, out).await
                }
                "/futureq.FutureQConsumer/Subscribe" => consumer::subscribe(&ctx, call, out).await,
                "/futureq.FutureQProducer/Cancel" => manage::cancel(&ctx, call, out).await,
                "/futureq.FutureQProducer/Reschedule" => manage::reschedule(&ctx, call, out).await,
                "/futureq.FutureQAdmin/TopicStats" => inspect::topic_stats(&ctx, call, out).await,
                "/futureq.FutureQAdmin/Peek" => inspect::peek(&ctx, call, out).await,
                "/futureq.FutureQAdmin/DeleteGroup" => groups::delete_group(&ctx, call, out).await,
                "/futureq.FutureQCluster/GetClusterInfo" => {
                    cluster::get_cluster_info(&ctx, call, out).await
                }
                "/futureq.FutureQCluster/JoinCluster"
                | "/futureq.FutureQCluster/LeaveCluster"
                | "/futureq.FutureQCluster/JoinMetadata"
                | "/futureq.FutureQCluster/LeaveMetadata" => match &ctx.settings.cluster {
                    Some(c) => cluster::membership(&ctx.repl, &c.secret, call, out).await,
                    None => cluster::standalone_membership(call).await,
                },
                "/grpc.health.v1.Health/Check" => cluster::health_check(&ctx, call, out).await,
                "/grpc.health.v1.Health/Watch" => cluster::health_watch(&ctx, call, out).await,
                futureq_net::reflection::V1_METHOD | futureq_net::reflection::V1ALPHA_METHOD => {
                    reflection::serve(&ctx, call, out).await
                }
                path => Status::new(Code::Unimplemented, format!("unknown method {path}")),
            }
        })
    })
}

/// Waits until the write path is open (the journal replayed, the Raft groups started), at
/// most `publish.proposalTimeout`: an answer read from a store still being replayed (a
/// partial Peek, a stats count, a cancel's "not found") would be wrong, not just late.
///
/// # Errors
/// UNAVAILABLE while recovery goes on past the bound, or at shutdown.
async fn recovered(ctx: &Ctx) -> Result<(), Status> {
    if ctx.writes_open.is_triggered() {
        return Ok(());
    }
    let wait = async {
        futures_lite::future::or(ctx.writes_open.wait(), ctx.shutdown.wait()).await;
    };
    let timeout = glommio::timer::sleep(ctx.settings.proposal_timeout);
    futures_lite::future::or(wait, async {
        timeout.await;
    })
    .await;
    if ctx.writes_open.is_triggered() && !ctx.shutdown.is_triggered() {
        Ok(())
    } else {
        Err(Status::new(
            Code::Unavailable,
            "the broker is recovering (replaying its journal or starting its Raft groups); retry shortly",
        ))
    }
}

/// Reads the single request message of a unary call.
async fn unary_request<M: prost::Message + Default>(call: &mut Call) -> Result<M, Status> {
    match call.inbound.next::<M>().await? {
        Some(m) => Ok(m),
        None => Err(Status::new(
            Code::InvalidArgument,
            "missing request message",
        )),
    }
}
