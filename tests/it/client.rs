//! The ergonomic client (`sessionstore_client::Client`) against the real
//! server over real gRPC: typed calls on every backend, errors as typed
//! variants, appends that retry without writing twice, watches that resume
//! across broken connections and server restarts, and paged listings.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{StreamExt as _, TryStreamExt as _};
use sessionstore_client::v1::session_event::Event;
use sessionstore_client::v1::{self as pb, Message, ProviderCall};
use sessionstore_client::{
    Client, Error, Exchange, ExportHistory, ListSessions, NewSession, RetryPolicy, SessionEvents,
};

use crate::support::{
    Backend, Proxy, ServerProcess, Storage, TestServer, assert_appended, patient_client,
    sessionstore_binary, token_line,
};

crate::backend_tests!(
    typed_calls_round_trip,
    errors_are_typed,
    one_request_id_is_one_write,
    list_sessions_follows_page_tokens,
    watch_delivers_in_order_and_ends_on_delete,
);

/// Safety net for "the next event arrives": generous, never a pacing sleep.
const NEXT_EVENT: Duration = Duration::from_secs(30);

fn exchange(session_id: &str, question: &str, answer: &str) -> Exchange {
    Exchange::new(session_id)
        .message(Message::user(question))
        .provider_call(
            ProviderCall::new("openai", "gpt-test")
                .with_tokens(10, 5)
                .with_cost_micros_usd(42),
        )
        .response(Message::assistant(answer))
}

fn contents(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(|m| m.content.as_str()).collect()
}

/// The next item of a watch; panics if it ends, fails or stalls.
async fn next_event(events: &mut SessionEvents) -> pb::SessionEvent {
    tokio::time::timeout(NEXT_EVENT, events.next())
        .await
        .expect("a watch event within the timeout")
        .expect("the watch stream ended early")
        .expect("a healthy watch stream")
}

/// Reads events into `seen` until one of revision `revision` (or later).
async fn read_through(events: &mut SessionEvents, revision: i64, seen: &mut Vec<pb::SessionEvent>) {
    loop {
        let event = next_event(events).await;
        let done = event.is_revision() && event.revision >= revision;
        seen.push(event);
        if done {
            return;
        }
    }
}

/// The revisions among `events`, in delivery order.
fn revisions(events: &[pb::SessionEvent]) -> Vec<i64> {
    events
        .iter()
        .filter(|e| e.is_revision())
        .map(|e| e.revision)
        .collect()
}

