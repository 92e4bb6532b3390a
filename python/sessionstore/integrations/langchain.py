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
  ``request_id`` so the client's retries store them once (a batch holding
  several model answers is one per answer, below). The session is made
  lazily, by the append itself: it carries ``create_if_missing`` (the
  session's metadata, see *Session ids*), so the server creates a missing
  session in the same call and transaction, once however many writers race
  to make it.
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
user); only valid ``tool_calls`` become native tool calls. An ``AIMessage``'s
reasoning is stored natively too: thinking blocks with their signatures,
redacted thinking, OpenAI reasoning items (content blocks of type
``reasoning``, or ``additional_kwargs["reasoning"]``) as ``reasoning`` JSON
blocks, LangChain's standard reasoning blocks as thinking blocks, and the
Gemini integrations' function-call thought signatures
(:data:`GEMINI_SIGNATURES_KEY`) as the tool calls' ``signature``.

**Which model said it.** An ``AIMessage`` whose model is known is stored as
the response of a provider call of that model: ``response_metadata``'s
``model_provider`` and ``model_name`` (see :func:`message_origin`), or the
history's ``model`` when the message names none. The call carries the
message's ``usage_metadata`` (tokens, cache reads and writes, reasoning
tokens) and ``response_metadata["id"]`` as its request id, so SummarizeUsage
and ListProviderCalls see it. Each such answer is its own ``AppendExchange``
(the messages before it are its input), so a batch with two answers is two
RPCs, in order; a failure raises after the ones before it are stored, and
each carries its own ``request_id``, so retries store each once.

