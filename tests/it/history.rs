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

crate::backend_tests!(
    rollback_truncates_and_later_writes_continue,
    rollback_edges_and_errors,
    rollback_past_the_summary_clears_it,
    edit_changes_the_current_view_and_replay_keeps_the_old,
    edit_and_redact_reject_bad_requests,
    redact_erases_the_text_everywhere,
    fork_copies_history_and_stays_independent,
    fork_rejects_bad_requests,
    transcripts_render_markdown_and_openai_json,
    large_transcripts_stream_in_chunks,
    state_versions_and_conditions,
    state_lists_in_key_order_and_dies_with_the_session,
    state_keys_order_as_text_with_nul_and_backslashes,
    search_sees_only_the_current_view,
    search_pages_and_filters_by_user,
    retention_deletes_idle_sessions_only,
    every_control_write_is_one_revision,
);

type Client = SessionStoreClient<Channel>;

// ---------------------------------------------------------------------------
// Helpers

/// The next event that records a revision (skipping progress markers).
async fn next_revision(stream: &mut Events) -> pb::SessionEvent {
    loop {
        let event = next_event(stream).await;
        if !matches!(event.event, Some(Event::Progress(_))) {
            return event;
        }
    }
}

/// Opens a watch after `after_revision` and reads up to its `caught_up`.
async fn watch_caught_up(client: &mut Client, id: &str, after_revision: i64) -> Events {
    let mut stream = watch(client, id, after_revision).await;
    let mut last = after_revision;
    loop {
        let event = next_revision(&mut stream).await;
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
        let event = next_revision(&mut stream).await;
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
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn get_state(client: &mut Client, id: &str, key: &str) -> Result<pb::StateEntry, Status> {
    client
        .get_state(pb::GetStateRequest {
            session_id: id.to_owned(),
            key: key.to_owned(),
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
        block: Some(Block::Text(pb::TextBlock { text: text.into() })),
    }
}

// ---------------------------------------------------------------------------
// Rollback

async fn rollback_truncates_and_later_writes_continue(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "rb").await;
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(exchange(&mut client, "rb", &format!("q{i}"), &format!("a{i}")).await);
    }
    let mut stream = watch_caught_up(&mut client, "rb", 4).await;

    let rolled = rollback(&mut client, "rb", 2).await.unwrap();
    assert_eq!((rolled.revision, rolled.next_sequence), (5, 3));
    let event = next_revision(&mut stream).await;
    assert_eq!(event.revision, 5);
    assert!(event.time.is_some());
    let Some(Event::RolledBack(rolled_back)) = &event.event else {
        panic!(
            "expected rolled_back, got {}: {event:?}",
            event_kind(&event)
        );
    };
    let removed = vec![
        appended[1].messages[1].id.clone(),
        appended[2].messages[0].id.clone(),
        appended[2].messages[1].id.clone(),
    ];
    assert_eq!(
        rolled_back,
        &pb::RolledBack {
            after_sequence: 2,
            removed_message_ids: removed,
            next_sequence: 3,
            summary_cleared: false,
        }
    );

    // Every current read agrees; the provider calls stay.
    assert_eq!(
        texts(&all_messages(&mut client, "rb").await),
        ["q0", "a0", "q1"]
    );
    let exported = export_all(&mut client, "rb", false).await;
    assert_eq!(exported, vec![user("q0"), assistant("a0"), user("q1")]);
    let calls = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: "rb".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(calls.provider_calls.len(), 3, "provider calls are kept");
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            user: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);
    assert_eq!(listed.sessions[0].message_count, 3);
    assert_eq!(listed.sessions[0].provider_call_count, 3);
    assert_eq!(get(&mut client, "rb").await.revision, 5);

    // The removed messages are gone for good.
    let removed_id = &appended[2].messages[0].id;
    let edit_removed = edit(&mut client, "rb", removed_id, Some(user("x")), "")
        .await
        .unwrap_err();
    assert_reason(&edit_removed, Code::NotFound, "MESSAGE_NOT_FOUND");
    let redact_removed = redact(&mut client, "rb", removed_id, "").await.unwrap_err();
    assert_reason(&redact_removed, Code::NotFound, "MESSAGE_NOT_FOUND");
    let summary_removed = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "rb".into(),
                summary_message_id: removed_id.clone(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["summary_message_id".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_field(
        &summary_removed,
        Code::InvalidArgument,
        "session.summary_message_id",
    );
    assert_eq!(get(&mut client, "rb").await.revision, 5);

    // expected_next_sequence sees the new end.
    let stale = client
        .append_exchange(pb::AppendExchangeRequest {
            expected_next_sequence: Some(6),
            ..exchange_request("rb", "late", "late")
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
    let continued = client
        .append_exchange(pb::AppendExchangeRequest {
            expected_next_sequence: Some(3),
            ..exchange_request("rb", "q3", "a3")
        })
        .await
        .unwrap()
        .into_inner();
    let sequences: Vec<i64> = continued.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [3, 4]);
    assert_eq!((continued.revision, continued.next_sequence), (6, 5));
    assert_appended(&next_revision(&mut stream).await, &continued);

    // full_history compares against the rolled-back history: the old,
    // longer one no longer matches ...
    let old_history = vec![
        user("q0"),
        assistant("a0"),
        user("q1"),
        assistant("a1"),
        user("q2"),
        assistant("a2"),
        user("q9"),
    ];
    let mismatch = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "rb".into(),
            full_history: old_history,
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("a9")],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_field(&mismatch, Code::FailedPrecondition, "full_history[3]");
    // ... while the current one plus a new turn appends only the new turn.
    let current_history = vec![
        text(pb::Role::System, "You are terse."),
        user("q0"),
        assistant("a0"),
        user("q1"),
        user("q3"),
        assistant("a3"),
        user("q4"),
    ];
    let diffed = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "rb".into(),
            full_history: current_history,
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("a4")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let new: Vec<(i64, &str)> = diffed
        .messages
        .iter()
        .map(|m| (m.sequence, content(m)))
        .collect();
    assert_eq!(new, [(5, "q4"), (6, "a4")]);
    assert_eq!(diffed.revision, 7);
    assert_appended(&next_revision(&mut stream).await, &diffed);
    server.stop().await.unwrap();
}

async fn rollback_edges_and_errors(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "rbe").await;
    let first = exchange(&mut client, "rbe", "q0", "a0").await;
    let mut stream = watch_caught_up(&mut client, "rbe", 2).await;

    // At or past the end: nothing changes.
    for after in [1, 2, 100] {
        let unchanged = rollback(&mut client, "rbe", after).await.unwrap();
        assert_eq!(
            (unchanged.revision, unchanged.next_sequence),
            (2, 2),
            "rollback after {after}"
        );
    }
    let below = rollback(&mut client, "rbe", -2).await.unwrap_err();
    assert_field(&below, Code::InvalidArgument, "after_sequence");
    let ghost = rollback(&mut client, "ghost", 0).await.unwrap_err();
    assert_eq!(ghost.code(), Code::NotFound);
    assert_eq!(get(&mut client, "rbe").await.revision, 2);

    // -1 removes every message; the first event is this one, so the calls
    // above recorded nothing.
    let emptied = rollback(&mut client, "rbe", -1).await.unwrap();
    assert_eq!((emptied.revision, emptied.next_sequence), (3, 0));
    let event = next_revision(&mut stream).await;
    assert_eq!(event.revision, 3);
    let Some(Event::RolledBack(rolled_back)) = &event.event else {
        panic!(
            "expected rolled_back, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(rolled_back.after_sequence, -1);
    assert_eq!(rolled_back.removed_message_ids, ids(&first.messages));
    assert_eq!(rolled_back.next_sequence, 0);
    assert!(all_messages(&mut client, "rbe").await.is_empty());
    assert!(export_all(&mut client, "rbe", false).await.is_empty());

    // Nothing left to remove: again no revision.
    let again = rollback(&mut client, "rbe", -1).await.unwrap();
    assert_eq!((again.revision, again.next_sequence), (3, 0));

    // Appends start again at sequence 0.
    let fresh = exchange(&mut client, "rbe", "new q", "new a").await;
    let sequences: Vec<i64> = fresh.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [0, 1]);
    assert_eq!(fresh.revision, 4);
    assert_appended(&next_revision(&mut stream).await, &fresh);
    server.stop().await.unwrap();
}

async fn rollback_past_the_summary_clears_it(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "sum").await;
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(exchange(&mut client, "sum", &format!("q{i}"), &format!("a{i}")).await);
    }
    let summary_id = appended[1].messages[1].id.clone(); // a1, sequence 3
    assert_eq!(
        set_summary(&mut client, "sum", &summary_id).await.revision,
        5
    );
    let from_summary = export_all(&mut client, "sum", true).await;
    assert_eq!(
        from_summary,
        vec![assistant("a1"), user("q2"), assistant("a2")]
    );

    // Keeping the summary message keeps the marker.
    let kept = rollback(&mut client, "sum", 3).await.unwrap();
    assert_eq!(kept.revision, 6);
    assert_eq!(get(&mut client, "sum").await.summary_message_id, summary_id);
    assert_eq!(
        export_all(&mut client, "sum", true).await,
        vec![assistant("a1")]
    );

    // Removing it clears the marker: from_summary then exports everything.
    let cleared = rollback(&mut client, "sum", 2).await.unwrap();
    assert_eq!(cleared.revision, 7);
    let session = get(&mut client, "sum").await;
    assert_eq!(session.summary_message_id, "");
    assert_eq!(session.revision, 7);
    assert_eq!(
        export_all(&mut client, "sum", true).await,
        vec![user("q0"), assistant("a0"), user("q1")]
    );

    let events = replay(&mut client, "sum").await;
    let cleared_flags: Vec<(i64, bool)> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::RolledBack(r)) => Some((e.revision, r.summary_cleared)),
            _ => None,
        })
        .collect();
    assert_eq!(cleared_flags, [(6, false), (7, true)]);

    // A message appended later can become the new summary.
    let later = exchange(&mut client, "sum", "q3", "a3").await;
    set_summary(&mut client, "sum", &later.messages[0].id).await;
    assert_eq!(
        export_all(&mut client, "sum", true).await,
        vec![user("q3"), assistant("a3")]
    );
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// Edit and redact

