//! The ergonomic client's tool approvals (`Client::request_approval`,
//! `decide_approval`, `get_approval`, `list_approvals`) against the real
//! server over real gRPC: the typed calls on every backend, each refusal
//! as its typed `Error` variant with its metadata, and a decision whose
//! answer is lost retried under the same request id and recorded once.

use std::time::{Duration, SystemTime};

use futures_util::{StreamExt as _, TryStreamExt as _};
use sessionstore_client::v1::{self as pb, ApprovalDecision, ApprovalState, Message, ProviderCall};
use sessionstore_client::{
    Client, Error, Exchange, ListApprovals, NewApproval, NewSession, RetryPolicy,
};
use tonic::Code;

use crate::support::Proxy;
use crate::support::{Backend, TestServer, patient_client};

crate::backend_tests!(
    typed_approval_calls_round_trip,
    approval_errors_are_typed,
    an_expired_approval_is_its_own_error,
);

/// Details in a layout no JSON encoder would produce: kept verbatim.
const DETAIL: &str = "{ \"paths\" : [\"/tmp/a\"],\n  \"force\":true }";
/// Safety net for "the next event arrives": generous, never a pacing sleep.
const NEXT_EVENT: Duration = Duration::from_secs(30);

/// An assistant message calling each of `ids` (OpenAI style).
fn calling(ids: &[&str]) -> Message {
    Message {
        tool_calls: ids
            .iter()
            .map(|id| pb::ToolCall {
                id: (*id).to_owned(),
                name: "delete_files".to_owned(),
                arguments: "{}".to_owned(),
                signature: String::new(),
            })
            .collect(),
        ..Message::assistant("")
    }
}

/// Creates `session_id` (owned by `user`) whose history is a question and
/// an answer calling each of `calls`: revision 2.
async fn session_calling(client: &Client, session_id: &str, user: &str, calls: &[&str]) {
    client
        .create_session(NewSession::new().id(session_id).user(user))
        .await
        .unwrap();
    let stored = client
        .append_exchange(
            &Exchange::new(session_id)
                .message(Message::user("clean up, please"))
                .provider_call(ProviderCall::new("openai", "gpt-tools").with_tokens(10, 5))
                .response(calling(calls)),
        )
        .await
        .unwrap();
    assert_eq!(stored.revision, 2);
}

fn approval_of(response: &pb::RequestApprovalResponse) -> pb::Approval {
    response.approval.clone().expect("the approval")
}

fn ids(approvals: &[pb::Approval]) -> Vec<&str> {
    approvals.iter().map(|a| a.approval_id.as_str()).collect()
}

