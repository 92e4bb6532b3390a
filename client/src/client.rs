//! [`Client`], the ergonomic face of the generated `SessionStoreClient`:
//! connection settings, a bearer token on every call, typed errors,
//! retries where they are safe, and streams that page and resume by
//! themselves.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::auth::{BearerAuth, RawClient};
use crate::error::{Error, Result};
use crate::requests::{Exchange, ExportHistory, ListSessions};
use crate::retry::{RetryPolicy, retrying};
use crate::v1;
use crate::v1::session_store_client::SessionStoreClient;
use crate::watch::SessionEvents;

/// A stream of results, boxed so it can be stored and sent between tasks.
pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T>> + Send + 'static>>;

/// Settings shared by every clone of a [`Client`].
#[derive(Debug)]
struct Settings {
    url: String,
    request_timeout: Option<Duration>,
    retry: RetryPolicy,
    watch_retry: RetryPolicy,
    watch_idle_timeout: Option<Duration>,
}

/// How to reach a sessionstore server. Start with [`Client::builder`].
///
/// Defaults: connect timeout 10 s, per-request timeout 30 s, no token,
/// [`RetryPolicy::default`] for appends and reads, 30 reconnection attempts
/// in a row for watches, and a watch that reconnects after 60 s without
/// any event (the server sends `progress` every 15 s on an idle stream).
///
/// ```no_run
/// use std::time::Duration;
/// use sessionstore_client::Client;
///
/// # async fn demo() -> Result<(), sessionstore_client::Error> {
/// let client = Client::builder("http://127.0.0.1:50051")
///     .bearer_token(std::env::var("SESSIONSTORE_TOKEN").unwrap_or_default())
///     .connect_timeout(Duration::from_secs(3))
///     .request_timeout(Duration::from_secs(10))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until connect() is called"]
pub struct ClientBuilder {
    url: String,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    bearer_token: Option<String>,
    retry: RetryPolicy,
    watch_retry: RetryPolicy,
    watch_idle_timeout: Option<Duration>,
    #[cfg(feature = "tls")]
    tls: TlsSettings,
}

#[cfg(feature = "tls")]
#[derive(Clone, Default)]
struct TlsSettings {
    ca_certificates: Vec<Vec<u8>>,
    domain_name: Option<String>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl TlsSettings {
    fn is_set(&self) -> bool {
        !self.ca_certificates.is_empty() || self.domain_name.is_some() || self.identity.is_some()
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("ClientBuilder");
        debug
            .field("url", &self.url)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "<redacted>"),
            )
            .field("retry", &self.retry)
            .field("watch_retry", &self.watch_retry)
            .field("watch_idle_timeout", &self.watch_idle_timeout);
        #[cfg(feature = "tls")]
        debug
            .field("tls_ca_certificates", &self.tls.ca_certificates.len())
            .field("tls_domain_name", &self.tls.domain_name)
            .field("tls_client_identity", &self.tls.identity.is_some());
        debug.finish()
    }
}

impl ClientBuilder {
    /// Settings for the server at `url`: `http://HOST:PORT`, or
    /// `https://HOST:PORT` for TLS (the `tls` feature, on by default).
    pub fn new(url: impl Into<String>) -> Self {
        ClientBuilder {
            url: url.into(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Some(Duration::from_secs(30)),
            bearer_token: None,
            retry: RetryPolicy::default(),
            watch_retry: RetryPolicy::default().max_attempts(30),
            watch_idle_timeout: Some(Duration::from_secs(60)),
            #[cfg(feature = "tls")]
            tls: TlsSettings::default(),
        }
    }

    /// How long establishing a connection may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one attempt of a unary call may take (sent to the server as
    /// the gRPC deadline), and how long opening a stream may take. Streams
    /// themselves have no deadline.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// No per-request timeout.
    pub fn no_request_timeout(mut self) -> Self {
        self.request_timeout = None;
        self
    }

    /// Sends `authorization: Bearer TOKEN` on every call.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(token.into());
        self
    }

