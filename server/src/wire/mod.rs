//! Conversions between the wire types (`sessionstore.v1`) and the domain.
//! Incoming conversions validate and name the offending field. The event
//! log stores events in this form too ([`EncodedEvent`]).

mod event;
mod fields;
mod kept;
mod outline;

pub use event::{Effect, EncodedEvent, event_from_pb};
pub use kept::{
    decode_kept, decode_queued_input, decode_stored_message, encode_kept, encode_queued_input,
    encode_stored_message,
};
pub use outline::{Outline, outline, without_reasoning};

use sessionstore_client::v1 as pb;
use sessionstore_client::v1::content_block::Block;

use crate::domain::approvals::{
    Approval, ApprovalState, DecideApproval, Decision, RequestApproval,
};
use crate::domain::queue::{InputMode, QueuedInput, SubmitInput};
use crate::domain::target::{ExportTarget, ReasoningPolicy};
use crate::domain::usage::UsageGroup;
use crate::domain::{
    AppendedExchange, Change, ContentBlock, DeltaContent, Ephemeral, EphemeralKind, Error, Message,
    NewExchange, NewSession, ProviderCall, Result, Role, SearchHit, Session, SessionEvent,
    SessionSummary, StateChange, StateEntry, StoredMessage, Timestamp, ToolCall,
};

pub fn timestamp(t: Timestamp) -> prost_types::Timestamp {
    let micros = t.0;
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        // In 0..1e9, so it fits.
        nanos: i32::try_from(micros.rem_euclid(1_000_000) * 1000).unwrap_or(0),
    }
}

fn role_from_pb(role: i32, field: &str) -> Result<Role> {
    match pb::Role::try_from(role) {
        Ok(pb::Role::System) => Ok(Role::System),
        Ok(pb::Role::User) => Ok(Role::User),
        Ok(pb::Role::Assistant) => Ok(Role::Assistant),
        Ok(pb::Role::Tool) => Ok(Role::Tool),
        Ok(pb::Role::Developer) => Ok(Role::Developer),
        Ok(pb::Role::Unspecified) => Err(Error::invalid(
            format!("{field}.role"),
            "is required (ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL or ROLE_DEVELOPER)",
        )),
        Err(_) => Err(Error::invalid(
            format!("{field}.role"),
            format!("{role} is not a known role"),
        )),
    }
}

/// A timestamp that is present only when set (0 means unset).
fn optional_timestamp(t: Timestamp) -> Option<prost_types::Timestamp> {
    (t.0 != 0).then(|| timestamp(t))
}

/// A `google.protobuf.Duration` in microseconds, saturating.
/// A timestamp field as microseconds since the epoch, refusing one out of range.
pub fn timestamp_micros(field: &str, time: &prost_types::Timestamp) -> Result<i64> {
    if !(0..1_000_000_000).contains(&time.nanos) {
        return Err(Error::invalid(field, "nanos must be within 0..999,999,999"));
    }
    time.seconds
        .checked_mul(1_000_000)
        .and_then(|micros| micros.checked_add(i64::from(time.nanos / 1000)))
        .ok_or_else(|| Error::invalid(field, "is out of range"))
}

/// One SummarizeUsage row.
pub fn usage_row_to_pb(row: crate::domain::usage::UsageRow) -> pb::UsageRow {
    pb::UsageRow {
        key: row.key,
        calls: row.calls,
        prompt_tokens: row.prompt_tokens,
        completion_tokens: row.completion_tokens,
        cached_input_tokens: row.cached_input_tokens,
        cache_creation_input_tokens: row.cache_creation_input_tokens,
        reasoning_tokens: row.reasoning_tokens,
        total_tokens: row.total_tokens,
        cost_micros_usd: row.cost_micros_usd,
    }
}

/// Microseconds as a `Duration` field; unset for 0.
pub fn duration_from_micros(micros: i64) -> Option<prost_types::Duration> {
    (micros != 0).then(|| prost_types::Duration {
        seconds: micros.div_euclid(1_000_000),
        nanos: i32::try_from(micros.rem_euclid(1_000_000) * 1000).unwrap_or(0),
    })
}

pub fn duration_micros(duration: &prost_types::Duration) -> i64 {
    duration
        .seconds
        .saturating_mul(1_000_000)
        .saturating_add(i64::from(duration.nanos / 1000))
}

