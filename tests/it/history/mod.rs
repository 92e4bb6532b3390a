//! Conversation control over a session's history: rollback, edit, redact,
//! fork, summaries across those, transcripts, per-session state, search and
//! retention. Every mutation is checked to be exactly one revision.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::content_block::Block;
use sessionstore_client::v1::session_event::Event;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::support::*;

type Client = SessionStoreClient<Channel>;

// ---------------------------------------------------------------------------
// Helpers

/// Opens a watch after `after_revision` and reads up to its `caught_up`.
async fn watch_caught_up(client: &mut Client, id: &str, after_revision: i64) -> Events {
    let mut stream = watch(client, id, after_revision).await;
    let mut last = after_revision;
    loop {
        let event = next_change(&mut stream).await;
        if matches!(event.event, Some(Event::CaughtUp(_))) {
            assert_eq!(event.revision, last, "caught_up carries the last revision");
            return stream;
        }
        last = event.revision;
    }
}

/// Every stored event of a session, replayed from the beginning.
async fn replay(client: &mut Client, id: &str) -> Vec<pb::SessionEvent> {
    let mut stream = watch(client, id, 0).await;
    let mut events = Vec::new();
    loop {
        let event = next_change(&mut stream).await;
        if matches!(event.event, Some(Event::CaughtUp(_))) {
            let revisions: Vec<i64> = events
                .iter()
                .map(|e: &pb::SessionEvent| e.revision)
                .collect();
            let expected: Vec<i64> = (1..=event.revision).collect();
            assert_eq!(revisions, expected, "replay is gap-free from revision 1");
            return events;
        }
        events.push(event);
    }
}

