//! PostgreSQL replicas: several servers on one database. Writers on every
//! replica share one gap-free transcript, idempotency keys hold across
//! replicas, and a watcher on one replica sees writes made through another —
//! also when the commit-hint (LISTEN) connections are killed mid-stream.

use std::collections::HashSet;
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use sessionstore_server::config::ServeConfig;
use sqlx::Connection as _;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::kill_listeners;
use crate::support::{
    Backend, Events, Storage, TestServer, all_messages, assert_appended, connect, content, create,
    error_details, event_kind, exchange_request, get, postgres_admin_url, postgres_available,
    rename, watch,
};

/// Safety net for "the next event / the next step arrives": never a pacing sleep.
const WAIT: Duration = Duration::from_secs(20);

type Client = SessionStoreClient<Channel>;

// ---------------------------------------------------------------------------
// Replicas

/// Several servers on one fresh database. Replica 0 owns the database and is
/// stopped (or dropped) last: fields drop in declaration order.
struct Replicas {
    url: String,
    extras: Vec<TestServer>,
    owner: TestServer,
}

impl Replicas {
    /// Starts `count` replicas on one new database; `tweak(i, config)`
    /// adjusts replica `i`'s configuration.
    async fn start(count: usize, tweak: impl Fn(usize, &mut ServeConfig)) -> Replicas {
        assert!(count >= 1);
        let storage = Storage::new(Backend::Postgres).await;
        let url = storage.url.clone();
        let owner = TestServer::start_on(storage, |c| tweak(0, c)).await;
        let mut extras = Vec::new();
        for i in 1..count {
            extras.push(TestServer::start_with(url.clone(), None, |c| tweak(i, c)).await);
        }
        Replicas { url, extras, owner }
    }

    fn server(&self, i: usize) -> &TestServer {
        if i == 0 {
            &self.owner
        } else {
            &self.extras[i - 1]
        }
    }

    fn endpoint(&self, i: usize) -> String {
        self.server(i).endpoint()
    }

    /// A new client (its own connection) to replica `i`.
    async fn client(&self, i: usize) -> Client {
        connect(&self.endpoint(i)).await
    }

    /// The database's name: the last path segment of its URL.
    fn database(&self) -> String {
        let name = self.url.rsplit('/').next().expect("database url");
        name.split('?').next().unwrap_or(name).to_owned()
    }

    /// Stops the extra replicas, then the owner (which drops the database).
    async fn stop(self) {
        let Replicas { extras, owner, .. } = self;
        for server in extras.into_iter().rev() {
            server.stop().await.expect("replica stops cleanly");
        }
        owner.stop().await.expect("owning replica stops cleanly");
    }
}

// ---------------------------------------------------------------------------
// Helpers

async fn append(
    client: &mut Client,
    request: pb::AppendExchangeRequest,
) -> pb::AppendExchangeResponse {
    tokio::time::timeout(WAIT, client.append_exchange(request))
        .await
        .expect("append answers in time")
        .expect("append exchange")
        .into_inner()
}

/// Checks one exchange's acknowledgement: two contiguous messages, the
/// response linked to the call, `next_sequence` right after them.
fn assert_contiguous(response: &pb::AppendExchangeResponse, question: &str, answer: &str) {
    assert_eq!(response.messages.len(), 2, "{response:?}");
    let (input, output) = (&response.messages[0], &response.messages[1]);
    assert_eq!(
        output.sequence,
        input.sequence + 1,
        "not contiguous: {response:?}"
    );
    assert_eq!(response.next_sequence, output.sequence + 1, "{response:?}");
    assert_eq!(content(input), question);
    assert_eq!(content(output), answer);
    let call = response.provider_call.as_ref().expect("provider call");
    assert_eq!(input.produced_by_call_id, "");
    assert_eq!(output.produced_by_call_id, call.id);
}

/// The next event other than `progress`, or why there is none in time
/// (keep-alives do not extend the wait).
async fn try_next(stream: &mut Events) -> Result<pb::SessionEvent, String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => return Err(format!("no event other than progress within {WAIT:?}")),
            Ok(Err(status)) => return Err(format!("the watch stream failed: {status:?}")),
            Ok(Ok(None)) => return Err("the watch stream ended early".to_owned()),
            Ok(Ok(Some(event))) if matches!(event.event, Some(Event::Progress(_))) => {}
            Ok(Ok(Some(event))) => return Ok(event),
        }
    }
}

