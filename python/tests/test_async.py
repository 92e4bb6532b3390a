"""The asyncio client against a real server: the same calls, errors,
retries and watch resumption as the blocking one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

import sessionstore
from sessionstore import RetryPolicy, v1

from .conftest import TOKENS, RetrySignal, Server, free_port

PATIENT = RetryPolicy(max_attempts=60, initial_backoff=0.05, max_backoff=0.5)


def user(text: str) -> v1.Message:
    return v1.Message(role=v1.ROLE_USER, content=text)


@pytest.mark.asyncio
async def test_round_trip(server: Server) -> None:
    async with server.async_client() as client:
        session = await client.create_session(title="async", system_prompt="Be brief.", user="al")
        appended = await client.append_exchange(
            session.id,
            messages=[user("2+2?")],
            provider_call=v1.ProviderCall(provider="openai", model="gpt-x", prompt_tokens=5),
            response_messages=[{"role": "ROLE_ASSISTANT", "content": "4"}],
            expected_next_sequence=0,
        )
        assert (appended.revision, appended.next_sequence) == (2, 2)
        assert (await client.get_session(session.id)).revision == 2
        history = await client.export_history(session.id, include_system_prompt=True)
        assert [m.content for m in history] == ["Be brief.", "2+2?", "4"]
        assert [m.sequence async for m in client.iter_messages(session.id, page_size=1)] == [0, 1]
        summaries = [s async for s in client.iter_sessions(user="al")]
        assert [s.session.id for s in summaries] == [session.id]
        assert [c.model async for c in client.iter_provider_calls(session.id)] == ["gpt-x"]
        assert "2+2?" in await client.export_transcript(session.id)
        await client.set_state(session.id, key="k", value="v")
        assert [e.value async for e in client.iter_state(session.id)] == ["v"]
        assert await client.health_check("sessionstore.v1.SessionStore")
        await client.delete_session(session.id)
        with pytest.raises(sessionstore.SessionNotFound):
            await client.get_session(session.id)


@pytest.mark.asyncio
async def test_errors_are_typed(server: Server) -> None:
    async with server.async_client() as client:
        with pytest.raises(sessionstore.SessionNotFound) as missing:
            await client.get_session("ses_missing")
        assert missing.value.code == grpc.StatusCode.NOT_FOUND
        assert missing.value.metadata == {"session_id": "ses_missing"}
        session = await client.create_session()
        with pytest.raises(sessionstore.InvalidArgument) as invalid:
            await client.append_exchange(session.id, messages=[{"content": "no role"}])
        assert invalid.value.field == "messages[0].role"
        await client.append_exchange(session.id, messages=[user("a")])
        with pytest.raises(sessionstore.SequenceMismatch) as mismatch:
            await client.append_exchange(
                session.id, messages=[user("b")], expected_next_sequence=5
            )
        assert mismatch.value.actual_next_sequence == 1
        with pytest.raises(sessionstore.RevisionOutOfRange):
            async for _ in client.watch(session.id, after_revision=50):
                pass


@pytest.mark.asyncio
async def test_unavailable_is_retried_until_the_server_is_up(
    make_server: Callable[..., Server], retry_signal: RetrySignal
) -> None:
    port = free_port()
    async with sessionstore.AsyncClient(
        f"http://127.0.0.1:{port}", retry_policy=PATIENT
    ) as client:
        call = asyncio.ensure_future(client.list_sessions())
        retried = asyncio.ensure_future(asyncio.to_thread(retry_signal.retried.wait, 30))
        assert await retried, "the client never retried"
        server = make_server(start=False)
        await asyncio.to_thread(server.start, port)
        page = await asyncio.wait_for(call, 60)
        assert list(page.sessions) == []


@pytest.mark.asyncio
async def test_watch_resumes_across_a_restart(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = make_server(database_url=f"sqlite://{tmp_path / 'db.sqlite'}")
    async with server.async_client(watch_retry_policy=PATIENT) as client:
        session = await client.create_session()
        await client.append_exchange(session.id, messages=[user("one")])
        events = client.watch(session.id)
        seen: list[tuple[int, Any]] = []
        async for event in events:
            seen.append((event.revision, event.WhichOneof("event")))
            if event.HasField("caught_up"):
                break
        assert seen == [(1, "session_created"), (2, "exchange_appended"), (2, "caught_up")]

        await asyncio.to_thread(server.terminate)
        await asyncio.to_thread(server.start)
        await client.append_exchange(session.id, messages=[user("two")])
        later = []
        async for event in events:
            if event.HasField("progress"):
                continue
            later.append((event.revision, event.WhichOneof("event")))
            break
        assert later == [(3, "exchange_appended")]
        assert events.reconnects >= 1 and events.last_revision == 3

        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)
        await client.set_state(session.id, key="k", value="v")
        async for event in events:
            if not event.HasField("progress"):
                assert (event.revision, event.WhichOneof("event")) == (4, "state_changed")
                break
        await client.delete_session(session.id)
        rest = [e.WhichOneof("event") async for e in events if not e.HasField("progress")]
        assert rest == ["session_deleted"]


@pytest.mark.asyncio
async def test_token_auth(auth_server: Server) -> None:
    async with auth_server.async_client(retry_policy=RetryPolicy.never()) as anonymous:
        with pytest.raises(sessionstore.Unauthenticated):
            await anonymous.list_sessions()
    async with auth_server.async_client(token=TOKENS["acme"]) as acme:
        session = await acme.create_session()
        events = acme.watch(session.id)
        first = await events.__anext__()
        assert first.HasField("session_created")
        events.close()
    async with auth_server.async_client(token=TOKENS["globex"]) as globex:
        with pytest.raises(sessionstore.SessionNotFound):
            await globex.get_session(session.id)


@pytest.mark.asyncio
async def test_tls(make_server: Callable[..., Server], tls: Any) -> None:
    server = make_server(tls=tls)
    async with sessionstore.AsyncClient(server.url, tls_ca_certificate=tls.ca_path) as client:
        session = await client.create_session(title="over TLS")
        assert (await client.get_session(session.id)).title == "over TLS"


@pytest.mark.asyncio
async def test_export_for_a_model_async(server: Server) -> None:
    async with server.async_client() as client:
        await client.create_session(session_id="py-switch-async")
        await client.append_exchange(
            "py-switch-async",
            messages=[{"role": "ROLE_USER", "content": "hi"}],
            provider_call={"provider": "anthropic", "model": "claude-sonnet-4-5"},
            response_messages=[
                {
                    "role": "ROLE_ASSISTANT",
                    "content": "hello",
                    "content_blocks": [{"thinking": {"thinking": "t", "signature": "s"}}],
                }
            ],
        )
        for_gpt = await client.export_for("py-switch-async", "openai", "gpt-5")
        assert [m.content for m in for_gpt] == ["hi", "hello"]
        assert for_gpt[1].content_blocks == []
        same = await client.export_for("py-switch-async", "anthropic", "claude-sonnet-4-5")
        assert same[1].content_blocks[0].thinking.signature == "s"


@pytest.mark.asyncio
async def test_first_append_and_pop_in_one_call_each(server: Server) -> None:
    async with server.async_client() as client:
        first = await client.append_exchange(
            "py-async-first",
            messages=[user("a"), user("b")],
            create_if_missing={"title": "async first", "metadata": {"k": "v"}},
        )
        assert first.session_created and first.revision == 2
        session = await client.get_session("py-async-first")
        assert (session.title, dict(session.metadata)) == ("async first", {"k": "v"})
        later = await client.append_exchange(
            "py-async-first", messages=[user("c")], create_if_missing=True
        )
        assert not later.session_created
        popped = await client.rollback_session(
            "py-async-first", remove_last=1, return_removed=True
        )
        assert [m.message.content for m in popped.removed_messages] == ["c"]
        with pytest.raises(ValueError):
            await client.rollback_session("py-async-first")
