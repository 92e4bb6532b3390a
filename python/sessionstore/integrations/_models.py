"""What the framework adapters share about models and reasoning: which
provider a model name belongs to, whether a stored message holds
reasoning, and the checks of an adapter's ``model``/``reasoning``
arguments."""

from __future__ import annotations

from .._proto.sessionstore.v1 import messages_pb2 as m
from .._requests import ReasoningPolicyLike, reasoning_policy

#: The provider of a model, by the prefix of its name.
_MODEL_PREFIXES = (
    ("claude", "anthropic"),
    ("gpt", "openai"),
    ("chatgpt", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("gemini", "google"),
)


def provider_of_model(model: str) -> str | None:
    """``anthropic`` for ``claude…``, ``openai`` for ``gpt…``, ``chatgpt…``,
    ``o1…``, ``o3…`` and ``o4…``, ``google`` for ``gemini…``; else ``None``."""
    name = model.lower()
    for prefix, provider in _MODEL_PREFIXES:
        if name.startswith(prefix):
            return provider
    return None


def has_reasoning(message: m.Message) -> bool:
    """Whether a sessionstore message holds any reasoning part: a thinking or
    redacted-thinking block, a ``reasoning`` JSON block, or a signature on a
    text block, tool-use block or tool call. An export for a target keeps
    all of a message's reasoning or none of it (it has one origin)."""
    for block in message.content_blocks:
        kind = block.WhichOneof("block")
        if kind in ("thinking", "redacted_thinking"):
            return True
        if kind == "json" and block.json.type == "reasoning":
            return True
        if kind == "text" and block.text.signature:
            return True
        if kind == "tool_use" and block.tool_use.signature:
            return True
    return any(call.signature for call in message.tool_calls)


def checked_provider(model: str | None, provider: str, reasoning: ReasoningPolicyLike) -> str:
    """``provider`` as sessionstore compares it (trimmed, lower case), once
    ``model``, ``provider`` and ``reasoning`` are known to make a target:
    ``ValueError`` for an empty provider with a model, or an unknown policy."""
    if model is not None and not provider.strip():
        raise ValueError("provider must not be empty when model is given")
    reasoning_policy(reasoning)  # a bad policy fails here, not on the first read
    return provider.strip().lower()
