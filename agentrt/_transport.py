"""The httpx-family transport: tag -> route -> send (with retries) -> observe.

This is agentrt's one integration point with HTTP. Every call made through a client that
agentrt built (``rt.openai()``, ``rt.http_client()``, ``session.chat``) passes through
:class:`AgentTransport.handle_async_request`, which

1. finds the call's session (contextvars: its job's default one outside any session)
   or opens an implicit one-call job (outside any job),
2. builds the call's :class:`CallMetadata` (turn, attained service, idle times),
3. picks an endpoint with the router,
4. lets the endpoint's dialect add its headers and body fields,
5. sends it through the wrapped transport, retrying per :class:`Retry`,
6. observes the reply (usage, cached tokens, time to first token) into the job's report.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import importlib.metadata
import json
import logging
import operator
import random
import re
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from datetime import UTC, datetime
from functools import cache
from threading import get_ident
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import httpx
import openai
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from ._context import (
    _CALL_SESSION,
    _CURRENT_JOB,
    Job,
    Session,
    _CallState,
    call_session,
    current_session,
    new_id,
)
from ._errors import AgentrtError, EndpointError, RuntimeClosedError, only_cancelled
from ._log import credential_forms, routing_log, scrub_bytes, transport_log
from ._notice import accept_header
from ._protocol import HEADER, CallMetadata, trusted_model
from .dialects._generic import check_header_name, check_header_value
from .scheduling._queue import Ticket
from .scheduling._retention import RetentionEstimator
from .scheduling._routing import RouteKey, prefix_fingerprints
from .telemetry._events import (
    AttemptFailed,
    CallEnded,
    CallQueued,
    CallSent,
    CallStarted,
    FirstToken,
    SessionMoved,
)
from .telemetry._reply import ReplyFacts, temperature_of
from .telemetry._report import CallStatus

if TYPE_CHECKING:
    from ._state import _Core, _EndpointState

__all__ = [
    "CLOSED_MESSAGE",
    "WRONG_LOOP_MESSAGE",
    "AgentTransport",
    "ClientClosedError",
    "HttpLib",
    "WrongLoopError",
    "http_lib",
]

CLOSED_MESSAGE = (
    "this Runtime is closed: its block has ended, and neither it nor the clients it built "
    "(rt.openai(), rt.http_client(), framework models) take new calls"
)


WRONG_LOOP_MESSAGE = (
    "this Runtime was used from another event loop than the one it was entered in (another "
    "thread's asyncio.run or trio.run, say): a Runtime, its jobs, sessions and clients live "
    "in that one loop. Use one Runtime per event loop, or a SyncRuntime to share one "
    "runtime between threads"
)


class WrongLoopError(AgentrtError, openai.OpenAIError):
    """A runtime (or a client it built) used from an event loop other than its own: an
    ``AgentrtError`` that openai's clients pass on as it is (see
    :class:`ClientClosedError`)."""


class ClientClosedError(RuntimeClosedError, openai.OpenAIError):
    """:class:`RuntimeClosedError` as a client agentrt built raises it. openai-python passes
    its own errors through as they are and (2.x) wraps any other one from the HTTP client
    in ``APIConnectionError``: as an ``OpenAIError`` too, the refusal reaches the caller
    unchanged, from openai's clients and from the frameworks built on them."""


RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_DEBUG = logging.DEBUG
_INFO = logging.INFO
_AUTH = b"authorization"
_AGENTRT = HEADER.encode()
_LOWER = operator.itemgetter(1)
"""A header triple's lower-case name (httpx's ``Headers._list`` items)."""
_USAGE_KEY = b'"usage"'
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]{1,32})"')
_JSON = json.JSONDecoder()


_USAGE_PATHS = frozenset({"/chat/completions", "/completions"})
"""The streamed APIs whose ``stream_options.include_usage`` adds a final usage chunk."""
_NULL_USAGE_LAST = b',"usage":null'
_NULL_USAGE_FIELD = re.compile(rb',\s*"usage"\s*:\s*null|"usage"\s*:\s*null\s*,')
"""A ``"usage": null`` member of a JSON object, with its comma. Outside a JSON string
only: inside one a quote is escaped, so ``,"`` and ``"usage":`` cannot occur there."""
_FINGERPRINT = b'"system_fingerprint"'
_EVENT_END = re.compile(rb"(\r\n\r\n|\n\n|\r\r)")
_PRIORITY_REFUSED = re.compile(rb"priority scheduling is not enabled", re.IGNORECASE)
"""In a 400 to a call that carried a priority: vLLM refuses a non-zero priority with
``Got priority {priority} but Priority scheduling is not enabled.`` when it was not
started with ``--scheduling-policy priority`` (``LLMEngine.add_request`` and the async
engine's ``add_request_async``); a proxy in front of it (LiteLLM) keeps that text."""
_MAX_ERROR_SCAN = 64 * 1024
"""Bytes of an error body searched for that text (vLLM's whole error object is ~150)."""
_TOOL_CALLS_KEY = b'"tool_calls"'
_NAME_KEY = b'"name"'
_MAX_TOOL_NAMES = 16
_MAX_TOOL_NAME = 200


def _tool_names_into(names: list[str], choices: Any, key: str) -> None:
    """Append the function names of ``choices[0][key]["tool_calls"]`` (``key``:
    ``message`` in a reply, ``delta`` in a stream chunk); anything malformed is skipped."""
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
        return
    part = choices[0].get(key)
    calls = part.get("tool_calls") if isinstance(part, dict) else None
    if not isinstance(calls, list):
        return
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and 0 < len(name) <= _MAX_TOOL_NAME:
            if len(names) >= _MAX_TOOL_NAMES:
                return
            names.append(name)


