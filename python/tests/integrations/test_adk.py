"""The Google ADK session service against a real server: ADK's session,
event and state semantics (app:, user:, temp: prefixes, GetSessionConfig,
stale sessions), what lands in sessionstore, how many RPCs it takes, and
ADK's tool confirmations as sessionstore approvals (a run paused in one
process, decided from another client, resumed in a third)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

try:
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.adk.sessions.session import Session
    from google.genai import types
except ImportError as exc:  # never skip: a missing framework is a failure
    pytest.fail(
        f"google-adk is not installed ({exc}): pip install './python[test,adk]'",
        pytrace=False,
    )

import sessionstore
from sessionstore import v1
from sessionstore.integrations import adk
from sessionstore.integrations.adk import (
    EVENT_BLOCK_TYPE,
    SessionstoreSessionService,
    StaleSessionError,
    parse_session_store_id,
    session_store_id,
)

from ..conftest import RpcMeter, Server

APP = "weather"


class CountingClient(sessionstore.AsyncClient):
    """An AsyncClient that records the RPCs the adapter makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []
        #: Each ListMessages's order and page size.
        self.message_reads: list[tuple[str, int]] = []

    async def _call(self, name: str, request: Any, *, retry: bool) -> Any:
        self.calls.append(name)
        if name == "ListMessages":
            self.message_reads.append((request.order_by, request.page_size))
        return await super()._call(name, request, retry=retry)

    def count(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name in self.calls:
            counts[name] = counts.get(name, 0) + 1
        self.calls.clear()
        return counts


@pytest_asyncio.fixture
async def adk_client(server: Server) -> AsyncIterator[CountingClient]:
    adk_client = CountingClient(server.url)
    try:
        yield adk_client
    finally:
        await adk_client.close()


@pytest.fixture
def service(adk_client: CountingClient) -> SessionstoreSessionService:
    return SessionstoreSessionService(client=adk_client)


async def shared(adk_client: sessionstore.AsyncClient, scope: str) -> dict[str, str]:
    return {e.key: e.value async for e in adk_client.iter_state(scope=scope)}


async def own(adk_client: sessionstore.AsyncClient, session: Session) -> dict[str, str]:
    store_id = session_store_id(session.app_name, session.user_id, session.id)
    return {e.key: e.value async for e in adk_client.iter_state(store_id)}


def tool_response(call_id: str, name: str, response: dict[str, Any]) -> types.Part:
    """A part answering the function call ``call_id``."""
    return types.Part(
        function_response=types.FunctionResponse(id=call_id, name=name, response=response)
    )


def delta_event(delta: dict[str, Any], **kwargs: Any) -> Event:
    return Event(invocation_id="inv", author="user", actions=EventActions(state_delta=delta), **kwargs)


def test_stale_session_error_is_adks_own_where_adk_has_one() -> None:
    """google-adk 2.7 brought ``StaleSessionError``; before it, the adapter
    raises a ``ValueError`` of its own (what ADK's services raised)."""
    try:
        from google.adk.errors import StaleSessionError as adks
    except ImportError:
        assert issubclass(StaleSessionError, ValueError)
        assert StaleSessionError.__module__ == adk.__name__
    else:
        assert StaleSessionError is adks


# -- create and get ----------------------------------------------------------


@pytest.mark.asyncio
async def test_create_with_all_prefixes_stores_each_where_it_belongs(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    state = {"city": "Oslo", "app:units": "metric", "user:name": {"first": "Ada"}, "temp:x": 1}
    session = await service.create_session(
        app_name=APP, user_id="ada", state=state, session_id="s1"
    )
    calls = adk_client.count()
    assert calls == {"CreateSession": 1}  # the shared keys written in the same call
    assert session.state == {"city": "Oslo", "app:units": "metric", "user:name": {"first": "Ada"}}
    assert session.id == "s1" and session.events == []

    assert await own(adk_client, session) == {"city": '"Oslo"'}
    assert await shared(adk_client, "adk.app:weather") == {"units": '"metric"'}
    assert await shared(adk_client, "adk.user:weather:ada") == {"name": '{"first": "Ada"}'}
    stored = await adk_client.get_session("adk:weather:ada:s1")
    assert stored.user == "ada"
    assert dict(stored.metadata) == {"adk_app": APP, "adk_user": "ada", "adk_session_id": "s1"}
    assert stored.revision == 1

    got = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert got == session
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=APP, user_id="ada", session_id="s1")


@pytest.mark.asyncio
async def test_create_without_shared_keys_is_one_write(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    session = await service.create_session(app_name=APP, user_id="ada", state={"a": 1})
    calls = adk_client.count()
    assert calls.get("CreateSession") == 1 and "SetState" not in calls
    assert session.id  # a fresh uuid
    assert await service.get_session(app_name=APP, user_id="ada", session_id="nope") is None


@pytest.mark.asyncio
async def test_rpc_costs_as_the_server_counts_them(
    metered_server: Server, meter: RpcMeter
) -> None:
    """What each ADK call costs, from the server's own count of the calls
    it handled (``grpc_server_handled_total``). ``create_session`` and
    ``append_event`` are one RPC each (the session, its own state and its
    ``app:``/``user:`` state written in one ``CreateSession``, which answers
    the merged shared state too); ``get_session`` two, sent together: the
    session with its own, app and user state in one ``GetSession``, and its
    events (``ListMessages`` newest first, or ``ExportHistory`` for a
    model, after the ``GetSession`` whose next sequence it needs)."""
    costs: dict[str, dict[str, int]] = {}
    async with metered_server.async_client() as client:
        service = SessionstoreSessionService(client=client)
        with meter() as costs["create_session (app:, user:, own)"]:
            session = await service.create_session(
                app_name=APP,
                user_id="ada",
                session_id="s1",
                state={"app:units": "metric", "user:name": "Ada", "city": "Oslo"},
            )
        with meter() as costs["create_session (own state only)"]:
            await service.create_session(
                app_name=APP, user_id="ada", session_id="s2", state={"city": "Oslo"}
            )
        with meter() as costs["get_session (no event yet)"]:
            fresh = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
        assert fresh == session
        with meter() as costs["append_event"]:
            await service.append_event(
                session, delta_event({"app:hits": 1, "user:seen": True, "n": 1})
            )
        with meter() as costs["get_session"]:
            got = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
        assert got == session
        with meter() as costs["get_session (num_recent_events=1)"]:
            await service.get_session(
                app_name=APP, user_id="ada", session_id="s1",
                config=GetSessionConfig(num_recent_events=1),
            )
        with meter() as costs["get_session (no session)"]:
            assert await service.get_session(app_name=APP, user_id="ada", session_id="no") is None
        for_model = SessionstoreSessionService(client=client, model="gemini-3-pro")
        with meter() as costs["get_session (model)"]:
            got = await for_model.get_session(app_name=APP, user_id="ada", session_id="s1")
        assert got is not None and got.events == session.events
        with meter() as costs["append_event (after get_session)"]:
            await service.append_event(got, delta_event({"n": 2}))  # not stale
    print("ADK RPC costs:", {call: dict(cost) for call, cost in costs.items()})
    assert costs == {
        "create_session (app:, user:, own)": {"CreateSession": 1},
        "create_session (own state only)": {"CreateSession": 1},
        "get_session (no event yet)": {"ListMessages": 1, "GetSession": 1},
        "append_event": {"AppendExchange": 1},
        "get_session": {"ListMessages": 1, "GetSession": 1},
        "get_session (num_recent_events=1)": {"ListMessages": 1, "GetSession": 1},
        "get_session (no session)": {"ListMessages NotFound": 1, "GetSession NotFound": 1},
        "get_session (model)": {"GetSession": 1, "ExportHistory": 1},
        "append_event (after get_session)": {"AppendExchange": 1},
    }


# -- append_event ------------------------------------------------------------


@pytest.mark.asyncio
async def test_append_event_is_one_exchange_and_one_revision(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    session = await service.create_session(app_name=APP, user_id="ada", session_id="s1")
    store_id = session_store_id(APP, "ada", "s1")
    for i in range(3):
        before = (await adk_client.get_session(store_id)).revision
        adk_client.count()
        event = delta_event(
            {"n": i, "app:hits": i, "user:seen": True, "temp:scratch": "x", "gone": None}
        )
        returned = await service.append_event(session, event)
        assert returned is event
        assert adk_client.count() == {"AppendExchange": 1}
        assert (await adk_client.get_session(store_id)).revision == before + 1
    assert session.state["n"] == 2 and session.state["temp:scratch"] == "x"
    assert session.state["gone"] is None  # ADK keeps None as a value

    got = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert got is not None
    assert got.state == {"n": 2, "app:hits": 2, "user:seen": True, "gone": None}
    assert got.events == session.events
    assert got.last_update_time == pytest.approx(session.events[-1].timestamp)

    # What the server holds: one message per event, state in its scopes, temp nowhere.
    messages = [m async for m in adk_client.iter_messages(store_id)]
    assert len(messages) == 3
    assert all("temp:" not in m.message.content_blocks[0].json.json for m in messages)
    assert await own(adk_client, session) == {"n": "2", "gone": "null"}
    assert await shared(adk_client, "adk.app:weather") == {"hits": "2"}
    assert await shared(adk_client, "adk.user:weather:ada") == {"seen": "true"}


@pytest.mark.asyncio
async def test_partial_events_are_not_stored(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    session = await service.create_session(app_name=APP, user_id="ada")
    adk_client.count()
    event = Event(author="model", partial=True, content=types.Content(role="model", parts=[types.Part(text="Hel")]))
    assert await service.append_event(session, event) is event
    assert adk_client.count() == {}
    assert session.events == []


@pytest.mark.asyncio
async def test_events_round_trip_exactly_with_native_fields(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    session = await service.create_session(app_name=APP, user_id="ada", session_id="s1")
    call = Event(
        invocation_id="inv1",
        author="forecaster",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text="thinking…", thought=True, thought_signature=b"\x00sig"),
                types.Part(text="Let me check. "),
                types.Part(text="One moment."),
                types.Part(
                    function_call=types.FunctionCall(
                        id="call-1", name="get_weather", args={"city": "Oslo", "days": 2}
                    )
                ),
            ],
        ),
        actions=EventActions(state_delta={"asked": "Oslo"}, artifact_delta={"chart.png": 0}),
        long_running_tool_ids={"call-1"},
        usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=3),
    )
    answer = Event(
        invocation_id="inv1",
        author="forecaster",
        content=types.Content(
            role="user",
            parts=[
                tool_response("call-1", "get_weather", {"temp_c": -3}),
                types.Part.from_bytes(data=bytes(range(256)), mime_type="image/png"),
            ],
        ),
        actions=EventActions(transfer_to_agent="other", escalate=True),
    )
    for event in (call, answer):
        await service.append_event(session, event)

    got = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert got is not None
    assert got.events == [call, answer]
    assert got == session

    first, second = [m.message async for m in adk_client.iter_messages(session_store_id(APP, "ada", "s1"))]
    assert first.role == v1.ROLE_ASSISTANT
    assert first.content == "Let me check. One moment."
    assert first.name == "forecaster"
    assert first.metadata["adk_event_id"] == call.id
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("call-1", "get_weather", '{"city": "Oslo", "days": 2}')
    ]
    kinds = [b.WhichOneof("block") for b in first.content_blocks]
    assert kinds == ["json", "thinking"]
    assert first.content_blocks[0].json.type == EVENT_BLOCK_TYPE
    assert first.content_blocks[1].thinking.thinking == "thinking…"
    assert second.role == v1.ROLE_USER
    result = second.content_blocks[1].tool_result
    assert (result.tool_use_id, result.content) == ("call-1", '{"temp_c": -3}')


