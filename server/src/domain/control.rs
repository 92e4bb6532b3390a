//! Conversation control: run leases, rollback, edit and redaction, forks,
//! per-session state and live deltas. The requests and the rules that need
//! no stored state; storage applies them.

use serde::Serialize;

use super::digest::RequestKey;
use super::fields::{
    MAX_KEY_LEN, check_len, check_request_id, check_scope_name, check_state_entry, check_state_key,
    validate_new_session_id,
};
use super::queue::Submitted;
use super::{DeltaContent, Error, Message, Result, StateEntry, StoredMessage, Timestamp};

/// The longest lease a run may take at once (it can renew).
pub const MAX_LEASE_MICROS: i64 = 24 * 3600 * 1_000_000;
/// The longest edit or redaction reason.
pub const MAX_REASON_LEN: usize = 1024;
/// The largest delta payload.
pub const MAX_DELTA_BYTES: usize = 256 * 1024;

/// A change to one existing session, applied as (at most) one revision,
/// with an answer of its own type. Storage applies each through an
/// [`Applier`], so every control reaches exactly the storage step made for
/// it and its caller gets exactly its own kind of answer.
pub trait ControlOp: Clone + Send + Sync + 'static {
    type Reply: Send + 'static;

    /// Checks the rules that need no stored state.
    fn validate(&self) -> Result<()>;

    /// The run a transcript-changing control acts for, if it is one: such
    /// controls are refused while another run holds the lease.
    fn transcript_run(&self) -> Option<&str> {
        None
    }

    /// Its idempotency key, for a control that takes a `request_id`: a
    /// retry with the same key and body gets the first answer, kept with
    /// the key.
    fn request_key(&self) -> Option<RequestKey> {
        None
    }

    /// The answer to keep with the control's idempotency key, when the
    /// event log cannot give it back (a rollback's removed messages).
    fn keep(_reply: &Self::Reply) -> Option<KeptReply> {
        None
    }

    /// The first answer, from what its key kept (`None`: nothing was).
    fn kept(_reply: KeptReply) -> Option<Self::Reply> {
        None
    }

    /// Applies the control through `applier`'s step for it.
    fn apply<A: Applier>(self, applier: &mut A)
    -> impl Future<Output = Result<Self::Reply>> + Send;
}

/// A control's answer as its idempotency key keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeptReply {
    RolledBack(RolledBack),
    Submitted(Submitted),
}

/// Storage's step for each control, on a session it has loaded.
pub trait Applier: Send {
    fn begin_run(&mut self, control: BeginRun) -> impl Future<Output = Result<RunBegun>> + Send;
    fn end_run(&mut self, control: EndRun) -> impl Future<Output = Result<i64>> + Send;
    fn cancel_run(&mut self, control: CancelRun) -> impl Future<Output = Result<i64>> + Send;
    fn rollback(&mut self, control: Rollback) -> impl Future<Output = Result<RolledBack>> + Send;
    fn edit(&mut self, control: Edit) -> impl Future<Output = Result<Edited>> + Send;
    fn redact(&mut self, control: Redact) -> impl Future<Output = Result<i64>> + Send;
    fn set_state(&mut self, control: SetState) -> impl Future<Output = Result<StateEntry>> + Send;
    fn delete_state(&mut self, control: DeleteState) -> impl Future<Output = Result<i64>> + Send;
    /// The session's revision after settling an expired lease (done on
    /// loading it).
    fn revision(&mut self) -> i64;
}

/// Take or renew the session's lease for `lease_micros`.
#[derive(Clone, Debug)]
pub struct BeginRun {
    pub run_id: String,
    pub lease_micros: i64,
}

/// A lease taken: its revision and when it runs out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunBegun {
    pub revision: i64,
    pub expire_time: Timestamp,
}

/// Give up the lease, if `run_id` holds it. Answers the session's revision.
#[derive(Clone, Debug)]
pub struct EndRun {
    pub run_id: String,
}

