//! The client crate (`sessionstore_client::Client`) as the tests connect it.

use std::time::Duration;

use sessionstore_client::{Client, RetryPolicy};

/// Retries quick and many, so a test rides out a server restart.
fn patient() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(200)
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(200))
}

/// A client of `endpoint` whose calls and watches retry [`patient`]ly.
pub async fn patient_client(endpoint: &str) -> Client {
    Client::builder(endpoint)
        .connect_timeout(Duration::from_secs(5))
        .retry_policy(patient())
        .watch_retry_policy(patient())
        .connect()
        .await
        .expect("connect")
}
