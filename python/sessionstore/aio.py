"""The asyncio client (``grpc.aio``): the same methods as ``Client``, as
coroutines; the ``iter_*`` helpers and ``watch`` are async iterators.

A ``grpc.aio`` channel belongs to the event loop it was made in, so an
``AsyncClient`` keeps one channel per event loop it is used from, made on
the first call in that loop: the client itself can be made anywhere (at
module level, before any loop runs) and used from one loop after another
(``asyncio.run`` again and again) or from several threads at once, each
running its own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from types import TracebackType
from typing import Any, Callable, NamedTuple, TypeVar

import grpc
import grpc.aio

from . import _requests as req
from . import _transport
from ._errors import SessionstoreError, from_rpc_error
from ._proto.sessionstore.v1 import messages_pb2 as m
from ._proto.sessionstore.v1 import sessionstore_pb2 as s
from ._proto.sessionstore.v1.sessionstore_pb2_grpc import SessionStoreStub
from ._requests import (
    ApprovalDecisionLike,
    ApprovalStateLike,
    ContentBlockLike,
    DetailLike,
    InputModeLike,
    LeaseLike,
    MessageLike,
    NewSessionLike,
    ProviderCallLike,
    ReasoningPolicyLike,
    StateChangeLike,
    TimeLike,
    TranscriptFormatLike,
    UsageGroupByLike,
)
from ._retry import RetryPolicy, log_retry
from ._transport import PemSource
from ._watch import WatchState, ended_early, resumable

__all__ = ["AsyncClient", "AsyncSessionEvents"]

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:50051"


class _LoopChannel(NamedTuple):
    """The channel an :class:`AsyncClient` uses in one event loop."""

    channel: grpc.aio.Channel
    stub: SessionStoreStub


class AsyncClient:
    """An asyncio client of a sessionstore server, with the same methods,
    arguments, retries and errors as :class:`sessionstore.Client`.

    It may be made outside any event loop, and used from any: one loop after
    another (``asyncio.run`` twice, ``Runner.run_sync`` twice) or several at
    once in different threads. It opens one ``grpc.aio`` channel per event
    loop, on the first call in that loop; a channel whose loop has closed is
    dropped (closing it) when the client next opens one. Use it as an async
    context manager or ``await client.close()`` to close every channel.

    Args:
        url: ``http://HOST:PORT``, or ``https://HOST:PORT`` for TLS.
        token: A bearer token, sent as ``authorization: Bearer TOKEN`` on every call.
        tls_ca_certificate: The CA to trust for ``https://`` (a path, or PEM bytes).
        tls_client_certificate: For mutual TLS: the client's certificate chain.
        tls_client_key: For mutual TLS: the client's private key.
        tls_domain_name: The name to verify the server's certificate against.
        request_timeout: Seconds each attempt of a unary call may take
            (``None``: no deadline). Streams have no deadline.
        retry_policy: Retries of transient failures.
        watch_retry_policy: Reconnections of :meth:`watch` in a row without
            an event between them before it gives up.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        tls_ca_certificate: PemSource | None = None,
        tls_client_certificate: PemSource | None = None,
        tls_client_key: PemSource | None = None,
        tls_domain_name: str | None = None,
        request_timeout: float | None = 30.0,
        retry_policy: RetryPolicy = RetryPolicy(),
        watch_retry_policy: RetryPolicy = RetryPolicy(max_attempts=30),
    ) -> None:
        target = _transport.parse_url(url)
        self.url = url
        self._address = target.address
        self._options = _transport.channel_options(tls_domain_name)
        self._metadata = _transport.call_metadata(token)
        self._credentials: grpc.ChannelCredentials | None = None
        if target.secure:
            self._credentials = _transport.credentials(
                tls_ca_certificate, tls_client_certificate, tls_client_key
            )
        elif tls_ca_certificate is not None or tls_client_certificate is not None:
            raise ValueError("TLS settings need an https:// URL")
        self._timeout = request_timeout
        self._retry = retry_policy
        self._watch_retry = watch_retry_policy
        # One channel per event loop (a grpc.aio channel works only in its
        # own). A channel holds its loop, so a weak map would never let go
        # of one: entries of closed loops are dropped by _loop_channel.
        self._channels: dict[asyncio.AbstractEventLoop, _LoopChannel] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle ---------------------------------------------------------

    async def close(self) -> None:
        """Closes the client's channels, one per event loop it was used in;
        calls in flight in this loop are cancelled. A channel of a loop
        running in another thread is closed there, without waiting; one of
        a loop that has stopped is dropped, which closes it. Calls made
        afterwards raise ``ValueError``."""
        with self._lock:
            self._closed = True
            entries = list(self._channels.items())
            self._channels.clear()
        current = asyncio.get_running_loop()
        for loop, entry in entries:
            if loop is current:
                await entry.channel.close()
            elif loop.is_running():
                try:
                    asyncio.run_coroutine_threadsafe(entry.channel.close(), loop)
                except RuntimeError:  # the loop closed meanwhile
                    pass

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    # -- plumbing ----------------------------------------------------------

    def _loop_channel(self) -> _LoopChannel:
        """The channel of the running event loop, made on its first call."""
        loop = asyncio.get_running_loop()
        entry = self._channels.get(loop)
        if entry is not None:
            return entry
        with self._lock:
            if self._closed:
                raise ValueError(f"{self!r} is closed")
            entry = self._channels.get(loop)
            if entry is not None:
                return entry
            # Nothing runs on a closed loop any more: its channel has no
            # calls left, and dropping it closes it.
            for stale in [other for other in self._channels if other.is_closed()]:
                del self._channels[stale]
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(
                    self._address, self._credentials, options=self._options
                )
            else:
                channel = grpc.aio.insecure_channel(self._address, options=self._options)
            entry = _LoopChannel(channel, SessionStoreStub(channel))  # type: ignore[no-untyped-call]
            self._channels[loop] = entry
            return entry

    def _loop_stub(self) -> SessionStoreStub:
        """The stub of the running event loop's channel."""
        return self._loop_channel().stub

    async def _call(self, name: str, request: Any, *, retry: bool) -> Any:
        method: Callable[..., Any] = getattr(self._loop_stub(), name)
        attempt = 1
        while True:
            try:
                return await method(request, timeout=self._timeout, metadata=self._metadata)
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                if not (retry and self._retry.should_retry(error, attempt)):
                    raise error from rpc_error
            delay = self._retry.delay_after(error, attempt)
            log_retry(name, error, attempt, delay)
            await asyncio.sleep(delay)
            attempt += 1

    async def _stream(self, name: str, request: Any) -> AsyncIterator[Any]:
        """The responses of a server stream. Opening it is retried until the
        first response arrives; a failure after that ends the iteration."""
        method: Callable[..., Any] = getattr(self._loop_stub(), name)
        attempt = 1
        while True:
            call = method(request, metadata=self._metadata)
            received = False
            try:
                async for response in call:
                    received = True
                    yield response
                return
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                if received or not self._retry.should_retry(error, attempt):
                    raise error from rpc_error
            finally:
                call.cancel()
            delay = self._retry.delay_after(error, attempt)
            log_retry(name, error, attempt, delay)
            await asyncio.sleep(delay)
            attempt += 1

    @staticmethod
    async def _pages(
        fetch: Callable[[str], Awaitable[Any]], items: Callable[[Any], Iterable[T]]
    ) -> AsyncIterator[T]:
        token = ""
        while True:
            page = await fetch(token)
            for item in items(page):
                yield item
            token = page.next_page_token
            if not token:
                return

    # -- health ------------------------------------------------------------

    async def health_check(
        self, service: str = "", *, wait_for_ready: bool = False, timeout: float | None = None
    ) -> bool:
        """Whether the server's ``grpc.health.v1`` service reports ``SERVING``
        for ``service``; with ``wait_for_ready`` the call waits (up to
        ``timeout``) for the server to accept connections."""
        check = self._loop_channel().channel.unary_unary(_transport.HEALTH_CHECK)
        try:
            data = await check(
                _transport.encode_health_request(service),
                timeout=timeout if timeout is not None else self._timeout,
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from rpc_error
        return _transport.decode_health_status(data) == 1

    # -- sessions ----------------------------------------------------------

    async def create_session(
        self,
        *,
        session_id: str = "",
        title: str = "",
        system_prompt: str = "",
        user: str = "",
        metadata: Mapping[str, str] | None = None,
        initial_history: Iterable[MessageLike] = (),
        initial_state: Mapping[str, str] | None = None,
        state_changes: Iterable[StateChangeLike] = (),
        state_scopes: Iterable[str] = (),
        request_id: str = "",
    ) -> m.Session:
        """Creates a session (revision 1) and returns it.

        ``session_id`` is optional (the server makes ``ses_…`` ids);
        ``AlreadyExists`` if taken. ``initial_history`` rehydrates an exported
        conversation; ``initial_state`` writes state entries in revision 1.
        ``state_changes`` (``StateChange`` or dicts with ``scope``, ``key``,
        ``value``) write shared scopes such as ``app:weather`` in the same
        transaction: all of it is created, or none. ``state_scopes`` fills
        the returned ``Session.state`` with those scopes' entries (``""``:
        the session's own), read after the writes. With a ``request_id``
        the call is retried on transient failures (a retry answers the
        session the first call created); without one it is not, as a retry
        of a create that reached the server would fail or make a second
        session.
        """
        request = req.create_session(
            session_id,
            title,
            system_prompt,
            user,
            metadata,
            initial_history,
            initial_state,
            state_changes,
            state_scopes,
            request_id,
        )
        return await self._call(  # type: ignore[no-any-return]
            "CreateSession", request, retry=bool(request_id)
        )

    async def get_session(self, session_id: str, *, state_scopes: Iterable[str] = ()) -> m.Session:
        """The session's fields and revision (``SessionNotFound`` if none).
        ``state_scopes`` (``""`` for the session's own state, or shared
        scopes such as ``app:weather``) fills ``Session.state`` with their
        entries, read with the session in one snapshot. Retried."""
        request = req.get_session(session_id, state_scopes)
        return await self._call("GetSession", request, retry=True)  # type: ignore[no-any-return]

    async def list_sessions(
        self, *, user: str = "", filter: str = "", page_size: int = 0, page_token: str = ""
    ) -> s.ListSessionsResponse:
        """One page of session summaries, newest update first. ``filter`` is
        the AIP-160 subset the server takes (``metadata.app = "x" AND user =
        "alice"``). Retried. See :meth:`iter_sessions` for every page."""
        request = s.ListSessionsRequest(
            user=user, filter=filter, page_size=page_size, page_token=page_token
        )
        return await self._call("ListSessions", request, retry=True)  # type: ignore[no-any-return]

    def iter_sessions(
        self, *, user: str = "", filter: str = "", page_size: int = 0
    ) -> AsyncIterator[m.SessionSummary]:
        """Every matching session's summary, fetching pages as it is read."""
        return self._pages(
            lambda token: self.list_sessions(
                user=user, filter=filter, page_size=page_size, page_token=token
            ),
            lambda page: page.sessions,
        )

    async def update_session(
        self,
        session_id: str,
        *,
        title: str | None = None,
        system_prompt: str | None = None,
        metadata: Mapping[str, str] | None = None,
        summary_message_id: str | None = None,
    ) -> m.Session:
        """Updates the fields given (the others are left alone) and returns
        the session. ``metadata`` replaces the whole map. Retried (setting
        the same values again is harmless)."""
        request = req.update_session(
            session_id, title, system_prompt, metadata, summary_message_id
        )
        return await self._call("UpdateSession", request, retry=True)  # type: ignore[no-any-return]

    async def delete_session(self, session_id: str) -> s.DeleteSessionResponse:
        """Deletes the session with its messages, provider calls and state;
        watchers get ``session_deleted``. Not retried."""
        request = s.DeleteSessionRequest(session_id=session_id)
        return await self._call("DeleteSession", request, retry=False)  # type: ignore[no-any-return]

    async def erase_user(
        self, user: str, *, scopes: Iterable[str] = ()
    ) -> s.EraseUserResponse:
        """Erases every session of ``user`` in the caller's tenant, with
        their messages, provider calls, history and state, and the shared
        state ``scopes`` named (such as ``user:APP:USER``); watchers get
        ``session_deleted``. Once it answers, no file of the store holds
        what was erased, and the store keeps only a content-free record.
        Answers the counts. Retried (a repeat finishes an erasure cut
        short).

        A user with thousands of sessions takes longer than the default
        ``request_timeout`` (on SQLite, removing their words from the search
        index takes a few milliseconds a message): call it on a client made
        with a longer ``request_timeout`` (``sessionstore sessions
        erase-user`` waits up to an hour), or call it again until it
        answers."""
        request = s.EraseUserRequest(user=user, scopes=list(scopes))
        return await self._call("EraseUser", request, retry=True)  # type: ignore[no-any-return]

    async def fork_session(
        self, session_id: str, *, at_sequence: int, new_session_id: str = ""
    ) -> m.Session:
        """A new session holding the history up to ``at_sequence`` (-1: none).
        Not retried."""
        request = s.ForkSessionRequest(
            session_id=session_id, at_sequence=at_sequence, new_session_id=new_session_id
        )
        return await self._call("ForkSession", request, retry=False)  # type: ignore[no-any-return]

    # -- messages ----------------------------------------------------------

    async def append_exchange(
        self,
        session_id: str,
        *,
        messages: Iterable[MessageLike] = (),
        full_history: Iterable[MessageLike] | None = None,
        provider_call: ProviderCallLike | None = None,
        response_messages: Iterable[MessageLike] = (),
        expected_next_sequence: int | None = None,
        request_id: str | None = None,
        run_id: str = "",
        state_changes: Iterable[StateChangeLike] = (),
        create_if_missing: NewSessionLike | None = None,
    ) -> s.AppendExchangeResponse:
        """Appends input messages, a provider call and its response messages
        (and ``state_changes``) in one transaction; returns the stored
        messages with their ids and sequences, the revision and the next
        sequence.

        Messages may be ``v1.Message`` or dicts of its fields. Give
        ``full_history`` instead of ``messages`` to send the whole history
        (only the new tail is stored). With ``expected_next_sequence`` the
        call fails ``SequenceMismatch`` if another writer got there first.

        ``create_if_missing`` makes a first write one call: when
        ``session_id`` names no session, the server creates it (revision 1)
        in the same transaction as the exchange (revision 2), with the
        fields given: ``True`` for none, a dict of ``CreateSessionRequest``
        fields (``title``, ``system_prompt``, ``user``, ``metadata``,
        ``initial_state``, ``expire_time``; no ``initial_history``) or a
        ``CreateSessionRequest``. A session that exists is appended to and
        the fields are ignored; the response's ``session_created`` says
        which happened. Racing first writers create it once.

        Retried: every attempt carries ``request_id`` (a fresh UUID when not
        given), so the server stores the exchange at most once. Pass your own
        ``request_id`` to make a later call with the same exchange safe too.
        """
        request = req.append_exchange(
            session_id,
            messages,
            full_history,
            provider_call,
            response_messages,
            expected_next_sequence,
            request_id,
            run_id,
            state_changes,
            create_if_missing,
        )
        return await self._call("AppendExchange", request, retry=True)  # type: ignore[no-any-return]

    async def iter_history(
        self,
        session_id: str,
        *,
        include_system_prompt: bool = False,
        from_summary: bool = False,
        after_sequence: int | None = None,
        max_messages: int = 0,
    ) -> AsyncIterator[m.Message]:
        """The session's messages in sequence order, streamed in bounded
        memory. Opening the export is retried; a failure mid-stream raises."""
        request = req.export_history(
            session_id, include_system_prompt, from_summary, after_sequence, max_messages
        )
        async for chunk in self._stream("ExportHistory", request):
            for message in chunk.messages:
                yield message

    async def export_history(
        self,
        session_id: str,
        *,
        include_system_prompt: bool = False,
        from_summary: bool = False,
        after_sequence: int | None = None,
        max_messages: int = 0,
    ) -> list[m.Message]:
        """The session's messages in sequence order, as a list: ready to hand
        to a model or to ``create_session(initial_history=...)``.

        ``include_system_prompt`` puts the prompt first as a system message;
        ``from_summary`` starts at the summary message; ``max_messages`` keeps
        the most recent ones (never starting on an orphaned tool result).
        """
        return [
            message
            async for message in self.iter_history(
                session_id,
                include_system_prompt=include_system_prompt,
                from_summary=from_summary,
                after_sequence=after_sequence,
                max_messages=max_messages,
            )
        ]

    async def export_for(
        self,
        session_id: str,
        provider: str,
        model: str,
        *,
        reasoning: ReasoningPolicyLike = "same_model",
        max_messages: int = 0,
    ) -> list[m.Message]:
        """The history as ``provider``'s ``model`` accepts it, for the next
        turn after a switch of model: reasoning only that model made
        (``reasoning="same_provider"`` keeps any of the provider's models',
        ``"none"`` none), no message left with only reasoning, and every tool
        call paired with its result (the last message's calls kept while
        pending). ``max_messages`` keeps the most recent of those. Storage is
        not changed. Opening is retried."""
        request = req.export_history(
            session_id, False, False, None, max_messages, req.export_target(provider, model, reasoning)
        )
        return [
            message
            async for chunk in self._stream("ExportHistory", request)
            for message in chunk.messages
        ]

    async def list_messages(
        self,
        session_id: str,
        *,
        after_sequence: int | None = None,
        page_size: int = 0,
        page_token: str = "",
        order_by: str = "",
        before_sequence: int | None = None,
    ) -> s.ListMessagesResponse:
        """One page of stored messages (with ids and sequences), oldest first,
        or newest first with ``order_by="sequence desc"``; only those between
        ``after_sequence`` and ``before_sequence`` when given. Retried."""
        request = req.list_messages(
            session_id, after_sequence, page_size, page_token, order_by, before_sequence
        )
        return await self._call("ListMessages", request, retry=True)  # type: ignore[no-any-return]

    def iter_messages(
        self,
        session_id: str,
        *,
        after_sequence: int | None = None,
        page_size: int = 0,
        order_by: str = "",
        before_sequence: int | None = None,
    ) -> AsyncIterator[m.StoredMessage]:
        """Every stored message after ``after_sequence`` (and before
        ``before_sequence``), page after page, in ``order_by``'s order."""
        return self._pages(
            lambda token: self.list_messages(
                session_id,
                after_sequence=after_sequence,
                page_size=page_size,
                page_token=token,
                order_by=order_by,
                before_sequence=before_sequence,
            ),
            lambda page: page.messages,
        )

    async def list_provider_calls(
        self, session_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> s.ListProviderCallsResponse:
        """One page of recorded provider calls. Retried."""
        request = s.ListProviderCallsRequest(
            session_id=session_id, page_size=page_size, page_token=page_token
        )
        return await self._call("ListProviderCalls", request, retry=True)  # type: ignore[no-any-return]

    def iter_provider_calls(
        self, session_id: str, *, page_size: int = 0
    ) -> AsyncIterator[m.ProviderCall]:
        """Every recorded provider call, in the order recorded."""
        return self._pages(
            lambda token: self.list_provider_calls(
                session_id, page_size=page_size, page_token=token
            ),
            lambda page: page.provider_calls,
        )

    async def rollback_session(
        self,
        session_id: str,
        *,
        after_sequence: int | None = None,
        run_id: str = "",
        expected_next_sequence: int | None = None,
        return_removed: bool = False,
        remove_last: int = 0,
        request_id: str = "",
    ) -> s.RollbackSessionResponse:
        """Removes the messages after ``after_sequence`` (-1: all), or the
        session's last ``remove_last`` messages (all if it has fewer): give
        one of the two. With ``return_removed`` the response holds the
        removed messages, so ``remove_last=1, return_removed=True`` pops the
        last message in one call, with no read first. With a ``request_id``
        the call is retried on transient failures, a retry answering what
        the first call removed; without one it is not."""
        request = req.rollback_session(
            session_id,
            after_sequence,
            run_id,
            expected_next_sequence,
            return_removed,
            remove_last,
            request_id,
        )
        return await self._call(  # type: ignore[no-any-return]
            "RollbackSession", request, retry=bool(request_id)
        )

    async def edit_message(
        self,
        session_id: str,
        *,
        message_id: str,
        message: MessageLike,
        reason: str = "",
        run_id: str = "",
    ) -> s.EditMessageResponse:
        """Gives a message new content (the event history keeps the old). Not retried."""
        request = req.edit_message(session_id, message_id, message, reason, run_id)
        return await self._call("EditMessage", request, retry=False)  # type: ignore[no-any-return]

    async def redact_message(
        self, session_id: str, *, message_id: str, reason: str = "", run_id: str = ""
    ) -> s.RedactMessageResponse:
        """Erases a message's content from current reads, the event history
        and search. Not retried."""
        request = s.RedactMessageRequest(
            session_id=session_id, message_id=message_id, reason=reason, run_id=run_id
        )
        return await self._call("RedactMessage", request, retry=False)  # type: ignore[no-any-return]

    async def export_transcript(
        self,
        session_id: str,
        *,
        format: TranscriptFormatLike = "markdown",
        provider: str = "",
        model: str = "",
        reasoning: ReasoningPolicyLike = "same_model",
    ) -> str:
        """The session as a Markdown transcript (``"markdown"``), an OpenAI
        Chat Completions JSON message array (``"openai_json"``), or a request
        body for a provider's API (``"anthropic_messages"``,
        ``"openai_responses"``, ``"gemini_contents"``: a JSON object).

        With ``provider`` (and ``model``), rendered for that model as
        :meth:`export_for` selects; the provider bodies otherwise follow their
        own provider's rules. Opening is retried."""
        request = req.export_transcript(session_id, format, provider, model, reasoning)
        data = b"".join([chunk.data async for chunk in self._stream("ExportTranscript", request)])
        return data.decode("utf-8")

    async def search_messages(
        self, query: str, *, user: str = "", page_size: int = 0, page_token: str = ""
    ) -> s.SearchMessagesResponse:
        """One page of full-text hits over the caller's sessions. Retried."""
        request = s.SearchMessagesRequest(
            query=query, user=user, page_size=page_size, page_token=page_token
        )
        return await self._call("SearchMessages", request, retry=True)  # type: ignore[no-any-return]

    def iter_search(
        self, query: str, *, user: str = "", page_size: int = 0
    ) -> AsyncIterator[m.SearchHit]:
        """Every hit of ``query``, best first, page after page."""
        return self._pages(
            lambda token: self.search_messages(
                query, user=user, page_size=page_size, page_token=token
            ),
            lambda page: page.hits,
        )

    # -- usage -------------------------------------------------------------

    async def summarize_usage(
        self,
        *,
        group_by: UsageGroupByLike = None,
        user: str = "",
        session_id: str = "",
        start_time: TimeLike | None = None,
        end_time: TimeLike | None = None,
        page_size: int = 0,
        page_token: str = "",
    ) -> s.SummarizeUsageResponse:
        """One page of sums of the tenant's recorded provider calls (calls,
        every token bucket, cost), ordered by key.

        ``group_by`` is ``None`` for one total row, or ``"session"``,
        ``"user"``, ``"model"`` (key ``provider/model``) or ``"day"`` (UTC,
        ``YYYY-MM-DD``). Only calls of ``user``'s sessions or of
        ``session_id`` when given, recorded at or after ``start_time`` and
        before ``end_time`` (``datetime``, naive ones taken as UTC, or
        ``Timestamp``). Retried. See :meth:`iter_usage` for every page."""
        request = req.summarize_usage(
            group_by, user, session_id, start_time, end_time, page_size, page_token
        )
        return await self._call("SummarizeUsage", request, retry=True)  # type: ignore[no-any-return]

    def iter_usage(
        self,
        *,
        group_by: UsageGroupByLike = None,
        user: str = "",
        session_id: str = "",
        start_time: TimeLike | None = None,
        end_time: TimeLike | None = None,
        page_size: int = 0,
    ) -> AsyncIterator[s.UsageRow]:
        """Every row of :meth:`summarize_usage`, by key, page after page."""
        return self._pages(
            lambda token: self.summarize_usage(
                group_by=group_by,
                user=user,
                session_id=session_id,
                start_time=start_time,
                end_time=end_time,
                page_size=page_size,
                page_token=token,
            ),
            lambda page: page.rows,
        )

    # -- runs --------------------------------------------------------------

    async def begin_run(self, session_id: str, *, run_id: str, lease: LeaseLike) -> s.BeginRunResponse:
        """Takes (or renews) the session's lease for ``run_id`` for ``lease``
        seconds (or a ``timedelta``). Retried (a renewal is harmless)."""
        request = req.begin_run(session_id, run_id, lease)
        return await self._call("BeginRun", request, retry=True)  # type: ignore[no-any-return]

    async def end_run(
        self, session_id: str, *, run_id: str, take_next: bool = False
    ) -> s.EndRunResponse:
        """Frees the session from ``run_id``'s lease. Retried.

        With ``take_next``, if ``run_id`` holds the lease, first takes the
        session's oldest waiting input into the history (``input_taken``,
        then ``run_ended``, in one transaction); the response's
        ``taken_input`` is that input (unset if none waited). Then not
        retried: a repeat of a call whose answer was lost finds the lease
        freed and answers no input although the first call took one; after
        a transient error, read the history to learn whether it did."""
        request = s.EndRunRequest(session_id=session_id, run_id=run_id, take_next=take_next)
        return await self._call(  # type: ignore[no-any-return]
            "EndRun", request, retry=not take_next
        )

    async def publish_delta(
        self,
        session_id: str,
        *,
        run_id: str,
        index: int,
        text: str | None = None,
        block: ContentBlockLike | None = None,
    ) -> s.PublishDeltaResponse:
        """Sends a run's partial output (``text`` or a content ``block``) to
        watchers; never stored. Retried (watchers drop a repeated index)."""
        request = req.publish_delta(session_id, run_id, index, text, block)
        return await self._call("PublishDelta", request, retry=True)  # type: ignore[no-any-return]

    async def cancel_run(
        self, session_id: str, *, run_id: str, reason: str = ""
    ) -> s.CancelRunResponse:
        """Asks an active run to stop, from any client: watchers get
        ``run_cancel_requested`` and the producer's next ``publish_delta``
        answers ``cancel_requested``. Answers the cancel's revision (the
        first cancel's, for a run cancelled before; nothing is written
        again). ``FailedPrecondition`` (reason ``RUN_NOT_ACTIVE``) for a run
        that is not active. Retried (a repeat answers the same revision)."""
        request = s.CancelRunRequest(session_id=session_id, run_id=run_id, reason=reason)
        return await self._call("CancelRun", request, retry=True)  # type: ignore[no-any-return]

    async def discard_run(self, session_id: str, *, run_id: str) -> s.DiscardRunResponse:
        """Tells watchers to drop a run's partial output. Retried."""
        request = s.DiscardRunRequest(session_id=session_id, run_id=run_id)
        return await self._call("DiscardRun", request, retry=True)  # type: ignore[no-any-return]

    # -- approvals ---------------------------------------------------------

    async def request_approval(
        self,
        session_id: str,
        *,
        tool_call_id: str,
        title: str = "",
        detail_json: DetailLike = "",
        run_id: str = "",
        expire_time: TimeLike | None = None,
    ) -> s.RequestApprovalResponse:
        """Asks for a decision on a tool call of the session's current
        history (an OpenAI-style ``ToolCall.id`` or a ``tool_use`` block id)
        before it runs: a pending approval, one revision (watchers get
        ``approval_requested``). Answers the approval (its ``approval_id``
        is ``apr_…``) and the revision.

        ``title`` (at most 1,024 bytes) and ``detail_json`` (JSON text kept
        verbatim, or a dict to encode; at most 65,536 bytes) are what the
        decider is shown. ``run_id`` is needed while that run holds the
        lease (``SessionBusy`` while another does). ``expire_time`` (a
        ``datetime``, naive ones taken as UTC, or a ``Timestamp``; in the
        future) expires it unless decided by then.

        ``UnknownToolCall`` if no message makes the call,
        ``ToolCallAnswered`` if one answers it, ``ApprovalExists`` (with its
        ``approval_id``) while the call has a pending or approved approval.
        Not retried: a repeat of a request that reached the server would
        fail ``ApprovalExists``."""
        request = req.request_approval(
            session_id, tool_call_id, title, detail_json, run_id, expire_time
        )
        return await self._call("RequestApproval", request, retry=False)  # type: ignore[no-any-return]

    async def decide_approval(
        self,
        session_id: str,
        *,
        approval_id: str,
        decision: ApprovalDecisionLike,
        reason: str = "",
        decided_by: str = "",
        request_id: str | None = None,
    ) -> s.DecideApprovalResponse:
        """Approves or denies a pending approval (``decision``: ``"approve"``,
        ``"deny"`` or the ``v1.ApprovalDecision`` value), exactly once across
        clients and replicas: one revision (``approval_decided``). A denial
        also stores the call's tool result, a tool error whose content is
        ``reason``, in that revision (the response's ``tool_result``).
        ``decided_by`` is free-form, for the record.

        Retried: every attempt carries ``request_id`` (a fresh UUID when not
        given), and a retry of a recorded decision answers it. Any other
        call on a decided approval raises ``ApprovalAlreadyDecided`` (with
        its ``state`` and ``decided_by``), on an expired one
        ``ApprovalExpired``; an unknown id is ``ApprovalNotFound``."""
        request = req.decide_approval(
            session_id, approval_id, decision, reason, decided_by, request_id
        )
        return await self._call(  # type: ignore[no-any-return]
            "DecideApproval", request, retry=bool(request.request_id)
        )

    async def get_approval(self, session_id: str, *, approval_id: str) -> m.Approval:
        """One approval of the session (``ApprovalNotFound`` if none by that
        id); one past its ``expire_time`` reads as expired. Retried."""
        request = s.GetApprovalRequest(session_id=session_id, approval_id=approval_id)
        return await self._call("GetApproval", request, retry=True)  # type: ignore[no-any-return]

    async def list_approvals(
        self,
        *,
        session_id: str = "",
        user: str = "",
        state: ApprovalStateLike = None,
        page_size: int = 0,
        page_token: str = "",
    ) -> s.ListApprovalsResponse:
        """One page of the tenant's approvals, oldest first: only
        ``session_id``'s, only those of ``user``'s sessions, only those in
        ``state`` (``"pending"``, ``"approved"``, ``"denied"``,
        ``"expired"`` or the ``v1.ApprovalState`` value; ``None``: any) when
        given. Retried. See :meth:`iter_approvals` for every page."""
        request = req.list_approvals(session_id, user, state, page_size, page_token)
        return await self._call("ListApprovals", request, retry=True)  # type: ignore[no-any-return]

    def iter_approvals(
        self,
        *,
        session_id: str = "",
        user: str = "",
        state: ApprovalStateLike = None,
        page_size: int = 0,
    ) -> AsyncIterator[m.Approval]:
        """Every matching approval, oldest first, page after page."""
        return self._pages(
            lambda token: self.list_approvals(
                session_id=session_id,
                user=user,
                state=state,
                page_size=page_size,
                page_token=token,
            ),
            lambda page: page.approvals,
        )

    # -- queued input ------------------------------------------------------

    async def submit_input(
        self,
        session_id: str,
        messages: Iterable[MessageLike],
        *,
        mode: InputModeLike = "queue",
        request_id: str | None = None,
    ) -> s.SubmitInputResponse:
        """Submits input (1 to 100 messages, typically one user message) to a
        session that may be busy: a run holds its lease, or its queue holds
        a waiting input. Not busy, the messages are appended at once, in
        every mode (``queued`` false, the stored ``messages`` in the
        response). Busy, ``mode`` decides: ``"queue"`` (the default) puts
        the input at the back of the session's queue (``queued`` true, the
        ``input`` with its ``input_id``, ``inp_…``, and its ``position``;
        watchers get ``input_queued``), ``"interrupt"`` does the same and
        asks the run holding the lease to stop as :meth:`cancel_run` would,
        ``"reject"`` raises ``SessionBusy``. Queued input is in no read of
        the history until the run takes it (:meth:`take_queued_input`, or
        :meth:`end_run` with ``take_next``).

        Retried: every attempt carries ``request_id`` (a fresh UUID when not
        given), and a retry of a recorded submission answers it, also after
        the input was taken or withdrawn; the same ``request_id`` with other
        messages or another mode raises ``RequestIdReused``. ``QueueFull``
        (``.limit``) while 100 inputs wait."""
        request = req.submit_input(session_id, messages, mode, request_id)
        return await self._call(  # type: ignore[no-any-return]
            "SubmitInput", request, retry=bool(request.request_id)
        )

    async def take_queued_input(
        self, session_id: str, *, run_id: str
    ) -> s.TakeQueuedInputResponse:
        """Takes the session's oldest waiting input into the history for
        ``run_id``, which must hold the session's lease (``LeaseNotHeld``
        otherwise): its messages are appended, contiguous and in order, in
        one revision (``input_taken``), and are in the response's
        ``messages``. ``QueueEmpty`` when no input waits. Each input is taken
        once, across clients and replicas. Not retried: a repeat of a take
        that reached the server would take the next input."""
        request = s.TakeQueuedInputRequest(session_id=session_id, run_id=run_id)
        return await self._call("TakeQueuedInput", request, retry=False)  # type: ignore[no-any-return]

    async def list_queued_inputs(
        self, session_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> s.ListQueuedInputsResponse:
        """One page of the inputs waiting in the session's queue, by
        position (the next to be taken first). Retried. See
        :meth:`iter_queued_inputs` for every page."""
        request = s.ListQueuedInputsRequest(
            session_id=session_id, page_size=page_size, page_token=page_token
        )
        return await self._call("ListQueuedInputs", request, retry=True)  # type: ignore[no-any-return]

    def iter_queued_inputs(
        self, session_id: str, *, page_size: int = 0
    ) -> AsyncIterator[m.QueuedInput]:
        """Every input waiting in the session's queue, by position, page after page."""
        return self._pages(
            lambda token: self.list_queued_inputs(
                session_id, page_size=page_size, page_token=token
            ),
            lambda page: page.inputs,
        )

    async def withdraw_queued_input(
        self, session_id: str, *, input_id: str
    ) -> s.WithdrawQueuedInputResponse:
        """Takes a waiting input back: it is never taken into the history
        (``input_withdrawn``). Answers the withdrawal's revision: the first
        one's for an input withdrawn before (nothing is written again), so
        it is retried. ``InputAlreadyTaken`` once the run took it,
        ``InputNotFound`` for an id the session never queued."""
        request = s.WithdrawQueuedInputRequest(session_id=session_id, input_id=input_id)
        return await self._call("WithdrawQueuedInput", request, retry=True)  # type: ignore[no-any-return]

    # -- state -------------------------------------------------------------

    async def set_state(
        self,
        session_id: str = "",
        *,
        key: str,
        value: str,
        expected_version: int | None = None,
        scope: str = "",
    ) -> m.StateEntry:
        """Sets a state entry: the session's own, or with ``scope`` (and no
        ``session_id``) a shared one of the tenant. ``expected_version`` 0
        means "must not exist"; a mismatch is ``StateVersionMismatch``.
        Retried only without ``expected_version``."""
        request = req.set_state(session_id, key, value, expected_version, scope)
        return await self._call(  # type: ignore[no-any-return]
            "SetState", request, retry=expected_version is None
        )

    async def get_state(self, session_id: str = "", *, key: str, scope: str = "") -> m.StateEntry:
        """A state entry (``StateNotFound`` if none). Retried."""
        request = s.GetStateRequest(session_id=session_id, key=key, scope=scope)
        return await self._call("GetState", request, retry=True)  # type: ignore[no-any-return]

    async def list_state(
        self, session_id: str = "", *, page_size: int = 0, page_token: str = "", scope: str = ""
    ) -> s.ListStateResponse:
        """One page of state entries, by key. Retried."""
        request = s.ListStateRequest(
            session_id=session_id, page_size=page_size, page_token=page_token, scope=scope
        )
        return await self._call("ListState", request, retry=True)  # type: ignore[no-any-return]

    def iter_state(
        self, session_id: str = "", *, page_size: int = 0, scope: str = ""
    ) -> AsyncIterator[m.StateEntry]:
        """Every state entry, by key, page after page."""
        return self._pages(
            lambda token: self.list_state(
                session_id, page_size=page_size, page_token=token, scope=scope
            ),
            lambda page: page.entries,
        )

    async def delete_state(
        self,
        session_id: str = "",
        *,
        key: str,
        expected_version: int | None = None,
        scope: str = "",
    ) -> s.DeleteStateResponse:
        """Deletes a state entry. Not retried."""
        request = req.delete_state(session_id, key, expected_version, scope)
        return await self._call("DeleteState", request, retry=False)  # type: ignore[no-any-return]

    # -- watch -------------------------------------------------------------

    def watch(
        self, session_id: str, after_revision: int = 0, include_active_deltas: bool = False
    ) -> AsyncSessionEvents:
        """The session's events after ``after_revision`` (0: from creation),
        as an async iterator that reconnects and resumes by itself: see
        :meth:`sessionstore.Client.watch`."""
        return AsyncSessionEvents(
            self._loop_stub,
            self._metadata,
            session_id,
            after_revision,
            include_active_deltas,
            self._watch_retry,
        )


class AsyncSessionEvents(AsyncIterator[m.SessionEvent]):
    """The events of one session, from :meth:`AsyncClient.watch`: an async
    iterator of ``v1.SessionEvent`` that reconnects and resumes by itself,
    delivering every revision once, in order.

    ``last_revision`` is the latest revision yielded; ``reconnects`` counts
    resumptions; :meth:`close` (or leaving an ``async with`` block) cancels
    the stream. Read on in another event loop (a later ``asyncio.run``), it
    resumes there after ``last_revision``.
    """

    def __init__(
        self,
        stub: Callable[[], SessionStoreStub],
        metadata: tuple[tuple[str, str], ...],
        session_id: str,
        after_revision: int,
        include_active_deltas: bool,
        retry: RetryPolicy,
    ) -> None:
        self._stub = stub
        self._metadata = metadata
        self._session_id = session_id
        self._include_active_deltas = include_active_deltas
        self._retry = retry
        self._state = WatchState(after_revision)
        self._call: Any = None
        self._call_loop: asyncio.AbstractEventLoop | None = None
        self._fresh = False
        self._wait: float | None = None
        self._closed = False

    @property
    def last_revision(self) -> int:
        """The latest revision yielded (the ``after_revision`` given at first)."""
        return self._state.last_revision

    @property
    def reconnects(self) -> int:
        """How many times the stream has reconnected and resumed."""
        return self._state.reconnects

    def close(self) -> None:
        """Cancels the stream; iteration then stops."""
        self._closed = True
        self._drop_call()

    async def __aenter__(self) -> AsyncSessionEvents:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __aiter__(self) -> AsyncSessionEvents:
        return self

    async def __anext__(self) -> m.SessionEvent:
        state = self._state
        loop = asyncio.get_running_loop()
        while True:
            if state.done or self._closed:
                raise StopAsyncIteration
            if self._call is not None and self._call_loop is not loop:
                # Read before in another event loop: resume in this one.
                self._drop_call()
            if self._call is None:
                if self._wait is not None:
                    await asyncio.sleep(self._wait)
                    self._wait = None
                    if self._closed:
                        raise StopAsyncIteration
                request = state.request(self._session_id, self._include_active_deltas)
                self._call = self._stub().WatchSession(request, metadata=self._metadata)
                self._call_loop = loop
                self._fresh = True
            try:
                event = await self._call.read()
            except grpc.RpcError as rpc_error:
                self._drop_call()
                if self._closed:
                    raise StopAsyncIteration from None
                self._failed(from_rpc_error(rpc_error), rpc_error)
                continue
            except asyncio.CancelledError:
                if self._closed:
                    raise StopAsyncIteration from None
                raise
            if event is grpc.aio.EOF:
                self._drop_call()
                if self._closed:
                    raise StopAsyncIteration
                self._failed(ended_early())
                continue
            if self._fresh:
                self._fresh = False
                if state.opened:
                    state.reconnects += 1
                state.opened = True
            state.failures = 0
            if state.admit(event):
                return event  # type: ignore[no-any-return]

    def _drop_call(self) -> None:
        call, loop = self._call, self._call_loop
        self._call = self._call_loop = None
        # A call of a closed loop is over already (and cannot be cancelled).
        if call is not None and loop is not None and not loop.is_closed():
            call.cancel()

    def _failed(self, error: SessionstoreError, cause: BaseException | None = None) -> None:
        """Raises ``error`` if the watch gives up; else schedules a reconnection."""
        state = self._state
        state.failures += 1
        if not resumable(error) or state.failures >= max(self._retry.max_attempts, 1):
            state.done = True
            raise error from cause
        self._wait = self._retry.delay_after(error, state.failures)
        log_retry("WatchSession", error, state.failures, self._wait)
