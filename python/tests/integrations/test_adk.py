"""The Google ADK session service against a real server: ADK's session,
event and state semantics (app:, user:, temp: prefixes, GetSessionConfig,
stale sessions), what lands in sessionstore, and how many RPCs it takes."""

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