fn role_to_pb(role: Role) -> pb::Role {
    match role {
        Role::System => pb::Role::System,
        Role::User => pb::Role::User,
        Role::Assistant => pb::Role::Assistant,
        Role::Tool => pb::Role::Tool,
        Role::Developer => pb::Role::Developer,
    }
}

fn block_from_pb(block: pb::ContentBlock, field: &str) -> Result<ContentBlock> {
    Ok(match block.block {
        None => {
            return Err(Error::invalid(
                field,
                "is empty: set one of text, thinking, redacted_thinking, image, tool_use, tool_result, json",
            ));
        }
        Some(Block::Text(b)) => ContentBlock::Text {
            text: b.text,
            signature: b.signature,
        },
        Some(Block::Thinking(b)) => ContentBlock::Thinking {
            thinking: b.thinking,
            signature: b.signature,
        },
        Some(Block::RedactedThinking(b)) => ContentBlock::RedactedThinking { data: b.data },
        Some(Block::Image(b)) => ContentBlock::Image {
            media_type: b.media_type,
            url: b.url,
            data: b.data,
        },
        Some(Block::ToolUse(b)) => ContentBlock::ToolUse {
            id: b.id,
            name: b.name,
            input: b.input,
            signature: b.signature,
        },
        Some(Block::ToolResult(b)) => ContentBlock::ToolResult {
            tool_use_id: b.tool_use_id,
            content: b.content,
            is_error: b.is_error,
        },
        Some(Block::Json(b)) => ContentBlock::Json {
            kind: b.r#type,
            json: b.json,
        },
    })
}

fn block_to_pb(block: ContentBlock) -> pb::ContentBlock {
    let block = match block {
        ContentBlock::Text { text, signature } => Block::Text(pb::TextBlock { text, signature }),
        ContentBlock::Thinking {
            thinking,
            signature,
        } => Block::Thinking(pb::ThinkingBlock {
            thinking,
            signature,
        }),
        ContentBlock::RedactedThinking { data } => {
            Block::RedactedThinking(pb::RedactedThinkingBlock { data })
        }
        ContentBlock::Image {
            media_type,
            url,
            data,
        } => Block::Image(pb::ImageBlock {
            media_type,
            url,
            data,
        }),
        ContentBlock::ToolUse {
            id,
            name,
            input,
            signature,
        } => Block::ToolUse(pb::ToolUseBlock {
            id,
            name,
            input,
            signature,
        }),
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => Block::ToolResult(pb::ToolResultBlock {
            tool_use_id,
            content,
            is_error,
        }),
        ContentBlock::Json { kind, json } => Block::Json(pb::JsonBlock { r#type: kind, json }),
    };
    pb::ContentBlock { block: Some(block) }
}

/// Converts one message; `field` names it in errors, e.g. `messages[2]`.
pub fn message_from_pb(message: pb::Message, field: &str) -> Result<Message> {
    let role = role_from_pb(message.role, field)?;
    let content_blocks = message
        .content_blocks
        .into_iter()
        .enumerate()
        .map(|(i, b)| block_from_pb(b, &format!("{field}.content_blocks[{i}]")))
        .collect::<Result<_>>()?;
    Ok(Message {
        role,
        content: message.content,
        content_blocks,
        tool_calls: message
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.name,
                arguments: c.arguments,
                signature: c.signature,
            })
            .collect(),
        tool_call_id: message.tool_call_id,
        tool_error: message.tool_error,
        name: message.name,
        metadata: message.metadata,
        incomplete: message.incomplete,
    })
}

/// Converts a list of messages; `field` is the list's name.
pub fn messages_from_pb(messages: Vec<pb::Message>, field: &str) -> Result<Vec<Message>> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message_from_pb(m, &format!("{field}[{i}]")))
        .collect()
}

/// A stored message's encoding (a `sessionstore.v1.Message`), decoded
/// into the domain's message; what fails is a storage error.
pub fn decode_message(encoding: &[u8]) -> Result<Message> {
    let message = <pb::Message as prost::Message>::decode(encoding).map_err(Error::storage)?;
    message_from_pb(message, "message")
        .map_err(|error| Error::storage(std::io::Error::other(error.to_string())))
}

/// A message's encoding, as a row stores it.
pub fn encode_message(message: &Message) -> Vec<u8> {
    prost::Message::encode_to_vec(&message_to_pb(message.clone()))
}

