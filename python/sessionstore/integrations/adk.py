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
- **Tool confirmations are approvals.** ADK pauses a run for a person's
  yes or no (``FunctionTool(func, require_confirmation=True)``, or a tool
  calling ``tool_context.request_confirmation(hint=..., payload=...)``)
  with an event making an ``adk_request_confirmation`` function call, and
  resumes only when the next user message replies to that call (a
  ``FunctionResponse`` of that name and id, ``{"confirmed": bool,
  "payload": ...}``). ``append_event`` stores that event and then asks
  ``RequestApproval`` for the call (:func:`approval_request`: the title is
  the original call, ``transfer({"amount": 5})``; ``detail_json`` the
  confirmation call's arguments, hint and payload included), so the pause
  is a pending approval that any process sees (``ListApprovals``,
  ``sessions approvals``, a watch's ``approval_requested``) and decides
  (``DecideApproval``, ``sessions approve``/``deny``).
  :meth:`~SessionstoreSessionService.confirmation_reply` turns the
  recorded decisions into ADK's reply (:func:`confirmation_message`; the
  payload the tool asked for goes back with it), in any process, from the
  store alone::

      reply = await service.confirmation_reply(app_name=app, user_id=user, session_id=sid)
      if reply is not None:  # None while nothing is decided
          async for event in runner.run_async(user_id=user, session_id=sid, new_message=reply):
              ...

  It also asks for an approval the confirmation lacks (``RequestApproval``
  is a second call after the event's ``AppendExchange``: a crash between
  the two loses it). A reply given to ADK directly (its web UI) is
  recorded too: before storing it, ``append_event`` decides the pending
  approval as it says (``decided_by`` ``adk:USER``, a denial's reason
  ``This tool call is rejected.``), and a reply contradicting a decision
  already recorded raises ``ApprovalAlreadyDecided`` with nothing stored,
  so the tool never runs against a recorded denial.

  *A denial and the history.* ``DecideApproval`` denying appends the
  call's tool result to the stored history (a tool message, the reason as
  its content); it holds no event, so ADK never reads it. The user's reply
  to a denied call is stored with its event but without a ``tool_result``
  block of its own (``event_message(..., answered=...)``), so ADK reads
  exactly one reply and the native history (transcripts, exports for a
  model) exactly one result for the call; with ``model=`` the reply is kept
  though its message has no result block (:func:`fit_to_export`). An
  approval is recorded only as a decision: it adds nothing to the history.
  ADK's reply has no room for the reason (``ToolConfirmation`` is
  ``hint``, ``confirmed``, ``payload``): ADK tells the model ``This tool
  call is rejected.``, and the reason stays in sessionstore. An expired
  approval is no decision: ``confirmation_reply`` leaves it out (ask again
  with ``request_approval``, or reply through ADK). ADK's other pauses
  (long-running tools, credential requests) are not yes-or-no decisions
  and are not mapped. ``approvals=False`` stores the events alone.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import uuid
from collections.abc import Awaitable, Collection, Iterable, Mapping
from typing import Any, Optional, TypeVar

from .. import v1
from .._errors import (
    AlreadyExists,
    ApprovalAlreadyDecided,
    ApprovalExists,
    ApprovalExpired,
    SequenceMismatch,
    SessionNotFound,
    ToolCallAnswered,
)
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
    from google.adk.tools.tool_confirmation import ToolConfirmation
    from google.genai import types
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
    "CONFIRMATION_FUNCTION",
    "EVENT_BLOCK_TYPE",
    "SessionstoreSessionService",
    "StaleSessionError",
    "approval_request",
    "confirmation_calls",
    "confirmation_message",
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

#: The function call ADK pauses on for a tool confirmation, and the name
#: of the user's reply.
CONFIRMATION_FUNCTION = "adk_request_confirmation"

_MAX_ID = 128
_MAX_SCOPE = 256
_MAX_TITLE = 1024  # RequestApproval's title
_MAX_DETAIL = 65536  # and detail_json
_PAGE = 1000  # the server's longest page
_CONCURRENCY = 16
_PLAIN = re.compile(r"[A-Za-z0-9_-]")
#: A denial recorded from an ADK reply: the approval's reason, and so the
#: content of its tool result (ADK's own words to the model for it).
_REJECTED = "This tool call is rejected."
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