@pytest.mark.asyncio
async def test_stale_session_is_rejected(service: SessionstoreSessionService) -> None:
    first = await service.create_session(app_name=APP, user_id="ada", session_id="s1")
    second = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert second is not None
    await service.append_event(second, delta_event({"k": 1}))
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(first, delta_event({"k": 2}))
    got = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert got is not None and got.state == {"k": 1} and len(got.events) == 1

    await service.delete_session(app_name=APP, user_id="ada", session_id="s1")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(got, delta_event({"k": 3}))


@pytest.mark.asyncio
async def test_a_repeated_append_is_stored_once(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    session = await service.create_session(app_name=APP, user_id="ada", session_id="s1")
    copy = session.model_copy(deep=True)  # as a caller retrying after an unknown outcome
    event = delta_event({"k": 1})
    await service.append_event(session, event)
    await service.append_event(session, event)  # already in session.events: a no-op
    assert len(session.events) == 1
    await service.append_event(copy, event.model_copy(deep=True))  # same request: same request_id
    got = await service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert got is not None and len(got.events) == 1
    assert (await adk_client.get_session(session_store_id(APP, "ada", "s1"))).revision == 2


# -- shared state and isolation ------------------------------------------------


@pytest.mark.asyncio
async def test_app_and_user_state_are_shared_and_isolated(
    service: SessionstoreSessionService,
) -> None:
    s1 = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"app:k1": "v1", "user:k1": "u1v1"}
    )
    await service.append_event(s1, delta_event({"app:k2": "v2", "user:k2": "u1v2", "own": 1}))

    s1b = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    assert s1b.state == {"app:k1": "v1", "app:k2": "v2", "user:k1": "u1v1", "user:k2": "u1v2"}
    s2 = await service.create_session(app_name=APP, user_id="u2", session_id="s1")
    assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
    other = await service.create_session(app_name="other", user_id="u1", session_id="s1")
    assert other.state == {}

    # A later app: write is seen by every session of the app on its next read.
    await service.append_event(s2, delta_event({"app:k1": "changed"}))
    got = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert got is not None
    assert got.state == {
        "own": 1, "app:k1": "changed", "app:k2": "v2", "user:k1": "u1v1", "user:k2": "u1v2"
    }
    got_u2 = await service.get_session(app_name=APP, user_id="u2", session_id="s1")
    assert got_u2 is not None and got_u2.events == s2.events and "own" not in got_u2.state
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"k1": "u1v1", "k2": "u1v2"}
    assert await service.get_user_state(app_name=APP, user_id="u2") == {}
    assert await service.get_user_state(app_name="other", user_id="u1") == {}