/// Ask a run to stop. Answers the revision recording the cancel (the first
/// one, for a run cancelled before).
#[derive(Clone, Debug)]
pub struct CancelRun {
    pub run_id: String,
    pub reason: String,
    /// The run has published deltas this replica still holds (it is
    /// active even without a lease).
    pub publishing: bool,
}

/// Remove messages with a greater sequence (-1: all of them), if the
/// session's next sequence is `expected_next_sequence` (when given);
/// answer the removed messages if `return_removed`.
#[derive(Clone, Debug, Serialize)]
pub struct Rollback {
    pub after_sequence: i64,
    pub run_id: String,
    pub expected_next_sequence: Option<i64>,
    pub return_removed: bool,
    /// Instead of `after_sequence` (then 0): the last this many messages.
    pub remove_last: i64,
    /// Idempotency key (empty: none). Not part of the fingerprint.
    #[serde(skip)]
    pub request_id: String,
}

impl Rollback {
    /// The sequence after which messages go, for a session whose next
    /// sequence is `next_sequence`.
    pub fn after(&self, next_sequence: i64) -> i64 {
        if self.remove_last > 0 {
            next_sequence.saturating_sub(self.remove_last).max(0) - 1
        } else {
            self.after_sequence
        }
    }
}

/// What a rollback left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolledBack {
    /// The session's revision (unchanged if nothing was removed).
    pub revision: i64,
    pub next_sequence: i64,
    /// The removed messages, in sequence order, if asked for.
    pub removed: Vec<StoredMessage>,
}

/// Replace a message's content.
#[derive(Clone, Debug)]
pub struct Edit {
    pub message_id: String,
    pub message: Message,
    pub reason: String,
    pub run_id: String,
}

/// Erase a message's content, here and in the event history. Answers the
/// revision recording it.
#[derive(Clone, Debug)]
pub struct Redact {
    pub message_id: String,
    pub reason: String,
    pub run_id: String,
}

/// An edited message, at its new revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edited {
    pub revision: i64,
    pub message: StoredMessage,
}

/// Set a state entry. Answers the entry written.
#[derive(Clone, Debug)]
pub struct SetState {
    pub key: String,
    pub value: String,
    pub expected_version: Option<i64>,
}

/// Delete a state entry. Answers the revision recording it.
#[derive(Clone, Debug)]
pub struct DeleteState {
    pub key: String,
    pub expected_version: Option<i64>,
}

/// Record an expired lease, if there is one (the sweeper's call). Answers
/// the session's revision.
#[derive(Clone, Copy, Debug)]
pub struct SettleLease;

impl ControlOp for BeginRun {
    type Reply = RunBegun;

    fn validate(&self) -> Result<()> {
        require_run_id(&self.run_id)?;
        if self.lease_micros <= 0 {
            return Err(Error::invalid("lease", "must be positive"));
        }
        if self.lease_micros > MAX_LEASE_MICROS {
            return Err(Error::invalid(
                "lease",
                "must be at most 24 hours (renew it with another BeginRun)",
            ));
        }
        Ok(())
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<RunBegun>> + Send {
        applier.begin_run(self)
    }
}

impl ControlOp for EndRun {
    type Reply = i64;

    fn validate(&self) -> Result<()> {
        require_run_id(&self.run_id)
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<i64>> + Send {
        applier.end_run(self)
    }
}

impl ControlOp for CancelRun {
    type Reply = i64;

    fn validate(&self) -> Result<()> {
        require_run_id(&self.run_id)?;
        check_reason(&self.reason)
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<i64>> + Send {
        applier.cancel_run(self)
    }
}

impl ControlOp for Rollback {
    type Reply = RolledBack;