pub fn message_to_pb(message: Message) -> pb::Message {
    pb::Message {
        role: role_to_pb(message.role).into(),
        content: message.content,
        content_blocks: message
            .content_blocks
            .into_iter()
            .map(block_to_pb)
            .collect(),
        tool_calls: message
            .tool_calls
            .into_iter()
            .map(|c| pb::ToolCall {
                id: c.id,
                name: c.name,
                arguments: c.arguments,
                signature: c.signature,
            })
            .collect(),
        tool_call_id: message.tool_call_id,
        tool_error: message.tool_error,
        name: message.name,
        metadata: message.metadata,
        incomplete: message.incomplete,
    }
}

pub fn stored_message_to_pb(stored: StoredMessage) -> pb::StoredMessage {
    pb::StoredMessage {
        id: stored.id,
        session_id: stored.session_id,
        sequence: stored.sequence,
        produced_by_call_id: stored.produced_by_call_id,
        message: Some(message_to_pb(stored.message)),
        create_time: Some(timestamp(stored.create_time)),
        redacted: stored.redacted,
    }
}

/// A provider call as sent by a client; the server-assigned fields are ignored.
pub fn provider_call_from_pb(call: pb::ProviderCall) -> ProviderCall {
    ProviderCall {
        id: String::new(),
        session_id: String::new(),
        request_id: call.request_id,
        provider: call.provider,
        model: call.model,
        requested_provider: call.requested_provider,
        requested_model: call.requested_model,
        prompt_tokens: call.prompt_tokens,
        completion_tokens: call.completion_tokens,
        total_tokens: call.total_tokens,
        cost_micros_usd: call.cost_micros_usd,
        create_time: Timestamp::default(),
        cached_input_tokens: call.cached_input_tokens,
        cache_creation_input_tokens: call.cache_creation_input_tokens,
        reasoning_tokens: call.reasoning_tokens,
        usage_json: call.usage_json,
        duration_micros: call.duration.as_ref().map_or(0, duration_micros),
    }
}

pub fn provider_call_to_pb(call: ProviderCall) -> pb::ProviderCall {
    pb::ProviderCall {
        id: call.id,
        session_id: call.session_id,
        request_id: call.request_id,
        provider: call.provider,
        model: call.model,
        requested_provider: call.requested_provider,
        requested_model: call.requested_model,
        prompt_tokens: call.prompt_tokens,
        completion_tokens: call.completion_tokens,
        total_tokens: call.total_tokens,
        cost_micros_usd: call.cost_micros_usd,
        create_time: Some(timestamp(call.create_time)),
        cached_input_tokens: call.cached_input_tokens,
        cache_creation_input_tokens: call.cache_creation_input_tokens,
        reasoning_tokens: call.reasoning_tokens,
        usage_json: call.usage_json,
        duration: duration_from_micros(call.duration_micros),
    }
}

pub fn session_to_pb(session: Session) -> pb::Session {
    pb::Session {
        id: session.id,
        title: session.title,
        system_prompt: session.system_prompt,
        user: session.user,
        metadata: session.metadata,
        summary_message_id: session.summary_message_id,
        revision: session.revision,
        create_time: Some(timestamp(session.create_time)),
        update_time: Some(timestamp(session.update_time)),
        parent_session_id: session.parent_session_id,
        parent_sequence: session.parent_sequence,
        active_run_id: session.active_run_id,
        run_expire_time: optional_timestamp(session.run_expire_time),
        next_sequence: session.next_sequence,
        expire_time: optional_timestamp(session.expire_time),
        state: Vec::new(),
    }
}

pub fn summary_to_pb(summary: SessionSummary) -> pb::SessionSummary {
    pb::SessionSummary {
        session: Some(session_to_pb(summary.session)),
        message_count: summary.message_count,
        provider_call_count: summary.provider_call_count,
        last_model: summary.last_model,
        last_provider: summary.last_provider,
        last_cost_micros_usd: summary.last_cost_micros_usd,
        last_request_id: summary.last_request_id,
        total_tokens: summary.total_tokens,
        total_cost_micros_usd: summary.total_cost_micros_usd,
    }
}