# -- list and delete -----------------------------------------------------------


@pytest.mark.asyncio
async def test_list_by_app_and_by_user_pages_through_one_filtered_listing(
    service: SessionstoreSessionService, adk_client: CountingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adk, "_PAGE", 2)  # several pages of everything
    for user, sid in [("u1", "a"), ("u1", "b"), ("u1", "c"), ("u2", "a"), ('u"3\\', "z")]:
        await service.create_session(
            app_name=APP, user_id=user, session_id=sid, state={"sid": sid, "user:who": user}
        )
    await service.create_session(app_name="other", user_id="u1", session_id="x")
    await service.create_session(app_name=APP + "2", user_id="u1", session_id="y")
    adk_client.count()

    mine = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    calls = adk_client.count()
    assert calls["ListSessions"] == 2  # pages of 2: one filtered listing, paged
    assert [(s.user_id, s.id) for s in mine] == [("u1", "a"), ("u1", "b"), ("u1", "c")]
    assert all(s.events == [] for s in mine)
    assert [s.state for s in mine] == [{"sid": x, "user:who": "u1"} for x in "abc"]
    assert mine[0].last_update_time <= mine[1].last_update_time <= mine[2].last_update_time

    everyone = (await service.list_sessions(app_name=APP)).sessions
    assert sorted((s.user_id, s.id) for s in everyone) == sorted(
        [("u1", "a"), ("u1", "b"), ("u1", "c"), ("u2", "a"), ('u"3\\', "z")]
    )
    assert {s.user_id: s.state["user:who"] for s in everyone} == {
        "u1": "u1", "u2": "u2", 'u"3\\': 'u"3\\'
    }
    quoted = (await service.list_sessions(app_name=APP, user_id='u"3\\')).sessions
    assert [s.id for s in quoted] == ["z"]
    assert (await service.list_sessions(app_name="nobody")).sessions == []

    adk_client.count()
    await service.delete_session(app_name=APP, user_id="u1", session_id="b")
    await service.delete_session(app_name=APP, user_id="u1", session_id="b")  # no-op
    assert adk_client.count() == {"DeleteSession": 2}
    assert await service.get_session(app_name=APP, user_id="u1", session_id="b") is None
    left = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    assert [s.id for s in left] == ["a", "c"]
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"who": "u1"}


@pytest.mark.asyncio
async def test_list_orders_by_last_event(service: SessionstoreSessionService) -> None:
    old = await service.create_session(app_name=APP, user_id="u", session_id="old")
    await service.create_session(app_name=APP, user_id="u", session_id="new")
    await service.append_event(old, Event(author="user", timestamp=old.last_update_time + 100))
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert [s.id for s in listed] == ["new", "old"]
    assert listed[1].last_update_time == pytest.approx(old.last_update_time)


# -- GetSessionConfig ----------------------------------------------------------


