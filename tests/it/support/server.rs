//! Real servers: in-process on an ephemeral port per backend, or the real
//! binary as a child process.

use std::net::SocketAddr;
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_server::config::{DatabaseConfig, ServeConfig};
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::PgDatabase;

/// The storage backends every suite test runs against.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    /// `sqlite::memory:`.
    Memory,
    /// A SQLite file in a fresh temporary directory.
    File,
    /// A fresh database on the PostgreSQL server at `SESSIONSTORE_TEST_POSTGRES_URL`.
    Postgres,
}

/// A running server; shut down (gracefully) on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    /// Where `/metrics` is served, when the configuration asked for it.
    pub metrics_addr: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
    /// Dropped after the server: the database outlives its users.
    pg: Option<PgDatabase>,
}

impl TestServer {
    pub async fn start(backend: Backend) -> TestServer {
        let storage = Storage::new(backend).await;
        Self::start_on(storage, |_| {}).await
    }

    /// Starts a server on prepared storage; `tweak` adjusts its configuration.
    pub async fn start_on(storage: Storage, tweak: impl FnOnce(&mut ServeConfig)) -> TestServer {
        let mut server = Self::start_with(storage.url.clone(), storage.dir, tweak).await;
        server.pg = storage.pg;
        server
    }

    pub async fn start_with(
        url: String,
        dir: Option<tempfile::TempDir>,
        tweak: impl FnOnce(&mut ServeConfig),
    ) -> TestServer {
        let mut config = ServeConfig {
            listen: "127.0.0.1:0".into(),
            database: DatabaseConfig {
                database_url: url.clone(),
                max_connections: 8,
            },
            max_request_bytes: 64 * 1024 * 1024,
            progress_interval_ms: 15_000,
            recheck_interval_ms: 5_000,
            max_idle_age: None,
            sweep_interval_ms: 1_000,
            shutdown_grace: Duration::from_secs(10),
            auth_tokens: None,
            insecure_no_auth: false,
            cors_allowed_origins: Vec::new(),
            search: Default::default(),
            sqlite_wal_writes: Default::default(),
            append_writers: None,
            append_one_trip: Default::default(),
            worker_threads: None,
            tls: Default::default(),
            limits: Default::default(),
            telemetry: Default::default(),
        };
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let metrics = match &config.telemetry.metrics_listen {
            Some(address) => Some(
                tokio::net::TcpListener::bind(address)
                    .await
                    .expect("bind metrics"),
            ),
            None => None,
        };
        let metrics_addr = metrics.as_ref().map(|l| l.local_addr().expect("addr"));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(sessionstore_server::server::serve_with_metrics(
            config,
            listener,
            metrics,
            async {
                let _ = rx.await;
            },
        ));
        TestServer {
            addr,
            metrics_addr,
            shutdown: Some(tx),
            task: Some(task),
            _dir: dir,
            pg: None,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A connected client. Connecting retries until the listener accepts,
    /// which it does as soon as `start` returns.
    pub async fn client(&self) -> SessionStoreClient<Channel> {
        connect(&self.endpoint()).await
    }

    /// Shuts down gracefully and waits for the server to finish.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let result = match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        };
        drop(self.pg.take());
        result
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Where a test server keeps its data. Several servers may share one
/// (PostgreSQL replicas); the storage is removed when dropped.
pub struct Storage {
    pub url: String,
    dir: Option<tempfile::TempDir>,
    pg: Option<PgDatabase>,
}

impl Storage {
    pub async fn new(backend: Backend) -> Storage {
        match backend {
            Backend::Memory => Storage {
                url: "sqlite::memory:".to_owned(),
                dir: None,
                pg: None,
            },
            Backend::File => {
                let dir = tempfile::tempdir().expect("tempdir");
                Storage {
                    url: format!("sqlite://{}/sessions.db", dir.path().display()),
                    dir: Some(dir),
                    pg: None,
                }
            }
            Backend::Postgres => {
                let pg = PgDatabase::create().await;
                Storage {
                    url: pg.url.clone(),
                    dir: None,
                    pg: Some(pg),
                }
            }
        }
    }
}

/// The files under `dir` this process still has open (read from
/// `/proc/self/fd`; empty where there is no `/proc`). A stopped server must
/// have closed its database: a test that copies or restores its files
/// right after relies on it.
pub fn open_files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|path| path.starts_with(dir))
        .collect()
}

pub async fn connect(endpoint: &str) -> SessionStoreClient<Channel> {
    let channel = Channel::from_shared(endpoint.to_owned())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    SessionStoreClient::new(channel)
}

/// Removes what cargo told this test about its own crate from a build
/// command's environment: a build script that reads CARGO_MANIFEST_DIR
/// (ring's does) would see it change between `cargo test` and this build,
/// and each would rebuild half the workspace for the other.
pub fn without_cargo_test_env(command: &mut std::process::Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&name.as_ref())
        {
            command.env_remove(name.as_ref());
        }
    }
}

