//! Requests, and the readings of answers and events, that many tests share.

use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;

pub fn text(role: pb::Role, content: &str) -> pb::Message {
    pb::Message {
        role: role.into(),
        content: content.to_owned(),
        ..Default::default()
    }
}

pub fn user(content: &str) -> pb::Message {
    text(pb::Role::User, content)
}

pub fn assistant(content: &str) -> pb::Message {
    text(pb::Role::Assistant, content)
}

pub fn call(
    model: &str,
    prompt_tokens: i64,
    completion_tokens: i64,
    cost: i64,
) -> pb::ProviderCall {
    pb::ProviderCall {
        provider: "openai".into(),
        model: model.into(),
        requested_provider: "auto".into(),
        requested_model: format!("{model}-requested"),
        request_id: format!("gw-{model}-{cost}"),
        prompt_tokens,
        completion_tokens,
        cost_micros_usd: cost,
        ..Default::default()
    }
}

/// Creates session `id` owned by `user`.
pub async fn create_owned(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    user: &str,
) -> pb::Session {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            user: user.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("create {id}: {status:?}"))
        .into_inner()
}

pub async fn create(client: &mut SessionStoreClient<Channel>, id: &str) -> pb::Session {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.to_owned(),
            title: format!("title of {id}"),
            system_prompt: "You are terse.".into(),
            user: "alice".into(),
            ..Default::default()
        })
        .await
        .expect("create session")
        .into_inner()
}

/// A request appending one user message and one assistant response with a
/// provider call.
pub fn exchange_request(
    session_id: &str,
    question: &str,
    answer: &str,
) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: session_id.to_owned(),
        messages: vec![user(question)],
        provider_call: Some(call("gpt-test", 10, 5, 42)),
        response_messages: vec![assistant(answer)],
        ..Default::default()
    }
}

/// A stored message's text content.
pub fn content(message: &pb::StoredMessage) -> &str {
    message.message.as_ref().map_or("", |m| m.content.as_str())
}

/// A WatchSession stream.
pub type Events = tonic::Streaming<pb::SessionEvent>;

/// How long a test waits for a watch stream's next event before failing.
pub const NEXT_EVENT: Duration = Duration::from_secs(20);

/// The next event of a watch stream; panics if it ends, fails or stalls.
pub async fn next_event(stream: &mut Events) -> pb::SessionEvent {
    tokio::time::timeout(NEXT_EVENT, stream.message())
        .await
        .expect("an event within the timeout")
        .expect("a healthy watch stream")
        .expect("the watch stream ended early")
}

/// The next event other than a `progress` keep-alive, within
/// [`NEXT_EVENT`] in all: keep-alives do not extend the wait, so a stream
/// that only ever sends them fails the test instead of hanging it.
pub async fn next_change(stream: &mut Events) -> pb::SessionEvent {
    let change = async {
        loop {
            let event = next_event(stream).await;
            if !matches!(event.event, Some(pb::session_event::Event::Progress(_))) {
                return event;
            }
        }
    };
    tokio::time::timeout(NEXT_EVENT, change)
        .await
        .expect("an event other than progress within the timeout")
}

/// Opens a watch of `session_id` after `after_revision`.
pub async fn watch(
    client: &mut SessionStoreClient<Channel>,
    session_id: &str,
    after_revision: i64,
) -> Events {
    client
        .watch_session(pb::WatchSessionRequest {
            session_id: session_id.to_owned(),
            after_revision,
            include_active_deltas: false,
            ..Default::default()
        })
        .await
        .expect("watch session")
        .into_inner()
}

/// The name of an event's kind, for assertions and messages.
pub fn event_kind(event: &pb::SessionEvent) -> &'static str {
    event.kind()
}

/// Checks that `event` is the `exchange_appended` of the acknowledged `expected`.
pub fn assert_appended(event: &pb::SessionEvent, expected: &pb::AppendExchangeResponse) {
    use pb::session_event::Event;
    assert_eq!(event.revision, expected.revision, "revision of {event:?}");
    assert!(event.time.is_some(), "event without time: {event:?}");
    let Some(Event::ExchangeAppended(appended)) = &event.event else {
        panic!(
            "expected exchange_appended, got {}: {event:?}",
            event_kind(event)
        );
    };
    assert_eq!(
        appended.messages, expected.messages,
        "revision {}",
        event.revision
    );
    assert_eq!(appended.provider_call, expected.provider_call);
    assert_eq!(appended.next_sequence, expected.next_sequence);
}