async fn typed_approval_calls_round_trip(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    session_calling(&client, "ses_apr", "alice", &["call_a", "call_b"]).await;

    let expire = SystemTime::now() + Duration::from_secs(3600);
    let asked = client
        .request_approval(
            NewApproval::new("ses_apr", "call_a")
                .title("Delete /tmp/a?")
                .detail_json(DETAIL)
                .expire_time(expire),
        )
        .await
        .unwrap();
    assert_eq!(asked.revision, 3);
    let first = approval_of(&asked);
    assert!(first.approval_id.starts_with("apr_"), "{first:?}");
    assert_eq!(first.session_id, "ses_apr");
    assert_eq!(first.tool_call_id, "call_a");
    assert_eq!(first.title, "Delete /tmp/a?");
    assert_eq!(first.detail_json, DETAIL, "details kept verbatim");
    assert_eq!(first.state(), ApprovalState::Pending);
    assert_eq!(first.decided_by, "");
    assert!(first.create_time.is_some());
    assert!(first.decide_time.is_none());
    let expire_seconds = prost_types::Timestamp::from(expire).seconds;
    assert_eq!(first.expire_time.map(|t| t.seconds), Some(expire_seconds));
    assert_eq!(
        client
            .get_approval("ses_apr", &first.approval_id)
            .await
            .unwrap(),
        first
    );

    // An approval: no tool result; the decision is on the record.
    let approved = client
        .decide_approval(
            "ses_apr",
            &first.approval_id,
            ApprovalDecision::Approve,
            "looks safe",
            "alice",
        )
        .await
        .unwrap();
    assert_eq!(approved.revision, 4);
    assert!(approved.tool_result.is_none());
    let decided = approved.approval.clone().unwrap();
    assert_eq!(decided.state(), ApprovalState::Approved);
    assert_eq!(
        (decided.decided_by.as_str(), decided.reason.as_str()),
        ("alice", "looks safe")
    );
    assert!(decided.decide_time.is_some());
    assert_eq!(
        client
            .get_approval("ses_apr", &first.approval_id)
            .await
            .unwrap(),
        decided
    );

    // A denial stores the call's tool result, the reason as its content,
    // in the decision's revision.
    let second = approval_of(
        &client
            .request_approval(NewApproval::new("ses_apr", "call_b").title("Force?"))
            .await
            .unwrap(),
    );
    let denied = client
        .decide_approval(
            "ses_apr",
            &second.approval_id,
            ApprovalDecision::Deny,
            "not on a Friday",
            "bob",
        )
        .await
        .unwrap();
    assert_eq!(denied.revision, 6);
    assert_eq!(
        denied.approval.as_ref().unwrap().state(),
        ApprovalState::Denied
    );
    let result = denied.tool_result.clone().expect("a denial's tool result");
    assert_eq!(result.sequence, 2);
    let message = result.message.clone().unwrap();
    assert_eq!(message.role(), pb::Role::Tool);
    assert_eq!(message.tool_call_id, "call_b");
    assert_eq!(message.content, "not on a Friday");
    assert!(message.tool_error);
    let history = client.export_history("ses_apr").await.unwrap();
    assert_eq!(history.len(), 3);
    assert_eq!(
        (
            history[2].tool_call_id.as_str(),
            history[2].content.as_str()
        ),
        ("call_b", "not on a Friday")
    );

    // Another session, another user, one pending approval.
    session_calling(&client, "ses_bob", "bob", &["call_z"]).await;
    let third = approval_of(
        &client
            .request_approval(NewApproval::new("ses_bob", "call_z"))
            .await
            .unwrap(),
    );

    // Listing: oldest first, every filter, page after page.
    let list = |query: ListApprovals| {
        let client = client.clone();
        async move {
            client
                .list_approvals(query)
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
        }
    };
    let everything = list(ListApprovals::new()).await;
    assert_eq!(
        ids(&everything),
        [
            first.approval_id.as_str(),
            second.approval_id.as_str(),
            third.approval_id.as_str()
        ]
    );
    assert_eq!(everything[0], decided);
    let paged = list(ListApprovals::new().page_size(1)).await;
    assert_eq!(paged, everything, "pages of one, followed by the stream");
    assert_eq!(
        ids(&list(ListApprovals::new().session_id("ses_apr").page_size(1)).await),
        [first.approval_id.as_str(), second.approval_id.as_str()]
    );
    assert_eq!(
        ids(&list(ListApprovals::new().user("bob")).await),
        [third.approval_id.as_str()]
    );
    assert_eq!(
        ids(&list(ListApprovals::new().state(ApprovalState::Pending)).await),
        [third.approval_id.as_str()]
    );
    assert_eq!(
        ids(&list(
            ListApprovals::new()
                .session_id("ses_apr")
                .state(ApprovalState::Denied)
        )
        .await),
        [second.approval_id.as_str()]
    );
    assert!(
        list(
            ListApprovals::new()
                .user("bob")
                .state(ApprovalState::Approved)
        )
        .await
        .is_empty()
    );

    // Watchers see each request and decision as a revision, by kind.
    let mut events = client.watch("ses_apr", 2);
    let mut kinds = Vec::new();
    loop {
        let event = tokio::time::timeout(NEXT_EVENT, events.next())
            .await
            .expect("an event within the timeout")
            .expect("the watch goes on")
            .unwrap();
        if event.kind() == "caught_up" {
            break;
        }
        kinds.push((event.revision, event.kind()));
    }
    assert_eq!(
        kinds,
        [
            (3, "approval_requested"),
            (4, "approval_decided"),
            (5, "approval_requested"),
            (6, "approval_decided"),
        ]
    );
}

