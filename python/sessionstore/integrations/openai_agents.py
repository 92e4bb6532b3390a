"""sessionstore as the session backend of the OpenAI Agents SDK.

:class:`SessionstoreSession` implements the SDK's ``Session`` protocol
(``get_items``, ``add_items``, ``pop_item``, ``clear_session``) on an
:class:`sessionstore.AsyncClient`::

    from agents import Agent, Runner
    from sessionstore import AsyncClient
    from sessionstore.integrations.openai_agents import SessionstoreSession

    agent = Agent(name="Assistant", instructions="Reply very concisely.")
    session = SessionstoreSession(
        "conversation_123", client=AsyncClient("http://127.0.0.1:50051")
    )
    result = Runner.run_sync(agent, "What city is the Golden Gate Bridge in?", session=session)
    result = Runner.run_sync(agent, "What state is it in?", session=session)

The adapter keeps no data of its own: each call reads or writes the server,
and each call that is one change is one RPC:

- ``add_items`` is one ``AppendExchange`` carrying every item, with a
  ``request_id``, so the client's retry of it is stored once. It carries
  ``create_if_missing`` too, so the first ``add_items`` of a new
  conversation creates the session (under the mapped id, see below) in the
  same call and transaction; racing first writers create it once. The
  items are stored all or none: more items than the server's
  ``--max-messages-per-exchange`` (1000 by default) in one call is refused
  with ``LimitExceeded`` and nothing is stored.
- ``clear_session`` is one ``RollbackSession(after_sequence=-1)``; the
  session itself stays.
- ``pop_item`` is one ``RollbackSession(remove_last=1,
  return_removed=True)``: the server removes whatever message is last when
  the call runs, with no read first, so a concurrent append is never lost
  (it is either popped and returned, or stays). Popping an empty or unknown
  session returns ``None``.
- ``get_items(limit)`` is one newest-first ``ListMessages`` page of
  ``limit`` (paging on only past messages that hold no item);
  ``get_items()`` pages through all messages (one ``ListMessages`` per
  1000), and with ``model`` either is one ``ExportHistory``.

**Items.** Each Responses API input item is one stored message. The item is
kept verbatim as JSON text (``json.dumps``, as the SDK's ``SQLiteSession``
stores it) in a ``JsonBlock`` of type :data:`ITEM_BLOCK_TYPE`, which the
server never parses; ``get_items`` returns ``json.loads`` of it, so items
round-trip exactly (malformed tool-call arguments, encrypted reasoning,
unknown item types, U+0000 in strings). The native fields are filled too,
so transcripts, search and the CLI show a real conversation: the role, the
text of a message's content, ``tool_calls`` for a ``function_call`` and
``tool_call_id`` for a ``function_call_output``.

A reasoning item is stored in the message of the item that follows it in
the same ``add_items`` (a ``function_call`` or the assistant's message), as a
JSON block of type ``reasoning``: sessionstore's native form of an OpenAI
reasoning item, which an export for another model leaves out. So
``pop_item`` removes the reasoning before the item it pops (the Responses
API refuses a reasoning item without its following item), and a window of
``get_items(limit)`` counts items, not stored messages.

**Switching models.** Give the session the model the agent runs on
(``model="gpt-5"``, ``provider="openai"`` by default):

- ``add_items`` then sends the items from the first one the model produced
  (an assistant message, a reasoning item, a ``*_call``) as the response of
  a provider call of that model, and the ones before it as input: still one
  ``AppendExchange``. The call carries the tokens of the model requests the
  run made since this session last recorded them (``prompt_tokens``,
  ``completion_tokens``, ``total_tokens``, ``cached_input_tokens``,
  ``cache_creation_input_tokens`` and ``reasoning_tokens``, summed over
  them; the SDK saves each turn as it ends, so usually one request's), read
  from the run's context, which the SDK passes to a session whose methods
  take ``wrapper`` (as this one's do): ``SummarizeUsage`` then counts what
  the run was billed. Called without a run's context (directly, or by a
  runner that does not pass it), the call names the model only.
- ``get_items`` reads an export for that target (``ExportHistory`` with
  ``ExportTarget``, ``reasoning="same_model"`` by default): reasoning items
  other models made are left out, and a ``function_call`` whose output never
  came (a cancelled run), with the reasoning before it, is dropped, except
  the calls of the last answer, which are pending. Stored items do not
  change; a session object with another model reads its own view.

Messages written to the same session by other clients (no item block) are
read back as easy input messages (``{"role": ..., "content": ...}``),
``function_call`` or ``function_call_output`` items where that is one item;
others (e.g. an assistant message with several tool calls) are skipped, as
``SQLiteSession`` skips rows it cannot decode.

**Session ids.** The SDK's ids are free-form strings; sessionstore ids are
1-128 of ``[A-Za-z0-9_.:-]``. :func:`store_session_id` maps one onto the
other, injectively:

- ``"oa:"`` + the id's UTF-8 bytes with ``A-Z a-z 0-9 _ - .`` kept and every
  other byte written ``:XX`` (two lower-case hex digits; ``:`` is the
  escape, so ``:`` itself becomes ``:3a``). :func:`sdk_session_id` reverses
  it. ``"chat-1"`` is ``"oa:chat-1"``; ``"user 42/ü"`` is
  ``"oa:user:2042:2f:c3:bc"``.
- When that would be longer than 128 characters: ``"oah:"`` + the SHA-256 of
  the id's UTF-8 bytes in hex (68 characters). The original id is not
  recoverable from it; it is kept in the session's metadata under
  :data:`SESSION_ID_METADATA_KEY` when the adapter creates the session.

The two forms never collide (``oa:`` vs ``oah:``).

**Cancellation.** As with the SDK's own sessions, cancelling a task inside
``add_items``, ``pop_item`` or ``clear_session`` lets the RPC finish (so the
change is either made or not, and known), then raises ``CancelledError``.

**Event loops.** As the SDK's quickstart does with ``SQLiteSession``, make
the session once (at module level, outside any event loop) and use it from
any loop: ``Runner.run_sync`` (the thread's loop), ``asyncio.run`` again and
again, ``Runner.run`` / ``Runner.run_streamed`` inside a running loop, or
several threads at once, each with its own loop. The ``AsyncClient`` opens
a channel per loop it is used in (see :class:`sessionstore.AsyncClient`).

**Durable tool approvals.** A tool made with ``needs_approval=True`` pauses
the run: ``result.interruptions`` holds one ``ToolApprovalItem`` per call
waiting, and the SDK continues the run from its ``RunState`` once each is
approved or rejected. :func:`request_approvals` keeps that pause in the
store, so the call is decided by anyone, and the run continued by any
process, after the one that paused it is gone::

    result = await Runner.run(agent, "Delete q3.txt", session=session)
    if result.interruptions:
        await request_approvals(session, result)  # this process may now exit

    # Anyone: client.decide_approval(session.store_session_id,
    #     approval_id=..., decision="approve")  (or "deny", reason=...),
    # the CLI's `sessions approve` / `sessions deny`, a UI.

    # Any process, later (None: nothing to continue yet):
    result = await resume(session, agent, wait=True)

- :func:`request_approvals` writes the run's snapshot (the SDK's
  ``RunState.to_json()``, compressed) to the session's state under
  :data:`RUN_STATE_KEY_PREFIX` (one ``SetState`` per 60,000 characters,
  usually one; the snapshot holds the run's input, so it grows with the
  conversation), then one ``RequestApproval`` per interruption: the call's
  id (the SDK stores the ``function_call`` before it pauses), the tool's
  name as the title, and as ``detail_json`` the tool, the agent, the
  arguments and the snapshot's reference (:data:`APPROVAL_DETAIL_KEY`).
- :func:`load_decided_run` (and :func:`resume`, which then runs
  ``Runner.run(agent, state, session=session)``) finds the session's
  newest paused run (``ListApprovals``; ``GetState`` per chunk), answers
  ``None`` while an approval is pending or waits for the decisions
  (``wait``, ``timeout``), checks the snapshot against the digest its
  approvals recorded, rebuilds the ``RunState`` and applies each decision
  through the SDK: approved, ``approve``; denied, ``reject`` with the
  denial's reason; expired, ``reject`` (``expired_message``). It takes the
  run once (``DeleteState`` of the snapshot with its version): of all the
  processes that try, one continues it, so an approved call runs at most
  once (a process that dies after taking the run leaves it unfinished; the
  history keeps what it stored).
- A denial: the server stores the call's tool result (the reason) as it
  records the denial, and the SDK writes its own output for the rejected
  call (the same reason) when the run continues. The session that resumed
  the run leaves the SDK's out, so the history holds one output for the
  call, as the SDK's own ``SQLiteSession`` would. Resume with the session
  object given to :func:`load_decided_run`. With several calls paused
  together, a denied call's output is stored when it is denied, so it comes
  before the outputs of the calls that run when the run goes on (the SDK's
  own session keeps the calls' order; the items are the same).
- The run's model requests recorded before the pause are not recorded
  again after it (``model=``).
- Only calls the session's history holds can be asked about: the function
  tools of the session's own run (the server refuses others with
  ``UnknownToolCall``; a nested ``Agent.as_tool`` run's calls never reach
  the session).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from .. import v1
from .._errors import (
    ApprovalExists,
    SessionNotFound,
    SessionstoreError,
    StateNotFound,
    StateVersionMismatch,
)
from .._requests import ReasoningPolicyLike, TimeLike, new_request_id
from ..aio import AsyncClient
from ._models import checked_provider

try:
    from agents.agent import Agent
    from agents.items import ToolApprovalItem, TResponseInputItem
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
    from agents.result import RunResult, RunResultStreaming
    from agents.run import Runner
    from agents.run_state import RunState
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "sessionstore.integrations.openai_agents needs the OpenAI Agents SDK: "
        'pip install "sessionstore-client[openai-agents]"'
    ) from error

__all__ = [
    "APPROVAL_DETAIL_KEY",
    "ITEM_BLOCK_TYPE",
    "RUN_STATE_KEY_PREFIX",
    "SESSION_ID_METADATA_KEY",
    "SessionstoreSession",
    "item_from_message",
    "items_from_message",
    "load_decided_run",
    "message_from_item",
    "messages_from_items",
    "request_approvals",
    "resume",
    "sdk_session_id",
    "store_session_id",
]

_T = TypeVar("_T")

#: The ``JsonBlock.type`` of the block holding an item verbatim.
ITEM_BLOCK_TYPE = "openai_agents.item"
#: The session metadata key holding the SDK's session id, set when the
#: adapter creates a session.
SESSION_ID_METADATA_KEY = "openai_agents.session_id"

_PREFIX = "oa:"
_DIGEST_PREFIX = "oah:"
_MAX_ID_LEN = 128
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_ESCAPED = re.compile(r"[A-Za-z0-9_.\-]|:[0-9a-f]{2}")
_PAGE_SIZE = 1000

_ROLES: Mapping[str, int] = {
    "user": v1.ROLE_USER,
    "assistant": v1.ROLE_ASSISTANT,
    "system": v1.ROLE_SYSTEM,
    "developer": v1.ROLE_DEVELOPER,
}
_ROLE_NAMES: Mapping[int, str] = {value: name for name, value in _ROLES.items()}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


# -- session ids -------------------------------------------------------------


def store_session_id(session_id: str) -> str:
    """The sessionstore session id for the SDK's ``session_id``.

    ``"oa:"`` plus the escaped id (reversible with :func:`sdk_session_id`),
    or, when that is over 128 characters, ``"oah:"`` plus the SHA-256 of the
    id in hex. Injective either way (barring SHA-256 collisions).
    """
    raw = session_id.encode("utf-8")
    escaped = "".join(chr(b) if b in _SAFE else f":{b:02x}" for b in raw)
    if len(_PREFIX) + len(escaped) <= _MAX_ID_LEN:
        return _PREFIX + escaped
    return _DIGEST_PREFIX + hashlib.sha256(raw).hexdigest()


def sdk_session_id(store_id: str) -> str | None:
    """The SDK session id that :func:`store_session_id` mapped to ``store_id``.

    ``None`` for a digest id (``"oah:…"``: read the session's metadata key
    :data:`SESSION_ID_METADATA_KEY`). ``ValueError`` for an id this mapping
    never makes.
    """
    if store_id.startswith(_DIGEST_PREFIX):
        return None
    if not store_id.startswith(_PREFIX):
        raise ValueError(f"not an OpenAI Agents session id: {store_id!r}")
    body = store_id[len(_PREFIX) :]
    out = bytearray()
    position = 0
    while position < len(body):
        found = _ESCAPED.match(body, position)
        if found is None:
            raise ValueError(f"not an OpenAI Agents session id: {store_id!r}")
        token = found.group()
        out += bytes.fromhex(token[1:]) if token[0] == ":" else token.encode("ascii")
        position = found.end()
    try:
        decoded = out.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"not an OpenAI Agents session id: {store_id!r}") from None
    if store_session_id(decoded) != store_id:  # e.g. ":41" for "A", or a too-long form
        raise ValueError(f"not an OpenAI Agents session id: {store_id!r}")
    return decoded


# -- items <-> messages ------------------------------------------------------


def _text_of(content: Any) -> str:
    """The readable text of a message item's ``content``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
    return "\n".join(texts)


