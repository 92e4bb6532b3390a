//! Tenant isolation. Another tenant's session id behaves exactly like an
//! unknown one in every RPC — NOT_FOUND with the same message and the same
//! error details, nothing written, nothing leaked — and session ids,
//! idempotency keys, state, listings, search and watches are all per tenant.

use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::support::{
    Backend, Storage, TestServer, assistant, authed, call, error_details, event_kind, next_change,
    token_line, user,
};

type Client = SessionStoreClient<Channel>;

/// Owns `SHARED`.
const OWNER: &str = "acme-token";
/// Has sessions of its own, and pokes at the owner's.
const INTRUDER: &str = "globex-token";
/// Has no sessions at all: its answers are what an unknown id looks like.
const STRANGER: &str = "initech-token";

/// The owner's session id.
const SHARED: &str = "ses_shared";
/// An id nobody has, of the same length as `SHARED`, so a message or an
/// error detail naming it can be compared after substitution.
const UNKNOWN: &str = "ses_nosuch";
/// The intruder's own session.
const INTRUDER_SESSION: &str = "ses_globex";
/// A word only the owner's messages contain.
const SECRET: &str = "zanzibarquux";
/// The run holding the owner's lease during the probes.
const RUN: &str = "run-acme";
/// The owner's idempotency key.
const OWNER_KEY: &str = "req-acme";
/// How long any single read from a stream may take before the test fails.
const STEP: Duration = Duration::from_secs(20);

/// Calls `$rpc` three times and checks the intruder learns nothing:
/// the intruder on the owner's `SHARED`, a tenant without sessions on the
/// same id, and (unless `same_id`) the intruder on `UNKNOWN`. The request is
/// built by the closure from the session id.
macro_rules! probe {
    (same_id $client:ident, $label:expr, $rpc:ident, |$id:ident| $request:expr) => {{
        let build = |$id: &str| $request;
        let foreign = $client
            .$rpc(authed(build(SHARED), INTRUDER))
            .await
            .map(drop);
        let stranger = $client
            .$rpc(authed(build(SHARED), STRANGER))
            .await
            .map(drop);
        assert_like_unknown($label, foreign, stranger, None);
    }};
    (stream $client:ident, $label:expr, $rpc:ident, |$id:ident| $request:expr) => {{
        let build = |$id: &str| $request;
        let foreign = first_item($client.$rpc(authed(build(SHARED), INTRUDER)).await).await;
        let stranger = first_item($client.$rpc(authed(build(SHARED), STRANGER)).await).await;
        let unknown = first_item($client.$rpc(authed(build(UNKNOWN), INTRUDER)).await).await;
        assert_like_unknown($label, foreign, stranger, Some(unknown));
    }};
    ($client:ident, $label:expr, $rpc:ident, |$id:ident| $request:expr) => {{
        let build = |$id: &str| $request;
        let foreign = $client
            .$rpc(authed(build(SHARED), INTRUDER))
            .await
            .map(drop);
        let stranger = $client
            .$rpc(authed(build(SHARED), STRANGER))
            .await
            .map(drop);
        let unknown = $client
            .$rpc(authed(build(UNKNOWN), INTRUDER))
            .await
            .map(drop);
        assert_like_unknown($label, foreign, stranger, Some(unknown));
    }};
}

crate::backend_tests!(
    another_tenants_session_is_an_unknown_session,
    ids_and_idempotency_keys_are_per_tenant,
);

/// A server whose token file names three tenants; keep the directory alive.
async fn start(backend: Backend) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(
        &path,
        token_line("acme", OWNER)
            + &token_line("globex", INTRUDER)
            + &token_line("initech", STRANGER),
    )
    .unwrap();
    let server = TestServer::start_on(Storage::new(backend).await, move |config| {
        config.auth_tokens = Some(path);
    })
    .await;
    (server, dir)
}

/// The outcome of a server-streaming call: its error, whether the call
/// itself or its first item failed; `Ok` if anything was streamed.
async fn first_item<T>(
    result: Result<tonic::Response<tonic::Streaming<T>>, Status>,
) -> Result<(), Status> {
    let mut stream = result?.into_inner();
    tokio::time::timeout(STEP, stream.message())
        .await
        .expect("a stream neither failed nor sent anything")
        .map(drop)
}

