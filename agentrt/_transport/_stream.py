"""A streamed reply, observed on its way to the caller: its first chunk (time to first
token), each event parsed once (usage, text, tool calls, a malformed event ends the call),
and, where agentrt asked for the usage chunk on the caller's behalf, the events as the
server would have sent them unasked (:class:`UsageFilter`)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import anyio

from .._errors import DeadlineExceeded, EndpointError, only_cancelled
from .._httplib import encoded
from .._log import transport_log
from .._wire import FINISH, text_of, tool_names_into, usage_into
from ..telemetry._events import FirstToken

if TYPE_CHECKING:
    import httpx

    from .._context import Session
    from .._httplib import HttpLib
    from .._state import _Core
    from ..scheduling._queue import Ticket
    from ..telemetry._reply import ReplyFacts
    from ..telemetry._report import CallStatus, _CallState
    from ._outgoing import Outgoing

__all__ = ["ObservedStream", "StreamCall", "UsageFilter"]

_USAGE_KEY = b'"usage"'
_NULL_USAGE_LAST = b',"usage":null'
_NULL_USAGE_FIELD = re.compile(rb',\s*"usage"\s*:\s*null|"usage"\s*:\s*null\s*,')
"""A ``"usage": null`` member of a JSON object, with its comma. Outside a JSON string
only: inside one a quote is escaped, so ``,"`` and ``"usage":`` cannot occur there."""
_FINGERPRINT = b'"system_fingerprint"'
_EVENT_END = re.compile(rb"(\r\n\r\n|\n\n|\r\r)")
_TOOL_CALLS_KEY = b'"tool_calls"'
_NAME_KEY = b'"name"'
_JSON = json.JSONDecoder()


class StreamCall(Protocol):
    """What a stream reads and ends of its call (``_call.TransportCall``)."""

    core: _Core
    state: _CallState
    session: Session
    ticket: Ticket
    out: Outgoing
    reply: ReplyFacts | None
    finish_reason: str | None
    output: str | None
    tools: tuple[str, ...]
    clock: Callable[[], float]

    def end(self, status: CallStatus, error: str | None) -> None: ...

    def replied_from(self) -> str: ...

    def why_cancelled(self) -> str: ...

    def deadline_exceeded(self) -> DeadlineExceeded: ...


