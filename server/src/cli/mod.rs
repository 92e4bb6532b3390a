//! `sessionstore sessions …`: a terminal client for people, over the
//! `sessionstore-client` crate. Tables and transcripts go to stdout;
//! progress and errors to stderr. Colour only on a terminal, never with
//! `NO_COLOR`.

use std::io::{IsTerminal as _, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use futures_util::StreamExt as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::{
    Client, ClientBuilder, Exchange, ExportHistory, ListSessions, NewSession, RetryPolicy,
};

use crate::domain::Timestamp;
use crate::domain::calendar::rfc3339;
use crate::domain::transcript::markdown_message;
use crate::wire;

mod approvals;
mod backup;
mod command;
mod database;
mod export;
mod file_format;
mod health;
mod import;
mod progress;
mod queue;
mod watch;

pub use backup::{BackupArgs, RestoreArgs, backup, restore};
pub use command::{Cli, Command, MigrateArgs};
pub use database::{ReplicasArgs, ReplicasFormat, check_migrations, replicas};
use export::export;
pub use health::{HealthArgs, run as health};
use import::import;
use watch::watch;

/// Look at and manage the sessions of a running server.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(flatten)]
    pub connection: Connection,

    #[command(subcommand)]
    pub command: SessionsCommand,
}

/// Where the server is and how to reach it.
#[derive(Debug, Args)]
pub struct Connection {
    /// The server: `http://HOST:PORT`, `https://HOST:PORT` (TLS) or
    /// `HOST:PORT` (meaning `http://`).
    #[arg(
        long,
        global = true,
        env = "SESSIONSTORE_SERVER",
        default_value = "http://127.0.0.1:50051",
        value_parser = parse_server
    )]
    pub server: String,

    /// Bearer token, when the server has --auth-tokens.
    #[arg(
        long,
        global = true,
        env = "SESSIONSTORE_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,

    /// PEM CA certificate to trust for an `https://` server.
    #[arg(long, global = true, env = "SESSIONSTORE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
}

