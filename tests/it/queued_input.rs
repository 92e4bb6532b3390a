//! Queued input: what a user types while the session is busy.
//!
//! A session is busy while a run holds its lease or its queue holds a
//! waiting input. SubmitInput appends input to an idle session at once, in
//! every mode, as AppendExchange messages without a run
//! (`exchange_appended`). To a busy one, QUEUE stores it at the back of the
//! session's queue (one revision, `input_queued`); INTERRUPT does the same,
//! then cancels the run holding the lease as CancelRun would (its own
//! revision, `run_cancel_requested` with reason `input:` and the input id);
//! REJECT fails SESSION_BUSY. The lease holder moves the oldest waiting
//! input into the history with TakeQueuedInput (`input_taken`), or with
//! EndRun's `take_next` just before the lease is freed (`input_taken`,
//! then `run_ended`). ListQueuedInputs reads the waiting inputs by
//! position; WithdrawQueuedInput takes one out for good
//! (`input_withdrawn`). Positions count from 1 per session and are never
//! reused.
//!
//! Checked here, on every backend: the fields as answered, listed and
//! watched; that queued input is in no read of the history until taken,
//! and ordinary input after; who may take, and in what order; `take_next`;
//! INTERRUPT's cancel and REJECT's refusal; limits (messages per input,
//! waiting inputs per session), each refusal writing nothing; retries by
//! request id; withdrawal; how the queue meets lease expiry, EndRun,
//! CancelRun, DiscardRun, RollbackSession, AppendExchange, DeleteSession
//! and ForkSession; a hundred concurrent submitters and competing takers;
//! tenant isolation. On two PostgreSQL replicas: the same race split
//! across both, and a keyed retry answered by the other replica. With the
//! real binary: a waiting input survives SIGKILL and is taken once.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::InputMode;
use sessionstore_client::v1::session_event::Event;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::support::*;

crate::backend_tests!(
    an_idle_session_takes_input_at_once,
    a_busy_session_queues_input_outside_the_history,
    only_the_lease_holder_takes_the_oldest_input,
    a_waiting_input_keeps_the_session_busy,
    end_run_takes_the_next_input_then_frees_the_lease,
    interrupt_cancels_the_run_holding_the_lease,
    refused_submissions_write_nothing,
    a_queue_holds_at_most_a_hundred_waiting_inputs,
    retries_by_request_id_answer_the_first,
    withdrawn_inputs_are_never_taken,
    the_queue_outlives_runs_rollbacks_and_expiry,
    deletion_recreation_and_forks_leave_no_queue,
    watchers_see_the_queue_at_the_revisions_answered,
    concurrent_submitters_and_takers_keep_position_order,
    another_tenants_session_is_unknown_to_the_queue,
);
crate::postgres_tests!(
    competing_takers_on_two_replicas_take_each_input_once,
    a_submission_retried_on_another_replica_answers_the_first,
);

type Client = SessionStoreClient<Channel>;

/// The most messages one input may hold.
const MAX_INPUT_MESSAGES: usize = 100;
/// The most inputs a session's queue may hold waiting.
const MAX_WAITING: usize = 100;
/// Every mode a submission may name.
const MODES: [InputMode; 4] = [
    InputMode::Unspecified,
    InputMode::Queue,
    InputMode::Interrupt,
    InputMode::Reject,
];
/// A lease no test outlives (seconds).
const LONG_LEASE: i64 = 600;
/// How long a test waits for a lease to run out after its time.
const LEASE_PATIENCE: Duration = Duration::from_secs(15);
/// How often a test reads while it waits for a lease to run out.
const POLL: Duration = Duration::from_millis(50);
/// Concurrent submitters of the race (each queues one input).
const SUBMITTERS: usize = 100;
/// Concurrent takers of the race (each the lease holder's calls).
const TAKERS: usize = 8;

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).expect("fits in i64")
}

// ---------------------------------------------------------------------------
// Messages

/// `texts` as user messages.
fn users(texts: &[&str]) -> Vec<pb::Message> {
    texts.iter().map(|text| user(text)).collect()
}

/// `count` user messages, `line 0` to `line {count - 1}`.
fn lines(count: usize) -> Vec<pb::Message> {
    (0..count).map(|i| user(&format!("line {i}"))).collect()
}

/// A user message with a text block and metadata: kept as sent.
fn rich(text: &str) -> pb::Message {
    pb::Message {
        content_blocks: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Text(pb::TextBlock {
                text: text.to_owned(),
                signature: String::new(),
            })),
        }],
        metadata: [("source".to_owned(), "keyboard".to_owned())]
            .into_iter()
            .collect(),
        ..user("")
    }
}

/// The messages of stored messages.
fn plain(stored: &[pb::StoredMessage]) -> Vec<pb::Message> {
    stored
        .iter()
        .map(|m| m.message.clone().expect("a stored message's message"))
        .collect()
}

fn texts(stored: &[pb::StoredMessage]) -> Vec<String> {
    stored.iter().map(|m| content(m).to_owned()).collect()
}

// ---------------------------------------------------------------------------
// Requests

/// Input of `texts` for `session` in `mode`, without a request id.
fn input(session: &str, mode: InputMode, texts: &[&str]) -> pb::SubmitInputRequest {
    pb::SubmitInputRequest {
        session_id: session.to_owned(),
        messages: users(texts),
        mode: mode.into(),
        request_id: String::new(),
    }
}

/// `request` with the idempotency key `key`.
fn keyed(request: pb::SubmitInputRequest, key: &str) -> pb::SubmitInputRequest {
    pb::SubmitInputRequest {
        request_id: key.to_owned(),
        ..request
    }
}

fn submit_label(request: &pb::SubmitInputRequest) -> String {
    format!(
        "submit {} message(s) to {} ({:?}, key {:?})",
        request.messages.len(),
        request.session_id,
        request.mode(),
        request.request_id
    )
}

async fn submit(client: &mut Client, request: pb::SubmitInputRequest) -> pb::SubmitInputResponse {
    let label = submit_label(&request);
    client
        .submit_input(request)
        .await
        .unwrap_or_else(|status| panic!("{label}: {status:?}"))
        .into_inner()
}

async fn submit_err(client: &mut Client, request: pb::SubmitInputRequest) -> Status {
    let label = submit_label(&request);
    match client.submit_input(request).await {
        Ok(answer) => panic!("{label} succeeded: {:?}", answer.into_inner()),
        Err(status) => status,
    }
}

/// The input a submission queued: `queued`, the input set, no messages.
#[track_caller]
fn queued(answer: &pb::SubmitInputResponse) -> pb::QueuedInput {
    assert!(answer.queued, "not queued: {answer:?}");
    assert!(
        answer.messages.is_empty(),
        "queued, yet messages answered: {answer:?}"
    );
    answer
        .input
        .clone()
        .unwrap_or_else(|| panic!("queued without an input: {answer:?}"))
}

/// Queues `text` (QUEUE) in busy `session`: the input and the revision.
async fn enqueue(client: &mut Client, session: &str, text: &str) -> (pb::QueuedInput, i64) {
    let answer = submit(client, input(session, InputMode::Queue, &[text])).await;
    (queued(&answer), answer.revision)
}

fn take_request(session: &str, run: &str) -> pb::TakeQueuedInputRequest {
    pb::TakeQueuedInputRequest {
        session_id: session.to_owned(),
        run_id: run.to_owned(),
    }
}

async fn take(client: &mut Client, session: &str, run: &str) -> pb::TakeQueuedInputResponse {
    client
        .take_queued_input(take_request(session, run))
        .await
        .unwrap_or_else(|status| panic!("{run} takes from {session}: {status:?}"))
        .into_inner()
}

async fn take_err(client: &mut Client, session: &str, run: &str) -> Status {
    match client.take_queued_input(take_request(session, run)).await {
        Ok(answer) => panic!("{run} took from {session}: {:?}", answer.into_inner()),
        Err(status) => status,
    }
}

fn withdraw_request(session: &str, input_id: &str) -> pb::WithdrawQueuedInputRequest {
    pb::WithdrawQueuedInputRequest {
        session_id: session.to_owned(),
        input_id: input_id.to_owned(),
    }
}

/// Withdraws `input_id` from `session`: the revision answered.
async fn withdraw(client: &mut Client, session: &str, input_id: &str) -> i64 {
    client
        .withdraw_queued_input(withdraw_request(session, input_id))
        .await
        .unwrap_or_else(|status| panic!("withdraw {input_id} from {session}: {status:?}"))
        .into_inner()
        .revision
}

async fn withdraw_err(client: &mut Client, session: &str, input_id: &str) -> Status {
    match client
        .withdraw_queued_input(withdraw_request(session, input_id))
        .await
    {
        Ok(answer) => panic!(
            "withdrew {input_id} from {session}: {:?}",
            answer.into_inner()
        ),
        Err(status) => status,
    }
}

fn list_request(session: &str, page_size: i32) -> pb::ListQueuedInputsRequest {
    pb::ListQueuedInputsRequest {
        session_id: session.to_owned(),
        page_size,
        page_token: String::new(),
    }
}

/// Every page ListQueuedInputs answers, `page_size` at a time.
async fn queue_pages(
    client: &mut Client,
    session: &str,
    page_size: i32,
) -> Vec<Vec<pb::QueuedInput>> {
    let mut request = list_request(session, page_size);
    let mut out = Vec::new();
    loop {
        let page = client
            .list_queued_inputs(request.clone())
            .await
            .unwrap_or_else(|status| panic!("list the queue of {session}: {status:?}"))
            .into_inner();
        out.push(page.inputs);
        if page.next_page_token.is_empty() {
            return out;
        }
        assert!(out.len() <= 200, "ListQueuedInputs never ends: {request:?}");
        request.page_token = page.next_page_token;
    }
}

/// The session's waiting inputs, by position.
async fn waiting(client: &mut Client, session: &str) -> Vec<pb::QueuedInput> {
    queue_pages(client, session, 1000).await.concat()
}

async fn waiting_err(client: &mut Client, session: &str) -> Status {
    match client.list_queued_inputs(list_request(session, 10)).await {
        Ok(answer) => panic!("listed the queue of {session}: {:?}", answer.into_inner()),
        Err(status) => status,
    }
}

fn positions(inputs: &[pb::QueuedInput]) -> Vec<i64> {
    inputs.iter().map(|input| input.position).collect()
}