async fn edit_changes_the_current_view_and_replay_keeps_the_old(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "ed").await;
    let first = exchange(&mut client, "ed", "q0", "a0").await;
    exchange(&mut client, "ed", "q1", "a1").await;
    let before = all_messages(&mut client, "ed").await;
    let mut stream = watch_caught_up(&mut client, "ed", 3).await;

    let target = &first.messages[1];
    let corrected = pb::Message {
        metadata: [("edited".to_owned(), "yes".to_owned())].into(),
        ..assistant("a0, corrected")
    };
    let edited = edit(
        &mut client,
        "ed",
        &target.id,
        Some(corrected.clone()),
        "typo",
    )
    .await
    .unwrap();
    assert_eq!(edited.revision, 4);
    let stored = edited.message.clone().unwrap();
    assert_eq!(
        (
            stored.id.as_str(),
            stored.sequence,
            stored.session_id.as_str()
        ),
        (target.id.as_str(), 1, "ed")
    );
    assert_eq!(stored.message.as_ref(), Some(&corrected));
    assert!(!stored.redacted);

    let event = next_revision(&mut stream).await;
    assert_eq!(event.revision, 4);
    let Some(Event::MessageEdited(message_edited)) = &event.event else {
        panic!(
            "expected message_edited, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(message_edited.message.as_ref(), Some(&stored));
    assert_eq!(message_edited.previous.as_ref(), Some(&assistant("a0")));
    assert_eq!(message_edited.reason, "typo");

    // The current view shows the new text at the same ids and sequences.
    let after = all_messages(&mut client, "ed").await;
    assert_eq!(ids(&after), ids(&before));
    assert_eq!(texts(&after), ["q0", "a0, corrected", "q1", "a1"]);
    assert_eq!(after[1], stored);
    assert_eq!(
        export_all(&mut client, "ed", false).await,
        vec![user("q0"), corrected.clone(), user("q1"), assistant("a1")]
    );

    // The replay keeps the original text where it was appended.
    let events = replay(&mut client, "ed").await;
    assert_appended(&events[1], &first);
    assert_eq!(events[3], event);

    // A second edit's previous is the first edit.
    let again = edit(
        &mut client,
        "ed",
        &target.id,
        Some(assistant("a0, final")),
        "",
    )
    .await
    .unwrap();
    assert_eq!(again.revision, 5);
    let event = next_revision(&mut stream).await;
    let Some(Event::MessageEdited(message_edited)) = &event.event else {
        panic!(
            "expected message_edited, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(message_edited.previous.as_ref(), Some(&corrected));
    assert_eq!(event.revision, again.revision);
    assert_eq!(get(&mut client, "ed").await.revision, 5);
    server.stop().await.unwrap();
}

async fn edit_and_redact_reject_bad_requests(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "bad").await;
    create(&mut client, "other").await;
    let mine = exchange(&mut client, "bad", "q", "a").await;
    let theirs = exchange(&mut client, "other", "q", "a").await;
    let id = mine.messages[0].id.clone();
    let foreign = theirs.messages[0].id.clone();
    let new = || Some(user("new"));

    let unknown = edit(&mut client, "bad", "msg_nope", new(), "")
        .await
        .unwrap_err();
    assert_reason(&unknown, Code::NotFound, "MESSAGE_NOT_FOUND");
    let elsewhere = edit(&mut client, "bad", &foreign, new(), "")
        .await
        .unwrap_err();
    assert_reason(&elsewhere, Code::NotFound, "MESSAGE_NOT_FOUND");
    let missing = edit(&mut client, "bad", &id, None, "").await.unwrap_err();
    assert_field(&missing, Code::InvalidArgument, "message");
    let roleless = edit(&mut client, "bad", &id, Some(pb::Message::default()), "")
        .await
        .unwrap_err();
    assert_field(&roleless, Code::InvalidArgument, "message.role");
    let no_id = edit(&mut client, "bad", "", new(), "").await.unwrap_err();
    assert_field(&no_id, Code::InvalidArgument, "message_id");
    let ghost = edit(&mut client, "ghost", &id, new(), "")
        .await
        .unwrap_err();
    assert_reason(&ghost, Code::NotFound, "SESSION_NOT_FOUND");

    let unknown = redact(&mut client, "bad", "msg_nope", "")
        .await
        .unwrap_err();
    assert_reason(&unknown, Code::NotFound, "MESSAGE_NOT_FOUND");
    let elsewhere = redact(&mut client, "bad", &foreign, "").await.unwrap_err();
    assert_reason(&elsewhere, Code::NotFound, "MESSAGE_NOT_FOUND");
    let no_id = redact(&mut client, "bad", "", "").await.unwrap_err();
    assert_field(&no_id, Code::InvalidArgument, "message_id");
    let ghost = redact(&mut client, "ghost", &id, "").await.unwrap_err();
    assert_reason(&ghost, Code::NotFound, "SESSION_NOT_FOUND");

    // Nothing was written anywhere.
    assert_eq!(get(&mut client, "bad").await.revision, 2);
    assert_eq!(get(&mut client, "other").await.revision, 2);
    assert_eq!(all_messages(&mut client, "bad").await, mine.messages);
    assert_eq!(all_messages(&mut client, "other").await, theirs.messages);
    server.stop().await.unwrap();
}

async fn redact_erases_the_text_everywhere(backend: Backend) {
    const SECRETS: [&str; 8] = [
        "secretcard",
        "secretcity",
        "secretedit",
        "secrettooltext",
        "secretarg",
        "secretthought",
        "secretblock",
        "secretresult",
    ];
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    // Sequence 0 arrives with the session (in its session_created event).
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "red".into(),
            user: "alice".into(),
            initial_history: vec![user("my card is secretcard"), assistant("noted")],
            ..Default::default()
        })
        .await
        .unwrap();
    let asks = pb::Message {
        content_blocks: vec![thinking("secretthought"), text_block("secretblock")],
        tool_calls: vec![tool_call("call_9", "weather", r#"{"city":"secretarg"}"#)],
        ..assistant("calling secrettooltext")
    };
    let first_request = pb::AppendExchangeRequest {
        session_id: "red".into(),
        messages: vec![user("weather in secretcity")],
        provider_call: Some(call("m", 1, 1, 1)),
        response_messages: vec![asks.clone()],
        request_id: "req-1".into(),
        ..Default::default()
    };
    let first = client
        .append_exchange(first_request.clone())
        .await
        .unwrap()
        .into_inner();
    let answer = pb::Message {
        name: "weather".into(),
        ..tool_result("call_9", "secretresult sunny")
    };
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "red".into(),
            messages: vec![answer.clone()],
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("it is sunny")],
            ..Default::default()
        })
        .await
        .unwrap();
    // An edit first, so its event carries the text twice (new and previous).
    edit(
        &mut client,
        "red",
        &first.messages[0].id,
        Some(user("weather in secretedit")),
        "fix",
    )
    .await
    .unwrap();
    let before = all_messages(&mut client, "red").await;
    assert_eq!(before.len(), 6);
    let mut stream = watch_caught_up(&mut client, "red", 4).await;

    // Redact sequences 0 (initial history), 2 (edited), 3 (tool calls), 4 (tool result).
    for (n, sequence) in [0_usize, 2, 3, 4].into_iter().enumerate() {
        let target = &before[sequence];
        let redacted = redact(&mut client, "red", &target.id, "pii").await.unwrap();
        assert_eq!(redacted.revision, 5 + i64::try_from(n).unwrap());
        let event = next_revision(&mut stream).await;
        assert_eq!(event.revision, redacted.revision);
        let Some(Event::MessageRedacted(message_redacted)) = &event.event else {
            panic!(
                "expected message_redacted, got {}: {event:?}",
                event_kind(&event)
            );
        };
        assert_eq!(
            message_redacted,
            &pb::MessageRedacted {
                message_id: target.id.clone(),
                sequence: target.sequence,
                reason: "pii".into(),
            }
        );
    }

    // Current reads: markers at the same ids and sequences, with only the
    // role and tool-call structure left.
    let after = all_messages(&mut client, "red").await;
    assert_eq!(ids(&after), ids(&before));
    let marker = |role: pb::Role| pb::Message {
        role: role.into(),
        ..Default::default()
    };
    let expected_markers = [
        (0, marker(pb::Role::User)),
        (2, marker(pb::Role::User)),
        (
            3,
            pb::Message {
                tool_calls: vec![tool_call("call_9", "weather", "{}")],
                ..marker(pb::Role::Assistant)
            },
        ),
        (
            4,
            pb::Message {
                tool_call_id: "call_9".into(),
                ..marker(pb::Role::Tool)
            },
        ),
    ];
    for (sequence, expected) in &expected_markers {
        let stored = &after[*sequence];
        assert!(stored.redacted, "sequence {sequence} is marked redacted");
        assert_eq!(stored.sequence, before[*sequence].sequence);
        assert_eq!(
            stored.message.as_ref(),
            Some(expected),
            "sequence {sequence}"
        );
    }
    for sequence in [1, 5] {
        assert!(!after[sequence].redacted);
        assert_eq!(after[sequence], before[sequence]);
    }
    let exported = export_all(&mut client, "red", false).await;
    assert_eq!(exported.len(), 6);
    assert_eq!(exported[3], expected_markers[2].1);
    assert_eq!(exported[1], assistant("noted"));

    // The replay from the beginning holds none of the erased text ...
    let events = replay(&mut client, "red").await;
    let dump = format!("{events:?}").to_lowercase();
    for secret in SECRETS {
        assert!(!dump.contains(secret), "{secret:?} survives in the replay");
    }
    // ... but still every event, with the markers in place.
    let kinds: Vec<&str> = events.iter().map(event_kind).collect();
    assert_eq!(
        kinds,
        [
            "session_created",
            "exchange_appended",
            "exchange_appended",
            "message_edited",
            "message_redacted",
            "message_redacted",
            "message_redacted",
            "message_redacted",
        ]
    );
    let Some(Event::SessionCreated(created)) = &events[0].event else {
        unreachable!()
    };
    assert!(created.messages[0].redacted);
    assert_eq!(content(&created.messages[0]), "");
    assert_eq!(content(&created.messages[1]), "noted");
    let Some(Event::MessageEdited(edited)) = &events[3].event else {
        unreachable!()
    };
    let edited_now = edited.message.as_ref().unwrap();
    assert!(edited_now.redacted);
    assert_eq!(content(edited_now), "");
    assert_eq!(
        edited.previous.as_ref().map(|m| m.content.as_str()),
        Some("")
    );
    assert_eq!(edited.reason, "fix");

    // An idempotent retry of the first exchange answers with the markers.
    let retried = client
        .append_exchange(first_request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried.revision, first.revision);
    assert_eq!(ids(&retried.messages), ids(&first.messages));
    let dump = format!("{retried:?}").to_lowercase();
    for secret in SECRETS {
        assert!(!dump.contains(secret), "{secret:?} survives in a retry");
    }

    // Search finds none of it, but still the rest.
    for secret in SECRETS {
        assert!(
            found(&mut client, secret, "").await.is_empty(),
            "search still finds {secret:?}"
        );
    }
    assert_eq!(found(&mut client, "noted", "").await, [at("red", 1)].into());
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// Fork