async fn typed_calls_round_trip(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;

    let session = client
        .create_session(
            NewSession::new()
                .id("ses_typed")
                .title("typed")
                .system_prompt("Be terse.")
                .user("alice")
                .metadata("channel", "web")
                .initial_history([Message::user("earlier?"), Message::assistant("earlier.")]),
        )
        .await
        .unwrap();
    assert_eq!(session.id, "ses_typed");
    assert_eq!(session.revision, 1);

    let fetched = client.get_session("ses_typed").await.unwrap();
    assert_eq!(fetched.title, "typed");
    assert_eq!(fetched.user, "alice");
    assert_eq!(
        fetched.metadata.get("channel").map(String::as_str),
        Some("web")
    );

    let exchange = exchange("ses_typed", "2 + 2?", "4").expected_next_sequence(2);
    let stored = client.append_exchange(&exchange).await.unwrap();
    assert_eq!(stored.revision, 2);
    assert_eq!(stored.next_sequence, 4);
    let sequences: Vec<i64> = stored.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [2, 3]);
    let call = stored.provider_call.clone().expect("stored provider call");
    assert_eq!(call.total_tokens, 15);
    assert_eq!(stored.messages[0].produced_by_call_id, "");
    assert_eq!(stored.messages[1].produced_by_call_id, call.id);

    let history = client.export_history("ses_typed").await.unwrap();
    assert_eq!(contents(&history), ["earlier?", "earlier.", "2 + 2?", "4"]);
    let window = client
        .export_history(
            ExportHistory::new("ses_typed")
                .include_system_prompt()
                .max_messages(2),
        )
        .await
        .unwrap();
    assert_eq!(contents(&window), ["Be terse.", "2 + 2?", "4"]);
    let streamed: Vec<Message> = client
        .export_history_stream("ses_typed")
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(streamed, history);

    // Export → create(initial_history) → export is an identity.
    let copy = client
        .create_session(NewSession::new().initial_history(history.clone()))
        .await
        .unwrap();
    assert!(copy.id.starts_with("ses_"), "{}", copy.id);
    assert_eq!(client.export_history(&copy.id).await.unwrap(), history);

    // raw() reaches everything else over the same connection.
    let messages = client
        .raw()
        .list_messages(pb::ListMessagesRequest {
            session_id: "ses_typed".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    assert_eq!(messages.len(), 4);

    client.delete_session("ses_typed").await.unwrap();
    match client.get_session("ses_typed").await {
        Err(Error::NotFound { session_id, .. }) => assert_eq!(session_id, "ses_typed"),
        other => panic!("expected NotFound after delete, got {other:?}"),
    }
}

async fn errors_are_typed(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;

    match client.get_session("ses_missing").await {
        Err(error @ Error::NotFound { .. }) => {
            assert!(
                matches!(&error, Error::NotFound { session_id, .. } if session_id == "ses_missing")
            );
            assert_eq!(error.code(), Some(tonic::Code::NotFound));
            assert_eq!(error.reason().as_deref(), Some("SESSION_NOT_FOUND"));
            assert!(!error.is_transient());
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(
        client.export_history("ses_missing").await,
        Err(Error::NotFound { .. })
    ));

    client
        .create_session(NewSession::new().id("ses_err"))
        .await
        .unwrap();
    match client.create_session(NewSession::new().id("ses_err")).await {
        Err(Error::AlreadyExists { session_id, .. }) => assert_eq!(session_id, "ses_err"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    client
        .append_exchange(&exchange("ses_err", "q", "a"))
        .await
        .unwrap();

    // A stale expected_next_sequence says the actual one, and writes nothing.
    match client
        .append_exchange(&exchange("ses_err", "q2", "a2").expected_next_sequence(7))
        .await
    {
        Err(Error::SequenceMismatch {
            expected,
            actual_next_sequence,
            status,
        }) => {
            assert_eq!((expected, actual_next_sequence), (7, 2));
            assert_eq!(status.code(), tonic::Code::Aborted);
        }
        other => panic!("expected SequenceMismatch, got {other:?}"),
    }
    assert_eq!(client.get_session("ses_err").await.unwrap().revision, 2);

    // Invalid arguments name the field.
    let no_role = Exchange::new("ses_err").message(Message::default());
    match client.append_exchange(&no_role).await {
        Err(Error::InvalidArgument {
            field, description, ..
        }) => {
            assert_eq!(field, "messages[0].role");
            assert!(!description.is_empty());
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let orphan_response = Exchange::new("ses_err").response(Message::assistant("from nowhere"));
    match client.append_exchange(&orphan_response).await {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "provider_call"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }

    // full_history that does not match what is stored.
    let diverged = Exchange::new("ses_err").full_history([
        Message::user("q"),
        Message::assistant("not what was said"),
        Message::user("next"),
    ]);
    match client.append_exchange(&diverged).await {
        Err(Error::HistoryMismatch { index, .. }) => assert_eq!(index, 1),
        other => panic!("expected HistoryMismatch, got {other:?}"),
    }

    // A watch beyond the head fails with its first item, and ends.
    let mut events = client.watch("ses_err", 99);
    match tokio::time::timeout(NEXT_EVENT, events.next())
        .await
        .unwrap()
    {
        Some(Err(Error::RevisionOutOfRange {
            after_revision,
            head_revision,
            ..
        })) => assert_eq!((after_revision, head_revision), (99, 2)),
        other => panic!("expected RevisionOutOfRange, got {other:?}"),
    }
    assert!(events.next().await.is_none());

    // A bad page size fails the listing stream, which then ends.
    let mut listing = client.list_sessions(ListSessions::new().page_size(-1));
    match listing.next().await {
        Some(Err(Error::InvalidArgument { field, .. })) => assert_eq!(field, "page_size"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(listing.next().await.is_none());

    // Nothing above wrote anything.
    assert_eq!(client.get_session("ses_err").await.unwrap().revision, 2);
}

async fn one_request_id_is_one_write(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_once"))
        .await
        .unwrap();

    let exchange = exchange("ses_once", "q", "a");
    let first = client.append_exchange(&exchange).await.unwrap();
    let again = client.append_exchange(&exchange).await.unwrap();
    assert_eq!(again, first, "a repeat answers with the first result");
    // The key alone identifies the exchange: a rebuilt copy is the same write.
    let rebuilt = self::exchange("ses_once", "q", "a").with_request_id(exchange.request_id());
    assert_eq!(client.append_exchange(&rebuilt).await.unwrap(), first);
    assert_eq!(client.get_session("ses_once").await.unwrap().revision, 2);
    assert_eq!(client.export_history("ses_once").await.unwrap().len(), 2);

    // The same key with another body is refused, and writes nothing.
    let reused =
        self::exchange("ses_once", "q", "different").with_request_id(exchange.request_id());
    match client.append_exchange(&reused).await {
        Err(Error::RequestIdReused { request_id, .. }) => {
            assert_eq!(request_id, exchange.request_id());
        }
        other => panic!("expected RequestIdReused, got {other:?}"),
    }
    // Every Exchange gets its own key.
    let other = self::exchange("ses_once", "q", "a");
    assert_ne!(other.request_id(), exchange.request_id());
    assert_eq!(client.append_exchange(&other).await.unwrap().revision, 3);
}

async fn list_sessions_follows_page_tokens(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    let mut created = Vec::new();
    for i in 0..7 {
        let id = format!("ses_page_{i}");
        client
            .create_session(NewSession::new().id(&id).user("pager"))
            .await
            .unwrap();
        created.push(id);
    }
    client
        .create_session(NewSession::new().id("ses_other").user("someone else"))
        .await
        .unwrap();
    // Touching a session moves it to the front.
    client
        .append_exchange(&exchange("ses_page_2", "q", "a"))
        .await
        .unwrap();

    let summaries: Vec<pb::SessionSummary> = client
        .list_sessions(ListSessions::new().user("pager").page_size(3))
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<String> = summaries
        .iter()
        .map(|s| s.session.clone().unwrap_or_default().id)
        .collect();
    let mut expected: Vec<String> = created.iter().rev().cloned().collect();
    expected.retain(|id| id != "ses_page_2");
    expected.insert(0, "ses_page_2".into());
    assert_eq!(
        ids, expected,
        "three pages of at most 3, newest update first"
    );
    assert_eq!(summaries[0].message_count, 2);
    assert_eq!(summaries[0].provider_call_count, 1);

    let everyone = client
        .list_sessions(ListSessions::new().page_size(2))
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    assert_eq!(everyone.len(), 8);
}

async fn watch_delivers_in_order_and_ends_on_delete(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_watch"))
        .await
        .unwrap();
    let first = client
        .append_exchange(&exchange("ses_watch", "q1", "a1"))
        .await
        .unwrap();

    let mut events = client.watch("ses_watch", 0);
    let mut seen = Vec::new();
    read_through(&mut events, 2, &mut seen).await;
    let caught_up = next_event(&mut events).await;
    assert!(matches!(caught_up.event, Some(Event::CaughtUp(_))));
    assert_eq!(caught_up.revision, 2);

    let second = client
        .append_exchange(&exchange("ses_watch", "q2", "a2"))
        .await
        .unwrap();
    let live = next_event(&mut events).await;
    assert_appended(&live, &second);
    assert_appended(&seen[1], &first);
    assert_eq!(events.last_revision(), 3);

    client.delete_session("ses_watch").await.unwrap();
    let deleted = next_event(&mut events).await;
    assert!(matches!(deleted.event, Some(Event::SessionDeleted(_))));
    assert_eq!(deleted.revision, 4);
    let end = tokio::time::timeout(NEXT_EVENT, events.next())
        .await
        .unwrap();
    assert!(end.is_none(), "session_deleted ends the stream: {end:?}");
    assert_eq!(events.reconnects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_are_sent_and_refusals_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, token_line("acme", "acme-secret")).unwrap();
    let path = tokens.clone();
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.auth_tokens = Some(path);
    })
    .await;

    let anonymous = patient_client(&server.endpoint()).await;
    match anonymous.get_session("ses_a").await {
        Err(error @ Error::Unauthenticated { .. }) => {
            assert_eq!(error.reason().as_deref(), Some("UNAUTHENTICATED"));
            assert!(!error.is_transient(), "not retried");
        }
        other => panic!("expected Unauthenticated, got {other:?}"),
    }
    let wrong = Client::builder(server.endpoint())
        .bearer_token("not-the-secret")
        .connect()
        .await
        .unwrap();
    assert!(matches!(
        wrong.create_session(NewSession::new()).await,
        Err(Error::Unauthenticated { .. })
    ));
    let mut events = wrong.watch("ses_a", 0);
    assert!(matches!(
        next_item(&mut events).await,
        Some(Err(Error::Unauthenticated { .. }))
    ));

    let acme = Client::builder(server.endpoint())
        .bearer_token("acme-secret")
        .connect()
        .await
        .unwrap();
    acme.create_session(NewSession::new().id("ses_a"))
        .await
        .unwrap();
    acme.append_exchange(&exchange("ses_a", "q", "a"))
        .await
        .unwrap();
    assert_eq!(acme.get_session("ses_a").await.unwrap().revision, 2);
    // raw() carries the token too.
    acme.raw()
        .get_session(pb::GetSessionRequest {
            session_id: "ses_a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut events = acme.watch("ses_a", 0);
    let mut seen = Vec::new();
    read_through(&mut events, 2, &mut seen).await;
    assert_eq!(revisions(&seen), [1, 2]);
    // Nothing of acme's is visible without its token.
    assert!(format!("{acme:?}").contains("Client"));
    assert!(!format!("{:?}", acme.raw()).contains("acme-secret"));
}

async fn next_item(events: &mut SessionEvents) -> Option<Result<pb::SessionEvent, Error>> {
    tokio::time::timeout(NEXT_EVENT, events.next())
        .await
        .expect("a watch item within the timeout")
}

// ---------------------------------------------------------------------------
// A proxy that breaks connections on cue

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_whose_answer_is_lost_is_retried_and_stored_once() {
    let server = TestServer::start(Backend::File).await;
    let proxy = Proxy::start(server.addr).await;
    let client = patient_client(&proxy.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_cut"))
        .await
        .unwrap();
    assert_eq!(proxy.accepted(), 1);

    // The server commits the append, but its answer never arrives: the
    // connection closes instead. The client retries on a new connection
    // with the same request_id and gets the first result.
    proxy.cut_before_next_response();
    let exchange = exchange("ses_cut", "q", "a");
    let stored = client.append_exchange(&exchange).await.unwrap();
    assert_eq!(proxy.responses_cut(), 1, "the first answer was cut");
    assert_eq!(proxy.accepted(), 2, "the retry came on a new connection");
    assert_eq!(
        stored.revision, 2,
        "the retry answered with the first write"
    );

    let direct = patient_client(&server.endpoint()).await;
    assert_eq!(direct.get_session("ses_cut").await.unwrap().revision, 2);
    assert_eq!(
        contents(&direct.export_history("ses_cut").await.unwrap()),
        ["q", "a"],
        "stored exactly once"
    );

    // Without retries the lost answer is a transient error; the exchange,
    // sent again by the caller, is still one write.
    let impatient = Client::builder(proxy.endpoint())
        .retry_policy(RetryPolicy::never())
        .connect()
        .await
        .unwrap();
    let second = self::exchange("ses_cut", "q2", "a2");
    proxy.cut_before_next_response();
    match impatient.append_exchange(&second).await {
        Err(error @ Error::Unavailable { .. }) => assert!(error.is_transient()),
        other => panic!("expected Unavailable after a cut connection, got {other:?}"),
    }
    assert_eq!(proxy.responses_cut(), 2);
    // The caller sends it again; on a loaded machine the first resend may
    // still meet the cut connection before the client has seen it close,
    // which is transient too: the caller sends again.
    let mut attempts = 0;
    let resent = loop {
        attempts += 1;
        match impatient.append_exchange(&second).await {
            Ok(resent) => break resent,
            Err(error) if error.is_transient() && attempts < 3 => continue,
            Err(error) => panic!("resending after a cut connection: {error:?}"),
        }
    };
    assert_eq!(resent.revision, 3);
    assert_eq!(direct.get_session("ses_cut").await.unwrap().revision, 3);
    assert_eq!(direct.export_history("ses_cut").await.unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_after_its_connection_breaks() {
    let server = TestServer::start(Backend::Memory).await;
    let proxy = Proxy::start(server.addr).await;
    let watcher = patient_client(&proxy.endpoint()).await;
    let writer = patient_client(&server.endpoint()).await;
    writer
        .create_session(NewSession::new().id("ses_cut_watch"))
        .await
        .unwrap();

    let mut events = watcher.watch("ses_cut_watch", 0);
    let mut seen = Vec::new();
    let mut acked = Vec::new();
    for i in 0..2 {
        acked.push(
            writer
                .append_exchange(&exchange("ses_cut_watch", &format!("q{i}"), "a"))
                .await
                .unwrap(),
        );
    }
    read_through(&mut events, 3, &mut seen).await;

    proxy.cut_all();
    for i in 2..5 {
        acked.push(
            writer
                .append_exchange(&exchange("ses_cut_watch", &format!("q{i}"), "a"))
                .await
                .unwrap(),
        );
    }
    read_through(&mut events, 6, &mut seen).await;

    assert_eq!(
        revisions(&seen),
        [1, 2, 3, 4, 5, 6],
        "each revision once, in order"
    );
    let appended: Vec<&pb::SessionEvent> = seen
        .iter()
        .filter(|e| matches!(e.event, Some(Event::ExchangeAppended(_))))
        .collect();
    for (event, ack) in appended.iter().zip(&acked) {
        assert_appended(event, ack);
    }
    let caught_up = seen
        .iter()
        .filter(|e| matches!(e.event, Some(Event::CaughtUp(_))))
        .count();
    assert_eq!(caught_up, 1, "caught_up is delivered once");
    assert!(events.reconnects() >= 1, "the stream reconnected");
    assert!(proxy.accepted() >= 2);
}

/// A watcher's view of one run: the text of its deltas, concatenated.
async fn read_run_until(events: &mut SessionEvents, run: &str, index: i64, text: &mut String) {
    loop {
        let event = next_event(events).await;
        if let Some(Event::Delta(delta)) = &event.event {
            assert_eq!(delta.run_id, run);
            if let Some(pb::delta::Delta::Text(piece)) = &delta.delta {
                text.push_str(piece);
            }
            if delta.index >= index {
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_resumes_a_run_by_its_cursor_and_another_stops_it() {
    // Tiny buffers: reconnecting lands inside merged deltas.
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, |config| {
        config.limits.max_run_deltas = 4;
    })
    .await;
    let proxy = Proxy::start(server.addr).await;
    let producer = patient_client(&server.endpoint()).await;
    let reloading = patient_client(&proxy.endpoint()).await;
    let stopper = patient_client(&server.endpoint()).await;
    let id = "ses_live_run";
    producer
        .create_session(NewSession::new().id(id))
        .await
        .unwrap();

    let mut run = producer.run(id, "run_1");
    for i in 0..10 {
        assert!(!run.publish_text(format!("p{i} ")).await.unwrap());
    }
    let mut events = reloading.watch_with(pb::WatchSessionRequest {
        session_id: id.to_owned(),
        after_revision: 1,
        include_active_deltas: true,
        ..Default::default()
    });
    let mut seen = String::new();
    read_run_until(&mut events, "run_1", 9, &mut seen).await;
    assert_eq!(seen, run.partial_text(), "a late joiner sees the prefix");

    // The connection breaks mid-run; the producer goes on meanwhile.
    proxy.cut_all();
    for i in 10..20 {
        run.publish_text(format!("p{i} ")).await.unwrap();
    }
    read_run_until(&mut events, "run_1", 19, &mut seen).await;
    assert!(events.reconnects() >= 1, "the stream reconnected");
    assert_eq!(seen, run.partial_text(), "every delta once, in order");

    // Stop from another client: the producer sees it on its next delta.
    let cancelled = stopper.cancel_run(id, "run_1", "stop").await.unwrap();
    assert!(run.publish_text("p20").await.unwrap());
    assert!(run.cancel_requested());
    assert_eq!(
        stopper.cancel_run(id, "run_1", "again").await.unwrap(),
        cancelled
    );
    let partial = run.partial_text().to_owned();
    let stored = run
        .finish_incomplete(exchange(id, "Tell me a story", "").responses([]))
        .await
        .unwrap_or_else(|error| panic!("finish: {error:?}"));
    let answer = stored.messages.last().unwrap().message.as_ref().unwrap();
    assert!(answer.incomplete);
    assert_eq!(answer.content, partial);

    // The watcher saw the stop, the rest of the text, then the answer.
    let mut stop_seen = false;
    loop {
        let event = next_event(&mut events).await;
        match &event.event {
            Some(Event::RunCancelRequested(requested)) => {
                assert_eq!(
                    (requested.run_id.as_str(), event.revision),
                    ("run_1", cancelled)
                );
                stop_seen = true;
            }
            Some(Event::Delta(delta)) => {
                if let Some(pb::delta::Delta::Text(piece)) = &delta.delta {
                    seen.push_str(piece);
                }
            }
            Some(Event::ExchangeAppended(appended)) => {
                assert_eq!(appended.run_id, "run_1");
                break;
            }
            _ => {}
        }
    }
    assert!(stop_seen);
    assert_eq!(seen, partial);
    // Not active any more (its output is stored): a new cancel is refused.
    match stopper.cancel_run(id, "run_2", "").await {
        Err(Error::RunNotActive { run_id, .. }) => assert_eq!(run_id, "run_2"),
        other => panic!("expected RUN_NOT_ACTIVE, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_are_retried_when_rate_limited() {
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, |config| {
        config.limits.max_requests_per_second = 2;
    })
    .await;
    let impatient = Client::builder(server.endpoint())
        .retry_policy(RetryPolicy::never())
        .connect()
        .await
        .unwrap();
    // The first call finds the bucket full.
    impatient
        .create_session(NewSession::new().id("ses_rate"))
        .await
        .unwrap();
    // A burst beyond the bucket is refused, saying when to come back.
    let mut refused = None;
    for _ in 0..10 {
        match impatient.get_session("ses_rate").await {
            Ok(_) => {}
            Err(error) => {
                refused = Some(error);
                break;
            }
        }
    }
    match refused {
        Some(error @ Error::RateLimited { .. }) => {
            let wait = error.retry_after().expect("RetryInfo");
            assert!(
                wait > Duration::ZERO && wait <= Duration::from_secs(1),
                "{wait:?}"
            );
            assert!(error.is_transient());
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }

    // The default policy waits as told and gets every append through, once.
    let client = Client::connect(server.endpoint()).await.unwrap();
    let before = client.get_session("ses_rate").await.unwrap().revision;
    for i in 0..6 {
        client
            .append_exchange(&exchange("ses_rate", &format!("q{i}"), "a"))
            .await
            .unwrap();
    }
    assert_eq!(
        client.get_session("ses_rate").await.unwrap().revision,
        before + 6
    );
    assert_eq!(client.export_history("ses_rate").await.unwrap().len(), 12);
}

// ---------------------------------------------------------------------------
// The real binary, killed and restarted on the same port and file

/// How a test stops the server before starting it again.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGKILL: connections reset, no goodbye.
    Kill,
    /// SIGTERM: a graceful shutdown ends watch streams cleanly.
    Terminate,
}

impl Stop {
    async fn apply(self, server: &mut ServerProcess) {
        match self {
            Stop::Kill => server.kill().await,
            Stop::Terminate => {
                let status = server.terminate().await;
                let log = std::fs::read_to_string(&server.log).unwrap_or_default();
                assert!(
                    status.success(),
                    "graceful shutdown exits 0: {status:?}\n--- server log ---\n{log}"
                );
            }
        }
    }
}

struct Restartable {
    binary: std::path::PathBuf,
    dir: tempfile::TempDir,
    database_url: String,
    starts: usize,
}

impl Restartable {
    async fn new() -> Restartable {
        let binary = tokio::task::spawn_blocking(sessionstore_binary)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let database_url = format!("sqlite://{}/db.sqlite", dir.path().display());
        Restartable {
            binary,
            dir,
            database_url,
            starts: 0,
        }
    }

    async fn start(&mut self, listen: &str) -> ServerProcess {
        self.starts += 1;
        let log = self.dir.path().join(format!("server-{}.log", self.starts));
        ServerProcess::start(&self.binary, &self.database_url, listen, log, &[]).await
    }
}

async fn watch_resumes_across_a_restart(stop: Stop) {
    let mut servers = Restartable::new().await;
    let mut server = servers.start("127.0.0.1:0").await;
    let client = patient_client(&server.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_restart"))
        .await
        .unwrap();

    let mut events = client.watch("ses_restart", 0);
    let mut seen = Vec::new();
    let mut acked = Vec::new();
    for i in 0..3 {
        acked.push(
            client
                .append_exchange(&exchange("ses_restart", &format!("before {i}"), "a"))
                .await
                .unwrap(),
        );
    }
    read_through(&mut events, 4, &mut seen).await;

    stop.apply(&mut server).await;
    let listen = server.listen_address();
    drop(server);
    let server = servers.start(&listen).await;

    // The client's connection comes back by itself; so does the watch.
    for i in 0..3 {
        acked.push(
            client
                .append_exchange(&exchange("ses_restart", &format!("after {i}"), "a"))
                .await
                .unwrap(),
        );
    }
    read_through(&mut events, 7, &mut seen).await;

    assert_eq!(
        revisions(&seen),
        [1, 2, 3, 4, 5, 6, 7],
        "each revision exactly once, in order, across the restart ({stop:?})"
    );
    let appended: Vec<&pb::SessionEvent> = seen
        .iter()
        .filter(|e| matches!(e.event, Some(Event::ExchangeAppended(_))))
        .collect();
    assert_eq!(appended.len(), acked.len());
    for (event, ack) in appended.iter().zip(&acked) {
        assert_appended(event, ack);
    }
    assert_eq!(
        seen.iter()
            .filter(|e| matches!(e.event, Some(Event::CaughtUp(_))))
            .count(),
        1
    );
    assert!(events.reconnects() >= 1, "the watch reconnected ({stop:?})");
    assert_eq!(events.last_revision(), 7);

    // And it keeps going: a deletion is the last event.
    client.delete_session("ses_restart").await.unwrap();
    let deleted = next_event(&mut events).await;
    assert!(matches!(deleted.event, Some(Event::SessionDeleted(_))));
    assert_eq!(deleted.revision, 8);
    assert!(next_item(&mut events).await.is_none());
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_after_sigkill_and_restart() {
    watch_resumes_across_a_restart(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_after_graceful_shutdown_and_restart() {
    watch_resumes_across_a_restart(Stop::Terminate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_sent_while_the_server_is_down_lands_once_after_restart() {
    let mut servers = Restartable::new().await;
    let mut server = servers.start("127.0.0.1:0").await;
    // Through a proxy, to see the client's attempts while the server is down.
    let upstream: SocketAddr = server.listen_address().parse().unwrap();
    let proxy = Proxy::start(upstream).await;
    let client = patient_client(&proxy.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_down"))
        .await
        .unwrap();
    let first = exchange("ses_down", "before", "a");
    let stored = client.append_exchange(&first).await.unwrap();
    assert_eq!(stored.revision, 2);

    server.kill().await;
    let accepted = proxy.accepted();
    let pending = {
        let client = client.clone();
        let exchange = exchange("ses_down", "while down", "a");
        tokio::spawn(async move {
            let stored = client.append_exchange(&exchange).await;
            (exchange, stored)
        })
    };
    // Two attempts have failed against the dead server.
    proxy.await_accepted(accepted + 2).await;
    assert!(!pending.is_finished(), "no answer while the server is down");

    let listen = server.listen_address();
    drop(server);
    let server = servers.start(&listen).await;
    let (second, stored) = tokio::time::timeout(NEXT_EVENT, pending)
        .await
        .expect("the append lands after the restart")
        .unwrap();
    let stored = stored.expect("retried until the server was back");
    assert_eq!(stored.revision, 3);

    // Sending either exchange again after the restart writes nothing: the
    // keys are in the database, not in the process.
    assert_eq!(client.append_exchange(&second).await.unwrap(), stored);
    let replayed = client.append_exchange(&first).await.unwrap();
    assert_eq!(replayed.revision, 2);
    let direct = patient_client(&server.endpoint()).await;
    assert_eq!(direct.get_session("ses_down").await.unwrap().revision, 3);
    assert_eq!(
        contents(&direct.export_history("ses_down").await.unwrap()),
        ["before", "a", "while down", "a"]
    );
}

// ---------------------------------------------------------------------------
// TLS

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "client test CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let issue = |name: &str, usage: ExtendedKeyUsagePurpose| {
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = issue("localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = issue("agent", ExtendedKeyUsagePurpose::ClientAuth);
    let write = |file: &str, pem: &str| {
        let path = dir.path().join(file);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let (cert, key, ca_path) = (
        write("server.pem", &server_cert),
        write("server.key", &server_key),
        write("ca.pem", &ca.pem()),
    );
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.tls.tls_cert = Some(cert);
        config.tls.tls_key = Some(key);
        config.tls.tls_client_ca = Some(ca_path);
    })
    .await;
    let url = format!("https://localhost:{}", server.addr.port());

    let client = Client::builder(&url)
        .tls_ca_certificate(ca.pem())
        .tls_client_identity(client_cert, client_key)
        .connect()
        .await
        .unwrap();
    let session = client
        .create_session(NewSession::new().id("ses_tls"))
        .await
        .unwrap();
    assert_eq!(session.id, "ses_tls");
    assert_eq!(client.get_session("ses_tls").await.unwrap().revision, 1);

    // Without a client certificate the server refuses the connection.
    let anonymous = Client::builder(&url)
        .tls_ca_certificate(ca.pem())
        .retry_policy(RetryPolicy::never())
        .connect()
        .await;
    if let Ok(anonymous) = anonymous {
        let refused = anonymous.get_session("ses_tls").await;
        assert!(
            refused.is_err(),
            "a client without a certificate got {refused:?}"
        );
    }
}