@pytest.mark.asyncio
async def test_get_session_config_reads_only_the_tail(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    for i in range(1, 41):
        await service.append_event(session, Event(author="user", timestamp=float(i)))
    store_id = session_store_id(APP, "u", "s")

    async def get(**config: Any) -> list[float]:
        adk_client.message_reads.clear()
        got = await service.get_session(
            app_name=APP, user_id="u", session_id="s", config=GetSessionConfig(**config)
        )
        assert got is not None
        assert got.last_update_time == 40.0
        return [e.timestamp for e in got.events]

    assert await get() == [float(i) for i in range(1, 41)]
    assert await get(num_recent_events=0) == []
    # Just the newest message, for the time.
    assert adk_client.message_reads == [("sequence desc", 1)]
    assert await get(num_recent_events=3) == [38.0, 39.0, 40.0]
    assert adk_client.message_reads == [("sequence desc", 3)]
    assert await get(after_timestamp=37.0) == [37.0, 38.0, 39.0, 40.0]
    assert sum(size for _, size in adk_client.message_reads) <= 1000
    assert await get(after_timestamp=400.0) == []
    assert await get(after_timestamp=38.0, num_recent_events=5) == [38.0, 39.0, 40.0]
    assert await get(after_timestamp=10.0, num_recent_events=2) == [39.0, 40.0]
    assert await get(num_recent_events=100) == [float(i) for i in range(1, 41)]
    assert (await adk_client.get_session(store_id)).next_sequence == 40


@pytest.mark.asyncio
async def test_after_timestamp_pages_backwards(
    service: SessionstoreSessionService, adk_client: CountingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adk, "_PAGE", 4)
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    for i in range(1, 21):
        await service.append_event(session, Event(author="user", timestamp=float(i)))
    adk_client.message_reads.clear()
    got = await service.get_session(
        app_name=APP, user_id="u", session_id="s", config=GetSessionConfig(after_timestamp=15.0)
    )
    assert got is not None and [e.timestamp for e in got.events] == [15.0, 16.0, 17.0, 18.0, 19.0, 20.0]
    # Two pages from the end, not twenty.
    assert adk_client.message_reads == [("sequence desc", 4), ("sequence desc", 4)]


# -- names ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_any_names_map_reversibly(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    names = [
        ("app:with.dots", "user/ä ö", "sess:1.2"),
        ("é", ".2e", "..::"),
        ("a" * 60, "b" * 60, "c" * 60),  # past 128 bytes: a digest id
    ]
    for app_name, user_id, session_id in names:
        store_id = session_store_id(app_name, user_id, session_id)
        assert len(store_id) <= 128
        assert all(c.isascii() and (c.isalnum() or c in "_-.:") for c in store_id)
        session = await service.create_session(
            app_name=app_name,
            user_id=user_id,
            session_id=session_id,
            state={"app:a": 1, "user:u": 2, "s": 3},
        )
        await service.append_event(session, delta_event({"s": 4}))
        got = await service.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
        assert got is not None and got.state == {"app:a": 1, "user:u": 2, "s": 4}
        listed = (await service.list_sessions(app_name=app_name, user_id=user_id)).sessions
        assert [(s.app_name, s.user_id, s.id) for s in listed] == [(app_name, user_id, session_id)]
        if store_id.startswith("adk:"):
            assert parse_session_store_id(store_id) == (app_name, user_id, session_id)
        else:
            assert parse_session_store_id(store_id) is None
            meta = (await adk_client.get_session(store_id)).metadata
            assert (meta["adk_app"], meta["adk_user"], meta["adk_session_id"]) == (
                app_name, user_id, session_id
            )
    assert session_store_id("a", "b:c", "d") != session_store_id("a:b", "c", "d")


# -- switching models ---------------------------------------------------------


def model_event(model: str, *parts: types.Part, **kwargs: Any) -> Event:
    return Event(
        invocation_id="inv",
        author="agent",
        model_version=model,
        content=types.Content(role="model", parts=list(parts)),
        **kwargs,
    )


def turn() -> list[Event]:
    """A user asks; Gemini 3 thinks and calls a tool with a signed call; the
    tool answers; Gemini 2.5 answers with a signed text part."""
    return [
        Event(
            invocation_id="inv",
            author="user",
            content=types.Content(role="user", parts=[types.Part(text="weather in Paris?")]),
        ),
        model_event(
            "gemini-3-pro",
            types.Part(text="look it up\x00", thought=True, thought_signature=b"sig-thought"),
            types.Part(
                function_call=types.FunctionCall(id="adk-1", name="weather", args={"city": "Paris"}),
                thought_signature=b"sig-call",
            ),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=100,
                candidates_token_count=20,
                total_token_count=150,
                cached_content_token_count=40,
                thoughts_token_count=30,
            ),
        ),
        Event(
            invocation_id="inv",
            author="agent",
            content=types.Content(
                role="user", parts=[tool_response("adk-1", "weather", {"celsius": 18})]
            ),
        ),
        model_event("gemini-2.5-flash", types.Part(text="18 °C.", thought_signature=b"sig-text")),
    ]


def unsigned(event: Event) -> Event:
    """``event`` with no thoughts and no thought signatures."""
    if event.content is None or not event.content.parts:
        return event
    parts = [
        part.model_copy(update={"thought_signature": None})
        for part in event.content.parts
        if not part.thought
    ]
    return event.model_copy(update={"content": event.content.model_copy(update={"parts": parts})})


async def stored_turn(service: SessionstoreSessionService, name: str) -> list[Event]:
    session = await service.create_session(app_name=APP, user_id="u", session_id=name)
    events = turn()
    for event in events:
        await service.append_event(session, event)
    return events