async fn next(stream: &mut Events) -> pb::SessionEvent {
    match try_next(stream).await {
        Ok(event) => event,
        Err(why) => panic!("{why}"),
    }
}

/// Reads a fresh watch (after revision 0) of a just-created session through
/// `caught_up`.
async fn read_through_caught_up(stream: &mut Events, created: &pb::Session) {
    let first = next(stream).await;
    assert_eq!(first.revision, 1, "{first:?}");
    let Some(Event::SessionCreated(session_created)) = &first.event else {
        panic!(
            "expected session_created, got {}: {first:?}",
            event_kind(&first)
        );
    };
    assert_eq!(session_created.session.as_ref(), Some(created));
    let caught_up = next(stream).await;
    assert!(
        matches!(caught_up.event, Some(Event::CaughtUp(_))),
        "expected caught_up, got {}: {caught_up:?}",
        event_kind(&caught_up)
    );
    assert_eq!(caught_up.revision, 1);
}

/// Reads revision events until `last` (inclusive); stops at the first
/// problem and says what it was, keeping what arrived before.
async fn collect_until(stream: &mut Events, last: i64) -> (Vec<pb::SessionEvent>, Option<String>) {
    let mut events = Vec::new();
    loop {
        match try_next(stream).await {
            Ok(event) => {
                let revision = event.revision;
                if matches!(event.event, Some(Event::CaughtUp(_))) {
                    return (events, Some(format!("a second caught_up: {event:?}")));
                }
                events.push(event);
                if revision >= last {
                    return (events, None);
                }
            }
            Err(why) => {
                let got = events.last().map_or(0, |e: &pb::SessionEvent| e.revision);
                return (
                    events,
                    Some(format!("{why} (last revision received: {got})")),
                );
            }
        }
    }
}

/// Asserts that `events` are exactly the revisions `expected` (in order,
/// once each) and that each matches what its writer was told.
fn assert_exact_sequence(
    watcher: usize,
    events: &[pb::SessionEvent],
    error: Option<&String>,
    responses: &[pb::AppendExchangeResponse],
    then: Option<i64>,
) {
    let got: Vec<i64> = events.iter().map(|e| e.revision).collect();
    let mut expected: Vec<i64> = responses.iter().map(|r| r.revision).collect();
    expected.extend(then);
    if got != expected {
        let seen: HashSet<i64> = got.iter().copied().collect();
        let missing: Vec<i64> = expected
            .iter()
            .copied()
            .filter(|r| !seen.contains(r))
            .collect();
        let mut duplicates = got.clone();
        duplicates.sort_unstable();
        let duplicates: Vec<i64> = duplicates
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        let out_of_order = got.windows(2).filter(|w| w[1] <= w[0]).count();
        panic!(
            "watcher {watcher}: received {} revision events, expected {}; missing {missing:?}, \
             duplicated {duplicates:?}, {out_of_order} out of order; stream problem: {error:?}; \
             received {got:?}",
            got.len(),
            expected.len()
        );
    }
    assert!(error.is_none(), "watcher {watcher}: {error:?}");
    for (event, response) in events.iter().zip(responses) {
        assert_appended(event, response);
    }
}

// ---------------------------------------------------------------------------
// LISTEN connections

async fn admin() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&postgres_admin_url())
        .await
        .expect("admin connection")
}

/// The commit-hint (LISTEN) connections to `database`. PgListener issues
/// `LISTEN "channel"` as a simple query, which `pg_stat_activity.query`
/// keeps while the connection idles.
async fn listen_backends(conn: &mut sqlx::PgConnection, database: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity \
         WHERE datname = $1 AND query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .bind(database)
    .fetch_all(conn)
    .await
    .expect("read pg_stat_activity")
}

/// Waits (bounded) until `database` has exactly `count` LISTEN connections:
/// every replica's listener is (re)connected. The condition is PostgreSQL's
/// own view (`pg_stat_activity`), which has no change notification, so it
/// is polled.
async fn await_listeners(conn: &mut sqlx::PgConnection, database: &str, count: usize) {
    let conn = tokio::sync::Mutex::new(conn);
    crate::support::poll_until(
        &format!("{count} LISTEN connections to {database}"),
        Duration::from_secs(20),
        || {
            let conn = &conn;
            async move {
                let seen = listen_backends(&mut **conn.lock().await, database).await;
                (seen.len() == count).then_some(())
            }
        },
    )
    .await;
}

