//! Compiles the API protos with protox (pure Rust: no system protoc) and prost-build, and
//! keeps their encoded descriptor set for gRPC server reflection (`reflection.rs`).
use prost::Message;
use prost_types::DescriptorProto;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(
        ["futureq.proto", "health.proto", "reflection_v1.proto"],
        ["proto"],
    )?;
    let mut served = fds.clone();
    served.file.push(v1alpha(&fds)?);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptors.bin"), served.encode_to_vec())?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    Ok(())
}

/// `grpc.reflection.v1alpha`: the v1 file under the older package name (the same messages,
/// so the same bytes on the wire), for the clients that still ask for it.
fn v1alpha(
    fds: &prost_types::FileDescriptorSet,
) -> Result<prost_types::FileDescriptorProto, Box<dyn std::error::Error>> {
    fn rename(t: &mut Option<String>) {
        if let Some(s) = t {
            *s = s.replace(".grpc.reflection.v1.", ".grpc.reflection.v1alpha.");
        }
    }
    fn rename_fields(m: &mut DescriptorProto) {
        m.field.iter_mut().for_each(|f| rename(&mut f.type_name));
        m.nested_type.iter_mut().for_each(rename_fields);
    }
    let mut f = fds
        .file
        .iter()
        .find(|f| f.name() == "reflection_v1.proto")
        .ok_or("reflection_v1.proto is not in the compiled set")?
        .clone();
    f.name = Some("reflection_v1alpha.proto".into());
    f.package = Some("grpc.reflection.v1alpha".into());
    f.message_type.iter_mut().for_each(rename_fields);
    for s in &mut f.service {
        for m in &mut s.method {
            rename(&mut m.input_type);
            rename(&mut m.output_type);
        }
    }
    Ok(f)
}