def _reply_object(raw: bytes, suffix: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object of a 2xx reply, parsed once (its usage, finish reason, tool calls
    and text are read from it), or None and what is wrong with it: not JSON (cut short,
    garbled), not an object, or, for the completion APIs, no ``choices`` list (``{}``,
    an error object).

    ``raw_decode`` of the UTF-8 text costs two thirds of ``json.loads`` on bytes;
    anything it does not take (leading whitespace, another encoding) goes through
    ``json.loads``."""
    try:
        text = raw.decode()
        data, end = _JSON.raw_decode(text)
        if end != len(text) and text[end:].strip(" \t\n\r"):
            raise ValueError("extra data")
    except ValueError:
        try:
            data = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError included
            return None, f"the body is not valid JSON ({exc})"
    if data.__class__ is not dict:
        return None, f"the body is a JSON {type(data).__name__}, not an object"
    if suffix in _USAGE_PATHS and data.get("choices").__class__ is not list:
        keys = ", ".join(list(data)[:6]) or "none"
        what = "an error object" if "error" in data else "not a completion"
        return None, f"the body is {what} (no 'choices' list; keys: {keys})"
    return data, ""


_async_library: Callable[[], str] | None
try:  # openai depends on sniffio; anyio no longer does
    from sniffio import current_async_library as _async_library
except ImportError:  # pragma: no cover
    _async_library = None


def loop_clock() -> Callable[[], float]:
    """The clock ``anyio.current_time()`` reads, found once per runtime (when it opens):
    the running asyncio loop's ``time`` (0.06 µs a read, where anyio's lookup of its
    backend costs 0.4 µs), else ``anyio.current_time`` itself (trio, or when the library
    cannot be told). A runtime lives in one event loop."""
    if _async_library is not None and _async_library() == "asyncio":
        return asyncio.get_running_loop().time
    return anyio.current_time


_CONTENT_ENCODING = b"content-encoding"


def _encoded(headers: Any) -> bool:
    """Whether a reply has a ``Content-Encoding``. Scans the headers' raw list where the
    library keeps one (as ``accept_header`` does): ``in`` builds a list of every name,
    0.3 µs against 0.1 µs, on every reply."""
    raw = getattr(headers, "_list", None)
    if not isinstance(raw, list):
        return "content-encoding" in headers
    return _CONTENT_ENCODING in map(_LOWER, raw)


class DeadlineExceeded(TimeoutError, openai.OpenAIError):
    """A call ran into its job's deadline (raised where the call was, as the job's own
    cancel scope makes ``rt.job(deadline_s=...)`` raise ``TimeoutError``). An
    ``OpenAIError`` too, so that openai 2.x passes it on instead of wrapping it in
    ``APIConnectionError``."""


_MAX_STALE = 256
"""Resends of one attempt after kept-alive connections the server had closed. Each such
connection leaves the pool, so the resends end once the pool's idle connections are
spent (at most its keep-alive limit, 256 in the runtime's own client); this only bounds
them. A bound of 8 was too low: a pool of 20 parallel sub-agents' idle connections, all
closed by the server, ran past it and turned a stale connection into a failed attempt
(the trio soak test, one run in six)."""


class _ConnTrace:
    """httpcore's ``trace`` extension on an attempt's request: whether it went out on a
    kept-alive connection (its headers sent with no connect before them) or on one made
    for it. The caller's own ``trace`` callback, if any, still receives every event;
    without one, the trace leaves the request once it knows (httpcore looks it up at each
    step), so an attempt pays for one to three events, not a dozen. Transports that do
    not trace (a mock, the embedded engine) leave ``reused`` false."""

    __slots__ = ("caller", "connected", "extensions", "reused")

    def __init__(self, caller: Any, extensions: dict[str, Any]) -> None:
        self.caller = caller
        self.extensions = extensions
        self.connected = False
        self.reused = False

    @classmethod
    def install(cls, request: httpx.Request) -> _ConnTrace:
        caller = request.extensions.get("trace")
        if caller.__class__ is cls:  # ours, from an earlier attempt
            caller = caller.caller
        extensions = {**request.extensions}  # the caller's dict untouched
        extensions["trace"] = trace = cls(caller, extensions)
        request.extensions = extensions
        return trace

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.endswith(".send_request_headers.started"):
            self.reused = not self.connected
            if self.caller is None:
                self.extensions.pop("trace", None)
        elif name.startswith("connection.connect_"):
            self.connected = True
        if self.caller is not None:
            await self.caller(name, info)


class _RetryableStatus(Exception):
    def __init__(self, response: httpx.Response, retry_after: float | None) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        self.retry_after = retry_after


class _RetryableError(Exception):
    def __init__(self, error: Exception, endpoint: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.endpoint = endpoint


def _retry_after(headers: httpx.Headers, now: datetime | None = None) -> float | None:
    """The wait a retryable reply asks for, in seconds: ``retry-after-ms`` (OpenAI's),
    else ``Retry-After`` as seconds or as an HTTP date (RFC 9110, section 10.2.3; a date
    in the past asks for no wait); None if absent or unreadable (then the backoff goes
    as usual). The caller caps it at ``Retry.retry_after_max``."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return float(value) / 1000.0
        except ValueError:
            return None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as HTTP dates are
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _usage_into(report: _CallState, usage: Any) -> None:
    """A reply's ``usage`` into the call's tokens: chat and text completions name them
    ``prompt_tokens``, ``completion_tokens`` and ``prompt_tokens_details``, the
    Responses API ``input_tokens``, ``output_tokens`` and ``input_tokens_details``."""
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


def _content_of(body: dict[str, Any] | None) -> Any:
    """What a request asked (its messages, or its prompt), for ``capture_content``."""
    if not body:
        return None
    return body.get("messages", body.get("prompt"))


def _text_of(choice: Any) -> str | None:
    if not isinstance(choice, dict):
        return None
    for key in ("message", "delta"):
        part = choice.get(key)
        if isinstance(part, dict) and isinstance(part.get("content"), str):
            return str(part["content"])
    text = choice.get("text")
    return text if isinstance(text, str) else None


def _request_body(content: bytes) -> dict[str, Any] | None:
    """The JSON object a request sends, else None.

    ``raw_decode`` of the UTF-8 text costs a third of ``json.loads`` on bytes (no encoding
    detection, no whitespace regex); anything it does not take (leading whitespace, another
    encoding) goes through ``json.loads``."""
    try:
        text = content.decode()
        parsed, end = _JSON.raw_decode(text)
        if end != len(text) and text[end:].strip(" \t\n\r"):
            raise ValueError("extra data")
    except ValueError:
        try:
            parsed = json.loads(content)
        except ValueError:
            return None
    return parsed if isinstance(parsed, dict) else None


def _merge_body(body: dict[str, Any], extra: dict[str, Any]) -> None:
    """Merge dialect fields into the body; never overwrite what the caller set."""
    for key, value in extra.items():
        if key not in body:
            body[key] = value
        elif isinstance(body[key], dict) and isinstance(value, dict):
            _merge_body(body[key], value)


# -- the HTTP library ---------------------------------------------------------------------
#
# agentrt speaks either legacy ``httpx`` or ``httpx2`` (the maintained fork that openai 3.x
# is built on; same API, different classes). A Runtime picks one library once, and every
# object it builds comes from that library. agentrt's own transport and stream classes are
# written once, as plain classes, and combined per library with that library's base
# classes (clients check e.g. ``isinstance(response.stream, <lib>.AsyncByteStream)``).
# The annotations below name legacy httpx types: httpx2's have the same shape.


class HttpLib:
    """One HTTP library (legacy ``httpx`` or ``httpx2``) and agentrt's classes on it."""

    def __init__(self, mod: ModuleType) -> None:
        self.mod: Any = mod
        self.name = mod.__name__
        self.transport_errors: tuple[type[Exception], ...] = (mod.TransportError, OSError)
        self.connect_errors: tuple[type[Exception], ...] = (
            mod.ConnectError,
            mod.ConnectTimeout,
            OSError,
        )
        """No connection could be made: the endpoint is down at once (docs/routing.md)."""
        self.stale_errors: tuple[type[Exception], ...] = (mod.RemoteProtocolError, mod.ReadError)
        """What a kept-alive connection the server had closed raises before any reply."""
        # Requests are copied shallowly and their headers edited through Headers' raw list
        # when the library has one (httpx and httpx2 both do); otherwise each attempt
        # builds a new request.
        self.raw_headers = isinstance(getattr(mod.Headers(), "_list", None), list) and hasattr(
            mod.Request("GET", "http://x/"), "__dict__"
        )
        self.AgentTransport: Any = self._derive(AgentTransport, mod.AsyncBaseTransport)
        self.ObservedStream: Any = self._derive(_ObservedStream, mod.AsyncByteStream)
        self.SharedTransport: Any = self._derive(_SharedTransport, mod.AsyncBaseTransport)
        self.SyncTransport: Any = self._derive(_SyncTransport, mod.BaseTransport)
        self.SyncStream: Any = self._derive(_SyncStream, mod.SyncByteStream)
        self.Bytes: Any = self._derive(_Bytes, mod.AsyncByteStream, mod.SyncByteStream)

    def _derive(self, impl: type, *bases: type) -> type:
        """``impl``'s behaviour on ``bases`` (this library's classes), bound to it."""
        return type(impl.__name__, (impl, *bases), {"__module__": __name__, "_lib": self})

    def __repr__(self) -> str:
        return f"<agentrt HttpLib {self.name}>"


class _Bytes:
    """A body held in memory, as the library's ``ByteStream``, but read without an async
    generator: a read cut by cancellation between its one chunk and its end leaves
    nothing to finalize (trio warns of an async generator collected unfinished, and
    cancelled calls under trio left one per request body)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __iter__(self) -> Iterator[bytes]:
        yield self._data

    def __aiter__(self) -> _Once:
        return _Once(self._data)


class _Once:
    """An async iterator over one chunk."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        data = self._data
        if data is None:
            raise StopAsyncIteration
        self._data = None
        return data


@cache
def _lib_of(mod: ModuleType) -> HttpLib:
    return HttpLib(mod)


@cache
def _httpx2() -> ModuleType | None:
    try:
        return importlib.import_module("httpx2")
    except ImportError:
        return None


@cache
def _openai_major() -> int:
    try:
        return int(importlib.metadata.version("openai").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


def http_lib(transport: object | None = None) -> HttpLib:
    """The HTTP library a Runtime uses: that of ``transport`` when one is given, else
    ``httpx2`` when it is installed and openai is 3.x or later, else legacy ``httpx``."""
    h2 = _httpx2()
    if transport is not None:
        if h2 is not None and isinstance(transport, h2.AsyncBaseTransport | h2.BaseTransport):
            return _lib_of(h2)
        return _lib_of(httpx)
    if h2 is not None and _openai_major() >= 3:
        return _lib_of(h2)
    return _lib_of(httpx)


class AgentTransport:
    """Wraps a real transport; tags, routes, retries and observes every call.

    Instantiate it through :attr:`HttpLib.AgentTransport` (this class on the library's
    ``AsyncBaseTransport``)."""

    _lib: HttpLib

    def __init__(self, core: _Core, inner: httpx.AsyncBaseTransport) -> None:
        self._core = core
        self._inner = inner
        self._placeholder = f"Bearer {core.placeholder_key}".encode()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        core = self._core
        if core.closed or get_ident() != core.loop_thread:  # before anything is counted or sent
            if core.closed:
                raise ClientClosedError(CLOSED_MESSAGE)
            raise WrongLoopError(WRONG_LOOP_MESSAGE)
        route = core.match(request.url)
        if route is None:
            # Not addressed to agentrt or one of its endpoints: pass through untouched.
            return await self._inner.handle_async_request(request)
        session = call_session(core)
        implicit: Job | None = None
        if session is None:
            implicit = Job._implicit(core)
            session = implicit._new_session(None, None, None)
        try:
            session._check_usable()
            call = _Call(self, request, route[0], route[1], session, implicit)
            deadline = call.ticket.deadline_at
            if deadline is None:
                return await call.run()
            return await call.run_bounded(deadline)
        except BaseException:
            if implicit is not None:
                session._unpin()
                implicit._end_implicit()
            raise

    def _prepare(
        self,
        request: httpx.Request,
        url: httpx.URL,
        add: dict[str, str],
        auth: bytes | None,
        content: bytes | None,
    ) -> httpx.Request:
        """The request to send for one attempt: the caller's, with the dialect's (and
        hooks') headers except those the caller set itself (the caller's own metadata
        wins, as its body fields do: docs/protocol.md, section 3; ``x-agentrt``, which
        describes this call, is always agentrt's), the endpoint's
        ``Authorization`` (its key or credentials, encoded once per endpoint), and the
        new body if any.

        Building a second request the usual way would cost a URL parse and a header
        normalisation pass on every call; a shallow copy with a copied header list costs
        about a microsecond."""
        lib = self._lib
        # (raw name, lower name, value) triples, as Headers keeps them; dialects emit
        # lower case.
        if lib.raw_headers:
            callers = set(map(_LOWER, request.headers._list))
        else:
            callers = {k.lower() for k, _ in request.headers.raw}
        callers.discard(_AGENTRT)
        new = [
            (name, name, v.encode()) for k, v in add.items() if (name := k.encode()) not in callers
        ]
        if auth is not None:
            new.append((_AUTH, _AUTH, auth))
        if content is not None:
            length = str(len(content)).encode()
            new.append((b"content-length", b"content-length", length))
        if url is not request.url:
            new.append((b"host", b"host", url.netloc))
        names = set(map(_LOWER, new))
        placeholder = self._placeholder
        if not lib.raw_headers:
            # A library whose Headers keeps no raw list: build a fresh request.
            headers = [
                (k, v)
                for k, v in request.headers.raw
                if (lk := k.lower()) not in names and not (lk == _AUTH and v == placeholder)
            ]
            headers.extend((k, v) for k, _, v in new)
            return lib.mod.Request(  # type: ignore[no-any-return]
                request.method,
                url,
                headers=headers,
                content=request.content if content is None else content,
                extensions=request.extensions,
            )
        # A shallow copy of the caller's request with its own header list: no URL parse,
        # no header normalisation, and the caller's request stays as it was.
        # (Headers() itself costs 0.6 µs: an ABC isinstance check on its argument.)
        out = object.__new__(type(request))
        out.__dict__.update(request.__dict__)
        src = request.headers
        headers_obj = object.__new__(type(src))
        headers_obj.__dict__.update(src.__dict__)
        # The caller's (raw, lower, value) list copied (it stays as it was), without the
        # names set here and without agentrt's placeholder key; found with C-level scans
        # (a Python loop over a dozen headers costs more than the rest of this).
        raw: list[tuple[bytes, bytes, bytes]] = src._list.copy()
        present = list(map(_LOWER, raw))
        for name in names:
            while name in present:
                i = present.index(name)
                del present[i], raw[i]
        i = 0
        for _ in range(present.count(_AUTH)):  # the caller's own: kept unless placeholders
            i = present.index(_AUTH, i)
            if raw[i][2] == placeholder:
                del present[i], raw[i]
            else:
                i += 1
        raw += new
        headers_obj._list = raw
        out.headers = headers_obj
        out.url = url
        if content is not None:
            out.stream = lib.Bytes(content)
            out._content = content
        elif type(request.stream) is lib.mod.ByteStream:  # the caller's body, in memory
            out.stream = lib.Bytes(request.content)
        return out

    def _rebuild(self, response: httpx.Response, content: bytes) -> httpx.Response:
        """The reply, read, handed on with its (decoded) body. An error reply says
        ``x-should-retry: false``: agentrt made the attempts its policy allows, and
        openai's clients (whatever their ``max_retries``: a copy's, a request's, a client
        of the caller's on ``rt.http_client()``) obey it rather than retry on top."""
        lib = self._lib.mod
        if response.status_code >= 400:
            response.headers["x-should-retry"] = "false"
        if not _encoded(response.headers):
            # Nothing was decoded: the read response itself can go on, its body in place
            # (an error's as scrubbed: the read body is kept apart from the stream).
            response.stream = self._lib.Bytes(content)
            response._content = content
            return response
        headers = lib.Headers(response.headers)
        for h in ("content-encoding", "content-length", "transfer-encoding"):
            if h in headers:
                del headers[h]
        return lib.Response(  # type: ignore[no-any-return]
            response.status_code,
            headers=headers,
            content=content,
            extensions=response.extensions,
        )


def _what_to_do(error: BaseException, url: str, lib: Any) -> str:
    """What the caller can do about the transport error that ended a call on ``url``
    (the end of :class:`EndpointError`'s message, so that it stands on its own)."""
    if isinstance(error, lib.ConnectError | lib.ConnectTimeout | OSError):
        return (
            f"is a server running at {url}? Check the URL (scheme, host, port and path), "
            "and that the server is up and listening there"
        )
    if isinstance(error, lib.TimeoutException):
        return (
            f"the server at {url} did not answer within the timeout; if it is busy or its "
            "replies are long, raise Runtime(timeout_s=...)"
        )
    return (
        f"the server at {url} closed the connection or broke off its reply; is it an "
        "OpenAI-compatible server, and healthy?"
    )


def _route(
    core: _Core, session: Session, avoid: Collection[int], prefix: tuple[int, ...], tokens: int
) -> tuple[int, str | None]:
    """The endpoint for the session's call, and why the session moved there from the
    replica that served its previous turn (its KV cache there is lost), or None if it
    did not move: ``"unavailable"`` (its replica failed or is down), the router's own
    reason where it gives one (``SessionAffinity.move_reason``: ``"retention"``,
    ``"overload"``), else ``"routing"``."""
    endpoints = core.endpoints
    home = session.endpoint_index
    index = 0
    if len(endpoints) > 1:
        idle = None
        if home is not None and session._last_reply_at is not None:
            idle = anyio.current_time() - session._last_reply_at
            retention = endpoints[home].retention
            if retention.dirty:
                endpoints[home].load.retention_s = retention.estimate()
        key = RouteKey(session.id, home, home is None, prefix, tokens, idle, session._stable)
        index = core.router.choose([e.load for e in endpoints], key, avoid)
        core.router.served(index, key)
    if home == index:
        return index, None
    session.endpoint_index = index
    if not session._closed:  # an ended session counts nowhere (Session._unpin)
        endpoints[index].load.sessions += 1
        if home is not None:
            endpoints[home].load.sessions -= 1
    if home is None:
        return index, None
    if home in avoid or not endpoints[home].load.healthy:
        return index, "unavailable"
    reason: str | None = getattr(core.router, "move_reason", None)
    return index, reason or "routing"


def _replied(core: _Core, session: Session, state: _CallState, idle_s: float | None) -> None:
    """A call of ``session`` succeeded: if it resumed the session on the replica that
    served its previous turn, record whether that replica still had the prefix."""
    index = session.endpoint_index
    if index is None or not core.learn_retention:
        return
    previous, session._cacheable = session._cacheable, None
    if state.prompt_tokens is None:
        return
    session._cacheable = (index, state.prompt_tokens + (state.completion_tokens or 0))
    if (
        previous is not None
        and previous[0] == index
        and idle_s is not None
        and state.cached_tokens is not None
        and not state.moved
    ):
        hit = RetentionEstimator.hit(previous[1], state.cached_tokens)
        if hit is not None:
            core.endpoints[index].retention.observe(idle_s, hit)


class _Call:
    """One call through the transport: its metadata, its attempts, its accounting."""

    __slots__ = (
        "added_usage",
        "backoff_s",
        "base",
        "body",
        "clock",
        "core",
        "ended",
        "ep",
        "failed",
        "finish_reason",
        "implicit",
        "output",
        "prefix",
        "reply",
        "request",
        "sent_at",
        "session",
        "state",
        "suffix",
        "ticket",
        "tools",
        "transport",
        "turn",
    )

    def __init__(
        self,
        transport: AgentTransport,
        request: httpx.Request,
        base: str,
        suffix: str,
        session: Session,
        implicit: Job | None,
    ) -> None:
        self.transport = transport
        self.core = core = transport._core
        self.request = request
        self.base = base
        self.suffix = suffix
        self.session = session
        self.implicit = implicit
        self.ep: _EndpointState | None = None
        """The endpoint of the attempt in flight, counted in its load until released."""
        self.failed: set[int] = set()
        self.backoff_s = 0.0
        """Seconds slept between attempts: not service the program received."""
        self.ended = False
        self.output: str | None = None
        """The completion text, collected only with ``capture_content`` and hooks."""
        self.finish_reason: str | None = None
        """The first choice's finish reason, looked up only when there are hooks or the
        runtime learns tool waits."""
        self.tools: tuple[str, ...] = ()
        """The tools the reply calls, looked up only when the runtime learns tool waits."""
        self.reply = ReplyFacts() if core.hooks else None
        """The reply's id, model, finish reasons and tool calls, read only for hooks."""
        job = session.job
        content = request.content if request.method == "POST" else b""
        self.body = body = _request_body(content) if content else None
        stream = False
        max_out = model = None
        if body:
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
        self.added_usage = False
        """agentrt asked for the stream's usage chunk (the caller did not): the chunk is
        read for the report and dropped from what the caller receives."""
        if stream and suffix in _USAGE_PATHS:
            assert body is not None
            options = body.get("stream_options")
            if options.__class__ is not dict or not (
                options.get("include_usage") or options.get("continuous_usage_stats")
            ):
                self.request = self._ask_usage(request, body, options)

        self.clock = clock = core.clock
        now = clock()
        after_tools = bool(session._period_tools)  # tool waits since the last call
        turn, idle_s, declared, expected, source, final = session._begin_turn(now)
        self.turn = (turn, idle_s, declared, expected, source, max_out, final)
        call_id = new_id("call")
        self.state = _CallState(
            call_id,
            session.id,
            session.name,
            turn,
            suffix,
            model,
            stream,
            now - job._t0,
            now,
        )
        job._calls.append(self.state)
        if self.turn[1] is not None:
            self.state.idle_s = self.turn[1]
            if after_tools:
                self.state.idle_cause = "tool"
        if core.prefixes is not None and content:
            self.state.prefix = core.prefixes.observe(session.id, content)
        tokens = len(content) // 4 + (max_out or 0)  # ~4 bytes of JSON per prompt token
        deadline = None if job.deadline_s is None else job._t0 + job.deadline_s
        self.ticket = Ticket(
            call_id, job.id, job.program_id, session.id, session.parent_id, tokens, deadline
        )
        self.prefix: tuple[int, ...] = ()
        if core.prefix_aware and session.endpoint_index is None and content:
            self.prefix = prefix_fingerprints(content)
        self.sent_at = now
        if core.hooks:
            core.emit(
                CallStarted(
                    t=now,
                    job_id=job.id,
                    session_id=session.id,
                    call_id=call_id,
                    turn=turn,
                    path=suffix,
                    model=model,
                    stream=stream,
                    content=_content_of(body) if core.capture_content else None,
                    max_tokens=max_out,
                    temperature=temperature_of(body),
                    session_name=session.name,
                )
            )

    def _ask_usage(self, request: httpx.Request, body: dict[str, Any], options: Any) -> Any:
        """The request of a streamed call whose caller did not ask for usage, asking for
        it (``stream_options.include_usage``; the caller's other stream options kept), so
        that its tokens are counted; and without compression, so that the stream can be
        read and its usage-only chunk dropped. Built once per such call, never for others.
        """
        asked = dict(options) if options.__class__ is dict else {}
        asked["include_usage"] = True
        body["stream_options"] = asked
        content = json.dumps(body, separators=(",", ":")).encode()
        headers = [
            (k, v)
            for k, v in request.headers.raw
            if k.lower() not in (b"content-length", b"accept-encoding")
        ]
        headers.append((b"accept-encoding", b"identity"))
        self.added_usage = True
        return self.transport._lib.mod.Request(
            request.method,
            request.url,
            headers=headers,
            content=content,
            extensions=request.extensions,
        )

    # -- sending ------------------------------------------------------------------------

    def _metadata(self, priority: int | None) -> CallMetadata:
        session = self.session
        job = session.job
        program = job._program
        turn, idle_s, declared, expected, source, max_out, final = self.turn
        deadline = self.ticket.deadline_at
        # Not validated again: the ids were checked when the job and session were made,
        # the numbers are agentrt's own (tests/test_hot_path.py compares the two ways).
        return trusted_model(
            CallMetadata,
            {
                "call_id": self.state.call_id,
                "job_id": job.id,
                "session_id": session.id,
                "program_id": job.program_id,
                "parent_session_id": session.parent_id,
                "root_session_id": session.root_id,
                "session_name": session.name,
                "blocks_parent": session.blocks_parent,
                "turn": turn,
                "first_turn": turn == 0,
                "service_s": float(program.service_s),
                "service_tokens": program.service_tokens,
                "idle_expected_s": None if expected is None else float(expected),
                "idle_expected_source": source,
                "idle_s": idle_s,
                "idle_declared_s": None if declared is None else float(declared),
                "priority": priority,
                "expected_output_tokens": max_out,
                "final": final,
                "deadline_s": None if deadline is None else max(0.0, deadline - self.clock()),
                "echo": dict(echo) if (echo := session.echo) else {},
            },
        )

    async def _attempt(self) -> httpx.Response:
        core, session, state, ticket = self.core, self.session, self.state, self.ticket
        home = session.endpoint_index
        index, moved = _route(core, session, self.failed, self.prefix, ticket.tokens)
        ep = core.endpoints[index]
        endpoint = ep.endpoint
        if moved is not None:
            state.moved = True
            if core.hooks:
                previous = state.endpoint or (
                    core.endpoints[home].endpoint.url if home is not None else None
                )
                core.emit(
                    SessionMoved(
                        t=self.clock(),
                        job_id=ticket.job_id,
                        session_id=session.id,
                        call_id=state.call_id,
                        from_endpoint=previous or "",
                        to_endpoint=endpoint.url,
                        reason=moved,
                    )
                )
            if routing_log.isEnabledFor(_INFO):
                self._log_move(home, endpoint.url, moved)
        admission = ep.admission
        priority = admission.policy.classify(ticket, state.started)
        if core.send_priority:
            if type(priority) is not int:
                raise TypeError(
                    f"scheduling policy {type(admission.policy).__name__}.classify returned "
                    f"{priority!r}; it must return an int (the queue level, lower first)"
                )
            # Only to an endpoint that takes priorities (send_priority, or 'auto' and it
            # advertised a priority scheduler).
            state.priority = priority if ep.options.send_priority else None
        ticket.enqueued_at = -1.0
        if not admission.try_admit(ticket):
            await admission.admit(ticket)
        try:
            queued = ticket.enqueued_at >= 0.0
            if queued or state.attempts:  # it waited in the queue, or this is a retry
                self.sent_at = now = self.clock()
                if queued:
                    state.queue_s += now - ticket.enqueued_at
            state.attempts += 1
            state.endpoint = endpoint.url
            out = self._build(ep, queued)
        except BaseException:
            admission.release(ticket, latency_s=None, tokens=0, ok=True)
            raise
        load = ep.load
        load.in_flight += 1
        load.outstanding_tokens += ticket.tokens
        self.ep = ep
        transport = self.transport
        lib = transport._lib
        resent = False
        stale = 0
        trace = _ConnTrace.install(out)
        while True:
            try:
                response = await transport._inner.handle_async_request(out)
            except lib.transport_errors as exc:
                if trace.reused and stale < _MAX_STALE and isinstance(exc, lib.stale_errors):
                    # A kept-alive connection the server had closed (its keep-alive
                    # expired as this request went out): no reply came, the endpoint is
                    # not at fault. Resent at once, in the same attempt, on another
                    # connection (httpcore dropped that one from its pool).
                    stale += 1
                    if transport_log.isEnabledFor(_DEBUG):
                        self._log_attempt(
                            ep,
                            f"{type(exc).__name__}: {exc} on a kept-alive connection the "
                            "server had closed; resent on another connection",
                        )
                    trace = _ConnTrace.install(out)
                    continue
                self._release(ok=False)
                # Only a connection that could not be made marks the endpoint down at
                # once and sends the retry elsewhere; a read timeout or a connection
                # closed without a reply is one failure toward the threshold, and the
                # retry stays where the session is. Our own pool's timeout is no
                # failure of the endpoint's.
                connect = isinstance(exc, lib.connect_errors)
                if not isinstance(exc, lib.mod.PoolTimeout):
                    core.record_health(ep, False, connect=connect)
                if connect:
                    self.failed.add(index)
                if core.hooks:
                    self._failed(ep, f"{type(exc).__name__}: {exc}")
                if transport_log.isEnabledFor(_DEBUG):
                    self._log_attempt(ep, f"{type(exc).__name__}: {exc}")
                raise _RetryableError(exc, index) from exc
            except BaseException:
                self._release(ok=True)
                raise
            status = response.status_code
            if (
                status != 400
                or resent
                or state.priority is None
                or not await self._priority_refused(ep, response)
            ):
                break
            # Resent at once without the priority, in the same attempt (it holds its
            # room and its retries): once per call, so a second 400 goes to the caller.
            resent = True
            try:
                self.sent_at = self.clock()
                out = self._build(ep, False)
            except BaseException:
                self._release(ok=True)
                raise
            trace = _ConnTrace.install(out)
        try:
            state.http_status = status
            if transport_log.isEnabledFor(_DEBUG):  # one dict lookup when off
                self._log_attempt(ep, f"HTTP {status}")
            if status in RETRY_STATUS:
                await response.aread()
                raise _RetryableStatus(response, _retry_after(response.headers))
        except BaseException:
            self._release(ok=status not in RETRY_STATUS)
            if status >= 500:
                core.record_health(ep, False)
            if core.hooks:
                self._failed(ep, f"HTTP {status}")
            await response.aclose()
            raise
        if status < 500:
            ep.health.record_success(self.sent_at)
        if status < 300:  # the features it accepts (tool-start notices)
            accept = accept_header(response.headers)
            if accept != ep.accept:
                ep.accept_header(accept)
        for name in ep.dialect.echo_headers:
            value = response.headers.get(name)
            if value is not None and len(value) <= 1024 and "\r" not in value:
                session.echo[name] = value
        return response

    def _build(self, ep: _EndpointState, queued: bool) -> httpx.Request:
        """The request of the attempt to ``ep``: the dialect's headers and body fields for
        the call's metadata (its priority where ``ep`` takes one), the hooks' headers."""
        enc = ep.dialect.encode(self._metadata(self.state.priority), ep.options)
        if self.core.hooks:
            self._sending(ep, queued, enc.headers)
        content = None
        if enc.body and self.body is not None:
            send_body = dict(self.body)
            _merge_body(send_body, enc.body)
            content = json.dumps(send_body, separators=(",", ":")).encode()
        request = self.request
        base = ep.endpoint.url
        url = request.url if base == self.base else ep.url_for(self.suffix, request.url)
        return self.transport._prepare(request, url, enc.headers, ep.authorization, content)

    async def _priority_refused(self, ep: _EndpointState, response: httpx.Response) -> bool:
        """Whether a 400 to a call that carried a priority refuses the priority itself
        (vLLM not started with ``--scheduling-policy priority``). If so, the reply is
        closed and ``ep`` gets no more priorities; the call's priority is cleared (its
        report shows none was sent). Any other 400 stays as it is, read, for the caller."""
        try:
            body = await response.aread()
        except BaseException:
            self._release(ok=True)
            await response.aclose()
            raise
        if _PRIORITY_REFUSED.search(body[:_MAX_ERROR_SCAN]) is None:
            return False
        await response.aclose()
        state = self.state
        state.http_status = 400
        if transport_log.isEnabledFor(_DEBUG):
            self._log_attempt(ep, "HTTP 400 (priority scheduling is not enabled)")
        if self.core.hooks:
            self._failed(ep, "HTTP 400", will_retry=True)
        state.priority = None
        if ep.refuse_priority():
            transport_log.warning(
                "endpoint %s refused a call's priority (HTTP 400: priority scheduling is "
                "not enabled there); the call was resent without one, and this runtime "
                "sends that endpoint no more priorities. To silence this, set "
                "send_priority=False for it (Endpoint(url, send_priority=False)), or start "
                "the server with --scheduling-policy priority",
                ep.endpoint.url,
            )
        return True

    def _scrubbed(self, body: bytes) -> bytes:
        """An error reply's body without the runtime's secrets or the credential the call
        carried, before the caller's client reads it: servers echo them (OpenAI's 401
        quotes the key), and the exception, the job's error and the journal would."""
        own = credential_forms(self.request.headers.get("authorization"))
        return scrub_bytes(body, tuple(sorted({*self.core.secrets, *own}, key=len, reverse=True)))

    def _log_attempt(self, ep: _EndpointState, outcome: str) -> None:
        """One attempt's outcome, at DEBUG on ``agentrt.transport``."""
        state = self.state
        transport_log.debug(
            "call %s (job %s, session %s) attempt %d of %d to %s%s: %s after %.3f s",
            state.call_id,
            self.ticket.job_id,
            state.session_id,
            state.attempts,
            self.core.retry.attempts,
            ep.endpoint.url,
            self.suffix,
            self.core.redact(outcome),
            self.clock() - self.sent_at,
        )

    def _log_move(self, home: int | None, to: str, reason: str) -> None:
        """A session moved to another replica, at INFO on ``agentrt.routing``."""
        previous = self.state.endpoint or (
            self.core.endpoints[home].endpoint.url if home is not None else None
        )
        routing_log.info(
            "session %s (job %s) moved from %s to %s (%s): its KV cache there is lost",
            self.session.id,
            self.ticket.job_id,
            previous,
            to,
            reason,
        )

    def _sending(self, ep: _EndpointState, queued: bool, headers: dict[str, str]) -> None:
        """Emit CallQueued (if it waited) and CallSent; merge the hooks' headers."""
        core, state, ticket = self.core, self.state, self.ticket
        url = ep.endpoint.url
        if queued:
            core.emit(
                CallQueued(
                    t=ticket.enqueued_at,
                    job_id=ticket.job_id,
                    session_id=ticket.session_id,
                    call_id=state.call_id,
                    endpoint=url,
                    attempt=state.attempts,
                )
            )
        event = CallSent(
            t=self.sent_at,
            job_id=ticket.job_id,
            session_id=ticket.session_id,
            call_id=state.call_id,
            endpoint=url,
            attempt=state.attempts,
            queue_s=state.queue_s,
            priority=state.priority,
        )
        core.emit(event)
        for name, value in event.headers.items():
            headers[check_header_name(name).lower()] = check_header_value(
                value, f"header {name!r} from a hook"
            )

    def _failed(self, ep: _EndpointState, error: str, *, will_retry: bool = False) -> None:
        state, ticket = self.state, self.ticket
        self.core.emit(
            AttemptFailed(
                t=self.clock(),
                job_id=ticket.job_id,
                session_id=ticket.session_id,
                call_id=state.call_id,
                endpoint=ep.endpoint.url,
                attempt=state.attempts,
                error=self.core.redact(error),
                will_retry=will_retry or state.attempts < self.core.retry.attempts,
            )
        )

    def _backoff(self, n: int, exc: BaseException | None) -> float:
        """The wait after failed attempt ``n``."""
        retry = self.core.retry
        delay = min(retry.wait_max, retry.wait_initial * 2 ** (n - 1))
        delay += random.uniform(0.0, retry.wait_jitter) if retry.wait_jitter else 0.0
        if isinstance(exc, _RetryableStatus) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, retry.retry_after_max))
        return float(delay)

    def _wait(self, rs: RetryCallState) -> float:
        # tenacity numbers its attempts from the second one (the first ran outside).
        exc = rs.outcome.exception() if rs.outcome else None
        return self._backoff(rs.attempt_number + 1, exc)

    async def _sleep(self, seconds: float) -> None:
        """A backoff between attempts, counted apart from the call's service."""
        start = self.clock()
        try:
            await anyio.sleep(seconds)
        finally:
            self.backoff_s += self.clock() - start

    async def _retry(self, first: _RetryableStatus | _RetryableError) -> httpx.Response:
        """The attempts after a first one failed with ``first``. The first attempt runs
        outside tenacity: most calls succeed at once, and the retry machinery costs tens
        of microseconds per call."""
        retry = self.core.retry
        if retry.attempts == 1:
            raise first
        await self._sleep(self._backoff(1, first))
        out: httpx.Response | None = None
        async for at in AsyncRetrying(
            stop=stop_after_attempt(retry.attempts - 1),
            wait=self._wait,
            retry=retry_if_exception_type((_RetryableStatus, _RetryableError)),
            sleep=self._sleep,
            reraise=True,
        ):
            with at:
                out = await self._attempt()
        assert out is not None
        return out

    async def run_bounded(self, deadline: float) -> httpx.Response:
        """:meth:`run` within its job's deadline: a call of a job with a deadline is
        bounded here whatever path it came by (an async or a sync client, a framework's
        model, a task outside the job's block). A call without one goes to :meth:`run`
        straight (no scope, no extra coroutine)."""
        with anyio.CancelScope(deadline=deadline) as scope:
            return await self.run()
        assert scope.cancelled_caught
        raise self._deadline_exceeded()

    def _cancelled(self) -> str:
        """Why a cancelled call was cancelled: its job's deadline, or something else."""
        deadline = self.ticket.deadline_at
        if deadline is not None and self.clock() >= deadline:
            job = self.session.job
            job._deadline_hit = True
            return f"deadline of {job.deadline_s:g} s exceeded"
        return "cancelled"

    def _deadline_exceeded(self) -> DeadlineExceeded:
        """End the call at its job's deadline; the error to raise."""
        job = self.session.job
        job._deadline_hit = True
        self._end("cancelled", f"deadline of {job.deadline_s:g} s exceeded")
        return DeadlineExceeded(f"job {job.id!r} exceeded its deadline of {job.deadline_s:g} s")

    async def run(self) -> httpx.Response:
        """Send the call (with retries) and observe its reply."""
        state = self.state
        transport = self.transport
        try:
            try:
                try:
                    response = await self._attempt()
                except (_RetryableStatus, _RetryableError) as first:
                    response = await self._retry(first)
            except _RetryableStatus as exc:
                # Out of attempts: hand the last error reply to the caller (openai raises
                # its usual typed error from it).
                response = exc.response
                self._end("error", f"HTTP {response.status_code}")
                transport_log.warning(
                    "call %s (job %s, session %s): HTTP %d on the last of %d attempt(s), "
                    "from %s; that answer goes to the caller",
                    state.call_id,
                    self.ticket.job_id,
                    state.session_id,
                    response.status_code,
                    state.attempts,
                    state.endpoint,
                )
                return transport._rebuild(response, self._scrubbed(response.content))
            except _RetryableError as exc:
                url = self.core.endpoints[exc.endpoint].endpoint.url
                message = self.core.redact(
                    f"endpoint {url} failed after {state.attempts} attempt(s): "
                    f"{type(exc.error).__name__}: {exc.error}; "
                    + _what_to_do(exc.error, url, transport._lib.mod)
                )
                self._end("error", message)
                transport_log.warning(
                    "call %s (job %s, session %s): %s",
                    state.call_id,
                    self.ticket.job_id,
                    state.session_id,
                    message,
                )
                raise EndpointError(message, endpoint=url, attempts=state.attempts) from (exc.error)
        except EndpointError:
            raise
        except BaseException as exc:
            if only_cancelled(exc):  # trio's may come in a group (a nursery: connecting)
                self._end("cancelled", self._cancelled())
            else:
                self._end("error", f"{type(exc).__name__}: {exc}")
            raise

        if (
            state.stream
            and response.status_code < 300
            and not response.headers.get("content-type", "").startswith("application/json")
        ):
            response.stream = transport._lib.ObservedStream(self, response)
            return response
        try:
            raw = await response.aread()
        except BaseException as exc:
            # Ended first: a cancelled aclose() may raise the cancellation again.
            if only_cancelled(exc):
                self._end("cancelled", self._cancelled())
            else:
                self._end("error", f"{type(exc).__name__}: {exc}")
            await response.aclose()
            raise
        if response.status_code >= 300:
            raw = self._scrubbed(raw)
            self._end("error", f"HTTP {response.status_code}")
        elif (data := _reply_object(raw, self.suffix))[0] is None or state.stream:
            if state.stream:  # a JSON reply to a streamed call: no client can read it
                data = (None, "a JSON body, not an event stream, to a streamed call")
            url = self.ep.endpoint.url if self.ep is not None else self.base
            ctype = response.headers.get("content-type", "?")
            message = self.core.redact(
                f"endpoint {url} did not answer like an OpenAI-compatible server: "
                f"{data[1]}; HTTP {response.status_code}, content-type {ctype}, "
                f"body starts {raw[:80]!r}"
            )
            self._end("error", message)
            raise EndpointError(message, endpoint=url, attempts=state.attempts)
        else:
            reply = data[0]
            _usage_into(state, reply.get("usage"))
            core = self.core
            choices = reply.get("choices")
            if choices.__class__ is not list:
                choices = None  # an API without choices (embeddings, models)
            if core.hooks or core.waits is not None:
                # The first choice's (as the hooks report it), else the last one's (tool
                # calls are spotted from it).
                choice = (choices[0] if core.hooks else choices[-1]) if choices else None
                finish = choice.get("finish_reason") if choice.__class__ is dict else None
                self.finish_reason = finish if isinstance(finish, str) else None
            if self.finish_reason == "tool_calls" and core.waits is not None:
                names: list[str] = []
                _tool_names_into(names, choices, "message")
                self.tools = tuple(names)
            if core.hooks and core.capture_content:
                self.output = _text_of(choices[0]) if choices else None
            if self.reply is not None:
                self.reply.read(reply, "message")
            self._end("ok", None)
        return transport._rebuild(response, raw)

    # -- ending ---------------------------------------------------------------------------

    def _release(self, *, ok: bool, now: float | None = None) -> None:
        """The attempt in flight is over (at ``now``, else read from the clock): its
        endpoint no longer carries it, its room in the admission gate goes to the next
        call, and its latency feeds the limit."""
        ep = self.ep
        if ep is None:
            return
        self.ep = None
        ticket = self.ticket
        load = ep.load
        load.in_flight -= 1
        load.outstanding_tokens -= ticket.tokens
        latency = (self.clock() if now is None else now) - self.sent_at
        ep.admission.release(ticket, latency, self.state.completion_tokens or 0, ok)

    def _end(self, status: CallStatus, error: str | None) -> None:
        """The call is over (once): release its endpoint, account it, end an implicit job."""
        if self.ended:
            return
        self.ended = True
        now = self.clock()  # one read for the release and the accounting
        if self.ep is not None:
            self._release(ok=status != "error", now=now)
        state = self.state
        if not state.done:
            state.done = True
            state.latency_s = latency = now - state.started
            state.status = status
            state.error = error if error is None else self.core.redact(error)
            core, session, ticket = self.core, self.session, self.ticket
            job = session.job
            program = job._program
            tokens = (state.prompt_tokens or 0) + (state.completion_tokens or 0)
            service = latency - state.queue_s - self.backoff_s  # not queueing nor backoff
            if service < 0.0:
                service = 0.0
            program.service_s += service
            program.service_tokens += tokens
            ticket.idle_expected_s = self.turn[3]
            for e in core.endpoints:
                e.admission.policy.on_call_end(ticket, service, tokens)
            if status == "ok":
                session._last_reply_at = now
                if core.learn_retention:
                    _replied(core, session, state, self.turn[1])  # cache retention
                if self.tools:
                    session._tool_calls(self.tools)
            if core.hooks:
                facts = self.reply if self.reply is not None else ReplyFacts()
                self.core.emit(
                    CallEnded(
                        t=now,
                        job_id=job.id,
                        session_id=self.session.id,
                        call_id=state.call_id,
                        status=status,
                        report=state.to_report(),
                        finish_reason=self.finish_reason,
                        output=self.output,
                        response_id=facts.id,
                        response_model=facts.model,
                        finish_reasons=tuple(facts.finish_reasons),
                        tool_calls=tuple(facts.tool_calls),
                    )
                )
        if self.implicit is not None:
            self.session._unpin()
            self.implicit._end_implicit()


class _ObservedStream:
    """Passes a streamed reply through, noting the first chunk and the usage block."""

    _lib: HttpLib

    def __init__(self, call: _Call, response: httpx.Response) -> None:
        inner = response.stream
        if not isinstance(inner, self._lib.mod.AsyncByteStream):
            raise TypeError("agentrt needs an async transport underneath")
        self._inner = inner
        self._call = call
        self._state = call.state
        self._url = call.ep.endpoint.url if call.ep is not None else call.base
        self._parse = not _encoded(response.headers)
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
        self._filter: _UsageFilter | None = None
        if call.added_usage and self._parse:
            n = call.body.get("n") if call.body else None
            self._filter = _UsageFilter(self, n if n.__class__ is int and n > 1 else 1)
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
                    raise self._call._deadline_exceeded()
        except StopAsyncIteration:
            if self._parse and (self._tail or self._data):
                self._scan(b"\n\n")  # a last event without its blank line (or its newline)
            self._complete = True
            self._call._end("ok", None)
            raise
        except DeadlineExceeded:
            raise
        except self._lib.transport_errors as exc:
            message = self._call.core.redact(f"endpoint {self._url} broke off the stream: {exc!r}")
            self._call._end("error", message)
            raise EndpointError(message, endpoint=self._url, attempts=state.attempts) from exc
        except BaseException as exc:
            if only_cancelled(exc):  # trio's may come in a group (a nursery in the read)
                why = self._call._cancelled()
                self._call._end("cancelled", why if why != "cancelled" else "cancelled mid-stream")
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
            found = _FINISH.search(chunk)
            if found:
                self._call.finish_reason = found.group(1).decode()
        if self._parse:
            self._scan(chunk)
            if self._complete:
                self._call._end("ok", None)  # [DONE] seen: the reply is complete
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
                text = _text_of(choices[0])
                if text:
                    self._parts.append(text)
        usage = obj.get("usage")
        if usage is None and (whole := obj.get("response")).__class__ is dict:
            usage = whole.get("usage")  # the Responses API's: in response.completed
        if usage is not None:
            _usage_into(self._state, usage)
        if (facts := self._call.reply) is not None:
            facts.read(obj, "delta")
        if self._learn and _NAME_KEY in raw and _TOOL_CALLS_KEY in raw:
            _tool_names_into(self._tools, obj.get("choices"), "delta")
            self._call.tools = tuple(self._tools)

    def _malformed(self, raw: bytes, problem: str) -> NoReturn:
        """An event the caller's client cannot parse: the call ends in an error that
        says so (not a ``JSONDecodeError`` from deep inside the client)."""
        message = self._call.core.redact(
            f"endpoint {self._url} sent a malformed stream event: its data is {problem}; "
            f"data starts {raw[:80]!r}"
        )
        self._call._end("error", message)
        raise EndpointError(message, endpoint=self._url, attempts=self._state.attempts)

    async def aclose(self) -> None:
        self._open.pop(self, None)
        try:
            if not self._shut_done:
                self._shut_done = True
                await self._inner.aclose()
        finally:
            if self._complete:
                self._call._end("ok", None)
            else:  # the caller stopped reading: its choice, not the endpoint's failure
                self._call._end("cancelled", "the caller closed the stream before its end")

    def _abandon(self, why: str) -> None:
        """Its session or job ended before the caller read or closed it: the call ends
        (``cancelled``, as a stream its caller closes early), if it has not."""
        self._call._end("ok" if self._complete else "cancelled", None if self._complete else why)

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


class _UsageFilter:
    """The stream a caller reads when agentrt asked for the usage chunk on its behalf
    (``_Call._ask_usage``): the reply's whole SSE events as the server sends them
    unasked. Asking adds a usage-only chunk (``"choices": []``), ``"usage": null`` to the
    other chunks (OpenAI), may put the usage in the finish chunk instead (some servers),
    and may move the ``system_fingerprint`` from the last content chunk onto the usage
    chunk (vLLM): the first three are removed, the fingerprint is put back. No content
    chunk is held: only a chunk that finishes the last of the reply's ``choices``
    choices, has no fingerprint and no usage waits, until the next event (the usage
    chunk, which follows it at once, or whatever comes). The usage itself was read by the
    observed stream."""

    __slots__ = ("_choices", "_finished", "_held", "_pending", "_stream")

    def __init__(self, stream: _ObservedStream, choices: int = 1) -> None:
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
        if self._pending is None and _USAGE_KEY not in events and _FINISH.search(events) is None:
            return events  # content chunks: as they are
        parts = _EVENT_END.split(events)  # event, separator, event, ..., the rest
        out: list[bytes] = []
        for k in range(0, len(parts), 2):
            event = parts[k] + (parts[k + 1] if k + 1 < len(parts) else b"")
            if not event:
                continue
            pending = self._pending
            obj = _chunk_of(event) if _USAGE_KEY in event or _FINISH.search(event) else None
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
        if _FINISH.search(event) and _FINGERPRINT not in event:
            i = event.rfind(b"}")
            if i > 0:
                event = event[:i] + member + event[i:]
        out.append(event)
    return out


class _SharedTransport:
    """A client's view of the runtime's transport; closing the client leaves it open."""

    _lib: HttpLib

    def __init__(self, transport: AgentTransport) -> None:
        self.transport = transport
        # The wrapped transport's method itself: no coroutine of its own on every call.
        self.handle_async_request = transport.handle_async_request  # type: ignore[method-assign]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)  # pragma: no cover

    async def aclose(self) -> None:
        return None


PortalCall = Callable[..., Any]
"""Runs an async function (and its arguments) in the runtime's event loop from another
thread and returns its result (``SyncRuntime._call``: a blocking portal's ``call``)."""


class _SyncTransport:
    """Carries a synchronous client's requests into the runtime's event loop (through
    ``call``); refuses them once ``refuses()`` says the sync runtime's block has ended."""

    _lib: HttpLib

    def __init__(
        self, call: PortalCall, refuses: Callable[[], bool], transport: AgentTransport
    ) -> None:
        self._portal_call = call
        self._refuses = refuses
        self._transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._transport._core.closed or self._refuses():
            raise ClientClosedError(CLOSED_MESSAGE)
        lib = self._lib
        session = current_session()
        job = _CURRENT_JOB.get()  # its default session is the loop's to open (call_session)
        content = request.read()
        areq = lib.mod.Request(
            request.method,
            request.url,
            headers=request.headers,
            content=content,
            extensions={k: v for k, v in request.extensions.items() if k == "timeout"},
        )

        async def send() -> tuple[httpx.Response, bytes | None]:
            token = _CALL_SESSION.set(session)
            job_token = _CURRENT_JOB.set(job)
            try:
                response = await self._transport.handle_async_request(areq)
            finally:
                _CURRENT_JOB.reset(job_token)
                _CALL_SESSION.reset(token)
            if "text/event-stream" in response.headers.get("content-type", ""):
                return response, None
            return response, await response.aread()

        response, body = self._portal_call(send)
        headers = lib.mod.Headers(response.headers)
        for h in ("content-encoding", "content-length", "transfer-encoding"):
            if h in headers:
                del headers[h]
        if body is not None:
            return lib.mod.Response(  # type: ignore[no-any-return]
                response.status_code, headers=headers, content=body
            )
        return lib.mod.Response(  # type: ignore[no-any-return]
            response.status_code,
            headers=response.headers,
            stream=lib.SyncStream(self._portal_call, response),
        )


class _SyncStream:
    _lib: HttpLib

    def __init__(self, call: PortalCall, response: httpx.Response) -> None:
        self._portal_call = call
        self._response = response
        self._gen = response.aiter_raw()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                yield self._portal_call(self._gen.__anext__)
            except StopAsyncIteration:
                return

    def close(self) -> None:
        async def close() -> None:
            await self._gen.aclose()  # type: ignore[attr-defined]
            await self._response.aclose()

        try:
            self._portal_call(close)
        except RuntimeClosedError:  # its runtime closed it (and its job settled it) first
            pass