/// The `sessions` commands.
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// A table of sessions, most recently updated first.
    List {
        /// Only this user's sessions.
        #[arg(long)]
        user: Option<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// A session's metadata and its conversation.
    Show {
        id: String,
        /// Also print the framework objects stored verbatim beside the
        /// messages (the `json` content blocks the Python adapters keep).
        #[arg(long)]
        raw: bool,
    },
    /// Write a session out: `json` holds everything `import` restores
    /// (messages, provider calls and their links, state, summary marker).
    ///
    /// `--for PROVIDER/MODEL` exports the history that model accepts:
    /// reasoning of other models removed, tool calls without their
    /// results (and results without their calls) left out. The provider
    /// request bodies (`anthropic`, `openai-responses`, `gemini`) without
    /// `--for` follow their own provider's rules, keeping the reasoning of
    /// any of its models.
    Export {
        id: String,
        #[arg(long, value_enum, default_value_t = ExportFormat::Json)]
        format: ExportFormat,
        /// Export for this model (e.g. `anthropic/claude-sonnet-4-5`; the
        /// model may be left out). Not for `json`, which holds everything.
        #[arg(long = "for", value_name = "PROVIDER/MODEL")]
        for_model: Option<String>,
        /// Which reasoning `--for` keeps: that of the same model (the
        /// default), of any model of the same provider, or none.
        #[arg(long, value_enum, requires = "for_model")]
        reasoning: Option<Reasoning>,
        /// Write here instead of to stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Create a session from a `sessions export --format json` file,
    /// replaying its history, provider calls, redactions, state and
    /// summary marker.
    Import {
        file: PathBuf,
        /// The new session's id (default: the one in the file).
        #[arg(long)]
        id: Option<String>,
    },
    /// Print a session's events as they happen, a run's text streaming onto
    /// its line as it is generated (Ctrl-C to stop).
    Watch {
        id: String,
        /// Start after this revision (0: from the beginning).
        #[arg(long, default_value_t = 0)]
        after_revision: i64,
    },
    /// What the tenant's model calls cost, summed (SummarizeUsage): in
    /// total or by day, model, session or user.
    Usage {
        /// Only this user's sessions.
        #[arg(long)]
        user: Option<String>,
        /// Group the sums.
        #[arg(long, value_enum, default_value_t = UsageBy::Total)]
        by: UsageBy,
        /// Only calls since this UTC date (`2026-11-01`) or age (`7d`, `12h`).
        #[arg(long, value_parser = parse_since)]
        since: Option<prost_types::Timestamp>,
    },
    /// Ask a session's active run to stop (CancelRun): its producer sees
    /// it on its next delta, every watcher sees run_cancel_requested.
    Cancel {
        id: String,
        /// The run to stop.
        run: String,
        /// Why (shown to watchers).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// List tool approvals (ListApprovals), oldest first: every session's
    /// of the tenant, or with ID only that session's.
    ///
    /// Text: one aligned line each under a header (ID, SESSION, TOOL CALL,
    /// STATE, TITLE, DECIDED BY, CREATED, EXPIRES); `--format json`: one
    /// array of objects. Decide one with `sessions approve` or `sessions
    /// deny`.
    Approvals {
        /// Only this session's approvals.
        id: Option<String>,
        /// Only approvals in this state.
        #[arg(long, value_enum)]
        state: Option<ApprovalStateArg>,
        /// Only approvals of this user's sessions.
        #[arg(long)]
        user: Option<String>,
        /// `text`: aligned columns under a header. `json`: one array of
        /// objects keyed by the approval's fields (times RFC 3339, UTC).
        #[arg(long, value_enum, default_value_t = ApprovalsFormat::Text)]
        format: ApprovalsFormat,
    },
    /// Approve a pending tool approval (DecideApproval): the tool call may
    /// run. A decided or expired approval is an error, saying so.
    Approve {
        id: String,
        /// The approval (`apr_…`, from `sessions approvals`).
        approval: String,
        /// Why, for the record.
        #[arg(long, default_value = "")]
        reason: String,
        /// Who decided, for the record.
        #[arg(long = "by", value_name = "NAME", default_value = "")]
        decided_by: String,
    },
    /// Deny a pending tool approval (DecideApproval): the call's tool
    /// result, a tool error saying the reason, is stored with the decision.
    Deny {
        id: String,
        /// The approval (`apr_…`, from `sessions approvals`).
        approval: String,
        /// Why (the tool result's content, which the model reads).
        #[arg(long, default_value = "")]
        reason: String,
        /// Who decided, for the record.
        #[arg(long = "by", value_name = "NAME", default_value = "")]
        decided_by: String,
    },
    /// Submit input to a session (SubmitInput): appended at once when the
    /// session is not busy; while a run holds its lease or inputs wait in
    /// its queue, queued at the back (prints its input id and position).
    ///
    /// `--mode interrupt` also asks the run holding the lease to stop (as
    /// `sessions cancel` does); `--mode reject` refuses the input while the
    /// session is busy, saying why. Retried safely (one request id).
    Submit {
        id: String,
        /// A user message; repeat it for several, submitted as one input.
        #[arg(long = "text", value_name = "TEXT", required = true)]
        texts: Vec<String>,
        /// What to do while the session is busy.
        #[arg(long, value_enum, default_value_t = InputModeArg::Queue)]
        mode: InputModeArg,
    },
    /// List the inputs waiting in a session's queue (ListQueuedInputs), by
    /// position: the first is taken next.
    ///
    /// Text: one aligned line each under a header (POSITION, ID, MODE,
    /// MESSAGES, TEXT, QUEUED); `--format json`: one array of objects.
    Queue {
        id: String,
        /// `text`: aligned columns under a header. `json`: one array of
        /// objects keyed by the input's fields (messages as in an export,
        /// times RFC 3339, UTC).
        #[arg(long, value_enum, default_value_t = QueueFormat::Text)]
        format: QueueFormat,
    },
    /// Withdraw a waiting input (WithdrawQueuedInput): it is never taken
    /// into the history. An input already taken is an error, saying so.
    Withdraw {
        id: String,
        /// The input (`inp_…`, from `sessions queue` or `sessions submit`).
        input: String,
    },
    /// Delete a session.
    Delete { id: String },
    /// Erase every session of a user, with their messages, provider calls,
    /// history and state, and the shared state scopes named (EraseUser).
    /// Asks for the user's name again first, unless `--yes`.
    EraseUser {
        user: String,
        /// A shared state scope to erase as well, e.g. `user:APP:USER`
        /// (repeatable).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Create a session and print its id.
    Create {
        /// The session's id (default: one the server makes, `ses_…`).
        #[arg(long)]
        id: Option<String>,
        #[arg(long)]
        title: Option<String>,
        #[arg(long)]
        system_prompt: Option<String>,
        /// The owner's name (what `sessions list --user` filters by).
        #[arg(long)]
        user: Option<String>,
    },
    /// Store one exchange: a user message and, optionally, the assistant's
    /// answer with the model call that produced it.
    Append {
        id: String,
        /// The user's message.
        #[arg(long = "user", value_name = "TEXT")]
        user_text: String,
        /// The assistant's answer (needs --model: every answer records the
        /// call that produced it).
        #[arg(long, value_name = "TEXT", requires = "model")]
        assistant: Option<String>,
        /// The model call, as PROVIDER/MODEL (e.g. `openai/gpt-4o`).
        #[arg(long, value_name = "PROVIDER/MODEL", value_parser = parse_model)]
        model: Option<(String, String)>,
        /// The call's prompt and completion tokens, as IN,OUT.
        #[arg(long, value_name = "IN,OUT", value_parser = parse_tokens, requires = "model")]
        tokens: Option<(i64, i64)>,
        /// The call's cost in millionths of a US dollar.
        #[arg(long, value_name = "MICROS", requires = "model")]
        cost_micros_usd: Option<i64>,
    },
}

/// `provider/model`.
fn parse_model(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((provider, model)) if !provider.is_empty() && !model.is_empty() => {
            Ok((provider.to_owned(), model.to_owned()))
        }
        _ => Err(format!(
            "{text:?} is not PROVIDER/MODEL (e.g. openai/gpt-4o)"
        )),
    }
}

/// `in,out`.
fn parse_tokens(text: &str) -> Result<(i64, i64), String> {
    let parsed = text.split_once(',').and_then(|(input, output)| {
        Some((input.trim().parse().ok()?, output.trim().parse().ok()?))
    });
    parsed.ok_or_else(|| format!("{text:?} is not IN,OUT (e.g. 310,12)"))
}

/// How `sessions usage` groups the sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UsageBy {
    Total,
    Day,
    Model,
    Session,
    User,
}

/// The approval states `sessions approvals --state` filters by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ApprovalStateArg {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl From<ApprovalStateArg> for pb::ApprovalState {
    fn from(state: ApprovalStateArg) -> Self {
        match state {
            ApprovalStateArg::Pending => pb::ApprovalState::Pending,
            ApprovalStateArg::Approved => pb::ApprovalState::Approved,
            ApprovalStateArg::Denied => pb::ApprovalState::Denied,
            ApprovalStateArg::Expired => pb::ApprovalState::Expired,
        }
    }
}