/// Builds (if needed) the `sessionstore` binary and returns its path.
pub fn sessionstore_binary() -> std::path::PathBuf {
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut cargo = std::process::Command::new(env!("CARGO"));
    without_cargo_test_env(&mut cargo);
    let output = cargo
        .current_dir(workspace)
        .args([
            "build",
            "-p",
            "sessionstore-server",
            "--bin",
            "sessionstore",
            "--message-format=json",
        ])
        .output()
        .expect("run cargo build");
    // cargo's progress (`Compiling …`, `Blocking waiting for file lock`)
    // is kept out of the test output; shown only when the build fails.
    assert!(
        output.status.success(),
        "cargo build of sessionstore failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("cargo output is UTF-8");
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact")
        .filter(|msg| {
            msg["target"]["name"] == "sessionstore"
                && msg["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "bin"))
        })
        .find_map(|msg| msg["executable"].as_str().map(std::path::PathBuf::from))
        .expect("cargo reported no sessionstore executable")
}

// ---------------------------------------------------------------------------
// Message builders

/// A `sessionstore serve` child process: the real binary, ready once it
/// logged `sessionstore serving` with the address it bound. Killed on drop.
pub struct ServerProcess {
    pub child: tokio::process::Child,
    /// The bound port (the one asked for, or the one picked for port 0).
    pub port: u16,
    /// Where its log (stdout) is copied.
    pub log: std::path::PathBuf,
}

impl ServerProcess {
    /// Starts `binary` serving `database_url` on `listen` (`127.0.0.1:0`
    /// for any free port, or `127.0.0.1:PORT` to take a port again after a
    /// restart) with `extra_args`, and waits for its ready line.
    pub async fn start(
        binary: &std::path::Path,
        database_url: &str,
        listen: &str,
        log: std::path::PathBuf,
        extra_args: &[&str],
    ) -> ServerProcess {
        let mut child = tokio::process::Command::new(binary)
            .args(["serve", "--listen", listen, "--database-url", database_url])
            .args(extra_args)
            .env_remove("SESSIONSTORE_AUTH_TOKENS")
            .env("SESSIONSTORE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sessionstore");
        let output = child.stdout.take().expect("piped stdout");
        let (ready_tx, ready_rx) = oneshot::channel();
        tokio::spawn(copy_server_log(output, log.clone(), ready_tx));
        let port = match tokio::time::timeout(Duration::from_secs(30), ready_rx).await {
            Ok(Ok(port)) => port,
            _ => {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("sessionstore never became ready\n--- server log ---\n{text}");
            }
        };
        ServerProcess { child, port, log }
    }

    /// `127.0.0.1:PORT`, to `--listen` on again after a restart.
    pub fn listen_address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A client with short connect and call timeouts (2 s, 10 s): a test
    /// of a killed or restarted binary fails fast instead of hanging.
    pub async fn short_timeout_client(&self) -> SessionStoreClient<Channel> {
        self.client_with_timeouts(Duration::from_secs(2), Duration::from_secs(10))
            .await
    }

    /// A client whose connecting and each call give up after these times.
    pub async fn client_with_timeouts(
        &self,
        connect: Duration,
        call: Duration,
    ) -> SessionStoreClient<Channel> {
        let channel = tonic::transport::Endpoint::from_shared(self.endpoint())
            .expect("endpoint")
            .connect_timeout(connect)
            .timeout(call)
            .connect()
            .await
            .expect("connect to sessionstore");
        SessionStoreClient::new(channel)
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("SIGKILL sessionstore");
    }

    /// SIGTERM (graceful shutdown), and wait for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("sessionstore is running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM {pid} failed");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("sessionstore exits within 30 s of SIGTERM")
            .expect("wait for sessionstore")
    }
}

/// Copies a server's stdout to `path` and sends the port from its
/// `sessionstore serving` line.
async fn copy_server_log(
    output: tokio::process::ChildStdout,
    path: std::path::PathBuf,
    ready: oneshot::Sender<u16>,
) {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let mut file = tokio::fs::File::create(&path).await.expect("log file");
    let mut lines = tokio::io::BufReader::new(output).lines();
    let mut ready = Some(ready);
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = file.write_all(format!("{line}\n").as_bytes()).await;
        let _ = file.flush().await;
        if line.contains("sessionstore serving")
            && let Some((_, rest)) = line.split_once("127.0.0.1:")
            && let Ok(port) = rest
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse::<u16>()
            && let Some(ready) = ready.take()
        {
            let _ = ready.send(port);
        }
    }
}
