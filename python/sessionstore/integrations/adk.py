"""Google ADK session service backed by sessionstore.

:class:`SessionstoreSessionService` is a ``google.adk`` ``BaseSessionService``
that keeps nothing of its own: every session, event and state entry lives on
the sessionstore server, and it behaves like ADK's own services
(``InMemorySessionService``, ``DatabaseSessionService``)::

    from sessionstore import AsyncClient
    from sessionstore.integrations.adk import SessionstoreSessionService

    client = AsyncClient("http://127.0.0.1:50051")
    runner = Runner(agent=agent, app_name="weather",
                    session_service=SessionstoreSessionService(client=client))

How ADK maps onto sessionstore:

- **Sessions.** ADK keys a session by ``(app_name, user_id, session_id)``;
  the sessionstore session id is ``adk:<app>:<user>:<session>``, each part
  escaped so the mapping is reversible (ASCII letters, digits, ``_`` and
  ``-`` stay; every other UTF-8 byte becomes ``.`` and two lower-case hex
  digits, so ``.`` is ``.2e`` and ``:`` is ``.3a``). An id that would pass
  sessionstore's 128 bytes is ``adkh:`` and the SHA-256 of the three names
  instead. Either way the names are kept verbatim in the session's metadata
  (``adk_app``, ``adk_user``, ``adk_session_id``) and ``user`` is the ADK user,
  so listing is one filtered ``ListSessions``.
- **Events.** One event is one message: the whole ``Event`` as JSON
  (``Event.model_dump_json()``) in a ``json`` content block of type
  ``adk.event`` (read back with ``Event.model_validate_json``, so events
  round-trip exactly), beside native fields for other readers: role user or
  assistant, the text parts as ``content``, thoughts as thinking blocks,
  function calls as ``tool_calls`` and function responses as ``tool_result``
  blocks. Messages without that block (written by something else) are
  skipped on read.
- **Which model said it.** An event a model produced (``model_version``
  set, author not ``user``) is stored as the response of a provider call of
  that model (provider by the model's name, Google unless it says otherwise,
  see :func:`event_origin`), with the event's ``usage_metadata`` as its
  token counts (Gemini's thoughts count as output and as reasoning), so
  SummarizeUsage and ListProviderCalls see it. Thought signatures are stored
  natively: on thinking blocks, on tool calls, and, when a text part has
  one, on text blocks (one per text part).
- **Switching models.** Give the service the model the next turns go to
  (``SessionstoreSessionService(client=..., model="gemini-3-pro")``;
  ``provider="google"`` by default, ``reasoning="same_model"``) and
  ``get_session`` reads an export for that target (``ExportHistory`` with
  ``ExportTarget``): thoughts and thought signatures of other models are
  taken off the events, and a function call without its response (or a
  response without its call) is taken out, except the last answer's pending
  calls; an event left with no parts and no actions is skipped
  (:func:`fit_to_export`). ``num_recent_events`` windows that export.
  Nothing stored changes.
- **State.** A session's own keys are the session's state; ``app:`` keys live
  in the shared scope ``adk.app:<app>`` and ``user:`` keys in
  ``adk.user:<app>:<user>`` (escaped as above; past 256 bytes
  ``adk.apph:``/``adk.userh:`` and a SHA-256), stored without their prefix as
  ADK's own services do; ``temp:`` keys are never stored. Values are JSON
  text, so they read back as JSON data (like ``DatabaseSessionService``). ADK
  never deletes a state key (``None`` is a value), so neither does this.
- **Writes.** ``append_event`` is one ``AppendExchange``: the event's message
  and its state changes (session, ``app:`` and ``user:`` keys) in one
  revision, with ``expected_next_sequence`` as the stale-session check and a
  ``request_id`` derived from the request, so a retry after an unknown outcome
  is stored once. ``create_session`` is one ``CreateSession`` (with the
  session's keys as ``initial_state``), plus one ``SetState`` per ``app:`` or
  ``user:`` key given, sent together once the session exists (sessionstore
  has no way to write shared scopes in the ``CreateSession`` itself, and an
  ``AppendExchange``, which could, needs a message), and one ``ListState``
  each of the app's and the user's scope for the merged state it returns:
  5 RPCs with one ``app:`` and one ``user:`` key, 3 with none.
- **Reads.** ``get_session`` is one newest-first ``ListMessages`` page
  (more only for long histories read whole), which gives the events and
  the stale check's next sequence, and one ``ListState`` each of the
  session's own state, the app's and the user's, all at once: 4 RPCs. A
  session with no event yet adds a ``GetSession`` (its creation time is
  its ``last_update_time``), and so does a service with ``model`` (its
  export carries no sequences).
- **Times.** ``last_update_time`` is the timestamp of the newest stored event
  (the session's creation time before the first), as ADK's services report.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import uuid
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Optional, TypeVar

from .. import v1
from .._errors import AlreadyExists, SequenceMismatch, SessionNotFound
from .._requests import ReasoningPolicyLike
from ..aio import AsyncClient
from ._models import checked_provider, has_reasoning, provider_of_model

try:
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "sessionstore.integrations.adk needs google-adk: "
        'pip install "sessionstore-client[adk]"'
    ) from exc

try:
    from google.adk.errors import StaleSessionError
except ImportError:  # google-adk before 2.7 (whose services raise ValueError)

    class StaleSessionError(ValueError):  # type: ignore[no-redef]
        """A session write lost an optimistic concurrency race."""


__all__ = [
    "EVENT_BLOCK_TYPE",
    "SessionstoreSessionService",
    "StaleSessionError",
    "event_message",
    "event_origin",
    "fit_to_export",
    "parse_session_store_id",
    "session_store_id",
    "stored_event",
]

T = TypeVar("T")

#: The ``JsonBlock.type`` of the block holding an event's JSON.
EVENT_BLOCK_TYPE = "adk.event"

_MAX_ID = 128
_MAX_SCOPE = 256
_PAGE = 1000  # the server's longest page
_CONCURRENCY = 16
_PLAIN = re.compile(r"[A-Za-z0-9_-]")
_STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)


# -- names -------------------------------------------------------------------


def _escape(name: str) -> str:
    """``name`` in ``[A-Za-z0-9_.-]``: other UTF-8 bytes (and ``.``) become
    ``.`` and two lower-case hex digits. Reversible by :func:`_unescape`."""
    out = []
    for char in name:
        if _PLAIN.fullmatch(char):
            out.append(char)
        else:
            out.extend(f".{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(out)


def _unescape(text: str) -> str:
    """The inverse of :func:`_escape`."""
    data = bytearray()
    i = 0
    while i < len(text):
        if text[i] == ".":
            data.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            data.extend(text[i].encode("ascii"))
            i += 1
    return data.decode("utf-8")


def _digest(*names: str) -> str:
    return hashlib.sha256(json.dumps(list(names)).encode("utf-8")).hexdigest()


def session_store_id(app_name: str, user_id: str, session_id: str) -> str:
    """The sessionstore session id of an ADK session: ``adk:APP:USER:SESSION``
    with each part escaped, or ``adkh:`` and a SHA-256 of the three names
    when that would pass 128 bytes."""
    plain = f"adk:{_escape(app_name)}:{_escape(user_id)}:{_escape(session_id)}"
    if len(plain) <= _MAX_ID:
        return plain
    return "adkh:" + _digest(app_name, user_id, session_id)


def parse_session_store_id(store_id: str) -> tuple[str, str, str] | None:
    """``(app_name, user_id, session_id)`` of an ``adk:`` id; ``None`` for a
    digest id (its names are in the session's metadata) or any other id."""
    parts = store_id.split(":")
    if len(parts) != 4 or parts[0] != "adk":
        return None
    return _unescape(parts[1]), _unescape(parts[2]), _unescape(parts[3])


def _app_scope(app_name: str) -> str:
    scope = "adk.app:" + _escape(app_name)
    return scope if len(scope) <= _MAX_SCOPE else "adk.apph:" + _digest(app_name)


def _user_scope(app_name: str, user_id: str) -> str:
    scope = f"adk.user:{_escape(app_name)}:{_escape(user_id)}"
    if len(scope) <= _MAX_SCOPE:
        return scope
    return "adk.userh:" + _digest(app_name, user_id)


def _quote(value: str) -> str:
    """A ``ListSessions`` filter value: double-quoted, ``\\`` and ``"`` escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- values ------------------------------------------------------------------


def _dump_value(value: Any) -> str:
    """A state value as JSON text (JSON-safe like ADK's database services:
    what has no JSON form is written as its ``str``)."""
    return json.dumps(
        to_jsonable_python(value, fallback=str), ensure_ascii=False, allow_nan=True
    )


def _load_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # an entry some other writer set as plain text


def _split_state(state: Mapping[str, Any] | None) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """The session's own, ``app:`` and ``user:`` entries of ``state`` (the
    last two without their prefix), as JSON text; ``temp:`` keys dropped."""
    own: dict[str, str] = {}
    app: dict[str, str] = {}
    user: dict[str, str] = {}
    for key, value in (state or {}).items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = _dump_value(value)
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = _dump_value(value)
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = _dump_value(value)
    return own, app, user


def _merged(
    own: Mapping[str, str], app: Mapping[str, str], user: Mapping[str, str]
) -> dict[str, Any]:
    """ADK's merged view: own keys, then ``app:`` and ``user:`` ones."""
    state = {key: _load_value(value) for key, value in own.items()}
    state.update({State.APP_PREFIX + key: _load_value(v) for key, v in app.items()})
    state.update({State.USER_PREFIX + key: _load_value(v) for key, v in user.items()})
    return state


