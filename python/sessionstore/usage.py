"""Providers' usage objects as ``v1.ProviderCall`` messages whose token
buckets match the bill.

The buckets nest: ``prompt_tokens`` counts every input token, and
``cached_input_tokens`` (read from the provider's prompt cache) and
``cache_creation_input_tokens`` (written to it) are parts of it;
``completion_tokens`` counts every output token, and ``reasoning_tokens`` is a
part of it. Providers report them differently: OpenAI's ``prompt_tokens`` (or
``input_tokens``) already includes its cache reads and writes, while
Anthropic's ``input_tokens`` excludes both. These helpers do the arithmetic::

    from sessionstore.usage import from_anthropic_usage, from_openai_usage

    call = from_openai_usage(completion.usage, model=completion.model)
    call = from_anthropic_usage(message.usage, model=message.model)
    client.append_exchange(session_id, messages=[...], provider_call=call, ...)

``usage`` may be a dict, the SDK's usage object (anything with
``model_dump()``, such as the ``openai`` and ``anthropic`` packages' models),
or the JSON text of one. It is kept in ``usage_json``: the text as given, or
the object as ``json.dumps(obj, separators=(",", ":"))``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Union

from . import _requests as req
from ._proto.sessionstore.v1 import messages_pb2 as m

__all__ = ["UsageLike", "from_anthropic_usage", "from_openai_usage"]

#: A usage object: a dict, an SDK model with ``model_dump()``, its JSON
#: text, or ``None`` (no usage: every bucket 0, ``usage_json`` empty).
UsageLike = Union[Mapping[str, Any], str, bytes, Any, None]


def from_openai_usage(
    usage: UsageLike,
    *,
    model: str,
    provider: str = "openai",
    cost_micros_usd: int = 0,
    request_id: str = "",
    requested_provider: str = "",
    requested_model: str = "",
    duration: req.LeaseLike | None = None,
) -> m.ProviderCall:
    """A provider call from an OpenAI usage object, of either API.

    - Chat Completions: ``prompt_tokens`` (cache reads and writes included),
      ``completion_tokens`` (reasoning included),
      ``prompt_tokens_details.cached_tokens`` and ``.cache_write_tokens``,
      ``completion_tokens_details.reasoning_tokens``;
    - Responses: ``input_tokens``, ``output_tokens``,
      ``input_tokens_details.cached_tokens`` and ``.cache_write_tokens``,
      ``output_tokens_details.reasoning_tokens``.

    ``cache_write_tokens`` (only models that bill cache writes report it) is
    ``cache_creation_input_tokens``; ``total_tokens`` is prompt + completion.
    Absent or ``None`` fields count 0. ``duration`` is the call's wall time,
    in seconds or a ``timedelta``.

    >>> call = from_openai_usage(
    ...     {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
    ...      "prompt_tokens_details": {"cached_tokens": 1920},
    ...      "completion_tokens_details": {"reasoning_tokens": 192}},
    ...     model="o4-mini",
    ... )
    >>> call.prompt_tokens, call.cached_input_tokens, call.reasoning_tokens
    (2006, 1920, 192)
    """
    fields, usage_json = _usage_object(usage)
    chat = fields.get("prompt_tokens") is not None or fields.get("completion_tokens") is not None
    given, made = ("prompt", "completion") if chat else ("input", "output")
    return _provider_call(
        provider=provider,
        model=model,
        prompt_tokens=_count(fields, f"{given}_tokens"),
        completion_tokens=_count(fields, f"{made}_tokens"),
        cached_input_tokens=_count(fields, f"{given}_tokens_details", "cached_tokens"),
        cache_creation_input_tokens=_count(fields, f"{given}_tokens_details", "cache_write_tokens"),
        reasoning_tokens=_count(fields, f"{made}_tokens_details", "reasoning_tokens"),
        usage_json=usage_json,
        cost_micros_usd=cost_micros_usd,
        request_id=request_id,
        requested_provider=requested_provider,
        requested_model=requested_model,
        duration=duration,
    )


def from_anthropic_usage(
    usage: UsageLike,
    *,
    model: str,
    provider: str = "anthropic",
    cost_micros_usd: int = 0,
    request_id: str = "",
    requested_provider: str = "",
    requested_model: str = "",
    duration: req.LeaseLike | None = None,
) -> m.ProviderCall:
    """A provider call from an Anthropic Messages usage object.

    Anthropic's ``input_tokens`` excludes the tokens read from and written to
    the prompt cache, so ``prompt_tokens`` is ``input_tokens +
    cache_read_input_tokens + cache_creation_input_tokens``;
    ``cached_input_tokens`` is ``cache_read_input_tokens``,
    ``cache_creation_input_tokens`` Anthropic's own, and ``completion_tokens``
    ``output_tokens`` (thinking included; Anthropic reports no separate
    count, so ``reasoning_tokens`` is 0). ``total_tokens`` is prompt +
    completion. Absent or ``None`` fields count 0. ``duration`` is the call's
    wall time, in seconds or a ``timedelta``.

    >>> call = from_anthropic_usage(
    ...     {"input_tokens": 50, "cache_creation_input_tokens": 1253,
    ...      "cache_read_input_tokens": 10240, "output_tokens": 503},
    ...     model="claude-sonnet-4-5",
    ... )
    >>> call.prompt_tokens, call.cached_input_tokens, call.cache_creation_input_tokens
    (11543, 10240, 1253)
    """
    fields, usage_json = _usage_object(usage)
    cache_read = _count(fields, "cache_read_input_tokens")
    cache_creation = _count(fields, "cache_creation_input_tokens")
    return _provider_call(
        provider=provider,
        model=model,
        prompt_tokens=_saturate(_count(fields, "input_tokens") + cache_read + cache_creation),
        completion_tokens=_count(fields, "output_tokens"),
        cached_input_tokens=cache_read,
        cache_creation_input_tokens=cache_creation,
        reasoning_tokens=0,
        usage_json=usage_json,
        cost_micros_usd=cost_micros_usd,
        request_id=request_id,
        requested_provider=requested_provider,
        requested_model=requested_model,
        duration=duration,
    )


def _provider_call(
    *, prompt_tokens: int, completion_tokens: int, duration: req.LeaseLike | None, **fields: Any
) -> m.ProviderCall:
    call = m.ProviderCall(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=_saturate(prompt_tokens + completion_tokens),
        **fields,
    )
    if duration is not None:
        call.duration.CopyFrom(req.duration(duration))
    return call


def _usage_object(usage: UsageLike) -> tuple[Mapping[str, Any], str]:
    """The usage object's fields, and its text for ``usage_json``."""
    if usage is None:
        return {}, ""
    if isinstance(usage, (bytes, bytearray)):
        usage = usage.decode("utf-8")
    if isinstance(usage, str):
        fields = json.loads(usage)
        if fields is None:
            return {}, ""
        if not isinstance(fields, Mapping):
            raise TypeError("a usage object's JSON text must hold an object")
        return fields, usage
    if not isinstance(usage, Mapping):
        usage = _dump(usage)
    return usage, json.dumps(usage, separators=(",", ":"))


def _dump(usage: Any) -> Mapping[str, Any]:
    """An SDK model's fields as the API sent them (wire names, only the
    fields that were there)."""
    dump = getattr(usage, "model_dump", None)
    if dump is None:
        raise TypeError(
            f"a usage object is a dict, JSON text or a model with model_dump(), "
            f"not {type(usage).__name__}"
        )
    try:
        fields = dump(mode="json", by_alias=True, exclude_unset=True)
    except TypeError:  # a model_dump() without pydantic's keywords
        fields = dump()
    if not isinstance(fields, Mapping):
        raise TypeError(f"{type(usage).__name__}.model_dump() did not return a dict")
    return fields


#: The largest count a ``ProviderCall`` holds (an int64).
_MAX_COUNT = 2**63 - 1


def _count(fields: Mapping[str, Any], *path: str) -> int:
    """The count at ``path``: 0 when absent, ``None`` or not a number;
    counts past int64 saturate."""
    value: Any = fields
    for key in path:
        if not isinstance(value, Mapping):
            return 0
        value = value.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return _saturate(int(value))


def _saturate(count: int) -> int:
    return min(count, _MAX_COUNT)
