"""SessionstoreSession (the OpenAI Agents SDK adapter) against a real server:
exact item round trips, latest-N windows, pop, clear, isolation, concurrent
writers, the session id mapping, and one RPC per change."""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, cast

import pytest
import pytest_asyncio

try:
    import agents  # noqa: F401
except ImportError:  # not a skip: these tests must run wherever the package is tested
    pytest.fail(
        "the OpenAI Agents SDK is not installed: the openai_agents adapter tests need the "
        "extra: pip install -e './python[test,openai-agents]'",
        pytrace=False,
    )

from agents import Agent, RunConfig, Runner, TResponseInputItem
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

import sessionstore
from sessionstore import v1
from sessionstore.integrations.openai_agents import (
    APPROVAL_DETAIL_KEY,
    ITEM_BLOCK_TYPE,
    RUN_STATE_KEY_PREFIX,
    SESSION_ID_METADATA_KEY,
    SessionstoreSession,
    load_decided_run,
    request_approvals,
    resume,
    sdk_session_id,
    store_session_id,
)

from ..conftest import RpcMeter, Server
from . import openai_agents_approvals_process as approvals_run

ALLOWED_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


def user(text: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": "user", "content": text})


#: One of every kind of item the adapter must keep exactly.
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Use metric units."},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "and this picture?"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
        ],
    },
    {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Need the weather tool."}],
        "encrypted_content": "gAAAAABo-opaque+/==",
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris", ',  # malformed JSON, kept as is
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "22 °C, sunny"},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "structured output"}],
    },
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "It is 22 °C.", "annotations": [], "logprobs": []},
            {"type": "refusal", "refusal": "No more."},
        ],
    },
    {"type": "item_reference", "id": "msg_0"},
    {"type": "some_future_item", "payload": {"nested": [1, 2.5, None, True, "x"]}, "n": 10**20},
    {"role": "user", "content": "nul \x00 inside \x00", "name\x00key": "v\x00"},
    {"role": "user", "content": ""},
    {"role": "assistant", "content": "emoji 😊 and 'quotes' \"and\" \\ backslashes\n"},
]


@pytest_asyncio.fixture
async def client(server: Server) -> AsyncIterator[sessionstore.AsyncClient]:
    """An ``AsyncClient`` of the test's server (in place of the blocking one)."""
    async with server.async_client() as client:
        yield client


@pytest.fixture
def make_session(
    client: sessionstore.AsyncClient,
) -> Callable[..., SessionstoreSession]:
    def make(session_id: str = "chat", **kwargs: Any) -> SessionstoreSession:
        return SessionstoreSession(session_id, client=client, **kwargs)

    return make


class CountingStub:
    """Stands in for the client's stub, counting the RPCs made (each attempt)
    and keeping their requests."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)

        def call(request: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, request))
            return method(request, *args, **kwargs)

        return call

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def reset(self) -> None:
        self.calls.clear()


@pytest.fixture
def rpcs(
    client: sessionstore.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CountingStub]:
    """Counts the RPCs the client makes (through its running loop's stub)."""
    stub_of_loop = client._loop_stub
    counting = CountingStub(None)

    def counted() -> Any:
        counting._stub = stub_of_loop()
        return counting

    monkeypatch.setattr(client, "_loop_stub", counted)
    yield counting


def test_the_session_follows_the_sdk_protocol() -> None:
    from agents.memory import SessionABC

    assert issubclass(SessionstoreSession, SessionABC)
    session = SessionstoreSession("x", client=cast(sessionstore.AsyncClient, None))
    assert isinstance(session, Session)
    assert session.session_id == "x"
    assert session.session_settings == SessionSettings()
    limited = SessionstoreSession(
        "x", client=cast(sessionstore.AsyncClient, None), session_settings={"limit": 3}
    )
    assert limited.session_settings == SessionSettings(limit=3)
    with pytest.raises(TypeError):
        SessionstoreSession(
            "x", client=cast(sessionstore.AsyncClient, None), session_settings={"limitt": 3}
        )


# -- round trips ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_every_item_kind_round_trips_exactly(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    session = make_session()
    items = copy.deepcopy(ITEMS)
    await session.add_items(cast(list[TResponseInputItem], items))
    assert items == ITEMS, "add_items must not change its argument"
    assert await session.get_items() == ITEMS
    for n in range(1, len(ITEMS) + 2):
        assert await session.get_items(limit=n) == ITEMS[-n:]
    assert await session.get_items(limit=0) == []
    # One at a time, and popped back exactly.
    other = make_session("one-by-one")
    for item in ITEMS:
        await other.add_items([cast(TResponseInputItem, item)])
    assert await other.get_items() == ITEMS
    popped = [await other.pop_item() for _ in ITEMS]
    assert popped == ITEMS[::-1]


@pytest.mark.asyncio
async def test_native_fields_make_a_readable_conversation(
    client: sessionstore.AsyncClient, make_session: Callable[..., SessionstoreSession]
) -> None:
    session = make_session("readable")
    await session.add_items(cast(list[TResponseInputItem], ITEMS))
    stored = [m.message async for m in client.iter_messages(session.store_session_id)]
    # The reasoning item is stored in the message of the call it precedes,
    # as sessionstore's native reasoning.
    assert len(stored) == len(ITEMS) - 1
    for index, message in enumerate(stored):
        blocks = [b for b in message.content_blocks if b.WhichOneof("block") == "json"]
        expected = ["reasoning", ITEM_BLOCK_TYPE] if index == 4 else [ITEM_BLOCK_TYPE]
        assert [b.json.type for b in blocks] == expected
    by_index = dict(enumerate(stored))
    assert (by_index[0].role, by_index[0].content) == (v1.ROLE_USER, ITEMS[0]["content"])
    assert by_index[1].role == v1.ROLE_SYSTEM
    assert by_index[2].role == v1.ROLE_DEVELOPER
    assert (by_index[3].role, by_index[3].content) == (v1.ROLE_USER, "and this picture?")
    call = by_index[4]
    assert json.loads(call.content_blocks[0].json.json) == ITEMS[4]
    assert call.role == v1.ROLE_ASSISTANT
    assert [(c.id, c.name, c.arguments) for c in call.tool_calls] == [
        ("call_1", "get_weather", '{"city": "Paris", ')
    ]
    result = by_index[5]
    assert (result.role, result.tool_call_id, result.content) == (
        v1.ROLE_TOOL,
        "call_1",
        "22 °C, sunny",
    )
    assert by_index[6].content == "structured output"
    assert (by_index[7].role, by_index[7].content) == (v1.ROLE_ASSISTANT, "It is 22 °C.\nNo more.")
    transcript = await client.export_transcript(session.store_session_id)
    for text in ("What is the weather in Paris?", "get_weather", "22 °C, sunny", "It is 22 °C."):
        assert text in transcript, transcript
    hits = (await client.search_messages("Paris weather")).hits
    assert {h.session_id for h in hits} == {session.store_session_id}
    assert 0 in {h.sequence for h in hits}


@pytest.mark.asyncio
async def test_an_unserializable_item_stores_nothing(
    make_session: Callable[..., SessionstoreSession], rpcs: CountingStub
) -> None:
    session = make_session()
    bad = cast(TResponseInputItem, {"role": "user", "content": object()})
    with pytest.raises(TypeError):
        await session.add_items([user("fine"), bad])
    assert rpcs.names() == []
    await session.add_items([])
    assert rpcs.names() == []
    assert await session.get_items() == []


@pytest.mark.asyncio
async def test_add_items_is_all_or_nothing(make_session: Callable[..., SessionstoreSession]) -> None:
    session = make_session()
    await session.add_items([user("before")])
    # Over the server's --max-messages-per-exchange (1000 by default): one
    # refused exchange, not a partial write.
    with pytest.raises(sessionstore.LimitExceeded):
        await session.add_items([user(f"m{i}") for i in range(1001)])
    assert await session.get_items() == [user("before")]


@pytest.mark.asyncio
async def test_messages_other_clients_wrote_read_as_items(
    client: sessionstore.AsyncClient, make_session: Callable[..., SessionstoreSession]
) -> None:
    session = make_session("shared")
    await session.add_items([user("from the sdk")])
    await client.append_exchange(
        session.store_session_id,
        messages=[
            {"role": "ROLE_USER", "content": "from elsewhere"},
            {
                "role": "ROLE_ASSISTANT",
                "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}],
            },
            {"role": "ROLE_TOOL", "tool_call_id": "c1", "content": "out"},
            {  # two tool calls are not one item: skipped
                "role": "ROLE_ASSISTANT",
                "tool_calls": [{"id": "a", "name": "f"}, {"id": "b", "name": "g"}],
            },
        ],
    )
    expected = [
        user("from the sdk"),
        {"role": "user", "content": "from elsewhere"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "out"},
    ]
    assert await session.get_items() == expected
    # The window widens past the skipped message to count items.
    assert await session.get_items(limit=2) == expected[-2:]
    # pop_item drops the message it cannot read and returns the next item.
    assert await session.pop_item() == expected[-1]
    assert await session.get_items() == expected[:-1]


# -- windows, pop, clear ---------------------------------------------------------


@pytest.mark.asyncio
async def test_latest_n_windows(make_session: Callable[..., SessionstoreSession]) -> None:
    session = make_session()
    items = [user(f"m{i}") for i in range(25)]
    for start in range(0, 25, 7):
        await session.add_items(items[start : start + 7])
    assert await session.get_items() == items
    assert await session.get_items(limit=None) == items
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=-1) == items  # SQLiteSession: negative is unlimited
    for n in (1, 2, 5, 24, 25, 26, 1000):
        assert await session.get_items(limit=n) == items[-n:], n
    # After a pop and a clear the window still counts from the tail.
    await session.pop_item()
    assert await session.get_items(limit=3) == items[21:24]