def message_from_item(item: Mapping[str, Any]) -> v1.Message:
    """The stored message for one input item: the item verbatim as JSON in a
    ``JsonBlock`` (:data:`ITEM_BLOCK_TYPE`), with the native fields filled
    where the item has an obvious reading.

    Raises ``TypeError`` / ``ValueError`` (from ``json.dumps``) for an item
    that is not JSON-serializable.
    """
    encoded = json.dumps(item)
    kind = item.get("type")
    role_name = item.get("role")
    message = v1.Message()
    message.content_blocks.add().json.CopyFrom(v1.JsonBlock(type=ITEM_BLOCK_TYPE, json=encoded))
    if kind == "function_call":
        message.role = v1.ROLE_ASSISTANT
        call = message.tool_calls.add()
        call.id = _str(item.get("call_id"))
        call.name = _str(item.get("name"))
        call.arguments = _str(item.get("arguments"))
    elif kind == "function_call_output":
        message.role = v1.ROLE_TOOL
        message.tool_call_id = _str(item.get("call_id"))
        output = item.get("output")
        message.content = output if isinstance(output, str) else _text_of(output)
    elif isinstance(role_name, str) and role_name in _ROLES and kind in (None, "message"):
        message.role = _ROLES[role_name]  # type: ignore[assignment]
        message.content = _text_of(item.get("content"))
    elif isinstance(kind, str) and kind.endswith("_output"):
        # Other tool results (computer_call_output, shell_call_output, ...).
        message.role = v1.ROLE_TOOL
        message.tool_call_id = _str(item.get("call_id"))
    else:
        # Model output (reasoning, tool calls of other kinds) and anything unknown.
        message.role = v1.ROLE_ASSISTANT
    if isinstance(kind, str):
        message.name = "" if kind == "message" else kind
    return message


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _is_reasoning(item: Mapping[str, Any]) -> bool:
    return item.get("type") == "reasoning"