async fn fork_copies_history_and_stays_independent(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let metadata: std::collections::BTreeMap<String, String> =
        [("team".to_owned(), "blue".to_owned())].into();
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "src".into(),
            title: "Source".into(),
            system_prompt: "Be kind.".into(),
            user: "carol".into(),
            metadata: metadata.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..3 {
        exchange(&mut client, "src", &format!("q{i}"), &format!("a{i}")).await;
    }
    let source_messages = all_messages(&mut client, "src").await;
    set_summary(&mut client, "src", &source_messages[1].id).await;
    redact(&mut client, "src", &source_messages[2].id, "")
        .await
        .unwrap();
    set_state(&mut client, "src", "cwd", "/src", None)
        .await
        .unwrap();
    let source_messages = all_messages(&mut client, "src").await;
    let source_revision = get(&mut client, "src").await.revision;

    let forked = fork(&mut client, "src", 3, "dst").await.unwrap();
    assert_eq!(forked.id, "dst");
    assert_eq!(forked.parent_session_id, "src");
    assert_eq!(forked.parent_sequence, 3);
    assert_eq!(forked.title, "Source");
    assert_eq!(forked.system_prompt, "Be kind.");
    assert_eq!(forked.user, "carol");
    assert_eq!(forked.metadata, metadata);
    assert_eq!(forked.revision, 1);
    assert_eq!(get(&mut client, "dst").await, forked);
    assert_eq!(
        get(&mut client, "src").await.revision,
        source_revision,
        "forking does not change the source"
    );

    // The history up to the sequence, same content, new ids, no call links,
    // the redaction marker still redacted.
    let copied = all_messages(&mut client, "dst").await;
    assert_eq!(copied.len(), 4);
    for (copy, original) in copied.iter().zip(&source_messages) {
        assert_eq!(copy.sequence, original.sequence);
        assert_eq!(copy.message, original.message);
        assert_eq!(copy.redacted, original.redacted);
        assert_eq!(copy.session_id, "dst");
        assert_eq!(copy.produced_by_call_id, "");
        assert!(copy.id.starts_with("msg_"), "{}", copy.id);
        assert!(
            source_messages.iter().all(|m| m.id != copy.id),
            "copies get new ids"
        );
    }
    assert!(copied[2].redacted);

    // The summary marker points at the copy of the summary message.
    assert_eq!(forked.summary_message_id, copied[1].id);
    let from_summary = export_all(&mut client, "dst", true).await;
    assert_eq!(from_summary.len(), 3);
    assert_eq!(from_summary[0], assistant("a0"));

    // State is not copied.
    let state = get_state(&mut client, "dst", "cwd").await.unwrap_err();
    assert_reason(&state, Code::NotFound, "STATE_NOT_FOUND");
    assert!(
        list_state(&mut client, "dst", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );

    // One session_created event with the copied history.
    let events = replay(&mut client, "dst").await;
    assert_eq!(events.len(), 1);
    let Some(Event::SessionCreated(created)) = &events[0].event else {
        panic!("expected session_created, got {:?}", events[0]);
    };
    assert_eq!(created.session.as_ref(), Some(&forked));
    assert_eq!(created.messages, copied);

    // Later writes to either never affect the other.
    let appended = exchange(&mut client, "dst", "fork q", "fork a").await;
    assert_eq!(appended.messages[0].sequence, 4);
    assert_eq!(all_messages(&mut client, "src").await, source_messages);
    edit(
        &mut client,
        "src",
        &source_messages[0].id,
        Some(user("changed")),
        "",
    )
    .await
    .unwrap();
    rollback(&mut client, "src", -1).await.unwrap();
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "src".into(),
        })
        .await
        .unwrap();
    let fork_now = all_messages(&mut client, "dst").await;
    assert_eq!(texts(&fork_now), ["q0", "a0", "", "a1", "fork q", "fork a"]);
    assert_eq!(fork_now[..4], copied[..]);
    let dst = get(&mut client, "dst").await;
    assert_eq!(dst.parent_session_id, "src");
    assert_eq!(dst.revision, 2);
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            user: "carol".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);
    assert_eq!(listed.sessions[0].message_count, 6);
    server.stop().await.unwrap();
}