// ---------------------------------------------------------------------------
// Tests

async fn writers_on_three_replicas_keep_sequences_gap_free() {
    const REPLICAS: usize = 3;
    const WRITERS_PER_REPLICA: usize = 4;
    const EACH: usize = 15;
    let replicas = Replicas::start(REPLICAS, |_, _| {}).await;
    let mut client = replicas.client(0).await;
    let created = create(&mut client, "ses_replicas_writers").await;

    let mut tasks = Vec::new();
    for r in 0..REPLICAS {
        for w in 0..WRITERS_PER_REPLICA {
            let mut client = replicas.client(r).await;
            let id = created.id.clone();
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                for i in 0..EACH {
                    let (question, answer) = (format!("r{r} w{w} q{i}"), format!("r{r} w{w} a{i}"));
                    let response =
                        append(&mut client, exchange_request(&id, &question, &answer)).await;
                    assert_contiguous(&response, &question, &answer);
                    mine.push(response);
                }
                mine
            }));
        }
    }
    let mut responses = Vec::new();
    for task in tasks {
        let mine = tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("writer finishes in time")
            .expect("writer succeeded");
        // One writer's own appends land in the order it made them.
        for pair in mine.windows(2) {
            assert!(pair[0].revision < pair[1].revision);
            assert!(pair[0].messages[1].sequence < pair[1].messages[0].sequence);
        }
        responses.extend(mine);
    }
    let exchanges = REPLICAS * WRITERS_PER_REPLICA * EACH;
    assert_eq!(responses.len(), exchanges);
    let exchanges = i64::try_from(exchanges).unwrap();

    // Every exchange got its own revision.
    let mut revisions: Vec<i64> = responses.iter().map(|r| r.revision).collect();
    revisions.sort_unstable();
    assert_eq!(revisions, (2..=1 + exchanges).collect::<Vec<_>>());
    // No sequence was handed out twice.
    let mut acked: Vec<&pb::StoredMessage> =
        responses.iter().flat_map(|r| r.messages.iter()).collect();
    acked.sort_by_key(|m| m.sequence);
    let acked_sequences: Vec<i64> = acked.iter().map(|m| m.sequence).collect();
    assert_eq!(acked_sequences, (0..2 * exchanges).collect::<Vec<_>>());

    // Read back through every replica: the same gap-free transcript.
    for r in 0..REPLICAS {
        let mut reader = replicas.client(r).await;
        let stored = all_messages(&mut reader, &created.id).await;
        let sequences: Vec<i64> = stored.iter().map(|m| m.sequence).collect();
        assert_eq!(
            sequences,
            (0..2 * exchanges).collect::<Vec<_>>(),
            "via replica {r}"
        );
        for (stored, acked) in stored.iter().zip(&acked) {
            assert_eq!(
                stored, *acked,
                "stored message differs from its ack (replica {r})"
            );
        }
        assert_eq!(get(&mut reader, &created.id).await.revision, 1 + exchanges);
    }

    let mut reader = replicas.client(2).await;
    let listed = reader
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("list sessions")
        .into_inner();
    let summary = listed
        .sessions
        .iter()
        .find(|s| s.session.as_ref().is_some_and(|s| s.id == created.id))
        .expect("the session is listed");
    assert_eq!(summary.message_count, 2 * exchanges);
    assert_eq!(summary.provider_call_count, exchanges);
    assert_eq!(summary.total_tokens, 15 * exchanges);
    assert_eq!(summary.total_cost_micros_usd, 42 * exchanges);
    assert_eq!(
        summary.session.as_ref().map(|s| s.revision),
        Some(1 + exchanges)
    );

    drop((client, reader));
    replicas.stop().await;
}

