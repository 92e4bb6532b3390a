"""Usage that matches the bill: providers' usage objects onto the
ProviderCall buckets (sums computed by hand), and SummarizeUsage through the
blocking and the asyncio client against a real server."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

import sessionstore
from sessionstore import _requests, from_anthropic_usage, from_openai_usage, v1

from .conftest import Server

# An OpenAI Chat Completions usage of a reasoning model with a prompt-cache
# hit: prompt_tokens 2006 already includes the 1920 cached, completion_tokens
# 300 the 192 reasoning; total 2006 + 300 = 2306, as OpenAI says.
OPENAI_CHAT = {
    "prompt_tokens": 2006,
    "completion_tokens": 300,
    "total_tokens": 2306,
    "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 192,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}
# An OpenAI Responses API usage of a model that reports (and bills) cache
# writes: input 1547 includes the 1024 read from the cache and the 384
# written to it; output 941 includes 704 reasoning; total 1547 + 941 = 2488.
OPENAI_RESPONSES = {
    "input_tokens": 1547,
    "input_tokens_details": {
        "cached_tokens": 1024,
        "cache_write_tokens": 384,
        "cache_write_tokens_details": {"ttl_30m_tokens": 384, "ttl_12h_tokens": 0},
    },
    "output_tokens": 941,
    "output_tokens_details": {"reasoning_tokens": 704},
    "total_tokens": 2488,
}
# A Chat Completions call that wrote its prompt to the cache: 3968 of the
# 4000 prompt tokens written, none read; total 4000 + 20 = 4020.
OPENAI_CHAT_CACHE_WRITE = {
    "prompt_tokens": 4000,
    "completion_tokens": 20,
    "total_tokens": 4020,
    "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 3968},
}
# No details at all, or null ones (older models, OpenAI-compatible servers):
# 9 + 2 = 11, nothing cached, no reasoning.
OPENAI_BARE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
OPENAI_NULLS = {
    "prompt_tokens": 9,
    "completion_tokens": 2,
    "total_tokens": 11,
    "prompt_tokens_details": None,
    "completion_tokens_details": {"reasoning_tokens": None},
}
# An Anthropic Messages usage reading 10240 tokens from the cache and writing
# 1253 to it. input_tokens 50 excludes both: prompt = 50 + 10240 + 1253 =
# 11543; completion 503 (thinking included, no separate count: reasoning 0);
# total 11543 + 503 = 12046.
ANTHROPIC_CACHED = {
    "input_tokens": 50,
    "cache_creation_input_tokens": 1253,
    "cache_read_input_tokens": 10240,
    "cache_creation": {"ephemeral_5m_input_tokens": 1253, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 503,
    "server_tool_use": None,
    "service_tier": "standard",
}
# No caching: cache_creation_input_tokens null, cache_read_input_tokens
# absent. prompt = 12 + 0 + 0 = 12; total 12 + 7 = 19.
ANTHROPIC_NULLS = {"input_tokens": 12, "cache_creation_input_tokens": None, "output_tokens": 7}


def buckets(call: v1.ProviderCall) -> tuple[int, ...]:
    """prompt, cached, cache creation, completion, reasoning, total."""
    return (
        call.prompt_tokens,
        call.cached_input_tokens,
        call.cache_creation_input_tokens,
        call.completion_tokens,
        call.reasoning_tokens,
        call.total_tokens,
    )


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (OPENAI_CHAT, (2006, 1920, 0, 300, 192, 2306)),
        (OPENAI_RESPONSES, (1547, 1024, 384, 941, 704, 2488)),
        (OPENAI_CHAT_CACHE_WRITE, (4000, 0, 3968, 20, 0, 4020)),
        (OPENAI_BARE, (9, 0, 0, 2, 0, 11)),
        (OPENAI_NULLS, (9, 0, 0, 2, 0, 11)),
    ],
    ids=["chat-completions", "responses", "chat-cache-write", "bare", "nulls"],
)
def test_openai_usage(usage: dict[str, Any], expected: tuple[int, ...]) -> None:
    call = from_openai_usage(usage, model="o4-mini")
    assert isinstance(call, v1.ProviderCall)
    assert (call.provider, call.model) == ("openai", "o4-mini")
    assert buckets(call) == expected
    assert call.usage_json == json.dumps(usage, separators=(",", ":"))


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (ANTHROPIC_CACHED, (11543, 10240, 1253, 503, 0, 12046)),
        (ANTHROPIC_NULLS, (12, 0, 0, 7, 0, 19)),
    ],
    ids=["cache-reads-and-writes", "nulls"],
)
def test_anthropic_usage(usage: dict[str, Any], expected: tuple[int, ...]) -> None:
    call = from_anthropic_usage(usage, model="claude-sonnet-4-5")
    assert (call.provider, call.model) == ("anthropic", "claude-sonnet-4-5")
    assert buckets(call) == expected
    assert call.usage_json == json.dumps(usage, separators=(",", ":"))


def test_usage_call_fields() -> None:
    call = from_anthropic_usage(
        ANTHROPIC_NULLS,
        model="claude-sonnet-4-5",
        provider="bedrock",
        cost_micros_usd=42,
        request_id="gw-9",
        requested_provider="anthropic",
        requested_model="claude-sonnet",
        duration=datetime.timedelta(milliseconds=1500),
    )
    assert (call.provider, call.requested_provider, call.requested_model) == (
        "bedrock",
        "anthropic",
        "claude-sonnet",
    )
    assert (call.cost_micros_usd, call.request_id) == (42, "gw-9")
    assert (call.duration.seconds, call.duration.nanos) == (1, 500_000_000)
    assert from_openai_usage(OPENAI_BARE, model="m", duration=0.25).duration.nanos == 250_000_000
    assert not from_openai_usage(OPENAI_BARE, model="m").HasField("duration")


def test_usage_as_json_text_is_kept_verbatim() -> None:
    text = '{"input_tokens": 50, "cache_read_input_tokens": 10240, "output_tokens": 3}'
    call = from_anthropic_usage(text, model="claude")
    assert buckets(call) == (10290, 10240, 0, 3, 0, 10293)
    assert call.usage_json == text
    assert from_openai_usage(text.encode(), model="gpt").usage_json == text


class SdkUsage:
    """Stands in for an SDK's pydantic usage model: fields set from the wire,
    the others None unless ``exclude_unset``."""

    FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details")

    def __init__(self, **wire: Any) -> None:
        self.wire = wire

    def model_dump(
        self, *, mode: str = "python", by_alias: bool = False, exclude_unset: bool = False
    ) -> dict[str, Any]:
        assert mode == "json" and by_alias
        if exclude_unset:
            return dict(self.wire)
        return {name: self.wire.get(name) for name in self.FIELDS}


class PlainDump:
    """A model whose ``model_dump`` takes no keywords."""

    def model_dump(self) -> dict[str, Any]:
        return dict(OPENAI_RESPONSES)


def test_usage_sdk_objects() -> None:
    usage = SdkUsage(
        prompt_tokens=2006, completion_tokens=300, prompt_tokens_details={"cached_tokens": 1920}
    )
    call = from_openai_usage(usage, model="o4-mini")
    # 2006 + 300 = 2306; only the fields the API sent are kept.
    assert buckets(call) == (2006, 1920, 0, 300, 0, 2306)
    assert json.loads(call.usage_json) == usage.wire
    assert buckets(from_openai_usage(PlainDump(), model="o3")) == (1547, 1024, 384, 941, 704, 2488)
    with pytest.raises(TypeError):
        from_openai_usage(42, model="x")
    with pytest.raises(TypeError):
        from_anthropic_usage("[1, 2]", model="x")


def test_no_usage_and_junk_counts() -> None:
    for empty in (None, "null"):
        call = from_openai_usage(empty, model="gpt-4o")
        assert buckets(call) == (0,) * 6
        assert call.usage_json == ""
    junk = {"prompt_tokens": 2**70, "completion_tokens": "12", "prompt_tokens_details": {"cached_tokens": 3.0}}
    assert buckets(from_openai_usage(junk, model="m")) == (2**63 - 1, 3, 0, 0, 0, 2**63 - 1)
    assert from_anthropic_usage({"input_tokens": True}, model="m").prompt_tokens == 0


def test_usage_group_by_names() -> None:
    for value in (None, "", "total", "unspecified", 0):
        assert _requests.usage_group_by(value) == v1.USAGE_GROUP_BY_UNSPECIFIED
    assert _requests.usage_group_by("model") == v1.USAGE_GROUP_BY_MODEL
    assert _requests.usage_group_by("USAGE_GROUP_BY_DAY") == v1.USAGE_GROUP_BY_DAY
    assert _requests.usage_group_by(v1.USAGE_GROUP_BY_SESSION) == v1.USAGE_GROUP_BY_SESSION
    with pytest.raises(ValueError):
        _requests.usage_group_by("week")
    assert sessionstore.usage.from_openai_usage is from_openai_usage


def row(r: v1.UsageRow) -> tuple[Any, ...]:
    """key, calls, prompt, cached, cache creation, completion, reasoning, total, cost."""
    return (
        r.key,
        r.calls,
        r.prompt_tokens,
        r.cached_input_tokens,
        r.cache_creation_input_tokens,
        r.completion_tokens,
        r.reasoning_tokens,
        r.total_tokens,
        r.cost_micros_usd,
    )


def append_calls(client: sessionstore.Client) -> None:
    """Alice's session: the Chat Completions and Responses calls; Bob's: the
    two Anthropic calls."""
    client.create_session(session_id="py-usage-alice", user="alice")
    client.create_session(session_id="py-usage-bob", user="bob")
    for session_id, call in [
        ("py-usage-alice", from_openai_usage(OPENAI_CHAT, model="o4-mini", cost_micros_usd=1000, duration=1.25)),
        ("py-usage-alice", from_openai_usage(OPENAI_RESPONSES, model="o3", cost_micros_usd=2000)),
        ("py-usage-bob", from_anthropic_usage(ANTHROPIC_CACHED, model="claude-sonnet-4-5", cost_micros_usd=3000)),
        ("py-usage-bob", from_anthropic_usage(ANTHROPIC_NULLS, model="claude-sonnet-4-5", cost_micros_usd=10)),
    ]:
        client.append_exchange(
            session_id,
            messages=[{"role": "ROLE_USER", "content": "q"}],
            provider_call=call,
            response_messages=[{"role": "ROLE_ASSISTANT", "content": "a"}],
        )


# The sums of the four calls, by hand (figures as in `row`).
# prompt 2006 + 1547 + 11543 + 12 = 15108; cached 1920 + 1024 + 10240 = 13184;
# cache creation 384 + 1253 = 1637; completion 300 + 941 + 503 + 7 = 1751;
# reasoning 192 + 704 = 896; total 2306 + 2488 + 12046 + 19 = 16859
# (= 15108 + 1751); cost 1000 + 2000 + 3000 + 10 = 6010.
TOTAL = ("", 4, 15108, 13184, 1637, 1751, 896, 16859, 6010)
BY_MODEL = [
    # 11543 + 12 = 11555; 503 + 7 = 510; 12046 + 19 = 12065; 3000 + 10.
    ("anthropic/claude-sonnet-4-5", 2, 11555, 10240, 1253, 510, 0, 12065, 3010),
    ("openai/o3", 1, 1547, 1024, 384, 941, 704, 2488, 2000),
    ("openai/o4-mini", 1, 2006, 1920, 0, 300, 192, 2306, 1000),
]
BY_USER = [
    # 2006 + 1547 = 3553; 1920 + 1024 = 2944; 300 + 941 = 1241;
    # 192 + 704 = 896; 2306 + 2488 = 4794.
    ("alice", 2, 3553, 2944, 384, 1241, 896, 4794, 3000),
    ("bob", 2, 11555, 10240, 1253, 510, 0, 12065, 3010),
]


def test_summarize_usage_sums_what_the_helpers_made(client: sessionstore.Client) -> None:
    started = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    append_calls(client)

    # The stored call is the helper's, total and raw usage included.
    stored = list(client.iter_provider_calls("py-usage-alice"))
    assert buckets(stored[0]) == (2006, 1920, 0, 300, 192, 2306)
    assert json.loads(stored[0].usage_json) == OPENAI_CHAT
    assert (stored[0].duration.seconds, stored[0].duration.nanos) == (1, 250_000_000)

    total = client.summarize_usage()
    assert isinstance(total, v1.SummarizeUsageResponse)
    assert [row(r) for r in total.rows] == [TOTAL]
    assert total.next_page_token == ""

    # One row a page: three pages, followed by iter_usage.
    first = client.summarize_usage(group_by="model", page_size=1)
    assert [row(r) for r in first.rows] == BY_MODEL[:1] and first.next_page_token
    assert [row(r) for r in client.iter_usage(group_by="model", page_size=1)] == BY_MODEL
    assert [row(r) for r in client.iter_usage(group_by=v1.USAGE_GROUP_BY_USER)] == BY_USER
    assert [(r.key, r.calls) for r in client.iter_usage(group_by="session")] == [
        ("py-usage-alice", 2),
        ("py-usage-bob", 2),
    ]
    assert [row(r) for r in client.iter_usage(group_by="model", user="bob")] == BY_MODEL[:1]
    assert row(client.summarize_usage(session_id="py-usage-alice").rows[0]) == (
        ("",) + BY_USER[0][1:]
    )

    # By UTC day since the start; nothing before it.
    days = list(client.iter_usage(group_by="day", start_time=started))
    assert sum(r.calls for r in days) == 4
    assert all(r.key >= started.strftime("%Y-%m-%d") for r in days)
    assert client.summarize_usage(end_time=started).rows[0].calls == 0
    with pytest.raises(sessionstore.SessionNotFound):
        client.summarize_usage(session_id="py-usage-nobody")


@pytest.mark.asyncio
async def test_summarize_usage_async(server: Server) -> None:
    with server.client() as client:
        append_calls(client)
    async with server.async_client() as client:
        total = await client.summarize_usage()
        assert [row(r) for r in total.rows] == [TOTAL]
        rows = [row(r) async for r in client.iter_usage(group_by="model", page_size=2)]
        assert rows == BY_MODEL


def test_erase_user(client: sessionstore.Client) -> None:
    """EraseUser through the blocking client: counts, gone from reads, the
    scope named erased, another user untouched, a bad request refused."""
    append_calls(client)
    client.set_state(scope="user:app:alice", key="pref", value="tea")
    erased = client.erase_user("alice", scopes=["user:app:alice"])
    assert isinstance(erased, v1.EraseUserResponse)
    assert (erased.sessions_deleted, erased.provider_calls_deleted) == (1, 2)
    assert erased.messages_deleted > 0
    with pytest.raises(sessionstore.SessionNotFound):
        client.get_session("py-usage-alice")
    with pytest.raises(sessionstore.StateNotFound):
        client.get_state(scope="user:app:alice", key="pref")
    assert client.get_session("py-usage-bob").user == "bob"
    assert [r.key for r in client.iter_usage(group_by="user")] == ["bob"]
    with pytest.raises(sessionstore.InvalidArgument) as refused:
        client.erase_user("")
    assert refused.value.field == "user"


@pytest.mark.asyncio
async def test_erase_user_async(server: Server) -> None:
    with server.client() as client:
        append_calls(client)
    async with server.async_client() as client:
        erased = await client.erase_user("bob")
        assert erased.sessions_deleted == 1
        again = await client.erase_user("bob")
        assert again.sessions_deleted == 0
