//! Compiles the API protos with protox (pure Rust: no system protoc) and prost-build, and
//! keeps their encoded descriptor set for gRPC server reflection (`reflection.rs`).
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(
        [
            "futureq.proto",
            "health.proto",
            "reflection_v1.proto",
            "reflection_v1alpha.proto",
        ],
        ["proto"],
    )?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptors.bin"), fds.encode_to_vec())?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    Ok(())
}
