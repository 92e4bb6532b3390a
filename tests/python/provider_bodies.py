"""Checks request bodies that ExportTranscript rendered against the
providers' official Python SDKs (run by tests/it/provider_bodies.rs).

    python provider_bodies.py MANIFEST

MANIFEST is a JSON list of {"format", "path", "prompt"}: "format" is
"anthropic", "openai-responses" or "gemini"; "path" the body's file;
"prompt" whether the session has a system prompt. Each body must:

* have exactly its format's keys ("system"/"instructions"/
  "systemInstruction" only with a prompt);
* validate against the SDK's request types, with nothing dropped or
  changed by validation: Anthropic's MessageCreateParams and OpenAI's
  ResponseCreateParams (TypedDicts, checked with pydantic: a key the
  types do not know is dropped by validation and so caught by comparing
  the result with the body), Gemini's Content and GenerateContentConfig
  (pydantic models that forbid unknown keys);
* go through the SDK's own client call (messages.create, responses.create,
  models.generate_content) over a mock transport, and reach the wire as
  the body has it: the request the SDK sends holds the body's messages,
  input or contents unchanged.

Prints "provider bodies ok: N" and exits 0, or names the first failure
and exits 1. Nothing goes over the network.
"""

import base64
import binascii
import json
import sys
from collections.abc import Iterator

import anthropic
import httpx2 as httpx
import openai
from anthropic.types import message_create_params
from google import genai
from google.genai import types as genai_types
from openai.types.responses import ResponseInputParam, response_create_params
from pydantic import TypeAdapter

KEYS = {
    "anthropic": ("system", "messages"),
    "openai-responses": ("instructions", "input"),
    "gemini": ("systemInstruction", "contents"),
}


class Failure(Exception):
    pass


def materialize(value):
    """A validated value with every lazily validated iterable (pydantic
    validates Iterable[...] fields as they are iterated) run through."""
    if isinstance(value, dict):
        return {key: materialize(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [materialize(item) for item in value]
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    if isinstance(value, Iterator) or hasattr(value, "__iter__"):
        return [materialize(item) for item in value]
    return value


def validate_typed(adapter, data, what):
    """Validates `data` against a TypedDict and fails unless validation
    kept it whole (an unknown key is dropped, a wrong value rejected or
    converted: either way the result differs)."""
    try:
        validated = materialize(adapter.validate_python(data))
    except Exception as error:  # pydantic.ValidationError, and lazy ones
        raise Failure(f"{what}: rejected by the SDK types: {str(error)[:3000]}") from error
    if validated != data:
        raise Failure(
            f"{what}: validation changed it (an unknown key or a converted value):\n"
            f"  sent:      {json.dumps(data)[:2000]}\n"
            f"  validated: {json.dumps(validated, default=repr)[:2000]}"
        )


def check_keys(body, format, prompt, what):
    system_key, array_key = KEYS[format]
    expected = {array_key} | ({system_key} if prompt else set())
    if set(body) != expected:
        raise Failure(f"{what}: keys {sorted(body)}, expected {sorted(expected)}")
    if not isinstance(body[array_key], list):
        raise Failure(f"{what}: {array_key} is not a list")


def capture(responder):
    """An httpx client whose transport records each request's JSON body
    and answers with `responder()`."""
    sent = []

    def handle(request):
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=responder())

    return httpx.Client(transport=httpx.MockTransport(handle)), sent


ANTHROPIC_PARAMS = TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)


