//! A committed event in its protobuf form: what the event log stores and
//! WatchSession sends.
//!
//! An event is encoded once, when it is written. The log keeps the
//! `SessionEvent` message's encoding, the hub hands the same bytes to every
//! watcher of the session, and a replay frames what it reads without
//! decoding it. Only what a watch stream itself acts on (a deletion, the
//! end of a run's partial output) is read out of the bytes, by a decode
//! that skips everything else.

use std::ops::Range;

use bytes::{BufMut as _, Bytes, BytesMut};
use prost::Message as _;
use sessionstore_client::v1 as pb;

use super::fields::{BadField, Field, Fields, delimited_len, key_len, put_delimited_head, varint};
use super::{
    event_into_pb, message_from_pb, provider_call_from_pb, state_change_from_pb, timestamp_micros,
};
use crate::domain::approvals::{Approval, ApprovalState};
use crate::domain::queue::{InputMode, QueuedInput};
use crate::domain::{
    AppendedExchange, Change, Error, ProviderCall, Result, Session, SessionEvent, StateEntry,
    StoredMessage, Timestamp,
};

/// Bytes before the encoding in a gRPC message: the compressed flag and
/// the length.
const PREFIX: usize = 5;

/// A committed event, encoded as a `sessionstore.v1.SessionEvent` and
/// framed as one gRPC message.
#[derive(Clone, Debug)]
pub struct EncodedEvent {
    pub revision: i64,
    /// What the event means for a watch stream.
    pub effect: Effect,
    /// Not compressed, the length (big-endian `u32`), then the encoding.
    framed: Bytes,
    /// The buffer `framed` is a slice of, shared with the events read in
    /// the same page (see [`EncodedEvent::in_page`]); `None` for an event
    /// framed on its own.
    page: Option<Bytes>,
}

/// What a watch stream does on an event beyond sending it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Nothing more.
    None,
    /// The run's partial output is closed (by its exchange, or its end):
    /// its delta indexes start over.
    ClosesRun(String),
    /// The session is gone: the stream ends after this event.
    SessionDeleted,
}

impl Effect {
    fn of(change: &Change) -> Self {
        match change {
            Change::ExchangeAppended(appended) if !appended.run_id.is_empty() => {
                Effect::ClosesRun(appended.run_id.clone())
            }
            Change::RunEnded { run_id, .. } => Effect::ClosesRun(run_id.clone()),
            Change::SessionDeleted => Effect::SessionDeleted,
            _ => Effect::None,
        }
    }
}

impl EncodedEvent {
    /// Encodes `event` (as it is written).
    pub fn new(event: SessionEvent) -> Self {
        let (revision, effect) = (event.revision, Effect::of(&event.change));
        Self::framed_from(revision, effect, &event_into_pb(event))
    }

    /// Encodes an appended exchange's event twice: whole, as watchers get
    /// it, and as the log stores it, which leaves out the content of the
    /// messages (`StoredMessage.message`): their rows in `messages` hold
    /// it, and [`EncodedEvent::with_contents`] puts it back when the event is read.
    /// Every other field, the messages' ids and sequences included, is
    /// kept.
    pub fn referring(event: SessionEvent) -> (Self, Vec<u8>) {
        let (whole, logged, _) = Self::split(event, false);
        (whole, logged)
    }

    /// As [`EncodedEvent::referring`], with the content it leaves out: the
    /// encoding of each message (a `sessionstore.v1.Message`, as a
    /// message row stores it), in the event's order. An append writes
    /// these into its messages' rows, each message converted and encoded
    /// once for both.
    pub fn referring_with_contents(event: SessionEvent) -> (Self, Vec<u8>, Vec<Vec<u8>>) {
        Self::split(event, true)
    }

    fn split(event: SessionEvent, keep_contents: bool) -> (Self, Vec<u8>, Vec<Vec<u8>>) {
        let (revision, effect) = (event.revision, Effect::of(&event.change));
        let mut message = event_into_pb(event);
        let whole = Self::framed_from(revision, effect, &message);
        let mut contents = Vec::new();
        if let Some(pb::session_event::Event::ExchangeAppended(appended)) = &mut message.event {
            for stored in &mut appended.messages {
                let content = stored.message.take();
                if keep_contents {
                    contents.push(content.map(|m| m.encode_to_vec()).unwrap_or_default());
                }
            }
        }
        (whole, message.encode_to_vec(), contents)
    }

