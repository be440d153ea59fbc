//! Membership flows: joining through seeds (this node's side) and the leader's side of
//! JoinCluster, LeaveCluster, JoinMetadata and LeaveMetadata.

use std::time::{Duration, Instant};

use futureq_core::refusal::WriteError;
use futureq_raft::node::{Forward, Node, Standing};

use super::core::{Core, META_DEADLINE};
use crate::config::ClusterSettings;
use crate::replication::{MembershipError, MembershipOp};

/// How long a joining node may take to catch up before it is promoted: a snapshot of 10^7
/// messages (~1.7 GB) is sent and installed in about a minute here, so 30 s refused joins
/// to a cluster with a large backlog (found by `futureq-bench compare`'s cluster pending
/// scenario: the new node exited).
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(600);
/// How long one JoinCluster call may take (the leader waits for the catch-up).
const JOIN_TIMEOUT: Duration = Duration::from_secs(660);
/// Catch-up polling interval.
const CATCH_UP_POLL: Duration = Duration::from_millis(500);
/// Attempts to finish an unfinished join after a restart.
const REJOIN_ATTEMPTS: u32 = 30;
/// Pause between them.
const REJOIN_PAUSE: Duration = Duration::from_secs(2);

/// No seed added this node to the cluster.
#[derive(Debug, thiserror::Error)]
#[error("failed to join cluster: all seeds exhausted (last: {last})")]
pub struct JoinError {
    /// The last seed's answer.
    last: String,
}

/// gRPC header carrying the cluster secret on membership RPCs.
pub const SECRET_HEADER: &str = "futureq-cluster-secret";

/// The request headers that carry `secret` (none when there is no secret).
#[must_use]
pub fn secret_header(secret: &futureq_net::peer_link::PeerSecret) -> Vec<(&'static str, &str)> {
    if secret.is_open() {
        Vec::new()
    } else {
        vec![(
            SECRET_HEADER,
            std::str::from_utf8(secret.bytes()).unwrap_or_default(),
        )]
    }
}

/// Asks the seeds, in order, to add this node (JoinCluster); a refusal that names the leader
/// is retried there once. The leader adds it as a learner, waits for it to catch up (this
/// node's groups already run and receive the log or a snapshot), then promotes it.
pub(super) async fn join(cfg: &ClusterSettings, grpc_advertise: &str) -> Result<(), JoinError> {
    use futureq_net::pb::{JoinRequest, JoinResponse};
    let req = JoinRequest {
        node_id: cfg.node_id,
        raft_address: cfg.raft_advertise.clone(),
        grpc_address: grpc_advertise.to_owned(),
    };
    let mut seeds: Vec<String> = cfg.join_seeds.clone();
    let mut last = String::new();
    let mut i = 0;
    while i < seeds.len() {
        let seed = seeds[i].clone();
        i += 1;
        tracing::info!(target: "raft", %seed, "asking to join the cluster");
        match futureq_net::grpc::client::unary_answer::<_, JoinResponse>(
            futureq_net::grpc::client::Dial {
                addr: &seed,
                tls: cfg.tls.as_deref(),
            },
            "/futureq.FutureQCluster/JoinCluster",
            &req,
            &secret_header(&cfg.secret),
            JOIN_TIMEOUT,
        )
        .await
        {
            Ok(r) if r.message.success => {
                tracing::info!(target: "raft", %seed, "joined the cluster");
                return Ok(());
            }
            Ok(r) => {
                if let Some(leader) = r.leader.filter(|l| !l.is_empty()) {
                    if !seeds.contains(&leader) {
                        seeds.insert(i, leader);
                    }
                }
                last = format!("{seed}: {}", r.message.error_message);
            }
            Err(s) => last = format!("{seed}: {}", s.message),
        }
        tracing::warn!(target: "raft", error = %last, "join attempt failed");
    }
    Err(JoinError { last })
}

