//! Generates the tonic client for the futureq API from the protos the broker serves.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../net/proto");
    let fds = protox::compile(
        ["futureq.proto", "health.proto", "reflection_v1.proto"],
        ["../../net/proto"],
    )?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
