"""The blocking client against a real server."""

from __future__ import annotations

import datetime
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

import sessionstore
from sessionstore import RetryPolicy, v1
from sessionstore import _requests, _watch

from .conftest import TOKENS, RetrySignal, Server, free_port

PATIENT = RetryPolicy(max_attempts=60, initial_backoff=0.05, max_backoff=0.5)


def user(text: str) -> v1.Message:
    return v1.Message(role=v1.ROLE_USER, content=text)


def assistant(text: str) -> v1.Message:
    return v1.Message(role=v1.ROLE_ASSISTANT, content=text)


def test_round_trip(client: sessionstore.Client) -> None:
    session = client.create_session(
        session_id="py-round-trip",
        title="trip",
        system_prompt="Be brief.",
        user="alice",
        metadata={"app": "weather"},
        initial_history=[user("earlier"), {"role": "ROLE_ASSISTANT", "content": "noted"}],
    )
    assert isinstance(session, v1.Session)
    assert (session.id, session.revision, session.metadata["app"]) == ("py-round-trip", 1, "weather")

    thinking = v1.ContentBlock(thinking=v1.ThinkingBlock(thinking="hmm", signature="sig=="))
    appended = client.append_exchange(
        session.id,
        messages=[{"role": "ROLE_USER", "content": "hello \u0000 world"}],
        provider_call={"provider": "openai", "model": "gpt-x", "prompt_tokens": 3,
                       "completion_tokens": 2, "cost_micros_usd": 7},
        response_messages=[
            v1.Message(role=v1.ROLE_ASSISTANT, content="hi", content_blocks=[thinking])
        ],
        expected_next_sequence=2,
    )
    assert isinstance(appended, v1.AppendExchangeResponse)
    assert (appended.revision, appended.next_sequence) == (2, 4)
    assert [m.sequence for m in appended.messages] == [2, 3]
    assert appended.provider_call.model == "gpt-x"

    assert client.get_session(session.id).revision == 2

    history = client.export_history(session.id, include_system_prompt=True)
    assert [m.role for m in history] == [
        v1.ROLE_SYSTEM, v1.ROLE_USER, v1.ROLE_ASSISTANT, v1.ROLE_USER, v1.ROLE_ASSISTANT
    ]
    assert history[3].content == "hello \u0000 world"
    assert history[4].content_blocks[0].thinking.signature == "sig=="
    assert [m.content for m in client.export_history(session.id, after_sequence=2)] == ["hi"]
    assert len(list(client.iter_history(session.id, max_messages=2))) == 2

    stored = list(client.iter_messages(session.id, page_size=1))
    assert [m.sequence for m in stored] == [0, 1, 2, 3]
    page = client.list_messages(session.id, page_size=3)
    assert len(page.messages) == 3 and page.next_page_token
    newest = list(client.iter_messages(session.id, page_size=1, order_by="sequence desc"))
    assert [m.sequence for m in newest] == [3, 2, 1, 0]
    between = client.list_messages(
        session.id, after_sequence=0, before_sequence=3, order_by="sequence desc"
    )
    assert [m.sequence for m in between.messages] == [2, 1]
    assert [c.model for c in client.iter_provider_calls(session.id)] == ["gpt-x"]

    client.create_session(session_id="py-other", user="bob")
    summaries = list(client.iter_sessions(page_size=1))
    assert {s.session.id for s in summaries} == {"py-round-trip", "py-other"}
    mine = list(client.iter_sessions(user="alice"))
    assert [s.session.id for s in mine] == ["py-round-trip"]
    assert mine[0].message_count == 4 and mine[0].total_cost_micros_usd == 7

    updated = client.update_session(session.id, title="renamed")
    assert (updated.title, updated.system_prompt) == ("renamed", "Be brief.")

    markdown = client.export_transcript(session.id)
    assert "hello" in markdown and "Be brief." in markdown
    assert '"role"' in client.export_transcript(session.id, format="openai_json")

    entry = client.set_state(session.id, key="cwd", value="/tmp")
    assert client.get_state(session.id, key="cwd").value == "/tmp"
    assert [e.key for e in client.iter_state(session.id)] == ["cwd"]
    client.set_state(session.id, key="cwd", value="/srv", expected_version=entry.version)
    client.delete_state(session.id, key="cwd")

    fork = client.fork_session(session.id, at_sequence=1, new_session_id="py-fork")
    assert fork.parent_session_id == session.id
    assert len(client.export_history("py-fork")) == 2

    rolled = client.rollback_session(session.id, after_sequence=1)
    assert rolled.next_sequence == 2
    message_id = client.list_messages(session.id).messages[1].id
    edited = client.edit_message(
        session.id, message_id=message_id, message=assistant("edited"), reason="typo"
    )
    assert edited.message.message.content == "edited"
    client.redact_message(session.id, message_id=message_id, reason="pii")
    assert client.list_messages(session.id).messages[1].redacted

    hits = list(client.iter_search("earlier"))
    assert {h.session_id for h in hits} == {session.id, "py-fork"}

    client.delete_session(session.id)
    with pytest.raises(sessionstore.SessionNotFound):
        client.get_session(session.id)


