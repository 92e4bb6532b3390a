"""One client, many event loops and threads: an ``AsyncClient`` made outside
any event loop serves every loop it is used from (``asyncio.run`` again and
again, threads each running a loop of their own) and ``close`` releases the
channel of each; a ``Client`` is shared between threads; and both clients
offer the same methods."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import grpc
import pytest

import sessionstore
from sessionstore import AsyncClient, Client, v1

from .conftest import Server

#: How long a thread waits at a barrier for the others before the test fails.
BARRIER_TIMEOUT = 60


def user(text: str) -> v1.Message:
    return v1.Message(role=v1.ROLE_USER, content=text)


@pytest.fixture
def loop_in_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, stopped and closed at
    the end of the test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="other-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(BARRIER_TIMEOUT)
    loop.close()


def in_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Any]) -> Any:
    """Runs the coroutine ``make()`` in ``loop`` (running in another thread)
    and waits for its result."""

    async def run() -> Any:
        return await make()

    return asyncio.run_coroutine_threadsafe(run(), loop).result(BARRIER_TIMEOUT)


# -- AsyncClient -----------------------------------------------------------------


def test_an_async_client_made_outside_any_loop_serves_one_loop_after_another(
    server: Server,
) -> None:
    client = server.async_client()  # no event loop runs here
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def turn(session_id: str, text: str) -> list[str]:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await client.append_exchange(session_id, messages=[user(text)])
        return [message.content for message in await client.export_history(session_id)]

    session_id = asyncio.run(client.create_session(title="loops")).id
    assert asyncio.run(turn(session_id, "one")) == ["one"]
    assert asyncio.run(turn(session_id, "two")) == ["one", "two"]
    assert asyncio.run(turn(session_id, "three")) == ["one", "two", "three"]
    # A loop that has closed is not kept alive: the channel it had (which
    # holds it) was dropped, and with it closed, when the next loop came.
    gc.collect()
    assert [loop() is None for loop in loops] == [True, True, False]

    asyncio.run(client.close())
    with pytest.raises(ValueError, match="closed"):
        asyncio.run(client.get_session(session_id))


def test_iterators_and_watches_made_outside_any_loop_run_in_the_loop_that_reads_them(
    server: Server,
) -> None:
    client = server.async_client()
    session_id = asyncio.run(
        client.create_session(initial_history=[user("a"), user("b")])
    ).id
    events = client.watch(session_id)  # made before any loop runs
    messages = client.iter_messages(session_id, page_size=1)

    async def read() -> tuple[list[str | None], list[int]]:
        seen: list[str | None] = []
        async with events:
            async for event in events:
                seen.append(event.WhichOneof("event"))
                if event.HasField("caught_up"):
                    break
        return seen, [stored.sequence async for stored in messages]

    assert asyncio.run(read()) == (["session_created", "caught_up"], [0, 1])

    # A watch read in one loop and then in another resumes there after the
    # last revision it yielded.
    later = client.watch(session_id)

    async def next_event() -> tuple[int, str | None]:
        event = await later.__anext__()
        return event.revision, event.WhichOneof("event")

    async def change_and_read() -> tuple[int, str | None]:
        await client.set_state(session_id, key="k", value="v")
        return await next_event()

    assert asyncio.run(next_event()) == (1, "session_created")
    assert asyncio.run(next_event()) == (1, "caught_up")
    assert asyncio.run(change_and_read()) == (2, "state_changed")
    assert later.last_revision == 2
    later.close()
    asyncio.run(client.close())


def test_threads_each_running_their_own_loop_share_one_async_client(server: Server) -> None:
    client = server.async_client()
    shared = asyncio.run(client.create_session(title="shared")).id
    threads, turns = 4, 5
    # Every thread's loop is running, with its first call made, before any
    # of them goes on: the loops use the client at the same time.
    all_started = threading.Barrier(threads, timeout=BARRIER_TIMEOUT)

    async def work(n: int) -> list[str]:
        own = (await client.create_session(title=f"thread {n}")).id
        await asyncio.to_thread(all_started.wait)
        for t in range(turns):
            await client.append_exchange(own, messages=[user(f"{n}.{t}")])
            await client.append_exchange(shared, messages=[user(f"{n}.{t}")])
        return [message.content for message in await client.export_history(own)]

    with ThreadPoolExecutor(threads) as pool:
        histories = list(pool.map(lambda n: asyncio.run(work(n)), range(threads)))

    assert histories == [[f"{n}.{t}" for t in range(turns)] for n in range(threads)]
    stored = asyncio.run(client.export_history(shared))
    assert sorted(message.content for message in stored) == sorted(
        f"{n}.{t}" for n in range(threads) for t in range(turns)
    )
    asyncio.run(client.close())


def test_close_releases_the_channel_of_every_loop(
    server: Server, loop_in_thread: asyncio.AbstractEventLoop
) -> None:
    client = server.async_client()
    session_id = in_loop(loop_in_thread, lambda: client.create_session()).id
    # The other loop's channel (the client makes it on that loop's first call).
    other_channel = in_loop(loop_in_thread, _channel_of_running_loop(client))

    async def here() -> grpc.aio.Channel:
        await client.get_session(session_id)
        channel = await _channel_of_running_loop(client)()
        await client.close()
        return channel

    this_channel = asyncio.run(here())
    assert this_channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN
    # Closed in its own loop, by a callback close() left there: once a
    # later callback has run, it has too.
    in_loop(loop_in_thread, lambda: asyncio.sleep(0))
    assert other_channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN
    with pytest.raises(ValueError, match="closed"):
        in_loop(loop_in_thread, lambda: client.get_session(session_id))


def _channel_of_running_loop(client: AsyncClient) -> Callable[[], Any]:
    async def channel() -> grpc.aio.Channel:
        return client._loop_channel().channel

    return channel


def test_async_with_closes_the_client(server: Server) -> None:
    client = server.async_client()

    async def use() -> None:
        async with client:
            await client.create_session()

    asyncio.run(use())
    with pytest.raises(ValueError, match="closed"):
        asyncio.run(client.create_session())


# -- Client ------------------------------------------------------------------------


def test_a_client_is_safe_to_share_between_threads(client: sessionstore.Client) -> None:
    shared = client.create_session(title="shared").id
    threads, turns = 8, 6
    all_started = threading.Barrier(threads, timeout=BARRIER_TIMEOUT)

    def work(n: int) -> tuple[list[str], list[int]]:
        own = client.create_session(title=f"thread {n}").id
        all_started.wait()
        for t in range(turns):
            client.append_exchange(own, messages=[user(f"{n}.{t}")])
            client.append_exchange(shared, messages=[user(f"{n}.{t}")])
            client.set_state(own, key=f"k{t}", value=str(t))
        history = [message.content for message in client.export_history(own)]
        sequences = [stored.sequence for stored in client.iter_messages(own, page_size=2)]
        assert [entry.key for entry in client.iter_state(own, page_size=2)] == [
            f"k{t}" for t in range(turns)
        ]
        return history, sequences

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(work, range(threads)))

    for n, (history, sequences) in enumerate(results):
        assert history == [f"{n}.{t}" for t in range(turns)]
        assert sequences == list(range(turns))
    stored = client.export_history(shared)
    assert sorted(message.content for message in stored) == sorted(
        f"{n}.{t}" for n in range(threads) for t in range(turns)
    )
    assert [stored.sequence for stored in client.iter_messages(shared)] == list(
        range(threads * turns)
    )


def test_a_closed_client_refuses_calls(server: Server) -> None:
    client = server.client()
    client.close()
    with pytest.raises(ValueError, match="closed"):
        client.get_session("ses_x")


# -- the same surface --------------------------------------------------------------


def _public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, callable)
        if not name.startswith("_")
    }


#: What the async client's iterators return, for the blocking client's.
_ASYNC_RETURNS = {"Iterator": "AsyncIterator", "SessionEvents": "AsyncSessionEvents"}


def test_client_and_async_client_offer_the_same_methods() -> None:
    blocking, asynchronous = _public_methods(Client), _public_methods(AsyncClient)
    assert sorted(blocking) == sorted(asynchronous)
    for name, method in blocking.items():
        twin = asynchronous[name]
        ours, theirs = inspect.signature(method), inspect.signature(twin)
        # Names, kinds, defaults and annotations of every parameter.
        assert list(ours.parameters.values()) == list(theirs.parameters.values()), name
        assert not inspect.iscoroutinefunction(method), name
        returns = str(ours.return_annotation)
        head = returns.split("[", 1)[0]
        if head in _ASYNC_RETURNS:
            # Iterators: an async iterator of the same items.
            assert not inspect.iscoroutinefunction(twin), name
            assert theirs.return_annotation == _ASYNC_RETURNS[head] + returns[len(head) :], name
        else:
            # Calls: a coroutine with the same result.
            assert inspect.iscoroutinefunction(twin), name
            assert theirs.return_annotation == ours.return_annotation, name
    assert list(inspect.signature(Client.__init__).parameters.values()) == list(
        inspect.signature(AsyncClient.__init__).parameters.values()
    )
    # Context managers, each of its kind.
    assert hasattr(Client, "__enter__") and hasattr(Client, "__exit__")
    assert inspect.iscoroutinefunction(AsyncClient.__aenter__)
    assert inspect.iscoroutinefunction(AsyncClient.__aexit__)


def test_both_clients_have_the_same_public_attributes() -> None:
    blocking = Client("http://127.0.0.1:1")
    asynchronous = AsyncClient("http://127.0.0.1:1")
    try:
        public = {name for name in vars(blocking) if not name.startswith("_")}
        assert public == {name for name in vars(asynchronous) if not name.startswith("_")}
        assert public == {"url"}
    finally:
        blocking.close()
