//! Builders for the requests the [`Client`](crate::Client) sends, and
//! small constructors on the generated message types.

use std::time::SystemTime;

use crate::v1;

// ---------------------------------------------------------------------------
// Constructors on the generated types

impl v1::Message {
    /// A message with `role` and text `content`.
    pub fn with_role(role: v1::Role, content: impl Into<String>) -> Self {
        v1::Message {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }

    /// A user message.
    ///
    /// ```
    /// use sessionstore_client::v1::{Message, Role};
    ///
    /// let hi = Message::user("Hi!");
    /// assert_eq!(hi.role(), Role::User);
    /// assert_eq!(hi.content, "Hi!");
    /// ```
    pub fn user(content: impl Into<String>) -> Self {
        Self::with_role(v1::Role::User, content)
    }

    /// An assistant (model) message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::with_role(v1::Role::Assistant, content)
    }

    /// A system message inside the history (the session's prompt lives on
    /// the session instead).
    pub fn system(content: impl Into<String>) -> Self {
        Self::with_role(v1::Role::System, content)
    }

    /// A developer message (OpenAI's `developer` role).
    pub fn developer(content: impl Into<String>) -> Self {
        Self::with_role(v1::Role::Developer, content)
    }

    /// A tool message answering the tool call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        v1::Message {
            tool_call_id: tool_call_id.into(),
            ..Self::with_role(v1::Role::Tool, content)
        }
    }
}

impl v1::ProviderCall {
    /// A provider call served by `provider`'s `model`; add figures with the
    /// `with_*` methods.
    ///
    /// ```
    /// use sessionstore_client::v1::ProviderCall;
    ///
    /// let call = ProviderCall::new("openai", "gpt-4o")
    ///     .with_tokens(1200, 80)
    ///     .with_cost_micros_usd(3_400)
    ///     .with_request_id("gw-req-17");
    /// assert_eq!(call.prompt_tokens, 1200);
    /// ```
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        v1::ProviderCall {
            provider: provider.into(),
            model: model.into(),
            ..Default::default()
        }
    }

    /// Prompt and completion tokens (the server fills in the total).
    pub fn with_tokens(mut self, prompt_tokens: i64, completion_tokens: i64) -> Self {
        self.prompt_tokens = prompt_tokens;
        self.completion_tokens = completion_tokens;
        self
    }

    /// The call's cost in millionths of a US dollar.
    pub fn with_cost_micros_usd(mut self, cost: i64) -> Self {
        self.cost_micros_usd = cost;
        self
    }

    /// The upstream gateway's request id (not the idempotency key).
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = request_id.into();
        self
    }

    /// What the caller asked for, when routing resolved it to another
    /// provider or model.
    pub fn with_requested(mut self, provider: impl Into<String>, model: impl Into<String>) -> Self {
        self.requested_provider = provider.into();
        self.requested_model = model.into();
        self
    }
}

impl v1::SessionEvent {
    /// The event's kind as its proto field name (`exchange_appended`,
    /// `caught_up`, …), or `unknown` for a kind this client does not know.
    pub fn kind(&self) -> &'static str {
        use v1::session_event::Event;
        match &self.event {
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
            Some(Event::RunCancelRequested(_)) => "run_cancel_requested",
            Some(Event::ApprovalRequested(_)) => "approval_requested",
            Some(Event::ApprovalDecided(_)) => "approval_decided",
            Some(Event::InputQueued(_)) => "input_queued",
            Some(Event::InputTaken(_)) => "input_taken",
            Some(Event::InputWithdrawn(_)) => "input_withdrawn",
            None => "unknown",
        }
    }

    /// Whether the event records a revision of the session (as opposed to
    /// the markers `caught_up` and `progress` and the ephemeral `delta` and
    /// `run_discarded`, which carry the current revision without making one).
    pub fn is_revision(&self) -> bool {
        use v1::session_event::Event;
        !matches!(
            self.event,
            Some(
                Event::CaughtUp(_) | Event::Progress(_) | Event::Delta(_) | Event::RunDiscarded(_)
            )
        )
    }
}