def event_message(event: Event, *, answered: Collection[str] = ()) -> v1.Message:
    """The message storing ``event``: its JSON verbatim in an ``adk.event``
    block, and native fields (role, text, thinking with its signature, tool
    calls with theirs, tool results) for readers that are not ADK and for
    exports for a target. Text parts are ``content``; when one of them
    carries a thought signature, each is also a text block with its own.

    A function response to a call in ``answered`` (one the stored history
    already answers: a denied approval's tool result) is kept in the JSON
    but gets no ``tool_result`` block, so no call is answered twice."""
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
        if part.function_response is not None and (part.function_response.id or "") not in answered:
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


def fit_to_export(
    event: Event, exported: v1.Message, answered: Collection[str] = ()
) -> Event | None:
    """An event as an export for a target left its message.

    The export removes reasoning the target may not receive and unpaired
    tool calls and results; the event's JSON still holds them. When the
    exported message holds no reasoning, the event loses its thought parts
    and every part's ``thought_signature``; function calls and function
    responses the export dropped are removed. A reply to a tool
    confirmation whose message has no result block for it (stored after a
    denial, whose tool result answers the call) stays when that call is in
    ``answered``: the calls the export answers elsewhere. An event whose
    content is left with no parts is left out (``None``), unless it
    carries actions.
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
    results |= {
        part.function_response.id
        for part in content.parts
        if part.function_response is not None
        and part.function_response.name == CONFIRMATION_FUNCTION
        and part.function_response.id in answered
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


# -- tool confirmations ----------------------------------------------------------


def _answers(message: v1.Message) -> Iterable[str]:
    """The tool calls a stored message answers: a tool message's
    ``tool_call_id`` and its ``tool_result`` blocks."""
    if message.role == v1.ROLE_TOOL and message.tool_call_id:
        yield message.tool_call_id
    for block in message.content_blocks:
        if block.WhichOneof("block") == "tool_result":
            yield block.tool_result.tool_use_id


def _clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", errors="ignore") + "..."


def confirmation_calls(event: Event) -> list[Any]:
    """The ``adk_request_confirmation`` function calls of ``event`` (ADK's
    pause for a tool confirmation), with ids."""
    return [
        call
        for call in event.get_function_calls()
        if call.name == CONFIRMATION_FUNCTION and call.id
    ]


def _confirmation_replies(event: Event) -> list[Any]:
    """The replies to tool confirmations a user's event carries."""
    if event.author != "user":
        return []
    return [
        response
        for response in event.get_function_responses()
        if response.name == CONFIRMATION_FUNCTION and response.id
    ]


def _confirmed(response: Mapping[str, Any] | None) -> bool:
    """Whether a confirmation reply confirms, read as ADK reads it (a
    ``ToolConfirmation``, or the ADK web client's ``{"response": JSON}``)."""
    response = dict(response or {})
    if len(response) == 1 and "response" in response:
        return ToolConfirmation.model_validate(json.loads(response["response"])).confirmed
    return ToolConfirmation.model_validate(response).confirmed


def approval_request(call: Any) -> dict[str, str]:
    """What the adapter asks ``RequestApproval`` for an
    ``adk_request_confirmation`` call: ``tool_call_id`` (the confirmation
    call's id), ``title`` (the original call, ``name(JSON arguments)``, cut
    to 1,024 bytes) and ``detail_json`` (the confirmation call's arguments:
    ``originalFunctionCall`` and ``toolConfirmation`` with its ``hint``
    and ``payload``, as JSON; without the original arguments if that
    passes 65,536 bytes)."""
    args = dict(call.args or {})
    original = args.get("originalFunctionCall")
    original = original if isinstance(original, dict) else {}
    name = str(original.get("name") or "tool")
    arguments = json.dumps(original.get("args") or {}, ensure_ascii=False, default=str)
    detail = json.dumps(args, ensure_ascii=False, default=str)
    if len(detail.encode("utf-8")) > _MAX_DETAIL:
        args["originalFunctionCall"] = {k: v for k, v in original.items() if k != "args"}
        args["argsOmitted"] = True
        detail = json.dumps(args, ensure_ascii=False, default=str)
    return {
        "tool_call_id": call.id,
        "title": _clip(f"{name}({arguments})", _MAX_TITLE),
        "detail_json": detail,
    }