    fn validate(&self) -> Result<()> {
        if self.after_sequence < -1 {
            return Err(Error::invalid("after_sequence", "must be at least -1"));
        }
        if self.remove_last < 0 {
            return Err(Error::invalid("remove_last", "must not be negative"));
        }
        if self.remove_last > 0 && self.after_sequence != 0 {
            return Err(Error::invalid(
                "after_sequence",
                "must be 0 with remove_last: give one or the other",
            ));
        }
        if self.expected_next_sequence.is_some_and(|e| e < 0) {
            return Err(Error::invalid(
                "expected_next_sequence",
                "must not be negative",
            ));
        }
        check_request_id("request_id", &self.request_id)?;
        optional_run_id(&self.run_id)
    }

    fn transcript_run(&self) -> Option<&str> {
        Some(&self.run_id)
    }

    fn request_key(&self) -> Option<RequestKey> {
        RequestKey::of("RollbackSession", &self.request_id, self)
    }

    fn keep(reply: &RolledBack) -> Option<KeptReply> {
        Some(KeptReply::RolledBack(reply.clone()))
    }

    fn kept(reply: KeptReply) -> Option<RolledBack> {
        match reply {
            KeptReply::RolledBack(rolled) => Some(rolled),
            KeptReply::Submitted(_) => None,
        }
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<RolledBack>> + Send {
        applier.rollback(self)
    }
}

impl ControlOp for Edit {
    type Reply = Edited;

    fn validate(&self) -> Result<()> {
        check_message_change(&self.message_id, &self.reason, &self.run_id)
    }

    fn transcript_run(&self) -> Option<&str> {
        Some(&self.run_id)
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<Edited>> + Send {
        applier.edit(self)
    }
}

impl ControlOp for Redact {
    type Reply = i64;

    fn validate(&self) -> Result<()> {
        check_message_change(&self.message_id, &self.reason, &self.run_id)
    }

    fn transcript_run(&self) -> Option<&str> {
        Some(&self.run_id)
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<i64>> + Send {
        applier.redact(self)
    }
}

impl ControlOp for SetState {
    type Reply = StateEntry;

    fn validate(&self) -> Result<()> {
        check_state_entry("key", &self.key, "value", &self.value)?;
        check_expected_version(self.expected_version)
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<StateEntry>> + Send {
        applier.set_state(self)
    }
}

impl ControlOp for DeleteState {
    type Reply = i64;

    fn validate(&self) -> Result<()> {
        check_state_key(&self.key)?;
        check_expected_version(self.expected_version)
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<i64>> + Send {
        applier.delete_state(self)
    }
}

impl ControlOp for SettleLease {
    type Reply = i64;

    fn validate(&self) -> Result<()> {
        Ok(())
    }