**Switching models.** Give the history the model the conversation goes to
next (``model="openai/gpt-5"``) and ``messages`` reads an export for that
target (``ExportHistory`` with ``ExportTarget``): reasoning another model
made is left out (``reasoning="same_provider"`` keeps the provider's other
models', ``"none"`` keeps none), messages left with only reasoning are
skipped, and a tool call without its result (or a result without its call)
is dropped, the last answer's pending calls excepted. The server decides;
the verbatim copy is then fitted to what it sent (:func:`fit_to_export`),
so a Claude conversation continued on GPT carries no Claude thinking, and
the same Claude model gets its signed thinking back byte for byte. Nothing
stored changes: another history on the same session with another ``model``
reads its own view.

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

**Approvals, and why LangGraph's interrupts are out of reach.** The tool
calls of a stored ``AIMessage`` are the session's native tool calls, so the
plain client asks for a person's decision on one
(``client.request_approval(history.store_session_id, tool_call_id=...)``)
and anyone decides it (``decide_approval``, ``sessions approve``/``deny``).
A denial stores the call's result on the server, which ``messages`` reads
as ``ToolMessage(reason, tool_call_id=..., status="error", name=TOOL)``: do
not add one of your own for that call. An approval adds nothing; the
tool's ``ToolMessage`` is added as usual. The history itself asks for and
decides nothing, because no pause passes through it: LangChain hands a
``BaseChatMessageHistory`` the messages to add and asks it for the
messages, and never tells it that a tool is about to run.
``RunnableWithMessageHistory`` has no pause at all; LangGraph's
``interrupt()`` (and LangChain's ``HumanInTheLoopMiddleware``, built on
it) stops a node, and the graph's *checkpointer* (a ``langgraph``
``BaseCheckpointSaver``) records the pending interrupt among its
checkpoint's writes and matches ``Command(resume=...)`` to it by thread. A
chat message history is not a checkpointer and never sees either; this
package has none (and does not depend on ``langgraph``). What works is the
caller asking around the interrupt, with the call stored here so that it
can be approved (the README's "LangChain and LangGraph: approvals around
interrupts" has the example); the pause itself stays in the graph's own
checkpointer, which must be a durable one for another process to resume.
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

from .._errors import SessionNotFound
from .._proto.sessionstore.v1 import messages_pb2 as m
from .._proto.sessionstore.v1 import sessionstore_pb2 as s
from .._requests import ReasoningPolicyLike, reasoning_policy
from ._models import has_reasoning, provider_of_model
from ..aio import AsyncClient
from ..client import Client

__all__ = [
    "GEMINI_SIGNATURES_KEY",
    "JSON_BLOCK_TYPE",
    "SESSION_ID_METADATA_KEY",
    "SessionstoreChatMessageHistory",
    "fit_to_export",
    "from_store_session_id",
    "message_from_store",
    "message_origin",
    "message_to_store",
    "provider_name",
    "to_store_session_id",
]

#: The ``JsonBlock.type`` of the block holding a LangChain message verbatim.
JSON_BLOCK_TYPE = "langchain.message"
#: Session metadata key holding the LangChain session id a session was made for.
SESSION_ID_METADATA_KEY = "langchain.session_id"
#: Message metadata key holding the LangChain message type (``human``, ``ai`` …).
MESSAGE_TYPE_METADATA_KEY = "langchain.type"

#: The ``additional_kwargs`` key under which LangChain's Gemini integrations
#: keep function calls' thought signatures (a map from call id to signature).
GEMINI_SIGNATURES_KEY = "__gemini_function_call_thought_signatures__"

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


# -- reasoning and origins ---------------------------------------------------

#: LangChain's ``model_provider`` names that sessionstore records otherwise
#: (the provider names its request-body formats default to).
_PROVIDER_NAMES = {"google_genai": "google", "google_vertexai": "google"}
#: Content blocks that stand for a tool call, and the key of their call id.
_CALL_BLOCK_ID = {"tool_use": "id", "tool_call": "id", "function_call": "call_id"}


def provider_name(provider: str) -> str:
    """The provider name sessionstore records for a LangChain provider name:
    lower case, with ``google_genai`` and ``google_vertexai`` as ``google``."""
    name = provider.strip().lower()
    return _PROVIDER_NAMES.get(name, name)


def message_origin(
    message: BaseMessage, default: tuple[str, str] | None = None
) -> tuple[str, str] | None:
    """The ``(provider, model)`` that produced an ``AIMessage``: its
    ``response_metadata`` (``model_provider``, and ``model_name`` or
    ``model``; a model without a provider is placed by its name: ``claude…``
    Anthropic, ``gpt…``/``o1…``/``o3…``/``o4…`` OpenAI, ``gemini…`` Google,
    else ``default``'s provider), else ``default``. ``None`` for other
    messages and when nothing says."""
    if not isinstance(message, AIMessage):
        return None
    metadata = message.response_metadata or {}
    model = metadata.get("model_name") or metadata.get("model")
    if not isinstance(model, str) or not model:
        return default
    provider = metadata.get("model_provider")
    if isinstance(provider, str) and provider.strip():
        return provider_name(provider), model
    name = provider_of_model(model)
    if name is not None:
        return name, model
    return (default[0], model) if default is not None else None


def _is_reasoning_block(block: Any) -> bool:
    """A content block holding reasoning: Anthropic's thinking and redacted
    thinking, an OpenAI reasoning item, LangChain's standard reasoning block."""
    return isinstance(block, dict) and block.get("type") in (
        "thinking",
        "redacted_thinking",
        "reasoning",
    )


def _reasoning_blocks(message: BaseMessage) -> list[m.ContentBlock]:
    """The reasoning of an ``AIMessage`` as sessionstore's native parts, in
    order: thinking blocks with their signatures, redacted thinking, OpenAI
    reasoning items (content blocks, or ``additional_kwargs["reasoning"]``)
    as ``reasoning`` JSON blocks, and LangChain's standard reasoning blocks
    as thinking blocks (with ``extras["signature"]``)."""
    if not isinstance(message, AIMessage):
        return []
    blocks: list[m.ContentBlock] = []
    content = message.content if isinstance(message.content, list) else []
    for block in content:
        if not isinstance(block, dict) or not _is_reasoning_block(block):
            continue
        kind = block.get("type")
        if kind == "thinking" and isinstance(block.get("thinking"), str):
            signature = block.get("signature")
            blocks.append(
                m.ContentBlock(
                    thinking=m.ThinkingBlock(
                        thinking=block["thinking"],
                        signature=signature if isinstance(signature, str) else "",
                    )
                )
            )
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            blocks.append(
                m.ContentBlock(redacted_thinking=m.RedactedThinkingBlock(data=block["data"]))
            )
        elif kind == "reasoning" and ("summary" in block or "encrypted_content" in block):
            blocks.append(_reasoning_item(block))
        elif kind == "reasoning" and isinstance(block.get("reasoning"), str):
            extras = block.get("extras")
            signature = extras.get("signature") if isinstance(extras, dict) else None
            blocks.append(
                m.ContentBlock(
                    thinking=m.ThinkingBlock(
                        thinking=block["reasoning"],
                        signature=signature if isinstance(signature, str) else "",
                    )
                )
            )
    item = message.additional_kwargs.get("reasoning")
    if isinstance(item, dict) and item.get("type") == "reasoning":
        blocks.append(_reasoning_item(item))
    return blocks


def _reasoning_item(item: dict[str, Any]) -> m.ContentBlock:
    return m.ContentBlock(
        json=m.JsonBlock(type="reasoning", json=json.dumps(item, ensure_ascii=False))
    )


def fit_to_export(message: BaseMessage, exported: m.Message) -> BaseMessage:
    """A LangChain message as an export for a target left its stored form.

    The export removes reasoning the target may not receive and tool calls
    that lost their results; the verbatim copy still holds both. A message
    whose export holds no reasoning loses its reasoning here too (thinking,
    redacted thinking and reasoning content blocks, ``additional_kwargs``'
    ``reasoning`` and :data:`GEMINI_SIGNATURES_KEY`), and an ``AIMessage``
    keeps only the tool calls (``tool_calls`` and tool-call content blocks)
    the export kept. Other messages come back as they are.
    """
    if not isinstance(message, AIMessage):
        return message
    update: dict[str, Any] = {}
    strip = not has_reasoning(exported)
    kept = {call.id for call in exported.tool_calls}
    kept.update(
        block.tool_use.id
        for block in exported.content_blocks
        if block.WhichOneof("block") == "tool_use"
    )

    def dropped(block: Any) -> bool:
        if strip and _is_reasoning_block(block):
            return True
        if isinstance(block, dict) and block.get("type") in _CALL_BLOCK_ID:
            return (block.get(_CALL_BLOCK_ID[block["type"]]) or "") not in kept
        return False

    if isinstance(message.content, list):
        content = [block for block in message.content if not dropped(block)]
        if len(content) != len(message.content):
            update["content"] = content
    if strip and (
        "reasoning" in message.additional_kwargs
        or GEMINI_SIGNATURES_KEY in message.additional_kwargs
    ):
        update["additional_kwargs"] = {
            key: value
            for key, value in message.additional_kwargs.items()
            if key not in ("reasoning", GEMINI_SIGNATURES_KEY)
        }
    calls = [call for call in message.tool_calls if (call.get("id") or "") in kept]
    if len(calls) != len(message.tool_calls):
        update["tool_calls"] = calls
    return message.model_copy(update=update) if update else message


def message_to_store(message: BaseMessage) -> m.Message:
    """The sessionstore message for a LangChain message: native fields filled
    in (an ``AIMessage``'s reasoning as native reasoning parts, see
    :func:`fit_to_export`), plus the message verbatim in a ``JsonBlock``
    (:data:`JSON_BLOCK_TYPE`).
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
        signatures = message.additional_kwargs.get(GEMINI_SIGNATURES_KEY)
        if not isinstance(signatures, dict):
            signatures = {}
        for call in message.tool_calls:
            signature = signatures.get(call.get("id") or "")
            stored.tool_calls.append(
                m.ToolCall(
                    id=call.get("id") or "",
                    name=call["name"],
                    arguments=json.dumps(call["args"], ensure_ascii=False),
                    signature=signature if isinstance(signature, str) else "",
                )
            )
        stored.content_blocks.extend(_reasoning_blocks(message))
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


def _target(model: str | tuple[str, str] | None) -> tuple[str, str] | None:
    """``model`` as ``(provider, model)``, the provider named as sessionstore
    records it (:func:`provider_name`)."""
    if model is None:
        return None
    if isinstance(model, str):
        provider, slash, name = model.partition("/")
        if not slash:
            raise ValueError(f"model must be 'PROVIDER/MODEL', got {model!r}")
    else:
        provider, name = model
    if not provider.strip():
        raise ValueError(f"model {model!r} names no provider")
    return provider_name(provider), name


def _count(details: Any, key: str) -> int:
    value = details.get(key) if isinstance(details, dict) else None
    return value if isinstance(value, int) else 0


def _provider_call(message: BaseMessage, origin: tuple[str, str]) -> dict[str, Any]:
    """The provider call that produced an ``AIMessage``: its model, the
    response id (``response_metadata["id"]``) and ``usage_metadata``."""
    provider, model = origin
    call: dict[str, Any] = {"provider": provider, "model": model}
    response_id = (message.response_metadata or {}).get("id")
    if isinstance(response_id, str):
        call["request_id"] = response_id
    usage = getattr(message, "usage_metadata", None)
    if isinstance(usage, dict):
        # LangChain's details are parts of their totals; a total reported
        # below its parts is raised to them (usage_json keeps what was said).
        inputs = usage.get("input_token_details")
        cached = _count(inputs, "cache_read")
        created = _count(inputs, "cache_creation")
        reasoning = _count(usage.get("output_token_details"), "reasoning")
        call["prompt_tokens"] = max(_count(usage, "input_tokens"), cached + created)
        call["completion_tokens"] = max(_count(usage, "output_tokens"), reasoning)
        call["total_tokens"] = _count(usage, "total_tokens")
        call["cached_input_tokens"] = cached
        call["cache_creation_input_tokens"] = created
        call["reasoning_tokens"] = reasoning
        call["usage_json"] = json.dumps(usage, ensure_ascii=False, default=str)
    return call


# -- the history -------------------------------------------------------------


class SessionstoreChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat message history stored in a sessionstore session.

    Args:
        session_id: The LangChain session id (any string); the sessionstore
            session is :func:`to_store_session_id` of it (``store_session_id``).
        client: The blocking client the sync methods use.
        async_client: The asyncio client the async methods use.
        model: The model the conversation goes to next, as
            ``"PROVIDER/MODEL"`` (``"anthropic/claude-sonnet-4-5"``) or a
            ``(provider, model)`` pair. With it, ``messages`` is the history
            as that model accepts it (an export for that target), and an
            ``AIMessage`` added without a model in its ``response_metadata``
            is recorded as this model's.
        reasoning: Whose reasoning ``messages`` keeps when ``model`` is set:
            ``"same_model"`` (the default), ``"same_provider"`` or ``"none"``.

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
        model: str | tuple[str, str] | None = None,
        reasoning: ReasoningPolicyLike = "same_model",
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
        self.target = _target(model)
        reasoning_policy(reasoning)  # a bad policy fails here, not on the first read
        self.reasoning = reasoning

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

    def _new_session(self) -> s.CreateSessionRequest:
        """The session an append creates when there is none (its
        ``create_if_missing``): the LangChain id kept in its metadata."""
        return s.CreateSessionRequest(metadata={SESSION_ID_METADATA_KEY: self.session_id})

    def _read(self, stored: list[m.Message]) -> list[BaseMessage]:
        if self.target is None:
            return [message_from_store(message) for message in stored]
        return [fit_to_export(message_from_store(message), message) for message in stored]

    def _exchanges(self, messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
        """``messages`` as ``append_exchange`` arguments: one exchange per
        ``AIMessage`` whose model is known (:func:`message_origin`), holding
        the messages before it as input and it as the response of a provider
        call of that model, with the usage in its ``usage_metadata``; the
        messages after the last such answer make one exchange of input."""
        request_id = str(uuid.uuid4())
        exchanges: list[dict[str, Any]] = []
        inputs: list[m.Message] = []
        for message in messages:
            stored = message_to_store(message)
            origin = message_origin(message, self.target)
            if origin is None:
                inputs.append(stored)
                continue
            exchanges.append(
                {
                    "messages": inputs,
                    "response_messages": [stored],
                    "provider_call": _provider_call(message, origin),
                }
            )
            inputs = []
        if inputs:
            exchanges.append({"messages": inputs})
        for index, exchange in enumerate(exchanges):
            exchange["request_id"] = request_id if index == 0 else f"{request_id}:{index}"
        if exchanges:
            # The first write makes the session if there is none (the later
            # ones find it).
            exchanges[0]["create_if_missing"] = self._new_session()
        return exchanges

    # -- reads ------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's messages, read from the server (``[]`` if it has
        none yet); with ``model``, as that model accepts them."""
        client = self._sync()
        try:
            if self.target is None:
                stored = client.export_history(self.store_session_id)
            else:
                provider, model = self.target
                stored = client.export_for(
                    self.store_session_id, provider, model, reasoning=self.reasoning
                )
        except SessionNotFound:
            return []
        return self._read(stored)

    async def aget_messages(self) -> list[BaseMessage]:
        """Async :attr:`messages`."""
        if self.async_client is None:
            return await asyncio.to_thread(lambda: self.messages)
        client = self.async_client
        try:
            if self.target is None:
                stored = await client.export_history(self.store_session_id)
            else:
                provider, model = self.target
                stored = await client.export_for(
                    self.store_session_id, provider, model, reasoning=self.reasoning
                )
        except SessionNotFound:
            return []
        return self._read(stored)

    # -- writes -----------------------------------------------------------

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Appends ``messages``: one ``AppendExchange`` (one revision), which
        creates the session if it does not exist (in the same call), or, when
        the batch holds several answers of known models, one per answer, in
        order."""
        exchanges = self._exchanges(messages)
        if not exchanges:
            return
        client = self._sync()
        for exchange in exchanges:
            client.append_exchange(self.store_session_id, **exchange)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages`."""
        if self.async_client is None:
            await asyncio.to_thread(self.add_messages, list(messages))
            return
        exchanges = self._exchanges(messages)
        if not exchanges:
            return
        for exchange in exchanges:
            await self.async_client.append_exchange(self.store_session_id, **exchange)

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
