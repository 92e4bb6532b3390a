//! Live runs that survive a reload and stop from anywhere: delta cursors,
//! merged deltas (`first_index`), the run output limit, `CancelRun` with
//! `cancel_requested` and `run_cancel_requested`, and all of it across
//! PostgreSQL replicas.

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use sessionstore_server::config::ServeConfig;
use tonic::Code;
use tonic::transport::Channel;

use crate::runs::{begin, end};
use crate::support::{
    Backend, Events, Storage, TestServer, assistant, call, connect, create, error_details,
    event_kind, get, next_change, rename, user,
};

crate::postgres_tests!(
    live_runs_cross_replicas,
    a_run_closed_by_an_append_is_closed_elsewhere_before_its_answer,
);

crate::backend_tests!(
    cursor_resumes_exactly_once_at_any_point,
    merged_deltas_keep_the_whole_prefix,
    run_output_limit_refuses_and_keeps_what_was_buffered,
    cancel_run_reaches_producer_and_watchers,
    cancel_run_errors_and_idempotency,
    a_disconnect_cancels_nothing,
    lease_expiry_while_cancelled,
);

type Client = SessionStoreClient<Channel>;

// ---------------------------------------------------------------------------
// Requests and readings

fn text_delta(id: &str, run: &str, index: i64, text: &str) -> pb::PublishDeltaRequest {
    pb::PublishDeltaRequest {
        session_id: id.to_owned(),
        run_id: run.to_owned(),
        index,
        delta: Some(pb::publish_delta_request::Delta::Text(text.to_owned())),
    }
}

fn block_delta(id: &str, run: &str, index: i64, text: &str) -> pb::PublishDeltaRequest {
    let block = pb::ContentBlock {
        block: Some(pb::content_block::Block::Text(pb::TextBlock {
            text: text.to_owned(),
            signature: String::new(),
        })),
    };
    pb::PublishDeltaRequest {
        session_id: id.to_owned(),
        run_id: run.to_owned(),
        index,
        delta: Some(pb::publish_delta_request::Delta::Block(block)),
    }
}

async fn publish(
    client: &mut Client,
    request: pb::PublishDeltaRequest,
) -> pb::PublishDeltaResponse {
    client
        .publish_delta(request)
        .await
        .unwrap_or_else(|status| panic!("publish delta: {status:?}"))
        .into_inner()
}

fn cancel_request(id: &str, run: &str, reason: &str) -> pb::CancelRunRequest {
    pb::CancelRunRequest {
        session_id: id.to_owned(),
        run_id: run.to_owned(),
        reason: reason.to_owned(),
    }
}

async fn cancel(client: &mut Client, id: &str, run: &str, reason: &str) -> i64 {
    client
        .cancel_run(cancel_request(id, run, reason))
        .await
        .unwrap_or_else(|status| panic!("cancel run {run}: {status:?}"))
        .into_inner()
        .revision
}

