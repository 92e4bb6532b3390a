#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod approvals;
mod auth;
mod client;
mod error;
mod queue;
mod requests;
mod retry;
mod run;
#[cfg(feature = "server")]
pub mod server_codec;
mod usage;
mod watch;

pub mod v1;

/// The encoded `FileDescriptorSet` of the `sessionstore.v1` protos, for
/// gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sessionstore_descriptor.bin"));

pub use auth::{BearerAuth, RawClient};
pub use client::{BoxStream, Client, ClientBuilder};
pub use error::{Error, Result};
pub use requests::{
    Exchange, ExportHistory, ListApprovals, ListSessions, NewApproval, NewInput, NewSession,
};
pub use retry::RetryPolicy;
pub use run::Run;
pub use v1::session_store_client::SessionStoreClient;
pub use watch::SessionEvents;
