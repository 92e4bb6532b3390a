//! Approvals: a decision asked for before a tool call of the history runs.
//!
//! RequestApproval records a pending approval for a tool call of the
//! current history (an OpenAI-style `ToolCall` or a `tool_use` block) in
//! one revision (`approval_requested`). DecideApproval approves or denies
//! it exactly once across clients and replicas, whatever run holds the
//! lease, in one revision (`approval_decided`); a denial appends the call's
//! tool result (`tool_error`, the reason as content) in that revision,
//! unless the call was answered or rolled back meanwhile. An approval nobody
//! decides expires at its `expire_time`: within 10 s on the server's own,
//! and before any later call reads or decides it. GetApproval and
//! ListApprovals read them, per tenant.
//!
//! Checked here, on every backend: the fields as stored and answered; the
//! refusals of both writes (unknown or answered calls, an approval that
//! exists, a past expire_time, a busy session, limits, unknown ids), each
//! writing nothing; retries by request id and every other call on a decided
//! approval; a dozen concurrent deciders (also split across two PostgreSQL
//! replicas); expiry, with and without a call; ListApprovals' filters, order
//! and pages; watch events; tenant isolation; how approvals meet EndRun,
//! lease expiry, RollbackSession, DeleteSession and ForkSession; and, with
//! the real binary, that a pending approval and a decision survive SIGKILL.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::support::*;

crate::backend_tests!(
    a_request_is_pending_until_approved,
    a_denial_appends_the_tool_result,
    a_redacted_denial_leaves_no_text_in_its_decision,
    refused_requests_write_nothing,
    refused_decisions_write_nothing,
    a_decision_is_taken_once_and_retries_answer_it,
    concurrent_deciders_agree_on_one_decision,
    an_approval_expires_on_its_own,
    an_expired_approval_is_settled_before_the_next_call,
    list_approvals_filters_orders_and_pages,
    approvals_outlive_runs_and_rollbacks,
    deletion_recreation_and_forks_leave_no_approvals,
    watchers_see_requests_and_decisions,
    another_tenants_session_is_unknown_to_approvals,
);
crate::postgres_tests!(deciders_on_two_replicas_agree_on_one_decision);

type Client = SessionStoreClient<Channel>;

/// The name of every OpenAI-style tool call the tests make.
const TOOL: &str = "delete_files";
/// Details in a layout no JSON encoder would produce: kept verbatim.
const DETAIL: &str = "{ \"paths\" : [\"/tmp/a\",\"/tmp/b\"],\n  \"force\":true, \"n\": 1.50 }";
/// How long a test waits for an expiry after its expire_time before failing.
const EXPIRY_PATIENCE: Duration = Duration::from_secs(15);
/// How often a test reads while it waits for an expiry.
const POLL: Duration = Duration::from_millis(100);
/// The most a title, and a detail_json or a reason, may hold (bytes).
const MAX_TITLE: usize = 1_024;
const MAX_TEXT: usize = 65_536;

// ---------------------------------------------------------------------------
// History

fn tool_call(id: &str) -> pb::ToolCall {
    pb::ToolCall {
        id: id.to_owned(),
        name: TOOL.to_owned(),
        arguments: "{}".to_owned(),
        signature: String::new(),
    }
}

/// An assistant message calling each of `ids` (OpenAI style, named [`TOOL`]).
fn calling(ids: &[&str]) -> pb::Message {
    pb::Message {
        tool_calls: ids.iter().map(|id| tool_call(id)).collect(),
        ..assistant("")
    }
}

/// An assistant message with one `tool_use` block (Anthropic style).
fn using(id: &str, name: &str) -> pb::Message {
    pb::Message {
        content_blocks: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::ToolUse(pb::ToolUseBlock {
                id: id.to_owned(),
                name: name.to_owned(),
                input: "{\"path\": \"/\"}".to_owned(),
                signature: String::new(),
            })),
        }],
        ..assistant("")
    }
}

/// A tool message answering `call` (OpenAI style).
fn answering(call: &str, output: &str) -> pb::Message {
    pb::Message {
        role: pb::Role::Tool.into(),
        content: output.to_owned(),
        tool_call_id: call.to_owned(),
        name: TOOL.to_owned(),
        ..Default::default()
    }
}

/// A user message with a `tool_result` block answering `tool_use_id`.
fn block_answering(tool_use_id: &str, output: &str) -> pb::Message {
    pb::Message {
        content_blocks: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::ToolResult(pb::ToolResultBlock {
                tool_use_id: tool_use_id.to_owned(),
                content: output.to_owned(),
                is_error: false,
            })),
        }],
        ..user("")
    }
}

/// Appends a question and a provider call whose response is `response`.
async fn append_turn(
    client: &mut Client,
    session: &str,
    response: Vec<pb::Message>,
) -> pb::AppendExchangeResponse {
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session.to_owned(),
            messages: vec![user("clean up, please")],
            provider_call: Some(call("gpt-tools", 10, 5, 42)),
            response_messages: response,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("append a turn to {session}: {status:?}"))
        .into_inner()
}

/// Appends client messages (tool results) without a provider call.
async fn append_messages(
    client: &mut Client,
    session: &str,
    messages: Vec<pb::Message>,
) -> pb::AppendExchangeResponse {
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session.to_owned(),
            messages,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("append to {session}: {status:?}"))
        .into_inner()
}

/// Creates `session` (alice's) with a turn whose answer calls `calls`:
/// revision 2, the question at sequence 0 and the calls at 1.
async fn session_calling(
    client: &mut Client,
    session: &str,
    calls: &[&str],
) -> pb::AppendExchangeResponse {
    create_owned(client, session, "alice").await;
    let turn = append_turn(client, session, vec![calling(calls)]).await;
    assert_eq!((turn.revision, turn.next_sequence), (2, 2));
    turn
}

async fn revision(client: &mut Client, session: &str) -> i64 {
    get(client, session).await.revision
}

async fn begin_run(client: &mut Client, session: &str, run: &str, seconds: i64) {
    client
        .begin_run(pb::BeginRunRequest {
            session_id: session.to_owned(),
            run_id: run.to_owned(),
            lease: Some(prost_types::Duration { seconds, nanos: 0 }),
        })
        .await
        .unwrap_or_else(|status| panic!("begin run {run}: {status:?}"));
}

async fn end_run(client: &mut Client, session: &str, run: &str) {
    client
        .end_run(pb::EndRunRequest {
            session_id: session.to_owned(),
            run_id: run.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("end run {run}: {status:?}"));
}

// ---------------------------------------------------------------------------
// Time

/// `offset` from now, in whole microseconds (what the server keeps).
fn from_now(offset: Duration) -> prost_types::Timestamp {
    let mut time = prost_types::Timestamp::from(SystemTime::now() + offset);
    time.nanos -= time.nanos % 1000;
    time
}

fn ago(offset: Duration) -> prost_types::Timestamp {
    let mut time = prost_types::Timestamp::from(SystemTime::now() - offset);
    time.nanos -= time.nanos % 1000;
    time
}

fn micros(time: &prost_types::Timestamp) -> i64 {
    time.seconds * 1_000_000 + i64::from(time.nanos) / 1000
}

fn now_micros() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(since_epoch.as_micros()).expect("micros fit")
}

/// How long until `time` (zero if it has passed).
fn until(time: &prost_types::Timestamp) -> Duration {
    Duration::from_micros(u64::try_from(micros(time) - now_micros()).unwrap_or(0))
}

// ---------------------------------------------------------------------------
// Requests

/// An approval of `call` in `session`, asked by no run, never expiring.
fn ask(session: &str, call: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        session_id: session.to_owned(),
        run_id: String::new(),
        tool_call_id: call.to_owned(),
        title: format!("Delete two files — {call}?"),
        detail_json: DETAIL.to_owned(),
        expire_time: None,
    }
}

async fn request(
    client: &mut Client,
    request: pb::RequestApprovalRequest,
) -> pb::RequestApprovalResponse {
    let label = format!(
        "request approval of {} in {}",
        request.tool_call_id, request.session_id
    );
    client
        .request_approval(request)
        .await
        .unwrap_or_else(|status| panic!("{label}: {status:?}"))
        .into_inner()
}

/// Asks for an approval and answers the pending approval.
async fn pending(client: &mut Client, ask: pb::RequestApprovalRequest) -> pb::Approval {
    request(client, ask).await.approval.expect("the approval")
}

async fn request_err(client: &mut Client, request: pb::RequestApprovalRequest) -> Status {
    let label = format!(
        "request approval of {} in {}",
        request.tool_call_id, request.session_id
    );
    match client.request_approval(request).await {
        Ok(answer) => panic!("{label} succeeded: {:?}", answer.into_inner()),
        Err(status) => status,
    }
}