def confirmation_message(approvals: Iterable[v1.Approval]) -> types.Content:
    """The user's reply to ADK's tool confirmations, from approvals decided
    in sessionstore: one ``FunctionResponse`` named
    ``adk_request_confirmation`` per approval, its id the approval's
    ``tool_call_id``, its response ``{"confirmed": True}`` for an approved
    one and ``{"confirmed": False}`` for a denied one, with the payload the
    tool asked for (``toolConfirmation.payload`` in the approval's
    ``detail_json``) when there is one. Pass it to ``Runner.run_async`` as
    ``new_message`` to resume the paused run: the tool runs when approved,
    and answers ``This tool call is rejected.`` when denied.

    Raises ``ValueError`` for an approval that is pending or expired
    (neither is a decision) and when ``approvals`` is empty.
    """
    parts = []
    for approval in approvals:
        if approval.state == v1.APPROVAL_STATE_APPROVED:
            response: dict[str, Any] = {"confirmed": True}
        elif approval.state == v1.APPROVAL_STATE_DENIED:
            response = {"confirmed": False}
        else:
            state = v1.ApprovalState.Name(approval.state)
            raise ValueError(f"approval {approval.approval_id} is not decided ({state})")
        payload = _requested_payload(approval.detail_json)
        if payload is not None:
            response["payload"] = payload
        parts.append(
            types.Part(
                function_response=types.FunctionResponse(
                    id=approval.tool_call_id, name=CONFIRMATION_FUNCTION, response=response
                )
            )
        )
    if not parts:
        raise ValueError("no approvals to reply with")
    return types.Content(role="user", parts=parts)


def _requested_payload(detail_json: str) -> Any:
    """``toolConfirmation.payload`` of an approval's details, if any."""
    try:
        detail = json.loads(detail_json) if detail_json else None
    except ValueError:
        return None
    if not isinstance(detail, dict):
        return None
    confirmation = detail.get("toolConfirmation")
    return confirmation.get("payload") if isinstance(confirmation, dict) else None