/// A well-formed input id nobody has: `id` with its last character changed.
fn unknown_id(id: &str) -> String {
    let mut other = id.to_owned();
    let last = other.pop().expect("a non-empty id");
    other.push(if last == '0' { '1' } else { '0' });
    other
}

// ---------------------------------------------------------------------------
// Runs

/// `run` takes (or renews) the lease for `seconds`: the revision.
async fn begin_run(client: &mut Client, session: &str, run: &str, seconds: i64) -> i64 {
    client
        .begin_run(pb::BeginRunRequest {
            session_id: session.to_owned(),
            run_id: run.to_owned(),
            lease: Some(prost_types::Duration { seconds, nanos: 0 }),
        })
        .await
        .unwrap_or_else(|status| panic!("begin run {run}: {status:?}"))
        .into_inner()
        .revision
}

async fn end_run(
    client: &mut Client,
    session: &str,
    run: &str,
    take_next: bool,
) -> pb::EndRunResponse {
    client
        .end_run(pb::EndRunRequest {
            session_id: session.to_owned(),
            run_id: run.to_owned(),
            take_next,
        })
        .await
        .unwrap_or_else(|status| panic!("end run {run} (take_next {take_next}): {status:?}"))
        .into_inner()
}

async fn cancel_run(client: &mut Client, session: &str, run: &str, reason: &str) -> i64 {
    client
        .cancel_run(pb::CancelRunRequest {
            session_id: session.to_owned(),
            run_id: run.to_owned(),
            reason: reason.to_owned(),
        })
        .await
        .unwrap_or_else(|status| panic!("cancel run {run}: {status:?}"))
        .into_inner()
        .revision
}

/// `run` publishes its delta `index`: the answer tells whether it was
/// asked to stop.
async fn publish(
    client: &mut Client,
    session: &str,
    run: &str,
    index: i64,
) -> pb::PublishDeltaResponse {
    client
        .publish_delta(pb::PublishDeltaRequest {
            session_id: session.to_owned(),
            run_id: run.to_owned(),
            index,
            delta: Some(pb::publish_delta_request::Delta::Text(format!(
                "part {index}"
            ))),
        })
        .await
        .unwrap_or_else(|status| panic!("{run} publishes delta {index}: {status:?}"))
        .into_inner()
}

/// Polls the session until no run holds its lease.
async fn wait_for_lease_gone(client: &mut Client, session: &str) {
    let deadline = tokio::time::Instant::now() + LEASE_PATIENCE;
    let mut interval = tokio::time::interval(POLL);
    loop {
        interval.tick().await;
        if get(client, session).await.active_run_id.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease of {session} never ran out"
        );
    }
}

// ---------------------------------------------------------------------------
// Reads

async fn revision(client: &mut Client, session: &str) -> i64 {
    get(client, session).await.revision
}

/// The session's history as ExportHistory streams it.
async fn exported(client: &mut Client, session: &str) -> Vec<pb::Message> {
    export(
        client,
        pb::ExportHistoryRequest {
            session_id: session.to_owned(),
            ..Default::default()
        },
    )
    .await
}

async fn history_texts(client: &mut Client, session: &str) -> Vec<String> {
    texts(&all_messages(client, session).await)
}

// ---------------------------------------------------------------------------
// Answers

/// A new input as queued: a server-made id, the session, `position`, the
/// messages and mode as `request` sent them (UNSPECIFIED may be kept as
/// QUEUE), a create_time.
#[track_caller]
fn assert_fresh_input(
    input: &pb::QueuedInput,
    session: &str,
    position: i64,
    request: &pb::SubmitInputRequest,
) {
    assert!(input.input_id.starts_with("inp_"), "{input:?}");
    assert_eq!(
        (input.session_id.as_str(), input.position),
        (session, position),
        "{input:?}"
    );
    assert_eq!(
        input.messages, request.messages,
        "the messages, as submitted"
    );
    let kept = match request.mode() {
        InputMode::Unspecified => vec![InputMode::Unspecified, InputMode::Queue],
        mode => vec![mode],
    };
    assert!(
        kept.contains(&input.mode()),
        "submitted {:?}, kept {:?}",
        request.mode(),
        input.mode()
    );
    assert!(input.create_time.is_some(), "{input:?}");
}

/// Stored input: `submitted`, in order, at contiguous sequences from
/// `first_sequence` of `session`, as ordinary input (no provider call).
#[track_caller]
fn assert_stored_input(
    stored: &[pb::StoredMessage],
    submitted: &[pb::Message],
    session: &str,
    first_sequence: i64,
) {
    assert_eq!(
        stored.len(),
        submitted.len(),
        "one stored message per message submitted"
    );
    for (k, (stored, submitted)) in stored.iter().zip(submitted).enumerate() {
        assert!(stored.id.starts_with("msg_"), "{stored:?}");
        assert_eq!(
            (
                stored.session_id.as_str(),
                stored.sequence,
                stored.produced_by_call_id.as_str(),
                stored.redacted
            ),
            (session, first_sequence + to_i64(k), "", false),
            "message {k} of the input: {stored:?}"
        );
        assert_eq!(stored.message.as_ref(), Some(submitted), "message {k}");
        assert!(stored.create_time.is_some(), "{stored:?}");
    }
}

/// A take of `expected` (as queued): the input whole, its messages stored
/// from `first_sequence` on, and the next sequence after them.
#[track_caller]
fn assert_took(
    taken: &pb::TakeQueuedInputResponse,
    expected: &pb::QueuedInput,
    first_sequence: i64,
) {
    assert_eq!(taken.input.as_ref(), Some(expected), "the input taken");
    assert_stored_input(
        &taken.messages,
        &expected.messages,
        &expected.session_id,
        first_sequence,
    );
    assert_eq!(
        taken.next_sequence,
        first_sequence + to_i64(expected.messages.len()),
        "{taken:?}"
    );
}

// ---------------------------------------------------------------------------
// Events

fn input_queued(event: &pb::SessionEvent) -> &pb::QueuedInput {
    match &event.event {
        Some(Event::InputQueued(queued)) => queued
            .input
            .as_ref()
            .unwrap_or_else(|| panic!("input_queued without its input: {event:?}")),
        _ => panic!("expected input_queued, got {event:?}"),
    }
}

fn input_taken(event: &pb::SessionEvent) -> &pb::InputTaken {
    match &event.event {
        Some(Event::InputTaken(taken)) => taken,
        _ => panic!("expected input_taken, got {event:?}"),
    }
}

fn input_withdrawn(event: &pb::SessionEvent) -> &pb::InputWithdrawn {
    match &event.event {
        Some(Event::InputWithdrawn(withdrawn)) => withdrawn,
        _ => panic!("expected input_withdrawn, got {event:?}"),
    }
}

fn exchange_appended(event: &pb::SessionEvent) -> &pb::ExchangeAppended {
    match &event.event {
        Some(Event::ExchangeAppended(appended)) => appended,
        _ => panic!("expected exchange_appended, got {event:?}"),
    }
}

fn cancel_requested(event: &pb::SessionEvent) -> &pb::RunCancelRequested {
    match &event.event {
        Some(Event::RunCancelRequested(requested)) => requested,
        _ => panic!("expected run_cancel_requested, got {event:?}"),
    }
}

fn run_begun(event: &pb::SessionEvent) -> &pb::RunBegun {
    match &event.event {
        Some(Event::RunBegun(begun)) => begun,
        _ => panic!("expected run_begun, got {event:?}"),
    }
}

fn run_ended(event: &pb::SessionEvent) -> &pb::RunEnded {
    match &event.event {
        Some(Event::RunEnded(ended)) => ended,
        _ => panic!("expected run_ended, got {event:?}"),
    }
}

/// Checks `event`: the `input_queued` of `input` at `revision`.
#[track_caller]
fn assert_queued_event(event: &pb::SessionEvent, input: &pb::QueuedInput, revision: i64) {
    assert_eq!(event.revision, revision, "{event:?}");
    assert!(event.time.is_some(), "{event:?}");
    assert_eq!(input_queued(event), input, "{event:?}");
}

/// Checks `event`: the `input_taken` recording `taken`, by `run`.
#[track_caller]
fn assert_taken_event(event: &pb::SessionEvent, taken: &pb::TakeQueuedInputResponse, run: &str) {
    assert_eq!(event.revision, taken.revision, "{event:?}");
    assert!(event.time.is_some(), "{event:?}");
    let recorded = input_taken(event);
    let input = taken.input.as_ref().expect("the input taken");
    assert_eq!(
        (
            recorded.input_id.as_str(),
            recorded.position,
            recorded.run_id.as_str()
        ),
        (input.input_id.as_str(), input.position, run),
        "{event:?}"
    );
    assert_eq!(recorded.messages, taken.messages, "{event:?}");
    assert_eq!(recorded.next_sequence, taken.next_sequence, "{event:?}");
}

/// Checks `event`: the cancel an INTERRUPT of `input` asked of `run`.
#[track_caller]
fn assert_interrupt_event(
    event: &pb::SessionEvent,
    run: &str,
    input: &pb::QueuedInput,
    revision: i64,
) {
    assert_eq!(event.revision, revision, "{event:?}");
    let requested = cancel_requested(event);
    assert_eq!(
        (requested.run_id.as_str(), requested.reason.as_str()),
        (run, format!("input:{}", input.input_id).as_str()),
        "{event:?}"
    );
}

/// The next event recording a revision (or a replay's `caught_up`): the
/// keep-alives, and the ephemeral deltas and discards of the tests' own
/// runs, are passed over.
async fn next_write(events: &mut Events) -> pb::SessionEvent {
    loop {
        let event = next_change(events).await;
        if !matches!(event.event, Some(Event::Delta(_) | Event::RunDiscarded(_))) {
            return event;
        }
    }
}

/// A watch of `session` from its head, read through `caught_up`.
async fn watch_head(client: &mut Client, session: &str) -> Events {
    let head = revision(client, session).await;
    let mut events = watch(client, session, head).await;
    let caught_up = next_write(&mut events).await;
    assert!(
        matches!(caught_up.event, Some(Event::CaughtUp(_))),
        "{caught_up:?}"
    );
    assert_eq!(caught_up.revision, head);
    events
}

/// The events of `session` after `after`, up to `caught_up` (excluded).
async fn replay(client: &mut Client, session: &str, after: i64) -> Vec<pb::SessionEvent> {
    let mut events = watch(client, session, after).await;
    let mut out = Vec::new();
    loop {
        let event = next_write(&mut events).await;
        if matches!(event.event, Some(Event::CaughtUp(_))) {
            return out;
        }
        out.push(event);
    }
}