def check_anthropic(body, what):
    request = {"model": "claude-opus-4-6", "max_tokens": 1024, **body}
    validate_typed(ANTHROPIC_PARAMS, request, what)
    for index, message in enumerate(body["messages"]):
        if message["role"] not in ("user", "assistant"):
            raise Failure(f"{what}: messages[{index}] has role {message['role']!r}")
        if not message["content"]:
            raise Failure(f"{what}: messages[{index}] has no content")
    http, sent = capture(
        lambda: {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-opus-4-6",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    )
    client = anthropic.Anthropic(api_key="test", http_client=http, max_retries=0)
    client.messages.create(**request)
    wire = sent[-1]
    for key in body:
        if wire.get(key) != body[key]:
            raise Failure(f"{what}: the SDK sent {key} changed")


OPENAI_PARAMS = TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)
OPENAI_INPUT = TypeAdapter(ResponseInputParam)


def check_openai(body, what):
    request = {"model": "gpt-5", **body}
    validate_typed(OPENAI_PARAMS, request, what)
    validate_typed(OPENAI_INPUT, body["input"], f"{what} (input)")
    http, sent = capture(
        lambda: {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "gpt-5",
            "output": [],
            "status": "completed",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )
    client = openai.OpenAI(api_key="test", http_client=http, max_retries=0)
    client.responses.create(**request)
    wire = sent[-1]
    for key in body:
        if wire.get(key) != body[key]:
            raise Failure(f"{what}: the SDK sent {key} changed")


# Gemini's bytes fields (thoughtSignature, inlineData.data) travel as
# base64, in either alphabet (the SDK re-encodes them URL-safe); compared as
# the bytes they stand for.
BYTES_KEYS = {"thoughtSignature", "data"}
# Values that are the caller's own JSON: compared exactly, keys and all.
OPAQUE_KEYS = {"args", "response"}


def decoded(text):
    padded = text + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except binascii.Error as error:
        raise Failure(f"{text!r} is not base64: {error}") from error


def camel(key):
    """The API's field names take either case (the SDK sends some nested
    ones in snake_case): compared in camelCase."""
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def same_json(left, right, key=None):
    if key in OPAQUE_KEYS:
        return left == right
    if key in BYTES_KEYS and isinstance(left, str) and isinstance(right, str):
        return decoded(left) == decoded(right)
    if isinstance(left, dict) and isinstance(right, dict):
        left = {camel(k): v for k, v in left.items()}
        right = {camel(k): v for k, v in right.items()}
        return set(left) == set(right) and all(
            same_json(left[k], right[k], k) for k in left
        )
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(
            same_json(a, b, key) for a, b in zip(left, right)
        )
    return left == right


def check_gemini(body, what):
    contents = []
    for index, content in enumerate(body["contents"]):
        where = f"{what}: contents[{index}]"
        if content.get("role") not in ("user", "model"):
            raise Failure(f"{where} has role {content.get('role')!r}")
        if not content.get("parts"):
            raise Failure(f"{where} has no parts")
        try:
            parsed = genai_types.Content.model_validate_json(json.dumps(content))
        except Exception as error:
            raise Failure(f"{where}: rejected by the SDK types: {error}") from error
        again = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not same_json(again, content):
            raise Failure(f"{where}: the SDK types changed it:\n  {content}\n  {again}")
        contents.append(parsed)
    config = None
    if "systemInstruction" in body:
        try:
            genai_types.Content.model_validate_json(json.dumps(body["systemInstruction"]))
            config = genai_types.GenerateContentConfig.model_validate_json(
                json.dumps({"systemInstruction": body["systemInstruction"]})
            )
        except Exception as error:
            raise Failure(f"{what}: systemInstruction rejected: {error}") from error
    http, sent = capture(
        lambda: {
            "candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}}]
        }
    )
    client = genai.Client(
        api_key="test", http_options=genai_types.HttpOptions(httpx_client=http)
    )
    client.models.generate_content(
        model="gemini-3-pro-preview", contents=contents, config=config
    )
    wire = sent[-1]
    for key in body:
        if not same_json(wire.get(key), body[key]):
            raise Failure(
                f"{what}: the SDK sent {key} changed:\n  body: {json.dumps(body[key])[:2000]}"
                f"\n  wire: {json.dumps(wire.get(key))[:2000]}"
            )


CHECKS = {
    "anthropic": check_anthropic,
    "openai-responses": check_openai,
    "gemini": check_gemini,
}


def main():
    with open(sys.argv[1], encoding="utf-8") as file:
        manifest = json.load(file)
    if not manifest:
        raise SystemExit("no bodies to check")
    for entry in manifest:
        what = f"{entry['format']} body {entry['path']}"
        with open(entry["path"], encoding="utf-8") as file:
            body = json.load(file)
        try:
            if not isinstance(body, dict):
                raise Failure(f"{what}: not a JSON object")
            check_keys(body, entry["format"], entry["prompt"], what)
            CHECKS[entry["format"]](body, what)
        except Failure as failure:
            print(f"FAILED: {failure}", file=sys.stderr)
            raise SystemExit(1)
    print(f"provider bodies ok: {len(manifest)}")


if __name__ == "__main__":
    main()