/// `decision` on `approval` by alice, without a reason or a request id.
fn decision(approval: &pb::Approval, decision: pb::ApprovalDecision) -> pb::DecideApprovalRequest {
    pb::DecideApprovalRequest {
        session_id: approval.session_id.clone(),
        approval_id: approval.approval_id.clone(),
        decision: decision.into(),
        reason: String::new(),
        decided_by: "alice".to_owned(),
        request_id: String::new(),
    }
}

fn approve(approval: &pb::Approval) -> pb::DecideApprovalRequest {
    decision(approval, pb::ApprovalDecision::Approve)
}

fn deny(approval: &pb::Approval, reason: &str) -> pb::DecideApprovalRequest {
    pb::DecideApprovalRequest {
        reason: reason.to_owned(),
        ..decision(approval, pb::ApprovalDecision::Deny)
    }
}

async fn decide(
    client: &mut Client,
    request: pb::DecideApprovalRequest,
) -> pb::DecideApprovalResponse {
    let label = format!("decide {}", request.approval_id);
    client
        .decide_approval(request)
        .await
        .unwrap_or_else(|status| panic!("{label}: {status:?}"))
        .into_inner()
}

async fn decide_err(client: &mut Client, request: pb::DecideApprovalRequest) -> Status {
    let label = format!("decide {}", request.approval_id);
    match client.decide_approval(request).await {
        Ok(answer) => panic!("{label} succeeded: {:?}", answer.into_inner()),
        Err(status) => status,
    }
}