/// How `sessions approvals` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ApprovalsFormat {
    /// One aligned line per approval, with a header.
    #[default]
    Text,
    /// One JSON array of objects.
    Json,
}

/// What `sessions submit --mode` does while the session is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InputModeArg {
    /// Queue the input at the back.
    Queue,
    /// Queue it, and ask the run holding the lease to stop.
    Interrupt,
    /// Refuse it.
    Reject,
}

impl From<InputModeArg> for pb::InputMode {
    fn from(mode: InputModeArg) -> Self {
        match mode {
            InputModeArg::Queue => pb::InputMode::Queue,
            InputModeArg::Interrupt => pb::InputMode::Interrupt,
            InputModeArg::Reject => pb::InputMode::Reject,
        }
    }
}

/// How `sessions queue` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum QueueFormat {
    /// One aligned line per waiting input, with a header.
    #[default]
    Text,
    /// One JSON array of objects.
    Json,
}

/// What `sessions export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// sessionstore's lossless JSON (messages with thinking, signatures,
    /// blocks and metadata; provider calls; state; summary marker).
    Json,
    /// A Markdown transcript for people.
    Markdown,
    /// OpenAI Chat Completions messages (no thinking).
    Openai,
    /// A request body for the Anthropic Messages API (`system`, `messages`).
    Anthropic,
    /// A request body for the OpenAI Responses API (`instructions`, `input`).
    OpenaiResponses,
    /// A request body for the Gemini API (`systemInstruction`, `contents`).
    Gemini,
}

/// Which reasoning `sessions export --for` keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Reasoning {
    /// Reasoning of the same provider and model.
    SameModel,
    /// Reasoning of any model of the same provider.
    SameProvider,
    /// None.
    None,
}

/// The target of `--for PROVIDER/MODEL` (split at the first `/`; the
/// model may contain more, or be left out) with `--reasoning`.
fn export_target(
    format: ExportFormat,
    for_model: Option<String>,
    reasoning: Option<Reasoning>,
) -> anyhow::Result<Option<sessionstore_client::v1::ExportTarget>> {
    use sessionstore_client::v1::ReasoningPolicy;
    let Some(for_model) = for_model else {
        return Ok(None);
    };
    if format == ExportFormat::Json {
        anyhow::bail!(
            "--for does not apply to --format json (it holds everything); \
             use markdown, openai, anthropic, openai-responses or gemini"
        );
    }
    let (provider, model) = for_model.split_once('/').unwrap_or((&for_model, ""));
    if provider.is_empty() {
        anyhow::bail!("--for {for_model:?} names no provider: give PROVIDER/MODEL");
    }
    let reasoning = match reasoning.unwrap_or(Reasoning::SameModel) {
        Reasoning::SameModel => ReasoningPolicy::SameModel,
        Reasoning::SameProvider => ReasoningPolicy::SameProvider,
        Reasoning::None => ReasoningPolicy::None,
    };
    Ok(Some(sessionstore_client::v1::ExportTarget {
        provider: provider.to_owned(),
        model: model.to_owned(),
        reasoning: reasoning.into(),
    }))
}

