//! Runs: leases (`BeginRun` / `EndRun`, expiry), the writes a lease gates,
//! live deltas (`PublishDelta` / `DiscardRun`), `include_active_deltas`, the
//! ordering of deltas among revisions, and deltas across PostgreSQL replicas.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use sessionstore_server::config::ServeConfig;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::kill_listeners;
use crate::support::{
    Backend, Events, Storage, TestServer, all_messages, assistant, connect, content, create,
    error_details, event_kind, exchange, exchange_request, get, next_change, rename,
};

/// Safety net for "the next event / the next step arrives": never a pacing sleep.
const WAIT: Duration = Duration::from_secs(20);

type Client = SessionStoreClient<Channel>;

// ---------------------------------------------------------------------------
// Requests

fn lease(millis: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: millis / 1000,
        nanos: i32::try_from((millis % 1000) * 1_000_000).unwrap(),
    })
}

fn begin_request(id: &str, run: &str, lease_ms: i64) -> pb::BeginRunRequest {
    pb::BeginRunRequest {
        session_id: id.to_owned(),
        run_id: run.to_owned(),
        lease: lease(lease_ms),
    }
}

pub(crate) async fn begin(
    client: &mut Client,
    id: &str,
    run: &str,
    lease_ms: i64,
) -> pb::BeginRunResponse {
    client
        .begin_run(begin_request(id, run, lease_ms))
        .await
        .unwrap_or_else(|status| panic!("begin run {run}: {status:?}"))
        .into_inner()
}

pub(crate) async fn end(client: &mut Client, id: &str, run: &str) -> i64 {
    client
        .end_run(pb::EndRunRequest {
            session_id: id.to_owned(),
            run_id: run.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("end run {run}: {status:?}"))
        .into_inner()
        .revision
}

fn run_exchange(id: &str, question: &str, answer: &str, run: &str) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        run_id: run.to_owned(),
        ..exchange_request(id, question, answer)
    }
}

fn text_delta(id: &str, run: &str, index: i64, text: &str) -> pb::PublishDeltaRequest {
    pb::PublishDeltaRequest {
        session_id: id.to_owned(),
        run_id: run.to_owned(),
        index,
        delta: Some(pb::publish_delta_request::Delta::Text(text.to_owned())),
    }
}

fn block_delta(
    id: &str,
    run: &str,
    index: i64,
    block: pb::ContentBlock,
) -> pb::PublishDeltaRequest {
    pb::PublishDeltaRequest {
        session_id: id.to_owned(),
        run_id: run.to_owned(),
        index,
        delta: Some(pb::publish_delta_request::Delta::Block(block)),
    }
}

fn text_block(text: &str) -> pb::ContentBlock {
    pb::ContentBlock {
        block: Some(pb::content_block::Block::Text(pb::TextBlock {
            text: text.to_owned(),
            signature: String::new(),
        })),
    }
}

async fn publish(client: &mut Client, request: pb::PublishDeltaRequest) -> i64 {
    let what = format!("{}#{}", request.run_id, request.index);
    client
        .publish_delta(request)
        .await
        .unwrap_or_else(|status| panic!("publish delta {what}: {status:?}"))
        .into_inner()
        .revision
}

async fn discard(client: &mut Client, id: &str, run: &str) -> i64 {
    client
        .discard_run(pb::DiscardRunRequest {
            session_id: id.to_owned(),
            run_id: run.to_owned(),
        })
        .await
        .unwrap_or_else(|status| panic!("discard run {run}: {status:?}"))
        .into_inner()
        .revision
}

// ---------------------------------------------------------------------------
// Errors

/// The ErrorInfo metadata of a status (empty without ErrorInfo).
fn error_metadata(status: &tonic::Status) -> HashMap<String, String> {
    use tonic_types::StatusExt as _;
    status
        .get_error_details()
        .error_info()
        .map(|info| info.metadata.clone())
        .unwrap_or_default()
}

/// INVALID_ARGUMENT naming `field` in the message, BadRequest and ErrorInfo.
fn assert_invalid(status: &tonic::Status, field: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let (reason, violation) = error_details(status);
    assert!(reason.is_some(), "ErrorInfo missing: {status:?}");
    assert_eq!(violation.as_deref(), Some(field), "{status:?}");
    assert_eq!(
        error_metadata(status).get("field").map(String::as_str),
        Some(field),
        "{status:?}"
    );
    assert!(status.message().contains(field), "{status:?}");
}

/// FAILED_PRECONDITION / SESSION_BUSY naming the run holding the lease.
fn assert_busy(status: &tonic::Status, holder: &str) {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let (reason, _) = error_details(status);
    assert_eq!(reason.as_deref(), Some("SESSION_BUSY"), "{status:?}");
    assert_eq!(
        error_metadata(status)
            .get("active_run_id")
            .map(String::as_str),
        Some(holder),
        "{status:?}"
    );
}

fn assert_not_found(status: &tonic::Status) {
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let (reason, _) = error_details(status);
    assert!(reason.is_some(), "ErrorInfo missing: {status:?}");
}

// ---------------------------------------------------------------------------
// Watching

async fn watch_from(client: &mut Client, id: &str, after: i64, active_deltas: bool) -> Events {
    client
        .watch_session(pb::WatchSessionRequest {
            session_id: id.to_owned(),
            after_revision: after,
            include_active_deltas: active_deltas,
            ..Default::default()
        })
        .await
        .expect("watch session")
        .into_inner()
}

/// Reads through `caught_up`: the replayed events and the caught-up revision.
async fn through_caught_up(stream: &mut Events) -> (Vec<pb::SessionEvent>, i64) {
    let mut replayed = Vec::new();
    loop {
        let event = next_change(stream).await;
        if matches!(event.event, Some(Event::CaughtUp(_))) {
            return (replayed, event.revision);
        }
        replayed.push(event);
    }
}

fn kinds(events: &[pb::SessionEvent]) -> Vec<&'static str> {
    events.iter().map(event_kind).collect()
}

fn as_delta(event: &pb::SessionEvent) -> &pb::Delta {
    match &event.event {
        Some(Event::Delta(delta)) => delta,
        _ => panic!("expected delta, got {}: {event:?}", event_kind(event)),
    }
}

fn delta_text(delta: &pb::Delta) -> &str {
    match &delta.delta {
        Some(pb::delta::Delta::Text(text)) => text,
        other => panic!("expected a text delta, got {other:?}"),
    }
}

