//! Compiles the protobuf contracts (needs `protoc`, installed by .ci/setup.sh).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["s3dma/agent/v1/agent.proto", "s3dma/tenant/v1/tenant.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&protos, &["."])?;
    Ok(())
}