// ---------------------------------------------------------------------------
// CreateSession

/// A session to create, with sensible defaults: a server-made id, no
/// title, prompt, user or history.
///
/// ```
/// use sessionstore_client::NewSession;
/// use sessionstore_client::v1::Message;
///
/// let session = NewSession::new()
///     .id("ses_support_4711")
///     .title("Refund question")
///     .system_prompt("You are a helpful support agent.")
///     .user("alice")
///     .metadata("channel", "web")
///     .initial_history([Message::user("Hi"), Message::assistant("Hello!")]);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NewSession {
    request: v1::CreateSessionRequest,
}

impl NewSession {
    /// A session with every field at its default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Choose the id instead of letting the server make one
    /// ([`Error::AlreadyExists`](crate::Error::AlreadyExists) if taken).
    pub fn id(mut self, session_id: impl Into<String>) -> Self {
        self.request.session_id = session_id.into();
        self
    }

    /// The display title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.request.title = title.into();
        self
    }

    /// The system prompt (kept on the session, not in the history).
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.request.system_prompt = prompt.into();
        self
    }

    /// The owner's name.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.request.user = user.into();
        self
    }

    /// One metadata entry (call again for more).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.metadata.insert(key.into(), value.into());
        self
    }

    /// An exported conversation to start from (e.g. from
    /// [`Client::export_history`](crate::Client::export_history)). A leading
    /// system message equal to the system prompt is not stored.
    pub fn initial_history(mut self, messages: impl IntoIterator<Item = v1::Message>) -> Self {
        self.request.initial_history.extend(messages);
        self
    }

    /// One entry of the session's own state, written with it (version 1).
    pub fn state(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.initial_state.insert(key.into(), value.into());
        self
    }

    /// One entry of a shared state scope of the tenant (such as
    /// `app:weather`), written in the same transaction as the session: the
    /// session and the shared state it starts with are created together or
    /// not at all.
    pub fn shared_state(
        mut self,
        scope: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.request.state_changes.push(v1::StateChange {
            scope: scope.into(),
            key: key.into(),
            value: value.into(),
            delete: false,
        });
        self
    }

    /// An idempotency key: a retry with the same key and fields returns the
    /// session the first call created, so
    /// [`Client::create_session`](crate::Client::create_session) retries
    /// such a request on transient failures.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request.request_id = request_id.into();
        self
    }

    /// The wire request.
    pub fn into_request(self) -> v1::CreateSessionRequest {
        self.request
    }
}

impl From<NewSession> for v1::CreateSessionRequest {
    fn from(session: NewSession) -> Self {
        session.into_request()
    }
}

// ---------------------------------------------------------------------------
// AppendExchange

/// One exchange to append: new client messages (or the full history as
/// sent to the provider), the provider call and what it produced.
///
/// Every `Exchange` carries an idempotency key, its `request_id`, made when
/// the exchange is created (a UUIDv7) unless you set your own. The client
/// sends it on every attempt, and sending the same `Exchange` again — even
/// after a restart, if you kept the key — returns the first result instead
/// of writing twice.
///
/// ```
/// use sessionstore_client::Exchange;
/// use sessionstore_client::v1::{Message, ProviderCall};
///
/// let exchange = Exchange::new("ses_1")
///     .message(Message::user("What is 2 + 2?"))
///     .provider_call(ProviderCall::new("openai", "gpt-4o").with_tokens(12, 1))
///     .response(Message::assistant("4"))
///     .expected_next_sequence(6);
/// assert!(!exchange.request_id().is_empty());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Exchange {
    request: v1::AppendExchangeRequest,
}

impl Exchange {
    /// An empty exchange for `session_id`, with a fresh `request_id`.
    pub fn new(session_id: impl Into<String>) -> Self {
        Exchange {
            request: v1::AppendExchangeRequest {
                session_id: session_id.into(),
                request_id: new_request_id(),
                ..Default::default()
            },
        }
    }

