"""Queued input with both clients against a real server: submit (appended
at once, queued, interrupting, rejected; retried under its request id),
take, list and iterate, withdraw, ``end_run(take_next=True)``, and every
refusal as its exception class with its metadata."""

from __future__ import annotations

import threading
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


def user(text: str) -> v1.Message:
    return v1.Message(role=v1.ROLE_USER, content=text)


def texts(messages: Any) -> list[str]:
    """The contents of messages, or of stored messages."""
    return [getattr(msg, "message", msg).content for msg in messages]


def busy_session(client: sessionstore.Client, run_id: str = "run-a") -> str:
    """A new session whose lease ``run_id`` holds (revision 2)."""
    sid = client.create_session().id
    client.begin_run(sid, run_id=run_id, lease=600)
    return sid


def test_submit_take_list_withdraw_and_end_taking_the_next(client: sessionstore.Client) -> None:
    sid = client.create_session().id

    # Not busy: appended at once, whatever the mode.
    now = client.submit_input(sid, [user("hello")], mode="reject")
    assert isinstance(now, v1.SubmitInputResponse)
    assert not now.queued
    assert not now.HasField("input")
    assert now.revision == 2
    assert texts(now.messages) == ["hello"]
    assert now.messages[0].sequence == 0

    # A run holds the lease: queued in order, out of the history.
    client.begin_run(sid, run_id="run-a", lease=600)
    answer = client.submit_input(sid, [user("one")])
    assert answer.queued and answer.revision == 4
    one = answer.input
    assert one.input_id.startswith("inp_")
    assert (one.session_id, one.position, one.mode) == (sid, 1, v1.INPUT_MODE_QUEUE)
    assert texts(one.messages) == ["one"]
    assert one.HasField("create_time")
    # Messages as dicts, the mode as the enum value or its full name.
    two = client.submit_input(
        sid, [{"role": "ROLE_USER", "content": "two a"}, user("two b")], mode=v1.INPUT_MODE_QUEUE
    ).input
    three = client.submit_input(sid, [user("three")], mode="INPUT_MODE_QUEUE").input
    assert (two.position, three.position) == (2, 3)
    assert texts(two.messages) == ["two a", "two b"]
    assert texts(client.export_history(sid)) == ["hello"]

    # Listing: by position, page after page.
    page = client.list_queued_inputs(sid, page_size=2)
    assert isinstance(page, v1.ListQueuedInputsResponse)
    assert list(page.inputs) == [one, two]
    assert page.next_page_token
    rest = client.list_queued_inputs(sid, page_size=2, page_token=page.next_page_token)
    assert list(rest.inputs) == [three] and rest.next_page_token == ""
    assert list(client.iter_queued_inputs(sid, page_size=1)) == [one, two, three]

    # Withdrawn: gone; again, the same revision.
    withdrawn = client.withdraw_queued_input(sid, input_id=three.input_id)
    assert isinstance(withdrawn, v1.WithdrawQueuedInputResponse)
    assert withdrawn.revision == 7
    assert client.withdraw_queued_input(sid, input_id=three.input_id).revision == 7
    assert list(client.iter_queued_inputs(sid)) == [one, two]

    # The lease holder takes the oldest; ending takes the next first.
    taken = client.take_queued_input(sid, run_id="run-a")
    assert isinstance(taken, v1.TakeQueuedInputResponse)
    assert taken.input == one
    assert (taken.revision, taken.next_sequence) == (8, 2)
    assert texts(taken.messages) == ["one"] and taken.messages[0].sequence == 1
    ended = client.end_run(sid, run_id="run-a", take_next=True)
    assert isinstance(ended, v1.EndRunResponse)
    assert ended.taken_input == two
    assert ended.revision == 10
    assert client.get_session(sid).active_run_id == ""
    assert texts(client.export_history(sid)) == ["hello", "one", "two a", "two b"]
    assert list(client.iter_queued_inputs(sid)) == []

    # Without take_next, as before; with it and nothing waiting, no input.
    assert not client.end_run(sid, run_id="run-a").HasField("taken_input")
    client.begin_run(sid, run_id="run-b", lease=600)
    ended = client.end_run(sid, run_id="run-b", take_next=True)
    assert not ended.HasField("taken_input")
    assert ended.revision == 12
    assert client.get_session(sid).active_run_id == ""

    # Watchers see each step.
    with client.watch(sid, after_revision=3) as events:
        kinds = []
        for event in events:
            if event.HasField("caught_up"):
                break
            kinds.append((event.revision, event.WhichOneof("event")))
    assert kinds == [
        (4, "input_queued"),
        (5, "input_queued"),
        (6, "input_queued"),
        (7, "input_withdrawn"),
        (8, "input_taken"),
        (9, "input_taken"),
        (10, "run_ended"),
        (11, "run_begun"),
        (12, "run_ended"),
    ]


