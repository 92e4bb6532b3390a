//! The ergonomic client's queued input (`Client::submit_input`,
//! `take_queued_input`, `list_queued_inputs`, `withdraw_queued_input`, and
//! `Run::take_queued_input` / `Run::end_and_take_next`) against the real
//! server over real gRPC: the typed calls on every backend, each refusal as
//! its typed `Error` variant with its metadata, and a submission whose
//! answer is lost retried under its request id and queued once.

use std::time::Duration;

use futures_util::{StreamExt as _, TryStreamExt as _};
use sessionstore_client::v1::{self as pb, InputMode, Message};
use sessionstore_client::{Client, Error, NewInput, NewSession};
use tonic::Code;

use crate::support::Proxy;
use crate::support::{Backend, TestServer, patient_client};

crate::backend_tests!(
    typed_queue_calls_round_trip,
    queue_errors_are_typed,
    the_run_helper_takes_queued_input,
);

/// A lease no test outlives.
const LEASE: Duration = Duration::from_secs(600);
/// Safety net for "the next event arrives": generous, never a pacing sleep.
const NEXT_EVENT: Duration = Duration::from_secs(30);

/// An input of one user message per text, queued while busy.
fn input(session_id: &str, texts: &[&str]) -> NewInput {
    NewInput::new(session_id).messages(texts.iter().map(|text| Message::user(*text)))
}

fn queued(answer: &pb::SubmitInputResponse) -> pb::QueuedInput {
    assert!(answer.queued, "expected a queued input: {answer:?}");
    assert!(answer.messages.is_empty(), "{answer:?}");
    answer.input.clone().expect("the queued input")
}

fn contents(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(|m| m.content.as_str()).collect()
}

fn stored_contents(messages: &[pb::StoredMessage]) -> Vec<&str> {
    messages
        .iter()
        .map(|m| m.message.as_ref().map_or("", |m| m.content.as_str()))
        .collect()
}

async fn waiting(client: &Client, session_id: &str) -> Vec<pb::QueuedInput> {
    client
        .list_queued_inputs(session_id)
        .try_collect()
        .await
        .unwrap()
}

fn positions(inputs: &[pb::QueuedInput]) -> Vec<i64> {
    inputs.iter().map(|input| input.position).collect()
}

async fn revision(client: &Client, session_id: &str) -> i64 {
    client.get_session(session_id).await.unwrap().revision
}

/// The events after `after`, up to `caught_up`, as (revision, kind).
async fn kinds_after(client: &Client, session_id: &str, after: i64) -> Vec<(i64, &'static str)> {
    let mut events = client.watch(session_id, after);
    let mut kinds = Vec::new();
    loop {
        let event = tokio::time::timeout(NEXT_EVENT, events.next())
            .await
            .expect("an event within the timeout")
            .expect("the watch goes on")
            .unwrap();
        if event.kind() == "caught_up" {
            return kinds;
        }
        kinds.push((event.revision, event.kind()));
    }
}