def _reasoning_block(item: Mapping[str, Any]) -> v1.ContentBlock:
    return v1.ContentBlock(json=v1.JsonBlock(type="reasoning", json=json.dumps(item)))


def messages_from_items(items: list[Mapping[str, Any]]) -> list[v1.Message]:
    """The stored messages for a batch of items: one per item, except that
    reasoning items go into the message of the item that follows them, as
    ``reasoning`` JSON blocks before its item block (sessionstore's native
    reasoning, which an export for another model leaves out). Reasoning
    items with no item after them in the batch make a message of their own.

    Raises ``TypeError`` / ``ValueError`` (from ``json.dumps``) for an item
    that is not JSON-serializable.
    """
    messages: list[v1.Message] = []
    reasoning: list[v1.ContentBlock] = []
    for item in items:
        if _is_reasoning(item):
            reasoning.append(_reasoning_block(item))
            continue
        message = message_from_item(item)
        if reasoning:
            blocks = [*reasoning, *message.content_blocks]
            del message.content_blocks[:]
            message.content_blocks.extend(blocks)
            reasoning = []
        messages.append(message)
    if reasoning:
        messages.append(v1.Message(role=v1.ROLE_ASSISTANT, name="reasoning", content_blocks=reasoning))
    return messages


def items_from_message(message: v1.Message) -> list[TResponseInputItem]:
    """The items a stored message holds, in order: its reasoning items
    (``reasoning`` JSON blocks), then its item (:func:`item_from_message`).
    A message with neither holds none."""
    items: list[TResponseInputItem] = []
    for block in message.content_blocks:
        if block.WhichOneof("block") == "json" and block.json.type == "reasoning":
            try:
                items.append(cast(TResponseInputItem, json.loads(block.json.json)))
            except ValueError:
                pass
    if items and not any(
        block.WhichOneof("block") == "json" and block.json.type == ITEM_BLOCK_TYPE
        for block in message.content_blocks
    ):
        return items  # reasoning with no item after it
    item = item_from_message(message)
    if item is not None:
        items.append(item)
    return items


