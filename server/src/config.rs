//! The server's configuration: `serve`'s flags and their `SESSIONSTORE_*`
//! environment twins (the rest of the command line is in `cli/`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

pub use crate::store::DEFAULT_DATABASE_URL;

/// Where the data lives.
#[derive(Clone, Debug, Args)]
pub struct DatabaseConfig {
    /// Database URL: `sqlite://PATH` (created if missing), `sqlite::memory:`,
    /// or `postgres://USER@HOST:PORT/DB` (several replicas may share one).
    #[arg(
        long,
        env = "SESSIONSTORE_DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL
    )]
    pub database_url: String,

    /// PostgreSQL connections per replica (plus a quarter as many, at least
    /// one, for exports' and replays' pages, one for LISTEN and one that follows the primary).
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

    /// Delete sessions with no change for this long (e.g. `30d`, `12h`,
    /// `90m`, `45s`). Unset: sessions are kept until deleted.
    #[arg(long, env = "SESSIONSTORE_MAX_IDLE_AGE", value_parser = parse_age)]
    pub max_idle_age: Option<Duration>,

    /// Milliseconds between background sweeps (expired run leases, idle
    /// sessions, old tombstones).
    #[arg(long, env = "SESSIONSTORE_SWEEP_INTERVAL_MS", default_value_t = 1_000)]
    pub sweep_interval_ms: u64,

    /// How long a shutdown (SIGTERM, SIGINT) may take: in-flight calls
    /// finish and watch streams end within it, and the process exits at
    /// its end even if some client never reads again (e.g. `10s`).
    #[arg(long, env = "SESSIONSTORE_SHUTDOWN_GRACE", value_parser = parse_age, default_value = "10s")]
    pub shutdown_grace: Duration,

    /// Bearer tokens: a file of `TENANT SHA256_HEX` lines (the hex SHA-256
    /// of each token). Reloaded when it changes. Without it, calls are
    /// unauthenticated and belong to the tenant `default`.
    #[arg(long, env = "SESSIONSTORE_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,

    /// Serve without authentication on a non-loopback address (refused
    /// otherwise when no --auth-tokens is given).
    #[arg(long, env = "SESSIONSTORE_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,

    /// Origins whose pages may call the service from a browser (gRPC-Web),
    /// comma-separated, e.g. `https://chat.example.com`. Default: none, so
    /// browsers refuse pages from other origins. `*` (any origin) only
    /// together with --auth-tokens.
    #[arg(
        long,
        env = "SESSIONSTORE_CORS_ALLOWED_ORIGINS",
        value_delimiter = ',',
        num_args = 1..
    )]
    pub cors_allowed_origins: Vec<String>,

    /// Full-text search (SearchMessages). `off`: no search index is kept,
    /// so appends skip its work, and SearchMessages fails
    /// FAILED_PRECONDITION (SEARCH_DISABLED). Back `on`, the index is built
    /// again from the stored messages in the background. Every replica of
    /// one database needs the same setting.
    #[arg(long, env = "SESSIONSTORE_SEARCH", value_enum, default_value_t = SearchMode::On)]
    pub search: SearchMode,

    /// How a SQLite file database's appends and search index write the
    /// WAL. `gathered`: a transaction's frames in a few large writes (more
    /// appends per second; used only with the SQLite release it was tested
    /// with, else `direct` and a log line says so). `direct`: each frame as
    /// SQLite writes it. Both are equally durable.
    #[arg(
        long,
        env = "SESSIONSTORE_SQLITE_WAL_WRITES",
        value_enum,
        default_value_t = WalWritesMode::Gathered
    )]
    pub sqlite_wal_writes: WalWritesMode,

    /// PostgreSQL: batch writers committing appends side by side on this
    /// replica, each on a connection of its own taken from
    /// `--max-connections` (at most half of it). A session's appends
    /// always go to the same writer. Unset: one per core, at most 4.
    #[arg(long, env = "SESSIONSTORE_APPEND_WRITERS", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub append_writers: Option<u32>,

    /// PostgreSQL: `on`, an append batch whose sessions its writer kept
    /// from its last batch is one statement outside any transaction,
    /// which commits as it succeeds and writes nothing if one of them
    /// changed elsewhere: one round trip per batch, and its commit hints
    /// sent after the answer from a task of their own (but a run's close,
    /// whose hint goes before). `off`: every batch in a transaction,
    /// `COMMIT` in a round trip of its own with the hints.
    #[arg(
        long,
        env = "SESSIONSTORE_APPEND_ONE_TRIP",
        value_enum,
        default_value_t = Switch::On
    )]
    pub append_one_trip: Switch,

    /// Threads that run the gRPC calls (the async runtime's workers).
    /// Default: one per core, one fewer (at least one) with a SQLite file
    /// database, whose appends are written on a thread of their own.
    #[arg(long, env = "SESSIONSTORE_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: Option<u16>,

    #[command(flatten)]
    pub tls: TlsConfig,

    #[command(flatten)]
    pub limits: LimitsConfig,

    #[command(flatten)]
    pub telemetry: TelemetryConfig,
}

