#![doc = include_str!("../README.md")]

/// The generated `sessionstore.v1` messages, client stub and (with the
/// `server` feature) server trait.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("sessionstore.v1");
}

/// The encoded `FileDescriptorSet` of the `sessionstore.v1` protos, for
/// gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sessionstore_descriptor.bin"));

pub use v1::session_store_client::SessionStoreClient;