def test_an_interrupt_asks_the_run_to_stop(client: sessionstore.Client) -> None:
    sid = busy_session(client)
    assert not client.publish_delta(sid, run_id="run-a", index=0, text="work").cancel_requested
    answer = client.submit_input(sid, [user("stop, do this instead")], mode="interrupt")
    assert answer.queued
    assert answer.input.mode == v1.INPUT_MODE_INTERRUPT
    assert answer.revision == 4, "input_queued, then run_cancel_requested"
    assert client.publish_delta(sid, run_id="run-a", index=1, text="more").cancel_requested

    with pytest.raises(sessionstore.SessionBusy) as busy:
        client.submit_input(sid, [user("no")], mode="reject")
    assert busy.value.active_run_id == "run-a"
    assert client.get_session(sid).revision == 4


def test_a_submission_is_keyed_by_its_request_id(client: sessionstore.Client) -> None:
    generated = _requests.submit_input("s", [user("x")], "interrupt", None)
    uuid.UUID(generated.request_id)  # every submission carries a fresh idempotency key
    assert generated.mode == v1.INPUT_MODE_INTERRUPT
    assert _requests.submit_input("s", [], "queue", "mine").request_id == "mine"
    assert _requests.input_mode("REJECT") == v1.INPUT_MODE_REJECT
    with pytest.raises(ValueError):
        _requests.input_mode("maybe")

    sid = busy_session(client)
    first = client.submit_input(sid, [user("once")], request_id="in-1")
    again = client.submit_input(sid, [user("once")], request_id="in-1")
    assert again == first, "a retry answers the first submission"
    assert len(list(client.iter_queued_inputs(sid))) == 1
    with pytest.raises(sessionstore.RequestIdReused) as reused:
        client.submit_input(sid, [user("other")], request_id="in-1")
    assert reused.value.code == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(sessionstore.RequestIdReused):
        client.submit_input(sid, [user("once")], mode="interrupt", request_id="in-1")
    # Also after the input was taken.
    client.take_queued_input(sid, run_id="run-a")
    assert client.submit_input(sid, [user("once")], request_id="in-1") == first


def test_a_submission_survives_a_server_restart(
    make_server: Callable[..., Server], tmp_path: Path, retry_signal: RetrySignal
) -> None:
    server = make_server(database_url=f"sqlite://{tmp_path / 'db.sqlite'}")
    with server.client(retry_policy=PATIENT) as client:
        sid = busy_session(client)
        server.kill()
        result: dict[str, Any] = {}

        def submit() -> None:
            try:
                result["submitted"] = client.submit_input(sid, [user("while down")])
            except Exception as error:  # reported below
                result["error"] = error

        submitter = threading.Thread(target=submit)
        submitter.start()
        assert retry_signal.retried.wait(30), "the client never retried"
        server.start()
        submitter.join(60)
        assert "error" not in result, result
        assert result["submitted"].queued
        assert result["submitted"].input.position == 1
        assert [i.input_id for i in client.iter_queued_inputs(sid)] == [
            result["submitted"].input.input_id
        ]