/// TLS for the gRPC port.
#[derive(Clone, Debug, Default, Args)]
pub struct TlsConfig {
    /// PEM certificate chain to serve TLS with (needs --tls-key).
    #[arg(long, env = "SESSIONSTORE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "SESSIONSTORE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificate(s): clients must present a certificate signed by
    /// one of them (mutual TLS).
    #[arg(long, env = "SESSIONSTORE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

/// What one request, one tenant and one stream may use. Each refusal is
/// RESOURCE_EXHAUSTED naming the flag.
#[derive(Clone, Debug, Args)]
pub struct LimitsConfig {
    /// Most new messages one AppendExchange may carry (messages and
    /// response_messages; a full_history or initial_history is a whole
    /// conversation, bounded by --max-request-bytes instead).
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_MESSAGES_PER_EXCHANGE",
        default_value_t = 1000
    )]
    pub max_messages_per_exchange: usize,

    /// Largest single message in bytes (its text, blocks, tool calls and
    /// metadata, as encoded).
    #[arg(long, env = "SESSIONSTORE_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_message_bytes: usize,

    /// Most entries in one metadata map (of a session or of a message).
    #[arg(long, env = "SESSIONSTORE_MAX_METADATA_ENTRIES", default_value_t = 64)]
    pub max_metadata_entries: usize,

    /// Largest page a list answers; larger `page_size` requests are served
    /// this many (AIP-158).
    #[arg(long, env = "SESSIONSTORE_MAX_PAGE_SIZE", default_value_t = 1000)]
    pub max_page_size: usize,

    /// Most concurrent WatchSession streams per tenant.
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_WATCH_STREAMS_PER_TENANT",
        default_value_t = 10_000
    )]
    pub max_watch_streams_per_tenant: usize,

    /// Requests per second per tenant, with bursts of as many again
    /// (0: unlimited).
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_REQUESTS_PER_SECOND",
        default_value_t = 0
    )]
    pub max_requests_per_second: u32,

    /// Most request bytes the server holds at once, over all requests: a
    /// request counts its bytes as they arrive, or the whole of a message
    /// once its gRPC length prefix has (up to --max-request-bytes). A
    /// request that would pass it is refused with RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_REQUEST_BYTES_IN_FLIGHT",
        default_value_t = 256 * 1024 * 1024
    )]
    pub max_request_bytes_in_flight: usize,

    /// Most concurrent streams (calls) on one HTTP/2 connection
    /// (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_CONCURRENT_STREAMS_PER_CONNECTION",
        default_value_t = 2048
    )]
    pub max_concurrent_streams_per_connection: u32,

    /// Most bytes all streams (ExportHistory, ExportTranscript, WatchSession
    /// replays) may hold read ahead of their readers, together. A new
    /// stream that cannot get its share (256 KiB) is refused; a running
    /// one reads less far ahead.
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_STREAM_BUFFER_BYTES",
        default_value_t = 512 * 1024 * 1024
    )]
    pub max_stream_buffer_bytes: usize,

    /// Deltas one active run keeps for late joiners before consecutive
    /// text deltas are merged into one (nothing is dropped).
    #[arg(long, env = "SESSIONSTORE_MAX_RUN_DELTAS", default_value_t = 1024)]
    pub max_run_deltas: usize,

    /// Largest partial output of one run, in bytes (at least 16 MiB): a
    /// PublishDelta past it is refused with RESOURCE_EXHAUSTED and the
    /// run's earlier deltas stay available.
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_RUN_OUTPUT_BYTES",
        default_value_t = 64 * 1024 * 1024
    )]
    pub max_run_output_bytes: usize,

    /// Most bytes the partial output of all active runs may hold, together
    /// (shown as sessionstore_active_run_bytes). A PublishDelta past it is
    /// refused with RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "SESSIONSTORE_MAX_ACTIVE_RUN_BYTES",
        default_value_t = 1024 * 1024 * 1024
    )]
    pub max_active_run_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_messages_per_exchange: 1000,
            max_message_bytes: 4 * 1024 * 1024,
            max_metadata_entries: 64,
            max_page_size: 1000,
            max_watch_streams_per_tenant: 10_000,
            max_requests_per_second: 0,
            max_request_bytes_in_flight: 256 * 1024 * 1024,
            max_concurrent_streams_per_connection: 2048,
            max_stream_buffer_bytes: 512 * 1024 * 1024,
            max_run_deltas: 1024,
            max_run_output_bytes: 64 * 1024 * 1024,
            max_active_run_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// Logs, metrics and traces.