    /// An appended exchange's event as the log stores it
    /// ([`EncodedEvent::referring`]), with its messages' content put back:
    /// `contents` holds the encoding of each message it refers to (a
    /// `sessionstore.v1.Message`), by sequence, in sequence order. Every
    /// message the event refers to must be there, and no other.
    ///
    /// The bytes are spliced, not decoded: each `StoredMessage` without its
    /// `message` gets the field appended (a message's fields may come in
    /// any order), and the lengths around it are written anew; every other
    /// field is copied as stored.
    pub fn with_contents(
        revision: i64,
        stored: &[u8],
        contents: &[(i64, Vec<u8>)],
    ) -> Result<Self> {
        let mut buf = BytesMut::new();
        let effect = Self::write_with_contents(stored, contents, &mut buf)?;
        Ok(EncodedEvent {
            revision,
            effect,
            framed: buf.freeze(),
            page: None,
        })
    }

    /// Writes what [`EncodedEvent::with_contents`] frames at the end of
    /// `buf`, and answers the event's effect.
    pub fn write_with_contents(
        stored: &[u8],
        contents: &[(i64, Vec<u8>)],
        buf: &mut BytesMut,
    ) -> Result<Effect> {
        // The exchange, and the bytes of the fields before and after it
        // (an event has one exchange, and its other fields are copied as
        // they are).
        let mut appended = None;
        let mut before = 0;
        for field in Fields(stored) {
            let field = field?;
            if field.tag == EXCHANGE_APPENDED {
                appended = Some(field);
                break;
            }
            before += field.whole.len();
        }
        let appended = appended
            .ok_or_else(|| malformed("only an appended exchange refers to its messages"))?;
        let after = stored
            .get(before + appended.whole.len()..)
            .unwrap_or_default();
        for field in Fields(after) {
            if field?.tag == EXCHANGE_APPENDED {
                return Err(malformed("an event with two appended exchanges"));
            }
        }
        let appended = appended.payload;
        // The exchange's fields, each parsed once, with the content each
        // stored message gets; the exchange's length with them, checking
        // that each content is there; then the bytes, written once into
        // the framed event.
        let mut fields = Vec::with_capacity(contents.len() + 4);
        let mut inner_len = 0;
        let mut run_id = "";
        let mut next = 0;
        for field in Fields(appended) {
            let field = field?;
            let content = match field.tag {
                MESSAGES => referred(&field, contents, &mut next)?,
                RUN_ID => {
                    run_id = std::str::from_utf8(field.payload)
                        .map_err(|_| malformed("a run id that is not UTF-8"))?;
                    None
                }
                _ => None,
            };
            inner_len += match content {
                Some(content) => with_content_len(&field, content),
                None => field.whole.len(),
            };
            fields.push((field, content));
        }
        if next != contents.len() {
            return Err(malformed("more contents than messages referred to"));
        }
        let len = before + after.len() + key_len(EXCHANGE_APPENDED) + delimited_len(inner_len);
        buf.reserve(PREFIX + len);
        put_prefix(buf, len);
        buf.extend_from_slice(stored.get(..before).unwrap_or_default());
        put_delimited_head(buf, EXCHANGE_APPENDED, inner_len);
        for (field, content) in fields {
            let Some(content) = content else {
                buf.extend_from_slice(field.whole);
                continue;
            };
            let content_field = key_len(MESSAGE_CONTENT) + delimited_len(content.len());
            put_delimited_head(buf, MESSAGES, field.payload.len() + content_field);
            buf.extend_from_slice(field.payload);
            put_delimited_head(buf, MESSAGE_CONTENT, content.len());
            buf.extend_from_slice(content);
        }
        buf.extend_from_slice(after);
        Ok(if run_id.is_empty() {
            Effect::None
        } else {
            Effect::ClosesRun(run_id.to_owned())
        })
    }

    /// The event at `revision` whose frame is `page[range]`: a page of
    /// events read together is framed into one buffer, and WatchSession
    /// sends a run of them from it as one DATA frame, uncopied
    /// ([`EncodedEvent::page`]). `None` if `range` is not within `page`.
    pub fn in_page(
        revision: i64,
        effect: Effect,
        page: &Bytes,
        range: Range<usize>,
    ) -> Option<Self> {
        let framed = page.get(range.clone()).map(|_| page.slice(range))?;
        Some(EncodedEvent {
            revision,
            effect,
            framed,
            page: Some(page.clone()),
        })
    }

    /// The buffer the event's frame is a slice of, shared with the events
    /// read in the same page, if it was read in one.
    pub fn page(&self) -> Option<&Bytes> {
        self.page.as_ref()
    }

    fn framed_from(revision: i64, effect: Effect, message: &pb::SessionEvent) -> Self {
        let len = message.encoded_len();
        let mut buf = BytesMut::with_capacity(PREFIX + len);
        put_prefix(&mut buf, len);
        // Cannot fail: the buffer has room for the whole message.
        let _ = message.encode(&mut buf);
        EncodedEvent {
            revision,
            effect,
            framed: buf.freeze(),
            page: None,
        }
    }