@pytest.mark.asyncio
async def test_each_model_gets_its_own_reasoning_only(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    events = await stored_turn(service, "switch")

    async def read(**target: Any) -> list[Event]:
        reader = SessionstoreSessionService(client=adk_client, **target)
        session = await reader.get_session(app_name=APP, user_id="u", session_id="switch")
        assert session is not None
        return session.events

    assert await read() == events
    gemini3 = await read(model="gemini-3-pro")
    assert gemini3 == [events[0], events[1], events[2], unsigned(events[3])]
    assert gemini3[1].content.parts[1].thought_signature == b"sig-call"
    assert await read(model="gemini-2.5-flash") == [
        events[0], unsigned(events[1]), events[2], events[3]
    ]
    assert await read(model="gemini-2.5-pro", reasoning="same_provider") == events
    assert await read(model="gpt-5", provider="openai") == [unsigned(e) for e in events]
    assert await read(model="gemini-3-pro", reasoning="none") == [unsigned(e) for e in events]
    # num_recent_events windows the export.
    reader = SessionstoreSessionService(client=adk_client, model="gpt-5", provider="openai")
    tail = await reader.get_session(
        app_name=APP, user_id="u", session_id="switch", config=GetSessionConfig(num_recent_events=2)
    )
    assert tail is not None and tail.events == [events[2], unsigned(events[3])]


@pytest.mark.asyncio
async def test_model_events_are_recorded_as_their_models_calls(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    await stored_turn(service, "calls")
    store_id = session_store_id(APP, "u", "calls")
    calls = {c.id: c for c in (await adk_client.list_provider_calls(store_id)).provider_calls}
    rows = [m async for m in adk_client.iter_messages(store_id)]
    made = [calls[r.produced_by_call_id].model if r.produced_by_call_id else None for r in rows]
    assert made == [None, "gemini-3-pro", None, "gemini-2.5-flash"]
    first = calls[rows[1].produced_by_call_id]
    assert first.provider == "google"
    assert (first.prompt_tokens, first.completion_tokens, first.total_tokens) == (100, 50, 150)
    assert (first.cached_input_tokens, first.reasoning_tokens) == (40, 30)
    signed = rows[1].message
    assert [c.signature for c in signed.tool_calls] == ["c2lnLWNhbGw="]
    assert [b.thinking.signature for b in signed.content_blocks if b.WhichOneof("block") == "thinking"] == [
        "c2lnLXRob3VnaHQ="
    ]
    text = [b.text for b in rows[3].message.content_blocks if b.WhichOneof("block") == "text"]
    assert [(t.text, t.signature) for t in text] == [("18 °C.", "c2lnLXRleHQ=")]


@pytest.mark.asyncio
async def test_a_call_without_its_response_is_dropped_for_a_model(
    service: SessionstoreSessionService, adk_client: CountingClient
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="lost")
    lost = model_event(
        "gemini-3-pro",
        types.Part(text="checking"),
        types.Part(function_call=types.FunctionCall(id="adk-lost", name="weather", args={})),
    )
    answer = model_event("gemini-3-pro", types.Part(text="never mind"))
    for event in (lost, answer):
        await service.append_event(session, event)
    reader = SessionstoreSessionService(client=adk_client, model="gemini-3-pro")
    read = await reader.get_session(app_name=APP, user_id="u", session_id="lost")
    assert read is not None
    assert lost.content is not None
    kept = lost.model_copy(
        update={"content": lost.content.model_copy(update={"parts": lost.content.parts[:1]})}
    )
    assert read.events == [kept, answer]
    plain = await service.get_session(app_name=APP, user_id="u", session_id="lost")
    assert plain is not None and plain.events == [lost, answer]


# -- one service, many event loops ------------------------------------------------


def test_the_sync_runner_and_asyncio_run_share_one_service(server: Server) -> None:
    """ADK's samples make the session service once, at module level
    (``session_service = InMemorySessionService()``); ``Runner.run`` then
    runs each turn in a thread of its own, with its own event loop, and a
    script's ``asyncio.run`` makes yet another: the service, on an
    ``AsyncClient`` made outside any loop, serves them all."""
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import Runner

    class Canned(BaseLlm):
        """Answers each request with the next of ``answers``."""

        answers: list[str]

        async def generate_content_async(  # type: ignore[override]
            self, llm_request: Any, stream: bool = False
        ) -> AsyncIterator[LlmResponse]:
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(text=self.answers.pop(0))]),
                model_version=self.model,
            )

    answers = ["San Francisco", "California", "About 39 million"]
    service = SessionstoreSessionService(client=server.async_client())
    agent = LlmAgent(
        name="assistant",
        model=Canned(model="canned-1", answers=list(answers)),
        instruction="Reply very concisely.",
    )
    runner = Runner(agent=agent, app_name=APP, session_service=service)
    asyncio.run(service.create_session(app_name=APP, user_id="u", session_id="s"))

    def question(text: str) -> types.Content:
        return types.Content(role="user", parts=[types.Part(text=text)])

    def answer_of(events: list[Event]) -> str:
        return "".join(
            part.text or ""
            for event in events
            if event.author == "assistant" and event.content
            for part in event.content.parts or ()
        )

    def ask(text: str) -> str:
        return answer_of(list(runner.run(user_id="u", session_id="s", new_message=question(text))))

    async def ask_async(text: str) -> str:
        events = [
            event
            async for event in runner.run_async(
                user_id="u", session_id="s", new_message=question(text)
            )
        ]
        return answer_of(events)

    questions = ["What city is the Golden Gate Bridge in?", "What state is it in?", "Population?"]
    said = [ask(questions[0]), ask(questions[1]), asyncio.run(ask_async(questions[2]))]
    assert said == answers
    stored = asyncio.run(service.get_session(app_name=APP, user_id="u", session_id="s"))
    assert stored is not None
    assert [
        (event.author, "".join(part.text or "" for part in event.content.parts or ()))
        for event in stored.events
        if event.content
    ] == [pair for q, a in zip(questions, answers) for pair in (("user", q), ("assistant", a))]
    asyncio.run(service._client.close())


# -- tool confirmations as approvals -------------------------------------------

#: A worker process: an ADK agent whose tools need a person's confirmation,
#: on a ``SessionstoreSessionService`` and nothing else. ``pause`` asks for a
#: confirmation and then waits (to be killed); ``resume`` replies with the
#: decision recorded in sessionstore (``confirmation_reply``) and runs on.
#: The tests import the same file (``runpy``) for the runs they make
#: themselves.
WORKER = r'''
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from sessionstore import AsyncClient
from sessionstore.integrations.adk import SessionstoreSessionService

APP = "bank"
USER = "ada"
MODEL = "gemini-fake"


class Scripted(BaseLlm):
    """Calls the tool the user names (``transfer 5``, ``book 3``), then
    says what the tool answered; echoes anything else."""

    async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
        last = llm_request.contents[-1]
        answers = [p.function_response for p in last.parts or () if p.function_response]
        words = "".join(p.text or "" for p in last.parts or ()).split()
        if answers:
            said = "tool said " + json.dumps(answers[-1].response, sort_keys=True)
            parts = [types.Part(text=said)]
        elif words and words[0] in ("transfer", "book"):
            arg = "amount" if words[0] == "transfer" else "days"
            call = types.FunctionCall(name=words[0], args={arg: int(words[1])})
            parts = [types.Part(function_call=call)]
        else:
            parts = [types.Part(text="echo " + " ".join(words))]
        content = types.Content(role="model", parts=parts)
        yield LlmResponse(content=content, model_version=self.model)


def make_agent(ran: Path) -> LlmAgent:
    """The agent; each tool that runs writes a line to ``ran``."""

    def transfer(amount: int) -> dict:
        """Sends money."""
        with ran.open("a") as out:
            out.write(f"transfer {amount}\n")
        return {"sent": amount}

    def book(days: int, tool_context: ToolContext) -> dict:
        """Books time off, as many days as approved."""
        confirmation = tool_context.tool_confirmation
        if confirmation is None:
            tool_context.request_confirmation(
                hint=f"Approve {days} days off?", payload={"approved_days": days}
            )
            return {"status": "awaiting approval"}
        if not confirmation.confirmed:
            return {"status": "rejected"}
        approved = confirmation.payload["approved_days"]
        with ran.open("a") as out:
            out.write(f"book {approved}\n")
        return {"booked": approved}

    return LlmAgent(
        name="teller",
        model=Scripted(model=MODEL),
        tools=[FunctionTool(transfer, require_confirmation=True), book],
    )


async def run(runner: Runner, session_id: str, message: types.Content) -> list[str]:
    """Runs one turn; what the agent said."""
    said = []
    async for event in runner.run_async(user_id=USER, session_id=session_id, new_message=message):
        if event.author != "user" and event.content:
            said += [part.text for part in event.content.parts or () if part.text]
    return said


async def main(url: str, session_id: str, mode: str, ran: str, model: str, text: str) -> None:
    client = AsyncClient(url)
    service = SessionstoreSessionService(client=client, model=model or None)
    runner = Runner(agent=make_agent(Path(ran)), app_name=APP, session_service=service)
    if mode == "pause":
        await service.create_session(app_name=APP, user_id=USER, session_id=session_id)
        message = types.Content(role="user", parts=[types.Part(text=text)])
    else:
        message = await service.confirmation_reply(
            app_name=APP, user_id=USER, session_id=session_id
        )
        if message is None:
            print(json.dumps({"said": None}), flush=True)
            return
    said = await run(runner, session_id, message)
    print(json.dumps({"said": said}), flush=True)
    if mode == "pause":
        print("PAUSED", flush=True)
        time.sleep(3600)  # a worker that stays up until it is killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
'''

