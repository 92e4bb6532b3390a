//! The `sessionstore` binary: configuration → tracing → store → serve.

use std::process::ExitCode;

use clap::Parser as _;
use sessionstore_server::cli::{Cli, Command};
use sessionstore_server::config::{ServeConfig, TelemetryConfig};
use sessionstore_server::store::{MigrateMode, OpenError};
use sessionstore_server::{cli, server, telemetry};

/// mimalloc rather than glibc's malloc: a run of appends allocates and
/// frees many small buffers on several threads (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let command = Cli::parse().into_command();
    // A malformed database URL (an unsupported `target_session_attrs`, a
    // bad host list) is said on stderr before anything starts.
    let database_url = match &command {
        Command::Serve(config) => Some(&config.database.database_url),
        Command::Migrate(args) => Some(&args.database.database_url),
        Command::Replicas(args) => Some(&args.database_url),
        Command::Backup(args) => Some(&args.database_url),
        Command::Restore(args) => Some(&args.database_url),
        _ => None,
    };
    if let Some(url) = database_url
        && let Err(error) = sessionstore_server::store::check_url(url)
    {
        report(&error.to_string());
        return ExitCode::FAILURE;
    }
    let runtime = match &command {
        Command::Serve(config) => {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(config.worker_threads(cores))
                .enable_all()
                .build()
        }
        _ => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            report(&format!("cannot start the async runtime: {error}"));
            return ExitCode::FAILURE;
        }
    };
    let command = match command {
        // A command for people: its output is the point, not logs.
        Command::Sessions(args) => {
            return match runtime.block_on(cli::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    report(&format!("{error:#}"));
                    ExitCode::FAILURE
                }
            };
        }
        Command::Health(args) => {
            return match runtime.block_on(cli::health(args)) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(error) => {
                    report(&format!("{error:#}"));
                    ExitCode::FAILURE
                }
            };
        }
        // `migrate --check` and `replicas` read the database and print
        // what they found: their output is the point, not logs.
        Command::Migrate(args) if args.check => {
            return match runtime.block_on(cli::check_migrations(&args.database.database_url)) {
                Ok(checked) => {
                    if let Some(refusal) = &checked.refusal {
                        report(&refusal.to_string());
                    }
                    ExitCode::from(checked.status.exit_code())
                }
                Err(error) => {
                    report(&format!("{error:#}"));
                    ExitCode::FAILURE
                }
            };
        }
        Command::Replicas(args) => {
            return match runtime.block_on(cli::replicas(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    report(&format!("{error:#}"));
                    ExitCode::FAILURE
                }
            };
        }
        // SQLite files copied on this thread: their output is the point.
        Command::Backup(args) => return exit_with(cli::backup(&args)),
        Command::Restore(args) => return exit_with(cli::restore(&args)),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "sessionstore", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        other => other,
    };
    let telemetry_config = match &command {
        Command::Serve(config) => config.telemetry.clone(),
        _ => TelemetryConfig::default(),
    };
    let telemetry = {
        // The OTLP exporter starts its connection on the runtime.
        let _runtime = runtime.enter();
        match telemetry::init(&telemetry_config) {
            Ok(telemetry) => telemetry,
            Err(error) => {
                report(&format!("{error:#}"));
                return ExitCode::FAILURE;
            }
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Migrate(args) => {
                let mode = if args.finalize {
                    MigrateMode::Finalize
                } else {
                    MigrateMode::Expand
                };
                server::migrate(&args.database.database_url, mode).await
            }
            Command::Serve(config) => run(*config).await,
            // Answered above, before telemetry.
            Command::Sessions(_)
            | Command::Health(_)
            | Command::Replicas(_)
            | Command::Backup(_)
            | Command::Restore(_)
            | Command::Completions { .. } => Ok(()),
        }
    });
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => match refused(&error) {
            // A refusal with a code of its own (the database finalized
            // past this binary, replicas behind a finalize): one line on
            // stderr, for the operator or the orchestrator, and the code.
            Some((code, message)) => {
                tracing::error!("{message}");
                report(&message);
                ExitCode::from(code)
            }
            None => {
                tracing::error!("{error:#}");
                ExitCode::FAILURE
            }
        },
    };
    {
        let _runtime = runtime.enter();
        drop(telemetry);
    }
    // Whatever is left (a connection whose peer stopped reading, a read on
    // a blocking thread) must not hold the exit: the grace period is over.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// An error for the person at the terminal, on stderr: used where no log
/// subscriber exists (before telemetry starts, when it fails to, and for the
/// `sessions` commands, whose output must not mix with logs).
fn report(error: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "sessionstore: {error}");
}

/// 0 for a command that did its work; 1, saying why on stderr, otherwise.
fn exit_with(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            report(&format!("{error:#}"));
            ExitCode::FAILURE
        }
    }
}

/// The exit code and message of an error that has its own code.
fn refused(error: &anyhow::Error) -> Option<(u8, String)> {
    let open = error
        .chain()
        .find_map(|cause| cause.downcast_ref::<OpenError>())?;
    Some((open.exit_code()?, open.to_string()))
}

async fn run(config: ServeConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    server::serve(config, listener, shutdown_signal()).await
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed here, when
/// called, not when the future is first polled: the server says it is
/// serving before it polls this, and a SIGTERM in between must still be a
/// graceful shutdown rather than the default action (death by signal).
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let handlers = signal(SignalKind::interrupt())
            .and_then(|interrupt| Ok((interrupt, signal(SignalKind::terminate())?)));
        async move {
            match handlers {
                Ok((mut interrupt, mut terminate)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = terminate.recv() => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