    /// The event at `revision` from the encoding the log stored.
    pub fn stored(revision: i64, encoding: &[u8]) -> Result<Self> {
        let outline = Outline::decode(encoding).map_err(Error::storage)?;
        let effect = if outline.session_deleted.is_some() {
            Effect::SessionDeleted
        } else if let Some(run) = outline
            .exchange_appended
            .map(|e| e.run_id)
            .or(outline.run_ended.map(|e| e.run_id))
            .filter(|run_id| !run_id.is_empty())
        {
            Effect::ClosesRun(run)
        } else {
            Effect::None
        };
        let mut buf = BytesMut::with_capacity(PREFIX + encoding.len());
        put_prefix(&mut buf, encoding.len());
        buf.extend_from_slice(encoding);
        Ok(EncodedEvent {
            revision,
            effect,
            framed: buf.freeze(),
            page: None,
        })
    }

    /// The `SessionEvent` encoding, as the log stores it.
    pub fn encoding(&self) -> &[u8] {
        self.framed.get(PREFIX..).unwrap_or_default()
    }

    /// The event as one gRPC message, shared, not copied.
    pub fn framed(&self) -> Bytes {
        self.framed.clone()
    }

    /// The event as the protocol's message.
    pub fn to_pb(&self) -> Result<pb::SessionEvent> {
        pb::SessionEvent::decode(self.encoding()).map_err(Error::storage)
    }

    /// The event as the domain's value.
    pub fn decode(&self) -> Result<SessionEvent> {
        event_from_pb(self.to_pb()?)
    }
}

/// Field numbers in `messages.proto`: `SessionEvent.exchange_appended`,
/// `ExchangeAppended.messages` and `.run_id`, `StoredMessage.sequence`
/// and `.message`.
const EXCHANGE_APPENDED: u32 = 11;
const MESSAGES: u32 = 1;
const RUN_ID: u32 = 3;
const MESSAGE_SEQUENCE: u32 = 3;
const MESSAGE_CONTENT: u32 = 5;

impl From<BadField> for Error {
    fn from(bad: BadField) -> Self {
        malformed(bad.0)
    }
}

/// The content for a stored message (`field`) left without it: the next
/// of `contents`, which must be its own. `None` if it holds its content.
fn referred<'c>(
    field: &Field<'_>,
    contents: &'c [(i64, Vec<u8>)],
    next: &mut usize,
) -> Result<Option<&'c [u8]>> {
    let (sequence, has_content) = outline_of_stored_message(field.payload)?;
    if has_content {
        return Ok(None);
    }
    match contents.get(*next) {
        Some((at, content)) if *at == sequence => {
            *next += 1;
            Ok(Some(content))
        }
        _ => Err(malformed(format!(
            "the content of message {sequence} is gone"
        ))),
    }
}

/// The bytes a stored message (`field`) takes with `content` added.
fn with_content_len(field: &Field<'_>, content: &[u8]) -> usize {
    let content_field = key_len(MESSAGE_CONTENT) + delimited_len(content.len());
    key_len(MESSAGES) + delimited_len(field.payload.len() + content_field)
}

/// A stored message's sequence, and whether it holds its content.
fn outline_of_stored_message(encoding: &[u8]) -> Result<(i64, bool)> {
    let mut sequence = 0;
    let mut has_content = false;
    for field in Fields(encoding) {
        let field = field?;
        match field.tag {
            // An int64 is its varint's two's-complement bits.
            MESSAGE_SEQUENCE => sequence = varint(field.payload)?.0 as i64,
            MESSAGE_CONTENT => has_content = true,
            _ => {}
        }
    }
    Ok((sequence, has_content))
}

fn put_prefix(buf: &mut BytesMut, len: usize) {
    buf.put_u8(0);
    // An event is bounded by the request size limit, far below 4 GiB.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
}

/// The parts of a `SessionEvent` a watch stream acts on, by their field
/// numbers in `messages.proto`; every other field is skipped undecoded.
#[derive(Clone, PartialEq, prost::Message)]
struct Outline {
    #[prost(message, optional, tag = "11")]
    exchange_appended: Option<RunOf>,
    #[prost(message, optional, tag = "13")]
    session_deleted: Option<Nothing>,
    #[prost(message, optional, tag = "19")]
    run_ended: Option<RunEndedOf>,
}

/// `ExchangeAppended.run_id`.
#[derive(Clone, PartialEq, prost::Message)]
struct RunOf {
    #[prost(string, tag = "3")]
    run_id: String,
}

