"""SessionstoreChatMessageHistory (LangChain) against a real server: exact
round trips of every message kind, sync and async, clear, isolation, several
histories and concurrent writers on one server, the session id map, and one
revision (and one RPC) per ``add_messages``."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        FunctionMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
except ImportError:  # pragma: no cover - depends on the environment
    pytest.fail(
        "langchain-core is not installed, so the LangChain adapter cannot be tested: "
        "pip install -e './python[test,langchain]'",
        pytrace=False,
    )

import sessionstore
from sessionstore import v1
from sessionstore.integrations import langchain as lc
from sessionstore.integrations.langchain import (
    GEMINI_SIGNATURES_KEY,
    SESSION_ID_METADATA_KEY,
    SessionstoreChatMessageHistory,
    from_store_session_id,
    to_store_session_id,
)

from ..conftest import RpcMeter, Server


def every_kind() -> list[BaseMessage]:
    """One message of every kind, with every field LangChain has set."""
    return [
        SystemMessage("You are terse.", id="sys-1"),
        HumanMessage(
            "What is 2+2?\x00 (NUL inside)",
            id="h-1",
            name="alice",
            additional_kwargs={"nested": {"list": [1, 2.5, None, True, "x\x00y"]}},
            response_metadata={"source": "web"},
        ),
        HumanMessage(
            content=[
                {"type": "text", "text": "look at "},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                "a bare string block",
            ]
        ),
        AIMessage(
            content="",
            id="run-1",
            name="calculator-bot",
            tool_calls=[
                {"name": "add", "args": {"a": 2, "b": 2}, "id": "call_1", "type": "tool_call"},
                {"name": "noop", "args": {}, "id": None, "type": "tool_call"},
            ],
            invalid_tool_calls=[
                {
                    "name": "broken",
                    "args": '{"a": 1',
                    "id": "call_2",
                    "error": "unterminated JSON",
                    "type": "invalid_tool_call",
                }
            ],
            usage_metadata={
                "input_tokens": 10,
                "output_tokens": 3,
                "total_tokens": 13,
                "input_token_details": {"cache_read": 4},
            },
            response_metadata={"model_name": "gpt-x", "finish_reason": "tool_calls"},
            additional_kwargs={"refusal": None, "weird\x00key": ["\x00"]},
        ),
        ToolMessage(
            "4",
            tool_call_id="call_1",
            artifact={"raw": [2, 2], "sum": 4},
            status="success",
            name="add",
            id="t-1",
        ),
        ToolMessage(
            content=[{"type": "text", "text": "bad arguments"}],
            tool_call_id="call_2",
            status="error",
        ),
        AIMessage(
            content=[
                {"type": "text", "text": "The answer is "},
                {"type": "text", "text": "4."},
            ],
            response_metadata={"logprobs": None},
        ),
        ChatMessage(content="I disagree.", role="critic", name="bob"),
        ChatMessage(content="be careful", role="developer"),
        FunctionMessage(content="{\"temp\": 21}", name="get_weather"),
        HumanMessage(""),
    ]


@pytest.fixture
def client(server: Server) -> Iterator[sessionstore.Client]:
    with server.client() as client:
        yield client


def revision(client: sessionstore.Client, history: SessionstoreChatMessageHistory) -> int:
    return client.get_session(history.store_session_id).revision


# -- construction ------------------------------------------------------------


def test_needs_a_client() -> None:
    with pytest.raises(TypeError, match="needs a client"):
        SessionstoreChatMessageHistory("x")
    with pytest.raises(TypeError, match="sessionstore.Client"):
        SessionstoreChatMessageHistory("x", client=object())  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_async_only_history_refuses_sync_calls(server: Server) -> None:
    async with server.async_client() as aclient:
        history = SessionstoreChatMessageHistory("async-only", async_client=aclient)
        with pytest.raises(RuntimeError, match="only an async_client"):
            history.messages
        with pytest.raises(RuntimeError, match="only an async_client"):
            history.add_messages([HumanMessage("hi")])
        await history.aadd_messages([HumanMessage("hi")])
        assert await history.aget_messages() == [HumanMessage("hi")]


# -- round trips -------------------------------------------------------------


def test_every_kind_round_trips_exactly(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("kinds", client=client)
    assert history.messages == []
    messages = every_kind()
    history.add_messages(messages)
    back = history.messages
    assert back == messages
    assert [type(m) for m in back] == [type(m) for m in messages]
    # A second history object on the same id reads the same: nothing is cached.
    assert SessionstoreChatMessageHistory("kinds", client=client).messages == messages


@pytest.mark.asyncio
async def test_every_kind_round_trips_exactly_async(server: Server) -> None:
    async with server.async_client() as aclient:
        history = SessionstoreChatMessageHistory("kinds-async", async_client=aclient)
        assert await history.aget_messages() == []
        messages = every_kind()
        await history.aadd_messages(messages[:4])
        await history.aadd_messages(messages[4:])
        assert await history.aget_messages() == messages


@pytest.mark.asyncio
async def test_sync_client_alone_serves_async_calls(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("sync-only", client=client)
    await history.aadd_messages(every_kind())
    assert await history.aget_messages() == every_kind()
    await history.aclear()
    assert await history.aget_messages() == []


@pytest.mark.asyncio
async def test_sync_and_async_clients_see_one_history(server: Server) -> None:
    with server.client() as client:
        async with server.async_client() as aclient:
            history = SessionstoreChatMessageHistory("both", client=client, async_client=aclient)
            history.add_messages([HumanMessage("from sync")])
            await history.aadd_messages([AIMessage("from async")])
            expected = [HumanMessage("from sync"), AIMessage("from async")]
            assert history.messages == expected
            assert await history.aget_messages() == expected


def test_add_message_and_helpers_go_through_add_messages(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("helpers", client=client)
    history.add_message(SystemMessage("s"))
    history.add_user_message("u")
    history.add_ai_message("a")
    assert history.messages == [SystemMessage("s"), HumanMessage("u"), AIMessage("a")]
    assert str(history) == "System: s\nHuman: u\nAI: a"
    # create (1) + one revision per call (3)
    assert revision(client, history) == 4


def test_native_fields_are_filled(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("native", client=client)
    history.add_messages(every_kind())
    stored = client.export_history(history.store_session_id)
    roles = [m.role for m in stored]
    assert roles == [
        v1.ROLE_SYSTEM,
        v1.ROLE_USER,
        v1.ROLE_USER,
        v1.ROLE_ASSISTANT,
        v1.ROLE_TOOL,
        v1.ROLE_TOOL,
        v1.ROLE_ASSISTANT,
        v1.ROLE_USER,  # a custom chat role has no native role: user
        v1.ROLE_DEVELOPER,
        v1.ROLE_TOOL,
        v1.ROLE_USER,
    ]
    assert stored[1].content == "What is 2+2?\x00 (NUL inside)"
    assert stored[1].name == "alice"
    assert stored[2].content == "look at a bare string block"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in stored[3].tool_calls] == [
        ("call_1", "add", {"a": 2, "b": 2}),
        ("", "noop", {}),
    ]
    assert (stored[4].tool_call_id, stored[4].tool_error, stored[4].content) == (
        "call_1",
        False,
        "4",
    )
    assert (stored[5].tool_call_id, stored[5].tool_error) == ("call_2", True)
    assert stored[6].content == "The answer is 4."
    assert stored[9].name == "get_weather"
    for message in stored:
        blocks = [b.json for b in message.content_blocks if b.WhichOneof("block") == "json"]
        assert [b.type for b in blocks] == [lc.JSON_BLOCK_TYPE]
    # Other readers see a real conversation.
    transcript = json.loads(
        client.export_transcript(history.store_session_id, format="openai_json")
    )
    assert transcript[3]["tool_calls"][0]["function"]["name"] == "add"
    assert transcript[4] == {"role": "tool", "content": "4", "name": "add", "tool_call_id": "call_1"}
    hits = client.search_messages("answer", page_size=10).hits
    assert [(h.session_id, h.sequence) for h in hits] == [(history.store_session_id, 6)]


def test_messages_written_by_other_clients_are_read(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("foreign", client=client)
    client.create_session(session_id=history.store_session_id)
    client.append_exchange(
        history.store_session_id,
        messages=[
            v1.Message(role=v1.ROLE_USER, content="hi"),
            v1.Message(
                role=v1.ROLE_ASSISTANT,
                tool_calls=[
                    v1.ToolCall(id="c1", name="f", arguments='{"x": 1}'),
                    v1.ToolCall(id="c2", name="g", arguments="{oops"),
                ],
            ),
            v1.Message(role=v1.ROLE_TOOL, tool_call_id="c1", content="1", tool_error=True),
        ],
    )
    back = history.messages
    assert back[0] == HumanMessage("hi")
    assert isinstance(back[1], AIMessage)
    assert back[1].tool_calls == [{"name": "f", "args": {"x": 1}, "id": "c1", "type": "tool_call"}]
    assert [c["args"] for c in back[1].invalid_tool_calls] == ["{oops"]
    assert back[2] == ToolMessage("1", tool_call_id="c1", status="error")


def test_values_json_cannot_keep_are_refused_before_sending(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("refused", client=client)
    with pytest.raises(ValueError, match="exactly"):
        history.add_messages([HumanMessage("ok"), ToolMessage("r", tool_call_id="c", artifact={1, 2})])
    with pytest.raises(ValueError, match="exactly"):
        history.add_messages([AIMessage("x", additional_kwargs={"t": (1, 2)})])
    with pytest.raises(ValueError, match="exactly"):
        history.add_messages([AIMessage("x", response_metadata={"nan": float("nan")})])
    assert history.messages == []  # nothing was written, not even the valid message
    with pytest.raises(sessionstore.SessionNotFound):
        client.get_session(history.store_session_id)


# -- one RPC per change ------------------------------------------------------


def test_one_revision_per_add_messages(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("revisions", client=client)
    history.add_messages([HumanMessage("a"), AIMessage("b")])
    first = revision(client, history)
    assert first == 2  # created (1), then the append (2)
    history.add_messages(every_kind()[:4])  # up to and with GPT's answer
    assert revision(client, history) == first + 1
    history.add_messages([HumanMessage("c")])
    assert revision(client, history) == first + 2
    history.add_messages([])  # nothing to write: no revision, no session needed
    assert revision(client, history) == first + 2
    # A batch with a model's answer and messages after it: the answer (with
    # what came before it) is one exchange, the rest another.
    history.add_messages(every_kind())
    assert revision(client, history) == first + 4
    history.clear()
    assert revision(client, history) == first + 5
    assert history.messages == []


@pytest.mark.asyncio
async def test_one_revision_per_aadd_messages(server: Server) -> None:
    with server.client() as client:
        async with server.async_client() as aclient:
            history = SessionstoreChatMessageHistory("arevisions", async_client=aclient)
            await history.aadd_messages(every_kind())
            before = revision(client, history)
            await history.aadd_messages(every_kind()[4:])  # no model's answer in it
            assert revision(client, history) == before + 1
            await history.aclear()
            assert revision(client, history) == before + 2


def test_rpc_costs_as_the_server_counts_them(metered_server: Server, meter: RpcMeter) -> None:
    """What each LangChain call costs, from the server's own count of the
    calls it handled (``grpc_server_handled_total``)."""
    costs: dict[str, dict[str, int]] = {}
    with metered_server.client() as client:
        history = SessionstoreChatMessageHistory("metered", client=client)
        with meter() as costs["add_messages (first)"]:
            history.add_messages([HumanMessage("a"), AIMessage("b")])
        with meter() as costs["add_messages (later)"]:
            history.add_messages([HumanMessage("c")])
        with meter() as costs["messages"]:
            assert history.messages == [HumanMessage("a"), AIMessage("b"), HumanMessage("c")]
        with meter() as costs["messages (no session)"]:
            assert SessionstoreChatMessageHistory("none", client=client).messages == []
        with meter() as costs["add_messages (two answers)"]:
            history.add_messages(every_kind())  # one exchange per model's answer
        with meter() as costs["clear"]:
            history.clear()
        session = client.get_session(history.store_session_id)
        assert dict(session.metadata) == {SESSION_ID_METADATA_KEY: "metered"}
        # Created (1) with the first exchange (2), then one per exchange and the clear.
        assert session.revision == 6

    async def asynchronous() -> None:
        async with metered_server.async_client() as aclient:
            history = SessionstoreChatMessageHistory("ametered", async_client=aclient)
            with meter() as costs["aadd_messages (first)"]:
                await history.aadd_messages([HumanMessage("a")])
            with meter() as costs["aadd_messages (later)"]:
                await history.aadd_messages([HumanMessage("b")])
            with meter() as costs["aget_messages"]:
                assert await history.aget_messages() == [HumanMessage("a"), HumanMessage("b")]

    asyncio.run(asynchronous())
    print("LangChain RPC costs:", {call: dict(cost) for call, cost in costs.items()})
    assert costs == {
        "add_messages (first)": {"AppendExchange": 1},  # the session made in the same call
        "add_messages (later)": {"AppendExchange": 1},
        "messages": {"ExportHistory": 1},
        "messages (no session)": {"ExportHistory NotFound": 1},
        "add_messages (two answers)": {"AppendExchange": 2},
        "clear": {"RollbackSession": 1},
        "aadd_messages (first)": {"AppendExchange": 1},
        "aadd_messages (later)": {"AppendExchange": 1},
        "aget_messages": {"ExportHistory": 1},
    }


def test_session_is_created_with_its_langchain_id(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("user 7 / chat ✓", client=client)
    history.add_messages([HumanMessage("hi")])
    session = client.get_session(history.store_session_id)
    assert session.metadata[SESSION_ID_METADATA_KEY] == "user 7 / chat ✓"


def test_a_session_made_elsewhere_is_used(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("premade", client=client)
    client.create_session(session_id=history.store_session_id, title="made by the app")
    history.add_messages([HumanMessage("hi")])
    assert history.messages == [HumanMessage("hi")]
    assert client.get_session(history.store_session_id).title == "made by the app"


# -- clear and isolation -----------------------------------------------------


def test_clear(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("clear", client=client)
    history.clear()  # nothing there yet: nothing happens
    history.add_messages(every_kind())
    history.clear()
    assert history.messages == []
    history.add_messages([HumanMessage("again")])
    assert history.messages == [HumanMessage("again")]


@pytest.mark.asyncio
async def test_aclear(server: Server) -> None:
    async with server.async_client() as aclient:
        history = SessionstoreChatMessageHistory("aclear", async_client=aclient)
        await history.aclear()
        await history.aadd_messages(every_kind())
        await history.aclear()
        assert await history.aget_messages() == []


def test_histories_are_isolated(client: sessionstore.Client) -> None:
    names = ["a", "b", "a:", "a:3A", "A", "", " ", "lc:a", "ü"]
    histories = [SessionstoreChatMessageHistory(name, client=client) for name in names]
    assert len({h.store_session_id for h in histories}) == len(names)
    for index, history in enumerate(histories):
        history.add_messages([HumanMessage(f"message {index}")])
    for index, history in enumerate(histories):
        assert history.messages == [HumanMessage(f"message {index}")]
    histories[0].clear()
    assert histories[0].messages == []
    assert histories[1].messages == [HumanMessage("message 1")]


def test_several_servers_do_not_mix(make_server: object, client: sessionstore.Client) -> None:
    other = make_server()  # type: ignore[operator]
    with other.client() as other_client:
        mine = SessionstoreChatMessageHistory("same-id", client=client)
        theirs = SessionstoreChatMessageHistory("same-id", client=other_client)
        mine.add_messages([HumanMessage("mine")])
        theirs.add_messages([HumanMessage("theirs")])
        assert mine.messages == [HumanMessage("mine")]
        assert theirs.messages == [HumanMessage("theirs")]


def test_concurrent_writers(client: sessionstore.Client) -> None:
    """Threads appending to one (not yet existing) history and to their own:
    every batch is stored once, contiguous, and the session is made once."""
    shared = SessionstoreChatMessageHistory("shared", client=client)
    writers, batches = 8, 5
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            own = SessionstoreChatMessageHistory(f"own-{writer}", client=client)
            barrier.wait()
            for batch in range(batches):
                shared.add_messages(
                    [HumanMessage(f"{writer}.{batch}"), AIMessage(f"{writer}.{batch} ok")]
                )
                own.add_message(HumanMessage(f"{writer}.{batch}"))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    messages = shared.messages
    assert len(messages) == writers * batches * 2
    for question, answer in zip(messages[::2], messages[1::2]):
        assert isinstance(question, HumanMessage) and isinstance(answer, AIMessage)
        assert answer.content == f"{question.content} ok"
    for writer in range(writers):
        mine = [m.content for m in messages[::2] if str(m.content).startswith(f"{writer}.")]
        assert mine == [f"{writer}.{batch}" for batch in range(batches)]
        own = SessionstoreChatMessageHistory(f"own-{writer}", client=client)
        assert own.messages == [HumanMessage(f"{writer}.{b}") for b in range(batches)]
    assert revision(client, shared) == 1 + writers * batches


@pytest.mark.asyncio
async def test_concurrent_async_writers(server: Server) -> None:
    async with server.async_client() as aclient:
        history = SessionstoreChatMessageHistory("async-shared", async_client=aclient)
        await asyncio.gather(
            *(history.aadd_messages([HumanMessage(str(i)), AIMessage(str(i))]) for i in range(20))
        )
        messages = await history.aget_messages()
        assert len(messages) == 40
        assert all(q.content == a.content for q, a in zip(messages[::2], messages[1::2]))
        assert sorted(int(str(q.content)) for q in messages[::2]) == list(range(20))


# -- session ids -------------------------------------------------------------

ID_CASES = [
    "",
    "a",
    "abc-DEF_123.x",
    ":",
    "a:b",
    "lc:a",
    "lch:abc",
    "with space",
    "slash/and\\back",
    "%41",
    ":41",
    "\x00",
    "ü",
    "日本語",
    "emoji 🙂",
    "x" * 125,
]


@pytest.mark.parametrize("session_id", ID_CASES)
def test_id_map_is_reversible(session_id: str) -> None:
    store_id = to_store_session_id(session_id)
    assert len(store_id) <= 128
    assert all(c.isascii() and (c.isalnum() or c in "_-.:") for c in store_id)
    assert from_store_session_id(store_id) == session_id


def test_id_map_is_injective() -> None:
    ids = ID_CASES + [chr(c) for c in range(0, 0x250)] + ["a" * n for n in range(0, 200)]
    store_ids = [to_store_session_id(i) for i in ids]
    assert len(set(store_ids)) == len(set(ids))


def test_id_map_shape() -> None:
    assert to_store_session_id("chat-1") == "lc:chat-1"
    assert to_store_session_id("a/b:c") == "lc:a:2Fb:3Ac"
    assert to_store_session_id("ü") == "lc::C3:BC"
    with pytest.raises(ValueError):
        from_store_session_id("ses_123")
    with pytest.raises(ValueError):
        from_store_session_id("lc:a:2f")  # lower-case hex is never made
    with pytest.raises(ValueError):
        from_store_session_id("lc::FF")  # not UTF-8
    with pytest.raises(TypeError):
        to_store_session_id(7)  # type: ignore[arg-type]


def test_long_ids_become_digests_with_the_original_in_metadata(
    client: sessionstore.Client,
) -> None:
    long_ids = ["y" * 126, "z" * 10_000, "/" * 42, "é" * 300]
    store_ids = [to_store_session_id(i) for i in long_ids]
    for store_id in store_ids:
        assert store_id.startswith("lch:") and len(store_id) == 68
        with pytest.raises(ValueError, match="metadata"):
            from_store_session_id(store_id)
    assert len(set(store_ids)) == len(long_ids)
    # The boundary: 125 plain characters fit, 126 do not.
    assert to_store_session_id("y" * 125) == "lc:" + "y" * 125
    assert to_store_session_id("y" * 126).startswith("lch:")
    for original in long_ids:
        history = SessionstoreChatMessageHistory(original, client=client)
        history.add_messages([HumanMessage(original[:10])])
    for original in long_ids:
        history = SessionstoreChatMessageHistory(original, client=client)
        assert history.messages == [HumanMessage(original[:10])]
        session = client.get_session(history.store_session_id)
        assert session.metadata[SESSION_ID_METADATA_KEY] == original


# -- switching models ---------------------------------------------------------

CLAUDE = {"model_provider": "anthropic", "model_name": "claude-sonnet-4-5", "id": "msg_01"}
GPT = {"model_provider": "openai", "model_name": "gpt-5", "id": "resp_01"}
GEMINI = {"model_provider": "google_genai", "model_name": "gemini-3-pro"}
REASONING_ITEM = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "think\x00ing"}],
    "encrypted_content": "gAAAA-opaque",
}


def conversation() -> list[BaseMessage]:
    """A conversation started on Claude with thinking and a tool call, then
    continued on GPT with a reasoning item, then on Gemini with signed calls;
    the last call is still waiting for its result."""
    return [
        HumanMessage("weather in Paris and Rome?"),
        AIMessage(
            content=[
                {"type": "thinking", "thinking": "two cities\x00", "signature": "c2lnLWNsYXVkZQ=="},
                {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
                {"type": "text", "text": "Checking Paris."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            ],
            tool_calls=[{"name": "weather", "args": {"city": "Paris"}, "id": "toolu_1"}],
            response_metadata=CLAUDE,
            usage_metadata={
                "input_tokens": 100,
                "output_tokens": 40,
                "total_tokens": 140,
                "input_token_details": {"cache_read": 60, "cache_creation": 20},
                "output_token_details": {"reasoning": 25},
            },
        ),
        ToolMessage("18C", tool_call_id="toolu_1"),
        AIMessage(
            content="Now Rome.",
            additional_kwargs={"reasoning": REASONING_ITEM},
            tool_calls=[{"name": "weather", "args": {"city": "Rome"}, "id": "call_gpt"}],
            response_metadata=GPT,
        ),
        ToolMessage("21C", tool_call_id="call_gpt"),
        AIMessage(
            content="",
            additional_kwargs={GEMINI_SIGNATURES_KEY: {"call_gem": "Z2VtaW5pLXNpZw=="}},
            tool_calls=[{"name": "forecast", "args": {"days": 2}, "id": "call_gem"}],
            response_metadata=GEMINI,
        ),
    ]


def without_reasoning(message: BaseMessage) -> BaseMessage:
    if not isinstance(message, AIMessage):
        return message
    update: dict[str, object] = {
        "additional_kwargs": {
            k: v
            for k, v in message.additional_kwargs.items()
            if k not in ("reasoning", GEMINI_SIGNATURES_KEY)
        }
    }
    if isinstance(message.content, list):
        update["content"] = [
            b
            for b in message.content
            if not (isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking"))
        ]
    return message.model_copy(update=update)


def test_reasoning_is_stored_natively_with_each_answers_call(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("native-reasoning", client=client)
    history.add_messages(conversation())
    assert history.messages == conversation()  # no model given: exactly as added
    stored = client.export_history(history.store_session_id)
    claude, gpt, gemini = stored[1], stored[3], stored[5]
    kinds = [b.WhichOneof("block") for b in claude.content_blocks]
    assert kinds == ["thinking", "redacted_thinking", "json"]
    assert claude.content_blocks[0].thinking.thinking == "two cities\x00"
    assert claude.content_blocks[0].thinking.signature == "c2lnLWNsYXVkZQ=="
    reasoning = [b.json for b in gpt.content_blocks if b.json.type == "reasoning"]
    assert [json.loads(b.json) for b in reasoning] == [REASONING_ITEM]
    assert [c.signature for c in gemini.tool_calls] == ["Z2VtaW5pLXNpZw=="]
    calls = {c.id: c for c in client.list_provider_calls(history.store_session_id).provider_calls}
    assert len(calls) == 3
    rows = list(client.iter_messages(history.store_session_id))
    by_message = {r.sequence: calls[r.produced_by_call_id] for r in rows if r.produced_by_call_id}
    assert sorted(by_message) == [1, 3, 5]
    assert (by_message[1].provider, by_message[1].model) == ("anthropic", "claude-sonnet-4-5")
    assert by_message[1].request_id == "msg_01"
    assert (by_message[1].prompt_tokens, by_message[1].completion_tokens) == (100, 40)
    assert (by_message[1].cached_input_tokens, by_message[1].cache_creation_input_tokens) == (60, 20)
    assert by_message[1].reasoning_tokens == 25
    assert (by_message[3].provider, by_message[3].model) == ("openai", "gpt-5")
    assert (by_message[5].provider, by_message[5].model) == ("google", "gemini-3-pro")
    # Three answers: three exchanges, the human message in the first.
    assert client.get_session(history.store_session_id).revision == 4


@pytest.mark.parametrize(
    ("model", "keeps"),
    [
        ("anthropic/claude-sonnet-4-5", 1),
        ("openai/gpt-5", 3),
        ("google/gemini-3-pro", 5),
        (("Google_GenAI", "gemini-3-pro"), 5),
    ],
)
def test_each_model_reads_its_own_reasoning_only(
    client: sessionstore.Client, model: object, keeps: int
) -> None:
    SessionstoreChatMessageHistory("switch", client=client).add_messages(conversation())
    history = SessionstoreChatMessageHistory("switch", client=client, model=model)  # type: ignore[arg-type]
    expected = [
        message if index == keeps else without_reasoning(message)
        for index, message in enumerate(conversation())
    ]
    assert history.messages == expected
    # Storage is untouched: a reader without a model still sees everything.
    assert SessionstoreChatMessageHistory("switch", client=client).messages == conversation()


def test_reasoning_policies(client: sessionstore.Client) -> None:
    SessionstoreChatMessageHistory("policies", client=client).add_messages(conversation())
    same_provider = SessionstoreChatMessageHistory(
        "policies", client=client, model="anthropic/claude-opus-4", reasoning="same_provider"
    )
    expected = [m if i == 1 else without_reasoning(m) for i, m in enumerate(conversation())]
    assert same_provider.messages == expected
    none = SessionstoreChatMessageHistory(
        "policies", client=client, model="anthropic/claude-sonnet-4-5", reasoning="none"
    )
    assert none.messages == [without_reasoning(m) for m in conversation()]
    with pytest.raises(ValueError):
        SessionstoreChatMessageHistory("policies", client=client, model="gpt-5")
    with pytest.raises(ValueError):
        SessionstoreChatMessageHistory("policies", client=client, model="openai/gpt-5", reasoning="most")


def test_unanswered_tool_calls_are_dropped_for_a_target(client: sessionstore.Client) -> None:
    history = SessionstoreChatMessageHistory("pairing", client=client, model="openai/gpt-5")
    cancelled = AIMessage(
        content=[
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_x", "name": "search", "input": {}},
        ],
        tool_calls=[{"name": "search", "args": {}, "id": "toolu_x"}],
        response_metadata=CLAUDE,
    )
    history.add_messages([HumanMessage("q"), cancelled, HumanMessage("never mind"), AIMessage("ok")])
    # The call has no result and is not the last one: gone, with its block;
    # the text stays. Read without a target, nothing is lost.
    assert history.messages == [
        HumanMessage("q"),
        AIMessage(content=[{"type": "text", "text": "Let me look."}], response_metadata=CLAUDE),
        HumanMessage("never mind"),
        AIMessage("ok"),
    ]
    plain = SessionstoreChatMessageHistory("pairing", client=client)
    assert plain.messages[1] == cancelled
    # The answer without a model in its metadata was recorded as the history's.
    rows = list(client.iter_messages(history.store_session_id))
    calls = {c.id: c for c in client.list_provider_calls(history.store_session_id).provider_calls}
    assert calls[rows[3].produced_by_call_id].model == "gpt-5"


def test_pending_calls_of_the_last_answer_stay(client: sessionstore.Client) -> None:
    SessionstoreChatMessageHistory("pending", client=client).add_messages(conversation())
    history = SessionstoreChatMessageHistory("pending", client=client, model="google/gemini-3-pro")
    assert history.messages[-1] == conversation()[-1]  # its call and signature kept


@pytest.mark.asyncio
async def test_async_history_reads_for_its_model(server: Server) -> None:
    async with server.async_client() as aclient:
        history = SessionstoreChatMessageHistory(
            "async-switch", async_client=aclient, model="openai/gpt-5"
        )
        await history.aadd_messages(conversation())
        expected = [m if i == 3 else without_reasoning(m) for i, m in enumerate(conversation())]
        assert await history.aget_messages() == expected


# -- the RunnableWithMessageHistory shape, across event loops -----------------


def test_runnable_with_message_history_runs_sync_and_in_one_loop_after_another(
    server: Server, client: sessionstore.Client
) -> None:
    """LangChain's ``RunnableWithMessageHistory`` shape: a
    ``get_session_history`` that makes the history per session id, on
    clients made once, outside any event loop, and the chain called with
    ``invoke`` and in ``asyncio.run`` (a new loop each time), which goes
    through the ``AsyncClient``."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables.history import RunnableWithMessageHistory

    async_client = server.async_client()  # no event loop runs here

    def get_session_history(session_id: str) -> SessionstoreChatMessageHistory:
        return SessionstoreChatMessageHistory(
            session_id, client=client, async_client=async_client
        )

    model = FakeListChatModel(
        responses=["San Francisco", "California", "About 39 million", "Sacramento"]
    )
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Reply very concisely."),
            MessagesPlaceholder(variable_name="history"),
            ("human", "{question}"),
        ]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        get_session_history,
        input_messages_key="question",
        history_messages_key="history",
    )
    config = {"configurable": {"session_id": "conversation_123"}}
    questions = [
        "What city is the Golden Gate Bridge in?",
        "What state is it in?",
        "What's the population?",
        "And its capital?",
    ]
    answers = [
        chain.invoke({"question": question}, config=config).content for question in questions[:2]
    ]
    for question in questions[2:]:
        answers.append(asyncio.run(chain.ainvoke({"question": question}, config=config)).content)
    assert answers == ["San Francisco", "California", "About 39 million", "Sacramento"]
    stored = get_session_history("conversation_123").messages
    assert [(m.type, m.content) for m in stored] == [
        pair
        for question, answer in zip(questions, answers)
        for pair in (("human", question), ("ai", answer))
    ]
    asyncio.run(async_client.close())