/// `bytes` with every occurrence of `from` replaced by `to` (same length).
fn substitute(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    let (from, to) = (from.as_bytes(), to.as_bytes());
    assert_eq!(from.len(), to.len());
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// The intruder's call on the owner's session failed NOT_FOUND exactly like
/// the same call of a tenant that has no such session (same code, message
/// and `grpc-status-details-bin` bytes), and like the intruder's own call
/// on an id nobody has, once that id is swapped for the owner's.
fn assert_like_unknown(
    label: &str,
    foreign: Result<(), Status>,
    stranger: Result<(), Status>,
    unknown: Option<Result<(), Status>>,
) {
    let foreign = foreign.err().unwrap_or_else(|| {
        panic!("{label}: the intruder's call on another tenant's session succeeded")
    });
    assert_eq!(
        foreign.code(),
        Code::NotFound,
        "{label}: another tenant's session must be NOT_FOUND: {foreign:?}"
    );
    assert!(
        error_details(&foreign).0.is_some(),
        "{label}: NOT_FOUND without google.rpc.ErrorInfo: {foreign:?}"
    );

    let stranger = stranger
        .err()
        .unwrap_or_else(|| panic!("{label}: a tenant without {SHARED} succeeded"));
    assert_eq!(
        (foreign.code(), foreign.message(), error_details(&foreign)),
        (
            stranger.code(),
            stranger.message(),
            error_details(&stranger)
        ),
        "{label}: another tenant's session answers unlike an unknown one"
    );
    assert_eq!(
        foreign.details(),
        stranger.details(),
        "{label}: error details differ from an unknown session's"
    );

    if let Some(unknown) = unknown {
        let unknown = unknown
            .err()
            .unwrap_or_else(|| panic!("{label}: the call on {UNKNOWN} succeeded"));
        assert_eq!(
            (foreign.code(), foreign.message().to_owned()),
            (unknown.code(), unknown.message().replace(UNKNOWN, SHARED)),
            "{label}: another tenant's id answers unlike an id nobody has"
        );
        assert_eq!(
            foreign.details(),
            substitute(unknown.details(), UNKNOWN, SHARED).as_slice(),
            "{label}: error details differ from an unknown id's: {:?} vs {:?}",
            error_details(&foreign),
            error_details(&unknown),
        );
    }
}

// ---------------------------------------------------------------------------
// Authenticated reads

async fn messages_of(client: &mut Client, token: &str, id: &str) -> Vec<pb::StoredMessage> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_messages(authed(
                pb::ListMessagesRequest {
                    session_id: id.to_owned(),
                    page_size: 1000,
                    page_token,
                    ..Default::default()
                },
                token,
            ))
            .await
            .expect("list messages")
            .into_inner();
        out.extend(page.messages);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

async fn sessions_of(client: &mut Client, token: &str, user: &str) -> Vec<pb::SessionSummary> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_sessions(authed(
                pb::ListSessionsRequest {
                    page_size: 1000,
                    page_token,
                    user: user.to_owned(),
                },
                token,
            ))
            .await
            .expect("list sessions")
            .into_inner();
        out.extend(page.sessions);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

fn ids(sessions: &[pb::SessionSummary]) -> Vec<String> {
    let mut ids: Vec<String> = sessions
        .iter()
        .map(|s| s.session.as_ref().map(|s| s.id.clone()).unwrap_or_default())
        .collect();
    ids.sort();
    ids
}

async fn search(client: &mut Client, token: &str, query: &str, user: &str) -> Vec<pb::SearchHit> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .search_messages(authed(
                pb::SearchMessagesRequest {
                    query: query.to_owned(),
                    user: user.to_owned(),
                    page_size: 1000,
                    page_token,
                },
                token,
            ))
            .await
            .expect("search messages")
            .into_inner();
        out.extend(page.hits);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

async fn get(client: &mut Client, token: &str, id: &str) -> Result<pb::Session, Status> {
    client
        .get_session(authed(
            pb::GetSessionRequest {
                session_id: id.to_owned(),
            },
            token,
        ))
        .await
        .map(tonic::Response::into_inner)
}

async fn watch(
    client: &mut Client,
    token: &str,
    id: &str,
    after_revision: i64,
) -> crate::support::Events {
    client
        .watch_session(authed(
            pb::WatchSessionRequest {
                session_id: id.to_owned(),
                after_revision,
                include_active_deltas: false,
            },
            token,
        ))
        .await
        .expect("watch session")
        .into_inner()
}

/// Every replayed event, then the `caught_up` marker (its `time`, which is
/// "now", cleared).
async fn replay(client: &mut Client, token: &str, id: &str) -> Vec<pb::SessionEvent> {
    let mut events = watch(client, token, id, 0).await;
    let mut out = Vec::new();
    loop {
        let mut event = next_change(&mut events).await;
        let done = matches!(event.event, Some(pb::session_event::Event::CaughtUp(_)));
        if done {
            event.time = None;
        }
        out.push(event);
        if done {
            return out;
        }
    }
}

fn lease(seconds: i64) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos: 0 }
}

/// Everything a tenant can read about one of its sessions.
#[derive(Debug, PartialEq)]
struct Snapshot {
    session: pb::Session,
    listed: Vec<pb::SessionSummary>,
    messages: Vec<pb::StoredMessage>,
    calls: Vec<pb::ProviderCall>,
    state: Vec<pb::StateEntry>,
    history: Vec<pb::Message>,
    transcript: Vec<u8>,
    events: Vec<pb::SessionEvent>,
    hits: Vec<pb::SearchHit>,
}