/// `RunEnded.run_id`.
#[derive(Clone, PartialEq, prost::Message)]
struct RunEndedOf {
    #[prost(string, tag = "1")]
    run_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Nothing {}

/// What the log stored, not valid as the protocol defines it.
#[derive(Debug, thiserror::Error)]
#[error("a stored event is malformed: {0}")]
struct Malformed(String);

fn malformed(what: impl Into<String>) -> Error {
    Error::storage(Malformed(what.into()))
}

/// A stored event back to the domain's value: the inverse of
/// [`super::event_to_pb`] for every change the log holds.
pub fn event_from_pb(event: pb::SessionEvent) -> Result<SessionEvent> {
    use pb::session_event::Event;
    let change = match event.event {
        Some(Event::SessionCreated(created)) => Change::SessionCreated {
            session: session_from_pb(created.session)?,
            messages: stored_messages_from_pb(created.messages)?,
            state: created
                .initial_state
                .into_iter()
                .map(state_entry_from_pb)
                .collect::<Result<_>>()?,
        },
        Some(Event::ExchangeAppended(appended)) => Change::ExchangeAppended(AppendedExchange {
            messages: stored_messages_from_pb(appended.messages)?,
            provider_call: appended
                .provider_call
                .map(stored_provider_call_from_pb)
                .transpose()?,
            run_id: appended.run_id,
            next_sequence: appended.next_sequence,
            state_changes: appended
                .state_changes
                .into_iter()
                .map(state_change_from_pb)
                .collect(),
            // As the JSON form: never stored with the exchange.
            update_time: Timestamp::default(),
            replayed: false,
            session_created: false,
        }),
        Some(Event::SessionUpdated(updated)) => Change::SessionUpdated {
            session: session_from_pb(updated.session)?,
        },
        Some(Event::SessionDeleted(_)) => Change::SessionDeleted,
        Some(Event::RunBegun(begun)) => Change::RunBegun {
            run_id: begun.run_id,
            expire_time: time_from_pb(begun.expire_time.as_ref())?,
        },
        Some(Event::RunEnded(ended)) => Change::RunEnded {
            run_id: ended.run_id,
            expired: ended.expired,
        },
        Some(Event::RunCancelRequested(cancel)) => Change::RunCancelRequested {
            run_id: cancel.run_id,
            reason: cancel.reason,
        },
        Some(Event::RolledBack(rolled)) => Change::RolledBack {
            after_sequence: rolled.after_sequence,
            removed_message_ids: rolled.removed_message_ids,
            next_sequence: rolled.next_sequence,
            summary_cleared: rolled.summary_cleared,
        },
        Some(Event::MessageEdited(edited)) => Change::MessageEdited {
            message: stored_message_from_pb(
                edited
                    .message
                    .ok_or_else(|| malformed("an edit without its message"))?,
            )?,
            previous: message_from_pb(
                edited
                    .previous
                    .ok_or_else(|| malformed("an edit without the previous message"))?,
                "previous",
            )
            .map_err(|e| malformed(e.to_string()))?,
            reason: edited.reason,
        },
        Some(Event::MessageRedacted(redacted)) => Change::MessageRedacted {
            message_id: redacted.message_id,
            sequence: redacted.sequence,
            reason: redacted.reason,
        },
        Some(Event::StateChanged(state)) => Change::StateChanged {
            key: state.key,
            value: state.value,
            version: state.version,
            deleted: state.deleted,
        },
        Some(Event::ApprovalRequested(requested)) => Change::ApprovalRequested {
            approval: approval_from_pb(requested.approval)?,
        },
        Some(Event::ApprovalDecided(decided)) => Change::ApprovalDecided {
            approval: approval_from_pb(decided.approval)?,
            tool_result: decided
                .tool_result
                .map(stored_message_from_pb)
                .transpose()?,
            next_sequence: decided.next_sequence,
        },
        Some(Event::InputQueued(queued)) => Change::InputQueued {
            input: queued_input_from_pb(
                queued
                    .input
                    .ok_or_else(|| malformed("an input event without its input"))?,
            )?,
        },
        Some(Event::InputTaken(taken)) => Change::InputTaken {
            input_id: taken.input_id,
            position: taken.position,
            run_id: taken.run_id,
            messages: stored_messages_from_pb(taken.messages)?,
            next_sequence: taken.next_sequence,
        },
        Some(Event::InputWithdrawn(withdrawn)) => Change::InputWithdrawn {
            input_id: withdrawn.input_id,
            position: withdrawn.position,
        },
        Some(
            Event::CaughtUp(_) | Event::Progress(_) | Event::Delta(_) | Event::RunDiscarded(_),
        )
        | None => return Err(malformed("not a change the log holds")),
    };
    Ok(SessionEvent {
        revision: event.revision,
        time: time_from_pb(event.time.as_ref())?,
        change,
    })
}

/// A stored queued input.
pub(super) fn queued_input_from_pb(input: pb::QueuedInput) -> Result<QueuedInput> {
    Ok(QueuedInput {
        mode: InputMode::from_code(input.mode)
            .ok_or_else(|| malformed("an input of no known mode"))?,
        create_time: time_from_pb(input.create_time.as_ref())?,
        messages: input
            .messages
            .into_iter()
            .map(|m| message_from_pb(m, "message").map_err(|e| malformed(e.to_string())))
            .collect::<Result<_>>()?,
        input_id: input.input_id,
        session_id: input.session_id,
        position: input.position,
    })
}

/// A stored approval.
fn approval_from_pb(approval: Option<pb::Approval>) -> Result<Approval> {
    let approval = approval.ok_or_else(|| malformed("an approval event without its approval"))?;
    Ok(Approval {
        state: ApprovalState::from_code(i64::from(approval.state))
            .ok_or_else(|| malformed("an approval in no known state"))?,
        create_time: time_from_pb(approval.create_time.as_ref())?,
        decide_time: time_from_pb(approval.decide_time.as_ref())?,
        expire_time: time_from_pb(approval.expire_time.as_ref())?,
        approval_id: approval.approval_id,
        session_id: approval.session_id,
        run_id: approval.run_id,
        tool_call_id: approval.tool_call_id,
        title: approval.title,
        detail_json: approval.detail_json,
        decided_by: approval.decided_by,
        reason: approval.reason,
    })
}

/// A stored time; unset is 0, as the domain has it.
fn time_from_pb(time: Option<&prost_types::Timestamp>) -> Result<Timestamp> {
    time.map_or(Ok(Timestamp(0)), |t| {
        timestamp_micros("time", t)
            .map(Timestamp)
            .map_err(|e| malformed(e.to_string()))
    })
}

fn session_from_pb(session: Option<pb::Session>) -> Result<Session> {
    let session = session.ok_or_else(|| malformed("a session change without its session"))?;
    Ok(Session {
        id: session.id,
        title: session.title,
        system_prompt: session.system_prompt,
        user: session.user,
        metadata: session.metadata,
        summary_message_id: session.summary_message_id,
        revision: session.revision,
        create_time: time_from_pb(session.create_time.as_ref())?,
        update_time: time_from_pb(session.update_time.as_ref())?,
        parent_session_id: session.parent_session_id,
        parent_sequence: session.parent_sequence,
        active_run_id: session.active_run_id,
        run_expire_time: time_from_pb(session.run_expire_time.as_ref())?,
        next_sequence: session.next_sequence,
        expire_time: time_from_pb(session.expire_time.as_ref())?,
    })
}

pub(super) fn stored_messages_from_pb(
    messages: Vec<pb::StoredMessage>,
) -> Result<Vec<StoredMessage>> {
    messages.into_iter().map(stored_message_from_pb).collect()
}

fn stored_message_from_pb(stored: pb::StoredMessage) -> Result<StoredMessage> {
    let message = stored
        .message
        .ok_or_else(|| malformed("a stored message without its content"))?;
    Ok(StoredMessage {
        id: stored.id,
        session_id: stored.session_id,
        sequence: stored.sequence,
        produced_by_call_id: stored.produced_by_call_id,
        message: message_from_pb(message, "message").map_err(|e| malformed(e.to_string()))?,
        create_time: time_from_pb(stored.create_time.as_ref())?,
        redacted: stored.redacted,
    })
}

/// A stored call, its server-assigned fields included.
fn stored_provider_call_from_pb(call: pb::ProviderCall) -> Result<ProviderCall> {
    let (id, session_id) = (call.id.clone(), call.session_id.clone());
    let create_time = time_from_pb(call.create_time.as_ref())?;
    Ok(ProviderCall {
        id,
        session_id,
        create_time,
        ..provider_call_from_pb(call)
    })
}

fn state_entry_from_pb(entry: pb::StateEntry) -> Result<StateEntry> {
    Ok(StateEntry {
        scope: entry.scope,
        key: entry.key,
        value: entry.value,
        version: entry.version,
        update_time: time_from_pb(entry.update_time.as_ref())?,
    })
}

#[cfg(test)]
mod tests {
    use prost::encoding::{WireType, decode_key, decode_varint};