async fn get_approval(
    client: &mut Client,
    session: &str,
    approval_id: &str,
) -> Result<pb::Approval, Status> {
    client
        .get_approval(pb::GetApprovalRequest {
            session_id: session.to_owned(),
            approval_id: approval_id.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// `approval` as GetApproval answers it now.
async fn reread(client: &mut Client, approval: &pb::Approval) -> pb::Approval {
    get_approval(client, &approval.session_id, &approval.approval_id)
        .await
        .unwrap_or_else(|status| panic!("get approval {}: {status:?}", approval.approval_id))
}

/// A ListApprovals filter, pages of 100.
fn filter(session: &str, user: &str, state: pb::ApprovalState) -> pb::ListApprovalsRequest {
    pb::ListApprovalsRequest {
        session_id: session.to_owned(),
        user: user.to_owned(),
        state: state.into(),
        page_size: 100,
        page_token: String::new(),
    }
}

/// Every page ListApprovals answers for `request`, following page tokens.
async fn pages(
    client: &mut Client,
    mut request: pb::ListApprovalsRequest,
) -> Vec<Vec<pb::Approval>> {
    let mut out = Vec::new();
    loop {
        let page = client
            .list_approvals(request.clone())
            .await
            .unwrap_or_else(|status| panic!("list approvals {request:?}: {status:?}"))
            .into_inner();
        out.push(page.approvals);
        if page.next_page_token.is_empty() {
            return out;
        }
        assert!(out.len() < 100, "ListApprovals never ends: {request:?}");
        request.page_token = page.next_page_token;
    }
}

async fn list(client: &mut Client, request: pb::ListApprovalsRequest) -> Vec<pb::Approval> {
    pages(client, request).await.concat()
}

/// The session's approvals, any state.
async fn approvals_of(client: &mut Client, session: &str) -> Vec<pb::Approval> {
    list(client, filter(session, "", pb::ApprovalState::Unspecified)).await
}

fn ids(approvals: &[pb::Approval]) -> Vec<&str> {
    approvals.iter().map(|a| a.approval_id.as_str()).collect()
}

/// A well-formed approval id nobody has: `id` with its last character changed.
fn unknown_id(id: &str) -> String {
    let mut other = id.to_owned();
    let last = other.pop().expect("a non-empty id");
    other.push(if last == '0' { '1' } else { '0' });
    other
}

// ---------------------------------------------------------------------------
// Answers

/// RESOURCE_EXHAUSTED / LIMIT_EXCEEDED naming `field`.
#[track_caller]
fn assert_too_large(status: &Status, field: &str) {
    assert_status(status, Code::ResourceExhausted, "LIMIT_EXCEEDED");
    assert_names_field(status, Code::ResourceExhausted, field);
}

/// FAILED_PRECONDITION / APPROVAL_ALREADY_DECIDED naming `decided` (the
/// approval as decided): its id, state and decider.
#[track_caller]
fn assert_already_decided(status: &Status, decided: &pb::Approval, label: &str) {
    assert_eq!(
        (status.code(), error_details(status).0.as_deref()),
        (Code::FailedPrecondition, Some("APPROVAL_ALREADY_DECIDED")),
        "{label}: {status:?}"
    );
    let metadata = error_metadata(status);
    let named = |key: &str| metadata.get(key).map(String::as_str);
    assert_eq!(
        (named("approval_id"), named("state"), named("decided_by")),
        (
            Some(decided.approval_id.as_str()),
            Some(decided.state().as_str_name()),
            Some(decided.decided_by.as_str())
        ),
        "{label}: {status:?}"
    );
}

/// A denial's tool result: at `sequence` of `session`, a tool message
/// answering `call`, named `name`, flagged an error, the reason its content.
#[track_caller]
fn assert_denial_result(
    result: Option<&pb::StoredMessage>,
    session: &str,
    sequence: i64,
    call: &str,
    name: &str,
    reason: &str,
) {
    let stored = result.unwrap_or_else(|| panic!("the denial of {call} has no tool result"));
    assert_eq!(
        (stored.session_id.as_str(), stored.sequence),
        (session, sequence),
        "where the tool result of {call} is stored"
    );
    let message = stored.message.as_ref().expect("the tool result's message");
    assert_eq!(
        (
            message.role(),
            message.tool_call_id.as_str(),
            message.tool_error,
            message.name.as_str()
        ),
        (pb::Role::Tool, call, true, name),
        "the tool result of {call}"
    );
    assert!(
        message.content == reason,
        "the tool result's content is not the reason exactly: {} bytes, expected {}",
        message.content.len(),
        reason.len()
    );
}

/// `pending` as its decision should leave it: only the state, decider,
/// reason and decide_time change.
fn as_decided(pending: &pb::Approval, decided: &pb::Approval) -> pb::Approval {
    pb::Approval {
        state: decided.state,
        decided_by: decided.decided_by.clone(),
        reason: decided.reason.clone(),
        decide_time: decided.decide_time,
        ..pending.clone()
    }
}

// ---------------------------------------------------------------------------
// Events

fn approval_requested(event: &pb::SessionEvent) -> &pb::ApprovalRequested {
    match &event.event {
        Some(Event::ApprovalRequested(requested)) => requested,
        _ => panic!("expected approval_requested, got {event:?}"),
    }
}

fn approval_decided(event: &pb::SessionEvent) -> &pb::ApprovalDecided {
    match &event.event {
        Some(Event::ApprovalDecided(decided)) => decided,
        _ => panic!("expected approval_decided, got {event:?}"),
    }
}

/// A watch of `session` from its head, read through `caught_up`.
async fn watch_head(client: &mut Client, session: &str) -> Events {
    let head = revision(client, session).await;
    let mut events = watch(client, session, head).await;
    let caught_up = next_change(&mut events).await;
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
        let event = next_change(&mut events).await;
        if matches!(event.event, Some(Event::CaughtUp(_))) {
            return out;
        }
        out.push(event);
    }
}

// ---------------------------------------------------------------------------
// Requesting and deciding

/// RedactMessage of a denial's tool result erases its text from the
/// decision's event in the replay and from the answer to the decision's
/// retry, as from every other read. (The approval's own `reason`, which
/// the denial's text repeats, is the decision's, and stays.)
async fn a_redacted_denial_leaves_no_text_in_its_decision(backend: Backend) {
    const SECRET: &str = "the secret reason nobody may read again";
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_redacted_denial";
    session_calling(&mut client, id, &["call_1"]).await;
    let approval = pending(&mut client, ask(id, "call_1")).await;
    let denial = pb::DecideApprovalRequest {
        request_id: "deny-once".to_owned(),
        ..deny(&approval, SECRET)
    };
    let denied = decide(&mut client, denial.clone()).await;
    let result = denied.tool_result.clone().expect("a denial's tool result");
    assert!(format!("{result:?}").contains(SECRET));

    client
        .redact_message(pb::RedactMessageRequest {
            session_id: id.to_owned(),
            message_id: result.id.clone(),
            reason: "privacy".to_owned(),
            ..Default::default()
        })
        .await
        .expect("redact the denial's tool result");

    let events = replay(&mut client, id, 0).await;
    let decided = events
        .iter()
        .find(|event| matches!(event.event, Some(Event::ApprovalDecided(_))))
        .expect("the decision in the replay");
    let decided = approval_decided(decided);
    let kept = decided
        .tool_result
        .as_ref()
        .expect("the decision's tool result");
    assert_eq!(kept.id, result.id);
    assert!(kept.redacted, "{kept:?}");
    // (The approval keeps its reason: a field of the decision, not of
    // the message.)
    assert!(!format!("{kept:?}").contains(SECRET), "{kept:?}");
    assert_eq!(
        decided.approval.as_ref().map(|a| a.reason.as_str()),
        Some(SECRET)
    );

    let retried = decide(&mut client, denial).await;
    let answered = retried.tool_result.expect("the retry's tool result");
    assert!(answered.redacted, "{answered:?}");
    assert!(!format!("{answered:?}").contains(SECRET));
    let stored = all_messages(&mut client, id).await;
    assert!(!format!("{stored:?}").contains(SECRET));
}

async fn a_request_is_pending_until_approved(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_approve";
    session_calling(&mut client, id, &["call_1", "call_2"]).await;
    let history = all_messages(&mut client, id).await;

    let asked = request(&mut client, ask(id, "call_1")).await;
    assert_eq!(asked.revision, 3, "one revision");
    let pending = asked.approval.clone().expect("the approval");
    assert!(pending.approval_id.starts_with("apr_"), "{pending:?}");
    let expected_title = ask(id, "call_1").title;
    assert_eq!(
        (
            pending.session_id.as_str(),
            pending.run_id.as_str(),
            pending.tool_call_id.as_str(),
            pending.title.as_str(),
            pending.detail_json.as_str(),
        ),
        (id, "", "call_1", expected_title.as_str(), DETAIL),
        "{pending:?}"
    );
    assert_eq!(pending.state(), pb::ApprovalState::Pending);
    assert_eq!(
        (pending.decided_by.as_str(), pending.reason.as_str()),
        ("", "")
    );
    assert!(pending.create_time.is_some(), "{pending:?}");
    assert!(pending.decide_time.is_none(), "{pending:?}");
    assert!(pending.expire_time.is_none(), "unset: never: {pending:?}");
    assert_eq!(reread(&mut client, &pending).await, pending);
    assert_eq!(revision(&mut client, id).await, 3);
    assert_eq!(all_messages(&mut client, id).await, history);

    // Asked again while pending: the existing one is named.
    let exists = request_err(&mut client, ask(id, "call_1")).await;
    assert_status(&exists, Code::AlreadyExists, "APPROVAL_EXISTS");
    assert_eq!(
        error_metadata(&exists).get("approval_id"),
        Some(&pending.approval_id)
    );

    // Approved: one revision, nothing appended.
    let approved = decide(
        &mut client,
        pb::DecideApprovalRequest {
            reason: "scratch files".into(),
            decided_by: "bob".into(),
            request_id: "dec-approve".into(),
            ..approve(&pending)
        },
    )
    .await;
    assert_eq!(approved.revision, 4, "one revision");
    assert!(approved.tool_result.is_none(), "{approved:?}");
    let decided = approved.approval.clone().expect("the approval");
    assert_eq!(decided.state(), pb::ApprovalState::Approved);
    assert_eq!(
        (decided.decided_by.as_str(), decided.reason.as_str()),
        ("bob", "scratch files")
    );
    let decide_time = decided.decide_time.as_ref().expect("decide_time");
    let create_time = pending.create_time.as_ref().expect("create_time");
    assert!(micros(decide_time) >= micros(create_time), "{decided:?}");
    assert_eq!(as_decided(&pending, &decided), decided);
    assert_eq!(reread(&mut client, &pending).await, decided);
    let session = get(&mut client, id).await;
    assert_eq!((session.revision, session.next_sequence), (4, 2));
    assert_eq!(all_messages(&mut client, id).await, history);

    // Approved, the call still has its approval.
    let exists = request_err(&mut client, ask(id, "call_1")).await;
    assert_status(&exists, Code::AlreadyExists, "APPROVAL_EXISTS");
    assert_eq!(
        error_metadata(&exists).get("approval_id"),
        Some(&pending.approval_id)
    );
    assert_eq!(revision(&mut client, id).await, 4);

    // A run id and an expire_time are kept as given.
    let expire = from_now(Duration::from_secs(3600));
    let timed = request(
        &mut client,
        pb::RequestApprovalRequest {
            run_id: "run-x".into(),
            expire_time: Some(expire),
            ..ask(id, "call_2")
        },
    )
    .await;
    assert_eq!(timed.revision, 5);
    let timed = timed.approval.expect("the approval");
    assert_ne!(timed.approval_id, pending.approval_id);
    assert_eq!(
        (timed.run_id.as_str(), timed.expire_time),
        ("run-x", Some(expire))
    );
    assert_eq!(timed.state(), pb::ApprovalState::Pending);
    server.stop().await.expect("stop");
}

async fn a_denial_appends_the_tool_result(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_deny";
    session_calling(&mut client, id, &["call_1"]).await;
    let asked = pending(&mut client, ask(id, "call_1")).await;

    let denied = decide(
        &mut client,
        pb::DecideApprovalRequest {
            decided_by: "bob".into(),
            ..deny(&asked, "not on prod")
        },
    )
    .await;
    assert_eq!(
        denied.revision, 4,
        "the decision and its tool result: one revision"
    );
    let decided = denied.approval.clone().expect("the approval");
    assert_eq!(decided.state(), pb::ApprovalState::Denied);
    assert_eq!(
        (decided.decided_by.as_str(), decided.reason.as_str()),
        ("bob", "not on prod")
    );
    assert_eq!(as_decided(&asked, &decided), decided);
    assert_denial_result(
        denied.tool_result.as_ref(),
        id,
        2,
        "call_1",
        TOOL,
        "not on prod",
    );
    let result = denied.tool_result.clone().expect("the tool result");

    // Stored where every read sees it.
    let messages = all_messages(&mut client, id).await;
    assert_eq!(messages.len(), 3);
    assert_eq!(messages.last(), Some(&result));
    let exported = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: id.into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(exported.len(), 3);
    assert_eq!(exported.last(), result.message.as_ref());
    let session = get(&mut client, id).await;
    assert_eq!((session.revision, session.next_sequence), (4, 3));
    assert_eq!(reread(&mut client, &asked).await, decided);

    // The call is answered now.
    let answered = request_err(&mut client, ask(id, "call_1")).await;
    assert_status(&answered, Code::FailedPrecondition, "TOOL_CALL_ANSWERED");

    // A tool_use block denied without a reason: an empty tool result named
    // after the block.
    let turn = append_turn(&mut client, id, vec![using("toolu_1", "rm_rf")]).await;
    assert_eq!((turn.revision, turn.next_sequence), (5, 5));
    let asked = pending(&mut client, ask(id, "toolu_1")).await;
    assert_eq!(asked.tool_call_id, "toolu_1");
    let denied = decide(&mut client, deny(&asked, "")).await;
    assert_eq!(denied.revision, 7);
    assert_denial_result(denied.tool_result.as_ref(), id, 5, "toolu_1", "rm_rf", "");
    let messages = all_messages(&mut client, id).await;
    assert_eq!(messages.last(), denied.tool_result.as_ref());
    let answered = request_err(&mut client, ask(id, "toolu_1")).await;
    assert_status(&answered, Code::FailedPrecondition, "TOOL_CALL_ANSWERED");
    server.stop().await.expect("stop");
}

async fn refused_requests_write_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_refuse";
    session_calling(&mut client, id, &["call_open", "call_done"]).await;
    append_messages(&mut client, id, vec![answering("call_done", "removed")]).await;
    append_turn(&mut client, id, vec![using("toolu_done", "rm_rf")]).await;
    append_messages(
        &mut client,
        id,
        vec![block_answering("toolu_done", "removed")],
    )
    .await;
    let head = revision(&mut client, id).await;
    let history = all_messages(&mut client, id).await;

    let failed = |code: Code, reason: &'static str| (code, Some(reason), None);
    let invalid = |code: Code, field: &'static str| (code, None, Some(field));
    let cases = [
        (
            "a call nobody made",
            ask(id, "call_nobody"),
            failed(Code::FailedPrecondition, "UNKNOWN_TOOL_CALL"),
        ),
        (
            "a tool's name, not a call's id",
            ask(id, TOOL),
            failed(Code::FailedPrecondition, "UNKNOWN_TOOL_CALL"),
        ),
        (
            "a call a tool message answers",
            ask(id, "call_done"),
            failed(Code::FailedPrecondition, "TOOL_CALL_ANSWERED"),
        ),
        (
            "a tool_use a tool_result block answers",
            ask(id, "toolu_done"),
            failed(Code::FailedPrecondition, "TOOL_CALL_ANSWERED"),
        ),
        (
            "an expire_time in the past",
            pb::RequestApprovalRequest {
                expire_time: Some(ago(Duration::from_secs(1))),
                ..ask(id, "call_open")
            },
            invalid(Code::InvalidArgument, "expire_time"),
        ),
        (
            "a title over the limit",
            pb::RequestApprovalRequest {
                title: "t".repeat(MAX_TITLE + 1),
                ..ask(id, "call_open")
            },
            invalid(Code::ResourceExhausted, "title"),
        ),
        (
            "details over the limit",
            pb::RequestApprovalRequest {
                detail_json: format!("\"{}\"", "d".repeat(MAX_TEXT - 1)),
                ..ask(id, "call_open")
            },
            invalid(Code::ResourceExhausted, "detail_json"),
        ),
        (
            "an unknown session",
            ask("ses_nosuch", "call_open"),
            (Code::NotFound, None, None),
        ),
    ];
    for (label, ask, (code, reason, field)) in cases {
        let status = request_err(&mut client, ask).await;
        assert_eq!(status.code(), code, "{label}: {status:?}");
        let (got_reason, got_field) = error_details(&status);
        if let Some(reason) = reason {
            assert_eq!(got_reason.as_deref(), Some(reason), "{label}: {status:?}");
        }
        if let Some(field) = field {
            assert_eq!(got_field.as_deref(), Some(field), "{label}: {status:?}");
            if code == Code::ResourceExhausted {
                assert_too_large(&status, field);
            }
        }
    }
    assert_eq!(
        revision(&mut client, id).await,
        head,
        "a refused request wrote"
    );
    assert!(approvals_of(&mut client, id).await.is_empty());

    // Another run holds the lease: busy for run B and for no run.
    begin_run(&mut client, id, "run-a", 60).await;
    let head = head + 1;
    for run in ["run-b", ""] {
        let busy = request_err(
            &mut client,
            pb::RequestApprovalRequest {
                run_id: run.into(),
                ..ask(id, "call_open")
            },
        )
        .await;
        assert_status(&busy, Code::FailedPrecondition, "SESSION_BUSY");
    }
    assert_eq!(
        revision(&mut client, id).await,
        head,
        "a refused request wrote"
    );
    assert!(approvals_of(&mut client, id).await.is_empty());
    assert_eq!(all_messages(&mut client, id).await, history);

    // The lease's run may ask, with a title and details at their limits.
    let title = "t".repeat(MAX_TITLE);
    let detail = format!("\"{}\"", "d".repeat(MAX_TEXT - 2));
    let asked = request(
        &mut client,
        pb::RequestApprovalRequest {
            run_id: "run-a".into(),
            title: title.clone(),
            detail_json: detail.clone(),
            ..ask(id, "call_open")
        },
    )
    .await;
    assert_eq!(asked.revision, head + 1);
    let approval = asked.approval.expect("the approval");
    assert_eq!(approval.run_id, "run-a");
    assert!(approval.title == title, "the title is kept whole");
    assert!(approval.detail_json == detail, "the details are kept whole");
    server.stop().await.expect("stop");
}

async fn refused_decisions_write_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    session_calling(&mut client, "ses_decide", &["call_1"]).await;
    session_calling(&mut client, "ses_other", &["call_1"]).await;
    let mine = pending(&mut client, ask("ses_decide", "call_1")).await;
    let theirs = pending(&mut client, ask("ses_other", "call_1")).await;
    let heads = (
        revision(&mut client, "ses_decide").await,
        revision(&mut client, "ses_other").await,
    );
    let nobodys = unknown_id(&mine.approval_id);

    let too_long = "r".repeat(MAX_TEXT + 1);
    let cases = [
        (
            "no decision",
            decision(&mine, pb::ApprovalDecision::Unspecified),
            (Code::InvalidArgument, None, Some("decision")),
        ),
        (
            "a denial's reason over the limit",
            deny(&mine, &too_long),
            (
                Code::ResourceExhausted,
                Some("LIMIT_EXCEEDED"),
                Some("reason"),
            ),
        ),
        (
            "an approval's reason over the limit",
            pb::DecideApprovalRequest {
                reason: too_long.clone(),
                ..approve(&mine)
            },
            (
                Code::ResourceExhausted,
                Some("LIMIT_EXCEEDED"),
                Some("reason"),
            ),
        ),
        (
            "an approval id nobody has",
            pb::DecideApprovalRequest {
                approval_id: nobodys.clone(),
                ..approve(&mine)
            },
            (Code::NotFound, Some("APPROVAL_NOT_FOUND"), None),
        ),
        (
            "another session's approval",
            pb::DecideApprovalRequest {
                approval_id: theirs.approval_id.clone(),
                ..approve(&mine)
            },
            (Code::NotFound, Some("APPROVAL_NOT_FOUND"), None),
        ),
        (
            "an unknown session",
            pb::DecideApprovalRequest {
                session_id: "ses_nosuch".into(),
                ..approve(&mine)
            },
            (Code::NotFound, None, None),
        ),
    ];
    for (label, request, (code, reason, field)) in cases {
        let status = decide_err(&mut client, request).await;
        assert_eq!(status.code(), code, "{label}: {status:?}");
        let (got_reason, got_field) = error_details(&status);
        if let Some(reason) = reason {
            assert_eq!(got_reason.as_deref(), Some(reason), "{label}: {status:?}");
        }
        if let Some(field) = field {
            assert_eq!(got_field.as_deref(), Some(field), "{label}: {status:?}");
        }
    }

    // GetApproval: the same ids are unknown to the session.
    for (session, approval_id) in [
        ("ses_decide", nobodys.as_str()),
        ("ses_decide", theirs.approval_id.as_str()),
        ("ses_other", mine.approval_id.as_str()),
    ] {
        let status = get_approval(&mut client, session, approval_id)
            .await
            .expect_err("no such approval in the session");
        assert_status(&status, Code::NotFound, "APPROVAL_NOT_FOUND");
    }
    let status = get_approval(&mut client, "ses_nosuch", &mine.approval_id)
        .await
        .expect_err("no such session");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Nothing was written, nothing decided.
    assert_eq!(
        (
            revision(&mut client, "ses_decide").await,
            revision(&mut client, "ses_other").await
        ),
        heads
    );
    assert_eq!(reread(&mut client, &mine).await, mine);
    assert_eq!(reread(&mut client, &theirs).await, theirs);
    assert_eq!(all_messages(&mut client, "ses_decide").await.len(), 2);

    // A reason at the limit is taken, whole, into the tool result.
    let at_limit = "r".repeat(MAX_TEXT);
    let denied = decide(&mut client, deny(&mine, &at_limit)).await;
    assert_eq!(denied.revision, heads.0 + 1);
    assert_denial_result(
        denied.tool_result.as_ref(),
        "ses_decide",
        2,
        "call_1",
        TOOL,
        &at_limit,
    );
    let decided = denied.approval.expect("the approval");
    assert!(decided.reason == at_limit, "the reason is kept whole");
    server.stop().await.expect("stop");
}