async fn try_get(client: &mut Client, id: &str) -> Result<pb::Session, Status> {
    client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn rollback(
    client: &mut Client,
    id: &str,
    after_sequence: i64,
) -> Result<pb::RollbackSessionResponse, Status> {
    client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: id.to_owned(),
            after_sequence,
            run_id: String::new(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn edit(
    client: &mut Client,
    id: &str,
    message_id: &str,
    message: Option<pb::Message>,
    reason: &str,
) -> Result<pb::EditMessageResponse, Status> {
    client
        .edit_message(pb::EditMessageRequest {
            session_id: id.to_owned(),
            message_id: message_id.to_owned(),
            message,
            reason: reason.to_owned(),
            run_id: String::new(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn redact(
    client: &mut Client,
    id: &str,
    message_id: &str,
    reason: &str,
) -> Result<pb::RedactMessageResponse, Status> {
    client
        .redact_message(pb::RedactMessageRequest {
            session_id: id.to_owned(),
            message_id: message_id.to_owned(),
            reason: reason.to_owned(),
            run_id: String::new(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn fork(
    client: &mut Client,
    id: &str,
    at_sequence: i64,
    new_session_id: &str,
) -> Result<pb::Session, Status> {
    client
        .fork_session(pb::ForkSessionRequest {
            session_id: id.to_owned(),
            at_sequence,
            new_session_id: new_session_id.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn set_summary(client: &mut Client, id: &str, message_id: &str) -> pb::Session {
    client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                summary_message_id: message_id.to_owned(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["summary_message_id".into()],
            }),
        })
        .await
        .expect("set the summary")
        .into_inner()
}

async fn export_all(client: &mut Client, id: &str, from_summary: bool) -> Vec<pb::Message> {
    export(
        client,
        pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            from_summary,
            ..Default::default()
        },
    )
    .await
}

async fn set_state(
    client: &mut Client,
    id: &str,
    key: &str,
    value: &str,
    expected_version: Option<i64>,
) -> Result<pb::StateEntry, Status> {
    client
        .set_state(pb::SetStateRequest {
            session_id: id.to_owned(),
            key: key.to_owned(),
            value: value.to_owned(),
            expected_version,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn get_state(client: &mut Client, id: &str, key: &str) -> Result<pb::StateEntry, Status> {
    client
        .get_state(pb::GetStateRequest {
            session_id: id.to_owned(),
            key: key.to_owned(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn delete_state(
    client: &mut Client,
    id: &str,
    key: &str,
    expected_version: Option<i64>,
) -> Result<pb::DeleteStateResponse, Status> {
    client
        .delete_state(pb::DeleteStateRequest {
            session_id: id.to_owned(),
            key: key.to_owned(),
            expected_version,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn list_state(
    client: &mut Client,
    id: &str,
    page_size: i32,
    page_token: &str,
) -> Result<pb::ListStateResponse, Status> {
    client
        .list_state(pb::ListStateRequest {
            session_id: id.to_owned(),
            page_size,
            page_token: page_token.to_owned(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn search(
    client: &mut Client,
    query: &str,
    user: &str,
    page_size: i32,
    page_token: &str,
) -> Result<pb::SearchMessagesResponse, Status> {
    client
        .search_messages(pb::SearchMessagesRequest {
            query: query.to_owned(),
            user: user.to_owned(),
            page_size,
            page_token: page_token.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Every hit of a search, following page tokens.
async fn search_all(client: &mut Client, query: &str, user: &str) -> Vec<pb::SearchHit> {
    let mut hits = Vec::new();
    let mut token = String::new();
    loop {
        let page = search(client, query, user, 0, &token)
            .await
            .expect("search");
        hits.extend(page.hits);
        if page.next_page_token.is_empty() {
            return hits;
        }
        token = page.next_page_token;
    }
}

/// Where a search found its words: (session id, sequence) pairs.
async fn found(client: &mut Client, query: &str, user: &str) -> BTreeSet<(String, i64)> {
    search_all(client, query, user)
        .await
        .into_iter()
        .map(|hit| (hit.session_id, hit.sequence))
        .collect()
}

fn at(session: &str, sequence: i64) -> (String, i64) {
    (session.to_owned(), sequence)
}

/// A whole transcript as its chunks. A failure may come with the call or
/// as the stream's first message.
async fn transcript_chunks(
    client: &mut Client,
    id: &str,
    format: i32,
) -> Result<Vec<Vec<u8>>, Status> {
    let mut stream = client
        .export_transcript(pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format,
            target: None,
        })
        .await?
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.message().await? {
        chunks.push(chunk.data);
    }
    Ok(chunks)
}

async fn transcript(client: &mut Client, id: &str, format: pb::TranscriptFormat) -> String {
    let chunks = transcript_chunks(client, id, format.into())
        .await
        .expect("export transcript");
    String::from_utf8(chunks.concat()).expect("a transcript is UTF-8")
}

/// Checks a failure's code and the field its BadRequest names.
#[track_caller]
fn assert_field(status: &Status, code: Code, field: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(
        error_details(status).1.as_deref(),
        Some(field),
        "{status:?}"
    );
}

/// Checks a failure's code and its ErrorInfo reason.
#[track_caller]
fn assert_reason(status: &Status, code: Code, reason: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(
        error_details(status).0.as_deref(),
        Some(reason),
        "{status:?}"
    );
}

/// A timestamp in microseconds since the epoch.
fn micros(time: Option<&prost_types::Timestamp>) -> i64 {
    let time = time.expect("a timestamp");
    time.seconds * 1_000_000 + i64::from(time.nanos / 1_000)
}

fn texts(messages: &[pb::StoredMessage]) -> Vec<&str> {
    messages.iter().map(content).collect()
}

fn ids(messages: &[pb::StoredMessage]) -> Vec<String> {
    messages.iter().map(|m| m.id.clone()).collect()
}

fn tool_call(id: &str, name: &str, arguments: &str) -> pb::ToolCall {
    pb::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
        signature: String::new(),
    }
}

fn tool_result(call_id: &str, content: &str) -> pb::Message {
    pb::Message {
        tool_call_id: call_id.into(),
        ..text(pb::Role::Tool, content)
    }
}

fn thinking(thought: &str) -> pb::ContentBlock {
    pb::ContentBlock {
        block: Some(Block::Thinking(pb::ThinkingBlock {
            thinking: thought.into(),
            signature: "sig".into(),
        })),
    }
}

fn text_block(text: &str) -> pb::ContentBlock {
    pb::ContentBlock {
        block: Some(Block::Text(pb::TextBlock {
            text: text.into(),
            signature: String::new(),
        })),
    }
}

mod edit;
mod fork;
mod newest;
mod references;
mod retention;
mod revisions;
mod rollback;
mod search;
mod state;
mod transcripts;
