"""Tool approvals with both clients against a real server: request, get,
decide (retried under its request id), list and iterate, and every refusal
as its exception class with its metadata."""

from __future__ import annotations

import datetime
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

import sessionstore
from sessionstore import RetryPolicy, v1
from sessionstore import _requests

from .conftest import RetrySignal, Server

PATIENT = RetryPolicy(max_attempts=60, initial_backoff=0.05, max_backoff=0.5)
#: Details in a layout no JSON encoder would produce: kept verbatim.
DETAIL = '{ "paths" : ["/tmp/a"],\n  "force":true }'


def user(text: str) -> v1.Message:
    return v1.Message(role=v1.ROLE_USER, content=text)


def calling(*ids: str) -> v1.Message:
    """An assistant message calling each of ``ids`` (OpenAI style)."""
    return v1.Message(
        role=v1.ROLE_ASSISTANT,
        tool_calls=[v1.ToolCall(id=i, name="delete_files", arguments="{}") for i in ids],
    )


def session_calling(client: sessionstore.Client, *calls: str, owner: str = "alice") -> str:
    """A session whose answer calls each of ``calls`` (revision 2)."""
    session = client.create_session(user=owner)
    client.append_exchange(
        session.id,
        messages=[user("clean up, please")],
        provider_call={"provider": "openai", "model": "gpt-tools"},
        response_messages=[calling(*calls)],
    )
    return session.id


def in_an_hour() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)


def test_request_get_decide_and_list(client: sessionstore.Client) -> None:
    sid = session_calling(client, "call_a", "call_b")
    expire = in_an_hour()
    asked = client.request_approval(
        sid, tool_call_id="call_a", title="Delete /tmp/a?", detail_json=DETAIL, expire_time=expire
    )
    assert isinstance(asked, v1.RequestApprovalResponse)
    assert asked.revision == 3
    first = asked.approval
    assert first.approval_id.startswith("apr_")
    assert (first.session_id, first.tool_call_id, first.title) == (sid, "call_a", "Delete /tmp/a?")
    assert first.detail_json == DETAIL
    assert first.state == v1.APPROVAL_STATE_PENDING
    assert first.expire_time.seconds == int(expire.timestamp())
    assert not first.HasField("decide_time")
    assert client.get_approval(sid, approval_id=first.approval_id) == first

    approved = client.decide_approval(
        sid, approval_id=first.approval_id, decision="approve", reason="fine", decided_by="alice"
    )
    assert isinstance(approved, v1.DecideApprovalResponse)
    assert approved.revision == 4
    assert not approved.HasField("tool_result")
    assert approved.approval.state == v1.APPROVAL_STATE_APPROVED
    assert (approved.approval.decided_by, approved.approval.reason) == ("alice", "fine")
    assert client.get_approval(sid, approval_id=first.approval_id) == approved.approval

    # A dict of details is encoded; a denial stores the call's tool result.
    second = client.request_approval(
        sid, tool_call_id="call_b", detail_json={"force": True}
    ).approval
    assert json.loads(second.detail_json) == {"force": True}
    denied = client.decide_approval(
        sid,
        approval_id=second.approval_id,
        decision=v1.APPROVAL_DECISION_DENY,
        reason="not on a Friday",
        decided_by="bob",
    )
    assert (denied.revision, denied.approval.state) == (6, v1.APPROVAL_STATE_DENIED)
    result = denied.tool_result
    assert result.sequence == 2
    assert result.message.role == v1.ROLE_TOOL
    assert (result.message.tool_call_id, result.message.content) == ("call_b", "not on a Friday")
    assert result.message.tool_error
    assert client.export_history(sid)[-1].content == "not on a Friday"

    other = session_calling(client, "call_z", owner="bob")
    third = client.request_approval(other, tool_call_id="call_z").approval
    ids = [first.approval_id, second.approval_id, third.approval_id]

    # Listing: oldest first, filtered, page after page.
    page = client.list_approvals(page_size=2)
    assert isinstance(page, v1.ListApprovalsResponse)
    assert [a.approval_id for a in page.approvals] == ids[:2]
    assert page.next_page_token
    rest = client.list_approvals(page_size=2, page_token=page.next_page_token)
    assert [a.approval_id for a in rest.approvals] == ids[2:]
    assert rest.next_page_token == ""
    assert [a.approval_id for a in client.iter_approvals(page_size=1)] == ids
    assert [a.approval_id for a in client.iter_approvals(session_id=sid)] == ids[:2]
    assert [a.approval_id for a in client.iter_approvals(user="bob")] == ids[2:]
    assert [a.approval_id for a in client.iter_approvals(state="pending")] == ids[2:]
    assert [a.approval_id for a in client.iter_approvals(state="APPROVAL_STATE_APPROVED")] == ids[:1]
    assert [
        a.approval_id for a in client.iter_approvals(session_id=sid, state=v1.APPROVAL_STATE_DENIED)
    ] == ids[1:2]
    assert list(client.iter_approvals(user="bob", state="expired")) == []
    assert len(list(client.iter_approvals(state="any"))) == 3

    # Watchers see each request and decision.
    with client.watch(sid, after_revision=2) as events:
        kinds = []
        for event in events:
            if event.HasField("caught_up"):
                break
            kinds.append((event.revision, event.WhichOneof("event")))
    assert kinds == [
        (3, "approval_requested"),
        (4, "approval_decided"),
        (5, "approval_requested"),
        (6, "approval_decided"),
    ]