async fn typed_queue_calls_round_trip(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_q"))
        .await
        .unwrap();

    // Not busy: appended at once, whatever the mode.
    let now = input("ses_q", &["hello"]).mode(InputMode::Reject);
    let appended = client.submit_input(&now).await.unwrap();
    assert!(!appended.queued, "{appended:?}");
    assert!(appended.input.is_none());
    assert_eq!(appended.revision, 2);
    assert_eq!(stored_contents(&appended.messages), ["hello"]);
    assert_eq!(appended.messages[0].sequence, 0);
    assert!(waiting(&client, "ses_q").await.is_empty());

    // A run holds the lease: queued, in order, out of the history.
    let run = client.begin_run("ses_q", "run_a", LEASE).await.unwrap();
    assert_eq!(revision(&client, "ses_q").await, 3);
    let one_input = input("ses_q", &["one"]);
    let answer = client.submit_input(&one_input).await.unwrap();
    assert_eq!(answer.revision, 4);
    let one = queued(&answer);
    assert!(one.input_id.starts_with("inp_"), "{one:?}");
    assert_eq!(one.session_id, "ses_q");
    assert_eq!(one.position, 1);
    assert_eq!(one.mode(), InputMode::Queue);
    assert_eq!(contents(&one.messages), ["one"]);
    assert!(one.create_time.is_some());
    let two = queued(
        &client
            .submit_input(&input("ses_q", &["two a", "two b"]))
            .await
            .unwrap(),
    );
    assert_eq!(
        (two.position, contents(&two.messages)),
        (2, vec!["two a", "two b"])
    );
    let three = queued(
        &client
            .submit_input(&input("ses_q", &["three"]))
            .await
            .unwrap(),
    );
    assert_eq!(three.position, 3);
    assert_eq!(
        waiting(&client, "ses_q").await,
        [one.clone(), two.clone(), three.clone()]
    );
    assert_eq!(client.export_history("ses_q").await.unwrap().len(), 1);

    // The same input again (its request id): the first answer, nothing new.
    let again = client.submit_input(&one_input).await.unwrap();
    assert_eq!(again, answer, "a retry answers the first submission");
    assert_eq!(revision(&client, "ses_q").await, 6);

    // Withdrawn: gone from the queue; withdrawn again, the same revision.
    assert_eq!(
        client
            .withdraw_queued_input("ses_q", &three.input_id)
            .await
            .unwrap(),
        7
    );
    assert_eq!(
        client
            .withdraw_queued_input("ses_q", &three.input_id)
            .await
            .unwrap(),
        7
    );
    assert_eq!(waiting(&client, "ses_q").await, [one.clone(), two.clone()]);

    // The lease holder takes the oldest into the history.
    let taken = client.take_queued_input("ses_q", "run_a").await.unwrap();
    assert_eq!(taken.input, Some(one.clone()));
    assert_eq!(taken.revision, 8);
    assert_eq!(stored_contents(&taken.messages), ["one"]);
    assert_eq!(taken.messages[0].sequence, 1);
    assert_eq!(taken.next_sequence, 2);
    let taken = client.take_queued_input("ses_q", "run_a").await.unwrap();
    assert_eq!(taken.input, Some(two.clone()));
    assert_eq!(
        taken
            .messages
            .iter()
            .map(|m| m.sequence)
            .collect::<Vec<_>>(),
        [2, 3],
        "an input's messages are contiguous"
    );
    assert_eq!(taken.next_sequence, 4);
    assert!(waiting(&client, "ses_q").await.is_empty());
    let history = client.export_history("ses_q").await.unwrap();
    assert_eq!(contents(&history), ["hello", "one", "two a", "two b"]);
    run.discard().await.unwrap();

    // Watchers see each step as a revision.
    assert_eq!(
        kinds_after(&client, "ses_q", 3).await,
        [
            (4, "input_queued"),
            (5, "input_queued"),
            (6, "input_queued"),
            (7, "input_withdrawn"),
            (8, "input_taken"),
            (9, "input_taken"),
            (10, "run_ended"),
        ]
    );

    // More than a page waits: the stream follows the pages, by position.
    let _run = client.begin_run("ses_q", "run_b", LEASE).await.unwrap();
    for i in 0..60 {
        let text = format!("line {i}");
        client
            .submit_input(&input("ses_q", &[text.as_str()]))
            .await
            .unwrap();
    }
    let listed = waiting(&client, "ses_q").await;
    assert_eq!(positions(&listed), (4..64).collect::<Vec<i64>>());
    assert_eq!(contents(&listed[59].messages), ["line 59"]);
}