def _fit_to_export(message: v1.Message) -> list[TResponseInputItem]:
    """The items of a message an export for a target sent: its item is left
    out when it is a function call the export dropped (no result followed),
    and its reasoning then too (the API refuses reasoning without the item
    it preceded); a reasoning item stored as an item of its own (before
    reasoning was stored natively) is left out."""
    items = items_from_message(message)
    if not items:
        return []
    item = cast(Mapping[str, Any], items[-1])
    if _is_reasoning(item):
        return []  # reasoning without a following item, or stored the old way
    if item.get("type") == "function_call":
        if item.get("call_id") not in {call.id for call in message.tool_calls}:
            return []
    return items


def _from_model(item: Mapping[str, Any]) -> bool:
    """Whether an item is the model's output (as opposed to the user's input
    or a tool's result)."""
    kind = item.get("type")
    if item.get("role") == "assistant" or kind == "reasoning":
        return True
    return isinstance(kind, str) and kind.endswith("_call")


def item_from_message(message: v1.Message) -> TResponseInputItem | None:
    """The input item a stored message holds: the verbatim JSON of its item
    block, or for a message another client wrote, an easy input message,
    ``function_call`` or ``function_call_output`` item. ``None`` when it is
    neither (the message is skipped)."""
    for block in message.content_blocks:
        if block.WhichOneof("block") == "json" and block.json.type == ITEM_BLOCK_TYPE:
            try:
                return cast(TResponseInputItem, json.loads(block.json.json))
            except ValueError:
                return None
    if message.role == v1.ROLE_TOOL and message.tool_call_id:
        return cast(
            TResponseInputItem,
            {"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content},
        )
    if len(message.tool_calls) == 1 and not message.content:
        call = message.tool_calls[0]
        return cast(
            TResponseInputItem,
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
            },
        )
    role = _ROLE_NAMES.get(message.role)
    if role is None or message.tool_calls:
        return None
    text = message.content or "\n".join(
        block.text.text for block in message.content_blocks if block.WhichOneof("block") == "text"
    )
    return cast(TResponseInputItem, {"role": role, "content": text})


# -- the session -------------------------------------------------------------


#: Where a run's context remembers, per session, how many of the run's
#: model requests (``usage.request_usage_entries``) were recorded already.
_RECORDED_ATTRIBUTE = "_sessionstore_recorded_requests"


class _Requests:
    """The model requests of a run (``wrapper.usage.request_usage_entries``)
    that the session ``key`` has not recorded yet."""

    def __init__(self, wrapper: Any, key: str, done: int, entries: list[Any]) -> None:
        self._wrapper = wrapper
        self._key = key
        self._done = done
        self._entries = entries

    @classmethod
    def unrecorded(cls, wrapper: Any, key: str) -> _Requests | None:
        """``None`` without a run's context or usage, or with nothing new."""
        usage = getattr(wrapper, "usage", None) if wrapper is not None else None
        entries = list(getattr(usage, "request_usage_entries", None) or ())
        recorded = getattr(wrapper, _RECORDED_ATTRIBUTE, None)
        done = recorded.get(key, 0) if isinstance(recorded, dict) else 0
        if not entries[done:]:
            return None
        return cls(wrapper, key, len(entries), entries[done:])

    def tokens(self) -> dict[str, int]:
        """The requests' tokens summed, as ``ProviderCall`` fields."""

        def total(read: Callable[[Any], Any]) -> int:
            return sum(_count(read(entry)) for entry in self._entries)

        cached = total(
            lambda e: getattr(getattr(e, "input_tokens_details", None), "cached_tokens", 0)
        )
        written = total(
            lambda e: getattr(getattr(e, "input_tokens_details", None), "cache_write_tokens", 0)
        )
        reasoning = total(
            lambda e: getattr(getattr(e, "output_tokens_details", None), "reasoning_tokens", 0)
        )
        # The SDK's input and output counts hold their cache and reasoning
        # parts (as the server requires); a model adapter that reported a
        # part larger than its whole would otherwise fail the append.
        return {
            "prompt_tokens": max(total(lambda e: getattr(e, "input_tokens", 0)), cached + written),
            "completion_tokens": max(total(lambda e: getattr(e, "output_tokens", 0)), reasoning),
            "total_tokens": total(lambda e: getattr(e, "total_tokens", 0)),
            "cached_input_tokens": cached,
            "cache_creation_input_tokens": written,
            "reasoning_tokens": reasoning,
        }

    def mark_recorded(self) -> None:
        """Remembers, in the run's context, that these requests are stored
        (after the append succeeded, so a failed one records them later)."""
        recorded = getattr(self._wrapper, _RECORDED_ATTRIBUTE, None)
        if not isinstance(recorded, dict):
            recorded = {}
            try:
                setattr(self._wrapper, _RECORDED_ATTRIBUTE, recorded)
            except (AttributeError, TypeError):  # pragma: no cover - a context without attributes
                return
        recorded[self._key] = max(recorded.get(self._key, 0), self._done)


def _count(value: Any) -> int:
    """A token count as an ``int`` (``None`` or a negative count as 0)."""
    return value if isinstance(value, int) and value > 0 else 0


async def _settle(awaitable: Awaitable[_T]) -> _T:
    """Awaits ``awaitable`` to its outcome even when the caller is cancelled
    meanwhile; then re-raises the cancellation (or returns the result)."""
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as error:
            cancelled = cancelled or error
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved, so the loop does not report it
        raise cancelled
    return task.result()


