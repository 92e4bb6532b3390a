//! The `sessionstore` binary: configuration → tracing → store → serve.

use std::process::ExitCode;

use clap::Parser as _;
use sessionstore_server::config::{Cli, Command, LogFormat, ServeConfig};
use sessionstore_server::{server, telemetry};

fn main() -> ExitCode {
    let command = Cli::parse()
        .command
        .unwrap_or_else(|| Command::Serve(Box::new(ServeConfig::from_env())));
    let log_format = match &command {
        Command::Serve(config) => config.telemetry.log_format,
        Command::Migrate(_) => LogFormat::Text,
    };
    telemetry::init(log_format);

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Migrate(database) => server::migrate(&database.database_url).await,
            Command::Serve(config) => run(*config).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: ServeConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    server::serve(config, listener, shutdown_signal()).await
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
