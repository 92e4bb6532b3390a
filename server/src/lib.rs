//! sessionstore: a gRPC service that stores LLM chat sessions losslessly.
//!
//! Layers, with arrows pointing one way: `grpc → domain ← store`,
//! `grpc → watch → store`, and `grpc`, `watch`, `store` → [`wire`] →
//! `domain`; [`server`] wires them. See ARCHITECTURE.md.

pub mod admission;
pub mod auth;
pub mod cli;
pub mod config;
pub mod connection;
pub mod domain;
pub mod grpc;
pub mod health;
pub mod inflight;
pub mod metrics;
pub mod read_ahead;
pub mod server;
pub mod store;
pub mod sweep;
pub mod telemetry;
pub mod tls;
pub mod watch;
pub mod web;
pub mod wire;

/// The version `--version` prints and the server logs: the package version
/// and, when built from a git checkout, the commit.
pub const VERSION: &str = env!("SESSIONSTORE_VERSION");

#[cfg(test)]
mod invariants;
