#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

/// The generated `sessionstore.v1` messages, client stub and (with the
/// `server` feature) server trait.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("sessionstore.v1");
    #[cfg(feature = "server")]
    include!(concat!(env!("OUT_DIR"), "/server/sessionstore.v1.rs"));
}

mod auth;
mod client;
mod error;
mod requests;
mod retry;
mod run;
#[cfg(feature = "server")]
pub mod server_codec;
mod usage;
mod watch;

/// The encoded `FileDescriptorSet` of the `sessionstore.v1` protos, for
/// gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sessionstore_descriptor.bin"));

pub use auth::{BearerAuth, RawClient};
pub use client::{BoxStream, Client, ClientBuilder};
pub use error::{Error, Result};
pub use requests::{Exchange, ExportHistory, ListSessions, NewSession};
pub use retry::RetryPolicy;
pub use run::Run;
pub use v1::session_store_client::SessionStoreClient;
pub use watch::SessionEvents;
