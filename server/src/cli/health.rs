//! `sessionstore health`: a running server's `grpc.health.v1` status, for
//! container probes and scripts.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::{Connection, connect, explain_connection, server_url};

/// How long a probe waits for the server before it says it is not serving.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Ask a running server whether it is serving.
#[derive(Debug, Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub connection: Connection,

    /// The service to ask about: empty for the whole server, or
    /// `sessionstore.v1.SessionStore`.
    #[arg(long, default_value = "")]
    pub service: String,
}

/// Prints the status (`SERVING`, `NOT_SERVING`, …); `Ok(true)` when serving.
pub async fn run(args: HealthArgs) -> anyhow::Result<bool> {
    let server = server_url(&args.connection.server);
    let token_given = args.connection.token.is_some();
    match check(&args).await {
        Ok(serving) => Ok(serving),
        Err(error) => Err(explain_connection(error, &server, token_given).await),
    }
}

async fn check(args: &HealthArgs) -> anyhow::Result<bool> {
    let client = connect(&args.connection, PROBE_TIMEOUT).await?;
    let mut health = HealthClient::new(client.channel());
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: args.service.clone(),
    });
    request.set_timeout(PROBE_TIMEOUT);
    let status = tokio::time::timeout(PROBE_TIMEOUT, health.check(request))
        .await
        .map_err(|_| anyhow::anyhow!("the server did not answer within {PROBE_TIMEOUT:?}"))?
        .map_err(sessionstore_client::Error::from)?
        .into_inner()
        .status();
    let name = status.as_str_name();
    writeln!(std::io::stdout(), "{name}")?;
    Ok(status == ServingStatus::Serving)
}
