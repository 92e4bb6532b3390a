//! Tenant isolation. Another tenant's session id behaves exactly like an
//! unknown one in every RPC — NOT_FOUND with the same message and the same
//! error details, nothing written, nothing leaked — and session ids,
//! idempotency keys, state, listings, search and watches are all per tenant.
//!
//! Each probing suite sets up the same [`Scene`] (the owner's session with
//! a lease, the intruder's own session, the owner's live watcher), aims
//! one group of RPCs at the owner's session as another tenant, and ends
//! with [`Scene::assert_untouched`].

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::support::{
    Backend, Events, NEXT_EVENT, Storage, TestServer, assistant, authed, call, error_details,
    event_kind, next_change, token_line, user,
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
    tokio::time::timeout(NEXT_EVENT, stream.message())
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
                    ..Default::default()
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
                ..Default::default()
            },
            token,
        ))
        .await
        .map(tonic::Response::into_inner)
}

async fn watch(client: &mut Client, token: &str, id: &str, after_revision: i64) -> Events {
    client
        .watch_session(authed(
            pb::WatchSessionRequest {
                session_id: id.to_owned(),
                after_revision,
                include_active_deltas: false,
                ..Default::default()
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
                ..Default::default()
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
                target: None,
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
                ..Default::default()
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
// The scene every probing suite starts from

/// A server with the owner's session (a conversation with provider calls,
/// state, an idempotency key and a run holding the lease), the intruder's
/// own session, and the owner's live watcher, caught up.
struct Scene {
    server: TestServer,
    _tokens: tempfile::TempDir,
    client: Client,
    /// The owner's first append, which carries `OWNER_KEY`, and its answer.
    owner_request: pb::AppendExchangeRequest,
    owner_response: pb::AppendExchangeResponse,
    /// The id of the owner's first message.
    owner_message_id: String,
    /// The owner's next sequence.
    owner_next_sequence: i64,
    /// Everything the owner could read before the probes.
    before: Snapshot,
    /// The owner's watch of `SHARED`, after `before`'s revision.
    live: Events,
}

impl Scene {
    async fn set_up(backend: Backend) -> Scene {
        let (server, tokens) = start(backend).await;
        let mut client = server.client().await;

        // The owner: a conversation with a provider call, state, an
        // idempotency key, and a run holding the lease.
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
        Scene {
            server,
            _tokens: tokens,
            client,
            owner_request,
            owner_response,
            owner_message_id,
            owner_next_sequence,
            before,
            live,
        }
    }

    /// After the probes: the owner's live watcher saw nothing of them, the
    /// owner reads byte for byte what it read before, no listing or search
    /// shows the owner's session to anyone else, and the intruder's own
    /// session is untouched by its failed calls too.
    async fn assert_untouched(&mut self) {
        let client = &mut self.client;
        let before = &self.before;

        // The first thing the watcher gets after the probes is the owner's
        // own delta.
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
        let event = next_change(&mut self.live).await;
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

        // Byte for byte what it was: fields, listing, messages, calls,
        // state, exports, the event log and search.
        let after = snapshot(client, OWNER, SHARED).await;
        assert_eq!(&after, before, "another tenant changed the owner's session");

        assert_listings_private(client).await;

        let own = get(client, INTRUDER, INTRUDER_SESSION).await.unwrap();
        assert_eq!(own.revision, 3, "create, append, set state: {own:?}");
        assert_eq!(own.title, "globex stuff");
    }

    async fn stop(self) {
        drop(self.live);
        self.server.stop().await.unwrap();
    }
}

/// Lists and search never show the owner's session to the intruder or the
/// stranger, under any user filter; the intruder's own search still works.
async fn assert_listings_private(client: &mut Client) {
    for token in [INTRUDER, STRANGER] {
        for filter in ["", "alice"] {
            let listed = sessions_of(client, token, filter).await;
            let expected: Vec<String> = if token == INTRUDER {
                vec![INTRUDER_SESSION.to_owned()]
            } else {
                Vec::new()
            };
            assert_eq!(ids(&listed), expected, "{token} listing user {filter:?}");
            let hits = search(client, token, SECRET, filter).await;
            assert!(hits.is_empty(), "{token} found the owner's text: {hits:?}");
            let hits = search(client, token, "launch code", filter).await;
            assert!(hits.is_empty(), "{token} found the owner's text: {hits:?}");
        }
    }
    let hits = search(client, INTRUDER, "globex quarterly", "").await;
    assert_eq!(hits.len(), 1, "the intruder's own search works: {hits:?}");
    assert_eq!(hits[0].session_id, INTRUDER_SESSION);
    let hits = search(client, STRANGER, "globex quarterly", "").await;
    assert!(hits.is_empty(), "{hits:?}");
}

/// The page token the owner got for the first of its messages, for the
/// intruder to replay.
async fn messages_page_token(client: &mut Client) -> String {
    let token = client
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
    assert!(!token.is_empty());
    token
}

/// The page token the owner got for the first of its provider calls.
async fn calls_page_token(client: &mut Client) -> String {
    let token = client
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
    assert!(!token.is_empty());
    token
}

/// The page token the owner got for the first of its state entries.
async fn state_page_token(client: &mut Client) -> String {
    let token = client
        .list_state(authed(
            pb::ListStateRequest {
                session_id: SHARED.into(),
                page_size: 1,
                page_token: String::new(),
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner()
        .next_page_token;
    assert!(!token.is_empty());
    token
}

mod appends;
mod edits;
mod forks;
mod listings;
mod per_tenant;
mod reads;
mod runs;
mod sessions;
mod state;
mod watches;