    /// Adds a client-supplied message (a user turn, a tool result).
    pub fn message(mut self, message: v1::Message) -> Self {
        self.request.messages.push(message);
        self
    }

    /// Adds client-supplied messages.
    pub fn messages(mut self, messages: impl IntoIterator<Item = v1::Message>) -> Self {
        self.request.messages.extend(messages);
        self
    }

    /// Instead of [`message`](Self::message)s: the complete history exactly
    /// as sent to the provider. The server appends only what is new
    /// ([`Error::HistoryMismatch`](crate::Error::HistoryMismatch) if it
    /// does not begin with the stored history).
    pub fn full_history(mut self, messages: impl IntoIterator<Item = v1::Message>) -> Self {
        self.request.full_history.extend(messages);
        self
    }

    /// The upstream model call this exchange records.
    pub fn provider_call(mut self, call: v1::ProviderCall) -> Self {
        self.request.provider_call = Some(call);
        self
    }

    /// Adds a message the provider call produced (needs a provider call).
    pub fn response(mut self, message: v1::Message) -> Self {
        self.request.response_messages.push(message);
        self
    }

    /// Adds messages the provider call produced.
    pub fn responses(mut self, messages: impl IntoIterator<Item = v1::Message>) -> Self {
        self.request.response_messages.extend(messages);
        self
    }

    /// Optimistic concurrency: write only if the session's next sequence is
    /// `sequence` ([`Error::SequenceMismatch`](crate::Error::SequenceMismatch)
    /// otherwise, and nothing is written).
    pub fn expected_next_sequence(mut self, sequence: i64) -> Self {
        self.request.expected_next_sequence = Some(sequence);
        self
    }

    /// The run this exchange belongs to (needed while that run holds the
    /// session's lease).
    pub fn run_id(mut self, run_id: impl Into<String>) -> Self {
        self.request.run_id = run_id.into();
        self
    }

    /// Creates the session from `session` if the tenant has none with this
    /// exchange's id, in the same transaction as the exchange, so a first
    /// write is one call (the response's `session_created` says whether it
    /// did). `session`'s id, if set, must be this exchange's; it carries no
    /// initial history. A session that exists is appended to as usual.
    pub fn create_if_missing(mut self, session: NewSession) -> Self {
        self.request.create_if_missing = Some(session.into_request());
        self
    }

    /// Uses your own idempotency key instead of the generated one, e.g. one
    /// derived from your own request id so that a retry after a crash of
    /// your process is still recognised.
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request.request_id = request_id.into();
        self
    }

    /// The idempotency key sent with every attempt.
    pub fn request_id(&self) -> &str {
        &self.request.request_id
    }

    /// The session the exchange is for.
    pub fn session_id(&self) -> &str {
        &self.request.session_id
    }

    /// The wire request.
    pub fn as_request(&self) -> &v1::AppendExchangeRequest {
        &self.request
    }

    /// The wire request.
    pub fn into_request(self) -> v1::AppendExchangeRequest {
        self.request
    }
}

impl From<v1::AppendExchangeRequest> for Exchange {
    /// Wraps a wire request, giving it a fresh `request_id` if it has none.
    fn from(mut request: v1::AppendExchangeRequest) -> Self {
        if request.request_id.is_empty() {
            request.request_id = new_request_id();
        }
        Exchange { request }
    }
}

impl From<Exchange> for v1::AppendExchangeRequest {
    fn from(exchange: Exchange) -> Self {
        exchange.into_request()
    }
}

/// A fresh idempotency key: a UUIDv7, time-ordered and unique.
pub(crate) fn new_request_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

// ---------------------------------------------------------------------------
// ExportHistory

/// Which messages of a session to export; by default all of them, without
/// the system prompt.
///
/// ```
/// use sessionstore_client::ExportHistory;
///
/// // The last 20 messages, after the system prompt, for a model's context.
/// let window = ExportHistory::new("ses_1").include_system_prompt().max_messages(20);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExportHistory {
    request: v1::ExportHistoryRequest,
}

