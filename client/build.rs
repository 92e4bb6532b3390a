//! Compiles `proto/` with protox (pure Rust), so no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // Inside the workspace the protos live at ../proto; a packaged crate carries a copy.
    let proto_root = [manifest_dir.join("../proto"), manifest_dir.join("proto")]
        .into_iter()
        .find(|p| p.join("sessionstore/v1/sessionstore.proto").exists())
        .ok_or("cannot find proto/sessionstore/v1/sessionstore.proto")?;
    let files = [
        proto_root.join("sessionstore/v1/messages.proto"),
        proto_root.join("sessionstore/v1/sessionstore.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }

    let fds = protox::compile(&files, [&proto_root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    {
        use prost::Message as _;
        std::fs::write(
            out_dir.join("sessionstore_descriptor.bin"),
            fds.encode_to_vec(),
        )?;
    }
    let server = std::env::var_os("CARGO_FEATURE_SERVER").is_some();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(server)
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