BANK = "bank"
ADA = "ada"


@pytest.fixture
def worker(tmp_path: Any) -> Any:
    """The worker's file; ``runpy`` of it gives its functions."""
    path = tmp_path / "adk_worker.py"
    path.write_text(WORKER)
    return path


def bank_runner(worker: Any, service: SessionstoreSessionService, ran: Any) -> Any:
    import runpy

    from google.adk.runners import Runner

    code = runpy.run_path(str(worker))
    return Runner(agent=code["make_agent"](ran), app_name=BANK, session_service=service), code


def user_says(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def reply(call_id: str, confirmed: bool) -> types.Content:
    """The user's reply to a confirmation, straight through ADK."""
    return types.Content(
        role="user",
        parts=[tool_response(call_id, adk.CONFIRMATION_FUNCTION, {"confirmed": confirmed})],
    )


def ran_lines(ran: Any) -> list[str]:
    return ran.read_text().splitlines() if ran.exists() else []


async def answers_of(
    adk_client: sessionstore.AsyncClient, store_id: str, call_id: str
) -> list[v1.Message]:
    """The stored messages answering ``call_id`` (as the server counts them)."""
    found = []
    async for stored in adk_client.iter_messages(store_id):
        message = stored.message
        blocks = [
            b.tool_result.tool_use_id
            for b in message.content_blocks
            if b.WhichOneof("block") == "tool_result"
        ]
        if message.tool_call_id == call_id or call_id in blocks:
            found.append(message)
    return found


def confirmation_call_ids(events: list[Event]) -> list[str]:
    return [call.id for event in events for call in adk.confirmation_calls(event)]


def replies_to(events: list[Event], call_id: str) -> list[Event]:
    return [
        event
        for event in events
        if any(r.id == call_id for r in event.get_function_responses())
    ]


def start_worker(worker: Any, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, str(worker), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("reader", ["plain", "export"])
@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_a_confirmation_outlives_its_process_and_resumes_from_the_store(
    server: Server, worker: Any, tmp_path: Any, decision: str, reader: str
) -> None:
    """A run pauses on ``FunctionTool(require_confirmation=True)`` in one
    process, which is then killed (SIGKILL); the approval it asked for is
    in sessionstore, where another client decides it; a new process, with
    nothing but the store, turns the decision into ADK's reply and
    resumes: the tool runs when approved and not when denied, and the
    history ADK reads back answers each call once."""
    import json
    import signal

    ran = tmp_path / "ran.txt"
    model = "gemini-fake" if reader == "export" else ""
    paused = start_worker(worker, server.url, "s1", "pause", str(ran), model, "transfer 5")
    try:
        assert paused.stdout is not None
        lines = []
        for line in paused.stdout:
            lines.append(line.strip())
            if line.strip() == "PAUSED":
                break
        assert lines[-1] == "PAUSED", (lines, paused.stderr.read() if paused.stderr else "")
        assert json.loads(lines[-2]) == {"said": []}  # nothing said: it waits
    finally:
        paused.send_signal(signal.SIGKILL)
        paused.wait()
    assert paused.returncode == -signal.SIGKILL
    assert ran_lines(ran) == []

    store_id = session_store_id(BANK, ADA, "s1")
    with server.client() as client:
        pending = list(client.iter_approvals(state="pending"))
        assert [(a.session_id, a.title) for a in pending] == [(store_id, 'transfer({"amount": 5})')]
        approval = pending[0]
        detail = json.loads(approval.detail_json)
        assert detail["originalFunctionCall"]["name"] == "transfer"
        assert detail["originalFunctionCall"]["args"] == {"amount": 5}
        assert "hint" in detail["toolConfirmation"]
        decided = client.decide_approval(
            store_id,
            approval_id=approval.approval_id,
            decision=decision,
            reason="over the limit" if decision == "deny" else "",
            decided_by="ops",
        )
        assert decided.HasField("tool_result") == (decision == "deny")

    resumed = start_worker(worker, server.url, "s1", "resume", str(ran), model, "")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    said = json.loads(out.strip().splitlines()[-1])["said"]
    if decision == "approve":
        assert ran_lines(ran) == ["transfer 5"]
        assert said == ['tool said {"sent": 5}']
    else:
        assert ran_lines(ran) == []
        assert said == ['tool said {"error": "This tool call is rejected."}']

    async def check() -> None:
        async with server.async_client() as adk_client:
            service = SessionstoreSessionService(
                client=adk_client, model=model or None
            )
            session = await service.get_session(app_name=BANK, user_id=ADA, session_id="s1")
            assert session is not None
            [call_id] = confirmation_call_ids(session.events)
            assert call_id == approval.tool_call_id
            # ADK reads one reply, the one the resumed run sent.
            [answer] = replies_to(session.events, call_id)
            assert answer.author == "user"
            # The store answers the call once: the reply when approved, the
            # denial's tool result (the reason) when denied.
            native = await answers_of(adk_client, store_id, call_id)
            assert len(native) == 1
            if decision == "deny":
                assert native[0].role == v1.ROLE_TOOL and native[0].tool_error
                assert native[0].content == "over the limit"
            got = await adk_client.get_approval(store_id, approval_id=approval.approval_id)
            assert got.decided_by == "ops"  # the reply did not decide it again
            # Nothing is open any more, and the conversation goes on.
            again = await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s1")
            assert again is None
            runner, code = bank_runner(worker, service, ran)
            assert await code["run"](runner, "s1", user_says("hello")) == ["echo hello"]

    asyncio.run(check())


@pytest.mark.asyncio
@pytest.mark.parametrize("confirmed", [True, False])
async def test_a_reply_through_adk_decides_the_approval(
    service: SessionstoreSessionService,
    adk_client: CountingClient,
    worker: Any,
    tmp_path: Any,
    confirmed: bool,
) -> None:
    """The user answers ADK itself (its web UI, a FunctionResponse): the
    pending approval is decided as the reply says, before the reply is
    stored, so no other client can decide it the other way."""
    ran = tmp_path / "ran.txt"
    runner, code = bank_runner(worker, service, ran)
    await service.create_session(app_name=BANK, user_id=ADA, session_id="s")
    assert await code["run"](runner, "s", user_says("transfer 7")) == []
    store_id = session_store_id(BANK, ADA, "s")
    [approval] = [a async for a in adk_client.iter_approvals(session_id=store_id)]
    assert approval.state == v1.APPROVAL_STATE_PENDING

    said = await code["run"](runner, "s", reply(approval.tool_call_id, confirmed))
    got = await adk_client.get_approval(store_id, approval_id=approval.approval_id)
    assert got.decided_by == "adk:ada"
    answers = await answers_of(adk_client, store_id, approval.tool_call_id)
    assert len(answers) == 1
    if confirmed:
        assert got.state == v1.APPROVAL_STATE_APPROVED
        assert ran_lines(ran) == ["transfer 7"] and said == ['tool said {"sent": 7}']
        assert answers[0].role == v1.ROLE_USER  # the reply itself
    else:
        assert got.state == v1.APPROVAL_STATE_DENIED
        assert got.reason == "This tool call is rejected."
        assert ran_lines(ran) == []
        assert said == ['tool said {"error": "This tool call is rejected."}']
        assert answers[0].role == v1.ROLE_TOOL  # the denial's tool result
    session = await service.get_session(app_name=BANK, user_id=ADA, session_id="s")
    assert session is not None and len(replies_to(session.events, approval.tool_call_id)) == 1


@pytest.mark.asyncio
async def test_a_reply_against_the_recorded_decision_is_refused(
    service: SessionstoreSessionService,
    adk_client: CountingClient,
    worker: Any,
    tmp_path: Any,
) -> None:
    """Denied in sessionstore, then confirmed through ADK (a stale UI): the
    recorded decision stands. The reply raises ``ApprovalAlreadyDecided``
    before it is stored and before the tool could run; the store's reply
    resumes the run."""
    ran = tmp_path / "ran.txt"
    runner, code = bank_runner(worker, service, ran)
    await service.create_session(app_name=BANK, user_id=ADA, session_id="s")
    await code["run"](runner, "s", user_says("transfer 9"))
    store_id = session_store_id(BANK, ADA, "s")
    [approval] = [a async for a in adk_client.iter_approvals(session_id=store_id)]
    await adk_client.decide_approval(
        store_id, approval_id=approval.approval_id, decision="deny", reason="no", decided_by="ops"
    )
    before = (await adk_client.get_session(store_id)).next_sequence
    with pytest.raises(sessionstore.ApprovalAlreadyDecided) as refused:
        await code["run"](runner, "s", reply(approval.tool_call_id, True))
    assert refused.value.state == v1.APPROVAL_STATE_DENIED and refused.value.decided_by == "ops"
    assert ran_lines(ran) == []
    assert (await adk_client.get_session(store_id)).next_sequence == before

    message = await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s")
    assert message is not None
    assert [p.function_response.response for p in message.parts or ()] == [{"confirmed": False}]
    said = await code["run"](runner, "s", message)
    assert said == ['tool said {"error": "This tool call is rejected."}']
    assert ran_lines(ran) == []
    assert len(await answers_of(adk_client, store_id, approval.tool_call_id)) == 1


@pytest.mark.asyncio
async def test_a_tool_asking_with_a_payload_gets_it_back(
    service: SessionstoreSessionService,
    adk_client: CountingClient,
    worker: Any,
    tmp_path: Any,
) -> None:
    """``tool_context.request_confirmation(hint=..., payload=...)``: the
    approval shows the hint and payload, and the reply made from the
    decision carries the payload back to the tool."""
    import json

    ran = tmp_path / "ran.txt"
    runner, code = bank_runner(worker, service, ran)
    await service.create_session(app_name=BANK, user_id=ADA, session_id="s")
    # ADK lets the model answer the tool's own reply meanwhile (here: what
    # the tool said, "awaiting approval"): a tool asking by itself does not
    # end the turn.
    await code["run"](runner, "s", user_says("book 3"))
    assert ran_lines(ran) == []
    store_id = session_store_id(BANK, ADA, "s")
    assert await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s") is None
    [approval] = [a async for a in adk_client.iter_approvals(session_id=store_id)]
    assert approval.title == 'book({"days": 3})'
    confirmation = json.loads(approval.detail_json)["toolConfirmation"]
    assert confirmation["hint"] == "Approve 3 days off?"
    assert confirmation["payload"] == {"approved_days": 3}
    await adk_client.decide_approval(store_id, approval_id=approval.approval_id, decision="approve")
    message = await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s")
    assert message is not None
    [part] = message.parts or []
    assert part.function_response is not None
    assert part.function_response.id == approval.tool_call_id
    assert part.function_response.response == {"confirmed": True, "payload": {"approved_days": 3}}
    assert await code["run"](runner, "s", message) == ['tool said {"booked": 3}']
    assert ran_lines(ran) == ["book 3"]


def confirmation_event(call_id: str) -> list[Event]:
    """A model's call and ADK's request to confirm it, as ADK stores them."""
    original = types.FunctionCall(id="adk-orig", name="transfer", args={"amount": 1})
    ask = types.FunctionCall(
        id=call_id,
        name=adk.CONFIRMATION_FUNCTION,
        args={
            "originalFunctionCall": original.model_dump(exclude_none=True, by_alias=True),
            "toolConfirmation": {"hint": "ok?", "confirmed": False},
        },
    )
    return [
        model_event("gemini-fake", types.Part(function_call=original)),
        Event(
            invocation_id="inv",
            author="teller",
            content=types.Content(role="model", parts=[types.Part(function_call=ask)]),
            long_running_tool_ids={call_id},
        ),
    ]


@pytest.mark.asyncio
async def test_confirmation_rpcs_as_the_server_counts_them(
    metered_server: Server, meter: RpcMeter
) -> None:
    """An event asking for a confirmation is its ``AppendExchange`` and one
    ``RequestApproval``; a user's reply to one adds a ``ListApprovals``,
    and a ``DecideApproval`` when the approval is still pending (a reply
    given to ADK directly; after a denial's tool result the reply is
    still one ``AppendExchange``: the adapter expects the sequence after
    it); ``approvals=False`` stores events alone."""
    costs: dict[str, dict[str, int]] = {}
    async with metered_server.async_client() as client:
        service = SessionstoreSessionService(client=client)
        session = await service.create_session(app_name=BANK, user_id=ADA, session_id="s")
        call, ask = confirmation_event("adk-ask")
        await service.append_event(session, call)
        with meter() as costs["append_event (asks a confirmation)"]:
            await service.append_event(session, ask)
        store_id = session_store_id(BANK, ADA, "s")
        [approval] = [a async for a in client.iter_approvals(session_id=store_id)]
        with meter() as costs["confirmation_reply (pending)"]:
            assert (
                await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s")
                is None
            )
        await client.decide_approval(store_id, approval_id=approval.approval_id, decision="approve")
        with meter() as costs["confirmation_reply (decided)"]:
            message = await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s")
        assert message is not None
        session = await service.get_session(app_name=BANK, user_id=ADA, session_id="s")
        assert session is not None
        with meter() as costs["append_event (the reply)"]:
            await service.append_event(
                session, Event(invocation_id="inv2", author="user", content=message)
            )
        pending = await service.create_session(app_name=BANK, user_id=ADA, session_id="u")
        for event in confirmation_event("adk-ask-u"):
            await service.append_event(pending, event)
        with meter() as costs["append_event (the reply, still pending)"]:
            await service.append_event(
                pending,
                Event(invocation_id="inv3", author="user", content=reply("adk-ask-u", False)),
            )
        plain = SessionstoreSessionService(client=client, approvals=False)
        other = await plain.create_session(app_name=BANK, user_id=ADA, session_id="t")
        call, ask = confirmation_event("adk-ask-2")
        await plain.append_event(other, call)
        with meter() as costs["append_event (approvals=False)"]:
            await plain.append_event(other, ask)
    assert costs == {
        "append_event (asks a confirmation)": {"AppendExchange": 1, "RequestApproval": 1},
        "confirmation_reply (pending)": {"ListMessages": 1, "ListApprovals": 1},
        "confirmation_reply (decided)": {"ListMessages": 1, "ListApprovals": 1},
        "append_event (the reply)": {"ListApprovals": 1, "AppendExchange": 1},
        "append_event (the reply, still pending)": {
            "ListApprovals": 1,
            "DecideApproval": 1,
            "AppendExchange": 1,
        },
        "append_event (approvals=False)": {"AppendExchange": 1},
    }


@pytest.mark.asyncio
async def test_a_lost_approval_request_is_asked_when_resuming(
    adk_client: CountingClient,
) -> None:
    """A process killed between storing the event and asking
    ``RequestApproval`` (here: a service with ``approvals=False`` stored
    it): ``confirmation_reply`` finds the confirmation without an approval
    and asks for it."""
    plain = SessionstoreSessionService(client=adk_client, approvals=False)
    session = await plain.create_session(app_name=BANK, user_id=ADA, session_id="s")
    for event in confirmation_event("adk-ask"):
        await plain.append_event(session, event)
    store_id = session_store_id(BANK, ADA, "s")
    assert [a async for a in adk_client.iter_approvals(session_id=store_id)] == []
    assert await plain.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s") is None
    assert [a async for a in adk_client.iter_approvals(session_id=store_id)] == []

    service = SessionstoreSessionService(client=adk_client)
    assert await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s") is None
    [approval] = [a async for a in adk_client.iter_approvals(session_id=store_id)]
    assert approval.tool_call_id == "adk-ask" and approval.title == 'transfer({"amount": 1})'
    await adk_client.decide_approval(store_id, approval_id=approval.approval_id, decision="deny")
    message = await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="s")
    assert message == reply("adk-ask", False)
    with pytest.raises(SessionNotFoundError):
        await service.confirmation_reply(app_name=BANK, user_id=ADA, session_id="none")


def test_confirmation_message_takes_decisions_only() -> None:
    detail = '{"toolConfirmation": {"hint": "?", "payload": [1, 2]}}'
    approved = v1.Approval(
        approval_id="apr_1", tool_call_id="c1", state=v1.APPROVAL_STATE_APPROVED, detail_json=detail
    )
    denied = v1.Approval(approval_id="apr_2", tool_call_id="c2", state=v1.APPROVAL_STATE_DENIED)
    message = adk.confirmation_message([approved, denied])
    assert message.role == "user"
    assert [
        (p.function_response.id, p.function_response.name, p.function_response.response)
        for p in message.parts or ()
        if p.function_response
    ] == [
        ("c1", "adk_request_confirmation", {"confirmed": True, "payload": [1, 2]}),
        ("c2", "adk_request_confirmation", {"confirmed": False}),
    ]
    for state in (v1.APPROVAL_STATE_PENDING, v1.APPROVAL_STATE_EXPIRED):
        with pytest.raises(ValueError, match="not decided"):
            adk.confirmation_message([v1.Approval(approval_id="apr_3", state=state)])
    with pytest.raises(ValueError):
        adk.confirmation_message([])