async fn idempotent_retry_on_another_replica_writes_nothing() {
    let replicas = Replicas::start(2, |_, _| {}).await;
    let mut a = replicas.client(0).await;
    let mut b = replicas.client(1).await;
    let created = create(&mut a, "ses_replicas_idem").await;

    let keyed = |key: &str, question: &str| pb::AppendExchangeRequest {
        request_id: key.to_owned(),
        ..exchange_request(&created.id, question, "answer")
    };
    let first = append(&mut a, keyed("k1", "question")).await;
    assert_eq!(first.revision, 2);
    assert_contiguous(&first, "question", "answer");

    // The identical retry on B: the first response, nothing written.
    let retried = append(&mut b, keyed("k1", "question")).await;
    assert_eq!(
        retried, first,
        "a retry on another replica answers like the first"
    );
    assert_eq!(get(&mut b, &created.id).await.revision, 2);
    assert_eq!(get(&mut a, &created.id).await.revision, 2);

    // The key with another body, on B: ALREADY_EXISTS, nothing written.
    let status = b
        .append_exchange(keyed("k1", "another question"))
        .await
        .expect_err("a reused key with a different body");
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    let (reason, _) = error_details(&status);
    assert!(reason.is_some(), "ErrorInfo missing: {status:?}");
    assert_eq!(get(&mut b, &created.id).await.revision, 2);
    assert_eq!(all_messages(&mut b, &created.id).await, first.messages);

    // The same request with a fresh key sent at the same moment to A and B:
    // one exchange, and both callers get its response. Several rounds, each
    // a race between two replicas.
    const ROUNDS: i64 = 10;
    let mut expected_messages = first.messages.clone();
    for round in 0..ROUNDS {
        let key = format!("race-{round}");
        let question = format!("race question {round}");
        let mut a2 = a.clone();
        let mut b2 = b.clone();
        let (via_a, via_b) = tokio::join!(
            tokio::spawn({
                let request = keyed(&key, &question);
                async move { append(&mut a2, request).await }
            }),
            tokio::spawn({
                let request = keyed(&key, &question);
                async move { append(&mut b2, request).await }
            }),
        );
        let (via_a, via_b) = (via_a.expect("append via A"), via_b.expect("append via B"));
        assert_eq!(
            via_a, via_b,
            "round {round}: both callers get the one response"
        );
        assert_eq!(
            via_a.revision,
            3 + round,
            "round {round}: exactly one revision"
        );
        assert_contiguous(&via_a, &question, "answer");
        expected_messages.extend(via_a.messages.clone());
        assert_eq!(get(&mut a, &created.id).await.revision, 3 + round);
    }
    // Exactly one exchange per key was written.
    assert_eq!(all_messages(&mut a, &created.id).await, expected_messages);
    assert_eq!(all_messages(&mut b, &created.id).await, expected_messages);
    let calls = b
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: created.id.clone(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .expect("list provider calls")
        .into_inner();
    assert_eq!(
        i64::try_from(calls.provider_calls.len()).unwrap(),
        1 + ROUNDS
    );

    drop((a, b));
    replicas.stop().await;
}

async fn watcher_on_b_sees_writes_through_a() {
    const EXCHANGES: i64 = 50;
    let replicas = Replicas::start(2, |_, _| {}).await;
    let mut a = replicas.client(0).await;
    let mut b = replicas.client(1).await;
    let created = create(&mut a, "ses_replicas_watch").await;

    let mut stream = watch(&mut b, &created.id, 0).await;
    read_through_caught_up(&mut stream, &created).await;

    // Write through A while B's watcher reads.
    let writer = tokio::spawn({
        let mut a = a.clone();
        let id = created.id.clone();
        async move {
            let mut responses = Vec::new();
            for i in 0..EXCHANGES {
                let (question, answer) = (format!("q{i}"), format!("a{i}"));
                let response = append(&mut a, exchange_request(&id, &question, &answer)).await;
                assert_contiguous(&response, &question, &answer);
                responses.push(response);
            }
            responses
        }
    });
    let (events, error) = collect_until(&mut stream, 1 + EXCHANGES).await;
    let responses = tokio::time::timeout(WAIT, writer)
        .await
        .expect("writer finishes in time")
        .expect("writer succeeded");
    assert_eq!(
        responses.iter().map(|r| r.revision).collect::<Vec<_>>(),
        (2..=1 + EXCHANGES).collect::<Vec<_>>()
    );

    // A later write through A is the very next event: nothing was
    // delivered twice after the last exchange.
    let renamed = rename(&mut a, &created.id, "renamed through A").await;
    assert_eq!(renamed.revision, 2 + EXCHANGES);
    let (tail, tail_error) = if error.is_none() {
        collect_until(&mut stream, renamed.revision).await
    } else {
        (Vec::new(), None)
    };
    let mut all = events;
    all.extend(tail);
    assert_exact_sequence(
        0,
        &all,
        error.as_ref().or(tail_error.as_ref()),
        &responses,
        Some(renamed.revision),
    );
    let Some(Event::SessionUpdated(updated)) = &all.last().expect("events").event else {
        panic!("expected session_updated last: {:?}", all.last());
    };
    assert_eq!(updated.session.as_ref(), Some(&renamed));

    drop((stream, a, b));
    replicas.stop().await;
}

/// Enough watchers on B that its hub wakes them from a blocking thread
/// (the server does so from 64 watchers of a session on): each still gets
/// every write through A once, in order, and then a later one.
async fn many_watchers_on_b_each_see_every_write_through_a() {
    const WATCHERS: usize = 80;
    const EXCHANGES: i64 = 20;
    let replicas = Replicas::start(2, |_, _| {}).await;
    let mut a = replicas.client(0).await;
    let mut b = replicas.client(1).await;
    let created = create(&mut a, "ses_replicas_many_watchers").await;
    let mut streams = Vec::with_capacity(WATCHERS);
    for _ in 0..WATCHERS {
        let mut stream = watch(&mut b, &created.id, 0).await;
        read_through_caught_up(&mut stream, &created).await;
        streams.push(stream);
    }

    let mut responses = Vec::new();
    for i in 0..EXCHANGES {
        let (question, answer) = (format!("q{i}"), format!("a{i}"));
        let response = append(&mut a, exchange_request(&created.id, &question, &answer)).await;
        assert_contiguous(&response, &question, &answer);
        responses.push(response);
    }
    let renamed = rename(&mut a, &created.id, "renamed through A").await;
    assert_eq!(renamed.revision, 2 + EXCHANGES);
    let readers: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move { collect_until(&mut stream, 2 + EXCHANGES).await })
        })
        .collect();
    for (w, reader) in readers.into_iter().enumerate() {
        let (events, error) = reader.await.expect("watcher task");
        assert_exact_sequence(
            w,
            &events,
            error.as_ref(),
            &responses,
            Some(renamed.revision),
        );
    }

    drop((a, b));
    replicas.stop().await;
}

