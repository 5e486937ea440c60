//! Compiles `proto/modal_api.proto` (the subset of Modal's API hermes
//! speaks) into the gRPC client, with protox: no `protoc` binary needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/modal_api.proto");
    if std::env::var_os("CARGO_FEATURE_MODAL").is_none() {
        return Ok(());
    }
    let fds = protox::compile(["modal_api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        // Its header values are real keys: its Debug (in the driver)
        // names the headers only.
        .skip_debug([".modal.client.ExperimentalOutboundPolicy.HeaderReplacement"])
        .compile_fds(fds)?;
    Ok(())
}
