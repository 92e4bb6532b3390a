//! The domain's data types. They mirror the API's resources but carry no
//! protobuf or SQL: the gRPC layer converts at the edge, storage encodes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::approvals::Approval;
use super::queue::QueuedInput;

/// String metadata, ordered so that encodings (and fingerprints) are stable.
pub type Metadata = BTreeMap<String, String>;

/// Microseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// Whether it is unset (0).
    #[allow(
        clippy::trivially_copy_pass_by_ref,
        reason = "serde passes a reference"
    )]
    pub fn is_unset(&self) -> bool {
        self.0 == 0
    }

    /// The current wall-clock time.
    pub fn now() -> Self {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(i64::try_from(since_epoch.as_micros()).unwrap_or(i64::MAX))
    }
}

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
    Developer,
}

/// One conversation entry, kept losslessly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub content_blocks: Vec<ContentBlock>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool_call_id: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_error: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: Metadata,
    /// Cut short: what its run produced before it was stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incomplete: bool,
}

impl Message {
    /// A message with only a role and text.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            content_blocks: Vec::new(),
            tool_calls: Vec::new(),
            tool_call_id: String::new(),
            tool_error: false,
            name: String::new(),
            metadata: Metadata::new(),
            incomplete: false,
        }
    }

    /// The tool-call ids this message answers (a `tool` message's
    /// `tool_call_id`, and any `tool_result` blocks).
    pub fn answered_tool_calls(&self) -> impl Iterator<Item = &str> {
        let by_role = (self.role == Role::Tool && !self.tool_call_id.is_empty())
            .then_some(self.tool_call_id.as_str());
        let by_block = self.content_blocks.iter().filter_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        });
        by_role.into_iter().chain(by_block)
    }

    /// Whether this message is a tool result (and so needs its tool call before it).
    pub fn is_tool_result(&self) -> bool {
        self.role == Role::Tool || self.answered_tool_calls().next().is_some()
    }

    /// Whether this message makes the tool call with the given id.
    pub fn makes_tool_call(&self, id: &str) -> bool {
        self.tool_calls.iter().any(|c| c.id == id)
            || self
                .content_blocks
                .iter()
                .any(|b| matches!(b, ContentBlock::ToolUse { id: use_id, .. } if use_id == id))
    }
}

/// One structured piece of a message. JSON-carrying strings (`input`, `json`)
/// are kept verbatim and never parsed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
        /// A provider signature bound to the part (reasoning).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        signature: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
    Image {
        media_type: String,
        url: String,
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
    ToolUse {
        id: String,
        name: String,
        input: String,
        /// A provider signature bound to the part (reasoning).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        signature: String,
    },
    ToolResult {
        tool_use_id: String,
        content: String,
        is_error: bool,
    },
    Json {
        #[serde(rename = "type")]
        kind: String,
        json: String,
    },
}

/// An OpenAI-style tool call; `arguments` is kept verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// A provider signature bound to the call (reasoning).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
}

/// A session's own fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub title: String,
    pub system_prompt: String,
    pub user: String,
    pub metadata: Metadata,
    pub summary_message_id: String,
    pub revision: i64,
    pub create_time: Timestamp,
    pub update_time: Timestamp,
    /// For a fork: the session it was forked from, and the last sequence copied.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_session_id: String,
    #[serde(default)]
    pub parent_sequence: i64,
    /// The run holding the session's lease, if any, and when the lease runs out.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub active_run_id: String,
    #[serde(default)]
    pub run_expire_time: Timestamp,
    /// The sequence the next message will get.
    #[serde(default)]
    pub next_sequence: i64,
    /// When the session expires (0: never).
    #[serde(default, skip_serializing_if = "Timestamp::is_unset")]
    pub expire_time: Timestamp,
}

impl Session {
    /// Whether it has expired by `now`: reads and writes treat it as gone.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expire_time.0 > 0 && self.expire_time <= now
    }

    /// Clears a lease that has run out by `now` but is not settled yet
    /// (for reads: the session is no longer busy).
    pub fn hide_expired_lease(&mut self, now: Timestamp) {
        if self.run_expire_time <= now {
            self.active_run_id.clear();
            self.run_expire_time = Timestamp(0);
        }
    }
}

/// A message as stored in a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub id: String,
    pub session_id: String,
    pub sequence: i64,
    pub produced_by_call_id: String,
    pub message: Message,
    pub create_time: Timestamp,
    /// The content was erased; only the role and structure remain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
}

/// What one upstream model call cost and how it was routed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderCall {
    pub id: String,
    pub session_id: String,
    pub request_id: String,
    pub provider: String,
    pub model: String,
    pub requested_provider: String,
    pub requested_model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub total_tokens: i64,
    pub cost_micros_usd: i64,
    pub create_time: Timestamp,
    /// The billing buckets beside the totals (parts of `prompt_tokens` and
    /// `completion_tokens`), the provider's usage object verbatim, and the
    /// call's wall time. Left out of the JSON forms when unset, so calls
    /// without them encode (and fingerprint) as they always have.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_creation_input_tokens: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub usage_json: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duration_micros: i64,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde passes a reference"
)]
fn is_zero(value: &i64) -> bool {
    *value == 0
}