def _scoped(entries: Iterable[v1.StateEntry], *scopes: str) -> list[dict[str, str]]:
    """``entries`` (a ``Session.state``) split by scope, one dict per
    scope of ``scopes``, in that order."""
    by_scope: dict[str, dict[str, str]] = {scope: {} for scope in scopes}
    for entry in entries:
        if entry.scope in by_scope:
            by_scope[entry.scope][entry.key] = entry.value
    return [by_scope[scope] for scope in scopes]


def _seconds(timestamp: Any) -> float:
    return float(timestamp.seconds) + float(timestamp.nanos) / 1e9


def _marker(next_sequence: int) -> str:
    return f"seq:{next_sequence}"


def _marker_sequence(session: Session) -> int | None:
    marker = session._storage_update_marker
    if isinstance(marker, str) and marker.startswith("seq:"):
        return int(marker[4:])
    return None


# -- events ------------------------------------------------------------------


def event_message(event: Event) -> v1.Message:
    """The message storing ``event``: its JSON verbatim in an ``adk.event``
    block, and native fields (role, text, thinking with its signature, tool
    calls with theirs, tool results) for readers that are not ADK and for
    exports for a target. Text parts are ``content``; when one of them
    carries a thought signature, each is also a text block with its own."""
    content = event.content
    role_name = content.role if content is not None and content.role else None
    if role_name is None:
        role_name = "user" if event.author == "user" else "model"
    role = v1.ROLE_USER if role_name == "user" else v1.ROLE_ASSISTANT
    parts = (content.parts or []) if content is not None else []
    signed_text = any(
        part.text is not None and not part.thought and part.thought_signature for part in parts
    )
    blocks = [v1.ContentBlock(json=v1.JsonBlock(type=EVENT_BLOCK_TYPE, json=event.model_dump_json()))]
    texts: list[str] = []
    tool_calls: list[v1.ToolCall] = []
    for part in parts:
        if part.text is not None:
            if part.thought:
                blocks.append(
                    v1.ContentBlock(
                        thinking=v1.ThinkingBlock(
                            thinking=part.text, signature=_signature(part.thought_signature)
                        )
                    )
                )
            else:
                texts.append(part.text)
                if signed_text:
                    blocks.append(
                        v1.ContentBlock(
                            text=v1.TextBlock(
                                text=part.text, signature=_signature(part.thought_signature)
                            )
                        )
                    )
        if part.function_call is not None:
            call = part.function_call
            tool_calls.append(
                v1.ToolCall(
                    id=call.id or "",
                    name=call.name or "",
                    arguments=json.dumps(call.args or {}, default=str, ensure_ascii=False),
                    signature=_signature(part.thought_signature),
                )
            )
        if part.function_response is not None:
            response = part.function_response
            blocks.append(
                v1.ContentBlock(
                    tool_result=v1.ToolResultBlock(
                        tool_use_id=response.id or "",
                        content=json.dumps(
                            response.response or {}, default=str, ensure_ascii=False
                        ),
                    )
                )
            )
    metadata = {"adk_event_id": event.id, "adk_author": event.author}
    if event.invocation_id:
        metadata["adk_invocation_id"] = event.invocation_id
    return v1.Message(
        role=role,
        content="".join(texts),
        content_blocks=blocks,
        tool_calls=tool_calls,
        name=event.author,
        metadata=metadata,
    )


