"""The blocking client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Callable, TypeVar

import grpc

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

__all__ = ["Client", "SessionEvents"]

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:50051"


class Client:
    """A blocking client of a sessionstore server.

    Every method takes keyword arguments and returns the generated protobuf
    messages (``sessionstore.v1``). Failures raise ``SessionstoreError``
    subclasses. Calls marked *retried* are repeated on ``UNAVAILABLE`` and on
    ``RESOURCE_EXHAUSTED``/``RATE_LIMITED`` under ``retry_policy``, waiting as
    long as the server's ``RetryInfo`` asks; ``append_exchange`` is among them
    because it always carries an idempotency key.

    The client is thread-safe; use it as a context manager or call
    :meth:`close`.

    Args:
        url: ``http://HOST:PORT``, or ``https://HOST:PORT`` for TLS.
        token: A bearer token, sent as ``authorization: Bearer TOKEN`` on every
            call (servers started with ``--auth-tokens``).
        tls_ca_certificate: The CA to trust for ``https://`` (a path, or the
            PEM as bytes); the system's roots if ``None``.
        tls_client_certificate: For mutual TLS: the client's certificate
            chain (path or PEM), with ``tls_client_key``.
        tls_client_key: For mutual TLS: the client's private key (path or PEM).
        tls_domain_name: The name to verify the server's certificate against,
            if not the URL's host.
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
        options = _transport.channel_options(tls_domain_name)
        self.url = url
        self._metadata = _transport.call_metadata(token)
        if target.secure:
            creds = _transport.credentials(
                tls_ca_certificate, tls_client_certificate, tls_client_key
            )
            self._channel = grpc.secure_channel(target.address, creds, options=options)
        else:
            if tls_ca_certificate is not None or tls_client_certificate is not None:
                raise ValueError("TLS settings need an https:// URL")
            self._channel = grpc.insecure_channel(target.address, options=options)
        self._stub = SessionStoreStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout = request_timeout
        self._retry = retry_policy
        self._watch_retry = watch_retry_policy

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- plumbing ----------------------------------------------------------

    def _call(self, name: str, request: Any, *, retry: bool) -> Any:
        method: Callable[..., Any] = getattr(self._stub, name)
        attempt = 1
        while True:
            try:
                return method(request, timeout=self._timeout, metadata=self._metadata)
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                if not (retry and self._retry.should_retry(error, attempt)):
                    raise error from rpc_error
            delay = self._retry.delay_after(error, attempt)
            log_retry(name, error, attempt, delay)
            time.sleep(delay)
            attempt += 1

    def _stream(self, name: str, request: Any) -> Iterator[Any]:
        """The responses of a server stream. Opening it is retried until the
        first response arrives; a failure after that ends the iteration."""
        method: Callable[..., Any] = getattr(self._stub, name)
        attempt = 1
        while True:
            call = method(request, metadata=self._metadata)
            received = False
            try:
                for response in call:
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
            time.sleep(delay)
            attempt += 1

    @staticmethod
    def _pages(
        fetch: Callable[[str], Any], items: Callable[[Any], Iterable[T]]
    ) -> Iterator[T]:
        token = ""
        while True:
            page = fetch(token)
            yield from items(page)
            token = page.next_page_token
            if not token:
                return

    # -- health ------------------------------------------------------------

    def health_check(
        self, service: str = "", *, wait_for_ready: bool = False, timeout: float | None = None
    ) -> bool:
        """Whether the server's ``grpc.health.v1`` service reports ``SERVING``
        for ``service`` (``""``: the server; ``"sessionstore.v1.SessionStore"``).

        With ``wait_for_ready`` the call waits (up to ``timeout``) for the
        server to accept connections instead of failing at once.
        """
        check = self._channel.unary_unary(_transport.HEALTH_CHECK)
        try:
            data = check(
                _transport.encode_health_request(service),
                timeout=timeout if timeout is not None else self._timeout,
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as rpc_error:
            raise from_rpc_error(rpc_error) from rpc_error
        return _transport.decode_health_status(data) == 1

    # -- sessions ----------------------------------------------------------

    def create_session(
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
        return self._call(  # type: ignore[no-any-return]
            "CreateSession", request, retry=bool(request_id)
        )

    def get_session(self, session_id: str, *, state_scopes: Iterable[str] = ()) -> m.Session:
        """The session's fields and revision (``SessionNotFound`` if none).
        ``state_scopes`` (``""`` for the session's own state, or shared
        scopes such as ``app:weather``) fills ``Session.state`` with their
        entries, read with the session in one snapshot. Retried."""
        request = req.get_session(session_id, state_scopes)
        return self._call("GetSession", request, retry=True)  # type: ignore[no-any-return]

    def list_sessions(
        self, *, user: str = "", filter: str = "", page_size: int = 0, page_token: str = ""
    ) -> s.ListSessionsResponse:
        """One page of session summaries, newest update first. ``filter`` is
        the AIP-160 subset the server takes (``metadata.app = "x" AND user =
        "alice"``). Retried. See :meth:`iter_sessions` for every page."""
        request = s.ListSessionsRequest(
            user=user, filter=filter, page_size=page_size, page_token=page_token
        )
        return self._call("ListSessions", request, retry=True)  # type: ignore[no-any-return]

    def iter_sessions(
        self, *, user: str = "", filter: str = "", page_size: int = 0
    ) -> Iterator[m.SessionSummary]:
        """Every matching session's summary, fetching pages as it is read."""
        return self._pages(
            lambda token: self.list_sessions(
                user=user, filter=filter, page_size=page_size, page_token=token
            ),
            lambda page: page.sessions,
        )

    def update_session(
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
        return self._call("UpdateSession", request, retry=True)  # type: ignore[no-any-return]

    def delete_session(self, session_id: str) -> s.DeleteSessionResponse:
        """Deletes the session with its messages, provider calls and state;
        watchers get ``session_deleted``. Not retried."""
        request = s.DeleteSessionRequest(session_id=session_id)
        return self._call("DeleteSession", request, retry=False)  # type: ignore[no-any-return]

    def erase_user(
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
        return self._call("EraseUser", request, retry=True)  # type: ignore[no-any-return]

    def fork_session(
        self, session_id: str, *, at_sequence: int, new_session_id: str = ""
    ) -> m.Session:
        """A new session holding the history up to ``at_sequence`` (-1: none).
        Not retried."""
        request = s.ForkSessionRequest(
            session_id=session_id, at_sequence=at_sequence, new_session_id=new_session_id
        )
        return self._call("ForkSession", request, retry=False)  # type: ignore[no-any-return]

    # -- messages ----------------------------------------------------------

    def append_exchange(
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
        return self._call("AppendExchange", request, retry=True)  # type: ignore[no-any-return]

    def iter_history(
        self,
        session_id: str,
        *,
        include_system_prompt: bool = False,
        from_summary: bool = False,
        after_sequence: int | None = None,
        max_messages: int = 0,
    ) -> Iterator[m.Message]:
        """The session's messages in sequence order, streamed in bounded
        memory. Opening the export is retried; a failure mid-stream raises."""
        request = req.export_history(
            session_id, include_system_prompt, from_summary, after_sequence, max_messages
        )
        for chunk in self._stream("ExportHistory", request):
            yield from chunk.messages

    def export_history(
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
        return list(
            self.iter_history(
                session_id,
                include_system_prompt=include_system_prompt,
                from_summary=from_summary,
                after_sequence=after_sequence,
                max_messages=max_messages,
            )
        )

    def export_for(
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
        return [message for chunk in self._stream("ExportHistory", request) for message in chunk.messages]

    def list_messages(
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
        return self._call("ListMessages", request, retry=True)  # type: ignore[no-any-return]

    def iter_messages(
        self,
        session_id: str,
        *,
        after_sequence: int | None = None,
        page_size: int = 0,
        order_by: str = "",
        before_sequence: int | None = None,
    ) -> Iterator[m.StoredMessage]:
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

    def list_provider_calls(
        self, session_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> s.ListProviderCallsResponse:
        """One page of recorded provider calls. Retried."""
        request = s.ListProviderCallsRequest(
            session_id=session_id, page_size=page_size, page_token=page_token
        )
        return self._call("ListProviderCalls", request, retry=True)  # type: ignore[no-any-return]

    def iter_provider_calls(
        self, session_id: str, *, page_size: int = 0
    ) -> Iterator[m.ProviderCall]:
        """Every recorded provider call, in the order recorded."""
        return self._pages(
            lambda token: self.list_provider_calls(
                session_id, page_size=page_size, page_token=token
            ),
            lambda page: page.provider_calls,
        )

    def rollback_session(
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
        return self._call(  # type: ignore[no-any-return]
            "RollbackSession", request, retry=bool(request_id)
        )

    def edit_message(
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
        return self._call("EditMessage", request, retry=False)  # type: ignore[no-any-return]

    def redact_message(
        self, session_id: str, *, message_id: str, reason: str = "", run_id: str = ""
    ) -> s.RedactMessageResponse:
        """Erases a message's content from current reads, the event history
        and search. Not retried."""
        request = s.RedactMessageRequest(
            session_id=session_id, message_id=message_id, reason=reason, run_id=run_id
        )
        return self._call("RedactMessage", request, retry=False)  # type: ignore[no-any-return]

    def export_transcript(
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
        data = b"".join(chunk.data for chunk in self._stream("ExportTranscript", request))
        return data.decode("utf-8")

    def search_messages(
        self, query: str, *, user: str = "", page_size: int = 0, page_token: str = ""
    ) -> s.SearchMessagesResponse:
        """One page of full-text hits over the caller's sessions. Retried."""
        request = s.SearchMessagesRequest(
            query=query, user=user, page_size=page_size, page_token=page_token
        )
        return self._call("SearchMessages", request, retry=True)  # type: ignore[no-any-return]

    def iter_search(
        self, query: str, *, user: str = "", page_size: int = 0
    ) -> Iterator[m.SearchHit]:
        """Every hit of ``query``, best first, page after page."""
        return self._pages(
            lambda token: self.search_messages(
                query, user=user, page_size=page_size, page_token=token
            ),
            lambda page: page.hits,
        )

    # -- usage -------------------------------------------------------------

    def summarize_usage(
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
        return self._call("SummarizeUsage", request, retry=True)  # type: ignore[no-any-return]

    def iter_usage(
        self,
        *,
        group_by: UsageGroupByLike = None,
        user: str = "",
        session_id: str = "",
        start_time: TimeLike | None = None,
        end_time: TimeLike | None = None,
        page_size: int = 0,
    ) -> Iterator[s.UsageRow]:
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

    def begin_run(self, session_id: str, *, run_id: str, lease: LeaseLike) -> s.BeginRunResponse:
        """Takes (or renews) the session's lease for ``run_id`` for ``lease``
        seconds (or a ``timedelta``). Retried (a renewal is harmless)."""
        request = req.begin_run(session_id, run_id, lease)
        return self._call("BeginRun", request, retry=True)  # type: ignore[no-any-return]

    def end_run(
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
        return self._call(  # type: ignore[no-any-return]
            "EndRun", request, retry=not take_next
        )

    def publish_delta(
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
        return self._call("PublishDelta", request, retry=True)  # type: ignore[no-any-return]

    def cancel_run(
        self, session_id: str, *, run_id: str, reason: str = ""
    ) -> s.CancelRunResponse:
        """Asks an active run to stop, from any client: watchers get
        ``run_cancel_requested`` and the producer's next ``publish_delta``
        answers ``cancel_requested``. Answers the cancel's revision (the
        first cancel's, for a run cancelled before; nothing is written
        again). ``FailedPrecondition`` (reason ``RUN_NOT_ACTIVE``) for a run
        that is not active. Retried (a repeat answers the same revision)."""
        request = s.CancelRunRequest(session_id=session_id, run_id=run_id, reason=reason)
        return self._call("CancelRun", request, retry=True)  # type: ignore[no-any-return]

    def discard_run(self, session_id: str, *, run_id: str) -> s.DiscardRunResponse:
        """Tells watchers to drop a run's partial output. Retried."""
        request = s.DiscardRunRequest(session_id=session_id, run_id=run_id)
        return self._call("DiscardRun", request, retry=True)  # type: ignore[no-any-return]

    # -- approvals ---------------------------------------------------------

    def request_approval(
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
        return self._call("RequestApproval", request, retry=False)  # type: ignore[no-any-return]

    def decide_approval(
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
        return self._call(  # type: ignore[no-any-return]
            "DecideApproval", request, retry=bool(request.request_id)
        )

    def get_approval(self, session_id: str, *, approval_id: str) -> m.Approval:
        """One approval of the session (``ApprovalNotFound`` if none by that
        id); one past its ``expire_time`` reads as expired. Retried."""
        request = s.GetApprovalRequest(session_id=session_id, approval_id=approval_id)
        return self._call("GetApproval", request, retry=True)  # type: ignore[no-any-return]

    def list_approvals(
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
        return self._call("ListApprovals", request, retry=True)  # type: ignore[no-any-return]

    def iter_approvals(
        self,
        *,
        session_id: str = "",
        user: str = "",
        state: ApprovalStateLike = None,
        page_size: int = 0,
    ) -> Iterator[m.Approval]:
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

    def submit_input(
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
        return self._call(  # type: ignore[no-any-return]
            "SubmitInput", request, retry=bool(request.request_id)
        )

    def take_queued_input(
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
        return self._call("TakeQueuedInput", request, retry=False)  # type: ignore[no-any-return]

    def list_queued_inputs(
        self, session_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> s.ListQueuedInputsResponse:
        """One page of the inputs waiting in the session's queue, by
        position (the next to be taken first). Retried. See
        :meth:`iter_queued_inputs` for every page."""
        request = s.ListQueuedInputsRequest(
            session_id=session_id, page_size=page_size, page_token=page_token
        )
        return self._call("ListQueuedInputs", request, retry=True)  # type: ignore[no-any-return]

    def iter_queued_inputs(
        self, session_id: str, *, page_size: int = 0
    ) -> Iterator[m.QueuedInput]:
        """Every input waiting in the session's queue, by position, page after page."""
        return self._pages(
            lambda token: self.list_queued_inputs(
                session_id, page_size=page_size, page_token=token
            ),
            lambda page: page.inputs,
        )

    def withdraw_queued_input(
        self, session_id: str, *, input_id: str
    ) -> s.WithdrawQueuedInputResponse:
        """Takes a waiting input back: it is never taken into the history
        (``input_withdrawn``). Answers the withdrawal's revision: the first
        one's for an input withdrawn before (nothing is written again), so
        it is retried. ``InputAlreadyTaken`` once the run took it,
        ``InputNotFound`` for an id the session never queued."""
        request = s.WithdrawQueuedInputRequest(session_id=session_id, input_id=input_id)
        return self._call("WithdrawQueuedInput", request, retry=True)  # type: ignore[no-any-return]

    # -- state -------------------------------------------------------------

    def set_state(
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
        return self._call(  # type: ignore[no-any-return]
            "SetState", request, retry=expected_version is None
        )

    def get_state(self, session_id: str = "", *, key: str, scope: str = "") -> m.StateEntry:
        """A state entry (``StateNotFound`` if none). Retried."""
        request = s.GetStateRequest(session_id=session_id, key=key, scope=scope)
        return self._call("GetState", request, retry=True)  # type: ignore[no-any-return]

    def list_state(
        self, session_id: str = "", *, page_size: int = 0, page_token: str = "", scope: str = ""
    ) -> s.ListStateResponse:
        """One page of state entries, by key. Retried."""
        request = s.ListStateRequest(
            session_id=session_id, page_size=page_size, page_token=page_token, scope=scope
        )
        return self._call("ListState", request, retry=True)  # type: ignore[no-any-return]

    def iter_state(
        self, session_id: str = "", *, page_size: int = 0, scope: str = ""
    ) -> Iterator[m.StateEntry]:
        """Every state entry, by key, page after page."""
        return self._pages(
            lambda token: self.list_state(
                session_id, page_size=page_size, page_token=token, scope=scope
            ),
            lambda page: page.entries,
        )

    def delete_state(
        self,
        session_id: str = "",
        *,
        key: str,
        expected_version: int | None = None,
        scope: str = "",
    ) -> s.DeleteStateResponse:
        """Deletes a state entry. Not retried."""
        request = req.delete_state(session_id, key, expected_version, scope)
        return self._call("DeleteState", request, retry=False)  # type: ignore[no-any-return]

    # -- watch -------------------------------------------------------------

    def watch(
        self, session_id: str, after_revision: int = 0, include_active_deltas: bool = False
    ) -> SessionEvents:
        """The session's events after ``after_revision`` (0: from creation):
        the replay, one ``caught_up``, then live events as they commit.

        The iterator survives the server: when the connection breaks or the
        server restarts or shuts down, it reconnects with backoff and resumes
        after the last revision it yielded, so every revision arrives once,
        in order; each open run's deltas resume after the last index yielded
        (``delta_cursors``), and a merged delta (``first_index < index``)
        reaching back before it is cut to its new part.
        ``session_deleted`` is the last event. A permanent error (e.g.
        ``SessionNotFound``), or more failed reconnections in a row than
        ``watch_retry_policy`` allows, is raised.
        """
        return SessionEvents(
            self._stub,
            self._metadata,
            session_id,
            after_revision,
            include_active_deltas,
            self._watch_retry,
        )


class SessionEvents(Iterator[m.SessionEvent]):
    """The events of one session, from :meth:`Client.watch`: an iterator of
    ``v1.SessionEvent`` that reconnects and resumes by itself.

    ``last_revision`` is the latest revision yielded (watch again from there
    to continue without gaps or repeats); ``reconnects`` counts resumptions.
    :meth:`close` (or leaving a ``with`` block) cancels the stream, also from
    another thread.
    """

    def __init__(
        self,
        stub: SessionStoreStub,
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
        self._wait: float | None = None
        self._fresh = False
        self._closed = threading.Event()
        self._lock = threading.Lock()

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
        self._closed.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def __enter__(self) -> SessionEvents:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> SessionEvents:
        return self

    def __next__(self) -> m.SessionEvent:
        state = self._state
        while True:
            if state.done or self._closed.is_set():
                raise StopIteration
            if self._call is None:
                if self._wait is not None and self._closed.wait(self._wait):
                    raise StopIteration
                self._wait = None
                with self._lock:
                    if self._closed.is_set():
                        raise StopIteration
                    request = state.request(self._session_id, self._include_active_deltas)
                    self._call = self._stub.WatchSession(request, metadata=self._metadata)
                    self._fresh = True
            try:
                event = next(self._call)
            except StopIteration:
                self._drop_call()
                self._failed(ended_early())
                continue
            except grpc.RpcError as rpc_error:
                self._drop_call()
                if self._closed.is_set():
                    raise StopIteration from None
                self._failed(from_rpc_error(rpc_error), rpc_error)
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
        with self._lock:
            if self._call is not None:
                self._call.cancel()
            self._call = None

    def _failed(self, error: SessionstoreError, cause: BaseException | None = None) -> None:
        """Raises ``error`` if the watch gives up; else schedules a reconnection."""
        state = self._state
        state.failures += 1
        if not resumable(error) or state.failures >= max(self._retry.max_attempts, 1):
            state.done = True
            raise error from cause
        self._wait = self._retry.delay_after(error, state.failures)
        log_retry("WatchSession", error, state.failures, self._wait)