def test_a_decision_is_keyed_by_its_request_id(client: sessionstore.Client) -> None:
    generated = _requests.decide_approval("s", "a", "deny", "", "", None)
    uuid.UUID(generated.request_id)  # every decision carries a fresh idempotency key
    assert generated.decision == v1.APPROVAL_DECISION_DENY
    assert _requests.decide_approval("s", "a", "deny", "", "", "mine").request_id == "mine"

    sid = session_calling(client, "call_a")
    approval = client.request_approval(sid, tool_call_id="call_a").approval
    first = client.decide_approval(
        sid, approval_id=approval.approval_id, decision="deny", reason="no", request_id="dec-1"
    )
    again = client.decide_approval(
        sid, approval_id=approval.approval_id, decision="deny", reason="no", request_id="dec-1"
    )
    assert again == first, "a retry answers the first decision"
    assert len(client.export_history(sid)) == 3, "one tool result"
    with pytest.raises(sessionstore.ApprovalAlreadyDecided) as changed:
        client.decide_approval(
            sid, approval_id=approval.approval_id, decision="deny", reason="never",
            request_id="dec-1",
        )
    assert changed.value.state == v1.APPROVAL_STATE_DENIED
    assert client.get_session(sid).revision == first.revision


def test_a_decision_survives_a_server_restart(
    make_server: Callable[..., Server], tmp_path: Path, retry_signal: RetrySignal
) -> None:
    server = make_server(database_url=f"sqlite://{tmp_path / 'db.sqlite'}")
    with server.client(retry_policy=PATIENT) as client:
        sid = session_calling(client, "call_a")
        approval = client.request_approval(sid, tool_call_id="call_a").approval
        server.kill()
        result: dict[str, Any] = {}

        def decide() -> None:
            try:
                result["decided"] = client.decide_approval(
                    sid, approval_id=approval.approval_id, decision="deny", reason="no"
                )
            except Exception as error:  # reported below
                result["error"] = error

        decider = threading.Thread(target=decide)
        decider.start()
        assert retry_signal.retried.wait(30), "the client never retried"
        server.start()
        decider.join(60)
        assert "error" not in result, result
        assert result["decided"].approval.state == v1.APPROVAL_STATE_DENIED
        assert result["decided"].revision == 4
        assert [m.content for m in client.export_history(sid)][-1] == "no"


