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
//! - `context`: what every service shares: the context ([`Ctx`]), the caller's session and
//!   authentication, reading a request, the store's admin reads, the common refusals.
//!
//! Every refusal is a typed [`Refusal`] (a reason and what became of the write) turned into a
//! status by the one table in [`futureq_net::grpc::status`]; its message names the message and
//! field the client got wrong, for people.

mod cluster;
mod consumer;
mod context;
mod groups;
mod inspect;
mod manage;
mod producer;
mod reflection;

use std::rc::Rc;

use futureq_core::refusal::Reason;
use futureq_net::grpc::{Call, Handler, Outbound, Status};

use self::context::{authenticate, drained, is_membership, Session};
use crate::auth::Access;

pub use self::context::Ctx;

pub use reflection::index as reflection_index;

/// Builds the request router. Every call but `grpc.health` is authenticated first when
/// principals are configured; each service checks its principal's permissions.
pub fn handler(ctx: Rc<Ctx>) -> Handler {
    Rc::new(move |call: Call, out: &mut Outbound| {
        let ctx = Rc::clone(&ctx);
        Box::pin(async move {
            match call.path.as_str() {
                "/grpc.health.v1.Health/Check" => {
                    return cluster::health_check(&ctx, call, out).await
                }
                "/grpc.health.v1.Health/Watch" => {
                    return cluster::health_watch(&ctx, call, out).await
                }
                _ => {}
            }
            let session = Session::new(&ctx);
            let access = authenticate(&ctx, &call);
            if is_membership(&call.path) {
                return match &ctx.settings.cluster {
                    Some(c) => {
                        // The cluster's own identity (its secret, and with cluster.tls its
                        // certificate) or an admin may change it.
                        let admin = matches!(&access, Ok(Access::As(p)) if p.is_admin());
                        let needs_certificate =
                            !admin && c.tls.is_some() && !call.peer.cluster_member;
                        if !admin && c.secret.is_open() {
                            if let Err(r) = access.and_then(|a| a.admin("change the membership")) {
                                return drained(call, r).await;
                            }
                        }
                        cluster::membership(
                            &ctx.repl,
                            &c.secret,
                            admin,
                            needs_certificate,
                            call,
                            out,
                        )
                        .await
                    }
                    None => cluster::standalone_membership(call).await,
                };
            }
            let access = match access {
                Ok(a) => a,
                Err(r) => return drained(call, r).await,
            };
            match call.path.as_str() {
                "/futureq.FutureQProducer/PublishStream" => {
                    producer::publish_stream(&ctx, (&access, session), call, out).await
                }
                "/futureq.FutureQConsumer/Subscribe" => {
                    consumer::subscribe(&ctx, (&access, session), call, out).await
                }
                "/futureq.FutureQProducer/Cancel" => manage::cancel(&ctx, &access, call, out).await,
                "/futureq.FutureQProducer/Reschedule" => {
                    manage::reschedule(&ctx, &access, call, out).await
                }
                "/futureq.FutureQAdmin/TopicStats" => {
                    inspect::topic_stats(&ctx, &access, call, out).await
                }
                "/futureq.FutureQAdmin/Peek" => inspect::peek(&ctx, &access, call, out).await,
                "/futureq.FutureQAdmin/DeleteGroup" => {
                    groups::delete_group(&ctx, &access, call, out).await
                }
                "/futureq.FutureQCluster/GetClusterInfo" => {
                    cluster::get_cluster_info(&ctx, call, out).await
                }
                futureq_net::reflection::V1_METHOD | futureq_net::reflection::V1ALPHA_METHOD => {
                    reflection::serve(&ctx, call, out).await
                }
                path => Status::refused(Reason::Unimplemented, format!("unknown method {path}")),
            }
        })
    })
}
