//! Compiles the API protos with protox (pure Rust: no system protoc) and prost-build.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["futureq.proto", "health.proto"], ["proto"])?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    Ok(())
}