# -- approvals -----------------------------------------------------------------


def test_an_approval_on_a_tool_call_of_the_history(server: Server) -> None:
    """The history reaches no pause of its own (see the module's
    documentation), but an ``AIMessage``'s tool calls are the session's
    native tool calls, so the plain client asks for approvals on them; a
    denial, decided by another client, reads back as the call's
    ``ToolMessage`` (the reason, ``status="error"``), for every reader and
    for a model's export; an approval adds nothing."""
    with server.client() as client, server.client() as decider:
        history = SessionstoreChatMessageHistory("approvals", client=client)
        calls = [
            {"name": "transfer", "args": {"amount": 5}, "id": "call_1", "type": "tool_call"},
            {"name": "lookup", "args": {"q": "rates"}, "id": "call_2", "type": "tool_call"},
        ]
        asked = AIMessage("", tool_calls=calls)
        history.add_messages([HumanMessage("send 5"), asked])
        sid = history.store_session_id
        denied = client.request_approval(sid, tool_call_id="call_1", title="transfer 5")
        approved = client.request_approval(sid, tool_call_id="call_2", title="lookup")
        decider.decide_approval(
            sid, approval_id=denied.approval.approval_id, decision="deny", reason="over the limit"
        )
        decider.decide_approval(sid, approval_id=approved.approval.approval_id, decision="approve")
        denial = ToolMessage(
            "over the limit", tool_call_id="call_1", status="error", name="transfer"
        )
        assert history.messages == [HumanMessage("send 5"), asked, denial]
        # The approved call runs; its result is added as any other.
        result = ToolMessage("1.1", tool_call_id="call_2")
        history.add_messages([result])
        assert history.messages == [HumanMessage("send 5"), asked, denial, result]
        for_model = SessionstoreChatMessageHistory("approvals", client=client, model="openai/gpt-5")
        assert for_model.messages == [HumanMessage("send 5"), asked, denial, result]
        with pytest.raises(sessionstore.ToolCallAnswered):
            client.request_approval(sid, tool_call_id="call_1")