/// Runs one `sessions` command.
pub async fn run(args: SessionsArgs) -> anyhow::Result<()> {
    let server = server_url(&args.connection.server);
    let token_given = args.connection.token.is_some();
    match run_command(args).await {
        Ok(()) => Ok(()),
        Err(error) => Err(explain_connection(error, &server, token_given).await),
    }
}

/// The forms `--server` takes, for its usage error.
const SERVER_FORMS: &str = "use http://HOST:PORT, https://HOST:PORT (TLS) or HOST:PORT";

/// `--server` (and `SESSIONSTORE_SERVER`): `http://HOST:PORT`,
/// `https://HOST:PORT`, or `HOST:PORT` (as `--listen` and grpcurl take it,
/// meaning `http://HOST:PORT`), as a URL. Anything else is a usage error
/// rather than a guess: a mistyped scheme (`htps://`) would otherwise go out
/// in plaintext, bearer token and all, and a missing port would quietly
/// mean 80.
fn parse_server(text: &str) -> Result<String, String> {
    // clap names the flag and the value: "invalid value 'X' for '--server
    // <SERVER>': WHY: use …".
    let refuse = |why: &str| format!("{why}: {SERVER_FORMS}");
    let (scheme, authority) = match text.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => ("http".to_owned(), text),
    };
    if scheme != "http" && scheme != "https" {
        return Err(refuse(&format!(
            "{scheme}:// is neither http:// nor https://"
        )));
    }
    // A trailing slash is harmless; a path, query or user name is not an
    // address of a gRPC server.
    let authority = authority.strip_suffix('/').unwrap_or(authority);
    if authority.is_empty() {
        return Err(refuse("no host"));
    }
    if authority.contains(['/', '?', '#', '@']) || authority.contains(char::is_whitespace) {
        return Err(refuse("not HOST:PORT"));
    }
    // `[::1]:50051`: the port follows the bracketed address.
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.starts_with('[') || host.ends_with(']') => (host, port),
        _ => return Err(refuse("no port")),
    };
    if host.is_empty() {
        return Err(refuse("no host"));
    }
    if !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
        return Err(refuse(&format!("{port:?} is not a port (1-65535)")));
    }
    let url = format!("{scheme}://{authority}");
    match tonic::transport::Endpoint::from_shared(url.clone()) {
        Ok(_) => Ok(url),
        Err(_) => Err(refuse("not a valid address")),
    }
}

/// The server's URL. `--server` is checked and made a URL as it is parsed;
/// this also accepts `HOST:PORT` for callers that build a [`Connection`]
/// themselves.
fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_owned()
    } else {
        format!("http://{server}")
    }
}

/// `server` with its scheme swapped (`http` for `https` and back), for the
/// hint that names the right one.
fn other_scheme(server: &str) -> String {
    match server.split_once("://") {
        Some(("https", rest)) => format!("http://{rest}"),
        Some((_, rest)) => format!("https://{rest}"),
        None => format!("https://{server}"),
    }
}

/// Whether a failed TLS handshake failed because the peer answered in
/// plaintext: rustls reads the server's HTTP/2 frames as a TLS record of
/// no known type, "received corrupt message of type InvalidContentType".
fn plaintext_peer(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        let text = cause.to_string();
        text.contains("InvalidContentType")
            || (text.contains("corrupt message") && text.contains("ContentType"))
    })
}

/// Whether the server at the `http://` URL `server` speaks TLS: asked
/// when a plaintext connection failed other than by being refused. It
/// sends the HTTP/2 preface; a TLS server answers with a TLS alert record
/// (content type 21, version 3.x) before closing. One short connection,
/// bounded by a timeout; any failure of its own means "no idea", i.e. no.
async fn tls_peer(server: &str) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(uri) = server.parse::<tonic::transport::Uri>() else {
        return false;
    };
    let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else {
        return false;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let probe = async move {
        let mut stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await?;
        let mut head = [0u8; 3];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(matches!(head, [0x15 | 0x16, 0x03, _]))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Ok(true))
    )
}