    use super::*;
    use crate::domain::{ContentBlock, Message, Metadata, Role, StateChange, ToolCall};

    fn message(id: &str, sequence: i64) -> StoredMessage {
        StoredMessage {
            id: id.into(),
            session_id: "s".into(),
            sequence,
            produced_by_call_id: "call-1".into(),
            message: Message {
                role: Role::Assistant,
                content: "a\0b \\ \"c\"".into(),
                content_blocks: vec![
                    ContentBlock::Thinking {
                        thinking: "hmm".into(),
                        signature: "sig".into(),
                    },
                    ContentBlock::RedactedThinking {
                        data: "opaque".into(),
                    },
                    ContentBlock::Json {
                        kind: "citation".into(),
                        json: r#"{"b": 1, "a":  [ 2 ]}"#.into(),
                    },
                ],
                tool_calls: vec![ToolCall {
                    id: "t1".into(),
                    name: "f".into(),
                    arguments: r#"{"x":  1}"#.into(),
                    signature: String::new(),
                }],
                tool_call_id: String::new(),
                tool_error: false,
                name: String::new(),
                metadata: Metadata::from([("k".into(), "v\0".into())]),
                incomplete: true,
            },
            create_time: Timestamp(1_700_000_000_123_456),
            redacted: false,
        }
    }