class ObservedStream:
    """Passes a streamed reply through, noting the first chunk and the usage block."""

    _lib: HttpLib
    _bases = ("AsyncByteStream",)

    def __init__(self, call: StreamCall, response: httpx.Response) -> None:
        inner = response.stream
        if not isinstance(inner, self._lib.mod.AsyncByteStream):
            raise TypeError("agentrt needs an async transport underneath")
        self._inner = inner
        self._call = call
        self._state = call.state
        self._url = call.replied_from()
        self._parse = not encoded(response.headers)
        self._hooks = bool(call.core.hooks)
        self._capture = call.core.capture_content and self._hooks
        self._learn = call.core.waits is not None
        self._tools: list[str] = []
        self._parts: list[str] = []
        self._tail = b""
        self._data: list[bytes] = []
        """The ``data:`` lines of the event being read."""
        self._complete = False
        self._it: AsyncIterator[bytes] | None = None
        self._deadline = call.ticket.deadline_at
        """The job's deadline: every read is bounded by it."""
        self._filter: UsageFilter | None = None
        if call.out.added_usage and self._parse:
            n = call.out.body.get("n") if call.out.body else None
            self._filter = UsageFilter(self, n if n.__class__ is int and n > 1 else 1)
        """What the caller reads when agentrt asked for the usage chunk (else this)."""
        self._session = call.session
        self._shut_done = False
        self._open = call.session.job._streams
        """The job's open streams, this one among them until it is closed: a stream its
        caller left unread is settled when its session or job ends (``Job._shut_streams``)."""
        self._open[self] = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        # Clients may iterate more than once (openai drains the rest after [DONE]): every
        # iteration continues the same underlying one. No generator here, so an abandoned
        # iteration leaves nothing suspended.
        if self._it is None:
            self._it = self._inner.__aiter__()
        return self if self._filter is None else self._filter

    async def __anext__(self) -> bytes:
        assert self._it is not None
        state = self._state
        try:
            if self._deadline is None:
                chunk = await self._it.__anext__()
            else:
                with anyio.CancelScope(deadline=self._deadline) as scope:
                    chunk = await self._it.__anext__()
                if scope.cancelled_caught:
                    raise self._call.deadline_exceeded()
        except StopAsyncIteration:
            if self._parse and (self._tail or self._data):
                self._scan(b"\n\n")  # a last event without its blank line (or its newline)
            self._complete = True
            self._call.end("ok", None)
            raise
        except DeadlineExceeded:
            raise
        except self._lib.transport_errors as exc:
            message = self._call.core.redact(f"endpoint {self._url} broke off the stream: {exc!r}")
            self._call.end("error", message)
            raise EndpointError(
                message, endpoint=self._url, attempts=state.attempts, error=exc
            ) from None  # the transport's error: its .error, not a chained traceback
        except BaseException as exc:
            if only_cancelled(exc):  # trio's may come in a group (a nursery in the read)
                why = self._call.why_cancelled()
                self._call.end("cancelled", why if why != "cancelled" else "cancelled mid-stream")
            raise
        if state.ttft_s is None and chunk:
            now = self._call.clock()
            state.ttft_s = now - state.started
            core = self._call.core
            if core.hooks:
                core.emit(
                    FirstToken(
                        t=now,
                        job_id=self._call.ticket.job_id,
                        session_id=self._call.ticket.session_id,
                        call_id=state.call_id,
                        ttft_s=state.ttft_s,
                    )
                )
        if self._hooks and self._call.finish_reason is None:
            found = FINISH.search(chunk)
            if found:
                self._call.finish_reason = found.group(1).decode()
        if self._parse:
            self._scan(chunk)
            if self._complete:
                self._call.end("ok", None)  # [DONE] seen: the reply is complete
        return chunk

    def _scan(self, chunk: bytes) -> None:
        """Read the complete lines of ``chunk`` (with what was left of the last one):
        every event's data is parsed once, as the caller's client will parse it, and read
        for usage, text (``capture_content``) and tool names; data that is not a JSON
        object ends the call (:meth:`_malformed`)."""
        data = self._tail + chunk if self._tail else chunk
        if b"\r" in data:
            # CRLF and a bare CR end a line too (the SSE spec); a CR at the very end may be
            # the first half of a CRLF, so its line waits for the next chunk.
            held = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = data.split(b"\n")
            if held:
                lines.pop()  # the empty rest after the held CR
                self._tail = lines.pop() + b"\r"
            else:
                self._tail = lines.pop()
        else:
            lines = data.split(b"\n")
            self._tail = lines.pop()
        for line in lines:
            if line[:5] == b"data:":
                payload = line[5:].strip()
                if payload[:6] == b"[DONE]":
                    self._complete = True
                    if self._capture:
                        self._call.output = "".join(self._parts)
                    continue
                self._data.append(payload)
            elif not line.strip(b"\r") and self._data:  # the event's end
                self._event()

    def _event(self) -> None:
        """One event's data (its ``data:`` lines joined, as SSE clients read them)."""
        parts, self._data = self._data, []
        raw = parts[0] if len(parts) == 1 else b"\n".join(parts)
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            self._malformed(raw, f"not valid JSON ({exc})")
        if obj.__class__ is not dict:
            self._malformed(raw, f"a JSON {type(obj).__name__}, not an object")
        if self._capture:
            choices = obj.get("choices")
            if isinstance(choices, list) and choices:
                text = text_of(choices[0])
                if text:
                    self._parts.append(text)
        usage = obj.get("usage")
        if usage is None and (whole := obj.get("response")).__class__ is dict:
            usage = whole.get("usage")  # the Responses API's: in response.completed
        if usage is not None:
            usage_into(self._state, usage)
        if (facts := self._call.reply) is not None:
            facts.read(obj, "delta")
        if self._learn and _NAME_KEY in raw and _TOOL_CALLS_KEY in raw:
            tool_names_into(self._tools, obj.get("choices"), "delta")
            self._call.tools = tuple(self._tools)

    def _malformed(self, raw: bytes, problem: str) -> NoReturn:
        """An event the caller's client cannot parse: the call ends in an error that
        says so (not a ``JSONDecodeError`` from deep inside the client)."""
        message = self._call.core.redact(
            f"endpoint {self._url} sent a malformed stream event: its data is {problem}; "
            f"data starts {raw[:80]!r}"
        )
        self._call.end("error", message)
        raise EndpointError(message, endpoint=self._url, attempts=self._state.attempts)

    async def aclose(self) -> None:
        self._open.pop(self, None)
        try:
            if not self._shut_done:
                self._shut_done = True
                await self._inner.aclose()
        finally:
            if self._complete:
                self._call.end("ok", None)
            else:  # the caller stopped reading: its choice, not the endpoint's failure
                self._call.end("cancelled", "the caller closed the stream before its end")

    def _abandon(self, why: str) -> None:
        """Its session or job ended before the caller read or closed it: the call ends
        (``cancelled``, as a stream its caller closes early), if it has not."""
        self._call.end("ok" if self._complete else "cancelled", None if self._complete else why)

    async def _shut(self) -> None:
        """Close the connection of a stream left unread (after :meth:`_abandon`)."""
        self._open.pop(self, None)
        if self._shut_done:
            return
        self._shut_done = True
        try:
            await self._inner.aclose()
        except Exception as exc:  # a connection that broke meanwhile: nothing to close
            transport_log.debug("closing a stream left unread: %r", exc)