def test_an_append_retried_with_its_request_id_is_stored_once(client: sessionstore.Client) -> None:
    session = client.create_session()
    generated = _requests.append_exchange(session.id, [user("x")], None, None, (), None, None, "", ())
    uuid.UUID(generated.request_id)  # every append carries a fresh idempotency key
    first = client.append_exchange(session.id, messages=[user("once")], request_id="req-1")
    again = client.append_exchange(session.id, messages=[user("once")], request_id="req-1")
    assert again.revision == first.revision
    assert len(client.export_history(session.id)) == 1
    with pytest.raises(sessionstore.RequestIdReused) as reused:
        client.append_exchange(session.id, messages=[user("different")], request_id="req-1")
    assert reused.value.request_id == "req-1"
    assert isinstance(reused.value, sessionstore.AlreadyExists)


def test_errors_are_typed_with_their_fields(client: sessionstore.Client) -> None:
    with pytest.raises(sessionstore.NotFound) as missing:
        client.get_session("ses_missing")
    error = missing.value
    assert isinstance(error, sessionstore.SessionNotFound)
    assert isinstance(error, sessionstore.SessionstoreError)
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert error.reason == "SESSION_NOT_FOUND"
    assert error.metadata["session_id"] == "ses_missing" == error.session_id
    assert not error.transient

    client.create_session(session_id="py-errors")
    with pytest.raises(sessionstore.AlreadyExists) as exists:
        client.create_session(session_id="py-errors")
    assert exists.value.reason == "SESSION_ALREADY_EXISTS"

    with pytest.raises(sessionstore.InvalidArgument) as invalid:
        client.append_exchange("py-errors", messages=[{"content": "no role"}])
    assert invalid.value.field == "messages[0].role"
    assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert invalid.value.description

    client.append_exchange("py-errors", messages=[user("a"), user("b")])
    with pytest.raises(sessionstore.SequenceMismatch) as mismatch:
        client.append_exchange("py-errors", messages=[user("c")], expected_next_sequence=0)
    assert mismatch.value.actual_next_sequence == 2
    assert mismatch.value.expected_next_sequence == 0
    assert mismatch.value.code == grpc.StatusCode.ABORTED
    assert isinstance(mismatch.value, sessionstore.Aborted)

    with pytest.raises(sessionstore.StateNotFound) as no_state:
        client.get_state("py-errors", key="nope")
    assert no_state.value.key == "nope"
    client.set_state("py-errors", key="k", value="v")
    with pytest.raises(sessionstore.StateVersionMismatch) as version:
        client.set_state("py-errors", key="k", value="w", expected_version=0)
    assert isinstance(version.value, sessionstore.Aborted)
    assert version.value.actual_version and version.value.expected_version == 0

    client.begin_run("py-errors", run_id="run-1", lease=60)
    with pytest.raises(sessionstore.FailedPrecondition) as busy:
        client.append_exchange("py-errors", messages=[user("while busy")])
    assert isinstance(busy.value, sessionstore.SessionBusy)
    assert busy.value.reason == "SESSION_BUSY"
    assert busy.value.active_run_id == "run-1"
    client.append_exchange("py-errors", messages=[user("the run's")], run_id="run-1")
    client.end_run("py-errors", run_id="run-1")

    with pytest.raises(sessionstore.RevisionOutOfRange) as out_of_range:
        next(iter(client.watch("py-errors", after_revision=999)))
    assert out_of_range.value.after_revision == 999

    with pytest.raises(ValueError):
        client.update_session("py-errors")