def _open_confirmations(events: Iterable[Event]) -> list[Any]:
    """The ``adk_request_confirmation`` calls no event replies to yet, in
    order."""
    calls: dict[str, Any] = {}
    for event in events:
        for call in confirmation_calls(event):
            calls.setdefault(call.id, call)
        for response in event.get_function_responses():
            if response.name == CONFIRMATION_FUNCTION and response.id:
                calls.pop(response.id, None)
    return list(calls.values())


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
        approvals: Whether ADK's tool confirmations are sessionstore
            approvals (the default; see the module's documentation):
            ``append_event`` asks ``RequestApproval`` for each
            confirmation an event asks for, and records the user's reply
            with ``DecideApproval``. ``False`` stores the events alone
            (for a server without approvals).
    """

    def __init__(
        self,
        *,
        client: AsyncClient,
        model: str | None = None,
        provider: str = "google",
        reasoning: ReasoningPolicyLike = "same_model",
        approvals: bool = True,
    ) -> None:
        self.provider = checked_provider(model, provider, reasoning)
        self._client = client
        self.model = model
        self.reasoning = reasoning
        self.approvals = approvals

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

    async def _latest_approvals(self, store_id: str) -> dict[str, v1.Approval]:
        """The session's newest approval of each tool call, by call id."""
        latest: dict[str, v1.Approval] = {}
        async for approval in self._client.iter_approvals(session_id=store_id, page_size=_PAGE):
            latest[approval.tool_call_id] = approval  # oldest first: the last wins
        return latest

    async def _ask(self, store_id: str, call: Any) -> None:
        """Asks for an approval of an ``adk_request_confirmation`` call,
        unless it has one (a retry) or a reply already."""
        try:
            await self._client.request_approval(store_id, **approval_request(call))
        except (ApprovalExists, ToolCallAnswered):
            pass

    async def _record_replies(
        self, session: Session, store_id: str, event: Event, expected: int | None
    ) -> tuple[set[str], int | None]:
        """Records the confirmation replies of a user's ``event`` on their
        approvals before the event is stored: each pending approval is
        decided as the reply says (``DecideApproval``, its request id
        derived from the event, so a retry answers the first decision); one
        already decided the other way raises ``ApprovalAlreadyDecided``, and
        nothing is stored (the recorded decision stands). Answers the calls
        the history already answers (denied: the denial's tool result), whose
        replies get no result block, and the next sequence to expect (one
        more when this decision's denial appended its tool result there)."""
        replies = _confirmation_replies(event)
        if not replies:
            return set(), expected
        latest = await self._latest_approvals(store_id)
        answered: set[str] = set()
        decided_by = "adk:" + session.user_id
        for reply in replies:
            approval = latest.get(reply.id)
            if approval is None or approval.state == v1.APPROVAL_STATE_EXPIRED:
                continue  # nothing to decide: the reply alone answers the call
            confirmed = _confirmed(reply.response)
            wanted = v1.APPROVAL_STATE_APPROVED if confirmed else v1.APPROVAL_STATE_DENIED
            if approval.state == wanted and approval.decided_by != decided_by:
                # Decided elsewhere as the reply says: the reply resumes it.
                if not confirmed:
                    answered.add(reply.id)
                continue
            # Pending; decided the other way (refused below); or decided
            # by a reply like this one, perhaps this very one before a
            # retry, whose request id then answers the first decision.
            decision = "approve" if confirmed else "deny"
            reason = "" if confirmed else _REJECTED
            request_id = "adk-" + _digest(store_id, approval.approval_id, event.id, decision)
            try:
                decided = await self._client.decide_approval(
                    store_id,
                    approval_id=approval.approval_id,
                    decision=decision,
                    reason=reason,
                    decided_by=decided_by,
                    request_id=request_id,
                )
            except ApprovalAlreadyDecided as exc:
                if exc.state != wanted:
                    raise
            except ApprovalExpired:
                continue
            else:
                stored = decided.tool_result
                if decided.HasField("tool_result") and stored.sequence == expected:
                    expected = stored.sequence + 1
            if not confirmed:
                answered.add(reply.id)
        return answered, expected

    async def confirmation_reply(
        self, *, app_name: str, user_id: str, session_id: str
    ) -> Optional[types.Content]:
        """The user's reply to the session's open tool confirmations that
        have been decided in sessionstore (by ``DecideApproval`` from any
        process: ``sessions approve``/``deny``, a UI, another client), to
        pass to ``Runner.run_async`` as ``new_message``; ``None`` while
        none is decided. See :func:`confirmation_message`.

        Reads the history (``ListMessages``) and the session's approvals
        (``ListApprovals``); an open confirmation without an approval (its
        ``RequestApproval`` lost to a crash right after the event was
        stored) is asked for here. Raises ``SessionNotFoundError`` if the
        session does not exist.
        """
        session_id = session_id.strip() if session_id else session_id
        store_id = session_store_id(app_name, user_id, session_id)
        try:
            events, _, _ = await self._events(store_id, None, None)
        except SessionNotFound:
            raise SessionNotFoundError(f"Session {session_id} not found.") from None
        calls = _open_confirmations(events)
        if not calls:
            return None
        latest = await self._latest_approvals(store_id)
        decided = []
        for call in calls:
            approval = latest.get(call.id)
            if approval is None:
                if self.approvals:
                    await self._ask(store_id, call)
            elif approval.state in (v1.APPROVAL_STATE_APPROVED, v1.APPROVAL_STATE_DENIED):
                decided.append(approval)
        return confirmation_message(decided) if decided else None

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
        answered = {id for message in messages for id in _answers(message)}
        events: list[Event] = []
        for message in messages:
            event = stored_event(message)
            if event is not None:
                event = fit_to_export(event, message, answered)
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
                # Both answered before either's error is raised: no call
                # is left running after this one returns.
                results = await asyncio.gather(
                    self._client.get_session(store_id, state_scopes=scopes),
                    self._events(store_id, limit, after),
                    return_exceptions=True,
                )
                for result in results:
                    if isinstance(result, BaseException):
                        raise result
                stored, (events, newest, next_sequence) = results
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

        Tool confirmations (unless ``approvals=False``): an event making
        ``adk_request_confirmation`` calls is followed by one
        ``RequestApproval`` per call; a user's event replying to one first
        reads the session's approvals (``ListApprovals``) and decides a
        pending one as the reply says (``DecideApproval``). A reply
        contradicting a recorded decision raises ``ApprovalAlreadyDecided``
        and stores nothing.
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
        expected = _marker_sequence(session)
        answered: set[str] = set()
        if self.approvals:
            try:
                answered, expected = await self._record_replies(session, store_id, event, expected)
            except SessionNotFound:
                raise SessionNotFoundError(f"Session {session.id} not found.") from None
        message = event_message(event, answered=answered)
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
        if self.approvals:
            for call in confirmation_calls(event):
                await self._ask(store_id, call)
        session._storage_update_marker = _marker(response.next_sequence)
        session.last_update_time = event.timestamp
        # What BaseSessionService._commit_event_to_session does (google-adk
        # 2.0 has not got it).
        self._update_session_state(session, event)
        session.events.append(event)
        return event
