"""What the events report of a request and its reply, read on the transport's path.

The transport parses every request body and every 2xx reply (or stream event) once; when
hooks are installed it hands the parsed objects here, and the results travel on
``CallStarted`` (``max_tokens``, ``temperature``) and ``CallEnded`` (``response_id``,
``response_model``, ``finish_reasons``, ``tool_calls``). Nothing here runs without hooks.
"""

from __future__ import annotations

from typing import Any, Final

from .._wire import tool_calls_of

__all__ = ["ReplyFacts", "temperature_of"]

MAX_ITEMS: Final = 16
"""Finish reasons and tool calls kept per reply (a reply with more choices keeps these)."""
MAX_TEXT: Final = 256
"""Longer ids, model names, finish reasons or tool names are not reported."""


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_TEXT else None


def temperature_of(body: dict[str, Any] | None) -> float | None:
    """The request's ``temperature`` (a JSON number), else None."""
    if body is None:
        return None
    value = body.get("temperature")
    if value.__class__ is float or value.__class__ is int:
        return float(value)
    return None


class ReplyFacts:
    """A reply's id, model, finish reasons and tool calls, gathered from its JSON body
    (:meth:`read` with ``"message"``) or from its stream's chunks (``"delta"``): the
    first id and model seen, every choice's finish reason, and the ``(id, name)`` of each
    tool call of the first choice (a stream names a call in its first delta)."""

    __slots__ = ("finish_reasons", "id", "model", "tool_calls")

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.finish_reasons: list[str] = []
        self.tool_calls: list[tuple[str, str]] = []

    def read(self, obj: dict[str, Any], key: str) -> None:
        """Take what ``obj`` (a reply, or one stream chunk) says; malformed parts are
        skipped."""
        if self.id is None:
            self.id = _text(obj.get("id"))
        if self.model is None:
            self.model = _text(obj.get("model"))
        choices = obj.get("choices")
        if choices.__class__ is not list or not choices:
            return
        for choice in choices:
            if choice.__class__ is dict:
                finish = _text(choice.get("finish_reason"))
                if finish is not None and len(self.finish_reasons) < MAX_ITEMS:
                    self.finish_reasons.append(finish)
        first = choices[0]
        if first.__class__ is not dict or first.get("index", 0) != 0:
            return
        calls = tool_calls_of(first, key)
        if calls is None:
            return
        for call in calls:
            if call.__class__ is not dict:
                continue
            call_id = _text(call.get("id"))
            fn = call.get("function")
            name = _text(fn.get("name")) if fn.__class__ is dict else None
            if call_id is not None and name is not None and len(self.tool_calls) < MAX_ITEMS:
                self.tool_calls.append((call_id, name))