def test_unavailable_is_retried_until_the_server_is_up(
    make_server: Callable[..., Server], retry_signal: RetrySignal
) -> None:
    port = free_port()
    with sessionstore.Client(f"http://127.0.0.1:{port}", retry_policy=RetryPolicy.never()) as impatient:
        with pytest.raises(sessionstore.Unavailable) as down:
            impatient.list_sessions()
        assert down.value.transient and down.value.code == grpc.StatusCode.UNAVAILABLE

    # The client starts first; the server only once a retry happened.
    result: dict[str, Any] = {}
    with sessionstore.Client(f"http://127.0.0.1:{port}", retry_policy=PATIENT) as client:
        def call() -> None:
            try:
                result["page"] = client.list_sessions()
            except Exception as error:  # reported below
                result["error"] = error

        caller = threading.Thread(target=call)
        caller.start()
        assert retry_signal.retried.wait(30), "the client never retried"
        server = make_server(start=False)
        server.start(port=port)
        caller.join(60)
        assert "error" not in result, result
        assert list(result["page"].sessions) == []


def test_an_append_survives_a_server_restart(
    make_server: Callable[..., Server], tmp_path: Path, retry_signal: RetrySignal
) -> None:
    server = make_server(database_url=f"sqlite://{tmp_path / 'db.sqlite'}")
    with server.client(retry_policy=PATIENT) as client:
        session = client.create_session()
        client.append_exchange(session.id, messages=[user("before")])
        server.kill()
        result: dict[str, Any] = {}

        def append() -> None:
            try:
                result["appended"] = client.append_exchange(
                    session.id, messages=[user("across the restart")]
                )
            except Exception as error:
                result["error"] = error

        appender = threading.Thread(target=append)
        appender.start()
        assert retry_signal.retried.wait(30)
        server.start()
        appender.join(60)
        assert "error" not in result, result
        assert result["appended"].next_sequence == 2
        assert [m.content for m in client.export_history(session.id)] == [
            "before", "across the restart"
        ]


def test_rate_limits_are_retried_after_the_servers_delay(
    make_server: Callable[..., Server]
) -> None:
    server = make_server(args=("--max-requests-per-second", "2"))
    with server.client(retry_policy=RetryPolicy.never()) as impatient:
        with pytest.raises(sessionstore.RateLimited) as limited:
            for _ in range(50):
                impatient.list_sessions()
    error = limited.value
    assert isinstance(error, sessionstore.ResourceExhausted)
    assert error.reason == "RATE_LIMITED" and error.transient
    assert error.retry_delay is not None and error.retry_delay > 0

    with server.client() as client:
        for _ in range(6):
            client.list_sessions()