// ---------------------------------------------------------------------------
// Idle and busy

async fn an_idle_session_takes_input_at_once(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_idle";
    create_owned(&mut client, id, "alice").await;
    let mut events = watch_head(&mut client, id).await;

    // Every mode: appended at once, one revision, as messages without a run.
    let mut stored = Vec::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        let request = pb::SubmitInputRequest {
            messages: vec![
                user(&format!("idle input {i}")),
                rich(&format!("detail {i}")),
            ],
            ..input(id, mode, &[])
        };
        let answer = submit(&mut client, request.clone()).await;
        let label = format!("{mode:?}");
        assert!(!answer.queued, "{label}: {answer:?}");
        assert!(answer.input.is_none(), "{label}: {answer:?}");
        assert_eq!(answer.revision, 2 + to_i64(i), "{label}: one revision");
        let first = to_i64(stored.len());
        assert_stored_input(&answer.messages, &request.messages, id, first);

        let event = next_write(&mut events).await;
        assert_eq!(event.revision, answer.revision, "{label}: {event:?}");
        let appended = exchange_appended(&event);
        assert_eq!(appended.messages, answer.messages, "{label}");
        assert_eq!(
            (
                appended.run_id.as_str(),
                appended.provider_call.as_ref(),
                appended.next_sequence
            ),
            ("", None, first + 2),
            "{label}: {event:?}"
        );
        stored.extend(answer.messages);
    }
    assert!(waiting(&mut client, id).await.is_empty());
    assert_eq!(all_messages(&mut client, id).await, stored);
    assert_eq!(exported(&mut client, id).await, plain(&stored));
    let session = get(&mut client, id).await;
    assert_eq!(
        (
            session.revision,
            session.next_sequence,
            session.active_run_id.as_str()
        ),
        (5, 8, "")
    );
    let calls = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: id.into(),
            ..Default::default()
        })
        .await
        .expect("list provider calls")
        .into_inner();
    assert!(calls.provider_calls.is_empty(), "{calls:?}");

    // A run came and went, its queue empty: idle again.
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 6);
    let ended = end_run(&mut client, id, "run-a", false).await;
    assert_eq!(ended.revision, 7);
    assert!(ended.taken_input.is_none(), "{ended:?}");
    let answer = submit(
        &mut client,
        input(id, InputMode::Reject, &["after the run"]),
    )
    .await;
    assert!(!answer.queued, "{answer:?}");
    assert_eq!(answer.revision, 8);
    assert_stored_input(&answer.messages, &users(&["after the run"]), id, 8);
    assert!(waiting(&mut client, id).await.is_empty());
    server.stop().await.expect("stop");
}

async fn a_busy_session_queues_input_outside_the_history(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_busy";
    create_owned(&mut client, id, "alice").await;
    exchange(&mut client, id, "q0", "a0").await;
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 3);
    let history = all_messages(&mut client, id).await;
    let mut events = watch_head(&mut client, id).await;

    // QUEUE: at the back, one revision.
    let first_request = pb::SubmitInputRequest {
        messages: vec![user("first quokkaword"), rich("with details")],
        ..input(id, InputMode::Queue, &[])
    };
    let answer = submit(&mut client, first_request.clone()).await;
    assert_eq!(answer.revision, 4, "one revision");
    let first = queued(&answer);
    assert_fresh_input(&first, id, 1, &first_request);
    assert_queued_event(&next_write(&mut events).await, &first, 4);

    // UNSPECIFIED: as QUEUE.
    let second_request = input(id, InputMode::Unspecified, &["second quokkaword"]);
    let answer = submit(&mut client, second_request.clone()).await;
    assert_eq!(answer.revision, 5, "one revision");
    let second = queued(&answer);
    assert_fresh_input(&second, id, 2, &second_request);
    assert_ne!(second.input_id, first.input_id);
    assert_queued_event(&next_write(&mut events).await, &second, 5);
    assert_eq!(
        waiting(&mut client, id).await,
        [first.clone(), second.clone()]
    );

    // In no read of the history.
    assert_eq!(all_messages(&mut client, id).await, history);
    assert_eq!(exported(&mut client, id).await, plain(&history));
    assert_eq!(search_hits(&mut client, "quokkaword").await, 0);
    let session = get(&mut client, id).await;
    assert_eq!(
        (
            session.revision,
            session.next_sequence,
            session.active_run_id.as_str()
        ),
        (5, 2, "run-a")
    );

    // Taken by the lease holder: ordinary input from then on.
    let taken = take(&mut client, id, "run-a").await;
    assert_eq!(taken.revision, 6, "one revision");
    assert_took(&taken, &first, 2);
    assert_taken_event(&next_write(&mut events).await, &taken, "run-a");
    let mut expected = history.clone();
    expected.extend(taken.messages.clone());
    assert_eq!(all_messages(&mut client, id).await, expected);
    assert_eq!(exported(&mut client, id).await, plain(&expected));
    assert_eq!(search_hits(&mut client, "quokkaword").await, 1);
    let session = get(&mut client, id).await;
    assert_eq!((session.revision, session.next_sequence), (6, 4));
    assert_eq!(
        waiting(&mut client, id).await,
        std::slice::from_ref(&second)
    );

    let taken = take(&mut client, id, "run-a").await;
    assert_eq!(taken.revision, 7, "one revision");
    assert_took(&taken, &second, 4);
    assert_taken_event(&next_write(&mut events).await, &taken, "run-a");
    expected.extend(taken.messages.clone());
    assert_eq!(all_messages(&mut client, id).await, expected);
    assert_eq!(search_hits(&mut client, "quokkaword").await, 2);

    // None waiting.
    let status = take_err(&mut client, id, "run-a").await;
    assert_status(&status, Code::NotFound, "QUEUE_EMPTY");
    assert!(waiting(&mut client, id).await.is_empty());
    let session = get(&mut client, id).await;
    assert_eq!(
        (
            session.revision,
            session.next_sequence,
            session.active_run_id.as_str()
        ),
        (7, 5, "run-a"),
        "takes leave the lease; a refused take writes nothing"
    );
    server.stop().await.expect("stop");
}

async fn only_the_lease_holder_takes_the_oldest_input(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_holder";
    create_owned(&mut client, id, "alice").await;
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 2);
    let three = input(id, InputMode::Queue, &["one", "two", "three"]);
    let answer = submit(&mut client, three.clone()).await;
    assert_eq!(answer.revision, 3);
    let first = queued(&answer);
    assert_fresh_input(&first, id, 1, &three);
    let (second, head) = enqueue(&mut client, id, "four").await;
    assert_eq!((second.position, head), (2, 4));

    // Another run while run-a holds the lease.
    let status = take_err(&mut client, id, "run-b").await;
    assert_status(&status, Code::FailedPrecondition, "LEASE_NOT_HELD");
    assert_eq!(
        revision(&mut client, id).await,
        head,
        "a refused take wrote"
    );

    // run-a's lease ended: it holds nothing.
    assert_eq!(end_run(&mut client, id, "run-a", false).await.revision, 5);
    let status = take_err(&mut client, id, "run-a").await;
    assert_status(&status, Code::FailedPrecondition, "LEASE_NOT_HELD");
    // Another run's lease.
    assert_eq!(begin_run(&mut client, id, "run-b", LONG_LEASE).await, 6);
    let status = take_err(&mut client, id, "run-a").await;
    assert_status(&status, Code::FailedPrecondition, "LEASE_NOT_HELD");
    assert_eq!(revision(&mut client, id).await, 6, "a refused take wrote");
    assert_eq!(
        waiting(&mut client, id).await,
        [first.clone(), second.clone()]
    );
    assert!(all_messages(&mut client, id).await.is_empty());

    // The holder takes the oldest: its three messages, contiguous, in order.
    let taken = take(&mut client, id, "run-b").await;
    assert_eq!(taken.revision, 7);
    assert_took(&taken, &first, 0);
    assert_eq!(texts(&taken.messages), ["one", "two", "three"]);
    let taken = take(&mut client, id, "run-b").await;
    assert_eq!(taken.revision, 8);
    assert_took(&taken, &second, 3);
    assert_eq!(
        history_texts(&mut client, id).await,
        ["one", "two", "three", "four"]
    );
    server.stop().await.expect("stop");
}

async fn a_waiting_input_keeps_the_session_busy(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_waiting";
    create_owned(&mut client, id, "alice").await;
    begin_run(&mut client, id, "run-a", LONG_LEASE).await;
    let (one, head) = enqueue(&mut client, id, "one").await;
    assert_eq!(head, 3);
    let ended = end_run(&mut client, id, "run-a", false).await;
    assert_eq!(ended.revision, 4);
    assert!(ended.taken_input.is_none(), "{ended:?}");
    assert_eq!(get(&mut client, id).await.active_run_id, "");
    assert_eq!(waiting(&mut client, id).await, std::slice::from_ref(&one));

    // No lease, but an input waits: a later submission never overtakes it.
    let (two, head) = enqueue(&mut client, id, "two").await;
    assert_eq!((two.position, head), (2, 5));
    let request = input(id, InputMode::Unspecified, &["three"]);
    let answer = submit(&mut client, request.clone()).await;
    assert_eq!(answer.revision, 6);
    let three = queued(&answer);
    assert_fresh_input(&three, id, 3, &request);
    // INTERRUPT with no run to cancel: queued, one revision.
    let request = input(id, InputMode::Interrupt, &["four"]);
    let answer = submit(&mut client, request.clone()).await;
    assert_eq!(answer.revision, 7, "no run to cancel: one revision");
    let four = queued(&answer);
    assert_fresh_input(&four, id, 4, &request);
    let status = submit_err(&mut client, input(id, InputMode::Reject, &["five"])).await;
    assert_status(&status, Code::FailedPrecondition, "SESSION_BUSY");
    assert_eq!(revision(&mut client, id).await, 7, "REJECT wrote");
    assert_eq!(positions(&waiting(&mut client, id).await), [1, 2, 3, 4]);
    assert!(all_messages(&mut client, id).await.is_empty());

    // AppendExchange ignores the queue.
    let appended = exchange(&mut client, id, "direct", "answer").await;
    assert_eq!((appended.revision, appended.next_sequence), (8, 2));
    assert_eq!(
        waiting(&mut client, id).await,
        [one.clone(), two.clone(), three.clone(), four.clone()]
    );

    // All withdrawn: idle again.
    for (k, input) in [&one, &two, &three, &four].into_iter().enumerate() {
        assert_eq!(
            withdraw(&mut client, id, &input.input_id).await,
            9 + to_i64(k)
        );
    }
    let answer = submit(&mut client, input(id, InputMode::Reject, &["five"])).await;
    assert!(!answer.queued, "{answer:?}");
    assert_eq!(answer.revision, 13);
    assert_stored_input(&answer.messages, &users(&["five"]), id, 2);

    // Positions are never reused.
    begin_run(&mut client, id, "run-b", LONG_LEASE).await;
    let (six, _) = enqueue(&mut client, id, "six").await;
    assert_eq!(six.position, 5);
    server.stop().await.expect("stop");
}

