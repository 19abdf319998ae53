"""Reading the JSON that calls send and receive: the request body, the reply object, its
usage, its choices' text and tool calls. Pure functions over parsed JSON; nothing here
sends, routes or counts (the call does, ``_call``)."""

from __future__ import annotations

import json
import re
from typing import Any, Final, Protocol

__all__ = [
    "FINISH",
    "USAGE_PATHS",
    "ask_usage",
    "asks_usage",
    "content_of",
    "json_bytes",
    "json_value",
    "merged",
    "reply_object",
    "request_body",
    "request_facts",
    "text_of",
    "tool_calls_of",
    "tool_names_into",
    "usage_into",
]

USAGE_PATHS: Final = frozenset({"/chat/completions", "/completions"})
"""The completion APIs: their replies carry ``choices``, and streamed, their
``stream_options.include_usage`` adds a final usage chunk."""
FINISH: Final = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]{1,32})"')
"""A choice's finish reason, found in raw JSON without parsing it."""
_JSON = json.JSONDecoder()
_MAX_TOOL_NAMES = 16
_MAX_TOOL_NAME = 200


def json_value(raw: bytes) -> Any:
    """The JSON value ``raw`` holds; ``ValueError`` (``json.loads``'s) if none.

    ``raw_decode`` of the UTF-8 text costs a third of ``json.loads`` on bytes (no encoding
    detection, no whitespace regex); anything it does not take (leading whitespace, another
    encoding) goes through ``json.loads``."""
    try:
        text = raw.decode()
        value, end = _JSON.raw_decode(text)
        if end != len(text) and text[end:].strip(" \t\n\r"):
            raise ValueError("extra data")
    except ValueError:
        return json.loads(raw)  # UnicodeDecodeError is a ValueError too
    return value


def request_body(content: bytes) -> dict[str, Any] | None:
    """The JSON object a request sends, else None."""
    try:
        parsed = json_value(content)
    except ValueError:
        return None
    return parsed if parsed.__class__ is dict else None