def _signature(signature: bytes | None) -> str:
    """A part's thought signature as sessionstore stores it: base64, as the
    Gemini API's JSON carries ``thoughtSignature``."""
    return base64.b64encode(signature).decode("ascii") if signature else ""


def event_origin(event: Event) -> tuple[str, str] | None:
    """The ``(provider, model)`` that produced a model's event: its
    ``model_version``, with the provider placed by the model's name
    (``gemini…`` and any name not listed Google, ``claude…`` Anthropic,
    ``gpt…``/``o1…``/``o3…``/``o4…`` OpenAI; a ``provider/`` prefix, as
    LiteLLM names models, is used as the provider). ``None`` for the user's
    events and events no model produced."""
    if event.author == "user" or not event.model_version:
        return None
    model = event.model_version
    provider, slash, name = model.partition("/")
    if slash and provider and name:
        return provider.lower(), name
    return provider_of_model(model) or "google", model


def _provider_call(event: Event, origin: tuple[str, str]) -> dict[str, Any]:
    """The provider call behind a model's event: its model and, when the
    event carries them, its token counts (``usage_metadata``)."""
    provider, model = origin
    call: dict[str, Any] = {"provider": provider, "model": model}
    usage = event.usage_metadata
    if usage is not None:
        # Gemini counts thoughts apart from the candidates; sessionstore's
        # completion tokens are every output token, reasoning included.
        thoughts = usage.thoughts_token_count or 0
        cached = usage.cached_content_token_count or 0
        call["prompt_tokens"] = max(usage.prompt_token_count or 0, cached)
        call["completion_tokens"] = (usage.candidates_token_count or 0) + thoughts
        call["total_tokens"] = usage.total_token_count or 0
        call["cached_input_tokens"] = cached
        call["reasoning_tokens"] = thoughts
        call["usage_json"] = usage.model_dump_json(exclude_none=True)
    return call