class UsageFilter:
    """The stream a caller reads when agentrt asked for the usage chunk on its behalf
    (``TransportCall._ask_usage``): the reply's whole SSE events as the server sends them
    unasked. Asking adds a usage-only chunk (``"choices": []``), ``"usage": null`` to the
    other chunks (OpenAI), may put the usage in the finish chunk instead (some servers),
    and may move the ``system_fingerprint`` from the last content chunk onto the usage
    chunk (vLLM): the first three are removed, the fingerprint is put back. No content
    chunk is held: only a chunk that finishes the last of the reply's ``choices``
    choices, has no fingerprint and no usage waits, until the next event (the usage
    chunk, which follows it at once, or whatever comes). The usage itself was read by the
    observed stream."""

    __slots__ = ("_choices", "_finished", "_held", "_pending", "_stream")

    def __init__(self, stream: ObservedStream, choices: int = 1) -> None:
        self._stream = stream
        self._held = b""
        """The start of an event whose end has not come yet."""
        self._pending: bytes | None = None
        """The chunk that finished the last choice, until the next event."""
        self._choices = choices
        """The choices the reply has (the request's ``n``)."""
        self._finished: set[Any] = set()
        """The indices of the choices that have finished."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        stream = self._stream
        while True:
            try:
                chunk = await stream.__anext__()
            except StopAsyncIteration:
                held, self._held = self._held, b""
                out = self._events(held) if held else b""  # a last event without its end
                pending, self._pending = self._pending, None
                out += pending or b""
                if out:
                    return out
                raise
            data = self._held + chunk if self._held else chunk
            end = _events_end(data)
            self._held = data[end:]
            out = self._events(data[:end]) if end else b""
            if out:
                return out

    def _events(self, events: bytes) -> bytes:
        """Complete events as the caller is to read them (the last may be held back)."""
        if _USAGE_KEY in events:
            events = events.replace(_NULL_USAGE_LAST, b"")  # OpenAI's (a tenth of the regex)
            if _USAGE_KEY in events:
                events = _NULL_USAGE_FIELD.sub(b"", events)
        if self._pending is None and _USAGE_KEY not in events and FINISH.search(events) is None:
            return events  # content chunks: as they are
        parts = _EVENT_END.split(events)  # event, separator, event, ..., the rest
        out: list[bytes] = []
        for k in range(0, len(parts), 2):
            event = parts[k] + (parts[k + 1] if k + 1 < len(parts) else b"")
            if not event:
                continue
            pending = self._pending
            obj = _chunk_of(event) if _USAGE_KEY in event or FINISH.search(event) else None
            usage = None if obj is None else obj.get("usage")
            if usage.__class__ is dict and obj is not None and not obj.get("choices"):
                # The usage-only chunk: dropped; its fingerprint onto the held chunk.
                if pending is not None:
                    out += _with_fingerprint([pending], obj.get("system_fingerprint"))
                    self._pending = None
                continue
            if pending is not None:  # held until the next event, whatever it is
                out.append(pending)
                self._pending = None
            if obj is None:
                out.append(event)
            elif usage.__class__ is dict:  # usage in a content chunk: no usage chunk follows
                self._finish(obj)
                out.append(_without_usage(event, obj))
            elif self._finish(obj) and _FINGERPRINT not in event:
                self._pending = event  # the usage chunk may have its fingerprint
            else:
                out.append(event)
        return b"".join(out)

    def _finish(self, obj: dict[str, Any]) -> bool:
        """Note the choices ``obj`` finishes; whether every choice has now finished."""
        choices = obj.get("choices")
        if isinstance(choices, list):
            for c in choices:
                if isinstance(c, dict) and c.get("finish_reason") is not None:
                    index = c.get("index", 0)
                    self._finished.add(index if isinstance(index, int) else 0)
        return len(self._finished) >= self._choices


def _events_end(data: bytes) -> int:
    """Where the last complete SSE event in ``data`` ends (0: none is complete): after
    its blank line, whose line ends are LF, CRLF or a bare CR."""
    i = data.rfind(b"\n\n")
    end = i + 2 if i >= 0 else 0
    j = data.rfind(b"\r\n\r\n")
    if j >= 0 and j + 4 > end:
        end = j + 4
    k = data.rfind(b"\r\r")
    return k + 2 if k >= 0 and k + 2 > end else end


def _chunk_of(event: bytes) -> dict[str, Any] | None:
    """An SSE event's chunk (its ``data:`` lines joined), if it is a JSON object."""
    data = b"\n".join(line[5:] for line in event.splitlines() if line.startswith(b"data:"))
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