pub fn append_response_to_pb(
    revision: i64,
    appended: AppendedExchange,
) -> pb::AppendExchangeResponse {
    pb::AppendExchangeResponse {
        messages: appended
            .messages
            .into_iter()
            .map(stored_message_to_pb)
            .collect(),
        provider_call: appended.provider_call.map(provider_call_to_pb),
        revision,
        next_sequence: appended.next_sequence,
        update_time: Some(timestamp(appended.update_time)),
        session_created: appended.session_created,
    }
}

pub fn event_to_pb(event: &SessionEvent) -> pb::SessionEvent {
    event_into_pb(event.clone())
}

/// As [`event_to_pb`], taking the event.
pub fn event_into_pb(event: SessionEvent) -> pb::SessionEvent {
    use pb::session_event::Event;
    let payload = match event.change {
        Change::SessionCreated {
            session,
            messages,
            state,
        } => Event::SessionCreated(pb::SessionCreated {
            session: Some(session_to_pb(session)),
            messages: messages.into_iter().map(stored_message_to_pb).collect(),
            initial_state: state.into_iter().map(state_entry_to_pb).collect(),
        }),
        Change::ExchangeAppended(appended) => Event::ExchangeAppended(pb::ExchangeAppended {
            messages: appended
                .messages
                .into_iter()
                .map(stored_message_to_pb)
                .collect(),
            provider_call: appended.provider_call.map(provider_call_to_pb),
            run_id: appended.run_id,
            next_sequence: appended.next_sequence,
            state_changes: appended
                .state_changes
                .into_iter()
                .map(state_change_to_pb)
                .collect(),
        }),
        Change::SessionUpdated { session } => Event::SessionUpdated(pb::SessionUpdated {
            session: Some(session_to_pb(session)),
        }),
        Change::SessionDeleted => Event::SessionDeleted(pb::SessionDeleted {}),
        Change::RunBegun {
            run_id,
            expire_time,
        } => Event::RunBegun(pb::RunBegun {
            run_id,
            expire_time: Some(timestamp(expire_time)),
        }),
        Change::RunEnded { run_id, expired } => Event::RunEnded(pb::RunEnded { run_id, expired }),
        Change::RunCancelRequested { run_id, reason } => {
            Event::RunCancelRequested(pb::RunCancelRequested { run_id, reason })
        }
        Change::RolledBack {
            after_sequence,
            removed_message_ids,
            next_sequence,
            summary_cleared,
        } => Event::RolledBack(pb::RolledBack {
            after_sequence,
            removed_message_ids,
            next_sequence,
            summary_cleared,
        }),
        Change::MessageEdited {
            message,
            previous,
            reason,
        } => Event::MessageEdited(pb::MessageEdited {
            message: Some(stored_message_to_pb(message)),
            previous: Some(message_to_pb(previous)),
            reason,
        }),
        Change::MessageRedacted {
            message_id,
            sequence,
            reason,
        } => Event::MessageRedacted(pb::MessageRedacted {
            message_id,
            sequence,
            reason,
        }),
        Change::StateChanged {
            key,
            value,
            version,
            deleted,
        } => Event::StateChanged(pb::StateChanged {
            key,
            value,
            version,
            deleted,
        }),
        Change::ApprovalRequested { approval } => Event::ApprovalRequested(pb::ApprovalRequested {
            approval: Some(approval_to_pb(approval)),
        }),
        Change::ApprovalDecided {
            approval,
            tool_result,
            next_sequence,
        } => Event::ApprovalDecided(pb::ApprovalDecided {
            approval: Some(approval_to_pb(approval)),
            tool_result: tool_result.map(stored_message_to_pb),
            next_sequence,
        }),
        Change::InputQueued { input } => Event::InputQueued(pb::InputQueued {
            input: Some(queued_input_to_pb(input)),
        }),
        Change::InputTaken {
            input_id,
            position,
            run_id,
            messages,
            next_sequence,
        } => Event::InputTaken(pb::InputTaken {
            input_id,
            position,
            run_id,
            messages: messages.into_iter().map(stored_message_to_pb).collect(),
            next_sequence,
        }),
        Change::InputWithdrawn { input_id, position } => {
            Event::InputWithdrawn(pb::InputWithdrawn { input_id, position })
        }
    };
    pb::SessionEvent {
        revision: event.revision,
        time: Some(timestamp(event.time)),
        event: Some(payload),
    }
}

/// A `caught_up` or `progress` marker at `revision`, stamped now.
pub fn marker_to_pb(revision: i64, event: pb::session_event::Event) -> pb::SessionEvent {
    pb::SessionEvent {
        revision,
        time: Some(timestamp(Timestamp::now())),
        event: Some(event),
    }
}