/// [`explain`], and when a plaintext connection failed, whether that is
/// because the server speaks TLS (which takes a look at the server).
async fn explain_connection(
    error: anyhow::Error,
    server: &str,
    token_given: bool,
) -> anyhow::Error {
    use sessionstore_client::Error as ClientError;
    let transport = match error.downcast_ref::<ClientError>() {
        Some(ClientError::Transport(_)) => true,
        Some(ClientError::Unavailable { status, .. }) => {
            std::error::Error::source(status).is_some()
        }
        _ => false,
    };
    if transport && server.starts_with("http://") && tls_peer(server).await {
        return anyhow::anyhow!(
            "the server at {server} speaks TLS: use {} (with --tls-ca PATH if its certificate is not publicly trusted)",
            other_scheme(server)
        );
    }
    explain(error, server, token_given)
}

/// One line for the person at the terminal: what went wrong and, where it
/// helps, what to do (a call's error, not the layers of causes beneath it).
fn explain(error: anyhow::Error, server: &str, token_given: bool) -> anyhow::Error {
    use sessionstore_client::Error as ClientError;
    let Some(client) = error.downcast_ref::<ClientError>() else {
        return error;
    };
    let unreachable = || {
        if server.starts_with("https://") && plaintext_peer(&error) {
            return anyhow::anyhow!(
                "the server at {server} does not speak TLS: use {} (or give the server --tls-cert and --tls-key)",
                other_scheme(server)
            );
        }
        anyhow::anyhow!(
            "cannot reach the server at {server} ({}): is it running? (--server URL, or SESSIONSTORE_SERVER)",
            error.root_cause()
        )
    };
    match client {
        ClientError::Transport(_) => unreachable(),
        ClientError::Unavailable { status, .. } if std::error::Error::source(status).is_some() => {
            unreachable()
        }
        ClientError::Unauthenticated { .. } if token_given => anyhow::anyhow!(
            "the server at {server} refused the bearer token: check --token (or SESSIONSTORE_TOKEN)"
        ),
        ClientError::Unauthenticated { .. } => anyhow::anyhow!(
            "the server at {server} wants a bearer token: pass --token TOKEN (or set SESSIONSTORE_TOKEN)"
        ),
        other => match other.status() {
            Some(status) => anyhow::anyhow!("{}", status.message()),
            None => anyhow::anyhow!("{other}"),
        },
    }
}