def fit_to_export(event: Event, exported: v1.Message) -> Event | None:
    """An event as an export for a target left its message.

    The export removes reasoning the target may not receive and unpaired
    tool calls and results; the event's JSON still holds them. When the
    exported message holds no reasoning, the event loses its thought parts
    and every part's ``thought_signature``; function calls and function
    responses the export dropped are removed. An event whose content is
    left with no parts is left out (``None``), unless it carries actions.
    """
    content = event.content
    if content is None or not content.parts:
        return event
    strip = not has_reasoning(exported)
    calls = {call.id for call in exported.tool_calls}
    results = {
        block.tool_result.tool_use_id
        for block in exported.content_blocks
        if block.WhichOneof("block") == "tool_result"
    }
    parts = []
    for part in content.parts:
        if strip and part.thought:
            continue
        if part.function_call is not None and (part.function_call.id or "") not in calls:
            continue
        if part.function_response is not None and (part.function_response.id or "") not in results:
            continue
        if strip and part.thought_signature:
            part = part.model_copy(update={"thought_signature": None})
        parts.append(part)
    if len(parts) == len(content.parts) and not strip:
        return event
    if not parts and not (event.actions and event.actions.model_dump(exclude_defaults=True)):
        return None
    return event.model_copy(update={"content": content.model_copy(update={"parts": parts})})


def stored_event(message: v1.Message) -> Event | None:
    """The event a message stores, or ``None`` for a message that holds none
    (another writer's, or one whose content was redacted)."""
    for block in message.content_blocks:
        if block.WhichOneof("block") == "json" and block.json.type == EVENT_BLOCK_TYPE:
            if block.json.json:
                return Event.model_validate_json(block.json.json)
    return None


# -- the service -------------------------------------------------------------