async fn end_run_takes_the_next_input_then_frees_the_lease(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_take_next";
    create_owned(&mut client, id, "alice").await;
    exchange(&mut client, id, "q0", "a0").await;
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 3);
    let (one, _) = enqueue(&mut client, id, "one").await;
    let (two, head) = enqueue(&mut client, id, "two").await;
    assert_eq!(head, 5);
    let mut events = watch_head(&mut client, id).await;

    // A run that does not hold the lease: nothing taken, nothing written.
    let ended = end_run(&mut client, id, "run-b", true).await;
    assert_eq!(ended.revision, 5);
    assert!(ended.taken_input.is_none(), "{ended:?}");
    assert_eq!(waiting(&mut client, id).await, [one.clone(), two.clone()]);
    assert_eq!(get(&mut client, id).await.active_run_id, "run-a");

    // The holder: the oldest input taken, then the lease freed.
    let ended = end_run(&mut client, id, "run-a", true).await;
    assert_eq!(ended.revision, 7, "input_taken, then run_ended");
    assert_eq!(ended.taken_input.as_ref(), Some(&one));
    let event = next_write(&mut events).await;
    assert_eq!(event.revision, 6, "{event:?}");
    let taken = input_taken(&event);
    assert_eq!(
        (
            taken.input_id.as_str(),
            taken.position,
            taken.run_id.as_str(),
            taken.next_sequence
        ),
        (one.input_id.as_str(), 1, "run-a", 3),
        "{event:?}"
    );
    assert_stored_input(&taken.messages, &one.messages, id, 2);
    let event = next_write(&mut events).await;
    assert_eq!(event.revision, 7, "{event:?}");
    let ended_event = run_ended(&event);
    assert_eq!(ended_event.run_id, "run-a");
    assert!(!ended_event.expired, "{event:?}");
    let messages = all_messages(&mut client, id).await;
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[2..], taken.messages[..]);
    let session = get(&mut client, id).await;
    assert_eq!(
        (
            session.revision,
            session.next_sequence,
            session.active_run_id.as_str()
        ),
        (7, 3, "")
    );
    assert_eq!(waiting(&mut client, id).await, std::slice::from_ref(&two));

    // `two` waits: the next submission queues behind it.
    let (three, head) = enqueue(&mut client, id, "three").await;
    assert_eq!((three.position, head), (3, 8));
    assert_queued_event(&next_write(&mut events).await, &three, 8);

    // take_next with no lease: nothing taken.
    let ended = end_run(&mut client, id, "run-a", true).await;
    assert_eq!(ended.revision, 8);
    assert!(ended.taken_input.is_none(), "{ended:?}");
    assert_eq!(waiting(&mut client, id).await, [two.clone(), three.clone()]);

    // An empty queue: only the lease is freed.
    assert_eq!(begin_run(&mut client, id, "run-b", LONG_LEASE).await, 9);
    let taken_two = take(&mut client, id, "run-b").await;
    assert_took(&taken_two, &two, 3);
    let taken_three = take(&mut client, id, "run-b").await;
    assert_took(&taken_three, &three, 4);
    let ended = end_run(&mut client, id, "run-b", true).await;
    assert_eq!(ended.revision, 12);
    assert!(ended.taken_input.is_none(), "{ended:?}");
    assert_eq!(run_begun(&next_write(&mut events).await).run_id, "run-b");
    assert_taken_event(&next_write(&mut events).await, &taken_two, "run-b");
    assert_taken_event(&next_write(&mut events).await, &taken_three, "run-b");
    let event = next_write(&mut events).await;
    assert_eq!(
        (event.revision, run_ended(&event).run_id.as_str()),
        (12, "run-b")
    );
    assert_eq!(
        history_texts(&mut client, id).await,
        ["q0", "a0", "one", "two", "three"]
    );
    server.stop().await.expect("stop");
}

async fn interrupt_cancels_the_run_holding_the_lease(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_interrupt";
    create_owned(&mut client, id, "alice").await;
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 2);
    let mut events = watch_head(&mut client, id).await;
    assert!(!publish(&mut client, id, "run-a", 0).await.cancel_requested);

    // Queued, then the run cancelled: two revisions, the answer the last.
    let request = input(id, InputMode::Interrupt, &["stop, do this instead"]);
    let answer = submit(&mut client, request.clone()).await;
    assert_eq!(
        answer.revision, 4,
        "input_queued, then run_cancel_requested"
    );
    let first = queued(&answer);
    assert_fresh_input(&first, id, 1, &request);
    assert_queued_event(&next_write(&mut events).await, &first, 3);
    assert_interrupt_event(&next_write(&mut events).await, "run-a", &first, 4);

    // The producer learns it on its next delta; CancelRun answers that cancel.
    let published = publish(&mut client, id, "run-a", 1).await;
    assert!(published.cancel_requested, "{published:?}");
    assert_eq!(published.revision, 4);
    assert_eq!(cancel_run(&mut client, id, "run-a", "again").await, 4);
    assert_eq!(revision(&mut client, id).await, 4);

    // Cancelled already: another INTERRUPT only queues.
    let answer = submit(&mut client, input(id, InputMode::Interrupt, &["and this"])).await;
    assert_eq!(
        answer.revision, 5,
        "the run was cancelled before: one revision"
    );
    let second = queued(&answer);
    assert_eq!(second.position, 2);
    assert_queued_event(&next_write(&mut events).await, &second, 5);

    // The run takes the input and ends.
    let taken = take(&mut client, id, "run-a").await;
    assert_took(&taken, &first, 0);
    assert_taken_event(&next_write(&mut events).await, &taken, "run-a");
    assert_eq!(end_run(&mut client, id, "run-a", false).await.revision, 7);
    assert_eq!(run_ended(&next_write(&mut events).await).run_id, "run-a");

    // No lease: an INTERRUPT queues and cancels nothing.
    let answer = submit(&mut client, input(id, InputMode::Interrupt, &["third"])).await;
    assert_eq!(answer.revision, 8, "no run to cancel: one revision");
    let third = queued(&answer);
    assert_eq!(third.position, 3);
    assert_queued_event(&next_write(&mut events).await, &third, 8);

    // A new run is cancelled by the next INTERRUPT, not by earlier ones.
    assert_eq!(begin_run(&mut client, id, "run-b", LONG_LEASE).await, 9);
    assert_eq!(run_begun(&next_write(&mut events).await).run_id, "run-b");
    assert!(!publish(&mut client, id, "run-b", 0).await.cancel_requested);
    let answer = submit(&mut client, input(id, InputMode::Interrupt, &["fourth"])).await;
    assert_eq!(answer.revision, 11);
    let fourth = queued(&answer);
    assert_eq!(fourth.position, 4);
    assert_queued_event(&next_write(&mut events).await, &fourth, 10);
    assert_interrupt_event(&next_write(&mut events).await, "run-b", &fourth, 11);
    assert!(publish(&mut client, id, "run-b", 1).await.cancel_requested);

    // A run CancelRun stopped first: an INTERRUPT only queues.
    assert_eq!(end_run(&mut client, id, "run-b", false).await.revision, 12);
    assert_eq!(begin_run(&mut client, id, "run-c", LONG_LEASE).await, 13);
    assert_eq!(cancel_run(&mut client, id, "run-c", "user").await, 14);
    let answer = submit(&mut client, input(id, InputMode::Interrupt, &["fifth"])).await;
    assert_eq!(answer.revision, 15, "cancelled before: one revision");
    assert_eq!(queued(&answer).position, 5);
    assert_eq!(cancel_run(&mut client, id, "run-c", "again").await, 14);
    assert_eq!(revision(&mut client, id).await, 15);
    assert_eq!(positions(&waiting(&mut client, id).await), [2, 3, 4, 5]);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Refusals and limits

/// Submissions refused in every mode: no messages, too many, an unknown
/// session.
async fn assert_malformed_refused(client: &mut Client, session: &str) {
    for mode in MODES {
        let none = submit_err(client, input(session, mode, &[])).await;
        assert_names_field(&none, Code::InvalidArgument, "messages");
        let over = submit_err(
            client,
            pb::SubmitInputRequest {
                messages: lines(MAX_INPUT_MESSAGES + 1),
                ..input(session, mode, &[])
            },
        )
        .await;
        assert_status(&over, Code::ResourceExhausted, "LIMIT_EXCEEDED");
        let unknown = submit_err(client, input("ses_nosuch", mode, &["hello"])).await;
        assert_eq!(unknown.code(), Code::NotFound, "{mode:?}: {unknown:?}");
    }
}

async fn refused_submissions_write_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_refused";
    create_owned(&mut client, id, "alice").await;

    // Idle.
    assert_malformed_refused(&mut client, id).await;
    assert_eq!(
        revision(&mut client, id).await,
        1,
        "a refused submission wrote"
    );
    assert!(all_messages(&mut client, id).await.is_empty());
    // At the limit: appended at once, whole.
    let hundred = pb::SubmitInputRequest {
        messages: lines(MAX_INPUT_MESSAGES),
        ..input(id, InputMode::Reject, &[])
    };
    let answer = submit(&mut client, hundred.clone()).await;
    assert!(!answer.queued, "{answer:?}");
    assert_eq!(answer.revision, 2);
    assert_stored_input(&answer.messages, &hundred.messages, id, 0);

    // Busy.
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 3);
    assert!(!publish(&mut client, id, "run-a", 0).await.cancel_requested);
    assert_malformed_refused(&mut client, id).await;
    let busy = submit_err(&mut client, input(id, InputMode::Reject, &["not now"])).await;
    assert_status(&busy, Code::FailedPrecondition, "SESSION_BUSY");
    assert_eq!(
        revision(&mut client, id).await,
        3,
        "a refused submission wrote"
    );
    assert!(waiting(&mut client, id).await.is_empty());
    assert_eq!(
        all_messages(&mut client, id).await.len(),
        MAX_INPUT_MESSAGES
    );
    assert!(
        !publish(&mut client, id, "run-a", 1).await.cancel_requested,
        "a refused INTERRUPT cancelled the run"
    );
    // At the limit: queued whole, and taken whole.
    let hundred = pb::SubmitInputRequest {
        mode: InputMode::Queue.into(),
        ..hundred
    };
    let answer = submit(&mut client, hundred.clone()).await;
    assert_eq!(answer.revision, 4);
    let full = queued(&answer);
    assert_fresh_input(&full, id, 1, &hundred);
    let taken = take(&mut client, id, "run-a").await;
    assert_eq!(taken.revision, 5);
    assert_took(&taken, &full, to_i64(MAX_INPUT_MESSAGES));
    server.stop().await.expect("stop");
}