    fn session() -> Session {
        Session {
            id: "s".into(),
            title: "t".into(),
            system_prompt: "p".into(),
            user: "u".into(),
            metadata: Metadata::new(),
            summary_message_id: String::new(),
            revision: 3,
            create_time: Timestamp(1),
            update_time: Timestamp(2),
            parent_session_id: "p".into(),
            parent_sequence: 4,
            active_run_id: "r".into(),
            run_expire_time: Timestamp(5),
            next_sequence: 6,
            expire_time: Timestamp(0),
        }
    }

    fn changes() -> Vec<Change> {
        vec![
            Change::SessionCreated {
                session: session(),
                messages: vec![message("m0", 0)],
                state: vec![StateEntry {
                    scope: String::new(),
                    key: "k".into(),
                    value: "v".into(),
                    version: 1,
                    update_time: Timestamp(7),
                }],
            },
            Change::ExchangeAppended(AppendedExchange {
                messages: vec![message("m1", 1), message("m2", 2)],
                provider_call: Some(ProviderCall {
                    id: "call-1".into(),
                    session_id: "s".into(),
                    request_id: "req".into(),
                    provider: "openai".into(),
                    model: "gpt".into(),
                    prompt_tokens: 10,
                    completion_tokens: 5,
                    total_tokens: 15,
                    cost_micros_usd: 3,
                    create_time: Timestamp(8),
                    cached_input_tokens: 2,
                    usage_json: "{}".into(),
                    duration_micros: 1_500_000,
                    ..ProviderCall::default()
                }),
                run_id: "run-1".into(),
                next_sequence: 3,
                state_changes: vec![StateChange {
                    scope: "shared".into(),
                    key: "k".into(),
                    value: String::new(),
                    delete: true,
                }],
                update_time: Timestamp::default(),
                replayed: false,
                session_created: false,
            }),
            Change::SessionUpdated { session: session() },
            Change::SessionDeleted,
            Change::RunBegun {
                run_id: "run-2".into(),
                expire_time: Timestamp(9),
            },
            Change::RunEnded {
                run_id: "run-2".into(),
                expired: true,
            },
            Change::RunCancelRequested {
                run_id: "run-3".into(),
                reason: "stop".into(),
            },
            Change::RolledBack {
                after_sequence: 1,
                removed_message_ids: vec!["m2".into()],
                next_sequence: 2,
                summary_cleared: true,
            },
            Change::MessageEdited {
                message: message("m1", 1),
                previous: message("m1", 1).message,
                reason: "typo".into(),
            },
            Change::MessageRedacted {
                message_id: "m1".into(),
                sequence: 1,
                reason: "pii".into(),
            },
            Change::StateChanged {
                key: "k".into(),
                value: "v".into(),
                version: 4,
                deleted: false,
            },
            Change::ApprovalRequested {
                approval: approval(ApprovalState::Pending),
            },
            Change::ApprovalDecided {
                approval: approval(ApprovalState::Denied),
                tool_result: Some(message("msg_t", 5)),
                next_sequence: 6,
            },
            Change::InputQueued {
                input: QueuedInput {
                    input_id: "inp_1".into(),
                    session_id: "s".into(),
                    position: 3,
                    messages: vec![message("m", 0).message],
                    mode: InputMode::Interrupt,
                    create_time: Timestamp(1_700_000_000_000_002),
                },
            },
            Change::InputTaken {
                input_id: "inp_1".into(),
                position: 3,
                run_id: "run-1".into(),
                messages: vec![message("msg_i", 6)],
                next_sequence: 7,
            },
            Change::InputWithdrawn {
                input_id: "inp_2".into(),
                position: 4,
            },
        ]
    }