async fn fork_rejects_bad_requests(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "fsrc").await;
    create(&mut client, "taken").await;
    let appended = exchange(&mut client, "fsrc", "q", "a").await;
    set_summary(&mut client, "fsrc", &appended.messages[1].id).await;

    for at in [2, 100, -2] {
        let past = fork(&mut client, "fsrc", at, "").await.unwrap_err();
        assert_field(&past, Code::InvalidArgument, "at_sequence");
    }
    let ghost = fork(&mut client, "ghost", 0, "").await.unwrap_err();
    assert_reason(&ghost, Code::NotFound, "SESSION_NOT_FOUND");
    let taken = fork(&mut client, "fsrc", 0, "taken").await.unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists);
    assert_eq!(get(&mut client, "taken").await.revision, 1);

    // -1: no messages; the server makes the id.
    let empty = fork(&mut client, "fsrc", -1, "").await.unwrap();
    assert!(empty.id.starts_with("ses_"), "{}", empty.id);
    assert_eq!(empty.parent_sequence, -1);
    assert_eq!(empty.summary_message_id, "", "the summary was not copied");
    assert!(all_messages(&mut client, &empty.id).await.is_empty());
    let appended = exchange(&mut client, &empty.id, "first", "reply").await;
    assert_eq!(appended.messages[0].sequence, 0);

    // A summary past the copied range is not carried over.
    let head = fork(&mut client, "fsrc", 0, "").await.unwrap();
    assert_eq!(head.summary_message_id, "");
    assert_ne!(head.id, empty.id);
    assert_eq!(texts(&all_messages(&mut client, &head.id).await), ["q"]);
    assert_eq!(get(&mut client, "fsrc").await.revision, 3);
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// Transcripts