def test_watch_resumes_across_a_restart_on_a_file_database(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = make_server(database_url=f"sqlite://{tmp_path / 'db.sqlite'}")
    with server.client(watch_retry_policy=PATIENT) as client:
        session = client.create_session()
        client.append_exchange(session.id, messages=[user("one")])
        with client.watch(session.id) as events:
            seen = []
            for event in events:
                seen.append((event.revision, event.WhichOneof("event")))
                if event.HasField("caught_up"):
                    break
            assert seen == [(1, "session_created"), (2, "exchange_appended"), (2, "caught_up")]

            server.kill()  # no goodbye: the stream breaks
            server.start()
            client.append_exchange(session.id, messages=[user("two")])
            client.set_state(session.id, key="k", value="v")

            later = []
            for event in events:
                kind = event.WhichOneof("event")
                if kind == "progress":
                    continue
                later.append((event.revision, kind))
                if event.revision == 4:
                    break
            # Nothing replayed twice, no second caught_up, nothing missed.
            assert later == [(3, "exchange_appended"), (4, "state_changed")]
            assert events.last_revision == 4
            assert events.reconnects >= 1

            server.terminate()  # graceful: the stream ends without session_deleted
            server.start()
            # Deleted while the watch was away: the log is gone with the
            # session, so the resumed watch ends with SessionNotFound rather
            # than session_deleted.
            client.delete_session(session.id)
            with pytest.raises(sessionstore.SessionNotFound):
                next(events)
            assert list(events) == []


def test_watch_passes_deltas_once(client: sessionstore.Client) -> None:
    session = client.create_session()
    client.begin_run(session.id, run_id="run-7", lease=60)
    client.publish_delta(session.id, run_id="run-7", index=0, text="Hel")
    with client.watch(session.id, include_active_deltas=True) as events:
        kinds = []
        for event in events:
            kinds.append(event.WhichOneof("event"))
            if kinds[-1] == "delta":
                assert event.delta.text == "Hel"
                break
        assert kinds == ["session_created", "run_begun", "caught_up", "delta"]
        client.publish_delta(session.id, run_id="run-7", index=1, block={"text": {"text": "lo"}})
        client.append_exchange(session.id, messages=[user("hi")], run_id="run-7")
        event = next(events)
        assert event.delta.block.text.text == "lo"
        assert next(events).HasField("exchange_appended")


def test_cancel_run_reaches_the_producer_and_watchers(client: sessionstore.Client) -> None:
    session = client.create_session()
    client.publish_delta(session.id, run_id="run-8", index=0, text="Once")
    with pytest.raises(sessionstore.FailedPrecondition) as refused:
        client.cancel_run(session.id, run_id="nobody")
    assert refused.value.reason == "RUN_NOT_ACTIVE"
    with client.watch(session.id, after_revision=1, include_active_deltas=True) as events:
        assert next(events).HasField("caught_up")
        assert next(events).delta.text == "Once"
        cancelled = client.cancel_run(session.id, run_id="run-8", reason="stop")
        event = next(events)
        assert event.run_cancel_requested.run_id == "run-8"
        assert event.run_cancel_requested.reason == "stop"
        assert event.revision == cancelled.revision
    answer = client.publish_delta(session.id, run_id="run-8", index=1, text=" upon")
    assert answer.cancel_requested
    assert client.cancel_run(session.id, run_id="run-8").revision == cancelled.revision


def test_watch_cuts_a_merged_delta_to_what_is_new(make_server: Callable[..., Server]) -> None:
    # Text deltas are merged at every second one: a resumed watch lands
    # inside merged ranges and must not repeat any text.
    server = make_server(args=("--max-run-deltas", "2"))
    with server.client() as client:
        session = client.create_session()
        pieces = [f"p{i}é " for i in range(6)]
        for index, piece in enumerate(pieces[:3]):
            client.publish_delta(session.id, run_id="r", index=index, text=piece)
        state = _watch.WatchState(after_revision=session.revision)
        seen = ""
        with client.watch(session.id, session.revision, include_active_deltas=True) as events:
            for event in events:
                if event.HasField("delta"):
                    assert state.admit(event)
                    seen += event.delta.text
                    if event.delta.index == 2:
                        break
        assert seen == "".join(pieces[:3])
        for index, piece in enumerate(pieces[3:], start=3):
            client.publish_delta(session.id, run_id="r", index=index, text=piece)
        # What a reconnect receives: the merged buffer from its start.
        with client.watch(session.id, session.revision, include_active_deltas=True) as events:
            for event in events:
                if event.HasField("delta"):
                    if state.admit(event):
                        assert event.delta.first_index > 2
                        seen += event.delta.text
                    if event.delta.index == 5:
                        break
        assert seen == "".join(pieces)


def test_token_auth(auth_server: Server) -> None:
    with auth_server.client(retry_policy=RetryPolicy.never()) as anonymous:
        assert anonymous.health_check()  # health answers without a token
        with pytest.raises(sessionstore.Unauthenticated) as refused:
            anonymous.list_sessions()
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    with auth_server.client(token="wrong") as wrong:
        with pytest.raises(sessionstore.Unauthenticated):
            wrong.create_session()
    with auth_server.client(token=TOKENS["acme"]) as acme, auth_server.client(
        token=TOKENS["globex"]
    ) as globex:
        session = acme.create_session(session_id="shared-name")
        assert acme.get_session(session.id).id == "shared-name"
        with pytest.raises(sessionstore.SessionNotFound):
            globex.get_session(session.id)  # another tenant's session is invisible
        globex.create_session(session_id="shared-name")
        assert [s.session.id for s in globex.iter_sessions()] == ["shared-name"]
        with pytest.raises(ValueError):
            sessionstore.Client(auth_server.url, token="two\nlines")


def test_tls(make_server: Callable[..., Server], tls: Any) -> None:
    server = make_server(tls=tls)
    assert server.url.startswith("https://")
    with sessionstore.Client(server.url, tls_ca_certificate=str(tls.ca_path)) as by_path:
        session = by_path.create_session(title="over TLS")
    with sessionstore.Client(server.url, tls_ca_certificate=tls.ca_pem) as by_pem:
        assert by_pem.get_session(session.id).title == "over TLS"
    with sessionstore.Client(
        f"https://localhost:{server.port}", tls_ca_certificate=tls.ca_pem
    ) as by_name:
        assert by_name.health_check()
    # Without the CA the server's certificate is not trusted.
    with sessionstore.Client(server.url, retry_policy=RetryPolicy.never()) as untrusting:
        with pytest.raises(sessionstore.Unavailable):
            untrusting.get_session(session.id)
    # Plaintext to a TLS port fails too.
    with sessionstore.Client(
        f"http://127.0.0.1:{server.port}", retry_policy=RetryPolicy.never()
    ) as plaintext:
        with pytest.raises(sessionstore.SessionstoreError):
            plaintext.get_session(session.id)


def test_urls_and_settings() -> None:
    from sessionstore._transport import parse_url

    assert parse_url("http://127.0.0.1:50051").address == "127.0.0.1:50051"
    assert parse_url("https://example.invalid").address == "example.invalid:443"
    assert parse_url("https://example.invalid:8443").secure
    assert not parse_url("127.0.0.1:50051").secure
    with pytest.raises(ValueError):
        parse_url("ftp://host:1")
    with pytest.raises(ValueError):
        sessionstore.Client("http://127.0.0.1:1", tls_ca_certificate=b"pem")


def test_framework_adapter_calls(client: sessionstore.Client) -> None:
    """What adapters build on: initial state, state changed with an exchange,
    shared scopes, metadata filters, "pop" by rollback, next_sequence."""
    session = client.create_session(
        metadata={"app": "weather"}, user="alice", initial_state={"mode": "brief"}
    )
    assert client.get_state(session.id, key="mode").version == 1
    appended = client.append_exchange(
        session.id,
        messages=[user("hi")],
        state_changes=[{"key": "turns", "value": "1"}, v1.StateChange(key="mode", delete=True)],
    )
    assert client.get_state(session.id, key="turns").version == appended.revision
    with pytest.raises(sessionstore.StateNotFound):
        client.get_state(session.id, key="mode")
    assert client.get_session(session.id).next_sequence == 1

    client.set_state(scope="app:weather", key="units", value="metric")
    assert client.get_state(scope="app:weather", key="units").scope == "app:weather"
    assert [e.key for e in client.iter_state(scope="app:weather")] == ["units"]
    assert client.delete_state(scope="app:weather", key="units").revision == 0

    client.create_session(metadata={"app": "other"}, user="alice")
    found = list(client.iter_sessions(filter='metadata.app = "weather" AND user = "alice"'))
    assert [s.session.id for s in found] == [session.id]
    with pytest.raises(sessionstore.InvalidArgument) as bad_filter:
        client.list_sessions(filter="title ~ 'x'")
    assert bad_filter.value.field == "filter"

    popped = client.rollback_session(
        session.id, after_sequence=-1, expected_next_sequence=1, return_removed=True
    )
    assert [m.message.content for m in popped.removed_messages] == ["hi"]
    with pytest.raises(sessionstore.SequenceMismatch) as stale:
        client.rollback_session(session.id, after_sequence=-1, expected_next_sequence=1)
    assert stale.value.actual_next_sequence == 0


def test_a_first_append_creates_its_session(client: sessionstore.Client) -> None:
    """``create_if_missing``: the session made in the append's own call and
    transaction, with the fields given; an existing one appended to."""
    expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    fields = {
        "title": "made by its first append",
        "user": "alice",
        "metadata": {"app": "weather"},
        "initial_state": {"mode": "brief"},
        "expire_time": expire,
    }
    first = client.append_exchange(
        "py-first", messages=[user("hi")], request_id="first", create_if_missing=fields
    )
    assert first.session_created and (first.revision, first.next_sequence) == (2, 1)
    session = client.get_session("py-first")
    assert (session.title, session.user, dict(session.metadata)) == (
        "made by its first append",
        "alice",
        {"app": "weather"},
    )
    expires = session.expire_time.ToDatetime(tzinfo=datetime.timezone.utc)
    assert abs(expires - expire) < datetime.timedelta(seconds=1)
    assert client.get_state("py-first", key="mode").version == 1
    # A retry answers the first result; a later append finds the session.
    again = client.append_exchange(
        "py-first", messages=[user("hi")], request_id="first", create_if_missing=fields
    )
    assert not again.session_created and again.revision == 2  # it says so once
    later = client.append_exchange(
        "py-first", messages=[user("again")], create_if_missing={"title": "ignored"}
    )
    assert not later.session_created and later.revision == 3
    assert client.get_session("py-first").title == "made by its first append"
    # True: a session with no fields; a request as it is.
    bare = client.append_exchange("py-bare", messages=[user("x")], create_if_missing=True)
    assert bare.session_created
    request = v1.CreateSessionRequest(title="from a request")
    made = client.append_exchange("py-req", messages=[user("x")], create_if_missing=request)
    assert made.session_created and client.get_session("py-req").title == "from a request"
    # Without it, an unknown session is still an error.
    with pytest.raises(sessionstore.SessionNotFound):
        client.append_exchange("py-absent", messages=[user("x")])
    with pytest.raises(sessionstore.InvalidArgument):
        client.append_exchange(
            "py-other", messages=[user("x")], create_if_missing={"session_id": "py-else"}
        )
    with pytest.raises(TypeError):
        client.append_exchange(
            "py-other", messages=[user("x")], create_if_missing="yes"  # type: ignore[arg-type]
        )


def test_rollback_removes_the_last_messages(client: sessionstore.Client) -> None:
    """``remove_last``: a pop in one call, with no read of the session first."""
    session = client.create_session()
    client.append_exchange(session.id, messages=[user(str(i)) for i in range(4)])
    popped = client.rollback_session(session.id, remove_last=1, return_removed=True)
    assert [m.message.content for m in popped.removed_messages] == ["3"]
    assert popped.next_sequence == 3
    two = client.rollback_session(session.id, remove_last=2, return_removed=True)
    assert [m.message.content for m in two.removed_messages] == ["1", "2"]
    rest = client.rollback_session(session.id, remove_last=5, return_removed=True)
    assert [m.message.content for m in rest.removed_messages] == ["0"]  # all there were
    empty = client.rollback_session(session.id, remove_last=1, return_removed=True)
    assert (list(empty.removed_messages), empty.next_sequence, empty.revision) == (
        [],
        0,
        rest.revision,
    )
    with pytest.raises(ValueError, match="needs after_sequence"):
        client.rollback_session(session.id)  # never "keep only the first message" by default
    with pytest.raises(ValueError, match="not both"):
        client.rollback_session(session.id, after_sequence=0, remove_last=1)


def test_export_for_a_model(client: sessionstore.Client) -> None:
    """A conversation on Claude, exported for GPT: Claude's thinking goes,
    the call and its result stay; for Claude itself the thinking stays;
    the provider bodies render as JSON objects for their APIs."""
    client.create_session(session_id="py-switch", system_prompt="Be brief.")
    thinking = {"thinking": {"thinking": "plan", "signature": "sig"}}
    client.append_exchange(
        "py-switch",
        messages=[{"role": "ROLE_USER", "content": "weather?"}],
        provider_call={"provider": "anthropic", "model": "claude-sonnet-4-5"},
        response_messages=[
            {
                "role": "ROLE_ASSISTANT",
                "content_blocks": [thinking],
                "tool_calls": [{"id": "c1", "name": "weather", "arguments": "{}"}],
            }
        ],
    )
    client.append_exchange(
        "py-switch",
        messages=[{"role": "ROLE_TOOL", "tool_call_id": "c1", "content": "sunny"}],
        provider_call={"provider": "anthropic", "model": "claude-sonnet-4-5"},
        response_messages=[{"role": "ROLE_ASSISTANT", "content": "Sunny."}],
    )
    for_gpt = client.export_for("py-switch", "openai", "gpt-5")
    assert [len(m.content_blocks) for m in for_gpt] == [0, 0, 0, 0]
    assert for_gpt[1].tool_calls[0].id == "c1"
    for_claude = client.export_for("py-switch", "anthropic", "claude-sonnet-4-5")
    assert for_claude[1].content_blocks[0].thinking.signature == "sig"
    assert client.export_for("py-switch", "anthropic", "claude-opus-4", reasoning="none")[1].content_blocks == []
    assert len(client.export_for("py-switch", "openai", "gpt-5", max_messages=1)) == 1
    markdown = client.export_transcript("py-switch", provider="openai", model="gpt-5")
    assert "plan" not in markdown and "Sunny." in markdown
    assert "plan" in client.export_transcript("py-switch")