def reply_object(raw: bytes, suffix: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object of a 2xx reply, parsed once (its usage, finish reason, tool calls
    and text are read from it), or None and what is wrong with it: not JSON (cut short,
    garbled), not an object, or, for the completion APIs, no ``choices`` list (``{}``,
    an error object)."""
    try:
        data = json_value(raw)
    except ValueError as exc:
        return None, f"the body is not valid JSON ({exc})"
    if data.__class__ is not dict:
        return None, f"the body is a JSON {type(data).__name__}, not an object"
    if suffix in USAGE_PATHS and data.get("choices").__class__ is not list:
        keys = ", ".join(list(data)[:6]) or "none"
        what = "an error object" if "error" in data else "not a completion"
        return None, f"the body is {what} (no 'choices' list; keys: {keys})"
    return data, ""


def request_facts(body: dict[str, Any] | None) -> tuple[bool, str | None, int | None]:
    """What a request body says of its call: whether it streams, its model, the output
    tokens it allows (``max_completion_tokens``, else ``max_tokens``)."""
    if not body:
        return False, None, None
    stream = body.get("stream") is True
    model = body.get("model")
    if not isinstance(model, str):
        model = None
    max_out = body.get("max_completion_tokens")
    if not isinstance(max_out, int):
        max_out = body.get("max_tokens")
        if not isinstance(max_out, int):
            max_out = None
    if max_out.__class__ is bool:  # as CallMetadata would take it
        max_out = int(max_out)
    return stream, model, max_out


def asks_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed request asks for its usage (``stream_options``)."""
    options = body.get("stream_options")
    return options.__class__ is dict and bool(
        options.get("include_usage") or options.get("continuous_usage_stats")
    )


def ask_usage(body: dict[str, Any]) -> None:
    """Ask a streamed request's usage (``stream_options.include_usage``), the caller's other
    stream options kept (in a copy: the caller's dict stays as it was)."""
    options = body.get("stream_options")
    asked = dict(options) if options.__class__ is dict else {}
    asked["include_usage"] = True
    body["stream_options"] = asked


def merged(body: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A request body with a dialect's fields merged in; never over what the caller set
    (its own metadata wins: docs/protocol.md, section 3), nested dicts key by key. A copy:
    ``body`` and the dicts in it stay as they were, for the call's next attempt."""
    out = dict(body)
    for key, value in extra.items():
        if key not in out:
            out[key] = value
        elif out[key].__class__ is dict and isinstance(value, dict):
            out[key] = merged(out[key], value)
    return out


def json_bytes(body: dict[str, Any]) -> bytes:
    """A request body as agentrt sends one it wrote: compact JSON (no spaces)."""
    return json.dumps(body, separators=(",", ":")).encode()


def content_of(body: dict[str, Any] | None) -> Any:
    """What a request asked (its messages, or its prompt), for ``capture_content``."""
    if not body:
        return None
    return body.get("messages", body.get("prompt"))


class Tokens(Protocol):
    """Where a reply's usage goes (a call's ``_CallState``)."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    cache_write_tokens: int | None
    reasoning_tokens: int | None


def usage_into(report: Tokens, usage: Any) -> None:
    """A reply's ``usage`` into the call's tokens: chat and text completions name them
    ``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details`` (``cached_tokens``,
    and ``cache_write_tokens`` where the server says what it wrote to its cache) and
    ``completion_tokens_details`` (``reasoning_tokens``); the Responses API
    ``input_tokens``, ``output_tokens``, ``input_tokens_details`` and
    ``output_tokens_details``."""
    if usage.__class__ is not dict:  # parsed JSON: a dict is exactly a dict
        return
    # int(): a JSON true counts as 1, as CallReport's validation took it.
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if pt is None:
        pt = usage.get("input_tokens")
    if ct is None:
        ct = usage.get("output_tokens")
    if isinstance(pt, int):
        report.prompt_tokens = int(pt)
    if isinstance(ct, int):
        report.completion_tokens = int(ct)
    details = usage.get("prompt_tokens_details")
    if details is None:
        details = usage.get("input_tokens_details")
    if details.__class__ is dict:
        cached = details.get("cached_tokens")
        if isinstance(cached, int):
            report.cached_tokens = int(cached)
        written = details.get("cache_write_tokens")
        if isinstance(written, int):
            report.cache_write_tokens = int(written)
    out = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
    reasoning = out.get("reasoning_tokens") if out.__class__ is dict else None
    if isinstance(reasoning, int):
        report.reasoning_tokens = int(reasoning)


# -- choices ------------------------------------------------------------------------------


def text_of(choice: Any) -> str | None:
    """A choice's text: its message's or delta's ``content``, else its ``text``."""
    if not isinstance(choice, dict):
        return None
    for key in ("message", "delta"):
        part = choice.get(key)
        if isinstance(part, dict) and isinstance(part.get("content"), str):
            return str(part["content"])
    text = choice.get("text")
    return text if isinstance(text, str) else None


def tool_calls_of(choice: Any, key: str) -> list[Any] | None:
    """The ``tool_calls`` list of a choice's ``key`` part (``message`` in a reply,
    ``delta`` in a stream chunk), else None. The one reader of tool calls: the call's
    tool names (:func:`tool_names_into`) and the events' (``ReplyFacts``) come from it."""
    part = choice.get(key) if choice.__class__ is dict else None
    calls = part.get("tool_calls") if part.__class__ is dict else None
    return calls if calls.__class__ is list else None


def tool_names_into(names: list[str], choices: Any, key: str) -> None:
    """Append the function names of the first choice's tool calls (at most 16, each of
    1 to 200 characters); anything malformed is skipped."""
    if not (isinstance(choices, list) and choices):
        return
    calls = tool_calls_of(choices[0], key)
    if calls is None:
        return
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and 0 < len(name) <= _MAX_TOOL_NAME:
            if len(names) >= _MAX_TOOL_NAMES:
                return
            names.append(name)