async fn a_queue_holds_at_most_a_hundred_waiting_inputs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_full";
    create_owned(&mut client, id, "alice").await;
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 2);
    let mut inputs = Vec::new();
    for i in 1..=MAX_WAITING {
        let (input, revision) = enqueue(&mut client, id, &format!("input {i}")).await;
        assert_eq!((input.position, revision), (to_i64(i), 2 + to_i64(i)));
        inputs.push(input);
    }
    let head = 2 + to_i64(MAX_WAITING);

    // Listed by position, in pages.
    assert_eq!(waiting(&mut client, id).await, inputs);
    let pages = queue_pages(&mut client, id, 30).await;
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        [30, 30, 30, 10]
    );
    assert_eq!(pages.concat(), inputs);
    let pages = queue_pages(&mut client, id, 7).await;
    assert!(pages.iter().all(|page| page.len() <= 7), "pages of 7");
    assert_eq!(pages.concat(), inputs);

    // The 101st: refused, in every mode that would queue it.
    assert!(!publish(&mut client, id, "run-a", 0).await.cancel_requested);
    for mode in [
        InputMode::Unspecified,
        InputMode::Queue,
        InputMode::Interrupt,
    ] {
        let status = submit_err(&mut client, input(id, mode, &["one too many"])).await;
        assert_status(&status, Code::ResourceExhausted, "QUEUE_FULL");
        assert_eq!(
            error_metadata(&status).get("limit").map(String::as_str),
            Some("100"),
            "{mode:?}: {status:?}"
        );
    }
    assert_eq!(
        revision(&mut client, id).await,
        head,
        "a refused submission wrote"
    );
    assert_eq!(waiting(&mut client, id).await, inputs);
    assert!(
        !publish(&mut client, id, "run-a", 1).await.cancel_requested,
        "a refused INTERRUPT cancelled the run"
    );

    // A take makes room: the next input gets the next position.
    let taken = take(&mut client, id, "run-a").await;
    assert_took(&taken, &inputs[0], 0);
    let (next, revision_next) = enqueue(&mut client, id, "input 101").await;
    assert_eq!((next.position, revision_next), (101, head + 2));
    let status = submit_err(
        &mut client,
        input(id, InputMode::Queue, &["again too many"]),
    )
    .await;
    assert_status(&status, Code::ResourceExhausted, "QUEUE_FULL");
    // So does a withdrawal.
    assert_eq!(
        withdraw(&mut client, id, &inputs[49].input_id).await,
        head + 3
    );
    let (last, revision_last) = enqueue(&mut client, id, "input 102").await;
    assert_eq!((last.position, revision_last), (102, head + 4));
    let expected: Vec<i64> = (2..=49).chain(51..=102).collect();
    assert_eq!(positions(&waiting(&mut client, id).await), expected);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Retries

