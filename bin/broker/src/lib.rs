//! The futureq broker: everything the `futureq` binary runs, as a library tests can drive.
//!
//! Layout (one job per module):
//! - [`config`]: the configuration file, its defaults and environment overrides, validated
//!   into [`config::Settings`].
//! - [`server`]: the process: one glommio executor per core, started and stopped together.
//! - `api`: the gRPC services (producer, consumer, cluster and health) on every core.
//! - `dispatcher`: core 0's delivery loop (the `futureq_core::hub` state machine over the
//!   store) and the TTL sweeper.
//! - `replication`: the seam between the modes, as every core sees it: the write requests
//!   (`WriteReq`) and who leads (a standalone broker is a one-node cluster that always leads).
//! - `local` and `cluster`: the two servers of the write requests on `runtime.raftCore`: the
//!   local journal (standalone) or the Raft groups (clustered).
//! - [`metrics`]: Prometheus text for every core's counters.
//! - [`runtime`]: process limits, CPU list, executor keep-alive.
//! - [`admin`]: operator commands against a cluster (`futureq leave`).
//! - [`auth`]: principals and their permissions (`api.auth.principalsFile`).
//! - [`certs`]: development certificates (`futureq certs dev`).
//! - [`security`]: what SIGHUP re-reads (certificates, principals) and its metrics.

pub mod admin;
mod api;
pub mod auth;
mod budget;
pub mod certs;
pub mod clock;
mod cluster;
pub mod config;
mod disk;
mod dispatcher;
mod exit;
mod fatal;
mod local;
mod mailbox;
pub mod metrics;
mod replication;
pub mod runtime;
pub mod security;
pub mod server;
mod task;

pub use exit::{ServerError, EXIT_WRITE_PATH_FAILED};
pub use futureq_net::Shutdown;
pub use server::run;