    fn approval(state: ApprovalState) -> Approval {
        Approval {
            approval_id: "apr_1".into(),
            session_id: "s".into(),
            run_id: "run-1".into(),
            tool_call_id: "call_1".into(),
            title: "Delete?".into(),
            detail_json: "{\"path\": \"/\"}".into(),
            state,
            decided_by: "ada".into(),
            reason: "no".into(),
            create_time: Timestamp(1_700_000_000_000_000),
            decide_time: Timestamp(1_700_000_000_000_001),
            expire_time: Timestamp(0),
        }
    }

    #[test]
    fn every_change_reads_back_from_its_encoding() -> Result<()> {
        for (revision, change) in (1..).zip(changes()) {
            let event = SessionEvent {
                revision,
                time: Timestamp(1_700_000_000_000_001),
                change,
            };
            let encoded = EncodedEvent::new(event.clone());
            assert_eq!(encoded.revision, revision);
            let stored = EncodedEvent::stored(revision, encoded.encoding())?;
            assert_eq!(stored.framed(), encoded.framed());
            assert_eq!(stored.effect, encoded.effect, "{:?}", event.change);
            assert_eq!(stored.decode()?, event);
        }
        Ok(())
    }

    #[test]
    fn the_effect_is_read_without_decoding_the_rest() -> Result<()> {
        let effects: Vec<Effect> = changes()
            .into_iter()
            .map(|change| {
                let encoded = EncodedEvent::new(SessionEvent {
                    revision: 1,
                    time: Timestamp(1),
                    change,
                });
                EncodedEvent::stored(1, encoded.encoding()).map(|e| e.effect)
            })
            .collect::<Result<_>>()?;
        assert_eq!(
            effects,
            [
                Effect::None,
                Effect::ClosesRun("run-1".into()),
                Effect::None,
                Effect::SessionDeleted,
                Effect::None,
                Effect::ClosesRun("run-2".into()),
                Effect::None,
                Effect::None,
                Effect::None,
                Effect::None,
                Effect::None,
                Effect::None,
                Effect::None,
                Effect::None,
                Effect::None,
                Effect::None,
            ]
        );
        Ok(())
    }

    #[test]
    fn an_appended_exchange_is_stored_without_its_contents_and_read_back_whole() -> Result<()> {
        let Some(Change::ExchangeAppended(appended)) = changes().into_iter().nth(1) else {
            panic!("the second change is an appended exchange");
        };
        let event = SessionEvent {
            revision: 7,
            time: Timestamp(1_700_000_000_000_001),
            change: Change::ExchangeAppended(appended.clone()),
        };
        let (whole, stored) = EncodedEvent::referring(event.clone());
        assert_eq!(whole.decode()?, event);
        let text = appended.messages[0].message.content.as_bytes();
        assert!(!stored.windows(text.len()).any(|w| w == text));
        assert!(stored.len() < whole.encoding().len() / 2);

        let content = |i: usize| {
            let message: &StoredMessage = &appended.messages[i];
            (
                message.sequence,
                super::super::message_to_pb(message.message.clone()).encode_to_vec(),
            )
        };
        // What the append path writes: the same event, the same stored
        // form, and each message's content as its row stores it.
        let (with, also_stored, contents) = EncodedEvent::referring_with_contents(event.clone());
        assert_eq!(with.to_pb()?, whole.to_pb()?);
        assert_eq!(also_stored, stored);
        assert_eq!(contents, vec![content(0).1, content(1).1]);

        let read = EncodedEvent::with_contents(7, &stored, &[content(0), content(1)])?;
        assert_eq!(read.revision, 7);
        assert_eq!(read.effect, whole.effect);
        assert_eq!(read.to_pb()?, whole.to_pb()?);
        assert_eq!(read.decode()?, event);

        // Every message it refers to, and no other.
        for contents in [
            vec![content(0)],
            vec![content(1), content(0)],
            vec![content(0), content(1), content(1)],
        ] {
            assert!(matches!(
                EncodedEvent::with_contents(7, &stored, &contents),
                Err(Error::Storage(_))
            ));
        }
        Ok(())
    }

    #[test]
    fn an_exchange_without_a_run_closes_none() -> Result<()> {
        let encoded = EncodedEvent::new(SessionEvent {
            revision: 2,
            time: Timestamp(1),
            change: Change::ExchangeAppended(AppendedExchange {
                messages: Vec::new(),
                provider_call: None,
                run_id: String::new(),
                next_sequence: 0,
                state_changes: Vec::new(),
                update_time: Timestamp::default(),
                replayed: false,
                session_created: false,
            }),
        });
        assert_eq!(encoded.effect, Effect::None);
        assert_eq!(
            EncodedEvent::stored(2, encoded.encoding())?.effect,
            Effect::None
        );
        Ok(())
    }