/// Appends one user message and one assistant response with a provider call.
pub async fn exchange(
    client: &mut SessionStoreClient<Channel>,
    session_id: &str,
    question: &str,
    answer: &str,
) -> pb::AppendExchangeResponse {
    client
        .append_exchange(exchange_request(session_id, question, answer))
        .await
        .expect("append exchange")
        .into_inner()
}

/// Every stored message of a session, following page tokens.
pub async fn all_messages(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
) -> Vec<pb::StoredMessage> {
    messages_in_pages(client, id, 1000).await
}

/// Every stored message of a session, `page_size` at a time (small pages
/// for large messages: a reply stays under the client's decode limit).
pub async fn messages_in_pages(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    page_size: i32,
) -> Vec<pb::StoredMessage> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_messages(pb::ListMessagesRequest {
                session_id: id.to_owned(),
                page_size,
                page_token,
                ..Default::default()
            })
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

/// Exports a session's history as plain messages.
pub async fn export(
    client: &mut SessionStoreClient<Channel>,
    request: pb::ExportHistoryRequest,
) -> Vec<pb::Message> {
    let mut stream = client
        .export_history(request)
        .await
        .expect("export")
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await.expect("export chunk") {
        out.extend(chunk.messages);
    }
    out
}

/// The ErrorInfo reason and BadRequest field of a status, if present.
pub fn error_details(status: &tonic::Status) -> (Option<String>, Option<String>) {
    use tonic_types::StatusExt as _;
    let details = status.get_error_details();
    let reason = details.error_info().map(|i| i.reason.clone());
    let field = details
        .bad_request()
        .and_then(|b| b.field_violations.first().map(|v| v.field.clone()));
    (reason, field)
}

/// The ErrorInfo metadata of a status (empty without ErrorInfo).
pub fn error_metadata(status: &tonic::Status) -> std::collections::HashMap<String, String> {
    use tonic_types::StatusExt as _;
    status
        .get_error_details()
        .error_info()
        .map(|info| info.metadata.clone())
        .unwrap_or_default()
}

/// `code` with ErrorInfo reason `reason`.
#[track_caller]
pub fn assert_status(status: &tonic::Status, code: tonic::Code, reason: &str) {
    assert_eq!(
        (status.code(), error_details(status).0.as_deref()),
        (code, Some(reason)),
        "{status:?}"
    );
}

/// `code` with a BadRequest field violation naming `field`.
#[track_caller]
pub fn assert_names_field(status: &tonic::Status, code: tonic::Code, field: &str) {
    assert_eq!(
        (status.code(), error_details(status).1.as_deref()),
        (code, Some(field)),
        "{status:?}"
    );
}

/// The session, which must exist.
pub async fn get(client: &mut SessionStoreClient<Channel>, id: &str) -> pb::Session {
    client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .expect("get session")
        .into_inner()
}

/// Asserts that session `id` is gone: GetSession answers NOT_FOUND.
pub async fn assert_gone(client: &mut SessionStoreClient<Channel>, id: &str) {
    let status = client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .expect_err("the session is gone");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
}

/// How many hits SearchMessages finds for `query` (at most 100).
pub async fn search_hits(client: &mut SessionStoreClient<Channel>, query: &str) -> usize {
    client
        .search_messages(pb::SearchMessagesRequest {
            query: query.to_owned(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .expect("search messages")
        .into_inner()
        .hits
        .len()
}

/// Sets a session's title (one revision).
pub async fn rename(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    title: &str,
) -> pb::Session {
    client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                title: title.to_owned(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["title".into()],
            }),
        })
        .await
        .expect("update session")
        .into_inner()
}

/// One `--auth-tokens` file line: `TENANT SHA256_HEX` of `token`.
pub fn token_line(tenant: &str, token: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{tenant} {hex}\n")
}

/// A request carrying `authorization: Bearer TOKEN`.
pub fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}").parse().expect("header value");
    request.metadata_mut().insert("authorization", value);
    request
}

// ---------------------------------------------------------------------------
// The real binary as a child process
