//! Test support: a real sessionstore server on an ephemeral port, per backend.

use std::net::SocketAddr;
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_server::config::{DatabaseConfig, ServeConfig};
use tokio::sync::oneshot;
use tonic::transport::Channel;

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

/// The PostgreSQL server tests create their databases on.
pub fn postgres_admin_url() -> String {
    std::env::var("SESSIONSTORE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Whether PostgreSQL tests can run. Without a server they are skipped with
/// a loud message, unless `SESSIONSTORE_REQUIRE_POSTGRES` is set (as
/// `.ci/run` does), in which case they fail.
pub async fn postgres_available(test: &str) -> bool {
    use sqlx::Connection as _;
    let url = postgres_admin_url();
    match sqlx::PgConnection::connect(&url).await {
        Ok(conn) => {
            let _ = conn.close().await;
            true
        }
        Err(error) => {
            if std::env::var_os("SESSIONSTORE_REQUIRE_POSTGRES").is_some() {
                panic!("PostgreSQL is required but unreachable at {url}: {error}");
            }
            eprintln!(
                "\n!!! SKIPPED {test}: no PostgreSQL at {url} ({error}).\n!!! Set SESSIONSTORE_TEST_POSTGRES_URL to run the PostgreSQL tests.\n"
            );
            false
        }
    }
}

/// A database created for one test and dropped after it.
pub struct PgDatabase {
    pub url: String,
    name: String,
}

impl PgDatabase {
    pub async fn create() -> PgDatabase {
        use sqlx::Connection as _;
        let admin = postgres_admin_url();
        let name = format!(
            "sessionstore_test_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut conn = sqlx::PgConnection::connect(&admin).await.expect("postgres");
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .expect("drop stale test database");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let _ = conn.close().await;
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        PgDatabase {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

static NEXT_DB: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside a runtime; do the async cleanup on a thread of its own.
        let done = std::thread::spawn(move || {
            use sqlx::Connection as _;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                    let _ = conn.close().await;
                }
            });
        });
        let _ = done.join();
    }
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

/// Builds (if needed) the `sessionstore` binary and returns its path.
pub fn sessionstore_binary() -> std::path::PathBuf {
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut cargo = std::process::Command::new(env!("CARGO"));
    // What cargo told this test about its own crate is not for the build:
    // a build script that reads CARGO_MANIFEST_DIR (ring's does) would see
    // it change between `cargo test` and this build, and each would rebuild
    // half the workspace for the other.
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
            cargo.env_remove(name.as_ref());
        }
    }
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
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run cargo build");
    assert!(
        output.status.success(),
        "cargo build of sessionstore failed"
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

pub fn text(role: pb::Role, content: &str) -> pb::Message {
    pb::Message {
        role: role.into(),
        content: content.to_owned(),
        ..Default::default()
    }
}

pub fn user(content: &str) -> pb::Message {
    text(pb::Role::User, content)
}

pub fn assistant(content: &str) -> pb::Message {
    text(pb::Role::Assistant, content)
}

pub fn call(
    model: &str,
    prompt_tokens: i64,
    completion_tokens: i64,
    cost: i64,
) -> pb::ProviderCall {
    pb::ProviderCall {
        provider: "openai".into(),
        model: model.into(),
        requested_provider: "auto".into(),
        requested_model: format!("{model}-requested"),
        request_id: format!("gw-{model}-{cost}"),
        prompt_tokens,
        completion_tokens,
        cost_micros_usd: cost,
        ..Default::default()
    }
}

pub async fn create(client: &mut SessionStoreClient<Channel>, id: &str) -> pb::Session {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.to_owned(),
            title: format!("title of {id}"),
            system_prompt: "You are terse.".into(),
            user: "alice".into(),
            ..Default::default()
        })
        .await
        .expect("create session")
        .into_inner()
}

/// A request appending one user message and one assistant response with a
/// provider call.
pub fn exchange_request(
    session_id: &str,
    question: &str,
    answer: &str,
) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: session_id.to_owned(),
        messages: vec![user(question)],
        provider_call: Some(call("gpt-test", 10, 5, 42)),
        response_messages: vec![assistant(answer)],
        ..Default::default()
    }
}

/// A stored message's text content.
pub fn content(message: &pb::StoredMessage) -> &str {
    message.message.as_ref().map_or("", |m| m.content.as_str())
}

/// A WatchSession stream.
pub type Events = tonic::Streaming<pb::SessionEvent>;

/// How long a test waits for a watch stream's next event before failing.
pub const NEXT_EVENT: Duration = Duration::from_secs(20);

/// The next event of a watch stream; panics if it ends, fails or stalls.
pub async fn next_event(stream: &mut Events) -> pb::SessionEvent {
    tokio::time::timeout(NEXT_EVENT, stream.message())
        .await
        .expect("an event within the timeout")
        .expect("a healthy watch stream")
        .expect("the watch stream ended early")
}

/// The next event other than a `progress` keep-alive.
pub async fn next_change(stream: &mut Events) -> pb::SessionEvent {
    loop {
        let event = next_event(stream).await;
        if !matches!(event.event, Some(pb::session_event::Event::Progress(_))) {
            return event;
        }
    }
}