/// Stores a run's answer (marked incomplete when it was cut short).
async fn store_answer(
    client: &mut Client,
    id: &str,
    run: &str,
    answer: &str,
    incomplete: bool,
) -> pb::AppendExchangeResponse {
    let mut response = assistant(answer);
    response.incomplete = incomplete;
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("question")],
            response_messages: vec![response],
            provider_call: Some(call("gpt-4o", 10, 5, 100)),
            run_id: run.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn watch_with(client: &mut Client, id: &str, after: i64, cursors: &[(&str, i64)]) -> Events {
    client
        .watch_session(pb::WatchSessionRequest {
            session_id: id.to_owned(),
            after_revision: after,
            include_active_deltas: true,
            delta_cursors: cursors
                .iter()
                .map(|(run, after_index)| pb::DeltaCursor {
                    run_id: (*run).to_owned(),
                    after_index: *after_index,
                })
                .collect(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// A delta as (first_index, index, text); a block's text in brackets.
fn delta_of(event: &pb::SessionEvent) -> Option<(i64, i64, String)> {
    let Some(Event::Delta(delta)) = &event.event else {
        return None;
    };
    let text = match &delta.delta {
        Some(pb::delta::Delta::Text(text)) => text.clone(),
        Some(pb::delta::Delta::Block(block)) => match &block.block {
            Some(pb::content_block::Block::Text(text)) => format!("[{}]", text.text),
            other => panic!("unexpected block {other:?}"),
        },
        None => panic!("a delta without content"),
    };
    Some((delta.first_index, delta.index, text))
}

/// Events up to and including `caught_up`, then the deltas sent with it
/// until `count` delta indexes are covered; returns the deltas.
async fn deltas_until(stream: &mut Events, last_index: i64) -> Vec<(i64, i64, String)> {
    let mut deltas = Vec::new();
    loop {
        let event = next_change(stream).await;
        if let Some(delta) = delta_of(&event) {
            let done = delta.1 >= last_index;
            deltas.push(delta);
            if done {
                return deltas;
            }
        }
    }
}

/// What a client does with deltas: drops the indexes it has (a merged
/// delta reaching back past its cursor), keeps the rest, in order.
#[derive(Default)]
struct Reader {
    /// Per index received: where its text ended in `text`.
    ends: Vec<(i64, usize)>,
    text: String,
}

impl Reader {
    fn last(&self) -> i64 {
        self.ends.last().map_or(-1, |(index, _)| *index)
    }

    fn take(&mut self, (first, last, text): &(i64, i64, String)) {
        assert!(*last > self.last(), "delta {last} sent twice");
        let start = self
            .ends
            .iter()
            .rev()
            .find(|(index, _)| index < first)
            .map_or(0, |(_, end)| *end);
        let have = self.text.len() - start;
        assert!(
            *first <= self.last() + 1,
            "a gap: delta {first} after {}",
            self.last()
        );
        self.text.push_str(&text[have..]);
        self.ends.push((*last, self.text.len()));
    }
}

// ---------------------------------------------------------------------------
// Cursors

async fn cursor_resumes_exactly_once_at_any_point(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_cursor";
    create(&mut client, id).await;
    let head = get(&mut client, id).await.revision;
    let published: Vec<String> = (0..10).map(|i| format!("t{i} ")).collect();
    for (i, text) in published.iter().enumerate() {
        publish(&mut client, text_delta(id, "r1", i as i64, text)).await;
    }
    for cursor in [-1, 0, 4, 9] {
        // A reconnecting watcher: after the head, its cursor in r1.
        let mut stream = watch_with(&mut client, id, head, &[("r1", cursor)]).await;
        let caught_up = next_change(&mut stream).await;
        assert_eq!(event_kind(&caught_up), "caught_up");
        let mut reader = Reader {
            ends: (0..=cursor).map(|i| (i, 0)).collect(),
            text: String::new(),
        };
        if cursor < 9 {
            for delta in deltas_until(&mut stream, 9).await {
                reader.take(&delta);
            }
        }
        let expected: String = published[usize::try_from(cursor + 1).unwrap()..].concat();
        assert_eq!(reader.text, expected, "resumed after delta {cursor}");
    }
    // A watcher at the end of the buffer gets the live rest, then the
    // run's exchange.
    let mut stream = watch_with(&mut client, id, head, &[("r1", 9)]).await;
    assert_eq!(event_kind(&next_change(&mut stream).await), "caught_up");
    publish(&mut client, text_delta(id, "r1", 10, "live")).await;
    // Re-publishing is a retry: it is not sent again.
    publish(&mut client, text_delta(id, "r1", 10, "live")).await;
    publish(&mut client, text_delta(id, "r1", 11, "more")).await;
    assert_eq!(
        delta_of(&next_change(&mut stream).await),
        Some((10, 10, "live".to_owned()))
    );
    assert_eq!(
        delta_of(&next_change(&mut stream).await),
        Some((11, 11, "more".to_owned()))
    );
    let stored = store_answer(&mut client, id, "r1", "the answer", false).await;
    let appended = next_change(&mut stream).await;
    assert_eq!(event_kind(&appended), "exchange_appended");
    assert_eq!(appended.revision, stored.revision);
    drop(stream);
    // The run's output is stored: nothing is replayed for it any more.
    let head = get(&mut client, id).await.revision;
    let mut stream = watch_with(&mut client, id, head, &[]).await;
    assert_eq!(event_kind(&next_change(&mut stream).await), "caught_up");
    publish(&mut client, text_delta(id, "r2", 0, "next")).await;
    assert_eq!(
        delta_of(&next_change(&mut stream).await),
        Some((0, 0, "next".to_owned()))
    );

    // Cursor fields are checked.
    for (cursor, field) in [
        (
            pb::DeltaCursor {
                run_id: String::new(),
                after_index: 0,
            },
            "delta_cursors[0].run_id",
        ),
        (
            pb::DeltaCursor {
                run_id: "r".into(),
                after_index: -2,
            },
            "delta_cursors[0].after_index",
        ),
    ] {
        let status = client
            .watch_session(pb::WatchSessionRequest {
                session_id: id.to_owned(),
                after_revision: 0,
                include_active_deltas: true,
                delta_cursors: vec![cursor],
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
    }
    server.stop().await.unwrap();
}

/// A server whose runs merge text deltas after `deltas` of them.
async fn start_merging(backend: Backend, deltas: usize) -> TestServer {
    TestServer::start_on(Storage::new(backend).await, |config| {
        config.limits.max_run_deltas = deltas;
    })
    .await
}

async fn merged_deltas_keep_the_whole_prefix(backend: Backend) {
    let server = start_merging(backend, 4).await;
    let mut client = server.client().await;
    let id = "ses_merge";
    create(&mut client, id).await;
    let head = get(&mut client, id).await.revision;
    // Text with a block in the middle: text merges around it, never across.
    let mut expected = String::new();
    for i in 0..12 {
        if i == 5 {
            publish(&mut client, block_delta(id, "r1", i, "B")).await;
            expected.push_str("[B]");
        } else {
            let text = format!("{i}é|");
            publish(&mut client, text_delta(id, "r1", i, &text)).await;
            expected.push_str(&text);
        }
    }

    // A late joiner gets everything published so far, in fewer deltas.
    let mut late = watch_with(&mut client, id, head, &[]).await;
    let deltas = deltas_until(&mut late, 11).await;
    assert!(deltas.len() < 12, "merged: {deltas:?}");
    assert!(deltas.iter().any(|(first, last, _)| first < last));
    assert!(
        deltas
            .iter()
            .any(|(first, last, text)| first == last && *first == 5 && text == "[B]"),
        "the block is kept as published: {deltas:?}"
    );
    let mut reader = Reader::default();
    for delta in &deltas {
        reader.take(delta);
    }
    assert_eq!(reader.text, expected);

    // A cursor inside a merged delta: it is sent whole and the client
    // drops what it has.
    let straddled = deltas
        .iter()
        .find(|(first, last, _)| last - first >= 2)
        .expect("a merged delta of three or more");
    let cursor = straddled.0 + 1;
    let mut resumed = watch_with(&mut client, id, head, &[("r1", cursor)]).await;
    let again = deltas_until(&mut resumed, 11).await;
    assert_eq!(again[0], *straddled, "the straddling delta, whole");
    let mut reader = Reader::default();
    for delta in deltas.iter().take_while(|(_, last, _)| *last < straddled.0) {
        reader.take(delta);
    }
    // What the client had: up to and including the cursor.
    let upto: String = (straddled.0..=cursor).map(|i| format!("{i}é|")).collect();
    reader.text.push_str(&upto);
    reader.ends.push((cursor, reader.text.len()));
    for delta in &again {
        reader.take(delta);
    }
    assert_eq!(reader.text, expected);
    server.stop().await.unwrap();
}

async fn run_output_limit_refuses_and_keeps_what_was_buffered(backend: Backend) {
    const LIMIT: usize = 16 * 1024 * 1024;
    let server = TestServer::start_on(Storage::new(backend).await, |config| {
        config.limits.max_run_output_bytes = LIMIT;
        config.telemetry.metrics_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let mut client = server.client().await;
    let id = "ses_limit";
    create(&mut client, id).await;
    let head = get(&mut client, id).await.revision;
    let piece = "x".repeat(256 * 1024);
    let pieces = LIMIT / piece.len();
    for i in 0..pieces {
        publish(&mut client, text_delta(id, "big", i as i64, &piece)).await;
    }
    let status = client
        .publish_delta(text_delta(id, "big", pieces as i64, "y"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        error_details(&status).0.as_deref(),
        Some("LIMIT_EXCEEDED"),
        "{status:?}"
    );
    assert!(
        status.message().contains("max_run_output_bytes")
            || status.message().contains("partial output")
    );
    // The gauge shows what the server holds.
    let metrics = crate::support::scrape(server.metrics_addr.unwrap()).await;
    let held: usize = metrics
        .lines()
        .find_map(|line| line.strip_prefix("sessionstore_active_run_bytes "))
        .and_then(|value| value.trim().parse().ok())
        .expect("sessionstore_active_run_bytes");
    assert!(held >= LIMIT, "{held}");

    // Everything before the refusal stays for late joiners.
    let mut late = watch_with(&mut client, id, head, &[]).await;
    let mut reader = Reader::default();
    for delta in deltas_until(&mut late, pieces as i64 - 1).await {
        reader.take(&delta);
    }
    assert_eq!(reader.text.len(), LIMIT);
    // Storing the output releases it.
    store_answer(&mut client, id, "big", "short answer", true).await;
    let metrics_addr = server.metrics_addr.unwrap();
    crate::support::poll_until(
        "the run's bytes are released",
        std::time::Duration::from_secs(10),
        || async move {
            let metrics = crate::support::scrape(metrics_addr).await;
            metrics
                .lines()
                .any(|line| line == "sessionstore_active_run_bytes 0")
                .then_some(())
        },
    )
    .await;
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// CancelRun

async fn cancel_run_reaches_producer_and_watchers(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut producer = server.client().await;
    let mut tab = server.client().await;
    let id = "ses_cancel";
    create(&mut producer, id).await;
    let head = get(&mut producer, id).await.revision;
    let mut watcher = watch_with(&mut tab, id, head, &[]).await;
    assert_eq!(event_kind(&next_change(&mut watcher).await), "caught_up");

    // A run with no lease is active once it publishes.
    let first = publish(&mut producer, text_delta(id, "r1", 0, "Once upon")).await;
    assert!(!first.cancel_requested);
    next_change(&mut watcher).await;
    let revision = cancel(&mut tab, id, "r1", "user pressed stop").await;
    assert_eq!(revision, head + 1);
    let event = next_change(&mut watcher).await;
    assert_eq!(event.revision, revision);
    match event.event {
        Some(Event::RunCancelRequested(requested)) => {
            assert_eq!(requested.run_id, "r1");
            assert_eq!(requested.reason, "user pressed stop");
        }
        other => panic!("expected run_cancel_requested, got {other:?}"),
    }
    // The producer learns it on its next delta, which is still delivered.
    let next = publish(&mut producer, text_delta(id, "r1", 1, " a time")).await;
    assert!(next.cancel_requested);
    assert_eq!(
        delta_of(&next_change(&mut watcher).await),
        Some((1, 1, " a time".to_owned()))
    );
    // Another run is not affected.
    let other = publish(&mut producer, text_delta(id, "r2", 0, "x")).await;
    assert!(!other.cancel_requested);
    next_change(&mut watcher).await;

    // It stores what it has, marked incomplete; the run is over.
    let stored = store_answer(&mut producer, id, "r1", "Once upon a time", true).await;
    let appended = next_change(&mut watcher).await;
    match appended.event {
        Some(Event::ExchangeAppended(appended)) => {
            let answer = appended.messages.last().unwrap().message.as_ref().unwrap();
            assert!(answer.incomplete);
            assert_eq!(answer.content, "Once upon a time");
        }
        other => panic!("expected exchange_appended, got {other:?}"),
    }
    // A later cancel answers the first one's revision and writes nothing.
    assert_eq!(cancel(&mut tab, id, "r1", "again").await, revision);
    assert_eq!(get(&mut tab, id).await.revision, stored.revision);

    // With a lease: the holder is active until it ends the run.
    begin(&mut producer, id, "r3", 60_000).await;
    let cancelled = cancel(&mut tab, id, "r3", "").await;
    let published = publish(&mut producer, text_delta(id, "r3", 0, "late")).await;
    assert!(published.cancel_requested);
    assert_eq!(published.revision, cancelled);
    end(&mut producer, id, "r3").await;
    assert_eq!(cancel(&mut tab, id, "r3", "").await, cancelled);
    server.stop().await.unwrap();
}

async fn cancel_run_errors_and_idempotency(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_cancel_errors";
    create(&mut client, id).await;
    let head = get(&mut client, id).await.revision;

    // Not active, never cancelled: FAILED_PRECONDITION, nothing written.
    let status = client
        .cancel_run(cancel_request(id, "nobody", ""))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(error_details(&status).0.as_deref(), Some("RUN_NOT_ACTIVE"));
    assert_eq!(get(&mut client, id).await.revision, head);

    // Field errors name the field.
    for (request, field, code) in [
        (cancel_request(id, "", ""), "run_id", Code::InvalidArgument),
        (
            cancel_request("", "r", ""),
            "session_id",
            Code::InvalidArgument,
        ),
        (
            cancel_request(id, "r", &"x".repeat(2000)),
            "reason",
            Code::InvalidArgument,
        ),
        (cancel_request("ses_missing", "r", ""), "", Code::NotFound),
    ] {
        let status = client.cancel_run(request).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
    }

    // A discarded run is not active any more.
    publish(&mut client, text_delta(id, "gone", 0, "x")).await;
    client
        .discard_run(pb::DiscardRunRequest {
            session_id: id.to_owned(),
            run_id: "gone".into(),
        })
        .await
        .unwrap();
    let status = client
        .cancel_run(cancel_request(id, "gone", ""))
        .await
        .unwrap_err();
    assert_eq!(error_details(&status).0.as_deref(), Some("RUN_NOT_ACTIVE"));

    // Cancelling twice, concurrently: one revision.
    publish(&mut client, text_delta(id, "twice", 0, "x")).await;
    let (mut one, mut two) = (client.clone(), client.clone());
    let (a, b) = tokio::join!(
        cancel(&mut one, id, "twice", "a"),
        cancel(&mut two, id, "twice", "b")
    );
    assert_eq!(a, b);
    assert_eq!(get(&mut client, id).await.revision, a);

    // A deleted session forgets its cancels with everything else.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: id.to_owned(),
        })
        .await
        .unwrap();
    create(&mut client, id).await;
    let status = client
        .cancel_run(cancel_request(id, "twice", ""))
        .await
        .unwrap_err();
    assert_eq!(error_details(&status).0.as_deref(), Some("RUN_NOT_ACTIVE"));
    server.stop().await.unwrap();
}

async fn a_disconnect_cancels_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut producer = server.client().await;
    let id = "ses_disconnect";
    create(&mut producer, id).await;
    let head = get(&mut producer, id).await.revision;
    publish(&mut producer, text_delta(id, "r1", 0, "a")).await;
    {
        // A tab that watches and goes away mid-run, and a whole connection.
        let mut tab = connect(&server.endpoint()).await;
        let mut stream = watch_with(&mut tab, id, head, &[]).await;
        deltas_until(&mut stream, 0).await;
    }
    let next = publish(&mut producer, text_delta(id, "r1", 1, "b")).await;
    assert!(!next.cancel_requested);
    assert_eq!(get(&mut producer, id).await.revision, head);
    // Its deltas are all still there for the next tab.
    let mut tab = server.client().await;
    let mut stream = watch_with(&mut tab, id, head, &[]).await;
    let mut reader = Reader::default();
    for delta in deltas_until(&mut stream, 1).await {
        reader.take(&delta);
    }
    assert_eq!(reader.text, "ab");
    server.stop().await.unwrap();
}

async fn lease_expiry_while_cancelled(backend: Backend) {
    let server = TestServer::start_on(Storage::new(backend).await, |config| {
        config.sweep_interval_ms = 50;
    })
    .await;
    let mut client = server.client().await;
    let id = "ses_expiry";
    create(&mut client, id).await;
    let head = get(&mut client, id).await.revision;
    let mut watcher = watch_with(&mut client, id, head, &[]).await;
    assert_eq!(event_kind(&next_change(&mut watcher).await), "caught_up");
    begin(&mut client, id, "r1", 300).await;
    assert_eq!(event_kind(&next_change(&mut watcher).await), "run_begun");
    let cancelled = cancel(&mut client, id, "r1", "stop").await;
    assert_eq!(
        event_kind(&next_change(&mut watcher).await),
        "run_cancel_requested"
    );
    // The producer never answers: its lease runs out.
    let ended = next_change(&mut watcher).await;
    match ended.event {
        Some(Event::RunEnded(ended)) => assert!(ended.expired),
        other => panic!("expected run_ended, got {other:?}"),
    }
    // Still answered as cancelled, and nothing is written.
    assert_eq!(cancel(&mut client, id, "r1", "again").await, cancelled);
    assert_eq!(get(&mut client, id).await.revision, ended.revision);
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// Across PostgreSQL replicas

/// Three replicas on one fresh database.
async fn replicas(tweak: impl Fn(&mut ServeConfig)) -> Vec<TestServer> {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let mut servers = vec![TestServer::start_on(storage, &tweak).await];
    for _ in 1..3 {
        servers.push(TestServer::start_with(url.clone(), None, &tweak).await);
    }
    servers
}

async fn stop_all(mut servers: Vec<TestServer>) {
    // The first owns the database: it stops last.
    while let Some(server) = servers.pop() {
        server.stop().await.unwrap();
    }
}

async fn live_runs_cross_replicas() {
    let servers = replicas(|config| config.limits.max_run_deltas = 8).await;
    let mut a = connect(&servers[0].endpoint()).await;
    let mut b = connect(&servers[1].endpoint()).await;
    let mut c = connect(&servers[2].endpoint()).await;
    let id = "ses_replicas";
    create(&mut a, id).await;
    let head = get(&mut a, id).await.revision;

    // The watcher on B sees what the producer on A publishes.
    let mut on_b = watch_with(&mut b, id, head, &[]).await;
    assert_eq!(event_kind(&next_change(&mut on_b).await), "caught_up");
    // Deltas are never stored: one published before a replica listens
    // never reaches it. A commit on A seen on B and C says both listen.
    let mut listening = watch_with(&mut c, id, head, &[]).await;
    assert_eq!(event_kind(&next_change(&mut listening).await), "caught_up");
    rename(&mut a, id, "listening").await;
    for watcher in [&mut on_b, &mut listening] {
        assert_eq!(event_kind(&next_change(watcher).await), "session_updated");
    }
    drop(listening);
    let mut published = String::new();
    let mut reader = Reader::default();
    for i in 0..20 {
        let text = format!("w{i} ");
        publish(&mut a, text_delta(id, "r1", i, &text)).await;
        published.push_str(&text);
    }
    for delta in deltas_until(&mut on_b, 19).await {
        reader.take(&delta);
    }
    assert_eq!(reader.text, published);
    drop(on_b);

    // Cut after delta 19; reconnecting to C with the cursor gets the rest
    // exactly once, then the run's exchange.
    for i in 20..25 {
        let text = format!("w{i} ");
        publish(&mut a, text_delta(id, "r1", i, &text)).await;
        published.push_str(&text);
    }
    // C has the deltas once they arrive: a late joiner there sees all 25.
    let mut probe = watch_with(&mut c, id, head, &[]).await;
    let mut full = Reader::default();
    for delta in deltas_until(&mut probe, 24).await {
        full.take(&delta);
    }
    assert_eq!(
        full.text, published,
        "late join on C equals what A published"
    );
    drop(probe);
    let mut on_c = watch_with(&mut c, id, head, &[("r1", reader.last())]).await;
    for delta in deltas_until(&mut on_c, 24).await {
        reader.take(&delta);
    }
    assert_eq!(reader.text, published);

    // Stop from B: the producer on A sees it on a delta within 2 s, and the
    // watcher on C sees run_cancel_requested.
    let cancelled = cancel(&mut b, id, "r1", "stop from B").await;
    let asked = std::time::Instant::now();
    let mut index = 25;
    loop {
        let response = publish(&mut a, text_delta(id, "r1", index, ".")).await;
        index += 1;
        if response.cancel_requested {
            break;
        }
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(2),
            "cancel_requested within 2 s"
        );
    }
    loop {
        let event = next_change(&mut on_c).await;
        if let Some(Event::RunCancelRequested(requested)) = &event.event {
            assert_eq!(requested.run_id, "r1");
            assert_eq!(event.revision, cancelled);
            break;
        }
        assert!(delta_of(&event).is_some(), "{event:?}");
    }
    // The producer stores its partial answer on A; C's watcher gets it.
    let stored = store_answer(&mut a, id, "r1", &published, true).await;
    loop {
        let event = next_change(&mut on_c).await;
        if event_kind(&event) == "exchange_appended" {
            assert_eq!(event.revision, stored.revision);
            break;
        }
        assert!(delta_of(&event).is_some(), "{event:?}");
    }
    // Repeated on C: the same revision, nothing written.
    assert_eq!(cancel(&mut c, id, "r1", "").await, cancelled);
    stop_all(servers).await;
}

/// Turn after turn, a producer on A stores its answer (closing the run's
/// partial output, so delta indexes start over) and at once publishes the
/// next turn's first delta, index 0 again. A watcher on B gets the answer,
/// then that delta, every turn: B's hub holds a delta that arrives while it
/// reads the commits hinted before it (without that, about one run in four
/// lost a turn's delta, judged against the previous turn's index). That A
/// sends the closing hint before its answer is checked apart
/// (`store::appends::…a_one_trip_batch_closing_a_run_notifies_before_it_answers`):
/// here the hint task would usually beat the client's next call anyway.
async fn a_run_closed_by_an_append_is_closed_elsewhere_before_its_answer() {
    const TURNS: usize = 60;
    let servers = replicas(|_| {}).await;
    let mut a = connect(&servers[0].endpoint()).await;
    let mut b = connect(&servers[1].endpoint()).await;
    let id = "ses_turns";
    create(&mut a, id).await;
    let head = get(&mut a, id).await.revision;
    let mut on_b = watch_with(&mut b, id, head, &[]).await;
    assert_eq!(event_kind(&next_change(&mut on_b).await), "caught_up");
    // B listens once a commit on A reaches it.
    rename(&mut a, id, "listening").await;
    assert_eq!(event_kind(&next_change(&mut on_b).await), "session_updated");

    publish(&mut a, text_delta(id, "r1", 0, "turn 0")).await;
    for turn in 0..TURNS {
        // This turn's delta, then its answer.
        let wanted = format!("turn {turn}");
        let event = next_change(&mut on_b).await;
        let delta =
            delta_of(&event).unwrap_or_else(|| panic!("turn {turn}: {event:?} before its delta"));
        assert_eq!(delta, (0, 0, wanted), "turn {turn}");
        let stored = store_answer(&mut a, id, "r1", &format!("answer {turn}"), false).await;
        // At once, the next turn's first delta.
        publish(
            &mut a,
            text_delta(id, "r1", 0, &format!("turn {}", turn + 1)),
        )
        .await;
        let event = next_change(&mut on_b).await;
        assert_eq!(
            (event_kind(&event), event.revision),
            ("exchange_appended", stored.revision),
            "turn {turn}: the answer before the next turn's delta"
        );
    }
    stop_all(servers).await;
}