impl ExportHistory {
    /// Every message of `session_id`.
    pub fn new(session_id: impl Into<String>) -> Self {
        ExportHistory {
            request: v1::ExportHistoryRequest {
                session_id: session_id.into(),
                ..Default::default()
            },
        }
    }

    /// Emit the system prompt first, as one system message (none if the
    /// prompt is empty or [`after_sequence`](Self::after_sequence) is set).
    pub fn include_system_prompt(mut self) -> Self {
        self.request.include_system_prompt = true;
        self
    }

    /// Start at the session's summary message, if one is set.
    pub fn from_summary(mut self) -> Self {
        self.request.from_summary = true;
        self
    }

    /// Only messages with a sequence greater than `sequence`.
    pub fn after_sequence(mut self, sequence: i64) -> Self {
        self.request.after_sequence = Some(sequence);
        self
    }

    /// Only the most recent `count` messages, widened so the window never
    /// starts on a tool result whose tool call it cut off.
    pub fn max_messages(mut self, count: i64) -> Self {
        self.request.max_messages = count;
        self
    }

    /// History for `provider`'s `model` ("anthropic", "claude-sonnet-4-5"):
    /// reasoning only that model made (thinking, OpenAI reasoning items,
    /// signatures), no message left with only reasoning, every tool call
    /// paired with its result (the last message's calls kept while pending).
    /// [`reasoning`](Self::reasoning) widens or narrows what is kept.
    pub fn for_model(mut self, provider: impl Into<String>, model: impl Into<String>) -> Self {
        let target = self.request.target.get_or_insert_with(Default::default);
        target.provider = provider.into();
        target.model = model.into();
        self
    }

    /// Which reasoning an export [`for_model`](Self::for_model) keeps:
    /// the same model's (the default), the same provider's, or none.
    pub fn reasoning(mut self, policy: v1::ReasoningPolicy) -> Self {
        self.request
            .target
            .get_or_insert_with(Default::default)
            .reasoning = policy.into();
        self
    }

    /// The wire request.
    pub fn into_request(self) -> v1::ExportHistoryRequest {
        self.request
    }
}

impl From<&str> for ExportHistory {
    fn from(session_id: &str) -> Self {
        ExportHistory::new(session_id)
    }
}

impl From<String> for ExportHistory {
    fn from(session_id: String) -> Self {
        ExportHistory::new(session_id)
    }
}

impl From<&String> for ExportHistory {
    fn from(session_id: &String) -> Self {
        ExportHistory::new(session_id.clone())
    }
}

impl From<v1::ExportHistoryRequest> for ExportHistory {
    fn from(request: v1::ExportHistoryRequest) -> Self {
        ExportHistory { request }
    }
}

// ---------------------------------------------------------------------------
// ListSessions

/// Which sessions to list: by default all of the caller's, newest update
/// first.
///
/// ```
/// use sessionstore_client::ListSessions;
///
/// let alices = ListSessions::new().user("alice").page_size(200);
/// let weather = ListSessions::new().filter(r#"metadata.app = "weather""#);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListSessions {
    pub(crate) user: String,
    pub(crate) filter: String,
    pub(crate) page_size: i32,
}

impl ListSessions {
    /// All sessions, in pages of the server's default size.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only sessions whose `user` is this.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = user.into();
        self
    }

    /// Only sessions matching `filter`: `user = "…"` and
    /// `metadata.KEY = "…"` terms joined by `AND` (values double-quoted).
    pub fn filter(mut self, filter: impl Into<String>) -> Self {
        self.filter = filter.into();
        self
    }

    /// How many sessions to fetch per call (0: the server's default, 50;
    /// the server caps it at 1000). The stream follows the pages by itself.
    pub fn page_size(mut self, size: i32) -> Self {
        self.page_size = size;
        self
    }
}

// ---------------------------------------------------------------------------
// RequestApproval