#[derive(Clone, Debug, Default, Args)]
pub struct TelemetryConfig {
    /// Serve Prometheus metrics at `GET /metrics` on this HOST:PORT.
    #[arg(long, env = "SESSIONSTORE_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,

    /// Log format: `text` or `json` (one object per line).
    #[arg(long, env = "SESSIONSTORE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Export traces over OTLP/gRPC to this endpoint (e.g.
    /// `http://127.0.0.1:4317`).
    #[arg(long, env = "SESSIONSTORE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Whether the search index is kept (`--search`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SearchMode {
    /// Kept, and SearchMessages answers.
    #[default]
    On,
    /// Not kept; SearchMessages fails SEARCH_DISABLED.
    Off,
}

/// A mechanism switched on or off (`--append-one-trip`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    #[default]
    On,
    Off,
}

/// `--sqlite-wal-writes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WalWritesMode {
    /// Frames gathered into a few large writes.
    #[default]
    Gathered,
    /// Each frame written as SQLite writes it.
    Direct,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses an age: a whole number followed by `s`, `m`, `h` or `d`.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit: s, m, h or d (e.g. 30d)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}: use s, m, h or d"
            ));
        }
    };
    if number == 0 {
        return Err("the age must be positive".to_owned());
    }
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

impl ServeConfig {
    pub fn progress_interval(&self) -> Duration {
        Duration::from_millis(self.progress_interval_ms.max(1))
    }

    pub fn recheck_interval(&self) -> Duration {
        Duration::from_millis(self.recheck_interval_ms.max(10))
    }

    /// The async runtime's worker threads on a machine of `cores`: as
    /// asked, or by default one per core, one fewer with a SQLite file
    /// database (BENCHMARKS.md: on two cores, one worker beside the append
    /// thread spent 7–8% less CPU per append than two, at the same rate).
    pub fn worker_threads(&self, cores: usize) -> usize {
        match self.worker_threads {
            Some(asked) => usize::from(asked),
            None if crate::store::appends_on_own_thread(&self.database.database_url) => {
                cores.saturating_sub(1).max(1)
            }
            None => cores.max(1),
        }
    }

    pub fn sweep_interval(&self) -> Duration {
        Duration::from_millis(self.sweep_interval_ms.max(10))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_age;
    use std::time::Duration;

    #[test]
    fn ages_parse() {
        assert_eq!(parse_age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_age("90m"), Ok(Duration::from_secs(90 * 60)));
        assert_eq!(parse_age("2s"), Ok(Duration::from_secs(2)));
        for bad in ["", "30", "d", "0s", "5w", "-1d", "1.5h"] {
            assert!(parse_age(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
