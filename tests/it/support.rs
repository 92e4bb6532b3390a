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
}

/// A running server; shut down (gracefully) on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

impl TestServer {
    pub async fn start(backend: Backend) -> TestServer {
        let (url, dir) = match backend {
            Backend::Memory => ("sqlite::memory:".to_owned(), None),
            Backend::File => {
                let dir = tempfile::tempdir().expect("tempdir");
                let url = format!("sqlite://{}/sessions.db", dir.path().display());
                (url, Some(dir))
            }
        };
        Self::start_with(url, dir, |_| {}).await
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
            },
            max_request_bytes: 64 * 1024 * 1024,
            progress_interval_ms: 15_000,
        };
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(sessionstore_server::server::serve(
            config,
            listener,
            async {
                let _ = rx.await;
            },
        ));
        TestServer {
            addr,
            shutdown: Some(tx),
            task: Some(task),
            _dir: dir,
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
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
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

/// Appends one user message and one assistant response with a provider call.
pub async fn exchange(
    client: &mut SessionStoreClient<Channel>,
    session_id: &str,
    question: &str,
    answer: &str,
) -> pb::AppendExchangeResponse {
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session_id.to_owned(),
            messages: vec![user(question)],
            provider_call: Some(call("gpt-test", 10, 5, 42)),
            response_messages: vec![assistant(answer)],
            ..Default::default()
        })
        .await
        .expect("append exchange")
        .into_inner()
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
    };
}