async fn snapshot(client: &mut Client, token: &str, id: &str) -> Snapshot {
    let session = get(client, token, id).await.expect("get session");
    let listed = sessions_of(client, token, "").await;
    let messages = messages_of(client, token, id).await;
    let calls = client
        .list_provider_calls(authed(
            pb::ListProviderCallsRequest {
                session_id: id.to_owned(),
                page_size: 1000,
                page_token: String::new(),
            },
            token,
        ))
        .await
        .expect("list provider calls")
        .into_inner();
    assert!(calls.next_page_token.is_empty());
    let state = client
        .list_state(authed(
            pb::ListStateRequest {
                session_id: id.to_owned(),
                page_size: 1000,
                page_token: String::new(),
            },
            token,
        ))
        .await
        .expect("list state")
        .into_inner();
    assert!(state.next_page_token.is_empty());
    let mut history = Vec::new();
    let mut stream = client
        .export_history(authed(
            pb::ExportHistoryRequest {
                session_id: id.to_owned(),
                include_system_prompt: true,
                ..Default::default()
            },
            token,
        ))
        .await
        .expect("export history")
        .into_inner();
    while let Some(chunk) = stream.message().await.expect("export chunk") {
        history.extend(chunk.messages);
    }
    let mut transcript = Vec::new();
    let mut stream = client
        .export_transcript(authed(
            pb::ExportTranscriptRequest {
                session_id: id.to_owned(),
                format: pb::TranscriptFormat::Markdown.into(),
            },
            token,
        ))
        .await
        .expect("export transcript")
        .into_inner();
    while let Some(chunk) = stream.message().await.expect("transcript chunk") {
        transcript.extend(chunk.data);
    }
    let events = replay(client, token, id).await;
    let hits = search(client, token, SECRET, "").await;
    Snapshot {
        session,
        listed,
        messages,
        calls: calls.provider_calls,
        state: state.entries,
        history,
        transcript,
        events,
        hits,
    }
}

async fn set_state(
    client: &mut Client,
    token: &str,
    id: &str,
    key: &str,
    value: &str,
) -> pb::StateEntry {
    client
        .set_state(authed(
            pb::SetStateRequest {
                session_id: id.to_owned(),
                key: key.to_owned(),
                value: value.to_owned(),
                expected_version: None,
            },
            token,
        ))
        .await
        .expect("set state")
        .into_inner()
}

async fn create(client: &mut Client, token: &str, id: &str, title: &str) -> pb::Session {
    client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: id.to_owned(),
                title: title.to_owned(),
                system_prompt: "You are terse.".into(),
                user: "alice".into(),
                ..Default::default()
            },
            token,
        ))
        .await
        .expect("create session")
        .into_inner()
}

// ---------------------------------------------------------------------------
// Tests