    /// Retries for `append_exchange` and for reads (get, list pages, the
    /// start of an export).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Reconnection for watch streams: its
    /// [`max_attempts`](RetryPolicy::max_attempts) bounds the failed
    /// reconnections in a row; any event received resets the count.
    pub fn watch_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.watch_retry = policy;
        self
    }

    /// A watch that receives nothing for this long treats its connection
    /// as dead and resumes on a new one (`None`: wait forever). Keep it
    /// above the server's `--progress-interval-ms` (15 s by default).
    pub fn watch_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.watch_idle_timeout = timeout;
        self
    }

    /// Trusts the CA certificate(s) in `pem` for the server's certificate
    /// (call again to add more). Needed for `https://` unless the server's
    /// certificate chains to a root the build enables.
    ///
    /// ```no_run
    /// use sessionstore_client::Client;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = Client::builder("https://sessions.internal:50051")
    ///     .tls_ca_certificate(std::fs::read("ca.pem")?)
    ///     // Mutual TLS, if the server has --tls-client-ca:
    ///     .tls_client_identity(std::fs::read("agent.pem")?, std::fs::read("agent.key")?)
    ///     .bearer_token("…")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_certificates.push(pem.into());
        self
    }

    /// The name to verify the server's certificate against, when it is not
    /// the URL's host.
    #[cfg(feature = "tls")]
    pub fn tls_domain_name(mut self, name: impl Into<String>) -> Self {
        self.tls.domain_name = Some(name.into());
        self
    }

    /// A client certificate chain and its private key (both PEM), for a
    /// server that requires client certificates (mutual TLS).
    #[cfg(feature = "tls")]
    pub fn tls_client_identity(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    fn endpoint(&self) -> Result<Endpoint> {
        let endpoint = Endpoint::from_shared(self.url.clone())?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        let https = endpoint.uri().scheme_str() == Some("https");
        #[cfg(feature = "tls")]
        {
            if https || self.tls.is_set() {
                use tonic::transport::{Certificate, ClientTlsConfig, Identity};
                let mut tls = ClientTlsConfig::new();
                if self.tls.ca_certificates.is_empty() {
                    tls = tls.with_enabled_roots();
                }
                for pem in &self.tls.ca_certificates {
                    tls = tls.ca_certificate(Certificate::from_pem(pem));
                }
                if let Some(name) = &self.tls.domain_name {
                    tls = tls.domain_name(name.clone());
                }
                if let Some((certificate, key)) = &self.tls.identity {
                    tls = tls.identity(Identity::from_pem(certificate, key));
                }
                return Ok(endpoint.tls_config(tls)?);
            }
        }
        if https {
            return Err(Error::InvalidConfig(
                "https:// URLs need the sessionstore-client `tls` feature".to_owned(),
            ));
        }
        Ok(endpoint)
    }

    fn settings(&self) -> Settings {
        Settings {
            url: self.url.clone(),
            request_timeout: self.request_timeout,
            retry: self.retry,
            watch_retry: self.watch_retry,
            watch_idle_timeout: self.watch_idle_timeout,
        }
    }

    fn auth(&self) -> Result<BearerAuth> {
        match &self.bearer_token {
            Some(token) => BearerAuth::new(token),
            None => Ok(BearerAuth::default()),
        }
    }

    /// Connects now; fails if the server cannot be reached within the
    /// connect timeout. The connection is re-established by itself after a
    /// failure.
    pub async fn connect(self) -> Result<Client> {
        let auth = self.auth()?;
        let channel = self.endpoint()?.connect().await?;
        Ok(Client::new(channel, auth, self.settings()))
    }

    /// A client that connects on its first call (so building it never
    /// fails for lack of a server).
    pub fn connect_lazy(self) -> Result<Client> {
        let auth = self.auth()?;
        let channel = self.endpoint()?.connect_lazy();
        Ok(Client::new(channel, auth, self.settings()))
    }

    /// A client over a channel you built yourself (custom connector, load
    /// balancing); the builder's URL, connect timeout and TLS settings are
    /// ignored, the rest applies.
    pub fn with_channel(self, channel: Channel) -> Result<Client> {
        let auth = self.auth()?;
        Ok(Client::new(channel, auth, self.settings()))
    }
}

/// A sessionstore client: typed calls, typed [`Error`]s, safe retries, and
/// streams that page and resume by themselves.
///
/// Cloning is cheap (the clones share one connection), so clone it into
/// every task that needs it.
///
/// ```no_run
/// use sessionstore_client::{Client, Exchange, NewSession};
/// use sessionstore_client::v1::{Message, ProviderCall};
///
/// # async fn demo() -> Result<(), sessionstore_client::Error> {
/// let client = Client::connect("http://127.0.0.1:50051").await?;
/// let session = client
///     .create_session(NewSession::new().title("demo").system_prompt("Be brief."))
///     .await?;
/// let stored = client
///     .append_exchange(
///         &Exchange::new(&session.id)
///             .message(Message::user("Hi!"))
///             .provider_call(ProviderCall::new("openai", "gpt-4o").with_tokens(9, 2))
///             .response(Message::assistant("Hello.")),
///     )
///     .await?;
/// assert_eq!(stored.next_sequence, 2);
/// let history = client.export_history(&session.id).await?;
/// assert_eq!(history.len(), 2);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    raw: RawClient,
    channel: Channel,
    settings: Arc<Settings>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.settings.url)
            .field("request_timeout", &self.settings.request_timeout)
            .finish_non_exhaustive()
    }
}

