//! sessionstore's end-to-end tests: the real server over real gRPC, against
//! every storage backend. One binary; one module per area.

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod support;

mod append_writers;
mod approvals;
mod auth;
mod backup;
mod browser;
mod cli;
mod cli_approvals;
mod cli_edges;
mod cli_queue;
mod client;
mod client_approvals;
mod client_queue;
mod concurrency;
mod core;
mod crash;
mod deletion;
mod deploy;
mod erase;
mod export_file;
mod export_target;
mod failover;
mod faults;
mod faults_edge;
mod faults_streams;
mod first_write;
mod framework;
mod history;
mod hostile;
mod keyed_calls;
mod large;
mod ledger;
mod lifecycle;
mod live;
mod migrations;
mod newcomer;
mod ops;
mod power_loss;
mod provider_bodies;
mod python;
mod python_package;
mod queued_input;
mod readme;
mod replicas;
mod rolling_upgrade;
mod runs;
mod search_switch;
mod store;
mod tenancy;
mod usage;
mod watch;

/// The end of the run: fails when `SESSIONSTORE_TEST_SKIP` let tests pass
/// without running (its name makes it the last test libtest starts, and a
/// failure is listed at the end of the output). See `support::prereq`.
#[tokio::test]
async fn zz_skipped_prerequisites() {
    support::prereq::summary().await;
}