async fn a_decision_is_taken_once_and_retries_answer_it(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_once";
    session_calling(&mut client, id, &["call_1", "call_2"]).await;
    let asked = pending(&mut client, ask(id, "call_1")).await;

    let keyed = pb::DecideApprovalRequest {
        decided_by: "bob".into(),
        request_id: "dec-1".into(),
        ..deny(&asked, "too risky")
    };
    let first = decide(&mut client, keyed.clone()).await;
    let head = revision(&mut client, id).await;
    assert_eq!(first.revision, head);
    let history = all_messages(&mut client, id).await;
    assert_eq!(history.last(), first.tool_result.as_ref());

    // A retry answers the first decision whole and writes nothing.
    let retry = decide(&mut client, keyed.clone()).await;
    assert_eq!(retry, first, "the retry answers the first decision");
    assert_eq!(revision(&mut client, id).await, head, "a retry wrote");
    assert_eq!(all_messages(&mut client, id).await, history);

    // Every other call on it is refused, naming the decision.
    let decided = first.approval.clone().expect("the approval");
    let others = [
        (
            "another decision, the same key",
            pb::DecideApprovalRequest {
                decision: pb::ApprovalDecision::Approve.into(),
                ..keyed.clone()
            },
        ),
        (
            "another reason, the same key",
            pb::DecideApprovalRequest {
                reason: "risky".into(),
                ..keyed.clone()
            },
        ),
        (
            "another decider, the same key",
            pb::DecideApprovalRequest {
                decided_by: "carol".into(),
                ..keyed.clone()
            },
        ),
        (
            "the same decision, another key",
            pb::DecideApprovalRequest {
                request_id: "dec-2".into(),
                ..keyed.clone()
            },
        ),
        (
            "the same decision, no key",
            pb::DecideApprovalRequest {
                request_id: String::new(),
                ..keyed.clone()
            },
        ),
        (
            "another client's approval",
            pb::DecideApprovalRequest {
                request_id: "dec-3".into(),
                ..approve(&asked)
            },
        ),
    ];
    for (label, request) in others {
        let status = decide_err(&mut client, request).await;
        assert_already_decided(&status, &decided, label);
    }
    assert_eq!(
        revision(&mut client, id).await,
        head,
        "a refused decision wrote"
    );
    assert_eq!(all_messages(&mut client, id).await, history);
    assert_eq!(reread(&mut client, &asked).await, decided);

    // Later writes do not change what the retry answers.
    append_messages(&mut client, id, vec![user("and now?")]).await;
    let later = decide(&mut client, keyed.clone()).await;
    assert_eq!(later, first, "a later retry answers the first decision");
    assert_eq!(revision(&mut client, id).await, head + 1);

    // The same for an approval.
    let asked = pending(&mut client, ask(id, "call_2")).await;
    let keyed = pb::DecideApprovalRequest {
        decided_by: "bob".into(),
        request_id: "dec-4".into(),
        ..approve(&asked)
    };
    let first = decide(&mut client, keyed.clone()).await;
    let head = revision(&mut client, id).await;
    assert_eq!(first.revision, head);
    assert_eq!(decide(&mut client, keyed.clone()).await, first);
    assert_eq!(revision(&mut client, id).await, head, "a retry wrote");
    let decided = first.approval.clone().expect("the approval");
    let status = decide_err(
        &mut client,
        pb::DecideApprovalRequest {
            request_id: "dec-5".into(),
            ..deny(&asked, "changed my mind")
        },
    )
    .await;
    assert_already_decided(&status, &decided, "a denial after the approval");
    assert_eq!(
        revision(&mut client, id).await,
        head,
        "a refused decision wrote"
    );
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Concurrent deciders

/// How many clients decide one approval at once.
const DECIDERS: usize = 12;

/// Decider `i`'s call: approve if `i` is even, deny if odd, each with its
/// own request id, reason and name.
fn decider(pending: &pb::Approval, i: usize) -> pb::DecideApprovalRequest {
    let verdict = if i.is_multiple_of(2) {
        pb::ApprovalDecision::Approve
    } else {
        pb::ApprovalDecision::Deny
    };
    pb::DecideApprovalRequest {
        reason: format!("decider {i} decides"),
        decided_by: format!("decider-{i}"),
        request_id: format!("{}-{i}", pending.approval_id),
        ..decision(pending, verdict)
    }
}

/// A round: a new tool call in `session`, asked for, then decided by
/// [`DECIDERS`] clients at once (round robin over `endpoints`): exactly one
/// succeeds, every other is told who did, and one revision is written.
async fn deciders_race(client: &mut Client, endpoints: &[String], session: &str, round: usize) {
    let call = format!("call_r{round}");
    append_turn(client, session, vec![calling(&[call.as_str()])]).await;
    let asked = request(client, ask(session, &call)).await;
    let approval = asked.approval.expect("the approval");
    let messages = all_messages(client, session).await.len();

    let start = Arc::new(tokio::sync::Barrier::new(DECIDERS));
    let mut tasks = Vec::new();
    for i in 0..DECIDERS {
        let endpoint = endpoints[i % endpoints.len()].clone();
        let request = decider(&approval, i);
        let start = Arc::clone(&start);
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&endpoint).await;
            start.wait().await;
            client
                .decide_approval(request)
                .await
                .map(tonic::Response::into_inner)
        }));
    }
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.expect("decider task") {
            Ok(answer) => won.push((i, answer)),
            Err(status) => lost.push((i, status)),
        }
    }
    assert_eq!(
        won.len(),
        1,
        "round {round}: exactly one decider wins: {won:?}"
    );
    let (winner, answer) = won.pop().expect("a winner");
    let decided = answer.approval.clone().expect("the approval");
    let denied = winner % 2 == 1;
    let expected_state = if denied {
        pb::ApprovalState::Denied
    } else {
        pb::ApprovalState::Approved
    };
    assert_eq!(
        (decided.state(), decided.decided_by.as_str()),
        (expected_state, format!("decider-{winner}").as_str()),
        "round {round}"
    );
    for (i, status) in &lost {
        assert_already_decided(status, &decided, &format!("round {round}, decider {i}"));
    }
    assert_eq!(answer.revision, asked.revision + 1, "round {round}");
    assert_eq!(
        revision(client, session).await,
        asked.revision + 1,
        "round {round}: one decision, one revision"
    );
    let after = all_messages(client, session).await;
    if denied {
        assert_denial_result(
            answer.tool_result.as_ref(),
            session,
            i64::try_from(messages).expect("sequence"),
            &call,
            TOOL,
            &format!("decider {winner} decides"),
        );
        assert_eq!(after.last(), answer.tool_result.as_ref());
    } else {
        assert!(answer.tool_result.is_none(), "{answer:?}");
    }
    assert_eq!(after.len(), messages + usize::from(denied), "round {round}");
    assert_eq!(reread(client, &approval).await, decided);
}