async fn approval_errors_are_typed(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    session_calling(&client, "ses_err", "carol", &["call_a", "call_done"]).await;
    client
        .append_exchange(&Exchange::new("ses_err").message(Message::tool("call_done", "done")))
        .await
        .unwrap();
    let revision = || {
        let client = client.clone();
        async move { client.get_session("ses_err").await.unwrap().revision }
    };
    assert_eq!(revision().await, 3);

    // RequestApproval's refusals.
    match client
        .request_approval(NewApproval::new("ses_err", "call_nowhere"))
        .await
    {
        Err(error @ Error::UnknownToolCall { .. }) => {
            assert!(
                matches!(&error, Error::UnknownToolCall { tool_call_id, .. } if tool_call_id == "call_nowhere")
            );
            assert_eq!(error.code(), Some(Code::FailedPrecondition));
            assert_eq!(error.reason().as_deref(), Some("UNKNOWN_TOOL_CALL"));
            assert!(!error.is_transient());
        }
        other => panic!("expected UnknownToolCall, got {other:?}"),
    }
    match client
        .request_approval(NewApproval::new("ses_err", "call_done"))
        .await
    {
        Err(error @ Error::ToolCallAnswered { .. }) => {
            assert!(
                matches!(&error, Error::ToolCallAnswered { tool_call_id, .. } if tool_call_id == "call_done")
            );
            assert_eq!(error.code(), Some(Code::FailedPrecondition));
            assert_eq!(error.reason().as_deref(), Some("TOOL_CALL_ANSWERED"));
        }
        other => panic!("expected ToolCallAnswered, got {other:?}"),
    }
    match client
        .request_approval(NewApproval::new("ses_missing", "call_a"))
        .await
    {
        Err(Error::NotFound { session_id, .. }) => assert_eq!(session_id, "ses_missing"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    match client
        .request_approval(NewApproval::new("ses_err", "call_a").title("x".repeat(1_025)))
        .await
    {
        Err(Error::LimitExceeded { field, .. }) => assert_eq!(field, "title"),
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    assert_eq!(revision().await, 3, "no refusal wrote anything");

    let pending = approval_of(
        &client
            .request_approval(NewApproval::new("ses_err", "call_a").title("Delete?"))
            .await
            .unwrap(),
    );
    match client
        .request_approval(NewApproval::new("ses_err", "call_a"))
        .await
    {
        Err(error @ Error::ApprovalExists { .. }) => {
            match &error {
                Error::ApprovalExists {
                    tool_call_id,
                    approval_id,
                    ..
                } => {
                    assert_eq!(tool_call_id, "call_a");
                    assert_eq!(approval_id, &pending.approval_id, "names the pending one");
                }
                _ => unreachable!(),
            }
            assert_eq!(error.code(), Some(Code::AlreadyExists));
            assert_eq!(error.reason().as_deref(), Some("APPROVAL_EXISTS"));
        }
        other => panic!("expected ApprovalExists, got {other:?}"),
    }

    // Unknown approvals, for reads and decisions alike.
    match client.get_approval("ses_err", "apr_nope").await {
        Err(error @ Error::ApprovalNotFound { .. }) => {
            assert!(
                matches!(&error, Error::ApprovalNotFound { approval_id, .. } if approval_id == "apr_nope")
            );
            assert_eq!(error.code(), Some(Code::NotFound));
            assert_eq!(error.reason().as_deref(), Some("APPROVAL_NOT_FOUND"));
        }
        other => panic!("expected ApprovalNotFound, got {other:?}"),
    }
    match client
        .decide_approval("ses_err", "apr_nope", ApprovalDecision::Approve, "", "")
        .await
    {
        Err(Error::ApprovalNotFound { approval_id, .. }) => assert_eq!(approval_id, "apr_nope"),
        other => panic!("expected ApprovalNotFound, got {other:?}"),
    }
    match client
        .decide_approval(
            "ses_err",
            &pending.approval_id,
            ApprovalDecision::Unspecified,
            "",
            "",
        )
        .await
    {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "decision"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    match client
        .decide_approval(
            "ses_err",
            &pending.approval_id,
            ApprovalDecision::Deny,
            "x".repeat(65_537),
            "",
        )
        .await
    {
        Err(Error::LimitExceeded { field, .. }) => assert_eq!(field, "reason"),
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    assert_eq!(revision().await, 4, "only the request was written");

    // Decided once: a decision by anyone else names the first.
    let request_id = "decision-of-carol";
    let decide = |reason: &str| pb::DecideApprovalRequest {
        session_id: "ses_err".into(),
        approval_id: pending.approval_id.clone(),
        decision: ApprovalDecision::Approve.into(),
        reason: reason.into(),
        decided_by: "carol".into(),
        request_id: request_id.into(),
    };
    let first = client.decide_approval_with(decide("ok")).await.unwrap();
    assert_eq!(first.revision, 5);
    let again = client.decide_approval_with(decide("ok")).await.unwrap();
    assert_eq!(
        again, first,
        "the same key and body answers the first decision"
    );
    for (what, attempt) in [
        (
            "another decider",
            client
                .decide_approval(
                    "ses_err",
                    &pending.approval_id,
                    ApprovalDecision::Deny,
                    "no",
                    "dave",
                )
                .await,
        ),
        (
            "the same key with another reason",
            client.decide_approval_with(decide("changed my mind")).await,
        ),
    ] {
        match attempt {
            Err(
                ref error @ Error::ApprovalAlreadyDecided {
                    ref approval_id,
                    state,
                    ref decided_by,
                    ..
                },
            ) => {
                assert_eq!(approval_id, &pending.approval_id, "{what}");
                assert_eq!(state, ApprovalState::Approved, "{what}");
                assert_eq!(decided_by, "carol", "{what}");
                assert_eq!(error.code(), Some(Code::FailedPrecondition));
                assert_eq!(error.reason().as_deref(), Some("APPROVAL_ALREADY_DECIDED"));
                assert!(
                    error.to_string().contains("APPROVAL_STATE_APPROVED"),
                    "{error}"
                );
            }
            other => panic!("{what}: expected ApprovalAlreadyDecided, got {other:?}"),
        }
    }
    assert_eq!(revision().await, 5, "one decision, written once");

    // A session another run holds: its run may ask, nobody else.
    client
        .begin_run("ses_err", "run_1", Duration::from_secs(60))
        .await
        .unwrap();
    client
        .append_exchange(
            &Exchange::new("ses_err")
                .run_id("run_1")
                .message(Message::user("and the other one?"))
                .provider_call(ProviderCall::new("openai", "gpt-tools"))
                .response(calling(&["call_c"])),
        )
        .await
        .unwrap();
    match client
        .request_approval(NewApproval::new("ses_err", "call_c"))
        .await
    {
        Err(Error::SessionBusy { active_run_id, .. }) => assert_eq!(active_run_id, "run_1"),
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    let asked = client
        .request_approval(NewApproval::new("ses_err", "call_c").run_id("run_1"))
        .await
        .unwrap();
    assert_eq!(approval_of(&asked).run_id, "run_1");

    // A bad page size fails the listing stream, which then ends.
    let mut listing = client.list_approvals(ListApprovals::new().page_size(-1));
    match listing.next().await {
        Some(Err(Error::InvalidArgument { field, .. })) => assert_eq!(field, "page_size"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(listing.next().await.is_none());
}

async fn an_expired_approval_is_its_own_error(backend: Backend) {
    let server = TestServer::start(backend).await;
    let client = patient_client(&server.endpoint()).await;
    session_calling(&client, "ses_exp", "erin", &["call_a"]).await;
    let expire = SystemTime::now() + Duration::from_secs(1);
    let asked = approval_of(
        &client
            .request_approval(NewApproval::new("ses_exp", "call_a").expire_time(expire))
            .await
            .unwrap(),
    );
    // Past its expire_time it is expired, whether or not the sweeper got to it.
    if let Ok(left) = expire.duration_since(SystemTime::now()) {
        tokio::time::sleep(left + Duration::from_millis(200)).await;
    }
    match client
        .decide_approval(
            "ses_exp",
            &asked.approval_id,
            ApprovalDecision::Approve,
            "too late",
            "erin",
        )
        .await
    {
        Err(error @ Error::ApprovalExpired { .. }) => {
            assert!(
                matches!(&error, Error::ApprovalExpired { approval_id, .. } if approval_id == &asked.approval_id)
            );
            assert_eq!(error.code(), Some(Code::FailedPrecondition));
            assert_eq!(error.reason().as_deref(), Some("APPROVAL_EXPIRED"));
        }
        other => panic!("expected ApprovalExpired, got {other:?}"),
    }
    let expired = client
        .get_approval("ses_exp", &asked.approval_id)
        .await
        .unwrap();
    assert_eq!(expired.state(), ApprovalState::Expired);
    assert_eq!(expired.decided_by, "");
    let listed: Vec<_> = client
        .list_approvals(ListApprovals::new().state(ApprovalState::Expired))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(ids(&listed), [asked.approval_id.as_str()]);
    // The call may be asked about again.
    let again = approval_of(
        &client
            .request_approval(NewApproval::new("ses_exp", "call_a"))
            .await
            .unwrap(),
    );
    assert_ne!(again.approval_id, asked.approval_id);
    assert_eq!(again.state(), ApprovalState::Pending);
}

/// The answer to a decision is lost (the connection closes just before
/// it): the client retries with the same request id on a new connection
/// and gets the first decision, written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_whose_answer_is_lost_is_retried_and_recorded_once() {
    let server = TestServer::start(Backend::File).await;
    let direct = patient_client(&server.endpoint()).await;
    session_calling(&direct, "ses_cut", "frank", &["call_a"]).await;
    let asked = approval_of(
        &direct
            .request_approval(NewApproval::new("ses_cut", "call_a"))
            .await
            .unwrap(),
    );

    let proxy = Proxy::start(server.addr).await;
    let client = patient_client(&proxy.endpoint()).await;
    // The connection is up before the cut is armed.
    assert_eq!(
        client
            .get_approval("ses_cut", &asked.approval_id)
            .await
            .unwrap()
            .state(),
        ApprovalState::Pending
    );
    assert_eq!(proxy.accepted(), 1);
    proxy.cut_before_next_response();
    let denied = client
        .decide_approval(
            "ses_cut",
            &asked.approval_id,
            ApprovalDecision::Deny,
            "no",
            "frank",
        )
        .await
        .unwrap();
    assert_eq!(proxy.responses_cut(), 1, "the first answer was cut");
    assert_eq!(proxy.accepted(), 2, "the retry came on a new connection");
    assert_eq!(denied.revision, 4, "the retry answered the first decision");
    assert_eq!(denied.approval.unwrap().state(), ApprovalState::Denied);
    assert!(denied.tool_result.is_some());

    assert_eq!(direct.get_session("ses_cut").await.unwrap().revision, 4);
    let history = direct.export_history("ses_cut").await.unwrap();
    assert_eq!(history.len(), 3, "one tool result, stored once");

    // Without retries the lost answer is a transient error, and a new
    // decision (another request id) then finds the approval decided.
    let impatient = Client::builder(proxy.endpoint())
        .retry_policy(RetryPolicy::never())
        .connect()
        .await
        .unwrap();
    session_calling(&direct, "ses_cut2", "frank", &["call_b"]).await;
    let second = approval_of(
        &direct
            .request_approval(NewApproval::new("ses_cut2", "call_b"))
            .await
            .unwrap(),
    );
    proxy.cut_before_next_response();
    match impatient
        .decide_approval(
            "ses_cut2",
            &second.approval_id,
            ApprovalDecision::Approve,
            "",
            "frank",
        )
        .await
    {
        Err(error @ Error::Unavailable { .. }) => assert!(error.is_transient()),
        other => panic!("expected Unavailable after a cut connection, got {other:?}"),
    }
    let recorded = direct
        .get_approval("ses_cut2", &second.approval_id)
        .await
        .unwrap();
    assert_eq!(recorded.state(), ApprovalState::Approved);
    match direct
        .decide_approval(
            "ses_cut2",
            &second.approval_id,
            ApprovalDecision::Approve,
            "",
            "frank",
        )
        .await
    {
        Err(Error::ApprovalAlreadyDecided { decided_by, .. }) => assert_eq!(decided_by, "frank"),
        other => panic!("expected ApprovalAlreadyDecided, got {other:?}"),
    }
}