def test_approval_errors_are_typed(client: sessionstore.Client) -> None:
    sid = session_calling(client, "call_a", "call_done")
    client.append_exchange(
        sid, messages=[v1.Message(role=v1.ROLE_TOOL, tool_call_id="call_done", content="done")]
    )

    with pytest.raises(sessionstore.UnknownToolCall) as unknown:
        client.request_approval(sid, tool_call_id="call_nowhere")
    assert isinstance(unknown.value, sessionstore.FailedPrecondition)
    assert unknown.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert unknown.value.reason == "UNKNOWN_TOOL_CALL"
    assert unknown.value.tool_call_id == "call_nowhere"
    assert not unknown.value.transient

    with pytest.raises(sessionstore.ToolCallAnswered) as answered:
        client.request_approval(sid, tool_call_id="call_done")
    assert isinstance(answered.value, sessionstore.FailedPrecondition)
    assert answered.value.reason == "TOOL_CALL_ANSWERED"
    assert answered.value.tool_call_id == "call_done"

    with pytest.raises(sessionstore.LimitExceeded) as limit:
        client.request_approval(sid, tool_call_id="call_a", title="x" * 1025)
    assert limit.value.field == "title"
    with pytest.raises(sessionstore.SessionNotFound):
        client.request_approval("ses_missing", tool_call_id="call_a")

    pending = client.request_approval(sid, tool_call_id="call_a").approval
    with pytest.raises(sessionstore.ApprovalExists) as exists:
        client.request_approval(sid, tool_call_id="call_a")
    assert isinstance(exists.value, sessionstore.AlreadyExists)
    assert exists.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert exists.value.reason == "APPROVAL_EXISTS"
    assert exists.value.approval_id == pending.approval_id
    assert exists.value.tool_call_id == "call_a"

    with pytest.raises(sessionstore.ApprovalNotFound) as missing:
        client.get_approval(sid, approval_id="apr_nope")
    assert isinstance(missing.value, sessionstore.NotFound)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.reason == "APPROVAL_NOT_FOUND"
    assert missing.value.approval_id == "apr_nope"
    with pytest.raises(sessionstore.ApprovalNotFound):
        client.decide_approval(sid, approval_id="apr_nope", decision="approve")
    with pytest.raises(ValueError):
        client.decide_approval(sid, approval_id=pending.approval_id, decision="maybe")
    with pytest.raises(sessionstore.InvalidArgument) as no_decision:
        client.decide_approval(
            sid, approval_id=pending.approval_id, decision=v1.APPROVAL_DECISION_UNSPECIFIED
        )
    assert no_decision.value.field == "decision"
    with pytest.raises(sessionstore.LimitExceeded) as long_reason:
        client.decide_approval(
            sid, approval_id=pending.approval_id, decision="deny", reason="x" * 65_537
        )
    assert long_reason.value.field == "reason"

    client.decide_approval(sid, approval_id=pending.approval_id, decision="approve", decided_by="carol")
    with pytest.raises(sessionstore.ApprovalAlreadyDecided) as decided:
        client.decide_approval(sid, approval_id=pending.approval_id, decision="deny", decided_by="dave")
    error = decided.value
    assert isinstance(error, sessionstore.FailedPrecondition)
    assert error.reason == "APPROVAL_ALREADY_DECIDED"
    assert error.approval_id == pending.approval_id
    assert error.state == v1.APPROVAL_STATE_APPROVED
    assert error.decided_by == "carol"

    # A session another run holds: its run may ask, nobody else.
    client.begin_run(sid, run_id="run-1", lease=60)
    client.append_exchange(
        sid,
        messages=[user("and the other one?")],
        provider_call={"provider": "openai", "model": "gpt-tools"},
        response_messages=[calling("call_c")],
        run_id="run-1",
    )
    with pytest.raises(sessionstore.SessionBusy) as busy:
        client.request_approval(sid, tool_call_id="call_c")
    assert busy.value.active_run_id == "run-1"
    assert client.request_approval(sid, tool_call_id="call_c", run_id="run-1").approval.run_id == "run-1"

    with pytest.raises(sessionstore.InvalidArgument) as bad_page:
        client.list_approvals(page_size=-1)
    assert bad_page.value.field == "page_size"


def test_an_expired_approval_raises_approval_expired(client: sessionstore.Client) -> None:
    sid = session_calling(client, "call_a")
    expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
    approval = client.request_approval(sid, tool_call_id="call_a", expire_time=expire).approval
    time.sleep(max(0.0, expire.timestamp() - time.time()) + 0.2)
    with pytest.raises(sessionstore.ApprovalExpired) as expired:
        client.decide_approval(sid, approval_id=approval.approval_id, decision="approve")
    assert isinstance(expired.value, sessionstore.FailedPrecondition)
    assert expired.value.reason == "APPROVAL_EXPIRED"
    assert expired.value.approval_id == approval.approval_id
    assert client.get_approval(sid, approval_id=approval.approval_id).state == (
        v1.APPROVAL_STATE_EXPIRED
    )
    assert [a.approval_id for a in client.iter_approvals(state="expired")] == [approval.approval_id]
    # The call may be asked about again.
    again = client.request_approval(sid, tool_call_id="call_a").approval
    assert again.approval_id != approval.approval_id


@pytest.mark.asyncio
async def test_the_async_client_does_the_same(server: Server) -> None:
    with server.client() as blocking:
        sid = session_calling(blocking, "call_a", "call_b")
    async with server.async_client() as client:
        asked = await client.request_approval(
            sid, tool_call_id="call_a", title="Delete?", expire_time=in_an_hour()
        )
        assert asked.revision == 3
        approval = asked.approval
        assert await client.get_approval(sid, approval_id=approval.approval_id) == approval
        second = (await client.request_approval(sid, tool_call_id="call_b")).approval
        pending = [a.approval_id async for a in client.iter_approvals(state="pending", page_size=1)]
        assert pending == [approval.approval_id, second.approval_id]
        page = await client.list_approvals(session_id=sid, page_size=1)
        assert [a.approval_id for a in page.approvals] == [approval.approval_id]
        denied = await client.decide_approval(
            sid, approval_id=approval.approval_id, decision="deny", reason="no", decided_by="al"
        )
        assert denied.tool_result.message.content == "no"
        with pytest.raises(sessionstore.ApprovalAlreadyDecided) as decided:
            await client.decide_approval(sid, approval_id=approval.approval_id, decision="approve")
        assert (decided.value.state, decided.value.decided_by) == (v1.APPROVAL_STATE_DENIED, "al")
        with pytest.raises(sessionstore.ApprovalNotFound):
            await client.get_approval(sid, approval_id="apr_nope")
        with pytest.raises(sessionstore.ApprovalExists) as exists:
            await client.request_approval(sid, tool_call_id="call_b")
        assert exists.value.approval_id == second.approval_id
        with pytest.raises(sessionstore.UnknownToolCall):
            await client.request_approval(sid, tool_call_id="call_nowhere")