/// A delta or discarded run, as watchers see it.
pub fn ephemeral_to_pb(ephemeral: &Ephemeral) -> pb::SessionEvent {
    use pb::session_event::Event;
    let payload = match ephemeral.kind.clone() {
        EphemeralKind::Delta {
            run_id,
            index,
            merged_from,
            content,
        } => Event::Delta(pb::Delta {
            run_id,
            index,
            first_index: merged_from.unwrap_or(index),
            delta: Some(match content {
                DeltaContent::Text(text) => pb::delta::Delta::Text(text),
                DeltaContent::Block(block) => pb::delta::Delta::Block(block_to_pb(block)),
            }),
        }),
        EphemeralKind::RunDiscarded { run_id } => Event::RunDiscarded(pb::RunDiscarded { run_id }),
    };
    pb::SessionEvent {
        revision: ephemeral.revision,
        time: Some(timestamp(ephemeral.time)),
        event: Some(payload),
    }
}

/// A PublishDelta payload, if one was set.
pub fn delta_from_pb(
    delta: Option<pb::publish_delta_request::Delta>,
) -> Result<Option<DeltaContent>> {
    use pb::publish_delta_request::Delta;
    Ok(match delta {
        None => None,
        Some(Delta::Text(text)) => Some(DeltaContent::Text(text)),
        Some(Delta::Block(block)) => Some(DeltaContent::Block(block_from_pb(block, "block")?)),
    })
}

/// One message sent on its own (EditMessage), validated under `field`.
pub fn message_from_pb_field(message: Option<pb::Message>, field: &str) -> Result<Message> {
    let message = message.ok_or_else(|| Error::invalid(field, "is required"))?;
    message_from_pb(message, field)
}

pub fn state_change_from_pb(change: pb::StateChange) -> StateChange {
    StateChange {
        scope: change.scope,
        key: change.key,
        value: change.value,
        delete: change.delete,
    }
}

pub fn state_change_to_pb(change: StateChange) -> pb::StateChange {
    pb::StateChange {
        scope: change.scope,
        key: change.key,
        value: change.value,
        delete: change.delete,
    }
}

pub fn state_entry_to_pb(entry: StateEntry) -> pb::StateEntry {
    pb::StateEntry {
        scope: entry.scope,
        key: entry.key,
        value: entry.value,
        version: entry.version,
        update_time: Some(timestamp(entry.update_time)),
    }
}

pub fn search_hit_to_pb(hit: SearchHit) -> pb::SearchHit {
    pb::SearchHit {
        session_id: hit.session_id,
        sequence: hit.sequence,
        message_id: hit.message_id,
        snippet: hit.snippet,
        session_title: hit.session_title,
        role: role_to_pb(hit.role).into(),
    }
}

/// An export's target, checked (`target.provider` is required); `None`
/// when the request has none.
pub fn target_from_pb(target: Option<pb::ExportTarget>) -> Result<Option<ExportTarget>> {
    let Some(target) = target else {
        return Ok(None);
    };
    let reasoning = match pb::ReasoningPolicy::try_from(target.reasoning) {
        Ok(pb::ReasoningPolicy::Unspecified | pb::ReasoningPolicy::SameModel) => {
            ReasoningPolicy::SameModel
        }
        Ok(pb::ReasoningPolicy::SameProvider) => ReasoningPolicy::SameProvider,
        Ok(pb::ReasoningPolicy::None) => ReasoningPolicy::None,
        Err(_) => {
            return Err(Error::invalid(
                "target.reasoning",
                "is not a ReasoningPolicy value",
            ));
        }
    };
    ExportTarget::new("target", target.provider, target.model, reasoning).map(Some)
}

/// A CreateSession request (or an append's `create_if_missing`, whose
/// fields `field` names) as the domain's new session; `expire_time` is
/// checked as CreateSession checks it.
pub fn new_session_from_pb(req: pb::CreateSessionRequest, field: &str) -> Result<NewSession> {
    let prefix = if field.is_empty() {
        String::new()
    } else {
        format!("{field}.")
    };
    Ok(NewSession {
        id: (!req.session_id.is_empty()).then_some(req.session_id),
        title: req.title,
        system_prompt: req.system_prompt,
        user: req.user,
        metadata: req.metadata,
        initial_history: messages_from_pb(
            req.initial_history,
            &format!("{prefix}initial_history"),
        )?,
        initial_state: req.initial_state.into_iter().collect(),
        expire_time: expire_time_from_pb(
            &format!("{prefix}expire_time"),
            req.expire_time.as_ref(),
        )?,
        request_id: req.request_id,
        state_changes: req
            .state_changes
            .into_iter()
            .map(state_change_from_pb)
            .collect(),
        state_scopes: req.state_scopes,
    })
}