async fn concurrent_deciders_agree_on_one_decision(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create_owned(&mut client, "ses_race", "alice").await;
    for round in 0..4 {
        deciders_race(&mut client, &[server.endpoint()], "ses_race", round).await;
    }
    server.stop().await.expect("stop");
}

/// Two replicas of one database: deciders split across both agree on one
/// decision, and a keyed decision retried on the other replica answers the
/// first.
async fn deciders_on_two_replicas_agree_on_one_decision() {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let a = TestServer::start_on(storage, |_| {}).await;
    let b = TestServer::start_with(url, None, |_| {}).await;
    let (mut on_a, mut on_b) = (a.client().await, b.client().await);
    let id = "ses_replicas";
    create_owned(&mut on_a, id, "alice").await;
    for round in 0..6 {
        deciders_race(&mut on_a, &[a.endpoint(), b.endpoint()], id, round).await;
    }

    append_turn(&mut on_a, id, vec![calling(&["call_keyed"])]).await;
    let asked = pending(&mut on_b, ask(id, "call_keyed")).await;
    let keyed = pb::DecideApprovalRequest {
        request_id: "dec-keyed".into(),
        ..deny(&asked, "not from here")
    };
    let first = decide(&mut on_a, keyed.clone()).await;
    let retried = decide(&mut on_b, keyed.clone()).await;
    assert_eq!(retried, first, "the retry on b answers the decision on a");
    assert_eq!(
        revision(&mut on_b, id).await,
        first.revision,
        "the retry wrote"
    );
    let status = decide_err(
        &mut on_b,
        pb::DecideApprovalRequest {
            request_id: "dec-other".into(),
            ..approve(&asked)
        },
    )
    .await;
    let decided = first.approval.expect("the approval");
    assert_already_decided(&status, &decided, "another decision on b");
    b.stop().await.expect("stop b");
    a.stop().await.expect("stop a");
}

// ---------------------------------------------------------------------------
// Expiry

