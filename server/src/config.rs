//! Command line and `SESSIONSTORE_*` environment configuration.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// sessionstore: a gRPC service that stores LLM chat sessions.
#[derive(Debug, Parser)]
#[command(name = "sessionstore", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC server (the default).
    Serve(ServeConfig),
    /// Apply the database migrations and exit.
    Migrate(DatabaseConfig),
}

/// Where the data lives.
#[derive(Clone, Debug, Args)]
pub struct DatabaseConfig {
    /// Database URL: `sqlite://PATH` (created if missing), `sqlite::memory:`,
    /// or `postgres://USER@HOST:PORT/DB` (several replicas may share one).
    #[arg(
        long,
        env = "SESSIONSTORE_DATABASE_URL",
        default_value = "sqlite://data/sessionstore.db"
    )]
    pub database_url: String,

    /// PostgreSQL connections per replica.
    #[arg(
        long,
        env = "SESSIONSTORE_DATABASE_MAX_CONNECTIONS",
        default_value_t = 16
    )]
    pub max_connections: u32,
}

/// How the server runs.
#[derive(Clone, Debug, Args)]
pub struct ServeConfig {
    /// Address to listen on, HOST:PORT.
    #[arg(long, env = "SESSIONSTORE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: String,

    #[command(flatten)]
    pub database: DatabaseConfig,

    /// Largest accepted request message, in bytes.
    #[arg(long, env = "SESSIONSTORE_MAX_REQUEST_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_request_bytes: usize,

    /// Milliseconds of silence after which a watch stream gets a progress event.
    #[arg(
        long,
        env = "SESSIONSTORE_PROGRESS_INTERVAL_MS",
        default_value_t = 15_000
    )]
    pub progress_interval_ms: u64,

    /// Milliseconds between a PostgreSQL replica's safety re-reads of watched
    /// sessions' heads (commit hints normally make this unnecessary).
    #[arg(
        long,
        env = "SESSIONSTORE_RECHECK_INTERVAL_MS",
        default_value_t = 5_000
    )]
    pub recheck_interval_ms: u64,
}

impl ServeConfig {
    /// The serve configuration from the environment and defaults alone.
    pub fn from_env() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            serve: ServeConfig,
        }
        Only::parse_from(["sessionstore"]).serve
    }

    pub fn progress_interval(&self) -> Duration {
        Duration::from_millis(self.progress_interval_ms.max(1))
    }

    pub fn recheck_interval(&self) -> Duration {
        Duration::from_millis(self.recheck_interval_ms.max(10))
    }
}