async fn retries_by_request_id_answer_the_first(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_keys";
    create_owned(&mut client, id, "alice").await;
    assert_eq!(begin_run(&mut client, id, "run-a", LONG_LEASE).await, 2);

    let keyed_queue = keyed(input(id, InputMode::Queue, &["keyed one"]), "in-1");
    let first = submit(&mut client, keyed_queue.clone()).await;
    assert_eq!(first.revision, 3);
    let first_input = queued(&first);
    let retry = submit(&mut client, keyed_queue.clone()).await;
    assert_eq!(retry, first, "the retry answers the first submission whole");
    assert_eq!(revision(&mut client, id).await, 3, "a retry wrote");
    assert_eq!(
        waiting(&mut client, id).await,
        std::slice::from_ref(&first_input)
    );

    // The same key with another body.
    let others = [
        (
            "other messages",
            keyed(input(id, InputMode::Queue, &["keyed two"]), "in-1"),
        ),
        (
            "one more message",
            keyed(input(id, InputMode::Queue, &["keyed one", "more"]), "in-1"),
        ),
        (
            "another mode",
            keyed(input(id, InputMode::Interrupt, &["keyed one"]), "in-1"),
        ),
    ];
    for (label, request) in others {
        let status = submit_err(&mut client, request).await;
        assert_eq!(status.code(), Code::AlreadyExists, "{label}: {status:?}");
        assert_status(&status, Code::AlreadyExists, "REQUEST_ID_REUSED");
        assert_eq!(
            error_metadata(&status)
                .get("request_id")
                .map(String::as_str),
            Some("in-1"),
            "{label}: the caller's key, as sent"
        );
    }
    assert_eq!(
        revision(&mut client, id).await,
        3,
        "a refused submission wrote"
    );

    // Concurrent retries of one submission: one input.
    let racing = keyed(input(id, InputMode::Queue, &["raced"]), "in-race");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut client = client.clone();
        let request = racing.clone();
        tasks.push(tokio::spawn(async move {
            client
                .submit_input(request)
                .await
                .map(tonic::Response::into_inner)
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(
            task.await
                .expect("task")
                .expect("a concurrent keyed submission"),
        );
    }
    assert!(
        answers.windows(2).all(|pair| pair[0] == pair[1]),
        "concurrent retries answer alike: {answers:?}"
    );
    let raced = queued(&answers[0]);
    assert_eq!((raced.position, answers[0].revision), (2, 4));
    assert_eq!(revision(&mut client, id).await, 4);

    // A keyed INTERRUPT, retried, neither queues nor cancels again.
    assert!(!publish(&mut client, id, "run-a", 0).await.cancel_requested);
    let keyed_interrupt = keyed(input(id, InputMode::Interrupt, &["keyed stop"]), "in-2");
    let interrupted = submit(&mut client, keyed_interrupt.clone()).await;
    assert_eq!(
        interrupted.revision, 6,
        "input_queued, then run_cancel_requested"
    );
    let interrupt_input = queued(&interrupted);
    assert_eq!(
        submit(&mut client, keyed_interrupt.clone()).await,
        interrupted
    );
    assert_eq!(revision(&mut client, id).await, 6, "a retry wrote");

    // Taken, or withdrawn: a retry still answers the first, and writes nothing.
    let taken = take(&mut client, id, "run-a").await;
    assert_took(&taken, &first_input, 0);
    assert_eq!(
        withdraw(&mut client, id, &interrupt_input.input_id).await,
        8
    );
    assert_eq!(submit(&mut client, keyed_queue.clone()).await, first);
    assert_eq!(submit(&mut client, keyed_interrupt).await, interrupted);
    assert_eq!(revision(&mut client, id).await, 8, "a retry wrote");
    assert_eq!(waiting(&mut client, id).await, std::slice::from_ref(&raced));
    assert_eq!(history_texts(&mut client, id).await, ["keyed one"]);

    // Appended at once: the retry answers that, the session busy or not.
    assert_eq!(withdraw(&mut client, id, &raced.input_id).await, 9);
    assert_eq!(end_run(&mut client, id, "run-a", false).await.revision, 10);
    let keyed_idle = keyed(input(id, InputMode::Reject, &["keyed now"]), "in-3");
    let at_once = submit(&mut client, keyed_idle.clone()).await;
    assert!(!at_once.queued, "{at_once:?}");
    assert_eq!(at_once.revision, 11);
    assert_eq!(begin_run(&mut client, id, "run-b", LONG_LEASE).await, 12);
    assert_eq!(submit(&mut client, keyed_idle).await, at_once);
    assert_eq!(revision(&mut client, id).await, 12, "a retry wrote");
    assert!(waiting(&mut client, id).await.is_empty());
    assert_eq!(
        history_texts(&mut client, id).await,
        ["keyed one", "keyed now"]
    );

    // Keys are per session: another session's key is free here.
    let other = "ses_keys_other";
    create_owned(&mut client, other, "alice").await;
    let elsewhere = submit(
        &mut client,
        keyed(input(other, InputMode::Queue, &["elsewhere"]), "in-1"),
    )
    .await;
    assert!(!elsewhere.queued, "{elsewhere:?}");
    assert_eq!(elsewhere.revision, 2);
    assert_eq!(history_texts(&mut client, other).await, ["elsewhere"]);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Withdrawal

async fn withdrawn_inputs_are_never_taken(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_withdraw";
    let other = "ses_withdraw_other";
    create_owned(&mut client, id, "alice").await;
    begin_run(&mut client, id, "run-a", LONG_LEASE).await;
    let (one, _) = enqueue(&mut client, id, "one").await;
    let (two, _) = enqueue(&mut client, id, "two").await;
    let (three, head) = enqueue(&mut client, id, "three").await;
    assert_eq!(head, 5);
    create_owned(&mut client, other, "alice").await;
    begin_run(&mut client, other, "run-x", LONG_LEASE).await;
    let (theirs, other_head) = enqueue(&mut client, other, "theirs").await;
    let mut events = watch_head(&mut client, id).await;

    // One revision; listed no more.
    assert_eq!(withdraw(&mut client, id, &two.input_id).await, 6);
    let event = next_write(&mut events).await;
    assert_eq!(event.revision, 6, "{event:?}");
    assert!(event.time.is_some(), "{event:?}");
    let withdrawn = input_withdrawn(&event);
    assert_eq!(
        (withdrawn.input_id.as_str(), withdrawn.position),
        (two.input_id.as_str(), 2)
    );
    assert_eq!(waiting(&mut client, id).await, [one.clone(), three.clone()]);
    // Again: the same revision, nothing written.
    assert_eq!(withdraw(&mut client, id, &two.input_id).await, 6);
    assert_eq!(
        revision(&mut client, id).await,
        6,
        "withdrawing again wrote"
    );

    // Never taken.
    let taken_one = take(&mut client, id, "run-a").await;
    assert_took(&taken_one, &one, 0);
    let taken_three = take(&mut client, id, "run-a").await;
    assert_took(&taken_three, &three, 1);
    let status = take_err(&mut client, id, "run-a").await;
    assert_status(&status, Code::NotFound, "QUEUE_EMPTY");
    assert_taken_event(&next_write(&mut events).await, &taken_one, "run-a");
    assert_taken_event(&next_write(&mut events).await, &taken_three, "run-a");
    assert_eq!(history_texts(&mut client, id).await, ["one", "three"]);

    // Taken: too late to withdraw.
    for taken in [&one, &three] {
        let status = withdraw_err(&mut client, id, &taken.input_id).await;
        assert_status(&status, Code::FailedPrecondition, "INPUT_ALREADY_TAKEN");
    }
    assert_eq!(withdraw(&mut client, id, &two.input_id).await, 6);

    // Unknown here: an id nobody has, another session's input.
    let status = withdraw_err(&mut client, id, &unknown_id(&one.input_id)).await;
    assert_status(&status, Code::NotFound, "INPUT_NOT_FOUND");
    let status = withdraw_err(&mut client, id, &theirs.input_id).await;
    assert_status(&status, Code::NotFound, "INPUT_NOT_FOUND");
    for mine in [&one, &two, &three] {
        let status = withdraw_err(&mut client, other, &mine.input_id).await;
        assert_status(&status, Code::NotFound, "INPUT_NOT_FOUND");
    }
    let status = withdraw_err(&mut client, "ses_nosuch", &two.input_id).await;
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(
        (
            revision(&mut client, id).await,
            revision(&mut client, other).await
        ),
        (8, other_head),
        "a refused withdrawal wrote"
    );
    assert_eq!(
        waiting(&mut client, other).await,
        std::slice::from_ref(&theirs)
    );

    // Positions are never reused.
    let (four, revision_four) = enqueue(&mut client, id, "four").await;
    assert_eq!((four.position, revision_four), (4, 9));
    assert_queued_event(&next_write(&mut events).await, &four, 9);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Runs, rollbacks, deletion and forks

async fn the_queue_outlives_runs_rollbacks_and_expiry(backend: Backend) {
    let storage = Storage::new(backend).await;
    let server = TestServer::start_on(storage, |config| config.sweep_interval_ms = 50).await;
    let mut client = server.client().await;
    let id = "ses_outlive";
    create_owned(&mut client, id, "alice").await;
    exchange(&mut client, id, "q0", "a0").await;
    begin_run(&mut client, id, "run-a", LONG_LEASE).await;
    let (one, _) = enqueue(&mut client, id, "one").await;

    // CancelRun and DiscardRun.
    publish(&mut client, id, "run-a", 0).await;
    cancel_run(&mut client, id, "run-a", "stop").await;
    client
        .discard_run(pb::DiscardRunRequest {
            session_id: id.into(),
            run_id: "run-a".into(),
        })
        .await
        .expect("discard run");
    assert_eq!(waiting(&mut client, id).await, std::slice::from_ref(&one));

    // RollbackSession and AppendExchange, by the holder.
    let rolled_back = client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: id.into(),
            after_sequence: 0,
            run_id: "run-a".into(),
            ..Default::default()
        })
        .await
        .expect("roll back")
        .into_inner();
    assert_eq!(rolled_back.next_sequence, 1);
    client
        .append_exchange(pb::AppendExchangeRequest {
            run_id: "run-a".into(),
            ..exchange_request(id, "q1", "a1")
        })
        .await
        .expect("the holder appends");
    assert_eq!(waiting(&mut client, id).await, std::slice::from_ref(&one));

    // EndRun without take_next.
    let ended = end_run(&mut client, id, "run-a", false).await;
    assert!(ended.taken_input.is_none(), "{ended:?}");
    assert_eq!(waiting(&mut client, id).await, std::slice::from_ref(&one));

    // No lease, an input waiting: AppendExchange appends, the input waits on.
    let appended = exchange(&mut client, id, "q2", "a2").await;
    assert_eq!(appended.next_sequence, 5);
    assert_eq!(waiting(&mut client, id).await, std::slice::from_ref(&one));

    // The lease runs out.
    begin_run(&mut client, id, "run-b", 1).await;
    let (two, _) = enqueue(&mut client, id, "two").await;
    assert_eq!(two.position, 2);
    wait_for_lease_gone(&mut client, id).await;
    assert_eq!(waiting(&mut client, id).await, [one.clone(), two.clone()]);

    // The next run takes them, oldest first, after all that was appended.
    begin_run(&mut client, id, "run-c", LONG_LEASE).await;
    let taken = take(&mut client, id, "run-c").await;
    assert_took(&taken, &one, 5);
    let taken = take(&mut client, id, "run-c").await;
    assert_took(&taken, &two, 6);
    assert_eq!(
        history_texts(&mut client, id).await,
        ["q0", "q1", "a1", "q2", "a2", "one", "two"]
    );
    server.stop().await.expect("stop");
}

async fn deletion_recreation_and_forks_leave_no_queue(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_gone";
    create_owned(&mut client, id, "alice").await;
    exchange(&mut client, id, "q0", "a0").await;
    begin_run(&mut client, id, "run-a", LONG_LEASE).await;
    let (one, _) = enqueue(&mut client, id, "one").await;
    let (two, _) = enqueue(&mut client, id, "two").await;

    // A fork copies the history, none of the queue.
    let fork = client
        .fork_session(pb::ForkSessionRequest {
            session_id: id.into(),
            at_sequence: 1,
            new_session_id: "ses_fork".into(),
        })
        .await
        .expect("fork")
        .into_inner();
    assert_eq!(fork.id, "ses_fork");
    assert!(waiting(&mut client, "ses_fork").await.is_empty());
    let status = withdraw_err(&mut client, "ses_fork", &one.input_id).await;
    assert_status(&status, Code::NotFound, "INPUT_NOT_FOUND");
    // run-a takes (or renews) the fork's lease: nothing to take there.
    begin_run(&mut client, "ses_fork", "run-a", LONG_LEASE).await;
    let status = take_err(&mut client, "ses_fork", "run-a").await;
    assert_status(&status, Code::NotFound, "QUEUE_EMPTY");
    assert_eq!(history_texts(&mut client, "ses_fork").await, ["q0", "a0"]);
    assert_eq!(waiting(&mut client, id).await, [one.clone(), two.clone()]);

    // Deleted: the queue with it.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: id.into(),
        })
        .await
        .expect("delete");
    let status = waiting_err(&mut client, id).await;
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = take_err(&mut client, id, "run-a").await;
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = withdraw_err(&mut client, id, &one.input_id).await;
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Created again: an empty queue, positions from 1.
    create_owned(&mut client, id, "alice").await;
    assert!(waiting(&mut client, id).await.is_empty());
    let answer = submit(&mut client, input(id, InputMode::Queue, &["fresh"])).await;
    assert!(!answer.queued, "the old queue keeps it busy: {answer:?}");
    begin_run(&mut client, id, "run-a", LONG_LEASE).await;
    let (again, _) = enqueue(&mut client, id, "again").await;
    assert_eq!(again.position, 1);
    assert!(
        again.input_id != one.input_id && again.input_id != two.input_id,
        "{again:?}"
    );
    for old in [&one, &two] {
        let status = withdraw_err(&mut client, id, &old.input_id).await;
        assert_status(&status, Code::NotFound, "INPUT_NOT_FOUND");
    }
    let taken = take(&mut client, id, "run-a").await;
    assert_took(&taken, &again, 1);
    let status = take_err(&mut client, id, "run-a").await;
    assert_status(&status, Code::NotFound, "QUEUE_EMPTY");
    assert_eq!(history_texts(&mut client, id).await, ["fresh", "again"]);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Events

async fn watchers_see_the_queue_at_the_revisions_answered(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_watched";
    create_owned(&mut client, id, "alice").await;
    let head = begin_run(&mut client, id, "run-a", LONG_LEASE).await;
    let mut events = watch_head(&mut client, id).await;
    let mut live = Vec::new();

    // QUEUE.
    let answer = submit(&mut client, input(id, InputMode::Queue, &["one"])).await;
    let one = queued(&answer);
    let event = next_write(&mut events).await;
    assert_queued_event(&event, &one, answer.revision);
    live.push(event);

    // INTERRUPT: queued, then the cancel.
    let answer = submit(&mut client, input(id, InputMode::Interrupt, &["two"])).await;
    let two = queued(&answer);
    let event = next_write(&mut events).await;
    assert_queued_event(&event, &two, answer.revision - 1);
    live.push(event);
    let event = next_write(&mut events).await;
    assert_interrupt_event(&event, "run-a", &two, answer.revision);
    live.push(event);

    // Withdrawn.
    let withdrawn = withdraw(&mut client, id, &two.input_id).await;
    let event = next_write(&mut events).await;
    assert_eq!(event.revision, withdrawn, "{event:?}");
    assert_eq!(
        input_withdrawn(&event),
        &pb::InputWithdrawn {
            input_id: two.input_id.clone(),
            position: 2,
        }
    );
    live.push(event);

    // Taken.
    let taken = take(&mut client, id, "run-a").await;
    let event = next_write(&mut events).await;
    assert_taken_event(&event, &taken, "run-a");
    live.push(event);

    // Taken by EndRun's take_next, then the lease freed.
    let answer = submit(&mut client, input(id, InputMode::Queue, &["three"])).await;
    let three = queued(&answer);
    let event = next_write(&mut events).await;
    assert_queued_event(&event, &three, answer.revision);
    live.push(event);
    let ended = end_run(&mut client, id, "run-a", true).await;
    assert_eq!(ended.taken_input.as_ref(), Some(&three));
    let stored = all_messages(&mut client, id).await;
    let event = next_write(&mut events).await;
    assert_eq!(event.revision, ended.revision - 1, "{event:?}");
    let recorded = input_taken(&event);
    assert_eq!(
        (
            recorded.input_id.as_str(),
            recorded.position,
            recorded.run_id.as_str(),
            recorded.next_sequence
        ),
        (three.input_id.as_str(), 3, "run-a", 2),
        "{event:?}"
    );
    assert_eq!(recorded.messages, stored[1..], "{event:?}");
    live.push(event);
    let event = next_write(&mut events).await;
    assert_eq!(event.revision, ended.revision, "{event:?}");
    assert_eq!(run_ended(&event).run_id, "run-a");
    live.push(event);

    // Appended at once.
    let answer = submit(&mut client, input(id, InputMode::Queue, &["four"])).await;
    assert!(!answer.queued, "{answer:?}");
    let event = next_write(&mut events).await;
    assert_eq!(event.revision, answer.revision, "{event:?}");
    assert_eq!(exchange_appended(&event).messages, answer.messages);
    live.push(event);

    // Refused calls and repeats make no event: the next one is a rename.
    assert_eq!(withdraw(&mut client, id, &two.input_id).await, withdrawn);
    let status = withdraw_err(&mut client, id, &one.input_id).await;
    assert_status(&status, Code::FailedPrecondition, "INPUT_ALREADY_TAKEN");
    take_err(&mut client, id, "run-a").await;
    let renamed = rename(&mut client, id, "renamed").await;
    assert_eq!(renamed.revision, answer.revision + 1);
    let event = next_write(&mut events).await;
    assert!(
        matches!(event.event, Some(Event::SessionUpdated(_))),
        "expected session_updated, got {event:?}"
    );

    // Each a revision of its own, and a replay tells the same.
    assert_eq!(
        live.iter().map(|e| e.revision).collect::<Vec<_>>(),
        (head + 1..=head + 9).collect::<Vec<_>>()
    );
    let replayed = replay(&mut client, id, head).await;
    assert_eq!(replayed.len(), live.len() + 1, "{replayed:?}");
    assert_eq!(replayed[..live.len()], live[..]);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Concurrency

/// [`SUBMITTERS`] concurrent submissions to `session` while run-a holds its
/// lease, then [`TAKERS`] competing takers (run-a's calls) until the queue
/// is empty, each task on its own connection, round robin over
/// `endpoints`: distinct consecutive positions, `input_queued` in position
/// order, each input taken exactly once, in position order.
async fn race_for_the_queue(endpoints: &[String], session: &str) {
    let mut client = connect(&endpoints[0]).await;
    create_owned(&mut client, session, "alice").await;
    let head = begin_run(&mut client, session, "run-a", LONG_LEASE).await;
    let mut events = watch_head(&mut client, session).await;

    let start = Arc::new(tokio::sync::Barrier::new(SUBMITTERS));
    let mut tasks = Vec::new();
    for i in 0..SUBMITTERS {
        let endpoint = endpoints[i % endpoints.len()].clone();
        let request = input(session, InputMode::Queue, &[&format!("input {i}")]);
        let start = Arc::clone(&start);
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&endpoint).await;
            start.wait().await;
            client
                .submit_input(request)
                .await
                .map(tonic::Response::into_inner)
        }));
    }
    let mut submitted: HashMap<String, (pb::QueuedInput, i64)> = HashMap::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let answer = task
            .await
            .expect("submitter task")
            .unwrap_or_else(|status| panic!("submitter {i}: {status:?}"));
        let input = queued(&answer);
        assert_eq!(
            input.messages,
            users(&[&format!("input {i}")]),
            "submitter {i}"
        );
        submitted.insert(input.input_id.clone(), (input, answer.revision));
    }
    assert_eq!(submitted.len(), SUBMITTERS, "distinct input ids");

    // Positions 1..100, one revision each.
    let mut by_position: Vec<(pb::QueuedInput, i64)> = submitted.values().cloned().collect();
    by_position.sort_by_key(|(input, _)| input.position);
    let all_positions: Vec<i64> = (1..=to_i64(SUBMITTERS)).collect();
    assert_eq!(
        by_position
            .iter()
            .map(|(input, _)| input.position)
            .collect::<Vec<_>>(),
        all_positions,
        "distinct consecutive positions"
    );
    let mut revisions: Vec<i64> = by_position.iter().map(|(_, revision)| *revision).collect();
    revisions.sort_unstable();
    assert_eq!(
        revisions,
        (head + 1..=head + to_i64(SUBMITTERS)).collect::<Vec<_>>(),
        "one revision per submission"
    );
    // input_queued in position order, each at the revision answered.
    for position in 1..=to_i64(SUBMITTERS) {
        let event = next_write(&mut events).await;
        let listed = input_queued(&event);
        assert_eq!(
            listed.position, position,
            "input_queued out of position order: {event:?}"
        );
        let (answered, revision) = &submitted[&listed.input_id];
        assert_eq!((listed, event.revision), (answered, *revision));
    }
    let all: Vec<pb::QueuedInput> = by_position.iter().map(|(input, _)| input.clone()).collect();
    assert_eq!(waiting(&mut client, session).await, all);

    // Competing takers.
    let start = Arc::new(tokio::sync::Barrier::new(TAKERS));
    let mut tasks = Vec::new();
    for t in 0..TAKERS {
        let endpoint = endpoints[t % endpoints.len()].clone();
        let session = session.to_owned();
        let start = Arc::clone(&start);
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&endpoint).await;
            start.wait().await;
            let mut taken = Vec::new();
            loop {
                match client
                    .take_queued_input(take_request(&session, "run-a"))
                    .await
                {
                    Ok(answer) => taken.push(answer.into_inner()),
                    Err(status) => {
                        assert_status(&status, Code::NotFound, "QUEUE_EMPTY");
                        return taken;
                    }
                }
            }
        }));
    }
    let mut takes = Vec::new();
    for (t, task) in tasks.into_iter().enumerate() {
        let taken = task
            .await
            .unwrap_or_else(|error| panic!("taker {t}: {error}"));
        takes.extend(taken);
    }

    // Each taken exactly once.
    let taken_ids: Vec<String> = takes
        .iter()
        .map(|t| t.input.as_ref().expect("the input taken").input_id.clone())
        .collect();
    let unique: BTreeSet<&str> = taken_ids.iter().map(String::as_str).collect();
    assert_eq!(
        taken_ids.len(),
        unique.len(),
        "an input was taken twice: {taken_ids:?}"
    );
    let expected: BTreeSet<&str> = submitted.keys().map(String::as_str).collect();
    assert_eq!(unique, expected, "every input taken");

    // In position order: the order of the revisions that took them.
    takes.sort_by_key(|t| t.revision);
    let take_revisions: Vec<i64> = takes.iter().map(|t| t.revision).collect();
    assert!(
        take_revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "two takes answered one revision: {take_revisions:?}"
    );
    let taken_positions: Vec<i64> = takes
        .iter()
        .map(|t| t.input.as_ref().expect("the input taken").position)
        .collect();
    assert_eq!(
        taken_positions, all_positions,
        "taken out of position order (by revision)"
    );
    let mut stored = Vec::new();
    for (k, taken) in takes.iter().enumerate() {
        let input_id = &taken.input.as_ref().expect("the input taken").input_id;
        assert_took(taken, &submitted[input_id].0, to_i64(k));
        stored.extend(taken.messages.clone());
    }
    assert_eq!(all_messages(&mut client, session).await, stored);
    assert!(waiting(&mut client, session).await.is_empty());
    let session_now = get(&mut client, session).await;
    assert_eq!(
        session_now.revision,
        head + to_i64(2 * SUBMITTERS),
        "one revision per take"
    );
}