def test_queue_errors_are_typed(client: sessionstore.Client) -> None:
    sid = client.create_session().id

    with pytest.raises(sessionstore.LeaseNotHeld) as not_held:
        client.take_queued_input(sid, run_id="run-x")
    error = not_held.value
    assert isinstance(error, sessionstore.FailedPrecondition)
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "LEASE_NOT_HELD"
    assert error.run_id == "run-x"
    assert not error.transient

    client.begin_run(sid, run_id="run-a", lease=600)
    with pytest.raises(sessionstore.LeaseNotHeld) as other_run:
        client.take_queued_input(sid, run_id="run-b")
    assert other_run.value.run_id == "run-b"
    with pytest.raises(sessionstore.QueueEmpty) as empty:
        client.take_queued_input(sid, run_id="run-a")
    assert isinstance(empty.value, sessionstore.NotFound)
    assert empty.value.code == grpc.StatusCode.NOT_FOUND
    assert empty.value.reason == "QUEUE_EMPTY"

    with pytest.raises(sessionstore.InputNotFound) as missing:
        client.withdraw_queued_input(sid, input_id="inp_nope")
    assert isinstance(missing.value, sessionstore.NotFound)
    assert missing.value.reason == "INPUT_NOT_FOUND"
    assert missing.value.input_id == "inp_nope"

    queued = client.submit_input(sid, [user("soon taken")]).input
    client.take_queued_input(sid, run_id="run-a")
    with pytest.raises(sessionstore.InputAlreadyTaken) as taken:
        client.withdraw_queued_input(sid, input_id=queued.input_id)
    assert isinstance(taken.value, sessionstore.FailedPrecondition)
    assert taken.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert taken.value.reason == "INPUT_ALREADY_TAKEN"
    assert taken.value.input_id == queued.input_id

    with pytest.raises(sessionstore.InvalidArgument) as no_messages:
        client.submit_input(sid, [])
    assert no_messages.value.field == "messages"
    with pytest.raises(sessionstore.LimitExceeded) as too_many:
        client.submit_input(sid, [user(f"m{i}") for i in range(101)])
    assert too_many.value.field == "messages"
    with pytest.raises(sessionstore.SessionNotFound):
        client.submit_input("ses_missing", [user("hi")])
    with pytest.raises(sessionstore.SessionNotFound):
        client.list_queued_inputs("ses_missing")
    with pytest.raises(sessionstore.InvalidArgument) as bad_page:
        client.list_queued_inputs(sid, page_size=-1)
    assert bad_page.value.field == "page_size"

    # A full queue: 100 wait, the next is refused and nothing is written.
    for i in range(100):
        assert client.submit_input(sid, [user(f"wait {i}")]).queued
    revision = client.get_session(sid).revision
    with pytest.raises(sessionstore.QueueFull) as full:
        client.submit_input(sid, [user("one too many")])
    assert isinstance(full.value, sessionstore.ResourceExhausted)
    assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert full.value.reason == "QUEUE_FULL"
    assert full.value.limit == 100
    assert not full.value.transient
    assert client.get_session(sid).revision == revision
    assert len(list(client.iter_queued_inputs(sid))) == 100

    # The run ends without taking them: busy still, with no run to name.
    client.end_run(sid, run_id="run-a")
    with pytest.raises(sessionstore.SessionBusy) as busy:
        client.submit_input(sid, [user("no")], mode="reject")
    assert busy.value.active_run_id == ""


@pytest.mark.asyncio
async def test_the_async_client_does_the_same(server: Server) -> None:
    with server.client() as blocking:
        sid = busy_session(blocking)
    async with server.async_client() as client:
        first = await client.submit_input(sid, [user("one")], request_id="a-1")
        assert first.queued and first.input.position == 1
        assert await client.submit_input(sid, [user("one")], request_id="a-1") == first
        second = (await client.submit_input(sid, [user("two")], mode="interrupt")).input
        third = (await client.submit_input(sid, [user("three")])).input
        waiting = [i.input_id async for i in client.iter_queued_inputs(sid, page_size=1)]
        assert waiting == [first.input.input_id, second.input_id, third.input_id]
        page = await client.list_queued_inputs(sid, page_size=1)
        assert list(page.inputs) == [first.input]
        withdrawn = await client.withdraw_queued_input(sid, input_id=third.input_id)
        assert withdrawn.revision == (await client.get_session(sid)).revision

        taken = await client.take_queued_input(sid, run_id="run-a")
        assert taken.input == first.input and texts(taken.messages) == ["one"]
        with pytest.raises(sessionstore.InputAlreadyTaken):
            await client.withdraw_queued_input(sid, input_id=first.input.input_id)
        with pytest.raises(sessionstore.LeaseNotHeld):
            await client.take_queued_input(sid, run_id="run-b")
        ended = await client.end_run(sid, run_id="run-a", take_next=True)
        assert ended.taken_input == second
        with pytest.raises(sessionstore.InputNotFound):
            await client.withdraw_queued_input(sid, input_id="inp_nope")

        await client.begin_run(sid, run_id="run-b", lease=600)
        with pytest.raises(sessionstore.QueueEmpty):
            await client.take_queued_input(sid, run_id="run-b")
        assert not (await client.end_run(sid, run_id="run-b", take_next=True)).HasField(
            "taken_input"
        )
        now = await client.submit_input(sid, [user("not busy")], mode="reject")
        assert not now.queued
        assert texts(await client.export_history(sid)) == ["one", "two", "not busy"]
