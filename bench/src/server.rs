//! The system under test: the real `sessionstore` binary as a child process,
//! on a database the bench made for the run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use sessionstore_client::SessionStoreClient;
use sqlx::Connection as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::{Channel, Endpoint};

/// Finds the `sessionstore` binary: `--server-bin`, else the one beside this
/// bench, built first (same profile) when the bench was started by cargo.
pub fn binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_owned());
    }
    let here = std::env::current_exe().context("locate the bench binary")?;
    let dir = here.parent().context("the bench binary has no directory")?;
    let sibling = dir.join("sessionstore");
    if let Ok(cargo) = std::env::var("CARGO") {
        // `cargo run -p sessionstore-bench` builds only the bench: make sure
        // the server beside it is current.
        let mut build = std::process::Command::new(cargo);
        build.args([
            "build",
            "-p",
            "sessionstore-server",
            "--bin",
            "sessionstore",
        ]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build.status().context("run cargo build")?;
        if !status.success() {
            bail!("cargo build of the sessionstore binary failed");
        }
    }
    if !sibling.exists() {
        bail!(
            "{} not found: build it (cargo build --release -p sessionstore-server) or pass --server-bin",
            sibling.display()
        );
    }
    Ok(sibling)
}

/// Set by `--keep`: databases are left where they are for inspection.
static KEEP: AtomicBool = AtomicBool::new(false);

/// Keeps every database from now on instead of removing it.
/// The CPU time, user and system, of the process whose `/proc` stat file
/// is `stat` (`/proc/self/stat`: this one), in units of 10 ms (`USER_HZ`).
pub fn cpu_time_of(stat: &str) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(stat)?;
    // The fields after the command name, which is in parentheses and
    // may hold spaces: state, ..., utime (11th), stime (12th).
    let (_, rest) = stat.rsplit_once(')').context("no command name")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<u64> {
        Ok(fields.get(i).context("short /proc stat")?.parse::<u64>()?)
    };
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

pub fn keep_databases() {
    KEEP.store(true, Ordering::Relaxed);
}

/// A database made for one run, removed when the run ends (unless
/// [`keep_databases`] was called).
pub enum Database {
    Sqlite { dir: PathBuf },
    Postgres { admin_url: String, name: String },
}

impl Database {
    pub fn sqlite(label: &str) -> anyhow::Result<Database> {
        let dir =
            std::env::temp_dir().join(format!("sessionstore-bench-{}-{label}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(Database::Sqlite { dir })
    }

    /// Creates a fresh database `sessionstore_bench_<pid>_<label>`.
    pub async fn postgres(admin_url: &str, label: &str) -> anyhow::Result<Database> {
        let name = format!("sessionstore_bench_{}_{label}", std::process::id());
        let mut admin = sqlx::PgConnection::connect(admin_url)
            .await
            .with_context(|| format!("connect to {admin_url}"))?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
            .execute(&mut admin)
            .await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await?;
        Ok(Database::Postgres {
            admin_url: admin_url.to_owned(),
            name,
        })
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Database::Postgres { .. })
    }

    pub fn backend(&self) -> &'static str {
        if self.is_postgres() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    /// The URL the server and the raw ceilings connect to.
    pub fn url(&self) -> String {
        match self {
            Database::Sqlite { dir } => format!("sqlite://{}", dir.join("bench.db").display()),
            Database::Postgres { admin_url, name } => replace_database(admin_url, name),
        }
    }

    /// Refreshes the planner's statistics after a pre-fill.
    pub async fn analyze(&self) -> anyhow::Result<()> {
        let url = self.url();
        if self.is_postgres() {
            let mut conn = sqlx::PgConnection::connect(&url).await?;
            sqlx::query("ANALYZE").execute(&mut conn).await?;
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&url).await?;
            sqlx::query("ANALYZE").execute(&mut conn).await?;
        }
        Ok(())
    }

    pub async fn remove(self) -> anyhow::Result<()> {
        if KEEP.load(Ordering::Relaxed) {
            eprintln!("   kept {}", self.url());
            return Ok(());
        }
        match self {
            Database::Sqlite { dir } => std::fs::remove_dir_all(dir)?,
            Database::Postgres { admin_url, name } => {
                let mut admin = sqlx::PgConnection::connect(&admin_url).await?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await?;
            }
        }
        Ok(())
    }
}

/// `postgres://user@host:port/olddb?x` with `olddb` replaced by `name`.
fn replace_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", &base[..path_start]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// A running `sessionstore serve`. Killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
    /// Started with `--search off`.
    pub search_off: bool,
}

impl Server {
    /// Starts the binary on `database_url`, on a free port, and waits until
    /// it logs that it is serving.
    pub async fn start(
        binary: &Path,
        database_url: &str,
        extra: &[&str],
    ) -> anyhow::Result<Server> {
        let mut child = Command::new(binary)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                database_url,
            ])
            .args(extra)
            .env_remove("SESSIONSTORE_AUTH_TOKENS")
            .env(
                "SESSIONSTORE_LOG",
                std::env::var("SESSIONSTORE_BENCH_SERVER_LOG_FILTER")
                    .unwrap_or_else(|_| "warn,sessionstore_server::server=info".to_owned()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", binary.display()))?;
        let stdout = child.stdout.take().context("piped stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let port = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if line.contains("sessionstore serving")
                    && let Some((_, rest)) = line.split_once("127.0.0.1:")
                {
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    return Ok::<_, anyhow::Error>(digits.parse::<u16>()?);
                }
            }
            bail!("sessionstore exited before serving")
        })
        .await
        .context("sessionstore did not start within 60 s")??;
        // Keep draining its log so it never blocks on a full pipe; with
        // SESSIONSTORE_BENCH_SERVER_LOG=FILE, into that file (its filter
        // SESSIONSTORE_BENCH_SERVER_LOG_FILTER, default warnings and the
        // server's start).
        let mut keep = match std::env::var_os("SESSIONSTORE_BENCH_SERVER_LOG") {
            Some(path) => Some(
                tokio::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .await
                    .with_context(|| format!("open {}", path.to_string_lossy()))?,
            ),
            None => None,
        };
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(file) = keep.as_mut() {
                    let _ = file.write_all(format!("{line}\n").as_bytes()).await;
                }
            }
        });
        let search_off = extra.windows(2).any(|pair| pair == ["--search", "off"]);
        Ok(Server {
            child,
            port,
            search_off,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One new HTTP/2 connection.
    pub async fn connect(&self) -> anyhow::Result<SessionStoreClient<Channel>> {
        let channel = Endpoint::from_shared(self.endpoint())?
            .tcp_nodelay(true)
            .connect()
            .await?;
        Ok(SessionStoreClient::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024))
    }

    /// The server's resident memory, from `/proc` (Linux only).
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        let pid = self.child.id().context("the server has exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .context("no VmRSS line")?
            .parse::<u64>()?;
        Ok(kib * 1024)
    }

    /// The CPU time the server has used so far, user and system, from
    /// `/proc` (Linux only; `/proc` counts in units of 10 ms, `USER_HZ`).
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        let pid = self.child.id().context("the server has exited")?;
        cpu_time_of(&format!("/proc/{pid}/stat"))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            replace_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            replace_database("postgres://u:p@h/db?sslmode=disable", "x"),
            "postgres://u:p@h/x?sslmode=disable"
        );
        assert_eq!(replace_database("postgres://h", "x"), "postgres://h/x");
    }
}