    fn apply<A: Applier>(self, applier: &mut A) -> impl Future<Output = Result<i64>> + Send {
        std::future::ready(Ok(applier.revision()))
    }
}

/// A ForkSession request.
#[derive(Clone, Debug)]
pub struct Fork {
    pub source_id: String,
    /// The last sequence copied (-1: none).
    pub at_sequence: i64,
    pub new_id: Option<String>,
}

impl Fork {
    pub fn validate(&self) -> Result<()> {
        if self.at_sequence < -1 {
            return Err(Error::invalid("at_sequence", "must be at least -1"));
        }
        if let Some(id) = &self.new_id {
            validate_new_session_id("new_session_id", id)?;
        }
        Ok(())
    }
}

/// Checks a PublishDelta request's own fields.
pub fn validate_delta(run_id: &str, index: i64, content: Option<&DeltaContent>) -> Result<()> {
    require_run_id(run_id)?;
    if index < 0 {
        return Err(Error::invalid("index", "must not be negative"));
    }
    let Some(content) = content else {
        return Err(Error::invalid("text", "a delta needs text or a block"));
    };
    if content.size() > MAX_DELTA_BYTES {
        return Err(Error::LimitExceeded {
            field: "text".into(),
            limit: "max_delta_bytes",
            description: format!("a delta must be at most {MAX_DELTA_BYTES} bytes"),
        });
    }
    Ok(())
}

/// Checks a required run id.
pub fn require_run_id(run_id: &str) -> Result<()> {
    check_len("run_id", run_id, MAX_KEY_LEN, true)
}

fn optional_run_id(run_id: &str) -> Result<()> {
    check_len("run_id", run_id, MAX_KEY_LEN, false)
}

/// An edit's or a redaction's own fields: the message, the reason, the run.
fn check_message_change(message_id: &str, reason: &str, run_id: &str) -> Result<()> {
    require_message_id(message_id)?;
    check_reason(reason)?;
    optional_run_id(run_id)
}

fn require_message_id(id: &str) -> Result<()> {
    check_len("message_id", id, MAX_KEY_LEN, true)
}

fn check_reason(reason: &str) -> Result<()> {
    check_len("reason", reason, MAX_REASON_LEN, false)
}

/// Checks a shared state scope (`[A-Za-z0-9_.:/-]`, 1–256 bytes), and
/// that the request names no session beside it (`session_id` empty).
pub fn check_shared_scope(scope: &str, session_id: &str) -> Result<()> {
    check_scope_name("scope", scope)?;
    if !session_id.is_empty() {
        return Err(Error::invalid(
            "session_id",
            "must be empty with a shared scope: a scope belongs to no session",
        ));
    }
    Ok(())
}

/// Checks an `expected_version`: 0 (must not exist) or more.
pub fn check_expected_version(expected: Option<i64>) -> Result<()> {
    if expected.is_some_and(|v| v < 0) {
        return Err(Error::invalid("expected_version", "must not be negative"));
    }
    Ok(())
}

/// The message a redaction leaves: the role and tool-call structure (ids
/// and names, with `{}` arguments, so the transcript stays valid for a
/// model API), nothing else.
pub fn redacted(message: &Message) -> Message {
    let mut marker = Message::text(message.role, "");
    marker.tool_call_id = message.tool_call_id.clone();
    marker.tool_calls = message
        .tool_calls
        .iter()
        .map(|call| super::ToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: "{}".to_owned(),
            signature: String::new(),
        })
        .collect();
    marker
}

/// The words a message is found by: its text, text blocks, tool results and
/// tool arguments (thinking and opaque blocks are not searched). U+0000
/// becomes a space.
pub fn search_text(message: &Message) -> String {
    use super::ContentBlock;
    let mut parts: Vec<&str> = vec![&message.content];
    for block in &message.content_blocks {
        match block {
            ContentBlock::Text { text, .. } => parts.push(text),
            ContentBlock::ToolUse { name, input, .. } => parts.extend([name.as_str(), input]),
            ContentBlock::ToolResult { content, .. } => parts.push(content),
            _ => {}
        }
    }
    for call in &message.tool_calls {
        parts.extend([call.name.as_str(), &call.arguments]);
    }
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
        .replace('\0', " ")
}

/// Erases message `message_id` wherever `change` carries its content.
/// Returns whether anything changed.
pub fn scrub(change: &mut super::Change, message_id: &str) -> bool {
    use super::Change;
    let erase = |stored: &mut StoredMessage| {
        stored.message = redacted(&stored.message);
        stored.redacted = true;
    };
    let mut changed = false;
    match change {
        Change::SessionCreated { messages, .. } => {
            for stored in messages.iter_mut().filter(|m| m.id == message_id) {
                erase(stored);
                changed = true;
            }
        }
        Change::ExchangeAppended(appended) => {
            for stored in appended.messages.iter_mut().filter(|m| m.id == message_id) {
                erase(stored);
                changed = true;
            }
        }
        Change::MessageEdited {
            message, previous, ..
        } if message.id == message_id => {
            erase(message);
            *previous = redacted(previous);
            changed = true;
        }
        // A denial's tool result, appended with the decision.
        Change::ApprovalDecided {
            tool_result: Some(stored),
            ..
        } if stored.id == message_id => {
            erase(stored);
            changed = true;
        }
        _ => {}
    }
    changed
}
