//! `grpc.reflection.v1` and `v1alpha`: one response per request on a bidirectional stream,
//! from the descriptors compiled into the binary ([`futureq_net::reflection`]).

use futureq_net::grpc::{Call, Outbound, Status};
use futureq_net::pb::reflection::ServerReflectionRequest;
use futureq_net::reflection::{Reflection, ReflectionError, DESCRIPTORS};
use futures_lite::future;

use super::context::Ctx;

/// The index of the API's descriptors, listing the API services, health and reflection's own.
///
/// # Errors
/// Only if the descriptors compiled into the binary do not match the services (a build defect,
/// caught by the tests).
pub fn index() -> Result<Reflection, ReflectionError> {
    let mut services = super::context::API_SERVICES.to_vec();
    services.push("grpc.health.v1.Health");
    services.extend(futureq_net::reflection::SERVICES);
    Reflection::new(DESCRIPTORS, &services)
}

/// Serves one reflection stream until the client half-closes, a protocol fault, or shutdown.
pub async fn serve(ctx: &Ctx, mut call: Call, out: &mut Outbound) -> Status {
    if let Err(s) = out.start() {
        return s;
    }
    loop {
        let next = async { Some(call.inbound.next::<ServerReflectionRequest>().await) };
        let stop = async {
            ctx.shutdown.wait().await;
            None
        };
        match future::or(next, stop).await {
            Some(Ok(Some(req))) => {
                if let Err(s) = out.send(&ctx.reflection.answer(req)).await {
                    return s;
                }
            }
            Some(Ok(None)) => return Status::ok(),
            Some(Err(s)) => return s,
            None => return Status::shutting_down(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_compiled_descriptors_define_every_routed_service() {
        super::index().unwrap();
    }
}
