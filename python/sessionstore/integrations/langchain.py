"""LangChain chat message history backed by sessionstore.

:class:`SessionstoreChatMessageHistory` is a
``langchain_core.chat_history.BaseChatMessageHistory`` whose messages live in
a sessionstore session::

    from sessionstore import Client
    from sessionstore.integrations.langchain import SessionstoreChatMessageHistory

    client = Client("http://127.0.0.1:50051")
    history = SessionstoreChatMessageHistory("user-42/chat 7", client=client)
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    history.messages  # read back from the server, equal to what was added

The history keeps no data of its own: every read asks the server, and every
framework call that is one change is one RPC:

- ``add_messages`` (and ``add_message``, ``add_user_message``, … through the
  base class) is one ``AppendExchange`` carrying all the messages, with a
  ``request_id`` so the client's retries store them once. The session is made
  lazily: when the append finds no session, ``CreateSession`` makes it
  (``AlreadyExists`` from a concurrent writer is fine) and the same append is
  sent again, with the same ``request_id``.
- ``clear`` is one ``RollbackSession(after_sequence=-1)``; the session itself
  stays (clearing a session that does not exist does nothing).
- ``messages`` is one ``ExportHistory`` stream; a session that does not exist
  yet reads as ``[]``.

**Storage.** Each LangChain message is stored as one sessionstore message
whose native fields are filled in (role, the text as ``content``, the tool
calls of an ``AIMessage``, ``tool_call_id``/``tool_error`` of a
``ToolMessage``, ``name``), so transcripts, search and other clients see a
real conversation, and which also carries the message verbatim, as
``langchain_core.messages.message_to_dict`` JSON, in a ``JsonBlock`` of type
:data:`JSON_BLOCK_TYPE`. Reading back uses that JSON, so every message kind
and field (tool calls, invalid tool calls, usage and response metadata,
additional kwargs, ids, artifacts, statuses, custom chat roles, lists of
content blocks, U+0000 …) comes back ``==`` to what was added. A message
that cannot be kept exactly as JSON (an artifact that is not JSON, a NaN, a
tuple …) is refused with ``ValueError`` before anything is sent. Messages
written by other clients (no such block), and redacted ones, are read from
their native fields. The block is left out of OpenAI JSON transcripts and of
search, but Markdown transcripts show it (as any JSON block) after the text.
Native mapping: human → user, ai → assistant, system → system, tool and
function → tool, a ``ChatMessage`` by its role (``user``/``human``,
``assistant``/``ai``, ``system``, ``tool``, ``developer``; any other role →
user); only valid ``tool_calls`` become native tool calls.

**Session ids.** LangChain session ids are free-form strings; sessionstore
ids are 1–128 of ``A-Z a-z 0-9 _ - . :``. :func:`to_store_session_id` maps
one onto the other: ``"lc:"`` followed by the id's UTF-8 bytes, where
letters, digits, ``_``, ``-`` and ``.`` stand for themselves and every other
byte is ``:`` and two upper-case hex digits (so ``a/b`` is ``lc:a:2Fb``).
The map is injective and :func:`from_store_session_id` reverses it. When the
result would be longer than 128 characters, the id is ``"lch:"`` followed by
the SHA-256 hex digest of the UTF-8 bytes instead (68 characters; distinct
ids collide only if SHA-256 does), which cannot be reversed by itself: the
original is kept in the session's metadata under
:data:`SESSION_ID_METADATA_KEY` (every session this module creates has it).

**Sync and async.** Sync methods use ``client`` and async ones use
``async_client``. With only ``client``, the async methods run the sync calls
in a worker thread (``asyncio.to_thread``), so they never block the event
loop; with only ``async_client``, the sync methods raise ``RuntimeError``
(an asyncio client cannot be driven from synchronous code safely).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        message_to_dict,
        messages_from_dict,
    )
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sessionstore.integrations.langchain needs langchain-core: "
        'pip install "sessionstore-client[langchain]"'
    ) from error

from .._errors import AlreadyExists, SessionNotFound
from .._proto.sessionstore.v1 import messages_pb2 as m
from ..aio import AsyncClient
from ..client import Client

__all__ = [
    "JSON_BLOCK_TYPE",
    "SESSION_ID_METADATA_KEY",
    "SessionstoreChatMessageHistory",
    "from_store_session_id",
    "message_from_store",
    "message_to_store",
    "to_store_session_id",
]

#: The ``JsonBlock.type`` of the block holding a LangChain message verbatim.
JSON_BLOCK_TYPE = "langchain.message"
#: Session metadata key holding the LangChain session id a session was made for.
SESSION_ID_METADATA_KEY = "langchain.session_id"
#: Message metadata key holding the LangChain message type (``human``, ``ai`` …).
MESSAGE_TYPE_METADATA_KEY = "langchain.type"

MAX_SESSION_ID_LEN = 128
_PREFIX = "lc:"
_DIGEST_PREFIX = "lch:"
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_ESCAPED = re.compile(r"[A-Za-z0-9_.\-]|:[0-9A-F]{2}")

_ROLE_OF_TYPE = {
    "human": m.ROLE_USER,
    "ai": m.ROLE_ASSISTANT,
    "system": m.ROLE_SYSTEM,
    "tool": m.ROLE_TOOL,
    "function": m.ROLE_TOOL,
}
_ROLE_OF_CHAT_ROLE = {
    "user": m.ROLE_USER,
    "human": m.ROLE_USER,
    "assistant": m.ROLE_ASSISTANT,
    "ai": m.ROLE_ASSISTANT,
    "system": m.ROLE_SYSTEM,
    "tool": m.ROLE_TOOL,
    "developer": m.ROLE_DEVELOPER,
}


# -- session ids -------------------------------------------------------------


def to_store_session_id(session_id: str) -> str:
    """The sessionstore session id for a LangChain session id.

    ``"lc:"`` plus the escaped UTF-8 bytes (letters, digits, ``_ - .`` as
    they are, any other byte as ``:XX``), or, when that is longer than 128
    characters, ``"lch:"`` plus the SHA-256 hex digest of the UTF-8 bytes.
    """
    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str, not {type(session_id).__name__}")
    data = session_id.encode("utf-8")
    escaped = _PREFIX + "".join(chr(b) if b in _PLAIN else f":{b:02X}" for b in data)
    if len(escaped) <= MAX_SESSION_ID_LEN:
        return escaped
    return _DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def from_store_session_id(store_id: str) -> str:
    """The LangChain session id a :func:`to_store_session_id` result stands for.

    Raises ``ValueError`` for a digest id (``lch:…``: look the original up in
    the session's metadata, :data:`SESSION_ID_METADATA_KEY`) and for ids this
    module does not make.
    """
    if store_id.startswith(_DIGEST_PREFIX):
        raise ValueError(
            f"{store_id!r} is a digest of a long session id; the original is in the "
            f"session's metadata under {SESSION_ID_METADATA_KEY!r}"
        )
    if not store_id.startswith(_PREFIX):
        raise ValueError(f"{store_id!r} is not a LangChain session id (no {_PREFIX!r} prefix)")
    body = store_id[len(_PREFIX) :]
    data = bytearray()
    position = 0
    while position < len(body):
        token = _ESCAPED.match(body, position)
        if token is None:
            raise ValueError(f"{store_id!r} is not a valid escaped session id")
        text = token.group()
        data += bytes([int(text[1:], 16)]) if len(text) == 3 else text.encode("ascii")
        position = token.end()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{store_id!r} does not escape UTF-8 text") from error


# -- messages ----------------------------------------------------------------


def _text_of(content: Any) -> str:
    """The plain text of a message's content: the string itself, or the text
    of its text blocks (and bare strings) joined without separators."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                text = block.get("text")
                if isinstance(text, str):
                    parts.append(text)
    return "".join(parts)


def _encode(message: BaseMessage) -> str:
    """The message as JSON that reads back ``==`` to it, or ``ValueError``."""
    try:
        text = json.dumps(message_to_dict(message), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"cannot store a {type(message).__name__} exactly: it does not serialise to JSON "
            f"({error})"
        ) from error
    if messages_from_dict([json.loads(text)])[0] != message:
        raise ValueError(
            f"cannot store a {type(message).__name__} exactly: it does not read back equal "
            "from JSON (tuples, non-string keys or other values JSON does not keep?)"
        )
    return text


def message_to_store(message: BaseMessage) -> m.Message:
    """The sessionstore message for a LangChain message: native fields filled
    in, plus the message verbatim in a ``JsonBlock`` (:data:`JSON_BLOCK_TYPE`).
    """
    if not isinstance(message, BaseMessage):
        raise TypeError(f"expected a BaseMessage, not {type(message).__name__}")
    kind = message.type
    if isinstance(message, ChatMessage):
        role = _ROLE_OF_CHAT_ROLE.get(message.role.lower(), m.ROLE_USER)
    else:
        role = _ROLE_OF_TYPE.get(kind, m.ROLE_USER)
    stored = m.Message(
        role=role,
        content=_text_of(message.content),
        name=message.name or "",
        metadata={MESSAGE_TYPE_METADATA_KEY: kind},
    )
    if isinstance(message, AIMessage):
        for call in message.tool_calls:
            stored.tool_calls.append(
                m.ToolCall(
                    id=call.get("id") or "",
                    name=call["name"],
                    arguments=json.dumps(call["args"], ensure_ascii=False),
                )
            )
    if isinstance(message, ToolMessage):
        stored.tool_call_id = message.tool_call_id
        stored.tool_error = message.status == "error"
    stored.content_blocks.append(
        m.ContentBlock(json=m.JsonBlock(type=JSON_BLOCK_TYPE, json=_encode(message)))
    )
    return stored


def message_from_store(stored: m.Message) -> BaseMessage:
    """The LangChain message a stored message holds: the verbatim copy when
    it has one, else one built from the native fields (messages written by
    other clients, or redacted ones)."""
    for block in stored.content_blocks:
        if block.WhichOneof("block") == "json" and block.json.type == JSON_BLOCK_TYPE:
            try:
                return messages_from_dict([json.loads(block.json.json)])[0]
            except (ValueError, KeyError, TypeError):
                break  # erased (redacted) or damaged: use the native fields
    return _from_native(stored)


def _from_native(stored: m.Message) -> BaseMessage:
    name = stored.name or None
    if stored.role == m.ROLE_USER:
        return HumanMessage(content=stored.content, name=name)
    if stored.role == m.ROLE_SYSTEM:
        return SystemMessage(content=stored.content, name=name)
    if stored.role == m.ROLE_DEVELOPER:
        return ChatMessage(content=stored.content, role="developer", name=name)
    if stored.role == m.ROLE_TOOL:
        return ToolMessage(
            content=stored.content,
            tool_call_id=stored.tool_call_id,
            status="error" if stored.tool_error else "success",
            name=name,
        )
    tool_calls: list[dict[str, Any]] = []
    invalid_tool_calls: list[dict[str, Any]] = []
    for call in stored.tool_calls:
        try:
            args = json.loads(call.arguments) if call.arguments else {}
        except ValueError as error:
            args = None
            invalid_tool_calls.append(
                {"name": call.name, "args": call.arguments, "id": call.id or None,
                 "error": str(error), "type": "invalid_tool_call"}
            )
        if isinstance(args, dict):
            tool_calls.append(
                {"name": call.name, "args": args, "id": call.id or None, "type": "tool_call"}
            )
        elif args is not None:
            invalid_tool_calls.append(
                {"name": call.name, "args": call.arguments, "id": call.id or None,
                 "error": "arguments are not a JSON object", "type": "invalid_tool_call"}
            )
    return AIMessage(
        content=stored.content,
        name=name,
        tool_calls=tool_calls,
        invalid_tool_calls=invalid_tool_calls,
    )


# -- the history -------------------------------------------------------------


class SessionstoreChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat message history stored in a sessionstore session.

    Args:
        session_id: The LangChain session id (any string); the sessionstore
            session is :func:`to_store_session_id` of it (``store_session_id``).
        client: The blocking client the sync methods use.
        async_client: The asyncio client the async methods use.

    At least one client is required (``TypeError`` otherwise). With only
    ``client``, async methods run it in a worker thread; with only
    ``async_client``, sync methods raise ``RuntimeError``. The clients are
    not closed by the history.
    """

    def __init__(
        self,
        session_id: str,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
    ) -> None:
        if client is None and async_client is None:
            raise TypeError(
                "SessionstoreChatMessageHistory needs a client: pass client=Client(...) "
                "and/or async_client=AsyncClient(...)"
            )
        if client is not None and not isinstance(client, Client):
            raise TypeError(f"client must be a sessionstore.Client, not {type(client).__name__}")
        if async_client is not None and not isinstance(async_client, AsyncClient):
            raise TypeError(
                "async_client must be a sessionstore.AsyncClient, "
                f"not {type(async_client).__name__}"
            )
        self.session_id = session_id
        self.store_session_id = to_store_session_id(session_id)
        self.client = client
        self.async_client = async_client

    def __repr__(self) -> str:
        return f"SessionstoreChatMessageHistory({self.session_id!r})"

    # -- plumbing ---------------------------------------------------------

    def _sync(self) -> Client:
        if self.client is None:
            raise RuntimeError(
                "this SessionstoreChatMessageHistory has only an async_client: use the async "
                "methods (aget_messages, aadd_messages, aclear) or pass client=Client(...)"
            )
        return self.client

    def _session_metadata(self) -> dict[str, str]:
        return {SESSION_ID_METADATA_KEY: self.session_id}

    # -- reads ------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's messages, read from the server (``[]`` if it has none yet)."""
        try:
            stored = self._sync().export_history(self.store_session_id)
        except SessionNotFound:
            return []
        return [message_from_store(message) for message in stored]

    async def aget_messages(self) -> list[BaseMessage]:
        """The session's messages, read from the server (``[]`` if it has none yet)."""
        if self.async_client is None:
            return await asyncio.to_thread(lambda: self.messages)
        try:
            stored = await self.async_client.export_history(self.store_session_id)
        except SessionNotFound:
            return []
        return [message_from_store(message) for message in stored]

    # -- writes -----------------------------------------------------------

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Appends ``messages`` in one ``AppendExchange`` (one revision),
        creating the session first if it does not exist."""
        batch = [message_to_store(message) for message in messages]
        if not batch:
            return
        client = self._sync()
        request_id = str(uuid.uuid4())
        try:
            client.append_exchange(self.store_session_id, messages=batch, request_id=request_id)
            return
        except SessionNotFound:
            pass
        try:
            client.create_session(
                session_id=self.store_session_id, metadata=self._session_metadata()
            )
        except AlreadyExists:
            pass  # another writer made it first
        client.append_exchange(self.store_session_id, messages=batch, request_id=request_id)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages`."""
        if self.async_client is None:
            await asyncio.to_thread(self.add_messages, list(messages))
            return
        batch = [message_to_store(message) for message in messages]
        if not batch:
            return
        client = self.async_client
        request_id = str(uuid.uuid4())
        try:
            await client.append_exchange(
                self.store_session_id, messages=batch, request_id=request_id
            )
            return
        except SessionNotFound:
            pass
        try:
            await client.create_session(
                session_id=self.store_session_id, metadata=self._session_metadata()
            )
        except AlreadyExists:
            pass
        await client.append_exchange(self.store_session_id, messages=batch, request_id=request_id)

    def clear(self) -> None:
        """Removes every message in one ``RollbackSession(after_sequence=-1)``.
        The session stays; clearing a session that does not exist does nothing."""
        try:
            self._sync().rollback_session(self.store_session_id, after_sequence=-1)
        except SessionNotFound:
            pass

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        if self.async_client is None:
            await asyncio.to_thread(self.clear)
            return
        try:
            await self.async_client.rollback_session(self.store_session_id, after_sequence=-1)
        except SessionNotFound:
            pass