/// Finishes a join that did not (its reply was lost, or this node stopped mid-join): asks
/// again in the background; the leader does only the missing steps. (A node that is in
/// neither group left the cluster: it does not rejoin by itself.)
pub(super) fn finish_join(cfg: &ClusterSettings, grpc_advertise: &str, node: &Node) {
    let (cfg, advertise, node) = (cfg.clone(), grpc_advertise.to_owned(), node.clone());
    glommio::spawn_local(async move {
        for attempt in 1..=REJOIN_ATTEMPTS {
            if node.standing(cfg.node_id) == (Standing::Voter, Standing::Voter) {
                return;
            }
            match join(&cfg, &advertise).await {
                Ok(()) => return,
                Err(e) => tracing::warn!(target: "raft", attempt, error = %e, "finishing the join failed; retrying"),
            }
            glommio::timer::sleep(REJOIN_PAUSE).await;
        }
    })
    .detach();
}

impl Core {
    fn not_leader(&self) -> MembershipError {
        MembershipError::NotLeader {
            leader_addr: self.cluster.leader_addr(),
        }
    }

    pub(super) async fn membership(&self, op: &MembershipOp) -> Result<(), MembershipError> {
        let deadline = || Instant::now() + META_DEADLINE;
        let fmt = |step: &'static str, cause: WriteError| MembershipError::Step { step, cause };
        match op {
            MembershipOp::Join { node_id, raft_addr } => {
                // Idempotent: a retried join (its reply was lost, or the node restarted
                // mid-join) does only the steps still missing.
                if self.leading_now().is_err() {
                    return Err(self.not_leader());
                }
                let (event, meta) = self.node.standing(*node_id);
                let learner = Forward::AddLearner(*node_id, raft_addr.clone());
                if meta == Standing::Absent {
                    self.node
                        .meta_request(learner.clone(), deadline())
                        .await
                        .map_err(|e| fmt("adding it to the metadata group", e))?;
                }
                if event == Standing::Absent {
                    self.node
                        .event_request(learner, deadline())
                        .await
                        .map_err(|e| fmt("adding it to the event shard", e))?;
                }
                if event != Standing::Voter {
                    self.wait_caught_up(*node_id).await?;
                }
                if meta != Standing::Voter {
                    self.node
                        .meta_request(Forward::AddVoter(*node_id), deadline())
                        .await
                        .map_err(|e| fmt("promoting it in the metadata group", e))?;
                }
                if event != Standing::Voter {
                    self.node
                        .event_request(Forward::AddVoter(*node_id), deadline())
                        .await
                        .map_err(|e| fmt("promoting it in the event shard", e))?;
                }
                Ok(())
            }
            MembershipOp::Leave { node_id } => {
                if self.leading_now().is_err() {
                    return Err(self.not_leader());
                }
                self.node
                    .event_request(Forward::Remove(*node_id), deadline())
                    .await
                    .map_err(|e| fmt("removing it from the event shard", e))?;
                self.node
                    .meta_request(Forward::Remove(*node_id), deadline())
                    .await
                    .map_err(|e| fmt("removing it from the metadata group", e))
            }
            MembershipOp::JoinMeta { node_id, raft_addr } => self
                .node
                .meta_request(Forward::AddLearner(*node_id, raft_addr.clone()), deadline())
                .await
                .map_err(|e| fmt("adding it to the metadata group", e)),
            MembershipOp::LeaveMeta { node_id } => self
                .node
                .meta_request(Forward::Remove(*node_id), deadline())
                .await
                .map_err(|e| fmt("removing it from the metadata group", e)),
        }
    }

    /// Polls until the learner's replicated index reaches the leader's last index as of the
    /// start of the wait.
    async fn wait_caught_up(&self, node_id: u64) -> Result<(), MembershipError> {
        let until = Instant::now() + CATCH_UP_DEADLINE;
        let target = self.node.event_last_log_index();
        loop {
            if self.node.matched_index(node_id) >= target {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(MembershipError::CatchUp {
                    node_id,
                    within: CATCH_UP_DEADLINE,
                });
            }
            glommio::timer::sleep(CATCH_UP_POLL).await;
        }
    }
}
