//! The code generated from our .proto files and the standard gRPC services' (tonic, prost).

/// Generated tonic client and prost messages for `package futureq`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("futureq");
}

/// Generated client for `grpc.health.v1`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod health {
    tonic::include_proto!("grpc.health.v1");
}

/// Generated client for `grpc.reflection.v1`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod reflection {
    tonic::include_proto!("grpc.reflection.v1");
}