async fn transcripts_render_markdown_and_openai_json(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let history = vec![
        user("Where to go?"),
        pb::Message {
            content_blocks: vec![
                thinking("the user likes mountains"),
                text_block("Try the Alps."),
            ],
            ..assistant("")
        },
        pb::Message {
            tool_calls: vec![
                tool_call("call_1", "get_weather", r#"{"city": "Zermatt"}"#),
                tool_call("call_2", "get_news", r#"{"topic": "Zerm"#),
            ],
            ..assistant("")
        },
        tool_result("call_1", "sunny"),
        user("my passport is P123SECRET"),
        assistant("nul\u{0}inside and a \\ backslash"),
    ];
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "tr".into(),
            title: "Trip planning".into(),
            system_prompt: "You are terse.".into(),
            user: "alice".into(),
            initial_history: history,
            ..Default::default()
        })
        .await
        .unwrap();
    let stored = all_messages(&mut client, "tr").await;
    redact(&mut client, "tr", &stored[4].id, "").await.unwrap();

    // Markdown.
    let markdown = transcript(&mut client, "tr", pb::TranscriptFormat::Markdown).await;
    assert!(markdown.starts_with("# Trip planning\n"), "{markdown}");
    assert!(
        markdown.contains("## System\n\nYou are terse.\n"),
        "{markdown}"
    );
    let headings: Vec<&str> = markdown.lines().filter(|l| l.starts_with("## ")).collect();
    let expected = [
        "## System",
        "## User",
        "## Assistant",
        "## Assistant",
        "## Tool",
        "## User",
        "## Assistant",
    ];
    assert_eq!(headings.len(), expected.len(), "{markdown}");
    for (heading, prefix) in headings.iter().zip(expected) {
        assert!(heading.starts_with(prefix), "{heading:?} is not {prefix:?}");
    }
    let details = markdown.find("<details>").expect("thinking is collapsed");
    let thought = markdown.find("the user likes mountains").unwrap();
    let closed = markdown.find("</details>").unwrap();
    assert!(details < thought && thought < closed, "{markdown}");
    assert!(markdown.contains("Try the Alps."));
    assert!(
        markdown.contains("**Tool call** `get_weather`"),
        "{markdown}"
    );
    assert!(markdown.contains("**Tool call** `get_news`"), "{markdown}");
    let lines: Vec<&str> = markdown.lines().collect();
    for arguments in [r#"{"city": "Zermatt"}"#, r#"{"topic": "Zerm"#] {
        let at = lines
            .iter()
            .position(|l| *l == arguments)
            .unwrap_or_else(|| panic!("arguments {arguments:?} on a line of their own"));
        assert!(lines[at - 1].starts_with("```"), "{markdown}");
        assert!(lines[at + 1].starts_with("```"), "{markdown}");
    }
    assert!(markdown.contains("sunny"));
    assert!(markdown.contains("_[redacted]_"), "{markdown}");
    assert!(!markdown.contains("P123SECRET"));

    // OpenAI Chat Completions JSON.
    let openai = transcript(&mut client, "tr", pb::TranscriptFormat::OpenaiJson).await;
    let array: Vec<Value> = serde_json::from_str(&openai).expect("a JSON array");
    assert_eq!(array.len(), 7, "{openai}");
    assert_eq!(
        array[0],
        json!({"role": "system", "content": "You are terse."})
    );
    assert_eq!(array[1], json!({"role": "user", "content": "Where to go?"}));
    assert_eq!(array[2]["role"], "assistant");
    let thought_free = array[2].to_string();
    assert!(thought_free.contains("Try the Alps."), "{thought_free}");
    assert!(!thought_free.contains("mountains"), "thinking is omitted");
    assert_eq!(array[3]["role"], "assistant");
    assert_eq!(
        array[3]["tool_calls"],
        json!([
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": r#"{"city": "Zermatt"}"#}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_news", "arguments": r#"{"topic": "Zerm"#}},
        ])
    );
    assert_eq!(array[4]["role"], "tool");
    assert_eq!(array[4]["tool_call_id"], "call_1");
    assert_eq!(array[4]["content"], "sunny");
    assert_eq!(array[5]["role"], "user");
    assert_eq!(array[5]["content"], "");
    assert!(!openai.contains("P123SECRET"));
    assert_eq!(
        array[6],
        json!({"role": "assistant", "content": "nul\u{0}inside and a \\ backslash"})
    );

    // Without a prompt there is no system message.
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "bare".into(),
            initial_history: vec![user("hi")],
            ..Default::default()
        })
        .await
        .unwrap();
    let bare = transcript(&mut client, "bare", pb::TranscriptFormat::OpenaiJson).await;
    let bare: Value = serde_json::from_str(&bare).unwrap();
    assert_eq!(bare, json!([{"role": "user", "content": "hi"}]));
    let bare_markdown = transcript(&mut client, "bare", pb::TranscriptFormat::Markdown).await;
    assert!(!bare_markdown.contains("## System"), "{bare_markdown}");
    assert!(bare_markdown.contains("## User"), "{bare_markdown}");

    // Errors.
    for format in [pb::TranscriptFormat::Unspecified as i32, 99] {
        let bad = transcript_chunks(&mut client, "tr", format)
            .await
            .unwrap_err();
        assert_field(&bad, Code::InvalidArgument, "format");
    }
    let ghost = transcript_chunks(&mut client, "ghost", pb::TranscriptFormat::Markdown.into())
        .await
        .unwrap_err();
    assert_eq!(ghost.code(), Code::NotFound);
    server.stop().await.unwrap();
}

async fn large_transcripts_stream_in_chunks(backend: Backend) {
    const MESSAGES: usize = 3_000;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let body = |i: usize| format!("{i:05} {}", "x".repeat(1_018));
    let history: Vec<pb::Message> = (0..MESSAGES)
        .map(|i| {
            if i % 2 == 0 {
                user(&body(i))
            } else {
                assistant(&body(i))
            }
        })
        .collect();
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "big".into(),
            title: "Big".into(),
            system_prompt: "Be long.".into(),
            initial_history: history,
            ..Default::default()
        })
        .await
        .unwrap();

    let chunks = transcript_chunks(&mut client, "big", pb::TranscriptFormat::OpenaiJson.into())
        .await
        .unwrap();
    assert!(chunks.len() > 1, "{} chunk(s)", chunks.len());
    let array: Vec<Value> =
        serde_json::from_slice(&chunks.concat()).expect("the chunks form one JSON array");
    assert_eq!(array.len(), MESSAGES + 1);
    assert_eq!(array[0]["content"], "Be long.");
    for (i, message) in array[1..].iter().enumerate() {
        assert_eq!(
            message["content"].as_str(),
            Some(body(i).as_str()),
            "message {i}"
        );
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        assert_eq!(message["role"], role);
    }

    let chunks = transcript_chunks(&mut client, "big", pb::TranscriptFormat::Markdown.into())
        .await
        .unwrap();
    assert!(chunks.len() > 1, "{} chunk(s)", chunks.len());
    let markdown = String::from_utf8(chunks.concat()).unwrap();
    let users = markdown.lines().filter(|l| *l == "## User").count();
    let assistants = markdown.lines().filter(|l| *l == "## Assistant").count();
    assert_eq!((users, assistants), (MESSAGES / 2, MESSAGES / 2));
    assert!(markdown.contains(&body(0)));
    assert!(markdown.contains(&body(MESSAGES - 1)));
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// State

