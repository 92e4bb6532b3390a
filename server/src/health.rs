//! gRPC health (`grpc.health.v1`) that follows the database: NOT_SERVING
//! while the database does not answer, SERVING again once it does, so load
//! balancers stop routing to a replica that can only fail.

use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::store::Store;

/// The service names health reports on: the server as a whole and the one
/// service.
const SERVICES: [&str; 2] = ["", "sessionstore.v1.SessionStore"];

/// How the reporter probes the database.
#[derive(Clone, Copy, Debug)]
pub struct ProbeOptions {
    /// Time between probes.
    pub interval: Duration,
    /// How long one probe may take before it counts as failed.
    pub timeout: Duration,
    /// Failed probes in a row before health turns NOT_SERVING.
    pub failures: u32,
}

impl Default for ProbeOptions {
    /// A probe a second, failing after 2 s; two failures in a row: NOT_SERVING
    /// within about 6 s of the database going away, SERVING within about a
    /// second of it answering again.
    fn default() -> Self {
        ProbeOptions {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            failures: 2,
        }
    }
}

/// Sets every service's status.
pub async fn set_all(reporter: &HealthReporter, status: ServingStatus) {
    for service in SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

/// Probes the database until `stopping` turns true, flipping health to
/// NOT_SERVING after `options.failures` failed probes in a row and back to
/// SERVING after one that succeeds.
pub async fn follow_database<S: Store>(
    store: S,
    reporter: HealthReporter,
    options: ProbeOptions,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut failures = 0_u32;
    let mut serving = true;
    loop {
        tokio::select! {
            _ = stopping.changed() => return,
            _ = tokio::time::sleep(options.interval) => {}
        }
        let answer = tokio::time::timeout(options.timeout, store.probe()).await;
        if *stopping.borrow() {
            return;
        }
        let failure = match answer {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!("no answer within {:?}", options.timeout)),
        };
        match failure {
            None => {
                failures = 0;
                if !serving {
                    serving = true;
                    tracing::info!("the database answers again: health SERVING");
                    set_all(&reporter, ServingStatus::Serving).await;
                }
            }
            Some(error) => {
                failures += 1;
                if serving && failures >= options.failures {
                    serving = false;
                    tracing::warn!(%error, "the database does not answer: health NOT_SERVING");
                    set_all(&reporter, ServingStatus::NotServing).await;
                }
            }
        }
    }
}