class SessionstoreSessionService(BaseSessionService):
    """An ADK session service storing sessions, events and state in
    sessionstore (see the module's documentation for the mapping).

    Args:
        client: The :class:`sessionstore.AsyncClient` to call. The service
            neither opens nor closes it.
        model: The model the agents' next turns go to (``"gemini-3-pro"``).
            With it, ``get_session`` returns the events as that model
            accepts them (an export for that target, see the module's
            documentation).
        provider: ``model``'s provider, ``"google"`` by default.
        reasoning: Whose reasoning ``get_session`` keeps when ``model`` is
            set: ``"same_model"`` (the default), ``"same_provider"`` or
            ``"none"``.
    """

    def __init__(
        self,
        *,
        client: AsyncClient,
        model: str | None = None,
        provider: str = "google",
        reasoning: ReasoningPolicyLike = "same_model",
    ) -> None:
        self.provider = checked_provider(model, provider, reasoning)
        self._client = client
        self.model = model
        self.reasoning = reasoning

    # -- helpers -------------------------------------------------------------

    async def _bounded(self, calls: Iterable[Awaitable[T]]) -> list[T]:
        """Awaits ``calls`` with at most a few in flight at once."""
        gate = asyncio.Semaphore(_CONCURRENCY)

        async def run(call: Awaitable[T]) -> T:
            async with gate:
                return await call

        return list(await asyncio.gather(*(run(call) for call in calls)))

    async def _entries(self, session_id: str = "", scope: str = "") -> dict[str, str]:
        """Every entry of a session's own state or of a shared scope."""
        return {
            entry.key: entry.value
            async for entry in self._client.iter_state(
                session_id, scope=scope, page_size=_PAGE
            )
        }

    async def _events(
        self,
        store_id: str,
        limit: int | None,
        after_timestamp: float | None,
    ) -> tuple[list[Event], float | None, int]:
        """The events ``get_session`` returns, the newest event's timestamp,
        and the session's next sequence.

        Reads newest first (``ListMessages`` by ``sequence desc``) in pages,
        and stops as soon as it has ``limit`` events or one older than
        ``after_timestamp`` (as ``InMemorySessionService`` filters: the
        ``limit`` most recent, then those from the newest one before
        ``after_timestamp`` on), so a bounded read costs a bounded number of
        messages. ``limit`` 0 reads just far enough for the newest timestamp.
        The first page gives the next sequence too (the newest message's
        plus one, as sequences run from 0 without gaps and only the tail is
        ever removed; 0 without messages), so the events and the stale check
        come from the same read, with no ``GetSession``.
        """
        chunk = _PAGE if limit is None else max(1, min(limit, _PAGE))
        newest: float | None = None
        next_sequence: int | None = None
        picked: list[Event] = []  # newest first
        token = ""
        while True:
            page = await self._client.list_messages(
                store_id, order_by="sequence desc", page_size=chunk, page_token=token
            )
            for stored in page.messages:
                if next_sequence is None:
                    next_sequence = stored.sequence + 1
                event = stored_event(stored.message)
                if event is None:
                    continue
                if newest is None:
                    newest = event.timestamp
                if limit is not None and len(picked) >= limit:
                    return picked[::-1], newest, next_sequence
                if after_timestamp is not None and event.timestamp < after_timestamp:
                    return picked[::-1], newest, next_sequence
                picked.append(event)
                if limit is not None and len(picked) >= limit:
                    return picked[::-1], newest, next_sequence
            token = page.next_page_token
            if not token or not page.messages:
                return picked[::-1], newest, next_sequence or 0

    async def _events_for(
        self, model: str, store_id: str, limit: int | None, after_timestamp: float | None
    ) -> tuple[list[Event], float | None]:
        """``_events`` through an export for ``model``: each event fitted to
        what the export kept of its message (:func:`fit_to_export`), events
        it left out skipped. ``limit`` windows the export itself."""
        messages = await self._client.export_for(
            store_id, self.provider, model, reasoning=self.reasoning, max_messages=limit or 0
        )
        events: list[Event] = []
        for message in messages:
            event = stored_event(message)
            if event is not None:
                event = fit_to_export(event, message)
            if event is not None:
                events.append(event)
        newest = events[-1].timestamp if events else None
        if limit == 0:
            return [], newest
        if after_timestamp is not None:
            older = [i for i, event in enumerate(events) if event.timestamp < after_timestamp]
            events = events[older[-1] + 1 :] if older else events
        if limit is not None:
            events = events[-limit:]
        return events, newest

    def _names(self, session: v1.Session) -> tuple[str, str, str]:
        """``(app_name, user_id, session_id)`` from a session's metadata."""
        meta = session.metadata
        return meta.get("adk_app", ""), meta.get("adk_user", ""), meta.get("adk_session_id", "")

    # -- BaseSessionService ------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: Optional[dict[str, Any]] = None,
        session_id: Optional[str] = None,
    ) -> Session:
        """Creates a session (``AlreadyExistsError`` if the id is taken).

        One ``CreateSession``, atomic: the session with its own keys of
        ``state``, and its ``app:`` and ``user:`` keys written to their
        shared scopes in the same transaction; the answer carries every
        ``app:`` and ``user:`` entry stored after those writes, which the
        returned state merges in, as ADK's services do. ``temp:`` keys are
        dropped. It carries a fresh request id, so the client's retries of
        a transient failure cannot create twice.
        """
        session_id = session_id.strip() if session_id else None
        session_id = session_id or str(uuid.uuid4())
        own, app, user = _split_state(state)
        store_id = session_store_id(app_name, user_id, session_id)
        app_scope = _app_scope(app_name)
        user_scope = _user_scope(app_name, user_id)
        shared = [
            {"scope": app_scope, "key": key, "value": value} for key, value in app.items()
        ] + [{"scope": user_scope, "key": key, "value": value} for key, value in user.items()]
        try:
            created = await self._client.create_session(
                session_id=store_id,
                user=user_id,
                metadata={
                    "adk_app": app_name,
                    "adk_user": user_id,
                    "adk_session_id": session_id,
                },
                initial_state=own,
                state_changes=shared,
                state_scopes=[app_scope, user_scope],
                request_id=str(uuid.uuid4()),
            )
        except AlreadyExists:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        app_stored, user_stored = _scoped(created.state, app_scope, user_scope)
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merged(own, app_stored, user_stored),
            last_update_time=_seconds(created.create_time),
        )
        session._storage_update_marker = _marker(created.next_sequence)
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: Optional[GetSessionConfig] = None,
    ) -> Optional[Session]:
        """The session with its merged state and its events (``None`` if
        there is none), honouring ``config``: ``num_recent_events`` and
        ``after_timestamp`` read only the tail of the history they need."""
        session_id = session_id.strip() if session_id else session_id
        store_id = session_store_id(app_name, user_id, session_id)
        limit = config.num_recent_events if config is not None else None
        after = config.after_timestamp if config is not None else None
        scopes = ["", _app_scope(app_name), _user_scope(app_name, user_id)]
        try:
            # Two reads: the session with its own, app and user state in
            # one snapshot, and its events.
            if self.model is None:
                # The newest-first read of the events gives the session's
                # next sequence too.
                stored, (events, newest, next_sequence) = await asyncio.gather(
                    self._client.get_session(store_id, state_scopes=scopes),
                    self._events(store_id, limit, after),
                )
            else:
                # An export has no sequences: the next sequence is read
                # first, so a write after it makes the session stale.
                stored = await self._client.get_session(store_id, state_scopes=scopes)
                next_sequence = stored.next_sequence
                events, newest = await self._events_for(self.model, store_id, limit, after)
        except SessionNotFound:  # none, or deleted meanwhile
            return None
        own, app, user = _scoped(stored.state, *scopes)
        if newest is None:
            newest = _seconds(stored.create_time)
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merged(own, app, user),
            events=events,
            last_update_time=newest,
        )
        session._storage_update_marker = _marker(next_sequence)
        return session

    async def _newest_time(self, stored: v1.Session) -> float | None:
        """The timestamp of a session's newest event (``None`` without one):
        no read for a session without messages."""
        if stored.next_sequence == 0:
            return None
        _, newest, _ = await self._events(stored.id, 0, None)
        return newest

    async def list_sessions(
        self, *, app_name: str, user_id: Optional[str] = None
    ) -> ListSessionsResponse:
        """The app's sessions (of one user, or of every user), without events,
        each with its merged state, oldest update first.

        One filtered ``ListSessions`` (paged), then the state of each session
        and its newest event's timestamp, and the app's and each user's shared
        state, read concurrently.
        """
        terms = [f"metadata.adk_app = {_quote(app_name)}"]
        if user_id is not None:
            terms.append(f"user = {_quote(user_id)}")
        summaries = [
            summary.session
            async for summary in self._client.iter_sessions(
                filter=" AND ".join(terms), page_size=_PAGE
            )
        ]
        found = [
            (stored, *self._names(stored))
            for stored in summaries
            if stored.metadata.get("adk_app") == app_name
        ]
        users = sorted({user for _, _, user, _ in found})
        app_state = self._entries(scope=_app_scope(app_name))
        user_states = self._bounded(
            self._entries(scope=_user_scope(app_name, user)) for user in users
        )
        own_states = self._bounded(self._entries(stored.id) for stored, *_ in found)
        newest = self._bounded(self._newest_time(stored) for stored, *_ in found)
        app_entries, user_entries, owns, times = await asyncio.gather(
            app_state, user_states, own_states, newest
        )
        by_user = dict(zip(users, user_entries))
        sessions = []
        for (stored, app, user, sid), own, latest in zip(found, owns, times):
            sessions.append(
                Session(
                    id=sid,
                    app_name=app,
                    user_id=user,
                    state=_merged(own, app_entries, by_user[user]),
                    last_update_time=latest
                    if latest is not None
                    else _seconds(stored.create_time),
                )
            )
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Deletes the session with its events and own state (one
        ``DeleteSession``); nothing happens if there is none. Shared
        ``app:``/``user:`` state stays."""
        session_id = session_id.strip() if session_id else session_id
        try:
            await self._client.delete_session(session_store_id(app_name, user_id, session_id))
        except SessionNotFound:
            pass

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The ``user:`` state of ``(app_name, user_id)``, keys without the prefix."""
        entries = await self._entries(scope=_user_scope(app_name, user_id))
        return {key: _load_value(value) for key, value in entries.items()}

    async def append_event(self, session: Session, event: Event) -> Event:
        """Stores ``event`` and its state delta in one ``AppendExchange`` and
        applies it to ``session``, as ADK's services do.

        Partial events are returned untouched; ``temp:`` keys reach
        ``session.state`` but are never stored. The exchange expects the
        session's next sequence as it was loaded, so a session that another
        writer has appended to since raises ``StaleSessionError``; a session
        that no longer exists raises ``SessionNotFoundError``. The
        ``request_id`` is derived from the request, so calling again after an
        unknown outcome stores the event once. An event already in
        ``session.events`` (the same id and fields) is not stored again.
        """
        if event.partial:
            return event
        if any(known == event for known in session.events if known.id == event.id):
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        own, app, user = _split_state(event.actions.state_delta if event.actions else None)
        changes = [v1.StateChange(scope="", key=k, value=v) for k, v in own.items()]
        app_scope = _app_scope(session.app_name)
        user_scope = _user_scope(session.app_name, session.user_id)
        changes += [v1.StateChange(scope=app_scope, key=k, value=v) for k, v in app.items()]
        changes += [v1.StateChange(scope=user_scope, key=k, value=v) for k, v in user.items()]
        store_id = session_store_id(session.app_name, session.user_id, session.id)
        message = event_message(event)
        expected = _marker_sequence(session)
        digest = hashlib.sha256()
        for piece in (
            store_id,
            str(expected),
            message.SerializeToString(deterministic=True).hex(),
            *(change.SerializeToString(deterministic=True).hex() for change in changes),
        ):
            digest.update(piece.encode("utf-8") + b"\0")
        origin = event_origin(event)
        exchange: dict[str, Any] = {"messages": [message]}
        if origin is not None:
            exchange = {
                "response_messages": [message],
                "provider_call": _provider_call(event, origin),
            }
        try:
            response = await self._client.append_exchange(
                store_id,
                **exchange,
                state_changes=changes,
                expected_next_sequence=expected,
                request_id="adk-" + digest.hexdigest(),
            )
        except SessionNotFound:
            raise SessionNotFoundError(f"Session {session.id} not found.") from None
        except SequenceMismatch:
            raise StaleSessionError(_STALE_MESSAGE) from None
        session._storage_update_marker = _marker(response.next_sequence)
        session.last_update_time = event.timestamp
        # What BaseSessionService._commit_event_to_session does (google-adk
        # 2.0 has not got it).
        self._update_session_state(session, event)
        session.events.append(event)
        return event