async fn state_versions_and_conditions(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "st").await;
    let mut stream = watch_caught_up(&mut client, "st", 1).await;

    let first = set_state(&mut client, "st", "cwd", "/home/alice", None)
        .await
        .unwrap();
    assert_eq!(
        (first.key.as_str(), first.value.as_str(), first.version),
        ("cwd", "/home/alice", 2)
    );
    assert!(first.update_time.is_some());
    assert_eq!(get_state(&mut client, "st", "cwd").await.unwrap(), first);
    let second = set_state(&mut client, "st", "cwd", "/tmp", None)
        .await
        .unwrap();
    assert_eq!(second.version, 3, "every write changes the version");

    // Conditional writes: a mismatch writes nothing.
    for expected in [0, 2, 99] {
        let mismatch = set_state(&mut client, "st", "cwd", "/nope", Some(expected))
            .await
            .unwrap_err();
        assert_reason(&mismatch, Code::Aborted, "STATE_VERSION_MISMATCH");
    }
    assert_eq!(get_state(&mut client, "st", "cwd").await.unwrap(), second);
    assert_eq!(get(&mut client, "st").await.revision, 3);
    let third = set_state(&mut client, "st", "cwd", "/srv", Some(3))
        .await
        .unwrap();
    assert_eq!(third.version, 4);
    let tricky = "a.rs\u{0}b.rs\\c \\0 \\\\ é";
    let files = set_state(&mut client, "st", "files", tricky, Some(0))
        .await
        .unwrap();
    assert_eq!(files.version, 5);
    assert_eq!(
        get_state(&mut client, "st", "files").await.unwrap().value,
        tricky
    );

    // Deletes.
    let stale = delete_state(&mut client, "st", "cwd", Some(3))
        .await
        .unwrap_err();
    assert_reason(&stale, Code::Aborted, "STATE_VERSION_MISMATCH");
    let deleted = delete_state(&mut client, "st", "cwd", Some(4))
        .await
        .unwrap();
    assert_eq!(deleted.revision, 6);
    let gone = get_state(&mut client, "st", "cwd").await.unwrap_err();
    assert_reason(&gone, Code::NotFound, "STATE_NOT_FOUND");
    let again = delete_state(&mut client, "st", "cwd", None)
        .await
        .unwrap_err();
    assert_reason(&again, Code::NotFound, "STATE_NOT_FOUND");
    let recreated = set_state(&mut client, "st", "cwd", "/again", Some(0))
        .await
        .unwrap();
    assert_eq!(recreated.version, 7);

    // Each write was one revision and one state_changed event.
    let mut changes = Vec::new();
    for revision in 2..=7 {
        let event = next_revision(&mut stream).await;
        assert_eq!(event.revision, revision);
        let Some(Event::StateChanged(changed)) = event.event else {
            panic!("expected state_changed at revision {revision}, got {event:?}");
        };
        changes.push(changed);
    }
    let change = |key: &str, value: &str, version: i64, deleted: bool| pb::StateChanged {
        key: key.into(),
        value: value.into(),
        version,
        deleted,
    };
    assert_eq!(
        changes,
        [
            change("cwd", "/home/alice", 2, false),
            change("cwd", "/tmp", 3, false),
            change("cwd", "/srv", 4, false),
            change("files", tricky, 5, false),
            change("cwd", "", 6, true),
            change("cwd", "/again", 7, false),
        ]
    );

    // Bad requests write nothing.
    let no_key = set_state(&mut client, "st", "", "v", None)
        .await
        .unwrap_err();
    assert_field(&no_key, Code::InvalidArgument, "key");
    let no_key = get_state(&mut client, "st", "").await.unwrap_err();
    assert_field(&no_key, Code::InvalidArgument, "key");
    let no_key = delete_state(&mut client, "st", "", None).await.unwrap_err();
    assert_field(&no_key, Code::InvalidArgument, "key");
    let negative = set_state(&mut client, "st", "k", "v", Some(-1))
        .await
        .unwrap_err();
    assert_field(&negative, Code::InvalidArgument, "expected_version");
    let huge = "v".repeat(64 * 1024 + 1);
    let too_big = set_state(&mut client, "st", "big", &huge, None)
        .await
        .unwrap_err();
    assert_eq!(too_big.code(), Code::ResourceExhausted, "{too_big:?}");
    for status in [
        set_state(&mut client, "ghost", "k", "v", None)
            .await
            .unwrap_err(),
        get_state(&mut client, "ghost", "k").await.unwrap_err(),
        delete_state(&mut client, "ghost", "k", None)
            .await
            .unwrap_err(),
        list_state(&mut client, "ghost", 0, "").await.unwrap_err(),
    ] {
        assert_reason(&status, Code::NotFound, "SESSION_NOT_FOUND");
    }
    assert_eq!(get(&mut client, "st").await.revision, 7);
    // 64 KiB exactly is allowed.
    let largest = set_state(&mut client, "st", "big", &huge[1..], None)
        .await
        .unwrap();
    assert_eq!(largest.value.len(), 64 * 1024);
    assert_eq!(largest.version, 8);
    server.stop().await.unwrap();
}

async fn state_lists_in_key_order_and_dies_with_the_session(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "ls").await;
    for key in ["k05", "k01", "k07", "k03", "k02", "k06", "k04"] {
        set_state(&mut client, "ls", key, &key.to_uppercase(), None)
            .await
            .unwrap();
    }
    let all: Vec<String> = (1..=7).map(|i| format!("k{i:02}")).collect();

    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = list_state(&mut client, "ls", 3, &token).await.unwrap();
        for entry in &page.entries {
            assert_eq!(entry.value, entry.key.to_uppercase());
            assert!(entry.version > 1);
        }
        pages.push(page.entries.into_iter().map(|e| e.key).collect::<Vec<_>>());
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, [&all[0..3], &all[3..6], &all[6..7]]);
    let default_page = list_state(&mut client, "ls", 0, "").await.unwrap();
    let keys: Vec<String> = default_page.entries.into_iter().map(|e| e.key).collect();
    assert_eq!(keys, all);
    assert!(default_page.next_page_token.is_empty());
    let negative = list_state(&mut client, "ls", -1, "").await.unwrap_err();
    assert_field(&negative, Code::InvalidArgument, "page_size");

    // State is deleted with its session: a new session of the same id has none.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "ls".into(),
        })
        .await
        .unwrap();
    create(&mut client, "ls").await;
    let gone = get_state(&mut client, "ls", "k01").await.unwrap_err();
    assert_reason(&gone, Code::NotFound, "STATE_NOT_FOUND");
    assert!(
        list_state(&mut client, "ls", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );

    server.stop().await.unwrap();
}

async fn state_keys_order_as_text_with_nul_and_backslashes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "keys").await;
    // Keys are text like any other, U+0000 and backslashes included; the
    // listing follows their order ("a\u{0}z" before "a!").
    let keys = ["a", "a\u{0}z", "a!", "a\\", "a\\\u{0}", "b"];
    for key in keys.iter().rev() {
        set_state(&mut client, "keys", key, key, None)
            .await
            .unwrap();
    }
    for key in keys {
        assert_eq!(
            get_state(&mut client, "keys", key).await.unwrap().value,
            key
        );
    }
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let page = list_state(&mut client, "keys", 2, &token).await.unwrap();
        listed.extend(page.entries.into_iter().map(|e| e.key));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed, sorted, "entries in key order");
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// Search