/// A decision to ask for before a tool call of the history runs: the
/// session, the call (an OpenAI-style `ToolCall.id` or a `tool_use` block
/// id), and what the person deciding is shown.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use sessionstore_client::NewApproval;
///
/// let approval = NewApproval::new("ses_1", "call_rm_rf")
///     .title("Delete 2 files under /tmp?")
///     .detail_json(r#"{"paths": ["/tmp/a", "/tmp/b"]}"#)
///     .run_id("run_42")
///     .expire_time(SystemTime::now() + Duration::from_secs(600));
/// assert_eq!(approval.into_request().tool_call_id, "call_rm_rf");
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NewApproval {
    request: v1::RequestApprovalRequest,
}

impl NewApproval {
    /// An approval of `tool_call_id` in `session_id`, with no title,
    /// details, run or expiry.
    pub fn new(session_id: impl Into<String>, tool_call_id: impl Into<String>) -> Self {
        NewApproval {
            request: v1::RequestApprovalRequest {
                session_id: session_id.into(),
                tool_call_id: tool_call_id.into(),
                ..Default::default()
            },
        }
    }

    /// What to show the person deciding (at most 1,024 bytes).
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.request.title = title.into();
        self
    }

    /// Details for the decider, JSON the server keeps verbatim and never
    /// parses (at most 65,536 bytes).
    pub fn detail_json(mut self, detail_json: impl Into<String>) -> Self {
        self.request.detail_json = detail_json.into();
        self
    }

    /// The run asking (needed while that run holds the session's lease;
    /// [`Error::SessionBusy`](crate::Error::SessionBusy) while another
    /// does).
    pub fn run_id(mut self, run_id: impl Into<String>) -> Self {
        self.request.run_id = run_id.into();
        self
    }

    /// When the request expires unless decided; it must be in the future.
    /// The server records the expiry within 10 s (`approval_decided`, state
    /// `EXPIRED`), and the call may then be asked about again.
    pub fn expire_time(mut self, time: SystemTime) -> Self {
        self.request.expire_time = Some(prost_types::Timestamp::from(time));
        self
    }

    /// The wire request.
    pub fn into_request(self) -> v1::RequestApprovalRequest {
        self.request
    }
}

impl From<NewApproval> for v1::RequestApprovalRequest {
    fn from(approval: NewApproval) -> Self {
        approval.into_request()
    }
}

// ---------------------------------------------------------------------------
// ListApprovals

/// Which approvals to list: by default every approval of the caller's
/// tenant, oldest first.
///
/// ```
/// use sessionstore_client::ListApprovals;
/// use sessionstore_client::v1::ApprovalState;
///
/// let waiting = ListApprovals::new().state(ApprovalState::Pending);
/// let this_chat = ListApprovals::new().session_id("ses_1").page_size(100);
/// let alices = ListApprovals::new().user("alice");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListApprovals {
    pub(crate) session_id: String,
    pub(crate) user: String,
    pub(crate) state: v1::ApprovalState,
    pub(crate) page_size: i32,
}

impl ListApprovals {
    /// All approvals, in pages of the server's default size.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only this session's.
    pub fn session_id(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = session_id.into();
        self
    }

    /// Only those of sessions whose `user` is this.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = user.into();
        self
    }

    /// Only approvals in this state (`Unspecified`: any).
    pub fn state(mut self, state: v1::ApprovalState) -> Self {
        self.state = state;
        self
    }

    /// How many approvals to fetch per call (0: the server's default, 50;
    /// the server caps it at 1000). The stream follows the pages by itself.
    pub fn page_size(mut self, size: i32) -> Self {
        self.page_size = size;
        self
    }

    /// The wire request for the first page.
    pub fn into_request(self) -> v1::ListApprovalsRequest {
        v1::ListApprovalsRequest {
            session_id: self.session_id,
            user: self.user,
            state: self.state.into(),
            page_size: self.page_size,
            page_token: String::new(),
        }
    }
}