async fn concurrent_submitters_and_takers_keep_position_order(backend: Backend) {
    let server = TestServer::start(backend).await;
    race_for_the_queue(&[server.endpoint()], "ses_race").await;
    server.stop().await.expect("stop");
}

/// Two replicas of one database: submitters and takers split across both.
async fn competing_takers_on_two_replicas_take_each_input_once() {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let a = TestServer::start_on(storage, |_| {}).await;
    let b = TestServer::start_with(url, None, |_| {}).await;
    race_for_the_queue(&[a.endpoint(), b.endpoint()], "ses_replicas").await;
    b.stop().await.expect("stop b");
    a.stop().await.expect("stop a");
}

/// A keyed submission retried on the other replica answers the first; an
/// input queued through one replica is taken through the other, once.
async fn a_submission_retried_on_another_replica_answers_the_first() {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let a = TestServer::start_on(storage, |_| {}).await;
    let b = TestServer::start_with(url, None, |_| {}).await;
    let (mut on_a, mut on_b) = (a.client().await, b.client().await);
    let id = "ses_replica_keys";
    create_owned(&mut on_a, id, "alice").await;
    begin_run(&mut on_a, id, "run-a", LONG_LEASE).await;

    let request = keyed(input(id, InputMode::Queue, &["once"]), "in-replica");
    let first = submit(&mut on_a, request.clone()).await;
    let input = queued(&first);
    let retried = submit(&mut on_b, request.clone()).await;
    assert_eq!(retried, first, "the retry on b answers the submission on a");
    assert_eq!(
        revision(&mut on_b, id).await,
        first.revision,
        "the retry wrote"
    );
    assert_eq!(waiting(&mut on_b, id).await, std::slice::from_ref(&input));

    let ended = end_run(&mut on_b, id, "run-a", true).await;
    assert_eq!(ended.taken_input.as_ref(), Some(&input));
    assert_eq!(ended.revision, first.revision + 2);
    let status = withdraw_err(&mut on_a, id, &input.input_id).await;
    assert_status(&status, Code::FailedPrecondition, "INPUT_ALREADY_TAKEN");
    assert_eq!(submit(&mut on_a, request).await, first);
    assert_eq!(history_texts(&mut on_a, id).await, ["once"]);
    assert_eq!(revision(&mut on_a, id).await, ended.revision);
    b.stop().await.expect("stop b");
    a.stop().await.expect("stop a");
}

// ---------------------------------------------------------------------------
// Tenancy

/// Owns the probed session.
const OWNER: &str = "acme-token";
/// Has a session of its own, and pokes at the owner's.
const INTRUDER: &str = "globex-token";
/// Has no sessions: its answers are what an unknown session looks like.
const STRANGER: &str = "initech-token";

/// A server whose token file names three tenants; keep the directory.
async fn start_tenants(backend: Backend) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens");
    std::fs::write(
        &path,
        token_line("acme", OWNER)
            + &token_line("globex", INTRUDER)
            + &token_line("initech", STRANGER),
    )
    .expect("write the tokens");
    let server = TestServer::start_on(Storage::new(backend).await, move |config| {
        config.auth_tokens = Some(path);
    })
    .await;
    (server, dir)
}