/// How a kill round goes on after the LISTEN connections were terminated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterKill {
    /// The writer keeps appending: later hints arrive on the new connection.
    KeepWriting,
    /// The writer stops right after the kill until every watcher has the
    /// head: the last commit (in flight during the kill) likely landed while
    /// no LISTEN was in effect, and no later hint comes. Only the re-read of
    /// the watched heads after re-LISTEN can deliver it.
    Quiet,
}

async fn listener_killed_mid_stream_loses_nothing() {
    const WATCHERS: usize = 5;
    const EXCHANGES: i64 = 200;
    /// After this many acknowledged appends, kill the LISTEN connections.
    const KILLS: [(i64, AfterKill); 3] = [
        (50, AfterKill::KeepWriting),
        (100, AfterKill::Quiet),
        (150, AfterKill::Quiet),
    ];
    // B re-reads heads only on (re)connection: the periodic safety net is
    // out of reach, so only the reconnect path can recover lost hints.
    let replicas = Replicas::start(2, |_, c| c.recheck_interval_ms = 600_000).await;
    let database = replicas.database();
    let mut admin = admin().await;
    let mut a = replicas.client(0).await;
    let created = create(&mut a, "ses_replicas_kill").await;

    // Five watchers on B, each on its own connection, read through caught_up
    // and then collect in the background, publishing their last revision.
    let mut watchers = Vec::new();
    let mut progress = Vec::new();
    for _ in 0..WATCHERS {
        let mut b = replicas.client(1).await;
        let mut stream = watch(&mut b, &created.id, 0).await;
        read_through_caught_up(&mut stream, &created).await;
        let (seen, seen_rx) = tokio::sync::watch::channel(1_i64);
        progress.push(seen_rx);
        watchers.push(tokio::spawn(async move {
            let mut events = Vec::new();
            let mut error = None;
            while events.last().map_or(1, |e: &pb::SessionEvent| e.revision) < 2 + EXCHANGES {
                match try_next(&mut stream).await {
                    Ok(event) if matches!(event.event, Some(Event::CaughtUp(_))) => {
                        error = Some(format!("a second caught_up: {event:?}"));
                        break;
                    }
                    Ok(event) => {
                        seen.send_replace(event.revision);
                        events.push(event);
                    }
                    Err(why) => {
                        error = Some(why);
                        break;
                    }
                }
            }
            drop((stream, b));
            (events, error)
        }));
    }
    // Both replicas' listeners are up before the run starts.
    await_listeners(&mut admin, &database, 2).await;

    // The writer appends through A while its gate is open; when the gate
    // closes it parks and says how far it got.
    let (acked, mut acked_rx) = tokio::sync::watch::channel(0_i64);
    let (gate, gate_rx) = tokio::sync::watch::channel(true);
    let (parked, mut parked_rx) = tokio::sync::watch::channel(None::<i64>);
    let writer = tokio::spawn({
        let mut a = a.clone();
        let id = created.id.clone();
        let mut gate_rx = gate_rx;
        async move {
            let mut responses: Vec<pb::AppendExchangeResponse> = Vec::new();
            for i in 0..EXCHANGES {
                if !*gate_rx.borrow() {
                    parked.send_replace(Some(responses.last().map_or(1, |r| r.revision)));
                    gate_rx.wait_for(|open| *open).await.expect("gate");
                    parked.send_replace(None);
                }
                let (question, answer) = (format!("q{i}"), format!("a{i}"));
                let response = append(&mut a, exchange_request(&id, &question, &answer)).await;
                assert_contiguous(&response, &question, &answer);
                responses.push(response);
                acked.send_replace(i + 1);
            }
            responses
        }
    });

    let mut rounds = Vec::new();
    for (round, (after, then)) in KILLS.into_iter().enumerate() {
        tokio::time::timeout(WAIT, acked_rx.wait_for(|n| *n >= after))
            .await
            .expect("the writer makes progress")
            .expect("the writer is alive");
        if round > 0 {
            // The previous kill was recovered from: both listeners are back.
            await_listeners(&mut admin, &database, 2).await;
        }
        let killed = kill_listeners(&mut admin, &database).await;
        assert!(
            killed >= 1,
            "round {round}: no LISTEN backend was terminated"
        );
        if then == AfterKill::Quiet {
            gate.send_replace(false);
            let head = *tokio::time::timeout(WAIT, parked_rx.wait_for(Option::is_some))
                .await
                .expect("the writer parks")
                .expect("the writer is alive");
            let head = head.expect("parked");
            for (w, seen) in progress.iter_mut().enumerate() {
                let reached = tokio::time::timeout(WAIT, seen.wait_for(|r| *r >= head))
                    .await
                    .is_ok_and(|r| r.is_ok());
                let last = *seen.borrow();
                assert!(
                    reached,
                    "round {round}: watcher {w} on B stalls at revision {last}; the head, \
                     committed through A around the kill of the LISTEN connections, is {head} \
                     and no later write follows: a hint lost while B re-LISTENed was not made \
                     up for by re-reading the watched heads"
                );
            }
            gate.send_replace(true);
        }
        rounds.push((round, after, then, killed, *acked_rx.borrow()));
    }
    let responses = tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("writer finishes in time")
        .expect("writer succeeded");
    assert_eq!(
        responses.iter().map(|r| r.revision).collect::<Vec<_>>(),
        (2..=1 + EXCHANGES).collect::<Vec<_>>()
    );
    // A later write through A is the very next event each watcher gets.
    let renamed = rename(&mut a, &created.id, "after the kills").await;
    assert_eq!(renamed.revision, 2 + EXCHANGES);

    for (w, watcher) in watchers.into_iter().enumerate() {
        let (events, error) = tokio::time::timeout(Duration::from_secs(120), watcher)
            .await
            .expect("watcher finishes in time")
            .expect("watcher task");
        assert_exact_sequence(
            w,
            &events,
            error.as_ref(),
            &responses,
            Some(renamed.revision),
        );
    }
    // And the listeners came back after the last kill.
    await_listeners(&mut admin, &database, 2).await;
    eprintln!(
        "listener_killed_mid_stream_loses_nothing: (round, kill after, then, backends killed, acked at the end of the round) = {rounds:?}"
    );

    let _ = admin.close().await;
    drop(a);
    replicas.stop().await;
}