async fn run_command(args: SessionsArgs) -> anyhow::Result<()> {
    // Erasing a user with many sessions takes as long as it takes.
    let timeout = match args.command {
        SessionsCommand::EraseUser { .. } => Duration::from_secs(3600),
        _ => Duration::from_secs(10),
    };
    let mut builder = builder(&args.connection, timeout)?;
    if matches!(args.command, SessionsCommand::Watch { .. }) {
        // A live tail outlasts a server restart: it says "reconnecting…"
        // and carries on from the last revision it printed.
        builder = builder.watch_retry_policy(
            RetryPolicy::default()
                .max_attempts(u32::MAX)
                .max_backoff(Duration::from_secs(2)),
        );
    }
    let client = builder.connect().await?;
    let server = server_url(&args.connection.server);
    let token_given = args.connection.token.is_some();
    // An import that fails part-way says why, then what it left behind.
    let explain = |error| explain(error, &server, token_given);
    let out = std::io::stdout();
    let mut out = out.lock();
    let result = match args.command {
        SessionsCommand::List { user, limit } => list(&client, user, limit, &mut out).await,
        SessionsCommand::Show { id, raw } => show(&client, &id, raw, &mut out).await,
        SessionsCommand::Export {
            id,
            format,
            for_model,
            reasoning,
            output,
        } => {
            let target = export_target(format, for_model, reasoning)?;
            match output {
                Some(path) => {
                    // A session that is not there leaves no empty file behind.
                    client.get_session(id.clone()).await?;
                    let file = std::fs::File::create(&path)
                        .with_context(|| format!("cannot create {}", path.display()))?;
                    let mut file = std::io::BufWriter::new(file);
                    export(&client, &id, format, target, &mut file).await?;
                    file.flush().map_err(anyhow::Error::from)
                }
                None => export(&client, &id, format, target, &mut out).await,
            }
        }
        SessionsCommand::Import { file, id } => {
            import(&client, &file, id, &explain, &mut out).await
        }
        SessionsCommand::Watch { id, after_revision } => {
            watch(&client, &id, after_revision, &mut out).await
        }
        SessionsCommand::Usage { user, by, since } => {
            usage(&client, user, by, since, &mut out).await
        }
        SessionsCommand::Cancel { id, run, reason } => {
            let revision = client.cancel_run(id.clone(), run.clone(), reason).await?;
            writeln!(out, "asked run {run} of {id} to stop (revision {revision})")
                .map_err(anyhow::Error::from)
        }
        SessionsCommand::Approvals {
            id,
            state,
            user,
            format,
        } => approvals::list(&client, id, state, user, format, &mut out).await,
        SessionsCommand::Approve {
            id,
            approval,
            reason,
            decided_by,
        } => {
            let decision = pb::ApprovalDecision::Approve;
            approvals::decide(
                &client, &id, &approval, decision, reason, decided_by, &mut out,
            )
            .await
        }
        SessionsCommand::Deny {
            id,
            approval,
            reason,
            decided_by,
        } => {
            let decision = pb::ApprovalDecision::Deny;
            approvals::decide(
                &client, &id, &approval, decision, reason, decided_by, &mut out,
            )
            .await
        }
        SessionsCommand::Submit { id, texts, mode } => {
            queue::submit(&client, &id, texts, mode, &mut out).await
        }
        SessionsCommand::Queue { id, format } => queue::list(&client, &id, format, &mut out).await,
        SessionsCommand::Withdraw { id, input } => {
            queue::withdraw(&client, &id, &input, &mut out).await
        }
        SessionsCommand::Delete { id } => {
            client.delete_session(id.clone()).await?;
            writeln!(out, "deleted {id}").map_err(anyhow::Error::from)
        }
        SessionsCommand::EraseUser { user, scopes, yes } => {
            if !yes {
                confirm_erasure(&user, &scopes)?;
            }
            let erased = client.erase_user(user.clone(), scopes).await?;
            writeln!(
                out,
                "erased user {user}: {} sessions, {} messages, {} provider calls",
                erased.sessions_deleted, erased.messages_deleted, erased.provider_calls_deleted
            )
            .map_err(anyhow::Error::from)
        }
        SessionsCommand::Create {
            id,
            title,
            system_prompt,
            user,
        } => {
            let mut new = NewSession::new();
            if let Some(id) = id {
                new = new.id(id);
            }
            if let Some(title) = title {
                new = new.title(title);
            }
            if let Some(prompt) = system_prompt {
                new = new.system_prompt(prompt);
            }
            if let Some(user) = user {
                new = new.user(user);
            }
            let session = client.create_session(new).await?;
            writeln!(out, "{}", session.id).map_err(anyhow::Error::from)
        }
        SessionsCommand::Append {
            id,
            user_text,
            assistant,
            model,
            tokens,
            cost_micros_usd,
        } => {
            let mut exchange = Exchange::new(id.clone()).message(pb::Message::user(user_text));
            if let Some((provider, model)) = model {
                let (input, output) = tokens.unwrap_or_default();
                let mut call = pb::ProviderCall::new(provider, model).with_tokens(input, output);
                if let Some(cost) = cost_micros_usd {
                    call = call.with_cost_micros_usd(cost);
                }
                exchange = exchange.provider_call(call);
            }
            if let Some(answer) = assistant {
                exchange = exchange.response(pb::Message::assistant(answer));
            }
            let stored = client.append_exchange(&exchange).await?;
            let first = stored.messages.first().map_or(0, |m| m.sequence);
            writeln!(
                out,
                "appended to {id}: sequences {first}..{} (revision {})",
                stored.next_sequence - 1,
                stored.revision
            )
            .map_err(anyhow::Error::from)
        }
    };
    match result {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        Err(error)
            if error
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        other => other,
    }
}

async fn connect(connection: &Connection, timeout: Duration) -> anyhow::Result<Client> {
    Ok(builder(connection, timeout)?.connect().await?)
}

fn builder(connection: &Connection, timeout: Duration) -> anyhow::Result<ClientBuilder> {
    let mut builder = Client::builder(server_url(&connection.server))
        .connect_timeout(timeout)
        .no_request_timeout();
    if let Some(token) = &connection.token {
        builder = builder.bearer_token(token.clone());
    }
    if let Some(ca) = &connection.tls_ca {
        let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
        builder = builder.tls_ca_certificate(pem);
    }
    Ok(builder)
}

fn colour() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