/// `token`'s session `id`, its lease held by `run`, with `request`'s input
/// waiting: the answer to the submission.
async fn tenant_queue(
    client: &mut Client,
    token: &str,
    id: &str,
    run: &str,
    request: pb::SubmitInputRequest,
) -> pb::SubmitInputResponse {
    client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: id.into(),
                user: "alice".into(),
                ..Default::default()
            },
            token,
        ))
        .await
        .expect("create");
    client
        .begin_run(authed(
            pb::BeginRunRequest {
                session_id: id.into(),
                run_id: run.into(),
                lease: Some(prost_types::Duration {
                    seconds: LONG_LEASE,
                    nanos: 0,
                }),
            },
            token,
        ))
        .await
        .expect("begin run");
    let answer = client
        .submit_input(authed(request, token))
        .await
        .expect("submit input")
        .into_inner();
    queued(&answer);
    answer
}

/// Session `id` as `token`'s tenant reads it.
async fn session_as(client: &mut Client, token: &str, id: &str) -> pb::Session {
    client
        .get_session(authed(
            pb::GetSessionRequest {
                session_id: id.into(),
                ..Default::default()
            },
            token,
        ))
        .await
        .unwrap_or_else(|status| panic!("get {id} as {token}: {status:?}"))
        .into_inner()
}

/// Session `id`'s waiting inputs as `token`'s tenant lists them.
async fn waiting_as(client: &mut Client, token: &str, id: &str) -> Vec<pb::QueuedInput> {
    client
        .list_queued_inputs(authed(list_request(id, 1000), token))
        .await
        .unwrap_or_else(|status| panic!("list the queue of {id} as {token}: {status:?}"))
        .into_inner()
        .inputs
}

/// The intruder's call on the owner's session failed NOT_FOUND exactly as
/// the same call of a tenant without sessions did (code, message, details).
#[track_caller]
fn assert_like_unknown(label: &str, foreign: Result<(), Status>, stranger: Result<(), Status>) {
    let foreign = foreign
        .err()
        .unwrap_or_else(|| panic!("{label}: succeeded on another tenant's session"));
    assert_eq!(foreign.code(), Code::NotFound, "{label}: {foreign:?}");
    let stranger = stranger
        .err()
        .unwrap_or_else(|| panic!("{label}: succeeded for a tenant without sessions"));
    assert_eq!(
        (foreign.code(), foreign.message()),
        (stranger.code(), stranger.message()),
        "{label}: another tenant's session answers unlike an unknown one"
    );
    assert_eq!(
        foreign.details(),
        stranger.details(),
        "{label}: error details differ from an unknown session's: {:?} vs {:?}",
        error_details(&foreign),
        error_details(&stranger)
    );
}

async fn another_tenants_session_is_unknown_to_the_queue(backend: Backend) {
    let (server, _tokens) = start_tenants(backend).await;
    let mut client = server.client().await;
    const SHARED: &str = "ses_shared";
    const OWN: &str = "ses_globex";
    const RUN: &str = "run-acme";
    let owners_request = keyed(input(SHARED, InputMode::Queue, &["owner's"]), "in-acme");
    let owners_answer = tenant_queue(&mut client, OWNER, SHARED, RUN, owners_request.clone()).await;
    let owners = queued(&owners_answer);
    let own_answer = tenant_queue(
        &mut client,
        INTRUDER,
        OWN,
        "run-globex",
        input(OWN, InputMode::Queue, &["intruder's"]),
    )
    .await;
    let own = queued(&own_answer);
    let before = session_as(&mut client, OWNER, SHARED).await;
    let mut live = client
        .watch_session(authed(
            pb::WatchSessionRequest {
                session_id: SHARED.into(),
                after_revision: before.revision,
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .expect("the owner's watch")
        .into_inner();
    let caught_up = next_write(&mut live).await;
    assert!(
        matches!(caught_up.event, Some(Event::CaughtUp(_))),
        "{caught_up:?}"
    );

    // Each new RPC, as the intruder and as a tenant without sessions.
    for mode in MODES {
        for key in ["", "in-acme"] {
            let build = || keyed(input(SHARED, mode, &["owner's"]), key);
            let foreign = client
                .submit_input(authed(build(), INTRUDER))
                .await
                .map(drop);
            let stranger = client
                .submit_input(authed(build(), STRANGER))
                .await
                .map(drop);
            assert_like_unknown(
                &format!("SubmitInput {mode:?}, key {key:?}"),
                foreign,
                stranger,
            );
        }
    }
    let foreign = client
        .take_queued_input(authed(take_request(SHARED, RUN), INTRUDER))
        .await
        .map(drop);
    let stranger = client
        .take_queued_input(authed(take_request(SHARED, RUN), STRANGER))
        .await
        .map(drop);
    assert_like_unknown("TakeQueuedInput", foreign, stranger);
    let foreign = client
        .list_queued_inputs(authed(list_request(SHARED, 10), INTRUDER))
        .await
        .map(drop);
    let stranger = client
        .list_queued_inputs(authed(list_request(SHARED, 10), STRANGER))
        .await
        .map(drop);
    assert_like_unknown("ListQueuedInputs", foreign, stranger);
    let foreign = client
        .withdraw_queued_input(authed(withdraw_request(SHARED, &owners.input_id), INTRUDER))
        .await
        .map(drop);
    let stranger = client
        .withdraw_queued_input(authed(withdraw_request(SHARED, &owners.input_id), STRANGER))
        .await
        .map(drop);
    assert_like_unknown("WithdrawQueuedInput", foreign, stranger);
    let end = || pb::EndRunRequest {
        session_id: SHARED.into(),
        run_id: RUN.into(),
        take_next: true,
    };
    let foreign = client.end_run(authed(end(), INTRUDER)).await.map(drop);
    let stranger = client.end_run(authed(end(), STRANGER)).await.map(drop);
    assert_like_unknown("EndRun with take_next", foreign, stranger);

    // The owner's input id in the intruder's own session: unknown there.
    let status = client
        .withdraw_queued_input(authed(withdraw_request(OWN, &owners.input_id), INTRUDER))
        .await
        .expect_err("another tenant's input");
    assert_status(&status, Code::NotFound, "INPUT_NOT_FOUND");

    // Nothing written: the owner's session, queue and run are as they were.
    assert_eq!(
        session_as(&mut client, OWNER, SHARED).await,
        before,
        "another tenant changed the owner's session"
    );
    assert_eq!(
        waiting_as(&mut client, OWNER, SHARED).await,
        std::slice::from_ref(&owners)
    );
    assert_eq!(
        waiting_as(&mut client, INTRUDER, OWN).await,
        std::slice::from_ref(&own)
    );
    let published = client
        .publish_delta(authed(
            pb::PublishDeltaRequest {
                session_id: SHARED.into(),
                run_id: RUN.into(),
                index: 0,
                delta: Some(pb::publish_delta_request::Delta::Text("x".into())),
            },
            OWNER,
        ))
        .await
        .expect("the owner's run publishes")
        .into_inner();
    assert!(
        !published.cancel_requested,
        "another tenant's INTERRUPT cancelled the owner's run"
    );
    // The owner's watcher's next event is the owner's own take.
    let taken = client
        .take_queued_input(authed(take_request(SHARED, RUN), OWNER))
        .await
        .expect("the owner takes")
        .into_inner();
    assert_eq!(taken.revision, before.revision + 1);
    assert_took(&taken, &owners, 0);
    assert_taken_event(&next_write(&mut live).await, &taken, RUN);

    // Keys are per tenant: the stranger's own session of that id takes the
    // owner's key with another body.
    client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: SHARED.into(),
                ..Default::default()
            },
            STRANGER,
        ))
        .await
        .expect("the stranger's own session");
    let theirs = client
        .submit_input(authed(
            keyed(input(SHARED, InputMode::Queue, &["stranger's"]), "in-acme"),
            STRANGER,
        ))
        .await
        .expect("the owner's key in another tenant")
        .into_inner();
    assert!(!theirs.queued, "{theirs:?}");
    let retried = client
        .submit_input(authed(owners_request, OWNER))
        .await
        .expect("the owner's retry")
        .into_inner();
    assert_eq!(
        retried, owners_answer,
        "the owner's retry answers its first"
    );
    drop(live);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Durability

/// The real binary on SQLite, killed with SIGKILL after two submissions and
/// after the first take: each time the waiting inputs are still there at
/// their positions, and each is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_input_survives_sigkill_and_is_taken_once() {
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .expect("build sessionstore");
    let dir = tempfile::tempdir().expect("tempdir");
    let database_url = format!("sqlite://{}/db.sqlite", dir.path().display());
    let start = |n: usize| {
        ServerProcess::start(
            &binary,
            &database_url,
            "127.0.0.1:0",
            dir.path().join(format!("server-{n}.log")),
            &[],
        )
    };
    let id = "ses_crash";

    let mut server = start(1).await;
    let mut client = server.short_timeout_client().await;
    create_owned(&mut client, id, "alice").await;
    begin_run(&mut client, id, "run-a", LONG_LEASE).await;
    let keyed_first = keyed(input(id, InputMode::Queue, &["first"]), "in-crash");
    let first_answer = submit(&mut client, keyed_first.clone()).await;
    let first = queued(&first_answer);
    let (second, head) = enqueue(&mut client, id, "second").await;
    assert_eq!((first.position, second.position), (1, 2));
    server.kill().await;

    let mut server = start(2).await;
    let mut client = server.short_timeout_client().await;
    assert_eq!(
        waiting(&mut client, id).await,
        [first.clone(), second.clone()],
        "the waiting inputs survive"
    );
    let session = get(&mut client, id).await;
    assert_eq!(
        (session.revision, session.active_run_id.as_str()),
        (head, "run-a")
    );
    assert_eq!(submit(&mut client, keyed_first.clone()).await, first_answer);
    let taken = take(&mut client, id, "run-a").await;
    assert_eq!(taken.revision, head + 1);
    assert_took(&taken, &first, 0);
    server.kill().await;

    let server = start(3).await;
    let mut client = server.short_timeout_client().await;
    assert_eq!(
        waiting(&mut client, id).await,
        std::slice::from_ref(&second)
    );
    assert_eq!(revision(&mut client, id).await, head + 1);
    assert_eq!(all_messages(&mut client, id).await, taken.messages);
    assert_eq!(submit(&mut client, keyed_first).await, first_answer);
    let again = take(&mut client, id, "run-a").await;
    assert_took(&again, &second, 1);
    let status = take_err(&mut client, id, "run-a").await;
    assert_status(&status, Code::NotFound, "QUEUE_EMPTY");
    assert_eq!(history_texts(&mut client, id).await, ["first", "second"]);
    drop(server);
}
