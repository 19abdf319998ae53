"""The HTTP library under the call path: which one (legacy ``httpx`` or ``httpx2``), the
event loop's clock, and the copies of a request and a reply that a call sends and hands
back (:func:`prepare`, :func:`rebuild`). Nothing here routes or counts."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import operator
from collections.abc import Callable, Iterator
from functools import cache
from types import ModuleType
from typing import Any

import anyio
import httpx

from ._protocol import HEADER

__all__ = [
    "ConnTrace",
    "HttpLib",
    "asking_usage",
    "encoded",
    "http_lib",
    "loop_clock",
    "prepare",
    "rebuild",
    "unframed",
    "what_to_do",
]

_AUTH = b"authorization"
_AGENTRT = HEADER.encode()
_LOWER = operator.itemgetter(1)
"""A header triple's lower-case name (httpx's ``Headers._list`` items)."""
_FRAMING = ("content-encoding", "content-length", "transfer-encoding")


_async_library: Callable[[], str] | None
try:  # openai depends on sniffio; anyio no longer does
    from sniffio import current_async_library as _async_library
except ImportError:  # pragma: no cover
    _async_library = None


def loop_clock() -> Callable[[], float]:
    """The clock ``anyio.current_time()`` reads, found once per runtime (when it opens):
    the running asyncio loop's ``time`` (0.06 µs a read, where anyio's lookup of its
    backend costs 0.4 µs), trio's clock's ``current_time``, else ``anyio.current_time``
    itself (when the library cannot be told). A runtime lives in one event loop; the
    first two read it from any thread, even outside the loop (``rt.endpoint_loads()``
    from a thread of the caller's)."""
    library = _async_library() if _async_library is not None else None
    if library == "asyncio":
        return asyncio.get_running_loop().time
    if library == "trio":
        import trio

        return trio.lowlevel.current_clock().current_time
    return anyio.current_time


_CONTENT_ENCODING = b"content-encoding"


def encoded(headers: Any) -> bool:
    """Whether a reply has a ``Content-Encoding``. Scans the headers' raw list where the
    library keeps one (as ``accept_header`` does): ``in`` builds a list of every name,
    0.3 µs against 0.1 µs, on every reply."""
    raw = getattr(headers, "_list", None)
    if not isinstance(raw, list):
        return "content-encoding" in headers
    return _CONTENT_ENCODING in map(_LOWER, raw)


def unframed(mod: Any, headers: httpx.Headers) -> httpx.Headers:
    """A copy of ``headers`` without the framing ones (encoding, length, chunking), for a
    reply whose body is handed on whole and decoded."""
    out: httpx.Headers = mod.Headers(headers)
    for h in _FRAMING:
        if h in out:
            del out[h]
    return out


class ConnTrace:
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
    def install(cls, request: httpx.Request) -> ConnTrace:
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


# -- the HTTP library ---------------------------------------------------------------------
#
# agentrt speaks either legacy ``httpx`` or ``httpx2`` (the maintained fork that openai 3.x
# is built on; same API, different classes). A Runtime picks one library once, and every
# object it builds comes from that library. agentrt's own transport and stream classes are
# written once, as plain classes, and combined per library with that library's base
# classes (``HttpLib.derive``).
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
        self._derived: dict[type, type] = {}
        self.Bytes: Any = self.derive(_Bytes)

    def derive(self, impl: type) -> Any:
        """``impl``'s behaviour on this library's base classes (named by its ``_bases``:
        clients check e.g. ``isinstance(response.stream, <lib>.AsyncByteStream)``),
        bound to it (its ``_lib``); made once per library."""
        cls = self._derived.get(impl)
        if cls is None:
            bases = tuple(getattr(self.mod, name) for name in impl.__dict__["_bases"])
            attrs = {"__module__": impl.__module__, "_lib": self}
            cls = self._derived[impl] = type(impl.__name__, (impl, *bases), attrs)
        return cls

    def __repr__(self) -> str:
        return f"<agentrt HttpLib {self.name}>"


class _Bytes:
    """A body held in memory, as the library's ``ByteStream``, but read without an async
    generator: a read cut by cancellation between its one chunk and its end leaves
    nothing to finalize (trio warns of an async generator collected unfinished, and
    cancelled calls under trio left one per request body)."""

    _bases = ("AsyncByteStream", "SyncByteStream")

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


# -- a call's request and reply ----------------------------------------------------------


def prepare(
    lib: HttpLib,
    request: httpx.Request,
    url: httpx.URL,
    add: dict[str, str],
    auth: bytes | None,
    content: bytes | None,
    placeholder: bytes,
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
    # (raw name, lower name, value) triples, as Headers keeps them; dialects emit
    # lower case.
    if lib.raw_headers:
        callers = set(map(_LOWER, request.headers._list))
    else:
        callers = {k.lower() for k, _ in request.headers.raw}
    callers.discard(_AGENTRT)
    new = [(name, name, v.encode()) for k, v in add.items() if (name := k.encode()) not in callers]
    if auth is not None:
        new.append((_AUTH, _AUTH, auth))
    if content is not None:
        length = str(len(content)).encode()
        new.append((b"content-length", b"content-length", length))
    if url is not request.url:
        new.append((b"host", b"host", url.netloc))
    names = set(map(_LOWER, new))
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


def asking_usage(lib: HttpLib, request: httpx.Request, content: bytes | None) -> httpx.Request:
    """The request of a streamed call whose caller did not ask for usage, with the body
    ``content`` that asks for it (``_wire.ask_usage``), or none where each attempt brings
    its own (a dialect's fields merged); and without compression, so that the stream can
    be read and its usage-only chunk dropped. Built once per such call, never for others."""
    headers = [
        (k, v)
        for k, v in request.headers.raw
        if k.lower() not in (b"content-length", b"accept-encoding")
    ]
    headers.append((b"accept-encoding", b"identity"))
    return lib.mod.Request(  # type: ignore[no-any-return]
        request.method,
        request.url,
        headers=headers,
        content=content,
        extensions=request.extensions,
    )


def what_to_do(error: BaseException, url: str, lib: Any) -> str:
    """What the caller can do about the transport error of library ``lib`` that ended a
    call on ``url`` (the end of :class:`EndpointError`'s message, so that it stands on
    its own)."""
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


def rebuild(lib: HttpLib, response: httpx.Response, content: bytes) -> httpx.Response:
    """The reply, read, handed on with its (decoded) body. An error reply says
    ``x-should-retry: false``: agentrt made the attempts its policy allows, and
    openai's clients (whatever their ``max_retries``: a copy's, a request's, a client
    of the caller's on ``rt.http_client()``) obey it rather than retry on top."""
    if response.status_code >= 400:
        response.headers["x-should-retry"] = "false"
    if not encoded(response.headers):
        # Nothing was decoded: the read response itself can go on, its body in place
        # (an error's as scrubbed: the read body is kept apart from the stream).
        response.stream = lib.Bytes(content)
        response._content = content
        return response
    return lib.mod.Response(  # type: ignore[no-any-return]
        response.status_code,
        headers=unframed(lib.mod, response.headers),
        content=content,
        extensions=response.extensions,
    )