async fn search_sees_only_the_current_view(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "s_alice").await;
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "s_bob".into(),
            title: "Bob's".into(),
            user: "bob".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    create(&mut client, "s_gone").await;

    let first = exchange(
        &mut client,
        "s_alice",
        "Where is the AARDVARK habitat?",
        "Aardvarks live in Africa.",
    )
    .await;
    exchange(
        &mut client,
        "s_alice",
        "tell me about the pangolin",
        "scaly",
    )
    .await;
    exchange(&mut client, "s_bob", "aardvark again", "alpha\u{0}omega").await;
    exchange(&mut client, "s_gone", "aardvark doomed", "x").await;

    // Case-insensitive words, every one of them.
    let expected: BTreeSet<_> = [at("s_alice", 0), at("s_bob", 0), at("s_gone", 0)].into();
    assert_eq!(found(&mut client, "aardvark", "").await, expected);
    assert_eq!(found(&mut client, "aArDvArK", "").await, expected);
    assert_eq!(
        found(&mut client, "habitat AARDVARK", "").await,
        [at("s_alice", 0)].into()
    );
    assert!(found(&mut client, "aardvark elephant", "").await.is_empty());
    assert_eq!(
        found(&mut client, "aardvark", "alice").await,
        [at("s_alice", 0), at("s_gone", 0)].into()
    );
    assert_eq!(
        found(&mut client, "aardvark", "bob").await,
        [at("s_bob", 0)].into()
    );
    let hits = search_all(&mut client, "habitat", "").await;
    assert_eq!(hits.len(), 1);
    let hit = &hits[0];
    assert_eq!(hit.session_id, "s_alice");
    assert_eq!(hit.sequence, 0);
    assert_eq!(hit.message_id, first.messages[0].id);
    assert_eq!(hit.session_title, "title of s_alice");
    assert_eq!(hit.role, i32::from(pb::Role::User));
    assert!(
        hit.snippet.to_lowercase().contains("**habitat**"),
        "{:?}",
        hit.snippet
    );
    let bob = search_all(&mut client, "aardvark", "bob").await;
    assert_eq!(bob[0].session_title, "Bob's");
    // U+0000 separates words like a space.
    assert_eq!(
        found(&mut client, "omega", "").await,
        [at("s_bob", 1)].into()
    );

    // Rolled-back, edited-away, redacted and deleted text is not found;
    // the edit's new text is.
    assert_eq!(
        found(&mut client, "pangolin", "").await,
        [at("s_alice", 2)].into()
    );
    rollback(&mut client, "s_alice", 1).await.unwrap();
    assert!(found(&mut client, "pangolin", "").await.is_empty());
    assert!(found(&mut client, "scaly", "").await.is_empty());

    let zebra = exchange(&mut client, "s_alice", "any zebra?", "zebra stripes").await;
    assert_eq!(
        found(&mut client, "zebra", "").await,
        [at("s_alice", 2), at("s_alice", 3)].into()
    );
    edit(
        &mut client,
        "s_alice",
        &zebra.messages[1].id,
        Some(assistant("okapi stripes")),
        "",
    )
    .await
    .unwrap();
    assert_eq!(
        found(&mut client, "zebra", "").await,
        [at("s_alice", 2)].into()
    );
    let okapi = search_all(&mut client, "OKAPI", "").await;
    assert_eq!(okapi.len(), 1);
    assert_eq!(
        (okapi[0].sequence, okapi[0].role),
        (3, i32::from(pb::Role::Assistant))
    );
    assert_eq!(
        found(&mut client, "stripes", "").await,
        [at("s_alice", 3)].into()
    );

    let secret = exchange(&mut client, "s_alice", "my secret platypus", "noted").await;
    assert_eq!(found(&mut client, "platypus", "").await.len(), 1);
    redact(&mut client, "s_alice", &secret.messages[0].id, "")
        .await
        .unwrap();
    assert!(found(&mut client, "platypus", "").await.is_empty());

    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s_gone".into(),
        })
        .await
        .unwrap();
    assert!(found(&mut client, "doomed", "").await.is_empty());
    // A new session of the same id does not bring the old text back.
    create(&mut client, "s_gone").await;
    assert!(found(&mut client, "doomed", "").await.is_empty());
    assert_eq!(
        found(&mut client, "aardvark", "").await,
        [at("s_alice", 0), at("s_bob", 0)].into()
    );

    // A fork's copies are found in the fork too.
    fork(&mut client, "s_alice", 0, "s_fork").await.unwrap();
    assert_eq!(
        found(&mut client, "habitat", "").await,
        [at("s_alice", 0), at("s_fork", 0)].into()
    );

    for query in ["", "   "] {
        let empty = search(&mut client, query, "", 0, "").await.unwrap_err();
        assert_field(&empty, Code::InvalidArgument, "query");
    }
    server.stop().await.unwrap();
}

async fn search_pages_and_filters_by_user(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "p_alice").await;
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "p_bob".into(),
            user: "bob".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut expected = BTreeSet::new();
    for i in 0..13 {
        let appended = exchange(&mut client, "p_alice", &format!("needle {i}"), "hay").await;
        expected.insert(at("p_alice", appended.messages[0].sequence));
    }
    let mut bob = BTreeSet::new();
    for i in 0..12 {
        let appended = exchange(&mut client, "p_bob", &format!("Needle {i}"), "hay").await;
        bob.insert(at("p_bob", appended.messages[0].sequence));
    }
    expected.extend(bob.iter().cloned());

    let mut seen = Vec::new();
    let mut pages = 0;
    let mut token = String::new();
    loop {
        let page = search(&mut client, "needle", "", 7, &token).await.unwrap();
        assert!(page.hits.len() <= 7);
        pages += 1;
        seen.extend(page.hits.into_iter().map(|h| (h.session_id, h.sequence)));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(pages, 4);
    let unique: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no hit on two pages");
    assert_eq!(unique, expected);

    assert_eq!(found(&mut client, "needle", "bob").await, bob);
    assert!(found(&mut client, "needle", "nobody").await.is_empty());
    let negative = search(&mut client, "needle", "", -1, "").await.unwrap_err();
    assert_field(&negative, Code::InvalidArgument, "page_size");
    server.stop().await.unwrap();
}