/// Every SessionStore RPC, aimed at another tenant's session, fails exactly
/// as for an unknown session and changes nothing the owner can see.
async fn another_tenants_session_is_an_unknown_session(backend: Backend) {
    let (server, _tokens) = start(backend).await;
    let mut client = server.client().await;

    // The owner: a conversation with a provider call, state, an idempotency
    // key, and a run holding the lease.
    let created = client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: SHARED.into(),
                title: "acme launch".into(),
                system_prompt: "You are terse.".into(),
                user: "alice".into(),
                metadata: [("team".to_owned(), "red".to_owned())].into(),
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.id, SHARED);
    let owner_request = pb::AppendExchangeRequest {
        session_id: SHARED.into(),
        messages: vec![user(&format!("the {SECRET} launch code is 0000"))],
        provider_call: Some(call("gpt-acme", 10, 5, 42)),
        response_messages: vec![assistant(&format!("noted, {SECRET}"))],
        request_id: OWNER_KEY.into(),
        ..Default::default()
    };
    let owner_response = client
        .append_exchange(authed(owner_request.clone(), OWNER))
        .await
        .unwrap()
        .into_inner();
    let second = client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: SHARED.into(),
                messages: vec![user("and the backup?")],
                provider_call: Some(call("gpt-acme", 12, 3, 40)),
                response_messages: vec![assistant("also 0000")],
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner();
    let owner_message_id = owner_response.messages[0].id.clone();
    let owner_next_sequence = second.next_sequence;
    set_state(&mut client, OWNER, SHARED, "cwd", "/srv/acme").await;
    set_state(&mut client, OWNER, SHARED, "files", "plan.md").await;
    client
        .begin_run(authed(
            pb::BeginRunRequest {
                session_id: SHARED.into(),
                run_id: RUN.into(),
                lease: Some(lease(600)),
            },
            OWNER,
        ))
        .await
        .unwrap();

    // Page tokens the owner got, for the intruder to replay.
    let messages_token = client
        .list_messages(authed(
            pb::ListMessagesRequest {
                session_id: SHARED.into(),
                page_size: 1,
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner()
        .next_page_token;
    let calls_token = client
        .list_provider_calls(authed(
            pb::ListProviderCallsRequest {
                session_id: SHARED.into(),
                page_size: 1,
                page_token: String::new(),
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner()
        .next_page_token;
    let state_token = client
        .list_state(authed(
            pb::ListStateRequest {
                session_id: SHARED.into(),
                page_size: 1,
                page_token: String::new(),
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner()
        .next_page_token;
    assert!(!messages_token.is_empty() && !calls_token.is_empty() && !state_token.is_empty());

    // The owner's full history as an SDK would resend it.
    let owner_history: Vec<pb::Message> = messages_of(&mut client, OWNER, SHARED)
        .await
        .into_iter()
        .filter_map(|m| m.message)
        .collect();
    assert_eq!(owner_history.len(), 4);

    // The intruder has a life of its own: a session, a message, state.
    create(&mut client, INTRUDER, INTRUDER_SESSION, "globex stuff").await;
    client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: INTRUDER_SESSION.into(),
                messages: vec![user("globex quarterly numbers")],
                ..Default::default()
            },
            INTRUDER,
        ))
        .await
        .unwrap();
    set_state(
        &mut client,
        INTRUDER,
        INTRUDER_SESSION,
        "cwd",
        "/srv/globex",
    )
    .await;

    let before = snapshot(&mut client, OWNER, SHARED).await;
    assert_eq!(before.hits.len(), 2, "{:?}", before.hits);
    let mut live = watch(&mut client, OWNER, SHARED, before.session.revision).await;
    let caught_up = next_change(&mut live).await;
    assert_eq!(event_kind(&caught_up), "caught_up");

    // --- Core RPCs.
    probe!(client, "GetSession", get_session, |id| {
        pb::GetSessionRequest {
            session_id: id.to_owned(),
        }
    });
    probe!(client, "UpdateSession (title)", update_session, |id| {
        pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                title: "globex was here".into(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["title".into()],
            }),
        }
    });
    probe!(client, "UpdateSession (all fields)", update_session, |id| {
        pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                title: "globex was here".into(),
                system_prompt: "Obey globex.".into(),
                metadata: [("team".to_owned(), "globex".to_owned())].into(),
                summary_message_id: owner_message_id.clone(),
                ..Default::default()
            }),
            update_mask: None,
        }
    });
    probe!(client, "DeleteSession", delete_session, |id| {
        pb::DeleteSessionRequest {
            session_id: id.to_owned(),
        }
    });

    // --- AppendExchange, every way in.
    probe!(client, "AppendExchange", append_exchange, |id| {
        pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            ..Default::default()
        }
    });
    probe!(
        client,
        "AppendExchange (the owner's exact request and request_id)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            ..owner_request.clone()
        }
    );
    probe!(
        client,
        "AppendExchange (the owner's request_id, another body)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            request_id: OWNER_KEY.into(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (right expected_next_sequence, the lease's run)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            provider_call: Some(call("gpt-globex", 1, 1, 1)),
            response_messages: vec![assistant("hi globex")],
            expected_next_sequence: Some(owner_next_sequence),
            run_id: RUN.into(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (stale expected_next_sequence)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            expected_next_sequence: Some(0),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (full_history extending the owner's)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            full_history: owner_history
                .iter()
                .cloned()
                .chain([user("globex was here")])
                .collect(),
            run_id: RUN.into(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (full_history diverging from the owner's)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            full_history: vec![user("something else entirely")],
            run_id: RUN.into(),
            ..Default::default()
        }
    );

    // --- Reads.
    probe!(stream client, "ExportHistory", export_history, |id| {
        pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            include_system_prompt: true,
            ..Default::default()
        }
    });
    probe!(
        stream client,
        "ExportHistory (from_summary, after_sequence, max_messages)",
        export_history,
        |id| pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            include_system_prompt: false,
            from_summary: true,
            after_sequence: Some(0),
            max_messages: 1,
        }
    );
    probe!(client, "ListMessages", list_messages, |id| {
        pb::ListMessagesRequest {
            session_id: id.to_owned(),
            ..Default::default()
        }
    });
    probe!(
        same_id client,
        "ListMessages (the owner's page token)",
        list_messages,
        |id| pb::ListMessagesRequest {
            session_id: id.to_owned(),
            after_sequence: None,
            page_size: 1,
            page_token: messages_token.clone(),
        }
    );
    probe!(client, "ListProviderCalls", list_provider_calls, |id| {
        pb::ListProviderCallsRequest {
            session_id: id.to_owned(),
            ..Default::default()
        }
    });
    probe!(
        same_id client,
        "ListProviderCalls (the owner's page token)",
        list_provider_calls,
        |id| pb::ListProviderCallsRequest {
            session_id: id.to_owned(),
            page_size: 1,
            page_token: calls_token.clone(),
        }
    );
    probe!(stream client, "WatchSession", watch_session, |id| {
        pb::WatchSessionRequest {
            session_id: id.to_owned(),
            after_revision: 0,
            include_active_deltas: true,
        }
    });
    probe!(
        stream client,
        "WatchSession (after_revision beyond the owner's head)",
        watch_session,
        |id| pb::WatchSessionRequest {
            session_id: id.to_owned(),
            after_revision: 999,
            include_active_deltas: false,
        }
    );
    probe!(
        stream client,
        "ExportTranscript (Markdown)",
        export_transcript,
        |id| pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format: pb::TranscriptFormat::Markdown.into(),
        }
    );
    probe!(
        stream client,
        "ExportTranscript (OpenAI JSON)",
        export_transcript,
        |id| pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format: pb::TranscriptFormat::OpenaiJson.into(),
        }
    );

    // --- Live output and runs.
    probe!(
        client,
        "PublishDelta (the lease's run)",
        publish_delta,
        |id| pb::PublishDeltaRequest {
            session_id: id.to_owned(),
            run_id: RUN.into(),
            index: 0,
            delta: Some(pb::publish_delta_request::Delta::Text(
                "globex delta".into()
            )),
        }
    );
    probe!(client, "PublishDelta (another run)", publish_delta, |id| {
        pb::PublishDeltaRequest {
            session_id: id.to_owned(),
            run_id: "run-globex".into(),
            index: 0,
            delta: Some(pb::publish_delta_request::Delta::Text(
                "globex delta".into(),
            )),
        }
    });
    probe!(client, "DiscardRun", discard_run, |id| {
        pb::DiscardRunRequest {
            session_id: id.to_owned(),
            run_id: RUN.into(),
        }
    });
    probe!(client, "BeginRun (another run)", begin_run, |id| {
        pb::BeginRunRequest {
            session_id: id.to_owned(),
            run_id: "run-globex".into(),
            lease: Some(lease(60)),
        }
    });
    probe!(
        client,
        "BeginRun (renewing the lease's run)",
        begin_run,
        |id| {
            pb::BeginRunRequest {
                session_id: id.to_owned(),
                run_id: RUN.into(),
                lease: Some(lease(1)),
            }
        }
    );
    probe!(client, "EndRun (the lease's run)", end_run, |id| {
        pb::EndRunRequest {
            session_id: id.to_owned(),
            run_id: RUN.into(),
        }
    });
    probe!(client, "EndRun (a run without a lease)", end_run, |id| {
        pb::EndRunRequest {
            session_id: id.to_owned(),
            run_id: "run-globex".into(),
        }
    });

    // --- History surgery.
    probe!(
        client,
        "RollbackSession (everything)",
        rollback_session,
        |id| {
            pb::RollbackSessionRequest {
                session_id: id.to_owned(),
                after_sequence: -1,
                run_id: RUN.into(),
            }
        }
    );
    probe!(
        client,
        "RollbackSession (past the end)",
        rollback_session,
        |id| pb::RollbackSessionRequest {
            session_id: id.to_owned(),
            after_sequence: 99,
            run_id: String::new(),
        }
    );
    probe!(
        client,
        "EditMessage (the owner's message id)",
        edit_message,
        |id| pb::EditMessageRequest {
            session_id: id.to_owned(),
            message_id: owner_message_id.clone(),
            message: Some(user("globex rewrote this")),
            reason: "globex".into(),
            run_id: RUN.into(),
        }
    );
    probe!(
        client,
        "RedactMessage (the owner's message id)",
        redact_message,
        |id| pb::RedactMessageRequest {
            session_id: id.to_owned(),
            message_id: owner_message_id.clone(),
            reason: "globex".into(),
            run_id: RUN.into(),
        }
    );
    probe!(
        client,
        "RedactMessage (an unknown message id)",
        redact_message,
        |id| pb::RedactMessageRequest {
            session_id: id.to_owned(),
            message_id: "msg_nosuch".into(),
            reason: "globex".into(),
            run_id: RUN.into(),
        }
    );
    probe!(client, "ForkSession (into a new id)", fork_session, |id| {
        pb::ForkSessionRequest {
            session_id: id.to_owned(),
            at_sequence: 1,
            new_session_id: "ses_forkd".into(),
        }
    });
    probe!(
        client,
        "ForkSession (server-made id, past the end)",
        fork_session,
        |id| pb::ForkSessionRequest {
            session_id: id.to_owned(),
            at_sequence: 99,
            new_session_id: String::new(),
        }
    );
    probe!(
        client,
        "ForkSession (onto its own id)",
        fork_session,
        |id| {
            pb::ForkSessionRequest {
                session_id: id.to_owned(),
                at_sequence: -1,
                new_session_id: id.to_owned(),
            }
        }
    );

    // --- State.
    probe!(client, "SetState (the owner's key)", set_state, |id| {
        pb::SetStateRequest {
            session_id: id.to_owned(),
            key: "cwd".into(),
            value: "/srv/globex".into(),
            expected_version: None,
        }
    });
    probe!(
        client,
        "SetState (expected_version 0 on the owner's key)",
        set_state,
        |id| pb::SetStateRequest {
            session_id: id.to_owned(),
            key: "cwd".into(),
            value: "/srv/globex".into(),
            expected_version: Some(0),
        }
    );
    probe!(client, "SetState (a new key)", set_state, |id| {
        pb::SetStateRequest {
            session_id: id.to_owned(),
            key: "globex".into(),
            value: "was here".into(),
            expected_version: None,
        }
    });
    probe!(client, "GetState (the owner's key)", get_state, |id| {
        pb::GetStateRequest {
            session_id: id.to_owned(),
            key: "cwd".into(),
        }
    });
    probe!(client, "GetState (a missing key)", get_state, |id| {
        pb::GetStateRequest {
            session_id: id.to_owned(),
            key: "missing".into(),
        }
    });
    probe!(client, "ListState", list_state, |id| pb::ListStateRequest {
        session_id: id.to_owned(),
        ..Default::default()
    });
    probe!(
        same_id client,
        "ListState (the owner's page token)",
        list_state,
        |id| pb::ListStateRequest {
            session_id: id.to_owned(),
            page_size: 1,
            page_token: state_token.clone(),
        }
    );
    probe!(
        client,
        "DeleteState (the owner's key)",
        delete_state,
        |id| {
            pb::DeleteStateRequest {
                session_id: id.to_owned(),
                key: "cwd".into(),
                expected_version: None,
            }
        }
    );
    probe!(
        client,
        "DeleteState (a wrong expected_version)",
        delete_state,
        |id| pb::DeleteStateRequest {
            session_id: id.to_owned(),
            key: "files".into(),
            expected_version: Some(99),
        }
    );

    // --- Lists and search never show the owner's session.
    for token in [INTRUDER, STRANGER] {
        for filter in ["", "alice"] {
            let listed = sessions_of(&mut client, token, filter).await;
            let expected: Vec<String> = if token == INTRUDER {
                vec![INTRUDER_SESSION.to_owned()]
            } else {
                Vec::new()
            };
            assert_eq!(ids(&listed), expected, "{token} listing user {filter:?}");
            let hits = search(&mut client, token, SECRET, filter).await;
            assert!(hits.is_empty(), "{token} found the owner's text: {hits:?}");
            let hits = search(&mut client, token, "launch code", filter).await;
            assert!(hits.is_empty(), "{token} found the owner's text: {hits:?}");
        }
    }
    let hits = search(&mut client, INTRUDER, "globex quarterly", "").await;
    assert_eq!(hits.len(), 1, "the intruder's own search works: {hits:?}");
    assert_eq!(hits[0].session_id, INTRUDER_SESSION);
    let hits = search(&mut client, STRANGER, "globex quarterly", "").await;
    assert!(hits.is_empty(), "{hits:?}");

    // No fork appeared anywhere.
    for token in [OWNER, INTRUDER, STRANGER] {
        let status = get(&mut client, token, "ses_forkd").await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{token}: {status:?}");
    }

    // The owner's live watcher saw nothing: the first thing after the probes
    // is the owner's own delta.
    let revision = client
        .publish_delta(authed(
            pb::PublishDeltaRequest {
                session_id: SHARED.into(),
                run_id: RUN.into(),
                index: 0,
                delta: Some(pb::publish_delta_request::Delta::Text("acme marker".into())),
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner()
        .revision;
    assert_eq!(revision, before.session.revision);
    let event = next_change(&mut live).await;
    match &event.event {
        Some(pb::session_event::Event::Delta(delta)) => {
            assert_eq!(delta.run_id, RUN);
            assert_eq!(
                delta.delta,
                Some(pb::delta::Delta::Text("acme marker".into())),
                "{event:?}"
            );
        }
        _ => panic!(
            "the owner's watcher got {} from another tenant: {event:?}",
            event_kind(&event)
        ),
    }
    assert_eq!(event.revision, before.session.revision);

    // Byte for byte what it was: fields, listing, messages, calls, state,
    // exports, the event log and search.
    let after = snapshot(&mut client, OWNER, SHARED).await;
    assert_eq!(after, before, "another tenant changed the owner's session");

    // The owner's idempotency key is still the owner's, and the lease is
    // still held by the owner's run.
    let retried = client
        .append_exchange(authed(owner_request.clone(), OWNER))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried, owner_response);
    let busy = client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: SHARED.into(),
                messages: vec![user("no run id")],
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition, "{busy:?}");
    let ended = client
        .end_run(authed(
            pb::EndRunRequest {
                session_id: SHARED.into(),
                run_id: RUN.into(),
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ended.revision, before.session.revision + 1);
    let event = next_change(&mut live).await;
    assert_eq!(event_kind(&event), "run_ended", "{event:?}");
    assert_eq!(event.revision, ended.revision);

    // The intruder's own session is untouched by its failed calls too.
    let own = get(&mut client, INTRUDER, INTRUDER_SESSION).await.unwrap();
    assert_eq!(own.revision, 3, "create, append, set state: {own:?}");
    assert_eq!(own.title, "globex stuff");
    drop(live);
    server.stop().await.unwrap();
}

/// Two tenants may each own `ses_x`; idempotency keys, forks' target ids,
/// state and watches are scoped to the tenant.
async fn ids_and_idempotency_keys_are_per_tenant(backend: Backend) {
    let (server, _tokens) = start(backend).await;
    let mut client = server.client().await;

    // Both create ses_x: two sessions.
    let acme_x = create(&mut client, OWNER, "ses_x", "acme x").await;
    let globex_x = create(&mut client, INTRUDER, "ses_x", "globex x").await;
    assert_eq!((acme_x.id.as_str(), acme_x.revision), ("ses_x", 1));
    assert_eq!((globex_x.id.as_str(), globex_x.revision), ("ses_x", 1));
    assert_eq!(
        get(&mut client, OWNER, "ses_x").await.unwrap().title,
        "acme x"
    );
    assert_eq!(
        get(&mut client, INTRUDER, "ses_x").await.unwrap().title,
        "globex x"
    );
    // Taken within a tenant, still.
    let taken = client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: "ses_x".into(),
                ..Default::default()
            },
            INTRUDER,
        ))
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    let acme_only = create(&mut client, OWNER, "ses_acme_only", "acme only").await;

    // The same request, key included, from both tenants: two writes.
    let request = pb::AppendExchangeRequest {
        session_id: "ses_x".into(),
        messages: vec![user("same question")],
        provider_call: Some(call("gpt-same", 3, 4, 5)),
        response_messages: vec![assistant("same answer")],
        request_id: "req-same".into(),
        ..Default::default()
    };
    let acme_first = client
        .append_exchange(authed(request.clone(), OWNER))
        .await
        .unwrap()
        .into_inner();
    let globex_first = client
        .append_exchange(authed(request.clone(), INTRUDER))
        .await
        .expect("another tenant's idempotency key must not apply")
        .into_inner();
    assert_eq!(acme_first.revision, 2);
    assert_eq!(globex_first.revision, 2);
    assert_eq!(globex_first.messages.len(), 2);
    for (a, g) in acme_first.messages.iter().zip(&globex_first.messages) {
        assert_ne!(a.id, g.id, "globex got acme's stored message");
        assert_eq!(g.session_id, "ses_x");
    }
    let (acme_call, globex_call) = (
        acme_first.provider_call.clone().unwrap(),
        globex_first.provider_call.clone().unwrap(),
    );
    assert_ne!(acme_call.id, globex_call.id);
    assert_eq!(
        messages_of(&mut client, OWNER, "ses_x").await,
        acme_first.messages
    );
    assert_eq!(
        messages_of(&mut client, INTRUDER, "ses_x").await,
        globex_first.messages
    );
    // Each tenant's retry returns its own first result.
    let acme_retry = client
        .append_exchange(authed(request.clone(), OWNER))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acme_retry, acme_first);
    let globex_retry = client
        .append_exchange(authed(request.clone(), INTRUDER))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(globex_retry, globex_first);
    // And the key is real within a tenant.
    let reused = client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                messages: vec![user("a different question")],
                ..request.clone()
            },
            INTRUDER,
        ))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists, "{reused:?}");

    // State is per tenant: globex's "must not exist yet" holds for its own ses_x.
    set_state(&mut client, OWNER, "ses_x", "k", "acme").await;
    let globex_state = client
        .set_state(authed(
            pb::SetStateRequest {
                session_id: "ses_x".into(),
                key: "k".into(),
                value: "globex".into(),
                expected_version: Some(0),
            },
            INTRUDER,
        ))
        .await
        .expect("acme's key is not globex's")
        .into_inner();
    assert_eq!(globex_state.value, "globex");
    let acme_state = client
        .get_state(authed(
            pb::GetStateRequest {
                session_id: "ses_x".into(),
                key: "k".into(),
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acme_state.value, "acme");

    // Forking into an id another tenant holds succeeds; into one's own, it is taken.
    let acme_only_before = snapshot(&mut client, OWNER, "ses_acme_only").await;
    let fork = client
        .fork_session(authed(
            pb::ForkSessionRequest {
                session_id: "ses_x".into(),
                at_sequence: 1,
                new_session_id: "ses_acme_only".into(),
            },
            INTRUDER,
        ))
        .await
        .expect("ids are unique per tenant: forking into another tenant's id works")
        .into_inner();
    assert_eq!(fork.id, "ses_acme_only");
    assert_eq!(fork.title, "globex x");
    let forked = messages_of(&mut client, INTRUDER, "ses_acme_only").await;
    assert_eq!(forked.len(), 2);
    assert_eq!(
        forked.iter().map(|m| &m.message).collect::<Vec<_>>(),
        globex_first
            .messages
            .iter()
            .map(|m| &m.message)
            .collect::<Vec<_>>()
    );
    let taken = client
        .fork_session(authed(
            pb::ForkSessionRequest {
                session_id: "ses_acme_only".into(),
                at_sequence: -1,
                new_session_id: "ses_x".into(),
            },
            INTRUDER,
        ))
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    assert_eq!(
        snapshot(&mut client, OWNER, "ses_acme_only").await,
        acme_only_before,
        "globex's fork touched acme's session of the same id"
    );
    assert_eq!(acme_only_before.session.revision, acme_only.revision);

    // Listings and search: each tenant sees its own.
    let acme_listed = sessions_of(&mut client, OWNER, "").await;
    assert_eq!(ids(&acme_listed), ["ses_acme_only", "ses_x"]);
    for summary in &acme_listed {
        let session = summary.session.as_ref().unwrap();
        assert!(session.title.starts_with("acme"), "{summary:?}");
    }
    let globex_listed = sessions_of(&mut client, INTRUDER, "alice").await;
    assert_eq!(ids(&globex_listed), ["ses_acme_only", "ses_x"]);
    for summary in &globex_listed {
        let session = summary.session.as_ref().unwrap();
        assert!(session.title.starts_with("globex"), "{summary:?}");
        assert_eq!(summary.message_count, 2, "{summary:?}");
    }
    client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: "ses_x".into(),
                messages: vec![user(&format!("acme alone knows {SECRET}"))],
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap();
    assert!(search(&mut client, INTRUDER, SECRET, "").await.is_empty());
    let hits = search(&mut client, OWNER, SECRET, "").await;
    assert_eq!(hits.len(), 1, "{hits:?}");
    let same = search(&mut client, INTRUDER, "same question", "").await;
    assert_eq!(same.len(), 2, "globex's ses_x and its fork: {same:?}");
    for hit in &same {
        assert!(
            globex_first.messages.iter().any(|m| m.id == hit.message_id)
                || forked.iter().any(|m| m.id == hit.message_id),
            "globex found a message that is not its own: {hit:?}"
        );
    }

    // Watches: acme's watcher of ses_x sees none of globex's ses_x changes,
    // not even its deletion.
    let head = get(&mut client, OWNER, "ses_x").await.unwrap().revision;
    let mut live = watch(&mut client, OWNER, "ses_x", head).await;
    assert_eq!(event_kind(&next_change(&mut live).await), "caught_up");
    set_state(&mut client, INTRUDER, "ses_x", "k", "globex again").await;
    client
        .publish_delta(authed(
            pb::PublishDeltaRequest {
                session_id: "ses_x".into(),
                run_id: "run-globex".into(),
                index: 0,
                delta: Some(pb::publish_delta_request::Delta::Text("globex".into())),
            },
            INTRUDER,
        ))
        .await
        .unwrap();
    client
        .delete_session(authed(
            pb::DeleteSessionRequest {
                session_id: "ses_x".into(),
            },
            INTRUDER,
        ))
        .await
        .unwrap();
    let renamed = client
        .update_session(authed(
            pb::UpdateSessionRequest {
                session: Some(pb::Session {
                    id: "ses_x".into(),
                    title: "acme x, renamed".into(),
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["title".into()],
                }),
            },
            OWNER,
        ))
        .await
        .expect("globex deleting its ses_x leaves acme's")
        .into_inner();
    let event = next_change(&mut live).await;
    assert_eq!(event_kind(&event), "session_updated", "{event:?}");
    assert_eq!(event.revision, renamed.revision);
    assert_eq!(renamed.revision, head + 1);
    assert_eq!(
        get(&mut client, INTRUDER, "ses_x")
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(messages_of(&mut client, OWNER, "ses_x").await.len(), 3);

    // With ses_x gone, globex may create it again, empty; acme's stays.
    let again = create(&mut client, INTRUDER, "ses_x", "globex x again").await;
    assert_eq!(again.revision, 1);
    assert!(messages_of(&mut client, INTRUDER, "ses_x").await.is_empty());
    assert_eq!(
        get(&mut client, OWNER, "ses_x").await.unwrap().title,
        "acme x, renamed"
    );
    drop(live);
    server.stop().await.unwrap();
}
