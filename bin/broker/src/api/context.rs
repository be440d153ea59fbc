//! What every service of the API shares: the context ([`Ctx`]), who a call comes from
//! ([`authenticate`], [`Session`]), reading a unary request and a delivery tag, the store's
//! admin reads, and the refusals every service gives (recovering, not the leader, a write
//! the write path did not carry out).

use std::sync::Arc;

use futureq_core::refusal::{Outcome, Reason, Refusal, WriteError};
use futureq_core::EventKey;
use futureq_net::grpc::{Call, Status};
use futureq_net::Shutdown;

use crate::auth::Access;
use crate::config::Settings;
use crate::dispatcher::HubCmd;
use crate::metrics::Metrics;
use crate::replication::Replication;

/// The futureq services [`super::handler`] routes/// The futureq services [`handler`] routes, as health checks and reflection name them (one
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
    pub hub: crate::mailbox::Mailbox<HubCmd>,
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

/// Whether `path` is one of the cluster's membership methods.
pub(super) fn is_membership(path: &str) -> bool {
    matches!(
        path,
        "/futureq.FutureQCluster/JoinCluster"
            | "/futureq.FutureQCluster/LeaveCluster"
            | "/futureq.FutureQCluster/JoinMetadata"
            | "/futureq.FutureQCluster/LeaveMetadata"
    )
}

/// The principals a stream was authenticated against: when a reload replaces them, the
/// stream's caller is authenticated again (a revoked token or certificate name ends it).
/// Made before the call is authenticated, so that a reload in between is seen (at worst
/// once too often).
pub(crate) struct Session {
    seen: u64,
    /// Registered once and kept while it has not fired (not once per wait).
    listener: Option<event_listener::EventListener>,
}

impl Session {
    pub(crate) fn new(ctx: &Ctx) -> Self {
        Session {
            seen: ctx
                .settings
                .security
                .auth
                .as_ref()
                .map_or(0, |a| a.generation()),
            listener: None,
        }
    }

    /// The call's access again when the principals were replaced since the last look;
    /// `None` when they were not.
    pub(crate) fn recheck(&mut self, ctx: &Ctx, call: &Call) -> Option<Result<Access, Refusal>> {
        let auth = ctx.settings.security.auth.as_ref()?;
        let now = auth.generation();
        if now == self.seen {
            return None;
        }
        self.seen = now;
        Some(authenticate(ctx, call))
    }

    /// Resolves when the principals were replaced since the last look (never without them).
    pub(crate) async fn reloaded(&mut self, ctx: &Ctx) {
        let Some(auth) = &ctx.settings.security.auth else {
            return futures_lite::future::pending().await;
        };
        loop {
            let listener = self.listener.get_or_insert_with(|| auth.listen());
            if auth.generation() != self.seen {
                return;
            }
            listener.await;
            self.listener = None;
        }
    }
}

/// Who `call` comes from: [`Access::Open`] without principals, else its principal.
///
/// # Errors
/// UNAUTHENTICATED when principals are configured and the call proves none.
pub(super) fn authenticate(ctx: &Ctx, call: &Call) -> Result<Access, Refusal> {
    let Some(auth) = &ctx.settings.security.auth else {
        return Ok(Access::Open);
    };
    if call.peer.cluster_member && call.path == "/futureq.FutureQCluster/GetClusterInfo" {
        // Another node of the cluster (its node certificate) asking the leader for its own
        // caller; a node certificate is no principal for anything else.
        return Ok(Access::Open);
    }
    let header = call.headers.get("authorization").map(|v| v.as_bytes());
    let principal = auth.principals().authenticate(header, &call.peer);
    match &principal {
        Ok(p) => {
            tracing::trace!(target: "grpc", method = %call.path, principal = %p.name, "authenticated")
        }
        Err(r) => {
            ctx.metrics.auth_refusals.add(&[r.reason.name()], 1);
            tracing::debug!(target: "grpc", method = %call.path, error = %r.message, "call refused: not authenticated");
        }
    }
    principal.map(Access::As)
}