// ---------------------------------------------------------------------------
// SubmitInput

/// Input typed while a session may be busy (`SubmitInput`): its messages
/// (1 to 100, typically one user message) and what to do if a run holds
/// the session or inputs wait in its queue — [`InputMode::Queue`] (the
/// default), [`InputMode::Interrupt`] or [`InputMode::Reject`].
///
/// Like an [`Exchange`], every `NewInput` carries an idempotency key, its
/// `request_id`, made when the input is created (a UUIDv7) unless you set
/// your own. The client sends it on every attempt, so
/// [`Client::submit_input`](crate::Client::submit_input) is retried on
/// transient failures, and sending the same `NewInput` again answers the
/// first submission instead of queueing twice.
///
/// [`InputMode::Queue`]: v1::InputMode::Queue
/// [`InputMode::Interrupt`]: v1::InputMode::Interrupt
/// [`InputMode::Reject`]: v1::InputMode::Reject
///
/// ```
/// use sessionstore_client::NewInput;
/// use sessionstore_client::v1::{InputMode, Message};
///
/// let input = NewInput::new("ses_1")
///     .message(Message::user("Actually, make it a haiku"))
///     .mode(InputMode::Interrupt);
/// assert!(!input.request_id().is_empty());
/// assert_eq!(input.as_request().mode(), InputMode::Interrupt);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct NewInput {
    request: v1::SubmitInputRequest,
}

impl NewInput {
    /// An input for `session_id` without messages yet, mode
    /// [`Queue`](v1::InputMode::Queue), with a fresh `request_id`.
    pub fn new(session_id: impl Into<String>) -> Self {
        NewInput {
            request: v1::SubmitInputRequest {
                session_id: session_id.into(),
                mode: v1::InputMode::Queue.into(),
                request_id: new_request_id(),
                ..Default::default()
            },
        }
    }

    /// Adds a message (a user turn, usually).
    pub fn message(mut self, message: v1::Message) -> Self {
        self.request.messages.push(message);
        self
    }

    /// Adds messages; they are taken into the history together, in order.
    pub fn messages(mut self, messages: impl IntoIterator<Item = v1::Message>) -> Self {
        self.request.messages.extend(messages);
        self
    }

    /// What to do while the session is busy: queue the input
    /// ([`Queue`](v1::InputMode::Queue), the default), queue it and ask the
    /// run holding the lease to stop as `CancelRun` would
    /// ([`Interrupt`](v1::InputMode::Interrupt)), or refuse it with
    /// [`Error::SessionBusy`](crate::Error::SessionBusy)
    /// ([`Reject`](v1::InputMode::Reject)). A session that is not busy
    /// takes the input at once in every mode.
    pub fn mode(mut self, mode: v1::InputMode) -> Self {
        self.request.mode = mode.into();
        self
    }

    /// Uses your own idempotency key instead of the generated one, e.g. one
    /// derived from your own request id so that a retry after a crash of
    /// your process is still recognised. Keys are per session.
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request.request_id = request_id.into();
        self
    }

    /// The idempotency key sent with every attempt.
    pub fn request_id(&self) -> &str {
        &self.request.request_id
    }

    /// The session the input is for.
    pub fn session_id(&self) -> &str {
        &self.request.session_id
    }

    /// The wire request.
    pub fn as_request(&self) -> &v1::SubmitInputRequest {
        &self.request
    }

    /// The wire request.
    pub fn into_request(self) -> v1::SubmitInputRequest {
        self.request
    }
}

impl From<v1::SubmitInputRequest> for NewInput {
    /// Wraps a wire request, giving it a fresh `request_id` if it has none.
    fn from(mut request: v1::SubmitInputRequest) -> Self {
        if request.request_id.is_empty() {
            request.request_id = new_request_id();
        }
        NewInput { request }
    }
}

impl From<NewInput> for v1::SubmitInputRequest {
    fn from(input: NewInput) -> Self {
        input.into_request()
    }
}
