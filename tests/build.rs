//! Compiles the Modal API subset the backends speak into the server side,
//! for the contract fake (protox: no `protoc` binary needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../backends/proto/modal_api.proto");
    let fds = protox::compile(["modal_api.proto"], ["../backends/proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .compile_fds(fds)?;
    Ok(())
}
