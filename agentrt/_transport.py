"""The httpx-family transport: tag -> route -> send (with retries) -> observe.

This is agentrt's one integration point with HTTP. Every call made through a client that
agentrt built (``rt.openai()``, ``rt.http_client()``, ``session.chat``) passes through
:class:`AgentTransport.handle_async_request`, which

1. finds the call's session (contextvars) or opens an implicit one-call job,
2. builds the call's :class:`CallMetadata` (turn, attained service, idle times),
3. picks an endpoint with the router,
4. lets the endpoint's dialect add its headers and body fields,
5. sends it through the wrapped transport, retrying per :class:`Retry`,
6. observes the reply (usage, cached tokens, time to first token) into the job's report.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import random
from collections.abc import AsyncIterator, Iterator
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from ._context import Job, Session, _CallState, current_session, new_id
from ._errors import EndpointError
from ._protocol import CallMetadata
from .scheduling._priority import plas_priority
from .telemetry._report import CallReport

if TYPE_CHECKING:
    from ._runtime import SyncRuntime, _Core, _EndpointState

__all__ = ["AgentTransport", "HttpLib", "http_lib"]

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_DROP_HEADERS = frozenset({b"content-length", b"host"})
_DROP_HEADERS_AUTH = _DROP_HEADERS | {b"authorization"}
_USAGE_KEY = b'"usage"'


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


def _retry_after(headers: httpx.Headers) -> float | None:
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
        return None  # HTTP-date form: fall back to exponential backoff


def _usage_into(report: CallReport, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(pt, int):
        report.prompt_tokens = pt
    if isinstance(ct, int):
        report.completion_tokens = ct
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        report.cached_tokens = details["cached_tokens"]


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
        self.AgentTransport: Any = self._derive(AgentTransport, mod.AsyncBaseTransport)
        self.ObservedStream: Any = self._derive(_ObservedStream, mod.AsyncByteStream)
        self.SharedTransport: Any = self._derive(_SharedTransport, mod.AsyncBaseTransport)
        self.SyncTransport: Any = self._derive(_SyncTransport, mod.BaseTransport)
        self.SyncStream: Any = self._derive(_SyncStream, mod.SyncByteStream)

    def _derive(self, impl: type, base: type) -> type:
        """``impl``'s behaviour on ``base`` (this library's class), bound to this library."""
        return type(impl.__name__, (impl, base), {"__module__": __name__, "_lib": self})

    def __repr__(self) -> str:
        return f"<agentrt HttpLib {self.name}>"


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

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        core = self._core
        route = core.match(request.url)
        if route is None:
            # Not addressed to agentrt or one of its endpoints: pass through untouched.
            return await self._inner.handle_async_request(request)
        session = current_session()
        implicit: Job | None = None
        if session is None:
            implicit = core.implicit_job()
            session = implicit._new_session(None, None, None)
        try:
            return await self._handle(request, route[0], route[1], session, implicit)
        except BaseException:
            if implicit is not None and not implicit._closed:
                core.end_implicit(implicit)
            raise

    async def _handle(
        self,
        request: httpx.Request,
        base: str,
        suffix: str,
        session: Session,
        implicit: Job | None,
    ) -> httpx.Response:
        core = self._core
        job = session.job
        session._check_usable()
        body: dict[str, Any] | None = None
        if request.method == "POST" and request.content:
            try:
                parsed = json.loads(request.content)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                body = parsed
        stream = bool(body.get("stream")) if body else False
        max_out = None
        if body:
            for key in ("max_completion_tokens", "max_tokens"):
                if isinstance(body.get(key), int):
                    max_out = body[key]
                    break

        now = anyio.current_time()
        turn, idle_s, declared, expected = session._begin_turn()
        program = core.program(job.program_id)
        call_id = new_id("call")
        priority = plas_priority(program.service_s) if core.send_priority else None
        report = CallReport(
            call_id=call_id,
            session_id=session.id,
            session_name=session.name,
            turn=turn,
            path=suffix,
            model=body.get("model") if body and isinstance(body.get("model"), str) else None,
            stream=stream,
            start_s=now - job._t0,
            priority=priority,
        )
        state = _CallState(report=report, started=now)
        job._calls.append(state)
        meta_base = CallMetadata(
            call_id=call_id,
            job_id=job.id,
            session_id=session.id,
            program_id=job.program_id,
            parent_session_id=session.parent_id,
            turn=turn,
            first_turn=turn == 0,
            service_s=program.service_s,
            service_tokens=program.service_tokens,
            idle_expected_s=expected,
            idle_s=idle_s,
            idle_declared_s=declared,
            priority=priority,
            expected_output_tokens=max_out,
        )

        lib = self._lib
        failed: set[int] = set()
        last: list[int] = [-1]
        placeholder = f"Bearer {core.placeholder_key}".encode()

        async def attempt() -> httpx.Response:
            index = core.route(session, failed)
            last[0] = index
            ep = core.endpoints[index]
            report.attempts += 1
            report.endpoint = ep.endpoint.url
            meta = (
                meta_base.model_copy(update={"echo": dict(session.echo)})
                if session.echo
                else meta_base
            )
            enc = ep.dialect.encode(meta, core.dialect_options)
            # Raw header tuples: far cheaper than httpx.Headers edits on the hot path.
            key = ep.endpoint.api_key if ep.endpoint.api_key is not None else core.api_key
            drop = _DROP_HEADERS if key is None else _DROP_HEADERS_AUTH
            names = frozenset(k.encode() for k in enc.headers)  # dialects emit lower case
            headers = [
                (k, v)
                for k, v in request.headers.raw
                if (lk := k.lower()) not in drop
                and lk not in names
                and not (lk == b"authorization" and v == placeholder)
            ]
            headers.extend((k.encode(), v.encode()) for k, v in enc.headers.items())
            if key is not None:
                headers.append((b"authorization", f"Bearer {key}".encode()))
            if body is not None and enc.body:
                send_body = dict(body)
                _merge_body(send_body, enc.body)
                content = json.dumps(send_body, separators=(",", ":")).encode()
            else:
                content = request.content
            url = request.url if ep.endpoint.url == base else ep.url_for(suffix, request.url)
            out = lib.mod.Request(
                request.method,
                url,
                headers=headers,
                content=content,
                extensions=request.extensions,
            )
            ep.load.in_flight += 1
            released = False
            try:
                response = await self._inner.handle_async_request(out)
            except lib.transport_errors as exc:
                ep.load.in_flight -= 1
                released = True
                failed.add(index)
                raise _RetryableError(exc, index) from exc
            except BaseException:
                ep.load.in_flight -= 1
                raise
            try:
                report.http_status = response.status_code
                if response.status_code in RETRY_STATUS:
                    await response.aread()
                    raise _RetryableStatus(response, _retry_after(response.headers))
            except BaseException:
                if not released:
                    ep.load.in_flight -= 1
                await response.aclose()
                raise
            for name in ep.dialect.echo_headers:
                value = response.headers.get(name)
                if value is not None and len(value) <= 1024 and "\r" not in value:
                    session.echo[name] = value
            return response

        retry = core.retry

        def backoff(n: int, exc: BaseException | None) -> float:
            """The wait after failed attempt ``n``."""
            delay = min(retry.wait_max, retry.wait_initial * 2 ** (n - 1))
            delay += random.uniform(0.0, retry.wait_jitter) if retry.wait_jitter else 0.0
            if isinstance(exc, _RetryableStatus) and exc.retry_after is not None:
                delay = max(delay, min(exc.retry_after, retry.retry_after_max))
            return float(delay)

        def wait(rs: RetryCallState) -> float:
            # tenacity numbers its attempts from the second one (the first ran outside).
            exc = rs.outcome.exception() if rs.outcome else None
            return backoff(rs.attempt_number + 1, exc)

        async def attempts() -> httpx.Response:
            # The first attempt runs outside tenacity: most calls succeed at once, and the
            # retry machinery costs tens of microseconds per call.
            try:
                return await attempt()
            except (_RetryableStatus, _RetryableError) as first:
                if retry.attempts == 1:
                    raise
                await anyio.sleep(backoff(1, first))
            out: httpx.Response | None = None
            async for at in AsyncRetrying(
                stop=stop_after_attempt(retry.attempts - 1),
                wait=wait,
                retry=retry_if_exception_type((_RetryableStatus, _RetryableError)),
                sleep=anyio.sleep,
                reraise=True,
            ):
                with at:
                    out = await attempt()
            assert out is not None
            return out

        response: httpx.Response | None = None
        try:
            try:
                response = await attempts()
            except _RetryableStatus as exc:
                # Out of attempts: hand the last error reply to the caller (openai raises
                # its usual typed error from it).
                response = exc.response
                self._finish(state, session, "error", f"HTTP {response.status_code}")
                return self._rebuild(response, response.content)
            except _RetryableError as exc:
                url = core.endpoints[exc.endpoint].endpoint.url
                message = (
                    f"endpoint {url} failed after {report.attempts} attempt(s): "
                    f"{type(exc.error).__name__}: {exc.error}"
                )
                self._finish(state, session, "error", message)
                raise EndpointError(message, endpoint=url, attempts=report.attempts) from (
                    exc.error
                )
        except anyio.get_cancelled_exc_class():
            self._finish(state, session, "cancelled", "cancelled")
            raise
        except EndpointError:
            raise
        except BaseException as exc:
            self._finish(state, session, "error", f"{type(exc).__name__}: {exc}")
            raise

        assert response is not None
        ep = core.endpoints[last[0]]
        if stream and response.status_code < 300:
            response.stream = self._lib.ObservedStream(self, response, state, session, ep, implicit)
            return response
        try:
            raw = await response.aread()
        except BaseException as exc:
            ep.load.in_flight -= 1
            await response.aclose()
            status = "cancelled" if isinstance(exc, anyio.get_cancelled_exc_class()) else "error"
            self._finish(state, session, status, f"{type(exc).__name__}: {exc}")
            if implicit is not None:
                core.end_implicit(implicit)
            raise
        ep.load.in_flight -= 1
        if response.status_code < 300:
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                ctype = response.headers.get("content-type", "?")
                message = (
                    f"endpoint {ep.endpoint.url} did not answer like an OpenAI-compatible "
                    f"server: HTTP {response.status_code}, content-type {ctype}, "
                    f"body starts {raw[:80]!r}"
                )
                self._finish(state, session, "error", message)
                if implicit is not None:
                    core.end_implicit(implicit)
                raise EndpointError(message, endpoint=ep.endpoint.url, attempts=report.attempts)
            _usage_into(report, data.get("usage"))
            self._finish(state, session, "ok", None)
        else:
            self._finish(state, session, "error", f"HTTP {response.status_code}")
        if implicit is not None:
            core.end_implicit(implicit)
        return self._rebuild(response, raw)

    def _rebuild(self, response: httpx.Response, content: bytes) -> httpx.Response:
        """The reply, read, handed on with its (decoded) body."""
        lib = self._lib.mod
        if "content-encoding" not in response.headers:
            # Nothing was decoded: the read response itself can go on, its body in place.
            response.stream = lib.ByteStream(content)
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

    def _finish(self, state: _CallState, session: Session, status: Any, error: str | None) -> None:
        if state.done:
            return
        state.done = True
        now = anyio.current_time()
        rep = state.report
        rep.latency_s = now - state.started
        rep.status = status
        rep.error = error
        program = self._core.program(session.job.program_id)
        program.service_s += rep.latency_s
        program.service_tokens += (rep.prompt_tokens or 0) + (rep.completion_tokens or 0)
        if status == "ok":
            session._replied()


class _ObservedStream:
    """Passes a streamed reply through, noting the first chunk and the usage block."""

    _lib: HttpLib

    def __init__(
        self,
        transport: AgentTransport,
        response: httpx.Response,
        state: _CallState,
        session: Session,
        ep: _EndpointState,
        implicit: Job | None,
    ) -> None:
        self._transport = transport
        inner = response.stream
        if not isinstance(inner, self._lib.mod.AsyncByteStream):
            raise TypeError("agentrt needs an async transport underneath")
        self._inner = inner
        self._state = state
        self._session = session
        self._ep = ep
        self._implicit = implicit
        self._parse = "content-encoding" not in response.headers
        self._tail = b""
        self._closed = False
        self._complete = False
        self._it: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        # Clients may iterate more than once (openai drains the rest after [DONE]): every
        # iteration continues the same underlying one. No generator here, so an abandoned
        # iteration leaves nothing suspended.
        if self._it is None:
            self._it = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._it is not None
        rep = self._state.report
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            self._complete = True
            self._end("ok", None)
            raise
        except anyio.get_cancelled_exc_class():
            self._end("cancelled", "cancelled mid-stream")
            raise
        except self._lib.transport_errors as exc:
            message = f"endpoint {self._ep.endpoint.url} broke off the stream: {exc!r}"
            self._end("error", message)
            raise EndpointError(
                message, endpoint=self._ep.endpoint.url, attempts=rep.attempts
            ) from exc
        if rep.ttft_s is None and chunk:
            rep.ttft_s = anyio.current_time() - self._state.started
        if self._parse:
            self._scan(chunk)
            if self._complete:
                self._end("ok", None)  # [DONE] seen: the reply is complete
        return chunk

    def _scan(self, chunk: bytes) -> None:
        data = self._tail + chunk
        lines = data.split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            if line.startswith(b"data: [DONE]"):
                self._complete = True
            elif _USAGE_KEY in line and line.startswith(b"data:"):
                try:
                    obj = json.loads(line[5:])
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    _usage_into(self._state.report, obj.get("usage"))

    def _end(self, status: str, error: str | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._ep.load.in_flight -= 1
        self._transport._finish(self._state, self._session, status, error)
        if self._implicit is not None:
            self._transport._core.end_implicit(self._implicit)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._complete:
                self._end("ok", None)
            else:
                self._end("error", "the stream was closed before it ended")


class _SharedTransport:
    """A client's view of the runtime's transport; closing the client leaves it open."""

    _lib: HttpLib

    def __init__(self, transport: AgentTransport) -> None:
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        return None


class _SyncTransport:
    """Carries a synchronous client's requests into the runtime's event loop."""

    _lib: HttpLib

    def __init__(self, srt: SyncRuntime, transport: AgentTransport) -> None:
        self._srt = srt
        self._transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        from ._context import _CALL_SESSION

        lib = self._lib
        session = current_session()
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
            try:
                response = await self._transport.handle_async_request(areq)
            finally:
                _CALL_SESSION.reset(token)
            if "text/event-stream" in response.headers.get("content-type", ""):
                return response, None
            return response, await response.aread()

        response, body = self._srt._call(send)
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
            stream=lib.SyncStream(self._srt, response),
        )


class _SyncStream:
    _lib: HttpLib

    def __init__(self, srt: SyncRuntime, response: httpx.Response) -> None:
        self._srt = srt
        self._response = response
        self._gen = response.aiter_raw()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                yield self._srt._call(self._gen.__anext__)
            except StopAsyncIteration:
                return

    def close(self) -> None:
        async def close() -> None:
            await self._gen.aclose()  # type: ignore[attr-defined]
            await self._response.aclose()

        self._srt._call(close)
