//! Compiles `proto/` with protox (pure Rust), so no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // `proto` is a link to the workspace's ../proto, which `cargo package`
    // copies into the package: the packaged crate builds on its own.
    let proto_root = manifest_dir.join("proto");
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
    // The messages and the client, with tonic-prost's codec.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .btree_map(".")
        .compile_fds(fds.clone())?;
    // The server trait (the `server` feature) on its own, over the messages
    // above and with `ServerCodec`, which answers a request that does not
    // decode with INVALID_ARGUMENT instead of INTERNAL.
    if std::env::var_os("CARGO_FEATURE_SERVER").is_some() {
        let server_dir = out_dir.join("server");
        std::fs::create_dir_all(&server_dir)?;
        tonic_prost_build::configure()
            .build_client(false)
            .build_server(true)
            .btree_map(".")
            .extern_path(".sessionstore.v1", "crate::v1")
            .codec_path("crate::server_codec::ServerCodec")
            .out_dir(&server_dir)
            .compile_fds(fds)?;
    }
    Ok(())
}