/// Answers `r` to a call refused before its service saw it. A unary request's message is read
/// first (within a second), so the client sees the status rather than a reset.
pub(super) async fn drained(mut call: Call, r: Refusal) -> Status {
    if UNARY.contains(&call.path.as_str()) || is_membership(&call.path) {
        let _ =
            futures_lite::future::or(async { call.inbound.next_raw().await.map(|_| ()) }, async {
                glommio::timer::sleep(std::time::Duration::from_secs(1)).await;
                Ok(())
            })
            .await;
    }
    Status::from(r)
}

/// The unary methods (one request message) besides the membership ones ([`is_membership`]).
const UNARY: &[&str] = &[
    "/futureq.FutureQProducer/Cancel",
    "/futureq.FutureQProducer/Reschedule",
    "/futureq.FutureQAdmin/TopicStats",
    "/futureq.FutureQAdmin/Peek",
    "/futureq.FutureQAdmin/DeleteGroup",
    "/futureq.FutureQCluster/GetClusterInfo",
];

/// Waits until the write path is open (the journal replayed, the Raft groups started), at
/// most `publish.proposalTimeout`: an answer read from a store still being replayed (a
/// partial Peek, a stats count, a cancel's "not found") would be wrong, not just late.
///
/// # Errors
/// UNAVAILABLE (RECOVERING) while recovery goes on past the bound; SHUTTING_DOWN at shutdown.
pub(super) async fn recovered(ctx: &Ctx) -> Result<(), Status> {
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
    if ctx.shutdown.is_triggered() {
        Err(Refusal::shutting_down().into())
    } else if ctx.writes_open.is_triggered() {
        Ok(())
    } else {
        Err(Status::refused(
            Reason::Recovering,
            "the broker is recovering (replaying its journal or starting its Raft groups); retry shortly",
        ))
    }
}

/// Reads the single request message of a unary call.
pub(super) async fn unary_request<M: prost::Message + Default>(
    call: &mut Call,
) -> Result<M, Status> {
    match call.inbound.next::<M>().await? {
        Some(m) => Ok(m),
        None => Err(Status::invalid("missing request message")),
    }
}

/// NOT_LEADER naming the leader this node knows of.
pub(super) fn not_leader(ctx: &Ctx) -> Status {
    Refusal::not_leader(&ctx.repl.leader_addr()).into()
}

/// The refusal of a write (`what`) the write path did not carry out, with its outcome.
pub(crate) fn write_refusal(ctx: &Ctx, what: &str, e: &WriteError) -> Refusal {
    let timeout = format!(
        "publish.proposalTimeout ({:?})",
        ctx.settings.proposal_timeout
    );
    e.refusal(what, &ctx.repl.leader_addr(), &timeout)
}

/// Reads the store on its admin thread (one such read at a time on the node, on no
/// executor: see [`futureq_storage::StoreService::admin`]).
pub(super) async fn read<T: Send + 'static>(
    ctx: &Ctx,
    f: impl FnOnce(&futureq_storage::Store) -> Result<T, futureq_storage::StoreError> + Send + 'static,
) -> Result<T, Status> {
    ctx.store.admin(f).await.and_then(|r| r).map_err(|e| {
        tracing::error!(target: "api", error = %e, "reading the store failed");
        // A read: nothing was written.
        Refusal::new(Reason::Internal, format!("reading the store failed: {e}"))
            .with_outcome(Outcome::NotStored)
            .into()
    })
}

/// A delivery tag from a request's `field`: 24 bytes, else INVALID_ARGUMENT naming it.
pub(super) fn tag_of(field: &str, tag: &[u8]) -> Result<EventKey, Status> {
    EventKey::from_slice(tag).map_err(|_| {
        Status::invalid(format!(
            "{field}: {} bytes; a delivery tag is {} bytes, as received",
            tag.len(),
            futureq_core::KEY_LEN
        ))
    })
}