/// Reads `approval` every [`POLL`] until it answers EXPIRED: a read sent
/// before `expire_time` may answer PENDING, one sent after it must answer
/// EXPIRED, and none answers EXPIRED before that time.
async fn read_until_expired(
    client: &mut Client,
    approval: &pb::Approval,
    expire_time: &prost_types::Timestamp,
) -> pb::Approval {
    let expiry = micros(expire_time);
    let deadline = tokio::time::Instant::now() + until(expire_time) + EXPIRY_PATIENCE;
    let mut interval = tokio::time::interval(POLL);
    loop {
        interval.tick().await;
        let sent = now_micros();
        let read = reread(client, approval).await;
        let answered = now_micros();
        match read.state() {
            pb::ApprovalState::Pending => assert!(
                sent < expiry,
                "a read sent {} µs after expire_time answered PENDING: {read:?}",
                sent - expiry
            ),
            pb::ApprovalState::Expired => {
                assert!(
                    answered >= expiry,
                    "EXPIRED before its expire_time: {read:?}"
                );
                return read;
            }
            _ => panic!("expected PENDING, then EXPIRED: {read:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} still pending {EXPIRY_PATIENCE:?} after its expire_time",
            approval.approval_id
        );
    }
}

/// Checks an expired approval: `pending` with state EXPIRED, no decider,
/// a decide_time no earlier than its expire_time.
#[track_caller]
fn assert_expired(expired: &pb::Approval, pending: &pb::Approval) {
    assert_eq!(expired.state(), pb::ApprovalState::Expired, "{expired:?}");
    assert_eq!(
        expired.decided_by, "",
        "an expiry has no decider: {expired:?}"
    );
    let expire_time = pending.expire_time.as_ref().expect("an expire_time");
    let decide_time = expired.decide_time.as_ref().unwrap_or_else(|| {
        panic!("an expired approval without decide_time: {expired:?}");
    });
    assert!(
        micros(decide_time) >= micros(expire_time),
        "decided before its expire_time: {expired:?}"
    );
    assert_eq!(as_decided(pending, expired), *expired);
}

/// With no call at all after the request, the server records the expiry
/// on its own, within 10 s of expire_time, and a watcher sees it.
async fn an_approval_expires_on_its_own(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_expire";
    session_calling(&mut client, id, &["call_1"]).await;
    let history = all_messages(&mut client, id).await;
    let expire = from_now(Duration::from_secs(2));
    let asked = request(
        &mut client,
        pb::RequestApprovalRequest {
            expire_time: Some(expire),
            ..ask(id, "call_1")
        },
    )
    .await;
    let pending = asked.approval.clone().expect("the approval");
    assert_eq!(pending.expire_time, Some(expire));
    let mut events = watch_head(&mut client, id).await;

    // No call until the watcher sees the expiry.
    let event = next_change(&mut events).await;
    let seen = now_micros();
    assert_eq!(
        event.revision,
        asked.revision + 1,
        "one revision: {event:?}"
    );
    let recorded = micros(event.time.as_ref().expect("the event's time"));
    assert!(
        recorded >= micros(&expire),
        "expired {} µs before its expire_time",
        micros(&expire) - recorded
    );
    assert!(
        recorded <= micros(&expire) + 10_000_000 && seen <= micros(&expire) + 10_000_000,
        "expiry recorded {} µs and seen {} µs after expire_time, not within 10 s",
        recorded - micros(&expire),
        seen - micros(&expire)
    );
    let decided = approval_decided(&event);
    let expired = decided.approval.clone().expect("the approval");
    assert_expired(&expired, &pending);
    assert!(
        decided.tool_result.is_none(),
        "an expiry appends nothing: {event:?}"
    );
    assert_eq!(decided.next_sequence, 2);

    assert_eq!(reread(&mut client, &pending).await, expired);
    assert_eq!(revision(&mut client, id).await, event.revision);
    assert_eq!(all_messages(&mut client, id).await, history);
    assert_eq!(
        list(&mut client, filter(id, "", pb::ApprovalState::Expired)).await,
        std::slice::from_ref(&expired)
    );

    // Too late to decide.
    for request in [approve(&pending), deny(&pending, "late")] {
        let status = decide_err(&mut client, request).await;
        assert_status(&status, Code::FailedPrecondition, "APPROVAL_EXPIRED");
    }
    assert_eq!(
        revision(&mut client, id).await,
        event.revision,
        "a refused decision wrote"
    );

    // The call may be asked for again.
    let again = request(&mut client, ask(id, "call_1")).await;
    assert_eq!(again.revision, event.revision + 1);
    let again = again.approval.expect("the approval");
    assert_ne!(again.approval_id, pending.approval_id);
    assert_eq!(again.state(), pb::ApprovalState::Pending);
    assert_eq!(
        list(&mut client, filter(id, "", pb::ApprovalState::Pending)).await,
        [again]
    );
    server.stop().await.expect("stop");
}

/// With no sweep in sight, the first call after expire_time that reads or
/// decides an approval finds it expired (and the expiry recorded).
async fn an_expired_approval_is_settled_before_the_next_call(backend: Backend) {
    let storage = Storage::new(backend).await;
    let server = TestServer::start_on(storage, |config| config.sweep_interval_ms = 3_600_000).await;
    let mut client = server.client().await;
    let id = "ses_settle";
    session_calling(&mut client, id, &["call_read", "call_decide"]).await;
    let expire = from_now(Duration::from_secs(2));
    let timed = |call: &str| pb::RequestApprovalRequest {
        expire_time: Some(expire),
        ..ask(id, call)
    };
    let read = pending(&mut client, timed("call_read")).await;
    let decided = pending(&mut client, timed("call_decide")).await;
    assert_eq!(revision(&mut client, id).await, 4);

    // Read: PENDING until expire_time, EXPIRED from then on.
    let expired = read_until_expired(&mut client, &read, &expire).await;
    assert_expired(&expired, &read);

    // The first call on the other one is a decision: too late.
    let status = decide_err(&mut client, approve(&decided)).await;
    assert_status(&status, Code::FailedPrecondition, "APPROVAL_EXPIRED");
    assert_expired(&reread(&mut client, &decided).await, &decided);

    // Each expiry is one revision, and appends nothing.
    assert_eq!(revision(&mut client, id).await, 6);
    assert_eq!(all_messages(&mut client, id).await.len(), 2);
    let events = replay(&mut client, id, 4).await;
    assert_eq!(
        events.iter().map(|e| e.revision).collect::<Vec<_>>(),
        [5, 6]
    );
    let mut expired_ids = Vec::new();
    for event in &events {
        let decided = approval_decided(event);
        let approval = decided.approval.as_ref().expect("the approval");
        assert_eq!(approval.state(), pb::ApprovalState::Expired, "{event:?}");
        assert!(decided.tool_result.is_none(), "{event:?}");
        assert_eq!(decided.next_sequence, 2);
        expired_ids.push(approval.approval_id.clone());
    }
    expired_ids.sort();
    let mut expected = vec![read.approval_id.clone(), decided.approval_id.clone()];
    expected.sort();
    assert_eq!(expired_ids, expected);

    // Both calls may be asked for again.
    for call in ["call_read", "call_decide"] {
        let again = pending(&mut client, ask(id, call)).await;
        assert_eq!(again.state(), pb::ApprovalState::Pending);
    }
    assert_eq!(revision(&mut client, id).await, 8);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Listing

async fn list_approvals_filters_orders_and_pages(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    for (session, owner, calls) in [
        ("ses_a1", "alice", ["call_1", "call_2"].as_slice()),
        ("ses_b", "bob", ["call_1", "call_2"].as_slice()),
        ("ses_a2", "alice", ["call_1"].as_slice()),
    ] {
        create_owned(&mut client, session, owner).await;
        append_turn(&mut client, session, vec![calling(calls)]).await;
    }
    let owner = |approval: &pb::Approval| {
        if approval.session_id == "ses_b" {
            "bob"
        } else {
            "alice"
        }
    };
    let mut asked = Vec::new();
    for (session, call) in [
        ("ses_a1", "call_1"),
        ("ses_b", "call_1"),
        ("ses_a1", "call_2"),
        ("ses_a2", "call_1"),
        ("ses_b", "call_2"),
    ] {
        asked.push(pending(&mut client, ask(session, call)).await);
    }
    decide(&mut client, approve(&asked[1])).await;
    decide(&mut client, deny(&asked[2], "no")).await;
    let mut current = Vec::new();
    for approval in &asked {
        current.push(reread(&mut client, approval).await);
    }
    // Oldest first: create_time, then approval_id.
    current.sort_by(|x, y| {
        let key = |a: &pb::Approval| {
            (
                micros(a.create_time.as_ref().expect("create_time")),
                a.approval_id.clone(),
            )
        };
        key(x).cmp(&key(y))
    });

    use pb::ApprovalState::{Approved, Denied, Expired, Pending, Unspecified};
    let cases = [
        ("", "", Unspecified, 5),
        ("ses_a1", "", Unspecified, 2),
        ("ses_b", "", Unspecified, 2),
        ("", "alice", Unspecified, 3),
        ("", "bob", Unspecified, 2),
        ("", "carol", Unspecified, 0),
        ("", "", Pending, 3),
        ("", "", Approved, 1),
        ("", "", Denied, 1),
        ("", "", Expired, 0),
        ("", "alice", Pending, 2),
        ("ses_a1", "", Denied, 1),
        ("ses_b", "bob", Unspecified, 2),
        ("ses_b", "alice", Unspecified, 0),
        ("ses_a2", "alice", Pending, 1),
    ];
    for (session, user, state, count) in cases {
        let expected: Vec<pb::Approval> = current
            .iter()
            .filter(|a| session.is_empty() || a.session_id == session)
            .filter(|a| user.is_empty() || owner(a) == user)
            .filter(|a| state == Unspecified || a.state() == state)
            .cloned()
            .collect();
        assert_eq!(expected.len(), count, "the test's own expectation");
        let listed = list(&mut client, filter(session, user, state)).await;
        assert_eq!(
            ids(&listed),
            ids(&expected),
            "session {session:?}, user {user:?}, state {state:?}"
        );
        assert_eq!(listed, expected, "listed as GetApproval answers them");
    }

    // Pages of two over the five: three pages, the same order.
    let paged = pages(
        &mut client,
        pb::ListApprovalsRequest {
            page_size: 2,
            ..filter("", "", Unspecified)
        },
    )
    .await;
    assert_eq!(paged.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(paged.concat(), current);
    // Filtered pages of one.
    let paged = pages(
        &mut client,
        pb::ListApprovalsRequest {
            page_size: 1,
            ..filter("", "alice", Unspecified)
        },
    )
    .await;
    assert_eq!(paged.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
    let alices: Vec<pb::Approval> = current
        .iter()
        .filter(|a| owner(a) == "alice")
        .cloned()
        .collect();
    assert_eq!(paged.concat(), alices);
    // The server's default page holds them all.
    let default_page = client
        .list_approvals(pb::ListApprovalsRequest::default())
        .await
        .expect("list approvals")
        .into_inner();
    assert_eq!(default_page.approvals, current);
    assert!(default_page.next_page_token.is_empty());
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Runs, rollbacks, deletion and forks

/// Polls the session until no run holds its lease.
async fn wait_for_lease_gone(client: &mut Client, session: &str) {
    let deadline = tokio::time::Instant::now() + EXPIRY_PATIENCE;
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

async fn approvals_outlive_runs_and_rollbacks(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_runs";
    session_calling(&mut client, id, &["call_1", "call_2", "call_3"]).await;

    // EndRun: the run's approval stays as it is.
    begin_run(&mut client, id, "run-a", 60).await;
    let first = pending(
        &mut client,
        pb::RequestApprovalRequest {
            run_id: "run-a".into(),
            ..ask(id, "call_1")
        },
    )
    .await;
    assert_eq!(first.run_id, "run-a");
    end_run(&mut client, id, "run-a").await;
    assert_eq!(reread(&mut client, &first).await, first);

    // Decided while another run holds the lease: the denial appends.
    begin_run(&mut client, id, "run-b", 60).await;
    let head = revision(&mut client, id).await;
    let denied = decide(&mut client, deny(&first, "not now")).await;
    assert_eq!(denied.revision, head + 1);
    assert_denial_result(
        denied.tool_result.as_ref(),
        id,
        2,
        "call_1",
        TOOL,
        "not now",
    );
    let first = denied.approval.expect("the approval");
    let session = get(&mut client, id).await;
    assert_eq!(
        session.active_run_id, "run-b",
        "a decision leaves the lease"
    );
    end_run(&mut client, id, "run-b").await;

    // The lease runs out: the run's approval stays pending.
    begin_run(&mut client, id, "run-c", 1).await;
    let second = pending(
        &mut client,
        pb::RequestApprovalRequest {
            run_id: "run-c".into(),
            ..ask(id, "call_2")
        },
    )
    .await;
    wait_for_lease_gone(&mut client, id).await;
    assert_eq!(reread(&mut client, &second).await, second);

    // Answered meanwhile: the denial is recorded alone.
    append_messages(&mut client, id, vec![answering("call_2", "deleted anyway")]).await;
    let history = all_messages(&mut client, id).await;
    assert_eq!(history.len(), 4);
    let head = revision(&mut client, id).await;
    let denied = decide(&mut client, deny(&second, "too late")).await;
    assert_eq!(denied.revision, head + 1);
    assert!(
        denied.tool_result.is_none(),
        "the call had its answer: {denied:?}"
    );
    let decided = denied.approval.expect("the approval");
    assert_eq!(decided.state(), pb::ApprovalState::Denied);
    assert_eq!(revision(&mut client, id).await, head + 1);
    assert_eq!(all_messages(&mut client, id).await, history);

    // Rolled back: the approvals stay as they are; a denial of the call the
    // rollback removed is recorded alone.
    let third = pending(&mut client, ask(id, "call_3")).await;
    client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: id.into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .expect("roll back to the question");
    assert_eq!(reread(&mut client, &third).await, third);
    assert_eq!(reread(&mut client, &first).await, first);
    assert_eq!(reread(&mut client, &second).await, decided);
    let head = revision(&mut client, id).await;
    let denied = decide(&mut client, deny(&third, "gone")).await;
    assert_eq!(denied.revision, head + 1);
    assert!(
        denied.tool_result.is_none(),
        "the call was rolled back: {denied:?}"
    );
    assert_eq!(
        denied.approval.expect("the approval").state(),
        pb::ApprovalState::Denied
    );
    let left = all_messages(&mut client, id).await;
    assert_eq!(left.len(), 1, "only the question: {left:?}");
    let session = get(&mut client, id).await;
    assert_eq!((session.revision, session.next_sequence), (head + 1, 1));
    let events = replay(&mut client, id, head).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let recorded = approval_decided(&events[0]);
    assert!(recorded.tool_result.is_none(), "{events:?}");
    assert_eq!(recorded.next_sequence, 1);
    server.stop().await.expect("stop");
}

async fn deletion_recreation_and_forks_leave_no_approvals(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_gone";
    session_calling(&mut client, id, &["call_1", "call_2"]).await;
    let waiting = pending(&mut client, ask(id, "call_1")).await;
    let approved = pending(&mut client, ask(id, "call_2")).await;
    decide(&mut client, approve(&approved)).await;
    session_calling(&mut client, "ses_kept", &["call_1"]).await;
    let kept = pending(&mut client, ask("ses_kept", "call_1")).await;

    // A fork copies the history, none of the approvals: its calls may be
    // asked for afresh, even the one approved in the original.
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
    assert!(approvals_of(&mut client, "ses_fork").await.is_empty());
    let status = get_approval(&mut client, "ses_fork", &waiting.approval_id)
        .await
        .expect_err("the fork has no approvals");
    assert_status(&status, Code::NotFound, "APPROVAL_NOT_FOUND");
    let forked = [
        pending(&mut client, ask("ses_fork", "call_1")).await,
        pending(&mut client, ask("ses_fork", "call_2")).await,
    ];
    for approval in &forked {
        assert_ne!(approval.approval_id, waiting.approval_id);
        assert_ne!(approval.approval_id, approved.approval_id);
    }
    assert_eq!(
        approvals_of(&mut client, id).await.len(),
        2,
        "the original keeps its own"
    );

    // Deleted: its approvals are gone from every read.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: id.into(),
        })
        .await
        .expect("delete");
    let mut left: Vec<String> = list(&mut client, filter("", "", pb::ApprovalState::Unspecified))
        .await
        .into_iter()
        .map(|a| a.approval_id)
        .collect();
    left.sort();
    let mut expected = vec![
        kept.approval_id.clone(),
        forked[0].approval_id.clone(),
        forked[1].approval_id.clone(),
    ];
    expected.sort();
    assert_eq!(left, expected, "the deleted session's approvals are listed");
    assert!(
        list(&mut client, filter("", "", pb::ApprovalState::Approved))
            .await
            .is_empty()
    );
    let status = get_approval(&mut client, id, &waiting.approval_id)
        .await
        .expect_err("the session is gone");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Created again with the same id and history: no approvals.
    session_calling(&mut client, id, &["call_1", "call_2"]).await;
    assert!(approvals_of(&mut client, id).await.is_empty());
    for old in [&waiting, &approved] {
        let status = get_approval(&mut client, id, &old.approval_id)
            .await
            .expect_err("the old approval is gone");
        assert_status(&status, Code::NotFound, "APPROVAL_NOT_FOUND");
    }
    for call in ["call_1", "call_2"] {
        let fresh = pending(&mut client, ask(id, call)).await;
        assert_ne!(fresh.approval_id, waiting.approval_id);
        assert_ne!(fresh.approval_id, approved.approval_id);
    }
    assert_eq!(reread(&mut client, &kept).await, kept);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Events

async fn watchers_see_requests_and_decisions(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let id = "ses_watched";
    session_calling(&mut client, id, &["call_1", "call_2"]).await;
    let mut events = watch_head(&mut client, id).await;
    let mut live = Vec::new();

    let asked = request(&mut client, ask(id, "call_1")).await;
    let event = next_change(&mut events).await;
    assert_eq!(event.revision, asked.revision);
    assert!(event.time.is_some(), "{event:?}");
    assert_eq!(approval_requested(&event).approval, asked.approval);
    live.push(event);

    let pending_1 = asked.approval.expect("the approval");
    let approved = decide(&mut client, approve(&pending_1)).await;
    let event = next_change(&mut events).await;
    assert_eq!(event.revision, approved.revision);
    let decided = approval_decided(&event);
    assert_eq!(decided.approval, approved.approval);
    assert!(decided.tool_result.is_none(), "{event:?}");
    assert_eq!(decided.next_sequence, 2);
    live.push(event);

    let asked = request(&mut client, ask(id, "call_2")).await;
    let event = next_change(&mut events).await;
    assert_eq!(event.revision, asked.revision);
    assert_eq!(approval_requested(&event).approval, asked.approval);
    live.push(event);

    let pending_2 = asked.approval.expect("the approval");
    let keyed = pb::DecideApprovalRequest {
        request_id: "dec-watched".into(),
        ..deny(&pending_2, "no")
    };
    let denied = decide(&mut client, keyed.clone()).await;
    let event = next_change(&mut events).await;
    assert_eq!(event.revision, denied.revision);
    let decided = approval_decided(&event);
    assert_eq!(decided.approval, denied.approval);
    assert_eq!(decided.tool_result, denied.tool_result);
    assert!(decided.tool_result.is_some(), "{event:?}");
    assert_eq!(decided.next_sequence, 3);
    let listed = all_messages(&mut client, id).await;
    assert_eq!(listed.last(), decided.tool_result.as_ref());
    live.push(event);

    // A retry and a refused call make no event: the next one is a rename.
    assert_eq!(decide(&mut client, keyed).await, denied);
    let refused = decide_err(&mut client, approve(&pending_2)).await;
    let decided = denied.approval.clone().expect("the approval");
    assert_already_decided(&refused, &decided, "an approval after the denial");
    let refused = request_err(&mut client, ask(id, "call_2")).await;
    assert_status(&refused, Code::FailedPrecondition, "TOOL_CALL_ANSWERED");
    let renamed = rename(&mut client, id, "renamed").await;
    assert_eq!(renamed.revision, denied.revision + 1);
    let event = next_change(&mut events).await;
    assert!(
        matches!(event.event, Some(Event::SessionUpdated(_))),
        "expected session_updated, got {event:?}"
    );
    assert_eq!(event.revision, renamed.revision);

    // A replay tells the same.
    let replayed = replay(&mut client, id, 2).await;
    assert_eq!(replayed.len(), 5, "{replayed:?}");
    assert_eq!(replayed[..4], live[..]);
    server.stop().await.expect("stop");
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

/// `token`'s session `id` (alice's) with a turn calling `call_1` and
/// `call_2`, and a pending approval of `call_1`.
async fn tenant_session(client: &mut Client, token: &str, id: &str) -> pb::Approval {
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
        .expect("create")
        .into_inner();
    client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: id.into(),
                messages: vec![user("clean up, please")],
                provider_call: Some(call("gpt-tools", 10, 5, 42)),
                response_messages: vec![calling(&["call_1", "call_2"])],
                ..Default::default()
            },
            token,
        ))
        .await
        .expect("append");
    client
        .request_approval(authed(ask(id, "call_1"), token))
        .await
        .expect("request approval")
        .into_inner()
        .approval
        .expect("the approval")
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

async fn another_tenants_session_is_unknown_to_approvals(backend: Backend) {
    let (server, _tokens) = start_tenants(backend).await;
    let mut client = server.client().await;
    const SHARED: &str = "ses_shared";
    const OWN: &str = "ses_globex";
    let owners = tenant_session(&mut client, OWNER, SHARED).await;
    let own = tenant_session(&mut client, INTRUDER, OWN).await;
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
    let caught_up = next_change(&mut live).await;
    assert!(
        matches!(caught_up.event, Some(Event::CaughtUp(_))),
        "{caught_up:?}"
    );

    // Each new RPC, as the intruder and as a tenant without sessions.
    for call in ["call_1", "call_2"] {
        let build = || ask(SHARED, call);
        let foreign = client
            .request_approval(authed(build(), INTRUDER))
            .await
            .map(drop);
        let stranger = client
            .request_approval(authed(build(), STRANGER))
            .await
            .map(drop);
        assert_like_unknown(&format!("RequestApproval of {call}"), foreign, stranger);
    }
    for (label, build) in [
        ("DecideApproval (approve)", approve(&owners)),
        ("DecideApproval (deny)", deny(&owners, "intruded")),
        (
            "DecideApproval (keyed)",
            pb::DecideApprovalRequest {
                request_id: "dec-intruder".into(),
                ..approve(&owners)
            },
        ),
    ] {
        let foreign = client
            .decide_approval(authed(build.clone(), INTRUDER))
            .await
            .map(drop);
        let stranger = client
            .decide_approval(authed(build, STRANGER))
            .await
            .map(drop);
        assert_like_unknown(label, foreign, stranger);
    }
    let read = || pb::GetApprovalRequest {
        session_id: SHARED.into(),
        approval_id: owners.approval_id.clone(),
    };
    let foreign = client
        .get_approval(authed(read(), INTRUDER))
        .await
        .map(drop);
    let stranger = client
        .get_approval(authed(read(), STRANGER))
        .await
        .map(drop);
    assert_like_unknown("GetApproval", foreign, stranger);
    let of_shared = || filter(SHARED, "", pb::ApprovalState::Unspecified);
    let foreign = client
        .list_approvals(authed(of_shared(), INTRUDER))
        .await
        .map(|r| r.into_inner().approvals);
    let stranger = client
        .list_approvals(authed(of_shared(), STRANGER))
        .await
        .map(|r| r.into_inner().approvals);
    match (foreign, stranger) {
        (Ok(foreign), Ok(stranger)) => {
            assert!(foreign.is_empty(), "ListApprovals leaked: {foreign:?}");
            assert!(stranger.is_empty(), "ListApprovals leaked: {stranger:?}");
        }
        (foreign, stranger) => {
            assert_like_unknown(
                "ListApprovals of the session",
                foreign.map(drop),
                stranger.map(drop),
            );
        }
    }

    // The owner's approval id in the intruder's own session: unknown there.
    let foreign_id = pb::GetApprovalRequest {
        session_id: OWN.into(),
        approval_id: owners.approval_id.clone(),
    };
    let status = client
        .get_approval(authed(foreign_id, INTRUDER))
        .await
        .expect_err("another tenant's approval");
    assert_status(&status, Code::NotFound, "APPROVAL_NOT_FOUND");
    let status = client
        .decide_approval(authed(
            pb::DecideApprovalRequest {
                session_id: OWN.into(),
                ..approve(&owners)
            },
            INTRUDER,
        ))
        .await
        .expect_err("another tenant's approval");
    assert_status(&status, Code::NotFound, "APPROVAL_NOT_FOUND");

    // Listings show each tenant its own, under any filter.
    for (token, expected) in [
        (INTRUDER, vec![own.clone()]),
        (STRANGER, Vec::new()),
        (OWNER, vec![owners.clone()]),
    ] {
        for request in [
            filter("", "", pb::ApprovalState::Unspecified),
            filter("", "alice", pb::ApprovalState::Unspecified),
            filter("", "", pb::ApprovalState::Pending),
        ] {
            let listed = client
                .list_approvals(authed(request.clone(), token))
                .await
                .expect("list approvals")
                .into_inner();
            assert_eq!(listed.approvals, expected, "{token}: {request:?}");
        }
    }

    // Nothing written: the owner's session and approval are as they were,
    // and its watcher's next event is the owner's own decision.
    let after = session_as(&mut client, OWNER, SHARED).await;
    assert_eq!(after, before, "another tenant changed the owner's session");
    let read = client
        .get_approval(authed(
            pb::GetApprovalRequest {
                session_id: SHARED.into(),
                approval_id: owners.approval_id.clone(),
            },
            OWNER,
        ))
        .await
        .expect("the owner's approval")
        .into_inner();
    assert_eq!(read, owners);
    let decided = client
        .decide_approval(authed(approve(&owners), OWNER))
        .await
        .expect("the owner decides")
        .into_inner();
    assert_eq!(decided.revision, before.revision + 1);
    let event = next_change(&mut live).await;
    assert_eq!(event.revision, decided.revision, "{event:?}");
    assert_eq!(approval_decided(&event).approval, decided.approval);
    drop(live);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------
// Durability

/// The real binary on SQLite, killed with SIGKILL after a request and
/// after a decision: the pending approval survives, and so does the
/// decision, which a retry with its request id answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_and_a_decision_survive_sigkill() {
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
    session_calling(&mut client, id, &["call_1"]).await;
    let asked = pending(&mut client, ask(id, "call_1")).await;
    server.kill().await;

    let mut server = start(2).await;
    let mut client = server.short_timeout_client().await;
    assert_eq!(
        reread(&mut client, &asked).await,
        asked,
        "the pending approval survives"
    );
    assert_eq!(
        approvals_of(&mut client, id).await,
        std::slice::from_ref(&asked)
    );
    let keyed = pb::DecideApprovalRequest {
        request_id: "dec-crash".into(),
        decided_by: "bob".into(),
        ..deny(&asked, "not after a crash")
    };
    let first = decide(&mut client, keyed.clone()).await;
    server.kill().await;

    let server = start(3).await;
    let mut client = server.short_timeout_client().await;
    let retry = decide(&mut client, keyed).await;
    assert_eq!(
        retry, first,
        "the retry answers the decision taken before the kill"
    );
    let decided = first.approval.clone().expect("the approval");
    assert_eq!(reread(&mut client, &asked).await, decided);
    assert_eq!(revision(&mut client, id).await, first.revision);
    let messages = all_messages(&mut client, id).await;
    assert_eq!(messages.last(), first.tool_result.as_ref());
    let status = decide_err(&mut client, approve(&asked)).await;
    assert_already_decided(&status, &decided, "another decision after the restart");
    drop(server);
}