async fn queue_errors_are_typed(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_err"))
        .await
        .unwrap();

    // Only the lease holder takes, and only what waits.
    match client.take_queued_input("ses_err", "run_x").await {
        Err(error @ Error::LeaseNotHeld { .. }) => {
            assert!(matches!(&error, Error::LeaseNotHeld { run_id, .. } if run_id == "run_x"));
            assert_eq!(error.code(), Some(Code::FailedPrecondition));
            assert_eq!(error.reason().as_deref(), Some("LEASE_NOT_HELD"));
            assert!(!error.is_transient());
        }
        other => panic!("expected LeaseNotHeld, got {other:?}"),
    }
    let run = client.begin_run("ses_err", "run_a", LEASE).await.unwrap();
    match client.take_queued_input("ses_err", "run_b").await {
        Err(Error::LeaseNotHeld { run_id, .. }) => assert_eq!(run_id, "run_b"),
        other => panic!("expected LeaseNotHeld for another run, got {other:?}"),
    }
    match client.take_queued_input("ses_err", "run_a").await {
        Err(error @ Error::QueueEmpty { .. }) => {
            assert_eq!(error.code(), Some(Code::NotFound));
            assert_eq!(error.reason().as_deref(), Some("QUEUE_EMPTY"));
            assert!(error.status().is_some());
        }
        other => panic!("expected QueueEmpty, got {other:?}"),
    }

    // REJECT while busy; a request id reused with another body.
    match client
        .submit_input(&input("ses_err", &["no"]).mode(InputMode::Reject))
        .await
    {
        Err(Error::SessionBusy { active_run_id, .. }) => assert_eq!(active_run_id, "run_a"),
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    let keyed = input("ses_err", &["first"]).with_request_id("key-1");
    let first = queued(&client.submit_input(&keyed).await.unwrap());
    match client
        .submit_input(&input("ses_err", &["other"]).with_request_id("key-1"))
        .await
    {
        Err(error @ Error::RequestIdReused { .. }) => {
            assert_eq!(error.code(), Some(Code::AlreadyExists));
            assert_eq!(error.reason().as_deref(), Some("REQUEST_ID_REUSED"));
        }
        other => panic!("expected RequestIdReused, got {other:?}"),
    }
    match client
        .submit_input(&keyed.clone().mode(InputMode::Interrupt))
        .await
    {
        Err(Error::RequestIdReused { .. }) => {}
        other => panic!("a key with another mode: expected RequestIdReused, got {other:?}"),
    }

    // Withdrawing: an unknown id, one taken.
    match client.withdraw_queued_input("ses_err", "inp_nope").await {
        Err(error @ Error::InputNotFound { .. }) => {
            assert!(
                matches!(&error, Error::InputNotFound { input_id, .. } if input_id == "inp_nope")
            );
            assert_eq!(error.code(), Some(Code::NotFound));
        }
        other => panic!("expected InputNotFound, got {other:?}"),
    }
    client.take_queued_input("ses_err", "run_a").await.unwrap();
    match client
        .withdraw_queued_input("ses_err", &first.input_id)
        .await
    {
        Err(error @ Error::InputAlreadyTaken { .. }) => {
            assert!(
                matches!(&error, Error::InputAlreadyTaken { input_id, .. } if input_id == &first.input_id)
            );
            assert_eq!(error.code(), Some(Code::FailedPrecondition));
            assert_eq!(error.reason().as_deref(), Some("INPUT_ALREADY_TAKEN"));
        }
        other => panic!("expected InputAlreadyTaken, got {other:?}"),
    }

    // Bad inputs and missing sessions.
    match client.submit_input(&NewInput::new("ses_err")).await {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "messages"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let too_many: Vec<String> = (0..101).map(|i| format!("m{i}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    match client.submit_input(&input("ses_err", &too_many)).await {
        Err(Error::LimitExceeded { field, .. }) => assert_eq!(field, "messages"),
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    match client.submit_input(&input("ses_missing", &["hi"])).await {
        Err(Error::NotFound { session_id, .. }) => assert_eq!(session_id, "ses_missing"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    match client.list_queued_inputs("ses_missing").next().await {
        Some(Err(Error::NotFound { session_id, .. })) => assert_eq!(session_id, "ses_missing"),
        other => panic!("expected NotFound as the stream's item, got {other:?}"),
    }

    // A full queue: 100 waiting inputs, then QUEUE_FULL, nothing queued.
    for i in 0..100 {
        let text = format!("wait {i}");
        queued(
            &client
                .submit_input(&input("ses_err", &[text.as_str()]))
                .await
                .unwrap(),
        );
    }
    let before = revision(&client, "ses_err").await;
    match client
        .submit_input(&input("ses_err", &["one too many"]))
        .await
    {
        Err(error @ Error::QueueFull { .. }) => {
            assert!(matches!(error, Error::QueueFull { limit: 100, .. }));
            assert_eq!(error.code(), Some(Code::ResourceExhausted));
            assert_eq!(error.reason().as_deref(), Some("QUEUE_FULL"));
            assert!(!error.is_transient());
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    assert_eq!(revision(&client, "ses_err").await, before);
    assert_eq!(waiting(&client, "ses_err").await.len(), 100);

    // No lease, but inputs wait: still busy, with no run to name.
    run.discard().await.unwrap();
    assert_eq!(
        client.get_session("ses_err").await.unwrap().active_run_id,
        ""
    );
    match client
        .submit_input(&input("ses_err", &["no"]).mode(InputMode::Reject))
        .await
    {
        Err(Error::SessionBusy { active_run_id, .. }) => assert_eq!(active_run_id, ""),
        other => panic!("expected SessionBusy for waiting inputs, got {other:?}"),
    }
}

async fn the_run_helper_takes_queued_input(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    client
        .create_session(NewSession::new().id("ses_run"))
        .await
        .unwrap();

    let mut run = client.begin_run("ses_run", "run_a", LEASE).await.unwrap();
    assert_eq!(run.take_queued_input().await.unwrap(), None, "none waits");
    let first = queued(
        &client
            .submit_input(&input("ses_run", &["first"]))
            .await
            .unwrap(),
    );
    let second = queued(
        &client
            .submit_input(&input("ses_run", &["second"]))
            .await
            .unwrap(),
    );
    let taken = run
        .take_queued_input()
        .await
        .unwrap()
        .expect("the oldest input");
    assert_eq!(taken.input, Some(first.clone()));
    assert_eq!(stored_contents(&taken.messages), ["first"]);
    assert_eq!(taken.next_sequence, 1);

    // An interrupt queues and asks the run to stop: its next delta says so.
    assert!(!run.publish_text("working…").await.unwrap());
    let stop = queued(
        &client
            .submit_input(&input("ses_run", &["stop"]).mode(InputMode::Interrupt))
            .await
            .unwrap(),
    );
    assert_eq!(stop.mode(), InputMode::Interrupt);
    assert!(run.publish_text(" more").await.unwrap(), "cancel requested");
    assert!(run.cancel_requested());

    // Ending takes the next input first, then frees the lease.
    let before = revision(&client, "ses_run").await;
    let next = run.end_and_take_next().await.unwrap();
    assert_eq!(next, Some(second.clone()));
    assert_eq!(
        kinds_after(&client, "ses_run", before).await,
        [(before + 1, "input_taken"), (before + 2, "run_ended")]
    );
    let session = client.get_session("ses_run").await.unwrap();
    assert_eq!(session.active_run_id, "", "the lease is free");
    assert_eq!(
        contents(&client.export_history("ses_run").await.unwrap()),
        ["first", "second"]
    );
    assert_eq!(
        waiting(&client, "ses_run").await,
        std::slice::from_ref(&stop)
    );

    // The next run takes the interrupt's input as it ends; one more run
    // finds nothing and frees the lease all the same.
    let run = client.begin_run("ses_run", "run_b", LEASE).await.unwrap();
    assert_eq!(run.end_and_take_next().await.unwrap(), Some(stop));
    let run = client.begin_run("ses_run", "run_c", LEASE).await.unwrap();
    let before = revision(&client, "ses_run").await;
    assert_eq!(run.end_and_take_next().await.unwrap(), None);
    assert_eq!(
        kinds_after(&client, "ses_run", before).await,
        [(before + 1, "run_ended")]
    );
    assert_eq!(
        contents(&client.export_history("ses_run").await.unwrap()),
        ["first", "second", "stop"]
    );

    // A run without the lease takes nothing: an error to take, a no-op to
    // end. (Not busy, the next submission is appended; busy, it waits.)
    let other = client.begin_run("ses_run", "run_d", LEASE).await.unwrap();
    let later = queued(
        &client
            .submit_input(&input("ses_run", &["later"]))
            .await
            .unwrap(),
    );
    assert_eq!(later.position, 4, "positions are never reused");
    let free = client.run("ses_run", "run_x");
    match free.take_queued_input().await {
        Err(Error::LeaseNotHeld { run_id, .. }) => assert_eq!(run_id, "run_x"),
        other => panic!("expected LeaseNotHeld, got {other:?}"),
    }
    let before = revision(&client, "ses_run").await;
    assert_eq!(free.end_and_take_next().await.unwrap(), None);
    assert_eq!(revision(&client, "ses_run").await, before);
    assert_eq!(
        waiting(&client, "ses_run").await,
        std::slice::from_ref(&later)
    );
    assert_eq!(other.end_and_take_next().await.unwrap(), Some(later));
}

/// A submission whose answer is lost (the connection cut just before the
/// server's response, after its commit): the client retries with the same
/// request id on a new connection and gets the first answer, queued once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_whose_answer_is_lost_is_retried_and_queued_once() {
    let server = TestServer::start(Backend::File).await;
    let direct = patient_client(&server.endpoint()).await;
    direct
        .create_session(NewSession::new().id("ses_cut"))
        .await
        .unwrap();

    let proxy = Proxy::start(server.addr).await;
    let client = patient_client(&proxy.endpoint()).await;
    // The connection is up before the cut is armed.
    assert_eq!(revision(&client, "ses_cut").await, 1);
    assert_eq!(proxy.accepted(), 1);

    // Not busy: appended once.
    proxy.cut_before_next_response();
    let appended = client
        .submit_input(&input("ses_cut", &["hello"]))
        .await
        .unwrap();
    assert_eq!(proxy.responses_cut(), 1, "the first answer was cut");
    assert_eq!(proxy.accepted(), 2, "the retry came on a new connection");
    assert!(!appended.queued);
    assert_eq!(appended.revision, 2, "the retry answered the first append");
    assert_eq!(direct.export_history("ses_cut").await.unwrap().len(), 1);

    // Busy: queued once.
    let _run = direct.begin_run("ses_cut", "run_a", LEASE).await.unwrap();
    proxy.cut_before_next_response();
    let answer = client
        .submit_input(&input("ses_cut", &["while busy"]))
        .await
        .unwrap();
    assert_eq!(proxy.responses_cut(), 2);
    let input = queued(&answer);
    assert_eq!((input.position, answer.revision), (1, 4));
    assert_eq!(waiting(&direct, "ses_cut").await, [input]);
    assert_eq!(revision(&direct, "ses_cut").await, 4);
}

// ---------------------------------------------------------------------------
// A proxy that cuts a connection just before the server's next response