fn paint(on: bool, code: &str, text: &str) -> String {
    if on {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

fn time_of(time: Option<&prost_types::Timestamp>) -> String {
    time.map_or_else(String::new, |t| {
        rfc3339(Timestamp(
            t.seconds * 1_000_000 + i64::from(t.nanos / 1_000),
        ))
    })
}

/// A cost as the CLI prints it: `unknown` for 0, dollars otherwise.
///
/// `cost_micros_usd` is a plain proto3 int64 ("Cost in millionths of a US
/// dollar"), 0 when the caller sent none, and the server prices nothing
/// itself: a 0 cannot tell "free" from "not recorded", and a sum of 0 means
/// no call recorded a cost (or there was no call). So 0 reads as unknown
/// rather than as a `$0.000000` nobody measured. A nonzero sum is what the
/// calls that gave a cost add up to.
fn cost(micros: i64) -> String {
    if micros == 0 {
        "unknown".to_owned()
    } else {
        dollars(micros)
    }
}

/// Micro-dollars as dollars, e.g. `$0.000042`.
fn dollars(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let micros = micros.unsigned_abs();
    format!("{sign}${}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// Cuts `text` to one line of at most `width` characters.
fn cell(text: &str, width: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > width {
        let cut: String = line.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

/// Prints `rows` (the first is the heading, in bold on a terminal) as
/// aligned columns: the columns in `numeric` right-aligned, the rest left.
fn print_table<const N: usize>(
    out: &mut impl Write,
    rows: &[[String; N]],
    numeric: &[usize],
) -> anyhow::Result<()> {
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let bold = colour();
    for (i, row) in rows.iter().enumerate() {
        let mut line = String::new();
        for (c, value) in row.iter().enumerate() {
            let pad = widths[c] - value.chars().count();
            if numeric.contains(&c) {
                line.push_str(&" ".repeat(pad));
                line.push_str(value);
            } else {
                line.push_str(value);
                line.push_str(&" ".repeat(pad));
            }
            line.push_str("  ");
        }
        if i == 0 {
            line = paint(bold, "1", line.trim_end());
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// `sessions usage`: SummarizeUsage as a table, every page.
async fn usage(
    client: &Client,
    user: Option<String>,
    by: UsageBy,
    since: Option<prost_types::Timestamp>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let (group_by, heading) = match by {
        UsageBy::Total => (pb::UsageGroupBy::Unspecified, "TOTAL"),
        UsageBy::Day => (pb::UsageGroupBy::Day, "DAY (UTC)"),
        UsageBy::Model => (pb::UsageGroupBy::Model, "MODEL"),
        UsageBy::Session => (pb::UsageGroupBy::Session, "SESSION"),
        UsageBy::User => (pb::UsageGroupBy::User, "USER"),
    };
    let mut rows = vec![[
        heading.to_owned(),
        "CALLS".to_owned(),
        "INPUT".to_owned(),
        "CACHED".to_owned(),
        "CACHE WRITE".to_owned(),
        "OUTPUT".to_owned(),
        "REASONING".to_owned(),
        "COST".to_owned(),
    ]];
    let mut request = pb::SummarizeUsageRequest {
        user: user.unwrap_or_default(),
        start_time: since,
        group_by: group_by.into(),
        page_size: 1000,
        ..Default::default()
    };
    loop {
        let page = client.summarize_usage(request.clone()).await?;
        for row in page.rows {
            let key = match by {
                UsageBy::Total => "all".to_owned(),
                UsageBy::User if row.key.is_empty() => "(none)".to_owned(),
                _ => row.key,
            };
            rows.push([
                key,
                row.calls.to_string(),
                row.prompt_tokens.to_string(),
                row.cached_input_tokens.to_string(),
                row.cache_creation_input_tokens.to_string(),
                row.completion_tokens.to_string(),
                row.reasoning_tokens.to_string(),
                cost(row.cost_micros_usd),
            ]);
        }
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    print_table(out, &rows, &[1, 2, 3, 4, 5, 6, 7])
}

/// `--since`: a UTC date (`2026-11-01`) or an age back from now (`7d`, `12h`).
fn parse_since(text: &str) -> Result<prost_types::Timestamp, String> {
    if let Some(day) = crate::domain::usage::day_of_date(text) {
        return Ok(prost_types::Timestamp {
            seconds: day * 86_400,
            nanos: 0,
        });
    }
    let age = crate::config::parse_age(text)
        .map_err(|_| format!("{text:?} is neither a date (YYYY-MM-DD) nor an age (7d, 12h)"))?;
    Ok(prost_types::Timestamp::from(
        std::time::SystemTime::now() - age,
    ))
}

async fn list(
    client: &Client,
    user: Option<String>,
    limit: usize,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut query = ListSessions::new();
    if let Some(user) = user {
        query = query.user(user);
    }
    let mut summaries = client.list_sessions(query).take(limit);
    let mut rows = vec![[
        "ID".to_owned(),
        "TITLE".to_owned(),
        "USER".to_owned(),
        "MESSAGES".to_owned(),
        "COST".to_owned(),
        "UPDATED".to_owned(),
    ]];
    while let Some(summary) = summaries.next().await {
        let summary = summary?;
        let session = summary.session.unwrap_or_default();
        rows.push([
            session.id,
            cell(&session.title, 40),
            cell(&session.user, 20),
            summary.message_count.to_string(),
            cost(summary.total_cost_micros_usd),
            time_of(session.update_time.as_ref()),
        ]);
    }
    print_table(out, &rows, &[3, 4])?;
    if rows.len() == 1 {
        writeln!(out, "(no sessions)")?;
    }
    Ok(())
}

fn role_colour(role: crate::domain::Role) -> &'static str {
    use crate::domain::Role;
    match role {
        Role::User => "32",                     // green
        Role::Assistant => "36",                // cyan
        Role::System | Role::Developer => "33", // yellow
        Role::Tool => "35",                     // magenta
    }
}

/// `sessions show`: the session's fields, then its conversation as people
/// read it. The framework objects the Python adapters store verbatim beside
/// each message (`json` content blocks: a LangChain message, an ADK event,
/// an Agents SDK item) repeat what the message already says, as JSON; they
/// are printed only with `raw`.
async fn show(client: &Client, id: &str, raw: bool, out: &mut impl Write) -> anyhow::Result<()> {
    let session = client.get_session(id.to_owned()).await?;
    let on = colour();
    let title = if session.title.trim().is_empty() {
        &session.id
    } else {
        &session.title
    };
    writeln!(out, "{}", paint(on, "1", &format!("# {title}")))?;
    writeln!(out, "id        {}", session.id)?;
    if !session.user.is_empty() {
        writeln!(out, "user      {}", session.user)?;
    }
    writeln!(out, "revision  {}", session.revision)?;
    writeln!(out, "created   {}", time_of(session.create_time.as_ref()))?;
    writeln!(out, "updated   {}", time_of(session.update_time.as_ref()))?;
    let mut metadata: Vec<_> = session.metadata.iter().collect();
    metadata.sort();
    for (key, value) in metadata {
        writeln!(out, "meta      {key} = {value}")?;
    }
    writeln!(out)?;
    let mut messages = client
        .export_history_stream(ExportHistory::new(id).include_system_prompt())
        .await?;
    let mut index = 0;
    let mut hidden = 0;
    while let Some(message) = messages.next().await {
        let mut message = wire::message_from_pb(message?, &format!("messages[{index}]"))?;
        index += 1;
        if !raw {
            let before = message.content_blocks.len();
            message
                .content_blocks
                .retain(|block| !matches!(block, crate::domain::ContentBlock::Json { .. }));
            hidden += before - message.content_blocks.len();
        }
        let section = markdown_message(&message, false);
        let (heading, body) = section.split_once('\n').unwrap_or((&section, ""));
        writeln!(out, "{}", paint(on, role_colour(message.role), heading))?;
        write!(out, "{body}")?;
    }
    if hidden > 0 {
        // A hint, not the conversation: on stderr.
        let mut err = std::io::stderr().lock();
        writeln!(
            err,
            "({hidden} stored framework object(s) not shown: --raw prints them)"
        )?;
    }
    Ok(())
}

/// Asks on stderr for `user`'s name again, and reads it from stdin.
fn confirm_erasure(user: &str, scopes: &[String]) -> anyhow::Result<()> {
    let mut prompt = std::io::stderr().lock();
    write!(
        prompt,
        "This erases every session of user {user:?}, with their messages, provider calls and state"
    )?;
    if !scopes.is_empty() {
        write!(prompt, ", and the shared scopes {}", scopes.join(", "))?;
    }
    write!(
        prompt,
        ". It cannot be undone.\nType the user's name to go on: "
    )?;
    prompt.flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if answer.trim_end_matches(['\n', '\r']) == user {
        Ok(())
    } else {
        anyhow::bail!("nothing erased: the name typed was not {user:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_and_cells_read_well() {
        assert_eq!(dollars(42), "$0.000042");
        assert_eq!(dollars(12_345_678), "$12.345678");
        assert_eq!(dollars(-5), "-$0.000005");
        assert_eq!(cost(0), "unknown");
        assert_eq!(cost(85), "$0.000085");
        assert_eq!(cell("short", 10), "short");
        assert_eq!(cell("a long title here", 6), "a lon…");
        assert_eq!(cell("two\nlines", 10), "two");
    }
}