/// An AppendExchange request as the domain's new exchange (each message
/// checked as it converts, naming its field).
pub fn new_exchange_from_pb(req: pb::AppendExchangeRequest) -> Result<NewExchange> {
    Ok(NewExchange {
        session_id: req.session_id,
        messages: messages_from_pb(req.messages, "messages")?,
        full_history: messages_from_pb(req.full_history, "full_history")?,
        provider_call: req.provider_call.map(provider_call_from_pb),
        response_messages: messages_from_pb(req.response_messages, "response_messages")?,
        expected_next_sequence: req.expected_next_sequence,
        request_id: req.request_id,
        run_id: req.run_id,
        state_changes: req
            .state_changes
            .into_iter()
            .map(state_change_from_pb)
            .collect(),
        create_if_missing: req
            .create_if_missing
            .map(|new| new_session_from_pb(new, "create_if_missing"))
            .transpose()?,
    })
}

/// SummarizeUsage's `group_by`.
pub fn usage_group_from_pb(group_by: i32) -> Result<UsageGroup> {
    Ok(match pb::UsageGroupBy::try_from(group_by) {
        Ok(pb::UsageGroupBy::Unspecified) => UsageGroup::Total,
        Ok(pb::UsageGroupBy::Session) => UsageGroup::Session,
        Ok(pb::UsageGroupBy::User) => UsageGroup::User,
        Ok(pb::UsageGroupBy::Model) => UsageGroup::Model,
        Ok(pb::UsageGroupBy::Day) => UsageGroup::Day,
        Err(_) => return Err(Error::invalid("group_by", "is not a UsageGroupBy value")),
    })
}

/// A `start_time`/`end_time` pair in microseconds, each optional, the end
/// not before the start.
pub fn time_range_from_pb(
    start: Option<&prost_types::Timestamp>,
    end: Option<&prost_types::Timestamp>,
) -> Result<(Option<i64>, Option<i64>)> {
    let start = start
        .map(|t| timestamp_micros("start_time", t))
        .transpose()?;
    let end = end.map(|t| timestamp_micros("end_time", t)).transpose()?;
    if let (Some(start), Some(end)) = (start, end)
        && end < start
    {
        return Err(Error::invalid("end_time", "must not be before start_time"));
    }
    Ok((start, end))
}

/// ListMessages' bounds: (`after_sequence`, -1 if unset; `before_sequence`,
/// none if unset).
pub fn sequence_bounds_from_pb(after: Option<i64>, before: Option<i64>) -> Result<(i64, i64)> {
    if after.is_some_and(|a| a < -1) {
        return Err(Error::invalid("after_sequence", "must be at least -1"));
    }
    if before.is_some_and(|b| b < 0) {
        return Err(Error::invalid("before_sequence", "must not be negative"));
    }
    Ok((after.unwrap_or(-1), before.unwrap_or(i64::MAX)))
}

/// ListMessages' `order_by`: whether newest first.
pub fn newest_first_from_pb(order_by: &str) -> Result<bool> {
    match order_by.trim() {
        "" | "sequence" => Ok(false),
        "sequence desc" => Ok(true),
        _ => Err(Error::invalid(
            "order_by",
            "must be \"sequence\" (oldest first) or \"sequence desc\" (newest first)",
        )),
    }
}

/// An expiry field: unset (or the epoch) is never; a time in the past is
/// allowed (the session is gone at once, and swept).
pub fn expire_time_from_pb(
    field: &str,
    time: Option<&prost_types::Timestamp>,
) -> Result<Timestamp> {
    match time {
        None => Ok(Timestamp(0)),
        Some(time) => {
            let micros = timestamp_micros(field, time)?;
            if micros < 0 {
                return Err(Error::invalid(field, "must not be before 1970"));
            }
            Ok(Timestamp(micros))
        }
    }
}