/// Runs `call`, giving up after `timeout` (if any) with
/// [`Error::DeadlineExceeded`]'s status.
async fn within<T>(
    timeout: Option<Duration>,
    what: &str,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match timeout {
        None => call.await,
        Some(limit) => match tokio::time::timeout(limit, call).await {
            Ok(result) => result,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{what} took longer than {limit:?}"
            ))),
        },
    }
}

impl Client {
    fn new(channel: Channel, auth: BearerAuth, settings: Settings) -> Client {
        Client {
            channel: channel.clone(),
            raw: SessionStoreClient::with_interceptor(channel, auth)
                // Exports and watch events may be large; the server bounds them.
                .max_decoding_message_size(usize::MAX),
            settings: Arc::new(settings),
        }
    }

    /// Connects to `url` (`http://HOST:PORT`) with the default settings.
    /// For TLS, a token or other timeouts use [`Client::builder`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), sessionstore_client::Error> {
    /// let client = sessionstore_client::Client::connect("http://127.0.0.1:50051").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: impl Into<String>) -> Result<Client> {
        ClientBuilder::new(url).connect().await
    }

    /// Settings for the server at `url`; finish with
    /// [`ClientBuilder::connect`].
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url)
    }

    /// The generated client, sharing this client's connection and bearer
    /// token, for every RPC without a typed method here (update, state,
    /// runs, search, transcripts…). Errors it returns can be turned into
    /// [`Error`] with `Error::from(status)`.
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, Error};
    /// use sessionstore_client::v1::SetStateRequest;
    ///
    /// # async fn demo(client: Client) -> Result<(), Error> {
    /// let entry = client
    ///     .raw()
    ///     .set_state(SetStateRequest {
    ///         session_id: "ses_1".into(),
    ///         key: "cwd".into(),
    ///         value: "/home/agent".into(),
    ///         ..Default::default()
    ///     })
    ///     .await
    ///     .map_err(Error::from)?
    ///     .into_inner();
    /// # Ok(()) }
    /// ```
    pub fn raw(&self) -> RawClient {
        self.raw.clone()
    }

    /// The connection itself (TLS included, no bearer token), for the
    /// server's other services: `grpc.health.v1.Health`, reflection.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Calls one unary RPC (`call` on the generated client), retried under
    /// the client's [`RetryPolicy`] when the RPC is safe to repeat.
    pub(crate) async fn unary<T, R, F, Fut>(
        &self,
        what: &'static str,
        message: T,
        retry: bool,
        call: F,
    ) -> Result<R>
    where
        T: Clone,
        F: Fn(RawClient, Request<T>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let attempt = || {
            let request = self.request(message.clone());
            let timeout = self.settings.request_timeout;
            let call = call(self.raw.clone(), request);
            async move {
                within(timeout, what, call)
                    .await
                    .map(tonic::Response::into_inner)
            }
        };
        if retry {
            retrying(&self.settings.retry, attempt).await
        } else {
            Ok(attempt().await?)
        }
    }

    /// A request carrying the per-request timeout as its gRPC deadline.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(timeout) = self.settings.request_timeout {
            request.set_timeout(timeout);
        }
        request
    }

    /// Creates a session; returns it with its id and revision 1.
    ///
    /// Retried on transient failures only when the request carries a
    /// `request_id` (a retry then returns the session the first call
    /// created): without one, a retry of a create that reached the server
    /// would fail [`Error::AlreadyExists`] (with a chosen id) or make a
    /// second session (without).
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, NewSession};
    ///
    /// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
    /// let session = client.create_session(NewSession::new().title("Trip planning")).await?;
    /// println!("created {}", session.id);
    /// # Ok(()) }
    /// ```
    pub async fn create_session(
        &self,
        session: impl Into<v1::CreateSessionRequest>,
    ) -> Result<v1::Session> {
        let message = session.into();
        let attempt = || {
            let request = self.request(message.clone());
            let mut raw = self.raw.clone();
            let timeout = self.settings.request_timeout;
            async move {
                within(timeout, "CreateSession", raw.create_session(request))
                    .await
                    .map(tonic::Response::into_inner)
            }
        };
        if message.request_id.is_empty() {
            Ok(attempt().await?)
        } else {
            retrying(&self.settings.retry, attempt).await
        }
    }

    /// The session's fields and revision ([`Error::NotFound`] if there is
    /// none). Retried on transient failures.
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, Error};
    ///
    /// # async fn demo(client: Client) -> Result<(), Error> {
    /// match client.get_session("ses_1").await {
    ///     Ok(session) => println!("at revision {}", session.revision),
    ///     Err(Error::NotFound { .. }) => println!("no such session"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn get_session(&self, session_id: impl Into<String>) -> Result<v1::Session> {
        self.get_session_with_state(session_id, Vec::<String>::new())
            .await
    }

    /// The session with the state entries of `scopes` (`""`: the session's
    /// own; else a shared scope such as `app:weather`) in
    /// [`v1::Session::state`], all read in one snapshot: a session and the
    /// state it runs with in one call. Retried on transient failures.
    ///
    /// ```no_run
    /// # async fn demo(client: sessionstore_client::Client) -> Result<(), sessionstore_client::Error> {
    /// let session = client.get_session_with_state("ses_1", ["", "app:weather"]).await?;
    /// for entry in &session.state {
    ///     println!("{}/{} = {}", entry.scope, entry.key, entry.value);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn get_session_with_state(
        &self,
        session_id: impl Into<String>,
        scopes: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<v1::Session> {
        let message = v1::GetSessionRequest {
            session_id: session_id.into(),
            state_scopes: scopes.into_iter().map(Into::into).collect(),
        };
        retrying(&self.settings.retry, || {
            let request = self.request(message.clone());
            let mut raw = self.raw.clone();
            let timeout = self.settings.request_timeout;
            async move {
                within(timeout, "GetSession", raw.get_session(request))
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }

    /// Deletes the session with its messages and provider calls; watchers
    /// get `session_deleted`. Not retried (a repeat after success would be
    /// [`Error::NotFound`]).
    ///
    /// ```no_run
    /// # async fn demo(client: sessionstore_client::Client) -> Result<(), sessionstore_client::Error> {
    /// client.delete_session("ses_1").await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_session(&self, session_id: impl Into<String>) -> Result<()> {
        let request = self.request(v1::DeleteSessionRequest {
            session_id: session_id.into(),
        });
        let mut raw = self.raw.clone();
        within(
            self.settings.request_timeout,
            "DeleteSession",
            raw.delete_session(request),
        )
        .await?;
        Ok(())
    }

    /// Erases every session of `user` in the caller's tenant, with all
    /// attached to them, and the shared state `scopes` named
    /// (`EraseUser`). Once it answers, no file of the store holds what was
    /// erased. Retried: a repeat finishes an erasure cut short.
    ///
    /// A user with thousands of sessions takes longer than the default
    /// request timeout (on SQLite, removing their words from the search
    /// index takes about 5 ms a message): call it on a client built with
    /// a longer [`ClientBuilder::request_timeout`], as `sessions
    /// erase-user` does, or call it again until it answers.
    pub async fn erase_user(
        &self,
        user: impl Into<String>,
        scopes: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<v1::EraseUserResponse> {
        let request = v1::EraseUserRequest {
            user: user.into(),
            scopes: scopes.into_iter().map(Into::into).collect(),
        };
        self.unary("EraseUser", request, true, |mut raw, request| async move {
            raw.erase_user(request).await
        })
        .await
    }

    /// Appends an exchange in one transaction and returns the stored
    /// messages (with ids and sequences), the stored provider call, the
    /// new revision and the next sequence.
    ///
    /// Retry-safe: every attempt carries the exchange's `request_id`, so
    /// when the server was unavailable, the connection broke or the tenant
    /// was rate limited (waiting as long as the server's `RetryInfo` asks)
    /// the client tries again under the [`RetryPolicy`] and the server
    /// stores the exchange at most once, answering a repeat with the first
    /// result. For the same reason you may call this again with the same
    /// `Exchange` after an error.
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, Error, Exchange};
    /// use sessionstore_client::v1::{Message, ProviderCall};
    ///
    /// # async fn demo(client: Client, next_sequence: i64) -> Result<(), Error> {
    /// let exchange = Exchange::new("ses_1")
    ///     .message(Message::user("And in Celsius?"))
    ///     .provider_call(ProviderCall::new("anthropic", "claude-sonnet").with_tokens(310, 12))
    ///     .response(Message::assistant("About 22 °C."))
    ///     .expected_next_sequence(next_sequence);
    /// match client.append_exchange(&exchange).await {
    ///     Ok(stored) => println!("stored up to sequence {}", stored.next_sequence - 1),
    ///     Err(Error::SequenceMismatch { actual_next_sequence, .. }) => {
    ///         println!("another writer got there first; next is {actual_next_sequence}");
    ///     }
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn append_exchange(&self, exchange: &Exchange) -> Result<v1::AppendExchangeResponse> {
        let message = exchange.as_request();
        retrying(&self.settings.retry, || {
            let request = self.request(message.clone());
            let mut raw = self.raw.clone();
            let timeout = self.settings.request_timeout;
            async move {
                within(timeout, "AppendExchange", raw.append_exchange(request))
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }

    /// The session's messages, in sequence order, collected into a `Vec`:
    /// pass a session id for all of them, or an [`ExportHistory`] to
    /// choose. Ready to hand to a model, or to
    /// [`NewSession::initial_history`](crate::NewSession::initial_history).
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, ExportHistory};
    ///
    /// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
    /// let everything = client.export_history("ses_1").await?;
    /// let recent = client
    ///     .export_history(ExportHistory::new("ses_1").include_system_prompt().max_messages(20))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn export_history(
        &self,
        request: impl Into<ExportHistory>,
    ) -> Result<Vec<v1::Message>> {
        let mut chunks = self.open_export(request.into()).await?;
        let mut messages = Vec::new();
        while let Some(chunk) = chunks.message().await? {
            messages.extend(chunk.messages);
        }
        Ok(messages)
    }

    /// The session's history as `provider`'s `model` accepts it, to send
    /// on to that model after a switch: `reasoning` says whose reasoning
    /// stays (see [`ExportHistory::for_model`]). Storage is not changed.
    pub async fn export_for(
        &self,
        session_id: impl Into<String>,
        provider: impl Into<String>,
        model: impl Into<String>,
        reasoning: v1::ReasoningPolicy,
    ) -> Result<Vec<v1::Message>> {
        let request = ExportHistory::new(session_id)
            .for_model(provider, model)
            .reasoning(reasoning);
        self.export_history(request).await
    }

    /// The session's messages as a stream, in bounded memory whatever the
    /// session's size. Opening the export is retried on transient
    /// failures; an error mid-stream ends it (start again with
    /// [`ExportHistory::after_sequence`] if you track sequences).
    ///
    /// ```no_run
    /// use futures_util::StreamExt as _;
    /// use sessionstore_client::Client;
    ///
    /// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
    /// let mut messages = client.export_history_stream("ses_1").await?;
    /// while let Some(message) = messages.next().await {
    ///     let message = message?;
    ///     println!("{:?}: {}", message.role(), message.content);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn export_history_stream(
        &self,
        request: impl Into<ExportHistory>,
    ) -> Result<BoxStream<v1::Message>> {
        let chunks = self.open_export(request.into()).await?;
        struct State {
            chunks: tonic::Streaming<v1::ExportHistoryResponse>,
            buffer: VecDeque<v1::Message>,
            done: bool,
        }
        let state = State {
            chunks,
            buffer: VecDeque::new(),
            done: false,
        };
        let stream = futures_util::stream::unfold(state, |mut state| async move {
            loop {
                if let Some(message) = state.buffer.pop_front() {
                    return Some((Ok(message), state));
                }
                if state.done {
                    return None;
                }
                match state.chunks.message().await {
                    Ok(Some(chunk)) => state.buffer.extend(chunk.messages),
                    Ok(None) => return None,
                    Err(status) => {
                        state.done = true;
                        return Some((Err(Error::from(status)), state));
                    }
                }
            }
        });
        Ok(Box::pin(stream))
    }

    async fn open_export(
        &self,
        request: ExportHistory,
    ) -> Result<tonic::Streaming<v1::ExportHistoryResponse>> {
        let message = request.into_request();
        retrying(&self.settings.retry, || {
            let request = Request::new(message.clone());
            let mut raw = self.raw.clone();
            let timeout = self.settings.request_timeout;
            async move {
                within(timeout, "ExportHistory", raw.export_history(request))
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }

    /// Every matching session's summary (counts, last model, totals),
    /// newest update first, fetching page after page as the stream is
    /// read. Each page is retried on transient failures; a permanent error
    /// is the stream's last item.
    ///
    /// ```no_run
    /// use futures_util::TryStreamExt as _;
    /// use sessionstore_client::{Client, ListSessions};
    ///
    /// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
    /// let summaries: Vec<_> = client
    ///     .list_sessions(ListSessions::new().user("alice"))
    ///     .try_collect()
    ///     .await?;
    /// for summary in summaries {
    ///     let session = summary.session.unwrap_or_default();
    ///     println!("{} {:?}: {} messages", session.id, session.title, summary.message_count);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn list_sessions(&self, query: ListSessions) -> BoxStream<v1::SessionSummary> {
        struct State {
            client: Client,
            request: v1::ListSessionsRequest,
            buffer: VecDeque<v1::SessionSummary>,
            done: bool,
        }
        let state = State {
            client: self.clone(),
            request: v1::ListSessionsRequest {
                page_size: query.page_size,
                page_token: String::new(),
                user: query.user,
                filter: query.filter,
            },
            buffer: VecDeque::new(),
            done: false,
        };
        let stream = futures_util::stream::unfold(state, |mut state| async move {
            loop {
                if let Some(summary) = state.buffer.pop_front() {
                    return Some((Ok(summary), state));
                }
                if state.done {
                    return None;
                }
                match state.client.list_page(&state.request).await {
                    Ok(page) => {
                        state.buffer.extend(page.sessions);
                        if page.next_page_token.is_empty() {
                            state.done = true;
                        } else {
                            state.request.page_token = page.next_page_token;
                        }
                    }
                    Err(error) => {
                        state.done = true;
                        return Some((Err(error), state));
                    }
                }
            }
        });
        Box::pin(stream)
    }

    async fn list_page(
        &self,
        message: &v1::ListSessionsRequest,
    ) -> Result<v1::ListSessionsResponse> {
        retrying(&self.settings.retry, || {
            let request = self.request(message.clone());
            let mut raw = self.raw.clone();
            let timeout = self.settings.request_timeout;
            async move {
                within(timeout, "ListSessions", raw.list_sessions(request))
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }

    /// The session's events after `after_revision` (0: from its creation):
    /// the replay, one `caught_up`, then live events as they commit.
    ///
    /// The stream survives the server: when the connection breaks, the
    /// server restarts or shuts down, or the stream ends without
    /// `session_deleted`, it reconnects with backoff and resumes after the
    /// last revision it delivered, so every revision arrives exactly once
    /// and in order. See [`SessionEvents`] for the details (what happens to
    /// `caught_up`, `progress` and ephemeral deltas across a reconnect).
    /// `session_deleted` is the last event.
    ///
    /// ```no_run
    /// use futures_util::StreamExt as _;
    /// use sessionstore_client::Client;
    /// use sessionstore_client::v1::session_event::Event;
    ///
    /// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
    /// let mut events = client.watch("ses_1", 0);
    /// while let Some(event) = events.next().await {
    ///     let event = event?;
    ///     match &event.event {
    ///         Some(Event::ExchangeAppended(appended)) => {
    ///             for stored in &appended.messages {
    ///                 let text = stored.message.as_ref().map_or("", |m| m.content.as_str());
    ///                 println!("#{} {}", stored.sequence, text);
    ///             }
    ///         }
    ///         Some(Event::CaughtUp(_)) => println!("-- live from revision {} --", event.revision),
    ///         _ => println!("{} at revision {}", event.kind(), event.revision),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn watch(&self, session_id: impl Into<String>, after_revision: i64) -> SessionEvents {
        self.watch_with(v1::WatchSessionRequest {
            session_id: session_id.into(),
            after_revision,
            include_active_deltas: false,
            delta_cursors: Vec::new(),
        })
    }

    /// [`watch`](Self::watch) with every request field, e.g.
    /// `include_active_deltas` to receive the partial output of runs still
    /// open when the stream catches up.
    pub fn watch_with(&self, request: v1::WatchSessionRequest) -> SessionEvents {
        SessionEvents::start(
            self.raw.clone(),
            request,
            crate::watch::WatchSettings {
                open_timeout: self.settings.request_timeout,
                idle_timeout: self.settings.watch_idle_timeout,
                retry: self.settings.watch_retry,
            },
        )
    }
}
