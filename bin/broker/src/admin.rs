//! Commands an operator runs against a cluster from this node's configuration.

use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};

use crate::config::Settings;
use crate::{cluster, runtime};

/// Why `futureq leave` did not remove the node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaveError {
    /// The configuration is a standalone broker's.
    #[error("leave needs a clustered node (cluster.enabled: true); this node runs standalone")]
    Standalone,
    /// The process cannot host the client's executor.
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// The client's executor failed.
    #[error("the client executor failed: {0}")]
    Executor(String),
    /// The cluster answered with a refusal.
    #[error("the cluster refused: {0}")]
    Refused(String),
    /// The call failed.
    #[error("LeaveCluster on {seed} failed: {code}: {message}")]
    Call {
        /// The address called last (the seed, or the leader it named).
        seed: String,
        /// The gRPC status code.
        code: String,
        /// Its message.
        message: String,
    },
}

/// How long `futureq leave` follows leader redirects and waits out elections.
const LEAVE_RETRY_FOR: Duration = Duration::from_secs(10);

/// `futureq leave --seed`: asks the cluster (through `seed`, its leader) to remove this node
/// from the event shard and then the metadata group. Once it returns, the node's Raft data
/// may be deleted.
///
/// # Errors
/// See [`LeaveError`].
pub fn leave(settings: &Settings, seed: &str) -> Result<(), LeaveError> {
    use futureq_net::pb::{LeaveRequest, LeaveResponse};
    let Some(c) = &settings.cluster else {
        return Err(LeaveError::Standalone);
    };
    runtime::raise_memlock(1)?;
    let (node_id, seed_owned, secret) = (c.node_id, seed.to_owned(), c.secret.clone());
    let tls = c.tls.clone();
    // A refusal that names the leader is retried there, and one while leadership settles
    // (right after an election) a little later, for up to LEAVE_RETRY_FOR.
    let outcome = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(runtime::IO_MEMORY_PER_EXECUTOR)
        .spawn(move || async move {
            let until = std::time::Instant::now() + LEAVE_RETRY_FOR;
            let mut target = seed_owned;
            loop {
                let r = futureq_net::grpc::client::unary_answer::<_, LeaveResponse>(
                    futureq_net::grpc::client::Dial {
                        addr: &target,
                        tls: tls.as_deref(),
                    },
                    "/futureq.FutureQCluster/LeaveCluster",
                    &LeaveRequest { node_id },
                    &cluster::secret_header(&secret),
                    Duration::from_secs(30),
                )
                .await;
                // A refusal by a node that does not lead names the leader (or none yet).
                let retry = match &r {
                    Ok(a) if !a.message.success => match &a.leader {
                        Some(l) => {
                            if !l.is_empty() {
                                target.clone_from(l);
                            }
                            true
                        }
                        None => false,
                    },
                    _ => false,
                };
                if !retry || std::time::Instant::now() >= until {
                    return (target, r);
                }
                glommio::timer::sleep(Duration::from_millis(200)).await;
            }
        })
        .map_err(|e| LeaveError::Executor(e.to_string()))?
        .join()
        .map_err(|e| LeaveError::Executor(e.to_string()))?;
    let (called, outcome) = outcome;
    match outcome.map(|a| a.message) {
        Ok(r) if r.success => Ok(()),
        Ok(r) => Err(LeaveError::Refused(r.error_message)),
        Err(s) => Err(LeaveError::Call {
            seed: called,
            code: s.code.to_string(),
            message: s.message,
        }),
    }
}