/// The most delta cursors one WatchSession may carry.
const MAX_DELTA_CURSORS: usize = 256;

/// A watch request's delta cursors, checked, by run id.
pub fn delta_cursors_from_pb(
    cursors: &[pb::DeltaCursor],
) -> Result<std::collections::HashMap<String, i64>> {
    if cursors.len() > MAX_DELTA_CURSORS {
        return Err(Error::invalid(
            "delta_cursors",
            format!("at most {MAX_DELTA_CURSORS} cursors (one per active run)"),
        ));
    }
    let mut by_run = std::collections::HashMap::with_capacity(cursors.len());
    for (i, cursor) in cursors.iter().enumerate() {
        crate::domain::control::require_run_id(&cursor.run_id)
            .map_err(|_| Error::invalid(format!("delta_cursors[{i}].run_id"), "is required"))?;
        if cursor.after_index < -1 {
            return Err(Error::invalid(
                format!("delta_cursors[{i}].after_index"),
                "must be at least -1 (-1: no delta received yet)",
            ));
        }
        if by_run
            .insert(cursor.run_id.clone(), cursor.after_index)
            .is_some()
        {
            return Err(Error::invalid(
                format!("delta_cursors[{i}].run_id"),
                "names a run a cursor before it already named",
            ));
        }
    }
    Ok(by_run)
}

pub fn approval_to_pb(approval: Approval) -> pb::Approval {
    pb::Approval {
        approval_id: approval.approval_id,
        session_id: approval.session_id,
        run_id: approval.run_id,
        tool_call_id: approval.tool_call_id,
        title: approval.title,
        detail_json: approval.detail_json,
        state: i32::try_from(approval.state.code()).unwrap_or_default(),
        decided_by: approval.decided_by,
        reason: approval.reason,
        create_time: Some(timestamp(approval.create_time)),
        decide_time: optional_timestamp(approval.decide_time),
        expire_time: optional_timestamp(approval.expire_time),
    }
}

/// A RequestApproval request's fields.
pub fn request_approval_from_pb(req: pb::RequestApprovalRequest) -> Result<RequestApproval> {
    Ok(RequestApproval {
        run_id: req.run_id,
        tool_call_id: req.tool_call_id,
        title: req.title,
        detail_json: req.detail_json,
        expire_time: expire_time_from_pb("expire_time", req.expire_time.as_ref())?,
    })
}

/// A DecideApproval request's fields; the decision is required.
pub fn decide_approval_from_pb(req: pb::DecideApprovalRequest) -> Result<DecideApproval> {
    let decision = match pb::ApprovalDecision::try_from(req.decision) {
        Ok(pb::ApprovalDecision::Approve) => Decision::Approve,
        Ok(pb::ApprovalDecision::Deny) => Decision::Deny,
        Ok(pb::ApprovalDecision::Unspecified) => {
            return Err(Error::invalid("decision", "is required: APPROVE or DENY"));
        }
        Err(_) => return Err(Error::invalid("decision", "is not a known decision")),
    };
    Ok(DecideApproval {
        approval_id: req.approval_id,
        decision,
        reason: req.reason,
        decided_by: req.decided_by,
        request_id: req.request_id,
    })
}

/// ListApprovals' `state` filter: `None` for UNSPECIFIED (any).
pub fn approval_state_filter_from_pb(state: i32) -> Result<Option<ApprovalState>> {
    if state == 0 {
        return Ok(None);
    }
    ApprovalState::from_code(i64::from(state))
        .map(Some)
        .ok_or_else(|| Error::invalid("state", "is not a known approval state"))
}

pub fn queued_input_to_pb(input: QueuedInput) -> pb::QueuedInput {
    pb::QueuedInput {
        input_id: input.input_id,
        session_id: input.session_id,
        position: input.position,
        messages: input.messages.into_iter().map(message_to_pb).collect(),
        mode: input.mode.code(),
        create_time: Some(timestamp(input.create_time)),
    }
}

/// A SubmitInput request's fields (each message checked as it converts).
pub fn submit_input_from_pb(req: pb::SubmitInputRequest) -> Result<SubmitInput> {
    Ok(SubmitInput {
        mode: InputMode::from_code(req.mode)
            .ok_or_else(|| Error::invalid("mode", "is not a known input mode"))?,
        messages: messages_from_pb(req.messages, "messages")?,
        request_id: req.request_id,
    })
}