    #[test]
    fn the_frame_is_a_grpc_message() {
        let encoded = EncodedEvent::new(SessionEvent {
            revision: 1,
            time: Timestamp(1),
            change: Change::SessionDeleted,
        });
        let framed = encoded.framed();
        let len = encoded.encoding().len();
        assert_eq!(framed.len(), PREFIX + len);
        assert_eq!(framed.first(), Some(&0));
        assert_eq!(
            framed.get(1..PREFIX),
            Some(
                u32::try_from(len)
                    .unwrap_or(u32::MAX)
                    .to_be_bytes()
                    .as_slice()
            )
        );
    }

    #[test]
    fn a_malformed_encoding_is_a_storage_error() {
        assert!(matches!(
            EncodedEvent::stored(1, &[0xff, 0xff, 0xff]),
            Err(Error::Storage(_))
        ));
    }

    /// A message of every wire type, with keys and lengths of one byte
    /// and of several, as `prost` writes it.
    fn every_kind_of_field() -> Vec<u8> {
        use prost::encoding::{encode_key, encode_varint};
        let mut buf = Vec::new();
        for (tag, value) in [
            (1, 0),
            (15, 127),
            (16, 128),
            (2047, u64::MAX),
            (536_870_911, 300),
        ] {
            encode_key(tag, WireType::Varint, &mut buf);
            encode_varint(value, &mut buf);
        }
        encode_key(3, WireType::SixtyFourBit, &mut buf);
        buf.extend_from_slice(&7u64.to_le_bytes());
        encode_key(4, WireType::ThirtyTwoBit, &mut buf);
        buf.extend_from_slice(&9u32.to_le_bytes());
        for (tag, len) in [(5, 0), (6, 1), (200, 127), (7, 128), (8, 20_000)] {
            encode_key(tag, WireType::LengthDelimited, &mut buf);
            encode_varint(len as u64, &mut buf);
            buf.extend((0..len).map(|i| i as u8));
        }
        buf
    }

    #[test]
    fn fields_are_read_as_prost_reads_them() -> Result<()> {
        let encoding = every_kind_of_field();
        let mut rest = encoding.as_slice();
        let mut read = 0;
        for field in Fields(&encoding) {
            let field = field?;
            // prost's own reading of the same field, from where it starts.
            let before = rest;
            let (tag, wire_type) = decode_key(&mut rest).map_err(Error::storage)?;
            let mut payload = rest;
            prost::encoding::skip_field(wire_type, tag, &mut rest, Default::default())
                .map_err(Error::storage)?;
            let whole = &before[..before.len() - rest.len()];
            if wire_type == WireType::LengthDelimited {
                let len = decode_varint(&mut payload).map_err(Error::storage)?;
                payload = &payload[..len as usize];
            } else {
                payload = &payload[..payload.len() - rest.len()];
            }
            assert_eq!(field.tag, tag);
            assert_eq!(field.whole, whole, "field {tag}");
            assert_eq!(field.payload, payload, "field {tag}");
            read += 1;
        }
        assert_eq!(read, 12);
        assert!(rest.is_empty());
        Ok(())
    }

    #[test]
    fn a_field_cut_short_or_out_of_range_is_refused() {
        let encoding = every_kind_of_field();
        // Every cut inside a field: the last field read is an error.
        for cut in 1..encoding.len() {
            let fields: Vec<_> = Fields(&encoding[..cut]).collect();
            let whole: usize = fields
                .iter()
                .filter_map(|field| field.as_ref().ok())
                .map(|field| field.whole.len())
                .sum();
            if whole != cut {
                assert!(matches!(fields.last(), Some(Err(_))), "cut at {cut}");
            }
        }
        for bad in [
            &[0x00][..],                           // tag 0
            &[0x0b],                               // a group's start
            &[0x0e],                               // wire type 6
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x01], // a key past u32
            &[0x0a, 0x05, 0x01],                   // a length past the end
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ], // a varint too long
        ] {
            assert!(
                matches!(Fields(bad).next(), Some(Err(_))),
                "{bad:?} was read"
            );
        }
    }

    #[test]
    fn a_delimited_head_is_what_prost_writes() {
        use prost::encoding::{encode_key, encode_varint};
        for tag in [1, 15, 16, 2047, 2048, 536_870_911] {
            for len in [0, 1, 127, 128, 16_383, 16_384, 1 << 40] {
                let mut ours = BytesMut::new();
                put_delimited_head(&mut ours, tag, len);
                let mut theirs = Vec::new();
                encode_key(tag, WireType::LengthDelimited, &mut theirs);
                encode_varint(len as u64, &mut theirs);
                assert_eq!(&ours[..], &theirs[..], "tag {tag}, length {len}");
            }
        }
    }
}