/// Checks that `event` is the delta `run#index` with `text` at `revision`.
fn assert_text_delta(event: &pb::SessionEvent, run: &str, index: i64, text: &str, revision: i64) {
    let delta = as_delta(event);
    assert_eq!(
        (delta.run_id.as_str(), delta.index, delta_text(delta)),
        (run, index, text),
        "{event:?}"
    );
    assert_eq!(event.revision, revision, "revision of {event:?}");
}

fn as_run_begun(event: &pb::SessionEvent) -> &pb::RunBegun {
    match &event.event {
        Some(Event::RunBegun(begun)) => begun,
        _ => panic!("expected run_begun, got {}: {event:?}", event_kind(event)),
    }
}

fn as_run_ended(event: &pb::SessionEvent) -> &pb::RunEnded {
    match &event.event {
        Some(Event::RunEnded(ended)) => ended,
        _ => panic!("expected run_ended, got {}: {event:?}", event_kind(event)),
    }
}

fn as_appended(event: &pb::SessionEvent) -> &pb::ExchangeAppended {
    match &event.event {
        Some(Event::ExchangeAppended(appended)) => appended,
        _ => panic!(
            "expected exchange_appended, got {}: {event:?}",
            event_kind(event)
        ),
    }
}

fn micros(time: Option<&prost_types::Timestamp>) -> i64 {
    let time = time.expect("a timestamp");
    time.seconds * 1_000_000 + i64::from(time.nanos) / 1000
}

fn now_micros() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

// ---------------------------------------------------------------------------
// Leases