_USAGE_MEMBER = re.compile(r'(,\s*)?"usage"\s*:\s*')
_COMMA_AFTER = re.compile(r"\s*,\s*")


def _without_usage(event: bytes, obj: dict[str, Any]) -> bytes:
    """``event`` without the ``usage`` member of its chunk ``obj``, every other byte as
    the server sent it; the chunk re-encoded on one ``data:`` line where the member
    cannot be cut out alone."""
    want = {k: v for k, v in obj.items() if k != "usage"}
    text = event.decode(errors="surrogateescape")
    for m in _USAGE_MEMBER.finditer(text):
        try:
            _, end = _JSON.raw_decode(text, m.end())
        except ValueError:
            continue
        rest = text[end:]
        if not m.group(1) and (comma := _COMMA_AFTER.match(rest)) is not None:
            rest = rest[comma.end() :]  # the first member: the comma after it goes
        cut = (text[: m.start()] + rest).encode(errors="surrogateescape")
        if _chunk_of(cut) == want:
            return cut
    lines = [line for line in event.splitlines() if line and not line.startswith(b"data:")]
    lines.append(b"data: " + json.dumps(want, separators=(",", ":")).encode())
    return b"\n".join(lines) + b"\n\n"


def _with_fingerprint(events: list[bytes], fingerprint: Any) -> list[bytes]:
    """``events``, each chunk with a finish reason given ``system_fingerprint`` where it
    has none (as the last member of its object, where vLLM puts it unasked)."""
    if not isinstance(fingerprint, str):
        return events
    member = b',"system_fingerprint":' + json.dumps(fingerprint).encode()
    out = []
    for event in events:
        if FINISH.search(event) and _FINGERPRINT not in event:
            i = event.rfind(b"}")
            if i > 0:
                event = event[:i] + member + event[i:]
        out.append(event)
    return out
