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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

from .. import v1
from .._errors import SessionNotFound
from .._requests import ReasoningPolicyLike, new_request_id
from ..aio import AsyncClient
from ._models import checked_provider

try:
    from agents.items import TResponseInputItem
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "sessionstore.integrations.openai_agents needs the OpenAI Agents SDK: "
        'pip install "sessionstore-client[openai-agents]"'
    ) from error

__all__ = [
    "ITEM_BLOCK_TYPE",
    "SESSION_ID_METADATA_KEY",
    "SessionstoreSession",
    "item_from_message",
    "items_from_message",
    "message_from_item",
    "messages_from_items",
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
        ``wrapper`` is the run's context (``RunContextWrapper``), which the
        SDK passes: with ``model`` set, the provider call carries the tokens
        of the requests it holds that this session has not recorded yet."""
        batch = [cast(Mapping[str, Any], item) for item in items]
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