class SessionstoreSession(SessionABC):
    """An OpenAI Agents SDK session stored in sessionstore.

    Args:
        session_id: The SDK's session id (any string); the stored session's
            id is :attr:`store_session_id` (see :func:`store_session_id`).
        client: The client to reach the server with. The session does not
            close it.
        session_settings: As for ``SQLiteSession``: ``SessionSettings`` or a
            dict of its fields; ``limit`` is the default of
            :meth:`get_items`. ``None`` means ``SessionSettings()``.
        model: The model the agent runs on (``"gpt-5"``). With it,
            :meth:`add_items` records the model's output as that model's,
            and :meth:`get_items` returns the history as that model accepts
            it (an export for that target).
        provider: ``model``'s provider, ``"openai"`` by default.
        reasoning: Whose reasoning :meth:`get_items` keeps when ``model`` is
            set: ``"same_model"`` (the default), ``"same_provider"`` or
            ``"none"``.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        *,
        client: AsyncClient,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        model: str | None = None,
        provider: str = "openai",
        reasoning: ReasoningPolicyLike = "same_model",
    ) -> None:
        self.provider = checked_provider(model, provider, reasoning)
        self.model = model
        self.reasoning = reasoning
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.client = client
        #: The sessionstore session id this session reads and writes.
        self.store_session_id = store_session_id(session_id)
        # Tool calls the store answered itself (a denied approval's tool
        # result, see load_decided_run): add_items leaves out the SDK's own
        # output for them, so each call keeps one output.
        self._answered_calls: set[str] = set()

    def __repr__(self) -> str:
        return f"SessionstoreSession({self.session_id!r}, store_session_id={self.store_session_id!r})"

    # -- reads ---------------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: Any = None
    ) -> list[TResponseInputItem]:
        """The conversation's items in order: the latest ``limit`` of them
        (``None``: ``session_settings.limit``, and when that is ``None`` too,
        all). ``limit`` 0 gives ``[]``; a negative limit gives all, as with
        ``SQLiteSession``. An unknown session has no items. (``wrapper``, the
        run's context the SDK passes, is not needed here.)"""
        effective = resolve_session_limit(limit, self.session_settings)
        if effective == 0:
            return []
        try:
            if effective is None or effective < 0:
                if self.model is not None:
                    return await self._items_for_model(self.model, None)
                return await self._items_after(None)
            if self.model is not None:
                return await self._items_for_model(self.model, effective)
            # Newest first, one page of `limit` for the common case; pages on
            # only past messages that are not items.
            latest: list[TResponseInputItem] = []
            async for stored in self.client.iter_messages(
                self.store_session_id,
                order_by="sequence desc",
                page_size=min(effective, _PAGE_SIZE),
            ):
                latest.extend(reversed(items_from_message(stored.message)))
                if len(latest) >= effective:
                    break
            latest.reverse()
            return latest[-effective:]
        except SessionNotFound:
            return []

    async def _items_after(self, after_sequence: int | None) -> list[TResponseInputItem]:
        items: list[TResponseInputItem] = []
        async for stored in self.client.iter_messages(
            self.store_session_id, after_sequence=after_sequence, page_size=_PAGE_SIZE
        ):
            items.extend(items_from_message(stored.message))
        return items

    async def _items_for_model(self, model: str, limit: int | None) -> list[TResponseInputItem]:
        """The items of an export for ``model``: reasoning of other models
        left out, and tool calls without results (:func:`_fit_to_export`)."""
        messages = await self.client.export_for(
            self.store_session_id,
            self.provider,
            model,
            reasoning=self.reasoning,
            max_messages=limit or 0,
        )
        items = [item for message in messages for item in _fit_to_export(message)]
        return items if limit is None else items[-limit:]

    # -- changes -------------------------------------------------------------

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Appends ``items`` in one ``AppendExchange`` (all or none), which
        creates the session if it does not exist (``create_if_missing``).
        ``TypeError`` before any RPC if an item is not JSON-serializable.
        The SDK's output for a call whose denial the store already answered
        (see :func:`load_decided_run`) is left out; with nothing else left,
        no RPC.
        ``wrapper`` is the run's context (``RunContextWrapper``), which the
        SDK passes: with ``model`` set, the provider call carries the tokens
        of the requests it holds that this session has not recorded yet."""
        batch = [
            cast(Mapping[str, Any], item)
            for item in items
            if not self._answered_by_store(cast(Mapping[str, Any], item))
        ]
        if not batch:
            return
        exchange: dict[str, Any] = {}
        first = next((index for index, item in enumerate(batch) if _from_model(item)), None)
        recorded: _Requests | None = None
        if self.model is None or first is None:
            exchange["messages"] = messages_from_items(batch)
        else:
            exchange["messages"] = messages_from_items(batch[:first])
            exchange["response_messages"] = messages_from_items(batch[first:])
            recorded = _Requests.unrecorded(wrapper, self.store_session_id)
            exchange["provider_call"] = {
                "provider": self.provider,
                "model": self.model,
                **(recorded.tokens() if recorded is not None else {}),
            }
        await _settle(self._append(exchange))
        if recorded is not None:
            recorded.mark_recorded()

    def _answered_by_store(self, item: Mapping[str, Any]) -> bool:
        """Whether ``item`` is the SDK's output for a tool call whose result
        the store already holds (a denial's, see :func:`load_decided_run`)."""
        return (
            bool(self._answered_calls)
            and item.get("type") == "function_call_output"
            and item.get("call_id") in self._answered_calls
        )

    async def _append(self, exchange: dict[str, Any]) -> None:
        await self.client.append_exchange(
            self.store_session_id,
            request_id=new_request_id(),
            create_if_missing=self._new_session(),
            **exchange,
        )

    def _new_session(self) -> v1.CreateSessionRequest:
        """The session the first ``add_items`` creates: titled with the SDK's
        id, which its metadata keeps whole (:data:`SESSION_ID_METADATA_KEY`)."""
        return v1.CreateSessionRequest(
            title=self.session_id[:200],
            metadata={SESSION_ID_METADATA_KEY: self.session_id},
        )

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Removes the latest item and returns it (``None`` if there is
        none): one ``RollbackSession(remove_last=1, return_removed=True)``,
        which takes whatever message is last when it runs. It carries a
        fresh request id, so the client's retry of a transient failure
        answers what the first attempt removed instead of popping twice."""
        return await _settle(self._pop())

    async def _pop(self) -> TResponseInputItem | None:
        while True:
            try:
                response = await self.client.rollback_session(
                    self.store_session_id,
                    remove_last=1,
                    return_removed=True,
                    request_id=str(uuid.uuid4()),
                )
            except SessionNotFound:
                return None
            if not response.removed_messages:
                return None  # the session is empty
            for removed in response.removed_messages:
                items = items_from_message(removed.message)
                if items:
                    return items[-1]
            if response.next_sequence <= 0:
                return None
            # It held no item (another client's message): pop the next one.

    async def clear_session(self, *, wrapper: Any = None) -> None:
        """Removes every item (one ``RollbackSession(after_sequence=-1)``);
        the stored session stays, empty."""
        await _settle(self._clear())

    async def _clear(self) -> None:
        try:
            await self.client.rollback_session(self.store_session_id, after_sequence=-1)
        except SessionNotFound:
            pass


# -- durable tool approvals ----------------------------------------------------

#: Where a paused run's snapshot is kept: session state entries
#: ``RUN_STATE_KEY_PREFIX + <run key> + "." + <n>``, the chunks of its text.
RUN_STATE_KEY_PREFIX = "openai_agents.run_state."
#: The key of an approval's ``detail_json`` naming the paused run it belongs
#: to: ``{"run": <run key>, "chunks": <n>, "sha256": <the snapshot's digest>}``.
APPROVAL_DETAIL_KEY = "openai_agents_run"

#: A state value holds at most 64 KiB: a snapshot is split into chunks of this
#: many (ASCII) characters.
_CHUNK_CHARS = 60_000
_TITLE_BYTES = 1024
#: A call's arguments shown in the approval's detail_json (at most 64 KiB),
#: cut to this many characters.
_ARGUMENTS_CHARS = 16_384
_SNAPSHOT_FORMAT = 1


@dataclass(frozen=True)
class _RunRef:
    """The paused run an approval belongs to (its detail's
    :data:`APPROVAL_DETAIL_KEY`)."""

    run: str
    chunks: int
    sha256: str

    def key(self, chunk: int) -> str:
        return f"{RUN_STATE_KEY_PREFIX}{self.run}.{chunk}"

    def as_detail(self) -> dict[str, Any]:
        return {"run": self.run, "chunks": self.chunks, "sha256": self.sha256}

    @classmethod
    def of(cls, approval: v1.Approval) -> _RunRef | None:
        """The run an approval this module requested names; ``None`` for
        any other approval."""
        try:
            detail = json.loads(approval.detail_json) if approval.detail_json else None
        except ValueError:
            return None
        ref = detail.get(APPROVAL_DETAIL_KEY) if isinstance(detail, dict) else None
        if not isinstance(ref, dict):
            return None
        run, chunks, digest = ref.get("run"), ref.get("chunks"), ref.get("sha256")
        if not (isinstance(run, str) and isinstance(chunks, int) and isinstance(digest, str)):
            return None
        if chunks < 1:
            return None
        return cls(run, chunks, digest)


def _call_id(item: ToolApprovalItem) -> str:
    """The id of the tool call an interruption asks about."""
    raw = item.raw_item
    for name in ("call_id", "id"):
        value = raw.get(name) if isinstance(raw, Mapping) else getattr(raw, name, None)
        if isinstance(value, str) and value:
            return value
    raise ValueError(f"the interruption for tool {item.name!r} names no tool call id")


def _arguments(item: ToolApprovalItem) -> Any:
    """The call's arguments as the decider is shown them: parsed JSON when
    they parse, else the text (cut to ``_ARGUMENTS_CHARS``)."""
    raw = item.raw_item
    value = raw.get("arguments") if isinstance(raw, Mapping) else getattr(raw, "arguments", None)
    if not isinstance(value, str):
        return None
    if len(value) > _ARGUMENTS_CHARS:
        return value[:_ARGUMENTS_CHARS] + "…"
    try:
        return json.loads(value)
    except ValueError:
        return value


def _title(item: ToolApprovalItem) -> str:
    encoded = (item.name or "tool call").encode("utf-8")[:_TITLE_BYTES]
    return encoded.decode("utf-8", errors="ignore")


def _snapshot(
    result: RunResult | RunResultStreaming,
    context_serializer: Any,
    strict_context: bool,
) -> tuple[_RunRef, list[str]]:
    """The paused run's snapshot (the SDK's ``RunState`` JSON, with what the
    session recorded of the run's usage) as state values, and its reference."""
    state = result.to_state()
    recorded = getattr(result.context_wrapper, _RECORDED_ATTRIBUTE, None)
    envelope = {
        "format": _SNAPSHOT_FORMAT,
        "state": state.to_json(context_serializer=context_serializer, strict_context=strict_context),
        "recorded_requests": dict(recorded) if isinstance(recorded, dict) else {},
    }
    raw = json.dumps(envelope, separators=(",", ":")).encode("ascii")
    digest = hashlib.sha256(raw).hexdigest()
    text = base64.b64encode(zlib.compress(raw, 9)).decode("ascii")
    chunks = [text[start : start + _CHUNK_CHARS] for start in range(0, len(text), _CHUNK_CHARS)]
    # The run key is the digest's: asking again for the same paused run
    # (a retry after a failure) writes the same entries and finds its own
    # approvals.
    return _RunRef(run=digest[:32], chunks=len(chunks), sha256=digest), chunks


async def request_approvals(
    session: SessionstoreSession,
    result: RunResult | RunResultStreaming,
    *,
    expire_time: TimeLike | None = None,
    run_id: str = "",
    context_serializer: Any = None,
    strict_context: bool = False,
) -> list[v1.Approval]:
    """Makes the approvals a paused run waits for durable: one stored
    approval per interruption of ``result`` (the result of ``Runner.run`` /
    ``Runner.run_streamed`` with ``session``; its ``interruptions`` are the
    SDK's ``ToolApprovalItem`` objects), answered in their order.

    First the run's snapshot (``result.to_state().to_json()``, compressed)
    is written to the session's state under :data:`RUN_STATE_KEY_PREFIX`
    (one ``SetState`` per 60,000 characters of it, usually one). Then each
    interruption is one ``RequestApproval``: ``tool_call_id`` the call's id
    (the ``function_call`` the SDK stored in the session before it paused),
    ``title`` the tool's name, ``detail_json`` ``{"tool", "agent",
    "arguments", "openai_agents_run": {"run", "chunks", "sha256"}}``: what
    the decider is shown, and the snapshot it belongs to. ``expire_time``
    and ``run_id`` are passed on (``run_id`` is needed only while a run of
    yours holds the session's lease).

    Anyone can then decide them (``decide_approval``, the CLI, a UI), and
    :func:`load_decided_run` / :func:`resume` continue the run in any
    process, through the SDK's own ``RunState``. Asking again for the same
    paused run answers the approvals already asked for. No interruptions:
    ``[]``, no RPC.

    The server refuses (``UnknownToolCall``) a call the session's history
    does not hold: approvals of function tools the session's run calls are
    what this keeps, not those of a nested agent run (``Agent.as_tool``),
    whose calls never reach the session. ``context_serializer`` and
    ``strict_context`` are ``RunState.to_json``'s, for a run context that is
    not a mapping.
    """
    interruptions = list(result.interruptions)
    if not interruptions:
        return []
    calls = [_call_id(item) for item in interruptions]  # ValueError before any RPC
    ref, chunks = _snapshot(result, context_serializer, strict_context)
    client, sid = session.client, session.store_session_id
    # The first chunk last: a loader that finds it finds the others.
    for index in [*range(1, len(chunks)), 0]:
        await client.set_state(sid, key=ref.key(index), value=chunks[index])
    approvals: list[v1.Approval] = []
    for item, call in zip(interruptions, calls):
        detail = {
            "tool": item.name,
            "agent": getattr(item.agent, "name", None),
            "arguments": _arguments(item),
            APPROVAL_DETAIL_KEY: ref.as_detail(),
        }
        try:
            response = await client.request_approval(
                sid,
                tool_call_id=call,
                title=_title(item),
                detail_json=json.dumps(detail, ensure_ascii=False),
                run_id=run_id,
                expire_time=expire_time,
            )
            approvals.append(response.approval)
        except ApprovalExists as error:
            existing = await client.get_approval(sid, approval_id=error.approval_id)
            if _RunRef.of(existing) != ref:
                raise  # another paused run asks about this call
            approvals.append(existing)
    return approvals


@dataclass
class _PausedRun:
    ref: _RunRef
    approvals: list[v1.Approval]
    first_chunk: v1.StateEntry


async def _paused_run(client: AsyncClient, sid: str) -> _PausedRun | None:
    """The session's newest paused run whose snapshot is still there (not
    yet taken by a loader), with its approvals."""
    groups: dict[_RunRef, list[v1.Approval]] = {}
    async for approval in client.iter_approvals(session_id=sid):
        ref = _RunRef.of(approval)
        if ref is not None:
            groups.setdefault(ref, []).append(approval)
    for ref in reversed(list(groups)):
        try:
            first = await client.get_state(sid, key=ref.key(0))
        except StateNotFound:
            continue  # taken (resumed), or never fully written
        return _PausedRun(ref, groups[ref], first)
    return None


async def _until_decided(
    client: AsyncClient, sid: str, after_revision: int, pending: set[str]
) -> None:
    """Returns once every approval of ``pending`` is decided or expired (the
    session's ``approval_decided`` events after ``after_revision``)."""
    async with client.watch(sid, after_revision=after_revision) as events:
        async for event in events:
            if event.WhichOneof("event") == "approval_decided":
                pending.discard(event.approval_decided.approval.approval_id)
                if not pending:
                    return


async def _read_snapshot(client: AsyncClient, sid: str, paused: _PausedRun) -> dict[str, Any]:
    """The snapshot's envelope, checked against the digest its approvals
    recorded."""
    ref = paused.ref
    rest = await asyncio.gather(
        *(client.get_state(sid, key=ref.key(index)) for index in range(1, ref.chunks))
    )
    text = paused.first_chunk.value + "".join(entry.value for entry in rest)
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (ValueError, zlib.error):
        raw = b""
    if hashlib.sha256(raw).hexdigest() != ref.sha256:
        raise ValueError(
            f"the stored snapshot of paused run {ref.run} is not the one its approvals "
            "were asked for (its state entries were changed)"
        )
    envelope = json.loads(raw)
    if not isinstance(envelope, dict) or envelope.get("format") != _SNAPSHOT_FORMAT:
        raise ValueError(f"paused run {ref.run}: unknown snapshot format")
    return envelope


async def load_decided_run(
    session: SessionstoreSession,
    agent: Agent[Any],
    *,
    wait: bool = False,
    timeout: float | None = None,
    expired_message: str | None = None,
    context_override: Any = None,
    context_deserializer: Any = None,
    strict_context: bool = False,
) -> RunState[Any, Agent[Any]] | None:
    """The session's paused run, rebuilt from the store alone with its
    approvals' decisions applied, for ``Runner.run(agent, state,
    session=session)`` to continue; ``None`` when there is none to continue.

    It finds the newest run :func:`request_approvals` recorded for the
    session (``ListApprovals`` of the session) whose snapshot is still in the
    session's state. While any of its approvals is pending it answers
    ``None``, or with ``wait`` waits for the decisions (watching the
    session's ``approval_decided`` events; ``None`` if ``timeout`` seconds
    pass first). Then it rebuilds the SDK's ``RunState`` (``RunState.from_json``
    with ``agent``, the run's starting agent, and ``context_override`` /
    ``context_deserializer`` / ``strict_context``, passed on), and for each
    interruption decides as recorded:

    - approved: ``state.approve(item)``: the tool runs when the run goes on;
    - denied: ``state.reject(item, rejection_message=approval.reason)``. The
      server already stored the call's tool result (the reason, as
      ``DecideApproval`` does for a denial); the SDK's output for the call
      says the same, and ``session`` leaves it out when the run saves its
      items, so the call has one output, as in the SDK's own sessions (it
      was stored when the call was denied, so before the outputs of calls
      paused with it that run now). Give the denial a reason: it is what
      the model reads;
    - expired: ``state.reject(item, rejection_message=expired_message)``
      (``None``: the SDK's default text, or the run's
      ``tool_error_formatter``); the SDK stores that output.

    An interruption with no approval recorded is left undecided (the
    resumed run pauses on it again).

    The run is taken once: the snapshot's first state entry is deleted with
    its version (``DeleteState`` with ``expected_version``), and a loader
    that loses that race, or comes later, gets ``None``; the other entries
    are then deleted too. So a decided call runs at most once, however many
    processes try to resume it; if the process that took the run dies before
    the run ends, the run is not continued (the session's history keeps
    what the run stored).

    Resume with this same ``session`` object: it is the one that knows which
    denied calls the store answered. A snapshot whose digest is not the one
    the approvals recorded (its state entries changed) raises
    ``ValueError``. The snapshot is as trustworthy as the store: the SDK
    resumes what it holds.
    """
    client, sid = session.client, session.store_session_id
    while True:
        try:
            revision = (await client.get_session(sid)).revision if wait else 0
            paused = await _paused_run(client, sid)
        except SessionNotFound:
            return None
        if paused is None:
            return None
        pending = {
            approval.approval_id
            for approval in paused.approvals
            if approval.state == v1.APPROVAL_STATE_PENDING
        }
        if not pending:
            break
        if not wait:
            return None
        try:
            await asyncio.wait_for(_until_decided(client, sid, revision, pending), timeout)
        except asyncio.TimeoutError:
            return None
        except SessionNotFound:
            return None

    envelope = await _read_snapshot(client, sid, paused)
    state = await RunState.from_json(
        agent,
        envelope["state"],
        context_override=context_override,
        context_deserializer=context_deserializer,
        strict_context=strict_context,
    )
    decisions = {approval.tool_call_id: approval for approval in paused.approvals}
    answered: set[str] = set()
    for item in state.get_interruptions():
        approval = decisions.get(_call_id(item))
        if approval is None:
            continue
        if approval.state == v1.APPROVAL_STATE_APPROVED:
            state.approve(item)
        elif approval.state == v1.APPROVAL_STATE_DENIED:
            state.reject(item, rejection_message=approval.reason)
            answered.add(approval.tool_call_id)
        elif approval.state == v1.APPROVAL_STATE_EXPIRED:
            state.reject(item, rejection_message=expired_message)

    # Take the run: one loader wins.
    try:
        await client.delete_state(
            sid, key=paused.ref.key(0), expected_version=paused.first_chunk.version
        )
    except (StateNotFound, StateVersionMismatch):
        return None
    await asyncio.gather(
        *(
            _forget(client, sid, paused.ref.key(index))
            for index in range(1, paused.ref.chunks)
        )
    )
    session._answered_calls.update(answered)
    # What the session recorded of the run's model requests (the snapshot
    # keeps their usage), so the resumed run's appends record only new ones.
    recorded = envelope.get("recorded_requests")
    wrapper = getattr(state, "_context", None)
    if isinstance(recorded, dict) and recorded and wrapper is not None:
        try:
            setattr(wrapper, _RECORDED_ATTRIBUTE, dict(recorded))
        except (AttributeError, TypeError):  # pragma: no cover - a context without attributes
            pass
    return state


async def _forget(client: AsyncClient, sid: str, key: str) -> None:
    """Deletes a state entry of a taken snapshot; one left behind (a failed
    call) is only unused data."""
    try:
        await client.delete_state(sid, key=key)
    except SessionstoreError:
        pass


async def resume(
    session: SessionstoreSession,
    agent: Agent[Any],
    *,
    wait: bool = False,
    timeout: float | None = None,
    expired_message: str | None = None,
    context_override: Any = None,
    context_deserializer: Any = None,
    strict_context: bool = False,
    **run_kwargs: Any,
) -> RunResult | None:
    """Continues the session's paused run once its approvals are decided:
    :func:`load_decided_run` (``None`` when there is none to continue, or
    its approvals are still pending and ``wait`` is false), then
    ``Runner.run(agent, state, session=session, **run_kwargs)``
    (``run_config``, ``max_turns``, ``hooks``, …). If the resumed run pauses
    again, pass its result to :func:`request_approvals`."""
    state = await load_decided_run(
        session,
        agent,
        wait=wait,
        timeout=timeout,
        expired_message=expired_message,
        context_override=context_override,
        context_deserializer=context_deserializer,
        strict_context=strict_context,
    )
    if state is None:
        return None
    return await Runner.run(agent, state, session=session, **run_kwargs)