/// Opens a watch of `session_id` after `after_revision`.
pub async fn watch(
    client: &mut SessionStoreClient<Channel>,
    session_id: &str,
    after_revision: i64,
) -> Events {
    client
        .watch_session(pb::WatchSessionRequest {
            session_id: session_id.to_owned(),
            after_revision,
            include_active_deltas: false,
        })
        .await
        .expect("watch session")
        .into_inner()
}

/// The name of an event's kind, for assertions and messages.
pub fn event_kind(event: &pb::SessionEvent) -> &'static str {
    use pb::session_event::Event;
    match &event.event {
        Some(Event::SessionCreated(_)) => "session_created",
        Some(Event::ExchangeAppended(_)) => "exchange_appended",
        Some(Event::SessionUpdated(_)) => "session_updated",
        Some(Event::SessionDeleted(_)) => "session_deleted",
        Some(Event::CaughtUp(_)) => "caught_up",
        Some(Event::Progress(_)) => "progress",
        Some(Event::Delta(_)) => "delta",
        Some(Event::RunDiscarded(_)) => "run_discarded",
        Some(Event::RunBegun(_)) => "run_begun",
        Some(Event::RunEnded(_)) => "run_ended",
        Some(Event::RolledBack(_)) => "rolled_back",
        Some(Event::MessageEdited(_)) => "message_edited",
        Some(Event::MessageRedacted(_)) => "message_redacted",
        Some(Event::StateChanged(_)) => "state_changed",
        None => "none",
    }
}

/// Checks that `event` is the `exchange_appended` of the acknowledged `expected`.
pub fn assert_appended(event: &pb::SessionEvent, expected: &pb::AppendExchangeResponse) {
    use pb::session_event::Event;
    assert_eq!(event.revision, expected.revision, "revision of {event:?}");
    assert!(event.time.is_some(), "event without time: {event:?}");
    let Some(Event::ExchangeAppended(appended)) = &event.event else {
        panic!(
            "expected exchange_appended, got {}: {event:?}",
            event_kind(event)
        );
    };
    assert_eq!(
        appended.messages, expected.messages,
        "revision {}",
        event.revision
    );
    assert_eq!(appended.provider_call, expected.provider_call);
    assert_eq!(appended.next_sequence, expected.next_sequence);
}

/// Appends one user message and one assistant response with a provider call.
pub async fn exchange(
    client: &mut SessionStoreClient<Channel>,
    session_id: &str,
    question: &str,
    answer: &str,
) -> pb::AppendExchangeResponse {
    client
        .append_exchange(exchange_request(session_id, question, answer))
        .await
        .expect("append exchange")
        .into_inner()
}

/// Every stored message of a session, following page tokens.
pub async fn all_messages(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
) -> Vec<pb::StoredMessage> {
    messages_in_pages(client, id, 1000).await
}

/// Every stored message of a session, `page_size` at a time (small pages
/// for large messages: a reply stays under the client's decode limit).
pub async fn messages_in_pages(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    page_size: i32,
) -> Vec<pb::StoredMessage> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_messages(pb::ListMessagesRequest {
                session_id: id.to_owned(),
                page_size,
                page_token,
                ..Default::default()
            })
            .await
            .expect("list messages")
            .into_inner();
        out.extend(page.messages);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

/// Exports a session's history as plain messages.
pub async fn export(
    client: &mut SessionStoreClient<Channel>,
    request: pb::ExportHistoryRequest,
) -> Vec<pb::Message> {
    let mut stream = client
        .export_history(request)
        .await
        .expect("export")
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await.expect("export chunk") {
        out.extend(chunk.messages);
    }
    out
}

/// The ErrorInfo reason and BadRequest field of a status, if present.
pub fn error_details(status: &tonic::Status) -> (Option<String>, Option<String>) {
    use tonic_types::StatusExt as _;
    let details = status.get_error_details();
    let reason = details.error_info().map(|i| i.reason.clone());
    let field = details
        .bad_request()
        .and_then(|b| b.field_violations.first().map(|v| v.field.clone()));
    (reason, field)
}

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

/// The session, which must exist.
pub async fn get(client: &mut SessionStoreClient<Channel>, id: &str) -> pb::Session {
    client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
        })
        .await
        .expect("get session")
        .into_inner()
}

/// Sets a session's title (one revision).
pub async fn rename(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    title: &str,
) -> pb::Session {
    client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                title: title.to_owned(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["title".into()],
            }),
        })
        .await
        .expect("update session")
        .into_inner()
}

/// Terminates every LISTEN connection to `database`; returns how many.
pub async fn kill_listeners(conn: &mut sqlx::PgConnection, database: &str) -> usize {
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .bind(database)
    .fetch_all(conn)
    .await
    .expect("terminate LISTEN backends");
    killed.into_iter().filter(|k| *k).count()
}

// ---------------------------------------------------------------------------
// Bearer tokens

/// One `--auth-tokens` file line: `TENANT SHA256_HEX` of `token`.
pub fn token_line(tenant: &str, token: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{tenant} {hex}\n")
}

/// A request carrying `authorization: Bearer TOKEN`.
pub fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}").parse().expect("header value");
    request.metadata_mut().insert("authorization", value);
    request
}

// ---------------------------------------------------------------------------
// The real binary as a child process

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