async fn run_and_delta_argument_errors(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_args").await.id;

    // BeginRun: lease missing, zero, negative, over a day; run_id empty.
    let no_lease = client
        .begin_run(pb::BeginRunRequest {
            lease: None,
            ..begin_request(&id, "A", 1000)
        })
        .await
        .unwrap_err();
    assert_invalid(&no_lease, "lease");
    for bad in [0, -1000] {
        let status = client
            .begin_run(begin_request(&id, "A", bad))
            .await
            .unwrap_err();
        assert_invalid(&status, "lease");
    }
    let negative_nanos = client
        .begin_run(pb::BeginRunRequest {
            lease: Some(prost_types::Duration {
                seconds: 0,
                nanos: -1,
            }),
            ..begin_request(&id, "A", 1000)
        })
        .await
        .unwrap_err();
    assert_invalid(&negative_nanos, "lease");
    let over_a_day = client
        .begin_run(begin_request(&id, "A", 24 * 3600 * 1000 + 1))
        .await
        .unwrap_err();
    assert_invalid(&over_a_day, "lease");
    let no_run = client
        .begin_run(begin_request(&id, "", 1000))
        .await
        .unwrap_err();
    assert_invalid(&no_run, "run_id");
    let unknown = client
        .begin_run(begin_request("ses_runs_nobody", "A", 1000))
        .await
        .unwrap_err();
    assert_not_found(&unknown);

    // EndRun: run_id required; unknown session.
    let status = client
        .end_run(pb::EndRunRequest {
            session_id: id.clone(),
            run_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_invalid(&status, "run_id");
    let status = client
        .end_run(pb::EndRunRequest {
            session_id: "ses_runs_nobody".into(),
            run_id: "A".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_not_found(&status);

    // PublishDelta: run_id, index, content; unknown session.
    let status = client
        .publish_delta(text_delta(&id, "", 0, "x"))
        .await
        .unwrap_err();
    assert_invalid(&status, "run_id");
    let status = client
        .publish_delta(text_delta(&id, "A", -1, "x"))
        .await
        .unwrap_err();
    assert_invalid(&status, "index");
    let status = client
        .publish_delta(pb::PublishDeltaRequest {
            delta: None,
            ..text_delta(&id, "A", 0, "x")
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let (reason, field) = error_details(&status);
    assert!(reason.is_some(), "ErrorInfo missing: {status:?}");
    assert!(field.is_some(), "BadRequest missing: {status:?}");
    let status = client
        .publish_delta(text_delta("ses_runs_nobody", "A", 0, "x"))
        .await
        .unwrap_err();
    assert_not_found(&status);

    // DiscardRun: run_id required; unknown session.
    let status = client
        .discard_run(pb::DiscardRunRequest {
            session_id: id.clone(),
            run_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_invalid(&status, "run_id");
    let status = client
        .discard_run(pb::DiscardRunRequest {
            session_id: "ses_runs_nobody".into(),
            run_id: "A".into(),
        })
        .await
        .unwrap_err();
    assert_not_found(&status);

    // Nothing was written, nobody holds the session.
    let session = get(&mut client, &id).await;
    assert_eq!(session.revision, 1);
    assert_eq!(session.active_run_id, "");
    assert!(session.run_expire_time.is_none(), "{session:?}");

    // A lease of exactly a day is allowed.
    let day = begin(&mut client, &id, "A", 24 * 3600 * 1000).await;
    assert_eq!(day.revision, 2);
    let expire = micros(day.expire_time.as_ref());
    let expected = now_micros() + 24 * 3600 * 1_000_000;
    assert!(
        (expire - expected).abs() < 60_000_000,
        "a day's lease expires in a day: {day:?}"
    );
}

async fn lease_makes_session_busy_for_other_runs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_busy").await.id;
    let first = exchange(&mut client, &id, "q0", "a0").await;
    assert_eq!(first.revision, 2);
    let mut stream = watch_from(&mut client, &id, 2, false).await;
    assert_eq!(through_caught_up(&mut stream).await.1, 2);

    let before = now_micros();
    let begun = begin(&mut client, &id, "A", 60_000).await;
    assert_eq!(begun.revision, 3);
    let expire = micros(begun.expire_time.as_ref());
    assert!(
        expire >= before + 59_000_000 && expire <= now_micros() + 61_000_000,
        "expire_time about a minute ahead: {begun:?}"
    );
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 3);
    let run_begun = as_run_begun(&event);
    assert_eq!(run_begun.run_id, "A");
    assert_eq!(run_begun.expire_time, begun.expire_time);

    let session = get(&mut client, &id).await;
    assert_eq!(session.active_run_id, "A");
    assert_eq!(session.run_expire_time, begun.expire_time);
    assert_eq!(session.revision, 3);

    // Another run cannot take the lease, append, publish, roll back, edit or redact.
    let status = client
        .begin_run(begin_request(&id, "B", 1000))
        .await
        .unwrap_err();
    assert_busy(&status, "A");
    for run in ["", "B"] {
        let status = client
            .append_exchange(run_exchange(&id, "q-busy", "a-busy", run))
            .await
            .unwrap_err();
        assert_busy(&status, "A");
    }
    let status = client
        .publish_delta(text_delta(&id, "B", 0, "partial"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let target = first.messages[1].id.clone();
    for run in ["", "B"] {
        let status = client
            .rollback_session(pb::RollbackSessionRequest {
                session_id: id.clone(),
                after_sequence: 0,
                run_id: run.to_owned(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_busy(&status, "A");
        let status = client
            .edit_message(pb::EditMessageRequest {
                session_id: id.clone(),
                message_id: target.clone(),
                message: Some(assistant("edited by B")),
                reason: "busy".into(),
                run_id: run.to_owned(),
            })
            .await
            .unwrap_err();
        assert_busy(&status, "A");
        let status = client
            .redact_message(pb::RedactMessageRequest {
                session_id: id.clone(),
                message_id: target.clone(),
                reason: "busy".into(),
                run_id: run.to_owned(),
            })
            .await
            .unwrap_err();
        assert_busy(&status, "A");
    }
    // Nothing was written.
    let session = get(&mut client, &id).await;
    assert_eq!(session.revision, 3);
    assert_eq!(session.active_run_id, "A");
    let messages = all_messages(&mut client, &id).await;
    assert_eq!(
        messages.iter().map(content).collect::<Vec<_>>(),
        ["q0", "a0"]
    );

    // State and session fields are not gated by the lease.
    let entry = client
        .set_state(pb::SetStateRequest {
            session_id: id.clone(),
            key: "cwd".into(),
            value: "/tmp".into(),
            expected_version: None,
            ..Default::default()
        })
        .await
        .expect("set state while busy")
        .into_inner();
    assert_eq!(entry.value, "/tmp");
    assert_eq!(event_kind(&next_change(&mut stream).await), "state_changed");
    let renamed = rename(&mut client, &id, "renamed while busy").await;
    assert_eq!(renamed.revision, 5);
    assert_eq!(
        event_kind(&next_change(&mut stream).await),
        "session_updated"
    );

    // The holder does all of it.
    let partial = publish(&mut client, text_delta(&id, "A", 0, "Hel")).await;
    assert_eq!(partial, 5);
    assert_text_delta(&next_change(&mut stream).await, "A", 0, "Hel", 5);
    let appended = client
        .append_exchange(run_exchange(&id, "q1", "Hello", "A"))
        .await
        .expect("the holder appends")
        .into_inner();
    assert_eq!(appended.revision, 6);
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 6);
    assert_eq!(as_appended(&event).run_id, "A");
    assert_eq!(as_appended(&event).messages, appended.messages);

    let edited = client
        .edit_message(pb::EditMessageRequest {
            session_id: id.clone(),
            message_id: target.clone(),
            message: Some(assistant("a0, edited by A")),
            reason: "holder".into(),
            run_id: "A".into(),
        })
        .await
        .expect("the holder edits")
        .into_inner();
    assert_eq!(edited.revision, 7);
    assert_eq!(
        event_kind(&next_change(&mut stream).await),
        "message_edited"
    );
    let redacted = client
        .redact_message(pb::RedactMessageRequest {
            session_id: id.clone(),
            message_id: appended.messages[1].id.clone(),
            reason: "holder".into(),
            run_id: "A".into(),
        })
        .await
        .expect("the holder redacts")
        .into_inner();
    assert_eq!(redacted.revision, 8);
    assert_eq!(
        event_kind(&next_change(&mut stream).await),
        "message_redacted"
    );
    let rolled_back = client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: id.clone(),
            after_sequence: 1,
            run_id: "A".into(),
            ..Default::default()
        })
        .await
        .expect("the holder rolls back")
        .into_inner();
    assert_eq!((rolled_back.revision, rolled_back.next_sequence), (9, 2));
    assert_eq!(event_kind(&next_change(&mut stream).await), "rolled_back");

    let messages = all_messages(&mut client, &id).await;
    assert_eq!(
        messages.iter().map(content).collect::<Vec<_>>(),
        ["q0", "a0, edited by A"]
    );
    let session = get(&mut client, &id).await;
    assert_eq!(session.revision, 9);
    assert_eq!(session.active_run_id, "A", "writes do not end the lease");
}

async fn renew_and_end_run(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_renew").await.id;
    let mut stream = watch_from(&mut client, &id, 0, false).await;
    assert_eq!(through_caught_up(&mut stream).await.1, 1);

    // Ending a run that holds nothing changes nothing.
    assert_eq!(end(&mut client, &id, "A").await, 1);

    let first = begin(&mut client, &id, "A", 30_000).await;
    assert_eq!(first.revision, 2);
    let event = next_change(&mut stream).await;
    assert_eq!(
        (event.revision, as_run_begun(&event).run_id.as_str()),
        (2, "A")
    );

    // Renewal by the holder: a new revision, a later expiry, a new event.
    let renewed = begin(&mut client, &id, "A", 60_000).await;
    assert_eq!(renewed.revision, 3);
    assert!(
        micros(renewed.expire_time.as_ref()) > micros(first.expire_time.as_ref()),
        "{renewed:?} renews {first:?}"
    );
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 3);
    assert_eq!(as_run_begun(&event).run_id, "A");
    assert_eq!(as_run_begun(&event).expire_time, renewed.expire_time);
    let session = get(&mut client, &id).await;
    assert_eq!(session.active_run_id, "A");
    assert_eq!(session.run_expire_time, renewed.expire_time);

    // EndRun by another run: the revision unchanged, no event, still busy.
    assert_eq!(end(&mut client, &id, "B").await, 3);
    let status = client
        .begin_run(begin_request(&id, "B", 1000))
        .await
        .unwrap_err();
    assert_busy(&status, "A");

    // EndRun by the holder.
    assert_eq!(end(&mut client, &id, "A").await, 4);
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 4, "no event for B's EndRun: {event:?}");
    let ended = as_run_ended(&event);
    assert_eq!(ended.run_id, "A");
    assert!(!ended.expired);
    let session = get(&mut client, &id).await;
    assert_eq!(session.revision, 4);
    assert_eq!(session.active_run_id, "");
    assert!(session.run_expire_time.is_none(), "{session:?}");
    // Ending again changes nothing.
    assert_eq!(end(&mut client, &id, "A").await, 4);

    // Free again: a run id needs no lease, and any run may append.
    for (i, run) in ["A", "Z", ""].into_iter().enumerate() {
        let appended = client
            .append_exchange(run_exchange(&id, &format!("q{i}"), "a", run))
            .await
            .unwrap_or_else(|status| panic!("append with run {run:?}: {status:?}"))
            .into_inner();
        assert_eq!(appended.revision, 5 + i64::try_from(i).unwrap());
        let event = next_change(&mut stream).await;
        assert_eq!(event.revision, appended.revision);
        assert_eq!(as_appended(&event).run_id, run);
    }
    // And another run may take the lease.
    let other = begin(&mut client, &id, "B", 30_000).await;
    assert_eq!(other.revision, 8);
    let event = next_change(&mut stream).await;
    assert_eq!(
        (event.revision, as_run_begun(&event).run_id.as_str()),
        (8, "B")
    );

    // The replay records exactly the revisions made.
    let mut replay = watch_from(&mut client, &id, 0, false).await;
    let (events, caught_up) = through_caught_up(&mut replay).await;
    assert_eq!(caught_up, 8);
    assert_eq!(
        kinds(&events),
        [
            "session_created",
            "run_begun",
            "run_begun",
            "run_ended",
            "exchange_appended",
            "exchange_appended",
            "exchange_appended",
            "run_begun",
        ]
    );
    assert_eq!(
        events.iter().map(|e| e.revision).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
}

/// With a prompt sweeper, an expired lease is recorded as `run_ended
/// {expired}` on its own, never before its time, and drops the run's deltas.
async fn lease_expiry_recorded_by_sweeper(backend: Backend) {
    const LEASE_MS: i64 = 1000;
    let storage = Storage::new(backend).await;
    let server = TestServer::start_on(storage, |c| c.sweep_interval_ms = 50).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_expiry").await.id;
    let mut stream = watch_from(&mut client, &id, 0, false).await;
    assert_eq!(through_caught_up(&mut stream).await.1, 1);

    let begun = begin(&mut client, &id, "A", LEASE_MS).await;
    assert_eq!(begun.revision, 2);
    let expire = micros(begun.expire_time.as_ref());
    // Well within the lease: still busy.
    let status = client
        .begin_run(begin_request(&id, "B", 1000))
        .await
        .unwrap_err();
    assert_busy(&status, "A");
    assert_eq!(
        publish(&mut client, text_delta(&id, "A", 0, "partial")).await,
        2
    );

    assert_eq!(as_run_begun(&next_change(&mut stream).await).run_id, "A");
    assert_text_delta(&next_change(&mut stream).await, "A", 0, "partial", 2);
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 3);
    let ended = as_run_ended(&event);
    assert_eq!(ended.run_id, "A");
    assert!(ended.expired, "{event:?}");
    assert!(
        micros(event.time.as_ref()) >= expire,
        "the lease ended before its time: {event:?}, expire_time {:?}",
        begun.expire_time
    );

    let session = get(&mut client, &id).await;
    assert_eq!(session.revision, 3);
    assert_eq!(session.active_run_id, "");
    assert!(session.run_expire_time.is_none(), "{session:?}");

    // The expired run's deltas are gone for late joiners.
    let mut late = watch_from(&mut client, &id, 3, true).await;
    assert_eq!(through_caught_up(&mut late).await, (Vec::new(), 3));
    publish(&mut client, text_delta(&id, "marker", 0, "m")).await;
    assert_text_delta(&next_change(&mut late).await, "marker", 0, "m", 3);

    // Free: B takes the lease.
    let other = begin(&mut client, &id, "B", 60_000).await;
    assert_eq!(other.revision, 4);
    assert_text_delta(&next_change(&mut stream).await, "marker", 0, "m", 3);
    let event = next_change(&mut stream).await;
    assert_eq!(
        (event.revision, as_run_begun(&event).run_id.as_str()),
        (4, "B")
    );
}

/// Reads the session until its lease is gone: a read sent after the
/// lease's expiry time must find it gone, and one that finds it gone must
/// have been answered no earlier than that time (no event marks an expiry
/// without a sweep, so the reads poll).
async fn after_expiry(
    client: &mut Client,
    id: &str,
    expire_time: Option<&prost_types::Timestamp>,
) -> pb::Session {
    let expiry = micros(expire_time);
    let patience = Duration::from_micros(u64::try_from(expiry - now_micros()).unwrap_or(0))
        + Duration::from_secs(10);
    let client = tokio::sync::Mutex::new(client);
    crate::support::poll_until("the lease gone", patience, || {
        let client = &client;
        async move {
            let sent = now_micros();
            let session = get(&mut **client.lock().await, id).await;
            if !session.active_run_id.is_empty() {
                assert!(sent <= expiry, "the lease outlived its time: {session:?}");
                return None;
            }
            assert!(now_micros() >= expiry, "the lease went before its time");
            Some(session)
        }
    })
    .await
}

/// Without a sweep in sight, the first write after expiry still finds
/// `run_ended {expired}` recorded just before it.
async fn expired_lease_settled_before_next_write(backend: Backend) {
    const LEASE_MS: i64 = 600;
    let storage = Storage::new(backend).await;
    let server = TestServer::start_on(storage, |c| c.sweep_interval_ms = 3_600_000).await;
    let mut client = server.client().await;

    // The next write is an append by a run-less caller.
    let appended_id = create(&mut client, "ses_runs_settle_append").await.id;
    let begun = begin(&mut client, &appended_id, "A", LEASE_MS).await;
    assert_eq!(begun.revision, 2);
    // The next write is another run's BeginRun.
    let begun_id = create(&mut client, "ses_runs_settle_begin").await.id;
    let begun2 = begin(&mut client, &begun_id, "A", LEASE_MS).await;
    assert_eq!(begun2.revision, 2);

    let status = client
        .append_exchange(run_exchange(&appended_id, "early", "too early", ""))
        .await
        .unwrap_err();
    assert_busy(&status, "A");

    let session = after_expiry(&mut client, &appended_id, begun.expire_time.as_ref()).await;
    assert!(session.run_expire_time.is_none(), "{session:?}");
    after_expiry(&mut client, &begun_id, begun2.expire_time.as_ref()).await;

    let appended = client
        .append_exchange(run_exchange(&appended_id, "q", "a", ""))
        .await
        .expect("append after expiry")
        .into_inner();
    assert_eq!(appended.revision, 4, "run_ended takes revision 3");
    let other = begin(&mut client, &begun_id, "B", 60_000).await;
    assert_eq!(other.revision, 4, "run_ended takes revision 3");

    for (id, last) in [
        (&appended_id, "exchange_appended"),
        (&begun_id, "run_begun"),
    ] {
        let mut replay = watch_from(&mut client, id, 1, false).await;
        let (events, caught_up) = through_caught_up(&mut replay).await;
        assert_eq!(caught_up, 4);
        assert_eq!(kinds(&events), ["run_begun", "run_ended", last], "{id}");
        assert_eq!(
            events.iter().map(|e| e.revision).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        let ended = as_run_ended(&events[1]);
        assert_eq!(ended.run_id, "A");
        assert!(ended.expired, "{:?}", events[1]);
    }
    let session = get(&mut client, &begun_id).await;
    assert_eq!(session.active_run_id, "B");
    assert_eq!(session.revision, 4);
}

// ---------------------------------------------------------------------------
// Deltas

async fn deltas_are_ephemeral_and_reach_watchers(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_deltas").await.id;
    let mut stream = watch_from(&mut client, &id, 0, false).await;
    assert_eq!(through_caught_up(&mut stream).await.1, 1);

    // Text and block deltas carry the current revision and do not bump it.
    assert_eq!(
        publish(&mut client, text_delta(&id, "r", 0, "Hel")).await,
        1
    );
    assert_text_delta(&next_change(&mut stream).await, "r", 0, "Hel", 1);
    let thinking = pb::ContentBlock {
        block: Some(pb::content_block::Block::Thinking(pb::ThinkingBlock {
            thinking: "let me think \u{0}".into(),
            signature: "sig==".into(),
        })),
    };
    assert_eq!(
        publish(&mut client, block_delta(&id, "r", 1, thinking.clone())).await,
        1
    );
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 1);
    let delta = as_delta(&event);
    assert_eq!((delta.run_id.as_str(), delta.index), ("r", 1));
    assert_eq!(delta.delta, Some(pb::delta::Delta::Block(thinking)));
    assert_eq!(get(&mut client, &id).await.revision, 1);

    // The final message arrives through AppendExchange with the same run id.
    let appended = client
        .append_exchange(run_exchange(&id, "hi", "Hello", "r"))
        .await
        .expect("append the run's exchange")
        .into_inner();
    assert_eq!(appended.revision, 2);
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 2);
    assert_eq!(as_appended(&event).run_id, "r");
    assert_eq!(as_appended(&event).messages, appended.messages);

    // A cancelled turn: its deltas, then run_discarded, at the current revision.
    assert_eq!(
        publish(&mut client, text_delta(&id, "s", 0, "Nev")).await,
        2
    );
    assert_text_delta(&next_change(&mut stream).await, "s", 0, "Nev", 2);
    assert_eq!(discard(&mut client, &id, "s").await, 2);
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 2);
    let Some(Event::RunDiscarded(discarded)) = &event.event else {
        panic!(
            "expected run_discarded, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(discarded.run_id, "s");
    // Discarding is not a write either.
    assert_eq!(get(&mut client, &id).await.revision, 2);
    let messages = all_messages(&mut client, &id).await;
    assert_eq!(
        messages.iter().map(content).collect::<Vec<_>>(),
        ["hi", "Hello"]
    );

    // A replay never contains deltas or discards.
    let mut replay = watch_from(&mut client, &id, 0, false).await;
    let (events, caught_up) = through_caught_up(&mut replay).await;
    assert_eq!(caught_up, 2);
    assert_eq!(kinds(&events), ["session_created", "exchange_appended"]);
    let renamed = rename(&mut client, &id, "after the deltas").await;
    assert_eq!(renamed.revision, 3);
    let event = next_change(&mut replay).await;
    assert_eq!((event.revision, event_kind(&event)), (3, "session_updated"));
    assert_eq!(
        event_kind(&next_change(&mut stream).await),
        "session_updated"
    );
}

async fn include_active_deltas_replays_open_runs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_active").await.id;

    // A leased run, ended.
    begin(&mut client, &id, "leased", 60_000).await;
    publish(&mut client, text_delta(&id, "leased", 0, "l0")).await;
    publish(&mut client, text_delta(&id, "leased", 1, "l1")).await;
    end(&mut client, &id, "leased").await;
    // A run whose exchange was appended.
    publish(&mut client, text_delta(&id, "answered", 0, "an0")).await;
    publish(&mut client, text_delta(&id, "answered", 1, "an1")).await;
    client
        .append_exchange(run_exchange(&id, "q", "an0an1", "answered"))
        .await
        .expect("append");
    // A discarded run.
    publish(&mut client, text_delta(&id, "cancelled", 0, "c0")).await;
    discard(&mut client, &id, "cancelled").await;
    // Two open runs, one of blocks.
    for (index, text) in ["o0", "o1", "o2", "o3"].into_iter().enumerate() {
        let index = i64::try_from(index).unwrap();
        publish(&mut client, text_delta(&id, "open", index, text)).await;
    }
    publish(&mut client, block_delta(&id, "blocks", 0, text_block("b0"))).await;
    publish(&mut client, block_delta(&id, "blocks", 1, text_block("b1"))).await;
    // A later revision: buffered deltas are stamped with the caught-up one.
    let head = rename(&mut client, &id, "later").await.revision;
    assert_eq!(head, 5);

    let mut from_zero = watch_from(&mut client, &id, 0, true).await;
    let mut at_head = watch_from(&mut client, &id, head, true).await;
    let mut without = watch_from(&mut client, &id, head, false).await;
    let (replayed, caught_up) = through_caught_up(&mut from_zero).await;
    assert_eq!(caught_up, head);
    assert_eq!(
        kinds(&replayed),
        [
            "session_created",
            "run_begun",
            "run_ended",
            "exchange_appended",
            "session_updated"
        ]
    );
    assert_eq!(through_caught_up(&mut at_head).await, (Vec::new(), head));
    assert_eq!(through_caught_up(&mut without).await, (Vec::new(), head));

    // A live delta bounds what came before it.
    publish(&mut client, text_delta(&id, "open", 4, "o4")).await;
    for stream in [&mut from_zero, &mut at_head] {
        let mut runs: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
        loop {
            let event = next_change(stream).await;
            assert_eq!(event.revision, head, "{event:?}");
            let delta = as_delta(&event);
            let text = match &delta.delta {
                Some(pb::delta::Delta::Text(text)) => text.clone(),
                Some(pb::delta::Delta::Block(block)) => match &block.block {
                    Some(pb::content_block::Block::Text(t)) => format!("block:{}", t.text),
                    other => panic!("unexpected block {other:?}"),
                },
                None => panic!("empty delta {event:?}"),
            };
            runs.entry(delta.run_id.clone())
                .or_default()
                .push((delta.index, text));
            if delta.run_id == "open" && delta.index == 4 {
                break;
            }
        }
        let expected: BTreeMap<String, Vec<(i64, String)>> = [
            (
                "open".to_owned(),
                vec![
                    (0, "o0".to_owned()),
                    (1, "o1".to_owned()),
                    (2, "o2".to_owned()),
                    (3, "o3".to_owned()),
                    (4, "o4".to_owned()),
                ],
            ),
            (
                "blocks".to_owned(),
                vec![(0, "block:b0".to_owned()), (1, "block:b1".to_owned())],
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(runs, expected, "open runs only, each in index order, once");
    }
    // Without the flag, only live deltas.
    assert_text_delta(&next_change(&mut without).await, "open", 4, "o4", head);

    // Once the open runs end, new joiners get nothing of them.
    client
        .append_exchange(run_exchange(&id, "q2", "o0..o4", "open"))
        .await
        .expect("append");
    discard(&mut client, &id, "blocks").await;
    let mut late = watch_from(&mut client, &id, head + 1, true).await;
    assert_eq!(through_caught_up(&mut late).await, (Vec::new(), head + 1));
    publish(&mut client, text_delta(&id, "marker", 0, "m")).await;
    assert_text_delta(&next_change(&mut late).await, "marker", 0, "m", head + 1);
}

/// Watchers joining while a run streams get every delta exactly once, in order.
async fn active_deltas_exactly_once_while_publishing(backend: Backend) {
    const DELTAS: i64 = 150;
    const JOINERS: i64 = 6;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_join").await.id;

    let (progress_tx, mut progress) = tokio::sync::watch::channel(-1_i64);
    let publisher = tokio::spawn({
        let mut client = client.clone();
        let id = id.clone();
        async move {
            for index in 0..DELTAS {
                let revision = publish(
                    &mut client,
                    text_delta(&id, "run", index, &format!("d{index}")),
                )
                .await;
                assert_eq!(revision, 1);
                progress_tx.send_replace(index);
            }
        }
    });

    let mut readers = Vec::new();
    for joiner in 0..JOINERS {
        // Join at spread-out points of the run.
        let target = joiner * DELTAS / JOINERS;
        tokio::time::timeout(WAIT, progress.wait_for(|published| *published >= target))
            .await
            .expect("the publisher progresses")
            .expect("publisher alive");
        for active_deltas in [true, false] {
            let mut stream = watch_from(&mut client, &id, 0, active_deltas).await;
            readers.push(tokio::spawn(async move {
                let (replayed, caught_up) = through_caught_up(&mut stream).await;
                assert_eq!((kinds(&replayed), caught_up), (vec!["session_created"], 1));
                let mut indexes = Vec::new();
                while indexes.last() != Some(&DELTAS) {
                    let event = next_change(&mut stream).await;
                    let delta = as_delta(&event);
                    assert_eq!(event.revision, 1);
                    assert_eq!(delta_text(delta), format!("d{}", delta.index));
                    indexes.push(delta.index);
                }
                (active_deltas, indexes)
            }));
        }
    }
    tokio::time::timeout(WAIT, publisher)
        .await
        .expect("publisher finishes")
        .unwrap();
    // The end of the run, after every watcher subscribed.
    publish(
        &mut client,
        text_delta(&id, "run", DELTAS, &format!("d{DELTAS}")),
    )
    .await;
    for reader in readers {
        let (active_deltas, indexes) = tokio::time::timeout(WAIT, reader)
            .await
            .expect("reader finishes")
            .unwrap();
        if active_deltas {
            assert_eq!(indexes, (0..=DELTAS).collect::<Vec<_>>());
        } else {
            // Only live ones: a gap-free, duplicate-free tail.
            let first = indexes[0];
            assert_eq!(indexes, (first..=DELTAS).collect::<Vec<_>>());
        }
    }
}

/// Deltas published while other writes commit never arrive after an event
/// of a later revision, and never twice.
async fn deltas_never_follow_a_later_revision(backend: Backend) {
    const EXCHANGES: i64 = 15;
    const DELTAS: i64 = 120;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = create(&mut client, "ses_runs_order").await.id;
    let head = 1 + EXCHANGES;

    let mut streams = vec![
        watch_from(&mut client, &id, 0, true).await,
        watch_from(&mut client, &id, 0, false).await,
    ];
    let writer = tokio::spawn({
        let mut client = client.clone();
        let id = id.clone();
        async move {
            for i in 0..EXCHANGES {
                exchange(&mut client, &id, &format!("q{i}"), &format!("a{i}")).await;
            }
        }
    });
    let publisher = tokio::spawn({
        let mut client = client.clone();
        let id = id.clone();
        async move {
            for index in 0..DELTAS {
                publish(&mut client, text_delta(&id, "p", index, "x")).await;
            }
        }
    });
    // One more watcher joins midway, replaying from the start.
    streams.push(watch_from(&mut client, &id, 0, true).await);
    tokio::time::timeout(WAIT, writer)
        .await
        .expect("writer finishes")
        .unwrap();
    tokio::time::timeout(WAIT, publisher)
        .await
        .expect("publisher finishes")
        .unwrap();
    // The last delta comes after every write: each watcher gets it.
    assert_eq!(
        publish(&mut client, text_delta(&id, "p", DELTAS, "last")).await,
        head
    );

    for (n, mut stream) in streams.into_iter().enumerate() {
        let mut last_revision = 0;
        let mut last_index = -1;
        let mut caught_up = 0;
        let mut deltas = 0;
        loop {
            let event = next_change(&mut stream).await;
            match &event.event {
                Some(Event::CaughtUp(_)) => {
                    caught_up += 1;
                    assert_eq!(event.revision, last_revision, "watcher {n}");
                }
                Some(Event::Delta(delta)) => {
                    assert!(
                        event.revision >= last_revision,
                        "watcher {n}: delta {event:?} after an event of revision {last_revision}"
                    );
                    assert!(
                        delta.index > last_index,
                        "watcher {n}: delta {} after {last_index}",
                        delta.index
                    );
                    last_index = delta.index;
                    deltas += 1;
                    if delta.index == DELTAS {
                        assert_eq!(last_revision, head, "watcher {n}");
                        break;
                    }
                }
                _ => {
                    assert_eq!(event.revision, last_revision + 1, "watcher {n}: {event:?}");
                    last_revision = event.revision;
                }
            }
        }
        assert_eq!(caught_up, 1, "watcher {n}");
        assert!(deltas >= 1, "watcher {n}");
    }
}

crate::postgres_tests!(
    deltas_cross_replicas,
    runs_and_leases_cross_replicas,
    exchange_missed_by_b_listener_still_closes_run_on_b,
);

crate::backend_tests!(
    run_and_delta_argument_errors,
    lease_makes_session_busy_for_other_runs,
    renew_and_end_run,
    lease_expiry_recorded_by_sweeper,
    expired_lease_settled_before_next_write,
    deltas_are_ephemeral_and_reach_watchers,
    include_active_deltas_replays_open_runs,
    active_deltas_exactly_once_while_publishing,
    deltas_never_follow_a_later_revision,
);

// ---------------------------------------------------------------------------
// Across PostgreSQL replicas

/// Two servers on one fresh database; `a` owns it and is stopped last.
struct TwoReplicas {
    database: String,
    b: TestServer,
    a: TestServer,
}

impl TwoReplicas {
    async fn start() -> TwoReplicas {
        let storage = Storage::new(Backend::Postgres).await;
        let url = storage.url.clone();
        let database = url.rsplit('/').next().expect("database url").to_owned();
        // No periodic re-read of heads: B learns of A's commits (and of
        // the runs they close) from A's notifications alone.
        let quiet = |c: &mut ServeConfig| c.recheck_interval_ms = 3_600_000;
        let a = TestServer::start_on(storage, quiet).await;
        let b = TestServer::start_with(url, None, quiet).await;
        TwoReplicas { database, b, a }
    }

    async fn stop(self) {
        let TwoReplicas { b, a, .. } = self;
        b.stop().await.expect("replica b stops cleanly");
        a.stop().await.expect("replica a stops cleanly");
    }
}

/// A watcher on B that has seen a write made through A: B's cross-replica
/// listener is in effect from here on.
async fn primed_watch_on_b(a: &mut Client, b: &mut Client, id: &str) -> (Events, i64) {
    let mut stream = watch_from(b, id, 0, false).await;
    through_caught_up(&mut stream).await;
    let renamed = rename(a, id, "primed through A").await;
    loop {
        let event = next_change(&mut stream).await;
        if event.revision == renamed.revision {
            assert_eq!(event_kind(&event), "session_updated");
            return (stream, renamed.revision);
        }
    }
}

async fn deltas_cross_replicas() {
    let replicas = TwoReplicas::start().await;
    let mut a = connect(&replicas.a.endpoint()).await;
    let mut b = connect(&replicas.b.endpoint()).await;
    let id = create(&mut a, "ses_runs_replicas").await.id;
    let (mut on_b, head) = primed_watch_on_b(&mut a, &mut b, &id).await;

    // Text deltas and a block far over the NOTIFY payload limit, through A.
    let big_text = "twenty kilobytes of block ".repeat(800);
    assert!(big_text.len() > 20_000);
    let big = text_block(&big_text);
    assert_eq!(
        publish(&mut a, text_delta(&id, "x", 0, "first")).await,
        head
    );
    assert_eq!(
        publish(&mut a, block_delta(&id, "x", 1, big.clone())).await,
        head
    );
    assert_eq!(
        publish(&mut a, text_delta(&id, "x", 2, "third")).await,
        head
    );
    assert_text_delta(&next_change(&mut on_b).await, "x", 0, "first", head);
    let event = next_change(&mut on_b).await;
    let delta = as_delta(&event);
    assert_eq!(
        (delta.run_id.as_str(), delta.index, event.revision),
        ("x", 1, head)
    );
    assert_eq!(delta.delta, Some(pb::delta::Delta::Block(big.clone())));
    assert_text_delta(&next_change(&mut on_b).await, "x", 2, "third", head);

    // B buffered what A published: a joiner on B gets it.
    let mut joiner = watch_from(&mut b, &id, head, true).await;
    assert_eq!(through_caught_up(&mut joiner).await, (Vec::new(), head));
    assert_text_delta(&next_change(&mut joiner).await, "x", 0, "first", head);
    let event = next_change(&mut joiner).await;
    assert_eq!(as_delta(&event).index, 1);
    assert_eq!(as_delta(&event).delta, Some(pb::delta::Delta::Block(big)));
    assert_text_delta(&next_change(&mut joiner).await, "x", 2, "third", head);

    // A discard through A reaches B and drops B's buffer.
    assert_eq!(discard(&mut a, &id, "x").await, head);
    for stream in [&mut on_b, &mut joiner] {
        let event = next_change(stream).await;
        assert_eq!(event.revision, head);
        let Some(Event::RunDiscarded(discarded)) = &event.event else {
            panic!(
                "expected run_discarded, got {}: {event:?}",
                event_kind(&event)
            );
        };
        assert_eq!(discarded.run_id, "x");
    }
    let mut late = watch_from(&mut b, &id, head, true).await;
    assert_eq!(through_caught_up(&mut late).await, (Vec::new(), head));
    publish(&mut a, text_delta(&id, "y", 0, "marker")).await;
    assert_text_delta(&next_change(&mut late).await, "y", 0, "marker", head);
    assert_text_delta(&next_change(&mut on_b).await, "y", 0, "marker", head);

    drop((on_b, joiner, late, a, b));
    replicas.stop().await;
}

async fn runs_and_leases_cross_replicas() {
    let replicas = TwoReplicas::start().await;
    let mut a = connect(&replicas.a.endpoint()).await;
    let mut b = connect(&replicas.b.endpoint()).await;
    let id = create(&mut a, "ses_runs_replicas_lease").await.id;
    let (mut on_b, head) = primed_watch_on_b(&mut a, &mut b, &id).await;

    // A run's exchange appended through A closes B's buffer of its deltas.
    publish(&mut a, text_delta(&id, "z", 0, "par")).await;
    publish(&mut a, text_delta(&id, "z", 1, "tial")).await;
    assert_text_delta(&next_change(&mut on_b).await, "z", 0, "par", head);
    assert_text_delta(&next_change(&mut on_b).await, "z", 1, "tial", head);
    let appended = a
        .append_exchange(run_exchange(&id, "q", "partial", "z"))
        .await
        .expect("append through A")
        .into_inner();
    assert_eq!(appended.revision, head + 1);
    let event = next_change(&mut on_b).await;
    assert_eq!(event.revision, head + 1);
    assert_eq!(as_appended(&event).run_id, "z");
    let mut late = watch_from(&mut b, &id, head + 1, true).await;
    assert_eq!(through_caught_up(&mut late).await, (Vec::new(), head + 1));
    publish(&mut a, text_delta(&id, "m", 0, "marker")).await;
    assert_text_delta(&next_change(&mut late).await, "m", 0, "marker", head + 1);
    assert_text_delta(&next_change(&mut on_b).await, "m", 0, "marker", head + 1);

    // The run goes on after its exchange is answered: its next delta is
    // buffered on B, never dropped by that exchange's closing hint (A sends
    // the hint before it answers).
    publish(&mut a, text_delta(&id, "z", 0, "next step")).await;
    assert_text_delta(&next_change(&mut on_b).await, "z", 0, "next step", head + 1);
    let mut joiner = watch_from(&mut b, &id, head + 1, true).await;
    assert_eq!(through_caught_up(&mut joiner).await, (Vec::new(), head + 1));
    let mut buffered = [
        next_change(&mut joiner).await,
        next_change(&mut joiner).await,
    ];
    buffered.sort_by_key(|event| as_delta(event).run_id.clone());
    assert_text_delta(&buffered[0], "m", 0, "marker", head + 1);
    assert_text_delta(&buffered[1], "z", 0, "next step", head + 1);
    assert_eq!(discard(&mut a, &id, "z").await, head + 1);
    assert_eq!(discard(&mut a, &id, "m").await, head + 1);
    for _ in 0..2 {
        let event = next_change(&mut on_b).await;
        assert!(
            matches!(event.event, Some(Event::RunDiscarded(_))),
            "expected run_discarded, got {}: {event:?}",
            event_kind(&event)
        );
    }

    // A lease taken through A holds on B.
    let begun = begin(&mut a, &id, "L", 60_000).await;
    assert_eq!(begun.revision, head + 2);
    let event = next_change(&mut on_b).await;
    assert_eq!(
        (event.revision, as_run_begun(&event).run_id.as_str()),
        (head + 2, "L")
    );
    assert_eq!(get(&mut b, &id).await.active_run_id, "L");
    let status = b
        .begin_run(begin_request(&id, "other", 1000))
        .await
        .unwrap_err();
    assert_busy(&status, "L");
    let status = b
        .append_exchange(run_exchange(&id, "q", "a", "other"))
        .await
        .unwrap_err();
    assert_busy(&status, "L");
    let status = b
        .publish_delta(text_delta(&id, "other", 0, "no"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    // The holder writes through B and ends its run there.
    let appended = b
        .append_exchange(run_exchange(&id, "q2", "a2", "L"))
        .await
        .expect("the holder appends through B")
        .into_inner();
    assert_eq!(appended.revision, head + 3);
    assert_eq!(end(&mut b, &id, "L").await, head + 4);
    let event = next_change(&mut on_b).await;
    assert_eq!(as_appended(&event).run_id, "L");
    let event = next_change(&mut on_b).await;
    assert_eq!(event.revision, head + 4);
    assert!(!as_run_ended(&event).expired);
    assert_eq!(get(&mut a, &id).await.active_run_id, "");

    drop((on_b, late, joiner, a, b));
    replicas.stop().await;
}

async fn admin() -> sqlx::PgConnection {
    use sqlx::Connection as _;
    sqlx::PgConnection::connect(&crate::support::postgres_admin_url())
        .await
        .expect("admin connection")
}

/// Lets (or stops letting) new connections into `database`.
async fn allow_connections(admin: &mut sqlx::PgConnection, database: &str, allow: bool) {
    sqlx::query(&format!(
        "ALTER DATABASE {database} WITH ALLOW_CONNECTIONS {allow}"
    ))
    .execute(admin)
    .await
    .expect("alter database");
}

/// B's listener misses the commit that closes a run (its LISTEN connection
/// is down while the exchange is appended through A). Once B has caught up
/// with that exchange, the run's buffered deltas must still be gone there.
async fn exchange_missed_by_b_listener_still_closes_run_on_b() {
    let replicas = TwoReplicas::start().await;
    let database = replicas.database.clone();
    let mut a = connect(&replicas.a.endpoint()).await;
    let mut b = connect(&replicas.b.endpoint()).await;
    let id = create(&mut a, "ses_runs_replicas_missed").await.id;
    let (mut on_b, head) = primed_watch_on_b(&mut a, &mut b, &id).await;

    publish(&mut a, text_delta(&id, "z", 0, "par")).await;
    publish(&mut a, text_delta(&id, "z", 1, "tial")).await;
    assert_text_delta(&next_change(&mut on_b).await, "z", 0, "par", head);
    assert_text_delta(&next_change(&mut on_b).await, "z", 1, "tial", head);

    // Cut every LISTEN connection and keep it from coming back while the
    // run's exchange commits through A (on a pooled connection A holds).
    let mut admin = admin().await;
    allow_connections(&mut admin, &database, false).await;
    let killed = kill_listeners(&mut admin, &database).await;
    let appended = a
        .append_exchange(run_exchange(&id, "q", "partial", "z"))
        .await;
    allow_connections(&mut admin, &database, true).await;
    assert_eq!(killed, 2, "one LISTEN connection per replica");
    let appended = appended.expect("append through A").into_inner();
    assert_eq!(appended.revision, head + 1);

    // B reconnects and finds the commit by re-reading the heads.
    let event = next_change(&mut on_b).await;
    assert_eq!(event.revision, head + 1);
    assert_eq!(as_appended(&event).run_id, "z");

    // A joiner on either replica gets none of the closed run's deltas.
    for (replica, endpoint) in [("A", replicas.a.endpoint()), ("B", replicas.b.endpoint())] {
        let mut client = connect(&endpoint).await;
        let mut late = watch_from(&mut client, &id, head + 1, true).await;
        assert_eq!(through_caught_up(&mut late).await, (Vec::new(), head + 1));
        let marker = format!("marker-{replica}");
        publish(&mut a, text_delta(&id, &marker, 0, "m")).await;
        // Earlier markers are open runs and may come first; run z never.
        loop {
            let event = next_change(&mut late).await;
            let delta = as_delta(&event);
            assert_ne!(
                delta.run_id, "z",
                "a late joiner on {replica} got a delta of run z, closed by its exchange: {event:?}"
            );
            if delta.run_id == marker {
                assert_eq!(delta.index, 0);
                break;
            }
        }
    }

    drop((on_b, a, b));
    replicas.stop().await;
}