@pytest.mark.asyncio
async def test_session_settings_limit_is_the_default(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    session = make_session(session_settings=SessionSettings(limit=3))
    items = [user(f"m{i}") for i in range(10)]
    await session.add_items(items)
    assert await session.get_items() == items[-3:]
    assert await session.get_items(limit=5) == items[-5:]
    assert await make_session(session_settings={"limit": 0}).get_items() == []


@pytest.mark.asyncio
async def test_windows_page_through_long_sessions(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    session = make_session("long")
    items = [user(f"message {i}") for i in range(2300)]
    for start in range(0, 2300, 1000):  # the server's default --max-messages-per-exchange
        await session.add_items(items[start : start + 1000])
    assert await session.get_items() == items
    assert await session.get_items(limit=1500) == items[-1500:]
    assert await session.get_items(limit=1001) == items[-1001:]


@pytest.mark.asyncio
async def test_pop_to_empty(make_session: Callable[..., SessionstoreSession]) -> None:
    session = make_session()
    assert await session.pop_item() is None  # no session yet
    items = [user("a"), cast(TResponseInputItem, ITEMS[5]), user("c")]
    await session.add_items(items)
    assert await session.pop_item() == items[2]
    assert await session.get_items() == items[:2]
    assert await session.pop_item() == items[1]
    assert await session.pop_item() == items[0]
    assert await session.pop_item() is None
    assert await session.get_items() == []
    await session.add_items([user("again")])
    assert await session.get_items() == [user("again")]


@pytest.mark.asyncio
async def test_clear(
    client: sessionstore.AsyncClient, make_session: Callable[..., SessionstoreSession]
) -> None:
    session = make_session()
    await session.clear_session()  # nothing stored yet: fine
    await session.add_items([user("a"), user("b")])
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    stored = await client.get_session(session.store_session_id)
    assert stored.next_sequence == 0
    await session.clear_session()  # already empty
    await session.add_items([user("c")])
    assert await session.get_items() == [user("c")]


@pytest.mark.asyncio
async def test_sessions_are_isolated(make_session: Callable[..., SessionstoreSession]) -> None:
    # Ids that a careless mapping would merge.
    ids = ["a/b", "a:2fb", "a_b", "A/B", "a b", "a%2Fb", "oa:a/b", ""]
    sessions = [make_session(i) for i in ids]
    assert len({s.store_session_id for s in sessions}) == len(ids)
    for index, session in enumerate(sessions):
        await session.add_items([user(f"{index}-1"), user(f"{index}-2")])
    await sessions[0].pop_item()
    await sessions[1].clear_session()
    assert await sessions[0].get_items() == [user("0-1")]
    assert await sessions[1].get_items() == []
    for index, session in list(enumerate(sessions))[2:]:
        assert await session.get_items() == [user(f"{index}-1"), user(f"{index}-2")]


# -- concurrency -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_ten_concurrent_writers(make_session: Callable[..., SessionstoreSession]) -> None:
    # Ten writers, each with its own session object, race to create the
    # session and then append batches of two.
    async def writer(index: int) -> None:
        session = make_session("busy")
        for batch in range(5):
            await session.add_items([user(f"w{index} b{batch} 0"), user(f"w{index} b{batch} 1")])

    await asyncio.gather(*(writer(i) for i in range(10)))
    items = await make_session("busy").get_items()
    contents = [cast(dict[str, str], item)["content"] for item in items]
    assert len(contents) == 100
    assert Counter(contents) == Counter(f"w{i} b{b} {k}" for i in range(10) for b in range(5) for k in range(2))
    for position in range(0, 100, 2):  # every batch stored whole, in order
        first, second = contents[position], contents[position + 1]
        assert first.endswith(" 0") and second == first[:-1] + "1", contents
    for index in range(10):  # each writer's batches in its order
        mine = [c for c in contents if c.startswith(f"w{index} ")]
        assert mine == sorted(mine, key=lambda c: (int(c.split()[1][1:]), c[-1]))


@pytest.mark.asyncio
async def test_pop_takes_the_tail_as_it_is_when_the_pop_runs(
    client: sessionstore.AsyncClient, make_session: Callable[..., SessionstoreSession]
) -> None:
    session = make_session("race")
    writer = make_session("race")
    await session.add_items([user("a"), user("b")])
    real_rollback = client.rollback_session
    appended = False

    async def append_then_rollback(session_id: str, **kwargs: Any) -> Any:
        nonlocal appended
        if not appended:  # another writer appends just before the pop reaches the server
            appended = True
            await writer.add_items([user("c")])
        return await real_rollback(session_id, **kwargs)

    client.rollback_session = append_then_rollback  # type: ignore[method-assign]
    try:
        popped = await session.pop_item()
    finally:
        client.rollback_session = real_rollback  # type: ignore[method-assign]
    assert appended
    assert popped == user("c")  # the latest item, returned: nothing lost
    assert await session.get_items() == [user("a"), user("b")]


@pytest.mark.asyncio
async def test_concurrent_pops_and_appends_lose_nothing(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    await make_session("mixed").add_items([user(f"seed {i}") for i in range(20)])
    popped: list[TResponseInputItem | None] = []

    async def popper() -> None:
        session = make_session("mixed")
        for _ in range(6):
            popped.append(await session.pop_item())

    async def appender(index: int) -> None:
        session = make_session("mixed")
        for n in range(6):
            await session.add_items([user(f"new {index} {n}")])

    await asyncio.gather(*(popper() for _ in range(3)), *(appender(i) for i in range(3)))
    remaining = await make_session("mixed").get_items()
    assert None not in popped
    everything = [user(f"seed {i}") for i in range(20)] + [
        user(f"new {i} {n}") for i in range(3) for n in range(6)
    ]
    got = [cast(dict[str, str], i)["content"] for i in remaining + cast(list[Any], popped)]
    assert sorted(got) == sorted(cast(dict[str, str], i)["content"] for i in everything)


@pytest.mark.asyncio
async def test_a_cancelled_add_still_has_a_known_outcome(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    session = make_session()
    task = asyncio.create_task(session.add_items([user("once")]))
    await asyncio.sleep(0)  # the append is in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await session.get_items() == [user("once")]


# -- one RPC per change --------------------------------------------------------------


@pytest.mark.asyncio
async def test_one_rpc_per_change(
    client: sessionstore.AsyncClient,
    make_session: Callable[..., SessionstoreSession],
    rpcs: CountingStub,
) -> None:
    session = make_session("counted")

    async def revision() -> int:
        return (await client.get_session(session.store_session_id)).revision

    # The first add creates the session in the same append.
    await session.add_items([user("a"), user("b"), user("c")])
    assert rpcs.names() == ["AppendExchange"]
    first = rpcs.calls[0][1]
    assert first.request_id and len(first.messages) == 3
    assert first.create_if_missing == v1.CreateSessionRequest(
        title="counted", metadata={SESSION_ID_METADATA_KEY: "counted"}
    )
    assert await revision() == 2  # created (1), then the exchange (2)

    before = await revision()
    rpcs.reset()
    await session.add_items([user("d"), user("e")])
    assert rpcs.names() == ["AppendExchange"]
    assert rpcs.calls[0][1].request_id
    assert await revision() == before + 1

    before = await revision()
    rpcs.reset()
    assert await session.pop_item() == user("e")
    assert rpcs.names() == ["RollbackSession"]  # no read first
    rollback = rpcs.calls[0][1]
    assert (rollback.remove_last, rollback.after_sequence, rollback.return_removed) == (1, 0, True)
    assert not rollback.HasField("expected_next_sequence")
    assert await revision() == before + 1

    before = await revision()
    rpcs.reset()
    await session.clear_session()
    assert rpcs.names() == ["RollbackSession"]
    assert rpcs.calls[0][1].after_sequence == -1
    assert await revision() == before + 1

    rpcs.reset()
    assert await session.get_items() == []
    assert await session.get_items(limit=2) == []
    assert rpcs.names() == ["ListMessages", "ListMessages"]  # a window is one newest-first page


@pytest.mark.asyncio
async def test_rpc_costs_as_the_server_counts_them(
    metered_server: Server, meter: RpcMeter
) -> None:
    """What each SDK call costs, from the server's own count of the calls
    it handled (``grpc_server_handled_total``)."""
    costs: dict[str, dict[str, int]] = {}
    async with metered_server.async_client() as client:
        session = SessionstoreSession("metered", client=client)
        with meter() as costs["add_items (first)"]:
            await session.add_items([user("a"), user("b")])
        with meter() as costs["add_items (later)"]:
            await session.add_items([user("c")])
        with meter() as costs["get_items()"]:
            assert await session.get_items() == [user("a"), user("b"), user("c")]
        with meter() as costs["get_items(limit=2)"]:
            assert await session.get_items(limit=2) == [user("b"), user("c")]
        with meter() as costs["pop_item"]:
            assert await session.pop_item() == user("c")
        with meter() as costs["clear_session"]:
            await session.clear_session()
        with meter() as costs["pop_item (empty)"]:
            assert await session.pop_item() is None
        with meter() as costs["pop_item (no session)"]:
            assert await SessionstoreSession("none", client=client).pop_item() is None
        on_gpt5 = SessionstoreSession("metered", client=client, model="gpt-5")
        with meter() as costs["get_items() (model)"]:
            assert await on_gpt5.get_items() == []
        stored = await client.get_session(session.store_session_id)
        assert (stored.title, dict(stored.metadata)) == (
            "metered",
            {SESSION_ID_METADATA_KEY: "metered"},
        )
    print("OpenAI Agents RPC costs:", {call: dict(cost) for call, cost in costs.items()})
    assert costs == {
        "add_items (first)": {"AppendExchange": 1},  # the session made in the same call
        "add_items (later)": {"AppendExchange": 1},
        "get_items()": {"ListMessages": 1},
        "get_items(limit=2)": {"ListMessages": 1},
        "pop_item": {"RollbackSession": 1},  # no read first
        "clear_session": {"RollbackSession": 1},
        "pop_item (empty)": {"RollbackSession": 1},
        "pop_item (no session)": {"RollbackSession NotFound": 1},
        "get_items() (model)": {"ExportHistory": 1},
    }


# -- session ids -----------------------------------------------------------------------


SDK_IDS = [
    "",
    "a",
    "chat-1",
    "user_42.thread-7",
    ":",
    "::",
    "oa:x",
    "oah:x",
    "a/b",
    "a:2fb",
    "a:2Fb",
    "a b",
    "ü",
    "😊",
    "\x00",
    "x\x00y",
    "%2F",
    "A" * 125,  # "oa:" + 125: exactly 128
    "A" * 126,  # one too many: digest
    "/" * 41,  # escaped to 123 characters: fits
    "/" * 42,  # 126 + 3 > 128: digest
    "é" * 200,
]


def test_ids_map_reversibly_and_injectively() -> None:
    mapped = [store_session_id(i) for i in SDK_IDS]
    assert len(set(mapped)) == len(SDK_IDS)
    for sdk_id, store_id in zip(SDK_IDS, mapped):
        assert ALLOWED_ID.fullmatch(store_id), store_id
        back = sdk_session_id(store_id)
        if store_id.startswith("oah:"):
            assert back is None
            assert len(store_id) == 68
        else:
            assert back == sdk_id
    assert store_session_id("chat-1") == "oa:chat-1"
    assert store_session_id("user 42/ü") == "oa:user:2042:2f:c3:bc"
    assert store_session_id(":") == "oa::3a"
    assert store_session_id("A" * 125) == "oa:" + "A" * 125
    assert store_session_id("A" * 126).startswith("oah:")
    for not_ours in ("ses_1", "oa:a/b", "oa::41", "oa::3A", "oa::c3", "oa::zz", "oa:" + "A" * 126):
        with pytest.raises(ValueError):
            sdk_session_id(not_ours)


@pytest.mark.asyncio
async def test_long_ids_use_a_digest_and_keep_the_original_in_metadata(
    client: sessionstore.AsyncClient, make_session: Callable[..., SessionstoreSession]
) -> None:
    long_a = "tenant/" + "x" * 300 + "/a"
    long_b = "tenant/" + "x" * 300 + "/b"
    a, b = make_session(long_a), make_session(long_b)
    assert a.store_session_id.startswith("oah:") and b.store_session_id.startswith("oah:")
    assert a.store_session_id != b.store_session_id
    await a.add_items([user("in a")])
    await b.add_items([user("in b")])
    assert await a.get_items() == [user("in a")]
    assert await b.get_items() == [user("in b")]
    stored = await client.get_session(a.store_session_id)
    assert stored.metadata[SESSION_ID_METADATA_KEY] == long_a
    short = make_session("short/id")
    await short.add_items([user("x")])
    stored = await client.get_session(short.store_session_id)
    assert stored.metadata[SESSION_ID_METADATA_KEY] == "short/id"
    assert sdk_session_id(stored.id) == "short/id"


# -- through the SDK's runner --------------------------------------------------------


@pytest.mark.asyncio
async def test_runner_keeps_history_in_the_session(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    session = make_session("runner")
    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    model.enqueue([assistant_message("San Francisco")])
    config = RunConfig(tracing_disabled=True)
    first = await Runner.run(
        agent, "Where is the Golden Gate Bridge?", session=session, run_config=config
    )
    assert first.final_output == "San Francisco"
    model.enqueue([assistant_message("California")])
    second = await Runner.run(agent, "Which state?", session=session, run_config=config)
    assert second.final_output == "California"
    history = await session.get_items()
    assert len(history) == 4
    assert model.calls[-1].input[:3] == history[:3]


def usage(
    prompt: int, completion: int, cached: int = 0, written: int = 0, reasoning: int = 0
) -> Any:
    """One model request's usage, as the SDK reports it."""
    from agents.usage import Usage
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

    return Usage(
        requests=1,
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=prompt + completion,
        input_tokens_details=InputTokensDetails.model_validate(
            {"cached_tokens": cached, "cache_write_tokens": written}
        ),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
    )


@pytest.mark.asyncio
async def test_runner_records_what_each_model_request_used(
    make_session: Callable[..., SessionstoreSession], client: sessionstore.AsyncClient
) -> None:
    from agents import function_tool
    from agents.testing import ModelStep, function_call

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"18C in {city}"

    model = ScriptedModel()
    agent = Agent(name="a", model=model, tools=[weather])
    session = make_session("runner-usage", model="gpt-5")
    config = RunConfig(tracing_disabled=True)
    # One run, two model requests: a tool call, then the answer.
    model.enqueue(
        ModelStep(
            output=[function_call("weather", {"city": "Paris"}, call_id="call_1")],
            usage=usage(100, 20, cached=40, written=10, reasoning=5),
        )
    )
    model.enqueue(ModelStep(output=[assistant_message("18C.")], usage=usage(150, 30, cached=90)))
    await Runner.run(agent, "Weather in Paris?", session=session, run_config=config)
    # A second run, one request.
    model.enqueue(ModelStep(output=[assistant_message("Yes.")], usage=usage(200, 7, reasoning=3)))
    await Runner.run(agent, "Sure?", session=session, run_config=config)

    calls = [call async for call in client.iter_provider_calls(session.store_session_id)]
    assert [
        (
            c.model,
            c.prompt_tokens,
            c.completion_tokens,
            c.total_tokens,
            c.cached_input_tokens,
            c.cache_creation_input_tokens,
            c.reasoning_tokens,
        )
        for c in calls
    ] == [
        ("gpt-5", 100, 20, 120, 40, 10, 5),
        ("gpt-5", 150, 30, 180, 90, 0, 0),
        ("gpt-5", 200, 7, 207, 0, 0, 3),
    ]
    summary = await client.summarize_usage(session_id=session.store_session_id)
    (row,) = summary.rows
    assert (row.calls, row.prompt_tokens, row.completion_tokens, row.total_tokens) == (
        3,
        450,
        57,
        507,
    )
    assert (row.cached_input_tokens, row.cache_creation_input_tokens, row.reasoning_tokens) == (
        130,
        10,
        8,
    )
    # The items are as they would be without usage.
    kinds = [item.get("type", "message") for item in await session.get_items()]
    assert kinds == [
        "message", "function_call", "function_call_output", "message", "message", "message",
    ]


@pytest.mark.asyncio
async def test_a_streamed_run_records_its_tokens_too(
    make_session: Callable[..., SessionstoreSession], client: sessionstore.AsyncClient
) -> None:
    from agents.testing import ModelStep

    model = ScriptedModel()
    model.enqueue(ModelStep(output=[assistant_message("Hello.")], usage=usage(64, 9, cached=32)))
    session = make_session("streamed-usage", model="gpt-5")
    result = Runner.run_streamed(
        Agent(name="a", model=model), "Hi", session=session,
        run_config=RunConfig(tracing_disabled=True),
    )
    async for _ in result.stream_events():
        pass
    (call,) = [c async for c in client.iter_provider_calls(session.store_session_id)]
    assert (call.prompt_tokens, call.completion_tokens, call.cached_input_tokens) == (64, 9, 32)


@pytest.mark.asyncio
async def test_add_items_without_a_run_records_no_tokens(
    make_session: Callable[..., SessionstoreSession], client: sessionstore.AsyncClient
) -> None:
    session = make_session("no-run-usage", model="gpt-5")
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
    await session.add_items([user("hi"), cast(TResponseInputItem, answer)])
    (call,) = [c async for c in client.iter_provider_calls(session.store_session_id)]
    assert (call.model, call.prompt_tokens, call.completion_tokens) == ("gpt-5", 0, 0)


# -- the SDK's quickstart shape: one session, many event loops ------------------


def test_the_quickstart_shape_runs_in_one_event_loop_after_another(server: Server) -> None:
    """The SDK's sessions quickstart makes its session once, at module level
    (``session = SQLiteSession("conversation_123")``), then runs the agent
    with ``Runner.run_sync`` (the thread's own loop) or in ``asyncio.run``
    (a new loop each time): the same, with this session on an
    ``AsyncClient`` made there, outside any loop."""
    session = SessionstoreSession("conversation_123", client=server.async_client())
    model = ScriptedModel()
    agent = Agent(name="Assistant", instructions="Reply very concisely.", model=model)
    config = RunConfig(tracing_disabled=True)

    def run_sync(question: str, answer: str) -> Any:
        model.enqueue([assistant_message(answer)])
        return Runner.run_sync(agent, question, session=session, run_config=config).final_output

    async def main(question: str, answer: str) -> Any:
        model.enqueue([assistant_message(answer)])
        result = await Runner.run(agent, question, session=session, run_config=config)
        return result.final_output

    assert run_sync("What city is the Golden Gate Bridge in?", "San Francisco") == "San Francisco"
    assert run_sync("What state is it in?", "California") == "California"
    assert asyncio.run(main("What's the population?", "About 39 million")) == "About 39 million"
    assert asyncio.run(main("And its capital?", "Sacramento")) == "Sacramento"

    history = asyncio.run(session.get_items())
    assert len(history) == 8
    assert [item.get("role") for item in cast(list[dict[str, Any]], history)] == [
        "user", "assistant"
    ] * 4
    # Each turn the model saw the conversation so far.
    assert model.calls[-1].input[:7] == history[:7]
    asyncio.run(session.client.close())


def test_threads_each_with_their_own_loop_share_the_client(server: Server) -> None:
    """Sessions made up front on one ``AsyncClient``, each run with
    ``Runner.run_sync`` from a thread of its own (a loop per thread), at
    the same time."""
    client = server.async_client()
    threads = 3
    sessions = [SessionstoreSession(f"thread-{n}", client=client) for n in range(threads)]
    all_started = threading.Barrier(threads, timeout=60)

    def conversation(n: int) -> list[Any]:
        model = ScriptedModel()
        agent = Agent(name="Assistant", model=model)
        config = RunConfig(tracing_disabled=True)
        all_started.wait()
        answers = []
        for turn in range(2):
            model.enqueue([assistant_message(f"answer {n}.{turn}")])
            result = Runner.run_sync(
                agent, f"question {n}.{turn}", session=sessions[n], run_config=config
            )
            answers.append(result.final_output)
        return answers

    with ThreadPoolExecutor(threads) as pool:
        answers = list(pool.map(conversation, range(threads)))
    assert answers == [[f"answer {n}.0", f"answer {n}.1"] for n in range(threads)]

    async def histories() -> list[int]:
        return [len(await session.get_items()) for session in sessions]

    assert asyncio.run(histories()) == [4] * threads
    asyncio.run(client.close())


# -- switching models ---------------------------------------------------------


def reasoning(n: int) -> dict[str, Any]:
    return {
        "id": f"rs_{n}",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": f"step {n}\x00"}],
        "encrypted_content": f"gAAAA-{n}",
    }


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "weather", "arguments": "{}"}


TURN: list[dict[str, Any]] = [
    {"role": "user", "content": "weather?"},
    reasoning(1),
    call("call_1"),
    {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    reasoning(2),
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "18C."}]},
]


def plain(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in items if item.get("type") != "reasoning"]


@pytest.mark.asyncio
async def test_a_model_reads_only_its_own_reasoning(
    client: sessionstore.AsyncClient, make_session: Callable[..., SessionstoreSession]
) -> None:
    gpt5 = make_session("switch", model="gpt-5")
    await gpt5.add_items(cast(list[TResponseInputItem], copy.deepcopy(TURN)))
    assert await gpt5.get_items() == TURN
    assert await gpt5.get_items(limit=3) == TURN[-3:]
    # Another model of OpenAI's: its reasoning items would be refused.
    assert await make_session("switch", model="o3").get_items() == plain(TURN)
    assert await make_session("switch", model="o3", reasoning="same_provider").get_items() == TURN
    assert await make_session("switch", model="gpt-5", reasoning="none").get_items() == plain(TURN)
    assert (
        await make_session("switch", model="claude-sonnet-4-5", provider="anthropic").get_items()
        == plain(TURN)
    )
    # Without a model: everything, as stored.
    assert await make_session("switch").get_items() == TURN
    # The model's output was recorded as one call of that model.
    calls = (await client.list_provider_calls(gpt5.store_session_id)).provider_calls
    assert [(c.provider, c.model) for c in calls] == [("openai", "gpt-5")]
    rows = [m async for m in client.iter_messages(gpt5.store_session_id)]
    assert [bool(r.produced_by_call_id) for r in rows] == [False, True, True, True]


@pytest.mark.asyncio
async def test_a_call_left_without_its_output_is_dropped_with_its_reasoning(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    session = make_session("cancelled", model="gpt-5")
    items = [
        {"role": "user", "content": "look it up"},
        reasoning(1),
        call("call_lost"),
        {"role": "user", "content": "never mind"},
        {"role": "assistant", "content": "OK."},
    ]
    await session.add_items(cast(list[TResponseInputItem], items))
    assert await session.get_items() == [items[0], items[3], items[4]]
    assert await make_session("cancelled").get_items() == items
    # A call of the last answer is pending, not lost: it stays.
    await session.add_items(cast(list[TResponseInputItem], [reasoning(2), call("call_new")]))
    assert (await session.get_items())[-2:] == [reasoning(2), call("call_new")]


@pytest.mark.asyncio
async def test_pop_takes_the_reasoning_before_the_item_too(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    session = make_session("pop-reasoning", model="gpt-5")
    await session.add_items(cast(list[TResponseInputItem], copy.deepcopy(TURN)))
    assert await session.pop_item() == TURN[-1]
    assert await session.get_items() == TURN[:-2]
    assert await session.pop_item() == TURN[3]
    assert await session.pop_item() == TURN[2]
    assert await session.get_items() == TURN[:1]


def test_a_bad_model_or_policy_fails_at_once(client: sessionstore.AsyncClient) -> None:
    with pytest.raises(ValueError):
        SessionstoreSession("x", client=client, model="gpt-5", provider=" ")
    with pytest.raises(ValueError):
        SessionstoreSession("x", client=client, model="gpt-5", reasoning="most")


@pytest.mark.asyncio
async def test_runner_sends_a_model_only_its_own_reasoning(
    make_session: Callable[..., SessionstoreSession],
) -> None:
    from openai.types.responses import ResponseReasoningItem
    from openai.types.responses.response_reasoning_item import Summary

    config = RunConfig(tracing_disabled=True)
    thought = ResponseReasoningItem(
        id="rs_gpt5",
        type="reasoning",
        summary=[Summary(text="a bridge in SF", type="summary_text")],
        encrypted_content="gAAAA-gpt5",
    )
    model = ScriptedModel()
    model.enqueue([thought, assistant_message("San Francisco")])
    on_gpt5 = make_session("runner-switch", model="gpt-5")
    await Runner.run(
        Agent(name="a", model=model), "Where is the Golden Gate Bridge?",
        session=on_gpt5, run_config=config,
    )
    stored = await make_session("runner-switch").get_items()
    assert [item.get("type") for item in stored[1:]] == ["reasoning", "message"]

    def kinds(call_input: Any) -> list[Any]:
        return [item.get("type", "message") for item in call_input]

    # The agent switches to o3: GPT-5's encrypted reasoning is not sent.
    model.enqueue([assistant_message("California")])
    on_o3 = make_session("runner-switch", model="o3")
    await Runner.run(Agent(name="a", model=model), "Which state?", session=on_o3, run_config=config)
    assert kinds(model.calls[-1].input) == ["message", "message", "message"]
    # Back on GPT-5, its own reasoning goes with the answer it preceded.
    model.enqueue([assistant_message("Yes")])
    await Runner.run(Agent(name="a", model=model), "Sure?", session=on_gpt5, run_config=config)
    sent = model.calls[-1].input
    assert kinds(sent) == ["message", "reasoning", "message", "message", "message", "message"]
    assert sent[1]["encrypted_content"] == "gAAAA-gpt5"


# -- durable tool approvals: pause in one process, decide, resume in another ------

APPROVALS_PROCESS = Path(approvals_run.__file__)


class Process:
    """A process of ``openai_agents_approvals_process.py``, whose output
    lines are read as they come (JSON each)."""

    def __init__(self, mode: str, server: Server, session_id: str, marks: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(APPROVALS_PROCESS), mode, server.url, session_id, str(marks)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._collect, daemon=True).start()

    @staticmethod
    def _read(stream: Any, lines: queue.Queue[str | None]) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    def _collect(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line)

    def next(self, timeout: float = 60) -> Any:
        """The next JSON line the process prints."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output in {timeout}s: {''.join(self.errors)}") from None
        assert line is not None, f"exited {self.proc.wait()}: {''.join(self.errors)}"
        return json.loads(line)

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def wait(self) -> None:
        assert self.proc.wait(120) == 0, "".join(self.errors)


async def reference_history(decision: str, reason: str = "") -> list[Any]:
    """The history the SDK's own ``SQLiteSession`` holds after the same
    turns, the run paused, decided in memory and resumed."""
    from agents import SQLiteSession

    with tempfile.TemporaryDirectory() as marks:
        agent, model = approvals_run.build(Path(marks))
        session = SQLiteSession("reference")
        result = await approvals_run.run_until_paused(agent, model, session)
        state = result.to_state()
        for item in state.get_interruptions():
            if decision == "approve":
                state.approve(item)
            else:
                state.reject(item, rejection_message=reason)
        model.enqueue([assistant_message(approvals_run.ANSWER)])
        await Runner.run(agent, state, session=session, run_config=approvals_run.CONFIG)
        return await session.get_items()


def outputs_of(items: list[Any], call_id: str) -> list[Any]:
    return [
        item for item in items
        if item.get("type") == "function_call_output" and item.get("call_id") == call_id
    ]


def snapshot_entries(client: sessionstore.Client, store_id: str) -> list[str]:
    return [
        entry.key for entry in client.iter_state(store_id)
        if entry.key.startswith(RUN_STATE_KEY_PREFIX)
    ]


def test_a_run_paused_for_approval_is_approved_elsewhere_and_resumed_after_a_kill(
    server: Server, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    session_id = "approvals/approve"
    store_id = store_session_id(session_id)
    # Process 1: the run pauses; its approval is asked for; then it is killed.
    pauser = Process("pause", server, session_id, marks)
    (approval_id,) = pauser.next()["approvals"]
    pauser.kill()
    assert not list(marks.iterdir())  # the tool has not run
    with server.client() as client:
        approval = client.get_approval(store_id, approval_id=approval_id)
        assert approval.state == v1.APPROVAL_STATE_PENDING
        assert (approval.tool_call_id, approval.title) == (approvals_run.CALL_ID, "delete_file")
        detail = json.loads(approval.detail_json)
        assert (detail["tool"], detail["agent"]) == ("delete_file", "janitor")
        assert detail["arguments"] == {"path": approvals_run.PATH}
        assert snapshot_entries(client, store_id)

        # Process 3 starts first: nothing to continue while pending, so it waits.
        resumer = Process("wait-and-resume", server, session_id, marks)
        assert resumer.next() == {"ready": False}
        # Process 2 (this one, with the plain client) decides.
        client.decide_approval(
            store_id, approval_id=approval_id, decision="approve", decided_by="ops@example.com"
        )
        resumed = resumer.next(timeout=120)
        resumer.wait()
        assert (resumed["final_output"], resumed["interruptions"]) == (approvals_run.ANSWER, 0)
        # The tool ran once, in the resumed process.
        assert [mark.name for mark in marks.iterdir()] == [f"ran-{resumer.proc.pid}"]
        # The resumed run took its snapshot: nothing is left to continue.
        assert snapshot_entries(client, store_id) == []

    async def stored() -> list[Any]:
        async with server.async_client() as client:
            session = SessionstoreSession(session_id, client=client)
            return await session.get_items()

    history = asyncio.run(stored())
    assert history == asyncio.run(reference_history("approve"))
    (output,) = outputs_of(history, approvals_run.CALL_ID)
    assert output["output"] == f"deleted {approvals_run.PATH}"
    # Again: the run was continued already.
    again = Process("resume", server, session_id, marks)
    assert again.next() is None
    again.wait()


def test_a_run_paused_for_approval_is_denied_elsewhere_and_resumed_after_a_kill(
    server: Server, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    session_id = "approvals/deny"
    store_id = store_session_id(session_id)
    reason = "Keep that file: finance needs it."
    pauser = Process("pause", server, session_id, marks)
    (approval_id,) = pauser.next()["approvals"]
    pauser.kill()
    with server.client() as client:
        decided = client.decide_approval(
            store_id, approval_id=approval_id, decision="deny", reason=reason
        )
        # The server stored the call's tool result with the denial.
        assert decided.tool_result.message.tool_call_id == approvals_run.CALL_ID
    resumer = Process("resume", server, session_id, marks)
    resumed = resumer.next(timeout=120)
    resumer.wait()
    assert resumed["final_output"] == approvals_run.ANSWER
    assert not list(marks.iterdir())  # the tool never ran
    # The resumed model read the denial once, with its reason.
    (sent,) = outputs_of(resumed["model_input"], approvals_run.CALL_ID)
    assert sent["output"] == reason

    async def stored() -> list[Any]:
        async with server.async_client() as client:
            session = SessionstoreSession(session_id, client=client)
            return await session.get_items()

    history = asyncio.run(stored())
    # As the SDK's own session holds it: one output for the call (the one
    # the server stored with the denial), then the answer.
    assert history == asyncio.run(reference_history("deny", reason))
    assert len(outputs_of(history, approvals_run.CALL_ID)) == 1


@pytest.mark.asyncio
async def test_pending_approvals_continue_nothing_and_a_run_is_taken_once(
    make_session: Callable[..., SessionstoreSession],
    client: sessionstore.AsyncClient,
    tmp_path: Path,
) -> None:
    agent, model = approvals_run.build(tmp_path)
    session = make_session("approvals-once")
    result = await approvals_run.run_until_paused(agent, model, session)
    approvals = await request_approvals(session, result)
    # Asked again for the same paused run: the same approvals.
    assert [a.approval_id for a in await request_approvals(session, result)] == [
        a.approval_id for a in approvals
    ]
    assert await load_decided_run(make_session("approvals-once"), agent) is None
    assert await load_decided_run(make_session("approvals-once"), agent, wait=True, timeout=0.2) is None
    await client.decide_approval(
        session.store_session_id, approval_id=approvals[0].approval_id, decision="approve"
    )
    # Five loaders at once: one gets the run.
    loaded = await asyncio.gather(
        *(load_decided_run(make_session("approvals-once"), agent) for _ in range(5))
    )
    assert sum(state is not None for state in loaded) == 1
    assert await load_decided_run(make_session("approvals-once"), agent) is None
    # A session with no paused run, or none at all; a run that did not pause.
    assert await load_decided_run(make_session("never-paused"), agent) is None
    model.enqueue([assistant_message("Hi.")])
    done = make_session("no-interruptions")
    finished = await Runner.run(agent, "Hi", session=done, run_config=approvals_run.CONFIG)
    assert await request_approvals(done, finished) == []
    assert await load_decided_run(done, agent) is None


@pytest.mark.asyncio
async def test_a_long_conversation_pauses_and_resumes_across_several_state_entries(
    make_session: Callable[..., SessionstoreSession],
    client: sessionstore.AsyncClient,
    tmp_path: Path,
) -> None:
    agent, model = approvals_run.build(tmp_path)
    session = make_session("approvals-long")
    # 400 KB of history that does not compress much: the run's snapshot
    # (which holds the run's input, the history) is several state values.
    history = [user(os.urandom(2000).hex()) for _ in range(100)]
    await session.add_items(history)
    result = await approvals_run.run_until_paused(agent, model, session)
    (approval,) = await request_approvals(session, result)
    detail = json.loads(approval.detail_json)[APPROVAL_DETAIL_KEY]
    assert detail["chunks"] > 2
    entries = [e async for e in client.iter_state(session.store_session_id)]
    assert len(entries) == detail["chunks"]
    assert all(len(entry.value) <= 64 * 1024 for entry in entries)
    await client.decide_approval(
        session.store_session_id, approval_id=approval.approval_id, decision="approve"
    )
    model.enqueue([assistant_message(approvals_run.ANSWER)])
    resumed = await resume(make_session("approvals-long"), agent, run_config=approvals_run.CONFIG)
    assert resumed is not None and resumed.final_output == approvals_run.ANSWER
    # The history, the two turns, the call and its output: each once.
    assert len(model.calls[-1].input) == len(history) + 5
    assert [e async for e in client.iter_state(session.store_session_id)] == []


@pytest.mark.asyncio
async def test_a_changed_snapshot_is_refused(
    make_session: Callable[..., SessionstoreSession],
    client: sessionstore.AsyncClient,
    tmp_path: Path,
) -> None:
    agent, model = approvals_run.build(tmp_path)
    session = make_session("approvals-changed")
    result = await approvals_run.run_until_paused(agent, model, session)
    (approval,) = await request_approvals(session, result)
    ref = json.loads(approval.detail_json)[APPROVAL_DETAIL_KEY]
    await client.decide_approval(
        session.store_session_id, approval_id=approval.approval_id, decision="approve"
    )
    key = f"{RUN_STATE_KEY_PREFIX}{ref['run']}.0"
    await client.set_state(session.store_session_id, key=key, value="eJwLzs8tKEotLgYAEF4Dpg==")
    with pytest.raises(ValueError, match="not the one its approvals were asked for"):
        await load_decided_run(session, agent)
    assert not list(tmp_path.iterdir())


@pytest.mark.asyncio
async def test_an_expired_approval_rejects_the_call(
    make_session: Callable[..., SessionstoreSession],
    client: sessionstore.AsyncClient,
    tmp_path: Path,
) -> None:
    agent, model = approvals_run.build(tmp_path)
    session = make_session("approvals-expired")
    result = await approvals_run.run_until_paused(agent, model, session)
    soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
    (approval,) = await request_approvals(session, result, expire_time=soon)
    assert approval.expire_time.seconds > 0
    # Nobody decides: waiting ends with the expiry (recorded within 10 s).
    model.enqueue([assistant_message(approvals_run.ANSWER)])
    resumer = make_session("approvals-expired")
    resumed = await resume(
        resumer, agent, wait=True, timeout=30, expired_message="Nobody approved in time.",
        run_config=approvals_run.CONFIG,
    )
    assert resumed is not None and resumed.final_output == approvals_run.ANSWER
    assert not list(tmp_path.iterdir())
    (output,) = outputs_of(await resumer.get_items(), approvals_run.CALL_ID)
    assert output["output"] == "Nobody approved in time."
    stored = await client.get_approval(session.store_session_id, approval_id=approval.approval_id)
    assert stored.state == v1.APPROVAL_STATE_EXPIRED


@pytest.mark.asyncio
async def test_a_resumed_run_records_only_its_new_model_requests(
    make_session: Callable[..., SessionstoreSession],
    client: sessionstore.AsyncClient,
    tmp_path: Path,
) -> None:
    from agents.testing import ModelStep

    agent, model = approvals_run.build(tmp_path)
    session = make_session("approvals-usage", model="gpt-5")
    model.enqueue(
        ModelStep(
            output=[function_call("delete_file", {"path": "/a"}, call_id="call_a")],
            usage=usage(100, 20),
        )
    )
    result = await Runner.run(agent, "Delete /a", session=session, run_config=approvals_run.CONFIG)
    (approval,) = await request_approvals(session, result)
    await client.decide_approval(
        session.store_session_id, approval_id=approval.approval_id, decision="approve"
    )
    model.enqueue(ModelStep(output=[assistant_message("Deleted.")], usage=usage(150, 7)))
    resumed = await resume(
        make_session("approvals-usage", model="gpt-5"), agent, run_config=approvals_run.CONFIG
    )
    assert resumed is not None
    calls = [c async for c in client.iter_provider_calls(session.store_session_id)]
    assert [(c.prompt_tokens, c.completion_tokens) for c in calls] == [(100, 20), (150, 7)]


@pytest.mark.asyncio
async def test_two_calls_paused_together_one_approved_one_denied(
    make_session: Callable[..., SessionstoreSession],
    client: sessionstore.AsyncClient,
    tmp_path: Path,
) -> None:
    from agents import SQLiteSession

    def script(model: ScriptedModel) -> None:
        model.enqueue(
            [
                function_call("delete_file", {"path": "/a"}, call_id="call_a"),
                function_call("delete_file", {"path": "/b"}, call_id="call_b"),
            ]
        )
        model.enqueue([assistant_message("Deleted /a; /b stays.")])

    (tmp_path / "reference").mkdir()
    (tmp_path / "store").mkdir()
    # The SDK's own session, decided in memory.
    agent, model = approvals_run.build(tmp_path / "reference")
    script(model)
    reference = SQLiteSession("reference")
    paused = await Runner.run(agent, "Delete /a and /b", session=reference, run_config=approvals_run.CONFIG)
    state = paused.to_state()
    first, second = state.get_interruptions()
    state.approve(first)
    state.reject(second, rejection_message="Not /b.")
    await Runner.run(agent, state, session=reference, run_config=approvals_run.CONFIG)

    # The same, decided through the store.
    agent, model = approvals_run.build(tmp_path / "store")
    script(model)
    session = make_session("approvals-two")
    paused = await Runner.run(agent, "Delete /a and /b", session=session, run_config=approvals_run.CONFIG)
    approvals = await request_approvals(session, paused)
    assert [a.tool_call_id for a in approvals] == ["call_a", "call_b"]
    await client.decide_approval(
        session.store_session_id, approval_id=approvals[0].approval_id, decision="approve"
    )
    assert await load_decided_run(make_session("approvals-two"), agent) is None  # one pending
    await client.decide_approval(
        session.store_session_id, approval_id=approvals[1].approval_id, decision="deny",
        reason="Not /b.",
    )
    resumed = await resume(make_session("approvals-two"), agent, run_config=approvals_run.CONFIG)
    assert resumed is not None and resumed.final_output == "Deleted /a; /b stays."
    assert [mark.read_text() for mark in (tmp_path / "store").iterdir()] == ["/a"]
    history = await session.get_items()
    # The items the SDK's own session holds, each call with one output; the
    # denied call's was stored when it was denied, so it comes before the
    # output of the call that ran when the run went on.
    expected = await reference.get_items()
    assert [item.get("call_id") for item in expected[3:5]] == ["call_a", "call_b"]
    expected[3:5] = reversed(expected[3:5])
    assert history == expected


@pytest.mark.asyncio
async def test_approval_rpc_costs_as_the_server_counts_them(
    metered_server: Server, meter: RpcMeter, tmp_path: Path
) -> None:
    costs: dict[str, dict[str, int]] = {}
    agent, model = approvals_run.build(tmp_path)
    async with metered_server.async_client() as client:
        session = SessionstoreSession("metered-approvals", client=client)
        result = await approvals_run.run_until_paused(agent, model, session)
        with meter() as costs["request_approvals (one call)"]:
            (approval,) = await request_approvals(session, result)
        with meter() as costs["load_decided_run (pending)"]:
            assert await load_decided_run(session, agent) is None
        await client.decide_approval(
            session.store_session_id, approval_id=approval.approval_id, decision="approve"
        )
        with meter() as costs["load_decided_run (decided)"]:
            assert await load_decided_run(session, agent) is not None
        with meter() as costs["load_decided_run (taken)"]:
            assert await load_decided_run(session, agent) is None
    print("OpenAI Agents approval RPC costs:", {c: dict(cost) for c, cost in costs.items()})
    assert costs == {
        "request_approvals (one call)": {"SetState": 1, "RequestApproval": 1},
        "load_decided_run (pending)": {"ListApprovals": 1, "GetState": 1},
        "load_decided_run (decided)": {"ListApprovals": 1, "GetState": 1, "DeleteState": 1},
        "load_decided_run (taken)": {"ListApprovals": 1, "GetState NotFound": 1},
    }
