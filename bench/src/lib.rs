//! futureq-bench: the load generator, and a tonic client for the futureq API that the
//! end-to-end tests use as an independent gRPC implementation.

/// The generated tonic client and prost messages (`package futureq`, `grpc.health.v1`,
/// `grpc.reflection.v1`), from the client library.
pub use futureq_client::{health, pb, reflection};