/// A session with the figures a listing shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    pub session: Session,
    pub message_count: i64,
    pub provider_call_count: i64,
    pub last_model: String,
    pub last_provider: String,
    pub last_cost_micros_usd: i64,
    pub last_request_id: String,
    pub total_tokens: i64,
    pub total_cost_micros_usd: i64,
}

/// A committed change to a session: one revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEvent {
    pub revision: i64,
    pub time: Timestamp,
    pub change: Change,
}

/// What a revision changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    SessionCreated {
        session: Session,
        messages: Vec<StoredMessage>,
        /// Its initial state entries, if any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        state: Vec<StateEntry>,
    },
    ExchangeAppended(AppendedExchange),
    SessionUpdated {
        session: Session,
    },
    SessionDeleted,
    /// A run took or renewed the lease.
    RunBegun {
        run_id: String,
        expire_time: Timestamp,
    },
    /// A run's lease ended (by EndRun, or `expired`).
    RunEnded {
        run_id: String,
        expired: bool,
    },
    /// CancelRun asked a run to stop.
    RunCancelRequested {
        run_id: String,
        reason: String,
    },
    /// Messages after `after_sequence` were removed.
    RolledBack {
        after_sequence: i64,
        removed_message_ids: Vec<String>,
        next_sequence: i64,
        summary_cleared: bool,
    },
    /// A message got new content; `previous` is what it held before.
    MessageEdited {
        message: StoredMessage,
        previous: Message,
        reason: String,
    },
    /// A message's content was erased.
    MessageRedacted {
        message_id: String,
        sequence: i64,
        reason: String,
    },
    /// A state entry was set, or deleted.
    StateChanged {
        key: String,
        value: String,
        version: i64,
        deleted: bool,
    },
    /// A tool call awaits a decision.
    ApprovalRequested {
        approval: Approval,
    },
    /// An approval was decided, or expired; a denial's tool result was
    /// appended in the same revision.
    ApprovalDecided {
        approval: Approval,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_result: Option<StoredMessage>,
        next_sequence: i64,
    },
    /// Input was queued while the session was busy.
    InputQueued {
        input: QueuedInput,
    },
    /// A queued input was moved into the history by the run holding the
    /// lease.
    InputTaken {
        input_id: String,
        position: i64,
        run_id: String,
        messages: Vec<StoredMessage>,
        next_sequence: i64,
    },
    /// A queued input was withdrawn.
    InputWithdrawn {
        input_id: String,
        position: i64,
    },
}

/// A change watchers see but that is never stored and makes no revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ephemeral {
    /// The session's revision when it was published.
    pub revision: i64,
    pub time: Timestamp,
    pub kind: EphemeralKind,
}

/// What an [`Ephemeral`] says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EphemeralKind {
    /// A run's partial output: the delta at `index`, or, when
    /// `merged_from` is set, the text deltas `merged_from..=index` merged
    /// into one.
    Delta {
        run_id: String,
        index: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        merged_from: Option<i64>,
        content: DeltaContent,
    },
    /// Drop the run's partial output.
    RunDiscarded { run_id: String },
}

impl EphemeralKind {
    /// The run it concerns.
    pub fn run_id(&self) -> &str {
        match self {
            EphemeralKind::Delta { run_id, .. } | EphemeralKind::RunDiscarded { run_id } => run_id,
        }
    }
}

/// The payload of a delta.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaContent {
    Text(String),
    Block(ContentBlock),
}

impl DeltaContent {
    /// Its size in bytes, as the run buffer counts it: a text's UTF-8
    /// length, a block's JSON length.
    pub fn size(&self) -> usize {
        match self {
            DeltaContent::Text(text) => text.len(),
            DeltaContent::Block(block) => serde_json::to_vec(block).map_or(usize::MAX, |b| b.len()),
        }
    }
}

/// A state change an exchange makes, in its own revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChange {
    /// `""`: the session's own state; else a shared scope of the tenant.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete: bool,
}

/// A key/value state entry: of a session, or of a shared scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateEntry {
    /// `""`: the session's own; else the shared scope it belongs to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    pub key: String,
    pub value: String,
    /// A session's entry: the revision that last wrote it. A shared
    /// entry: how many times it has been written.
    pub version: i64,
    pub update_time: Timestamp,
}

/// One full-text search result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchHit {
    pub session_id: String,
    pub session_title: String,
    pub sequence: i64,
    pub message_id: String,
    pub role: Role,
    pub snippet: String,
}

/// The outcome of one AppendExchange: what was stored, at which revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendedExchange {
    pub messages: Vec<StoredMessage>,
    pub provider_call: Option<ProviderCall>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run_id: String,
    pub next_sequence: i64,
    /// The state changes the exchange made, as requested.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_changes: Vec<StateChange>,
    /// The time of the revision (the event's own time: never stored here).
    #[serde(skip)]
    pub update_time: Timestamp,
    /// The answer to a retried request: the first attempt's result, read
    /// back, with nothing written this time. Never stored.
    #[serde(skip)]
    pub replayed: bool,
    /// The append's `create_if_missing` created the session in the same
    /// transaction. Never stored.
    #[serde(skip)]
    pub session_created: bool,
}

/// Serde helper: bytes as a base64 string (compact in JSON).
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}