async fn delete_through_a_ends_watch_on_b() {
    let replicas = Replicas::start(2, |_, _| {}).await;
    let mut a = replicas.client(0).await;
    let mut b = replicas.client(1).await;
    let created = create(&mut a, "ses_replicas_delete").await;
    let appended = append(&mut a, exchange_request(&created.id, "q", "a")).await;
    assert_eq!(appended.revision, 2);

    let mut stream = watch(&mut b, &created.id, 0).await;
    let first = next(&mut stream).await;
    assert_eq!((first.revision, event_kind(&first)), (1, "session_created"));
    let second = next(&mut stream).await;
    assert_appended(&second, &appended);
    let caught_up = next(&mut stream).await;
    assert_eq!(
        (caught_up.revision, event_kind(&caught_up)),
        (2, "caught_up")
    );

    a.delete_session(pb::DeleteSessionRequest {
        session_id: created.id.clone(),
    })
    .await
    .expect("delete session");

    let deleted = next(&mut stream).await;
    assert_eq!(
        (deleted.revision, event_kind(&deleted)),
        (3, "session_deleted"),
        "{deleted:?}"
    );
    assert!(deleted.time.is_some());
    // Then the stream ends cleanly.
    let end = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("the stream ends in time");
    match end {
        Ok(None) => {}
        Ok(Some(event)) => panic!("an event after session_deleted: {event:?}"),
        Err(status) => panic!("the stream ended with an error, not cleanly: {status:?}"),
    }
    // B agrees the session is gone.
    let status = b
        .get_session(pb::GetSessionRequest {
            session_id: created.id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("deleted session");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    drop((stream, a, b));
    replicas.stop().await;
}

/// Shared state scopes and an exchange's state changes across replicas:
/// writers on two replicas racing on one shared entry each get their own
/// version (none lost), a state change made through A is what B reads, and
/// B's watcher sees it in A's exchange.
async fn shared_state_written_on_two_replicas_loses_no_write() {
    let replicas = Replicas::start(2, |_, _| {}).await;
    let mut a = replicas.client(0).await;
    let mut b = replicas.client(1).await;
    let created = create(&mut a, "ses_replicas_state").await;
    let mut watching = watch(&mut b, &created.id, created.revision).await;

    // Both replicas create and then bump one new shared key at once.
    const WRITES: usize = 10;
    let set = |value: String| pb::SetStateRequest {
        key: "counter".into(),
        value,
        scope: "app:race".into(),
        ..Default::default()
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (name, client) in [("a", a.clone()), ("b", b.clone())] {
        let mut client = client;
        tasks.spawn(async move {
            let mut versions = Vec::new();
            for i in 0..WRITES {
                let entry = client
                    .set_state(set(format!("{name}{i}")))
                    .await
                    .expect("set shared state")
                    .into_inner();
                versions.push(entry.version);
            }
            versions
        });
    }
    let mut versions: Vec<i64> = Vec::new();
    while let Some(done) = tasks.join_next().await {
        versions.extend(done.expect("writer task"));
    }
    versions.sort_unstable();
    let expected: Vec<i64> = (1..=(2 * WRITES) as i64).collect();
    assert_eq!(versions, expected, "every write has its own version");

    // A state change made through A, read through B and seen by B's watcher.
    let request = pb::AppendExchangeRequest {
        state_changes: vec![pb::StateChange {
            scope: "app:race".into(),
            key: "counter".into(),
            value: "from the exchange".into(),
            delete: false,
        }],
        ..exchange_request(&created.id, "question", "answer")
    };
    let appended = append(&mut a, request.clone()).await;
    let entry = b
        .get_state(pb::GetStateRequest {
            key: "counter".into(),
            scope: "app:race".into(),
            ..Default::default()
        })
        .await
        .expect("get shared state on B")
        .into_inner();
    assert_eq!(
        (entry.value.as_str(), entry.version),
        ("from the exchange", 2 * WRITES as i64 + 1)
    );
    let event = loop {
        let event = next(&mut watching).await;
        if event.revision == appended.revision {
            break event;
        }
    };
    let Some(Event::ExchangeAppended(seen)) = event.event else {
        panic!("expected exchange_appended, got {}", event_kind(&event));
    };
    assert_eq!(seen.state_changes, request.state_changes);
    drop(watching);
    replicas.stop().await;
}

/// A replica's append writers keep the sessions they write between batches
/// and do not read them again; whatever changes a session elsewhere (an
/// append or a run on another replica, a rollback, a delete, a plain SQL
/// update that leaves the revision alone) is found by the next append on
/// the keeping replica, never written over.
#[tokio::test]
async fn a_writer_keeping_a_session_finds_changes_made_elsewhere() {
    if !postgres_available("replicas::a_writer_keeping_a_session_finds_changes_made_elsewhere")
        .await
    {
        return;
    }
    let replicas = Replicas::start(2, |_, _| {}).await;
    let mut a = replicas.client(0).await;
    let mut b = replicas.client(1).await;
    let id = "ses_replicas_kept";
    let created = create(&mut a, id).await;
    let keyed = |key: &str, question: &str, next: Option<i64>| pb::AppendExchangeRequest {
        request_id: key.to_owned(),
        expected_next_sequence: next,
        ..exchange_request(id, question, "answer")
    };
    // An append on A that a lease refuses: SESSION_BUSY, nothing written.
    let refused_as_busy = async |a: &mut Client, request: pb::AppendExchangeRequest| {
        let status = a
            .append_exchange(request)
            .await
            .expect_err("the session is busy");
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(
            error_details(&status).0.as_deref(),
            Some("SESSION_BUSY"),
            "{status:?}"
        );
    };
    let mut acked = Vec::new();

    // A keeps the session; B appends behind its back.
    let a1 = append(&mut a, keyed("a1", "first on A", Some(0))).await;
    assert_eq!(a1.revision, created.revision + 1);
    acked.extend(a1.messages.clone());
    let b1 = append(&mut b, keyed("b1", "first on B", Some(a1.next_sequence))).await;
    acked.extend(b1.messages.clone());
    let a2 = append(&mut a, keyed("a2", "second on A", Some(b1.next_sequence))).await;
    assert_eq!(a2.revision, b1.revision + 1);
    assert_eq!(a2.messages[0].sequence, b1.next_sequence);
    acked.extend(a2.messages.clone());

    // A retry on A of what A kept: the first answer, nothing written.
    let again = append(&mut a, keyed("a2", "second on A", Some(b1.next_sequence))).await;
    assert_eq!(again, a2);

    // A run begun on B holds the session against A's plain appends.
    b.begin_run(pb::BeginRunRequest {
        session_id: id.into(),
        run_id: "run-b".into(),
        lease: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
    })
    .await
    .expect("begin run on B");
    refused_as_busy(&mut a, keyed("a3", "while B runs", None)).await;
    b.end_run(pb::EndRunRequest {
        session_id: id.into(),
        run_id: "run-b".into(),
        ..Default::default()
    })
    .await
    .expect("end run on B");
    let a3 = append(&mut a, keyed("a3", "after B's run", None)).await;
    acked.extend(a3.messages.clone());

    // A lease written straight into the row, its revision left alone.
    let mut sql = sqlx::PgConnection::connect(&replicas.url)
        .await
        .expect("connect to the replicas' database");
    let far = 4_102_444_800_000_000_i64; // 2100, in microseconds
    sqlx::query("UPDATE sessions SET run_id = 'sql-run', run_expire_time = $1 WHERE id = $2")
        .bind(far)
        .bind(id)
        .execute(&mut sql)
        .await
        .expect("set a lease by hand");
    refused_as_busy(&mut a, keyed("a4", "under the hand-set lease", None)).await;
    sqlx::query("UPDATE sessions SET run_id = '', run_expire_time = 0 WHERE id = $1")
        .bind(id)
        .execute(&mut sql)
        .await
        .expect("clear the lease by hand");
    let a4 = append(&mut a, keyed("a4", "lease cleared", None)).await;
    acked.extend(a4.messages.clone());

    // A rollback on B moves the next sequence back under A.
    let kept_until = a3.next_sequence;
    b.rollback_session(pb::RollbackSessionRequest {
        session_id: id.into(),
        after_sequence: kept_until - 1,
        ..Default::default()
    })
    .await
    .expect("roll back on B");
    acked.retain(|message| message.sequence < kept_until);
    let a5 = append(&mut a, keyed("a5", "after the rollback", Some(kept_until))).await;
    assert_eq!(a5.messages[0].sequence, kept_until);
    acked.extend(a5.messages.clone());
    assert_eq!(all_messages(&mut a, id).await, acked);
    assert_eq!(all_messages(&mut b, id).await, acked);

    // A delete on B: A's next append finds no session.
    b.delete_session(pb::DeleteSessionRequest {
        session_id: id.into(),
    })
    .await
    .expect("delete on B");
    let status = a
        .append_exchange(keyed("a6", "after the delete", None))
        .await
        .expect_err("the session is gone");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    sql.close().await.expect("close");
    replicas.stop().await;
}

crate::postgres_tests!(
    writers_on_three_replicas_keep_sequences_gap_free,
    idempotent_retry_on_another_replica_writes_nothing,
    watcher_on_b_sees_writes_through_a,
    many_watchers_on_b_each_see_every_write_through_a,
    listener_killed_mid_stream_loses_nothing,
    delete_through_a_ends_watch_on_b,
    shared_state_written_on_two_replicas_loses_no_write,
);