/// SQLite keeps its search index in a file of its own beside the database
/// (`<database>-search`), derived from the messages: a missing one is
/// rebuilt, and so is one that holds more than the database (as after a
/// power loss that took the database's last commits but not the index's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_search_file_is_rebuilt_when_missing_or_ahead() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    let url = format!("sqlite://{}", db.display());
    let with_suffix = |suffix: &str| std::path::PathBuf::from(format!("{}{suffix}", db.display()));
    // The sequences a search finds (all in `ses_sea`).
    let found = |client: &Client, word: &'static str| {
        let mut client = client.clone();
        async move {
            search_all(&mut client, word, "")
                .await
                .iter()
                .inspect(|hit| assert_eq!(hit.session_id, "ses_sea"))
                .map(|hit| hit.sequence)
                .collect::<Vec<_>>()
        }
    };
    let server = TestServer::start_with(url.clone(), None, |_| {}).await;
    let mut client = server.client().await;
    create(&mut client, "ses_sea").await;
    exchange(&mut client, "ses_sea", "the walrus said", "it is time").await;
    assert_eq!(found(&client, "walrus").await, [0]);
    server.stop().await.unwrap();
    assert_eq!(open_files_under(dir.path()), [] as [std::path::PathBuf; 0]);
    assert!(
        with_suffix("-search").exists(),
        "the index has a file of its own"
    );
    assert_eq!(automerge(&with_suffix("-search")).await, 8);
    // The database as it was, closed cleanly (its WAL copied back).
    std::fs::copy(&db, with_suffix(".before")).unwrap();

    // Missing: rebuilt from the messages.
    for suffix in ["-search", "-search-wal", "-search-shm"] {
        let _ = std::fs::remove_file(with_suffix(suffix));
    }
    let server = TestServer::start_with(url.clone(), None, |_| {}).await;
    let mut client = server.client().await;
    assert_eq!(found(&client, "walrus").await, [0]);
    exchange(&mut client, "ses_sea", "shoes, ships", "sealing wax").await;
    assert_eq!(found(&client, "sealing").await, [3]);
    server.stop().await.unwrap();
    assert_eq!(open_files_under(dir.path()), [] as [std::path::PathBuf; 0]);
    assert_eq!(automerge(&with_suffix("-search")).await, 8);

    // Ahead: the database goes back to before the second exchange, the
    // index keeps it. The index must not find what the database lost.
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(suffix));
    }
    std::fs::copy(with_suffix(".before"), &db).unwrap();
    let server = TestServer::start_with(url, None, |_| {}).await;
    let mut client = server.client().await;
    assert!(found(&client, "sealing").await.is_empty());
    assert_eq!(found(&client, "walrus").await, [0]);
    // And it goes on indexing.
    exchange(&mut client, "ses_sea", "and cabbages", "and kings").await;
    assert_eq!(found(&client, "cabbages").await, [2]);
    server.stop().await.unwrap();
}

/// The FTS5 `automerge` setting the search file at `path` holds: how many
/// segments of a level gather before they are merged.
async fn automerge(path: &std::path::Path) -> i64 {
    use sqlx::Connection as _;
    let url = format!("sqlite://{}", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let value = sqlx::query_scalar("SELECT v FROM message_search_config WHERE k = 'automerge'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    value
}

// ---------------------------------------------------------------------------
// Retention

async fn retention_deletes_idle_sessions_only(backend: Backend) {
    const MAX_IDLE: Duration = Duration::from_millis(1_500);
    let storage = Storage::new(backend).await;
    let server = TestServer::start_on(storage, |config| {
        config.max_idle_age = Some(MAX_IDLE);
        config.sweep_interval_ms = 50;
    })
    .await;
    let mut client = server.client().await;
    // The busy session is the older one: were it idle, it would go first.
    create(&mut client, "busy").await;
    create(&mut client, "idle").await;
    let last_write = exchange(&mut client, "idle", "q", "a").await;
    let mut watcher = watch_caught_up(&mut client, "idle", 0).await;

    // Keep writing to the busy session until the idle one's watcher hears
    // of its deletion.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    let mut busy_writes = 0;
    let deleted = loop {
        tokio::select! {
            event = watcher.message() => {
                let event = event.expect("a healthy watch").expect("session_deleted before the end");
                match event.event {
                    Some(Event::SessionDeleted(_)) => break event,
                    Some(Event::Progress(_)) => {}
                    _ => panic!("unexpected event {event:?}"),
                }
            }
            _ = ticks.tick() => {
                assert!(Instant::now() < deadline, "the idle session was never swept");
                exchange(&mut client, "busy", "still", "here").await;
                busy_writes += 1;
            }
        }
    };
    assert_eq!(deleted.revision, last_write.revision + 1);
    let written = all_messages(&mut client, "busy").await;
    assert_eq!(
        written.len(),
        busy_writes * 2,
        "the busy session kept everything"
    );
    // Not before its time: at least the idle age after its last revision.
    let idle_for =
        micros(deleted.time.as_ref()) - micros(last_write.messages[0].create_time.as_ref());
    assert!(
        idle_for >= i64::try_from(MAX_IDLE.as_micros()).unwrap(),
        "deleted after {idle_for} µs idle"
    );
    // The watch then ends cleanly.
    let end = tokio::time::timeout(NEXT_EVENT, watcher.message())
        .await
        .expect("the stream ends");
    assert!(matches!(end, Ok(None)), "{end:?}");

    let gone = try_get(&mut client, "idle").await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    assert!(get(&mut client, "busy").await.revision > 1);
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<&str> = listed
        .sessions
        .iter()
        .map(|s| s.session.as_ref().unwrap().id.as_str())
        .collect();
    assert_eq!(listed, ["busy"]);
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// Revisions

async fn every_control_write_is_one_revision(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "rev").await;
    exchange(&mut client, "rev", "q0", "a0").await;
    exchange(&mut client, "rev", "q1", "a1").await;
    let messages = all_messages(&mut client, "rev").await;
    let mut stream = watch_caught_up(&mut client, "rev", 3).await;

    let mut made: Vec<(i64, &str)> = Vec::new();
    let edited = edit(
        &mut client,
        "rev",
        &messages[1].id,
        Some(assistant("A0")),
        "",
    )
    .await
    .unwrap();
    made.push((edited.revision, "message_edited"));
    let redacted = redact(&mut client, "rev", &messages[0].id, "")
        .await
        .unwrap();
    made.push((redacted.revision, "message_redacted"));
    let set = set_state(&mut client, "rev", "k", "v", None).await.unwrap();
    made.push((set.version, "state_changed"));
    let deleted = delete_state(&mut client, "rev", "k", None).await.unwrap();
    made.push((deleted.revision, "state_changed"));
    let rolled = rollback(&mut client, "rev", 1).await.unwrap();
    made.push((rolled.revision, "rolled_back"));

    // Rejected or empty calls make no revision.
    edit(&mut client, "rev", "msg_nope", Some(user("x")), "")
        .await
        .unwrap_err();
    redact(&mut client, "rev", &messages[3].id, "")
        .await
        .unwrap_err();
    set_state(&mut client, "rev", "k", "v", Some(42))
        .await
        .unwrap_err();
    delete_state(&mut client, "rev", "k", None)
        .await
        .unwrap_err();
    rollback(&mut client, "rev", -7).await.unwrap_err();
    assert_eq!(
        rollback(&mut client, "rev", 1).await.unwrap().revision,
        rolled.revision
    );
    fork(&mut client, "rev", 0, "rev_fork").await.unwrap();

    let updated = rename(&mut client, "rev", "renamed").await;
    made.push((updated.revision, "session_updated"));
    let appended = exchange(&mut client, "rev", "q2", "a2").await;
    made.push((appended.revision, "exchange_appended"));

    let expected = [
        (4, "message_edited"),
        (5, "message_redacted"),
        (6, "state_changed"),
        (7, "state_changed"),
        (8, "rolled_back"),
        (9, "session_updated"),
        (10, "exchange_appended"),
    ];
    assert_eq!(made, expected, "one revision per write, consecutive");
    let mut last_time = 0;
    for (revision, kind) in expected {
        let event = next_revision(&mut stream).await;
        assert_eq!((event.revision, event_kind(&event)), (revision, kind));
        let time = micros(event.time.as_ref());
        assert!(time >= last_time, "event times never go back");
        last_time = time;
    }
    let session = get(&mut client, "rev").await;
    assert_eq!(session.revision, 10);
    assert_eq!(replay(&mut client, "rev").await.len(), 10);
    server.stop().await.unwrap();
}
