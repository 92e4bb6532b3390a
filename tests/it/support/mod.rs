//! Test support: a real sessionstore server on an ephemeral port, per
//! backend (`server`), the PostgreSQL behind it (`postgres`), and the
//! requests and readings the tests share (`rpc`).

use std::net::SocketAddr;
use std::time::Duration;

mod cli;
mod client_crate;
pub mod cluster;
mod postgres;
pub mod prereq;
mod proxy;
mod rpc;
mod server;

pub use cli::{CliWatch, sessions_cli, table_rows};
pub use client_crate::patient_client;
pub use postgres::*;
pub use proxy::Proxy;
pub use rpc::*;
pub use server::*;

/// Runs each listed async test function once per backend, as separate tests.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Memory).await;
                }
            )*
        }
        mod file {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::File).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if $crate::support::postgres_available(concat!(module_path!(), "::", stringify!($name))).await {
                        super::$name($crate::support::Backend::Postgres).await;
                    }
                }
            )*
        }
    };
}

/// Runs each listed async test function (no arguments) as a test of
/// PostgreSQL alone, in module `postgres_only`: where no PostgreSQL is
/// reachable it fails, unless `SESSIONSTORE_TEST_SKIP` names `postgres`
/// (see [`prereq`]).
#[macro_export]
macro_rules! postgres_tests {
    ($($name:ident),* $(,)?) => {
        mod postgres_only {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if $crate::support::postgres_available(concat!(module_path!(), "::", stringify!($name))).await {
                        super::$name().await;
                    }
                }
            )*
        }
    };
}

/// The Prometheus text a server's `/metrics` serves.
pub async fn scrape(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to /metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .expect("ask for /metrics");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read /metrics");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// Polls `check` until it gives `Some`, for at most `patience`, and panics
/// naming `what` after that. Only for conditions that have no signal to
/// wait on (a gauge scraped from `/metrics`, a token file reloaded on the
/// server's own schedule): each try is a real request, and the pause
/// between tries only keeps them from flooding the server.
pub async fn poll_until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    patience: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + patience;
    let mut interval = tokio::time::interval(Duration::from_millis(20));
    loop {
        interval.tick().await;
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {patience:?}"
        );
    }
}
