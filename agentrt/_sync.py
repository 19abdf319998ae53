"""The synchronous side: :class:`SyncRuntime` (and its jobs and sessions) runs the async
runtime in a background thread's event loop, and the synchronous clients it builds carry
their requests into that loop (:class:`SyncTransport`)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, wait
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    contextmanager,
    suppress,
)
from functools import partial
from inspect import isawaitable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, Self, TypedDict, TypeVar, overload

import anyio
import httpx
import openai
from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._blocks import sync_block
from ._clients import client_kwargs, copy_kwargs
from ._config import Endpoint, Retry
from ._context import (
    _CALL_SESSION,
    _CURRENT_JOB,
    _CURRENT_SESSION,
    Job,
    Session,
    current_session,
)
from ._errors import CLOSED_MESSAGE, AgentrtError, ClientClosedError, RuntimeClosedError
from ._httplib import HttpLib, unframed
from ._jobs import check_not_nested, run_job, still_running
from ._options import AsyncTransport, PolicySpec, TimeoutLike, check
from ._runtime import Runtime
from ._settings import configured
from ._transport import AgentTransport
from .dialects import DialectSpec
from .scheduling._admission import AdmissionStatistics
from .scheduling._loadcontrol import LoadControl, LoadStatistics
from .scheduling._routing import EndpointLoad, Router
from .telemetry._events import Hook
from .telemetry._journal import Journal
from .telemetry._report import JobReport

if TYPE_CHECKING:
    from typing import Unpack

    from openai import AsyncStream
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    from ._types import ChatArgs, CompleteArgs

__all__ = ["SyncJob", "SyncRuntime", "SyncSession", "SyncTransport"]

_T = TypeVar("_T")


PortalCall = Callable[..., Any]
"""Runs an async function (and its arguments) in the runtime's event loop from another
thread and returns its result (``SyncRuntime._call``: a blocking portal's ``call``)."""


class SyncTransport:
    """Carries a synchronous client's requests into the runtime's event loop (through
    ``call``); refuses them once ``refuses()`` says the sync runtime's block has ended."""

    _lib: HttpLib
    _bases = ("BaseTransport",)

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
        if body is not None:
            return lib.mod.Response(  # type: ignore[no-any-return]
                response.status_code, headers=unframed(lib.mod, response.headers), content=body
            )
        return lib.mod.Response(  # type: ignore[no-any-return]
            response.status_code,
            headers=response.headers,
            stream=lib.derive(SyncStream)(self._portal_call, response),
        )


class SyncStream:
    """A streamed reply read from a synchronous client, chunk by chunk through the
    runtime's loop."""

    _lib: HttpLib
    _bases = ("SyncByteStream",)

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


class _OpenAI(openai.OpenAI):
    """The ``openai.OpenAI`` of ``SyncRuntime.openai()``; its copies keep
    ``max_retries=0``."""

    def copy(self, *args: Any, **kwargs: Any) -> Self:
        return super().copy(*args, **copy_kwargs(kwargs))

    with_options = copy


# -- the synchronous facade --------------------------------------------------------------

_CALL, _TOOL, _JOB = 0, 1, 2
"""What a thread of a SyncRuntime runs in the runtime's loop: a call (or any other
operation), a tool wait's block, a job's block; closing cuts them in this order."""

_CUT_BOUND_S: Final = 10.0
"""How long closing waits for what it cut to end (it ends at once; the portal's stop
cancels whatever is left after this)."""


class _Held:
    """A task that a thread of a SyncRuntime runs in the runtime's loop: a call, cut by
    cancelling its scope, or the block of a job or tool wait, left when the thread leaves
    it or, with :class:`RuntimeClosedError`, when the runtime closes under it. Made and
    used in the loop's thread only."""

    __slots__ = ("error", "left", "scope", "tier")

    def __init__(self, tier: int) -> None:
        self.tier = tier
        self.scope: anyio.CancelScope | None = None
        self.left: anyio.Event | None = None
        self.error: BaseException | None = None

    def leave(self, error: BaseException | None) -> None:
        """End the block (the first time only), with the block's exception or None."""
        if self.left is not None and not self.left.is_set():
            self.error = error
            self.left.set()


class _RuntimeOptions(TypedDict, total=False):
    """:class:`Runtime`'s keyword arguments, typed as it types them, for
    :class:`SyncRuntime`'s (tests/runtime/test_sync.py checks that the two agree)."""

    config: str | os.PathLike[str] | None
    dialect: DialectSpec
    api_key: str | None
    routing: str | Router
    policy: PolicySpec
    concurrency: int | Literal["auto", "engine"] | None
    token_budget: int | None
    send_priority: bool | Literal["auto"]
    retry: Retry
    timeout_s: float | TimeoutLike
    transport: AsyncTransport | None
    on_job_end: Callable[[JobReport], None] | None
    keep_reports: int
    poll_metrics_s: float | Literal["auto"] | None
    hooks: Sequence[Hook]
    journal: str | os.PathLike[str] | None
    otel: bool
    prometheus: Any
    capture_content: bool
    learn_waits: bool
    load_control: bool | LoadControl


_RUNTIME_SIGNATURE = inspect.signature(Runtime.__init__)
"""Runtime's parameters, with their defaults (SyncRuntime checks its arguments by them)."""


class SyncRuntime:
    """The same shape as :class:`Runtime` for code that is not async.

    An anyio blocking portal runs the async runtime in a background thread::

        with agentrt.SyncRuntime(["http://127.0.0.1:8000/v1"]) as rt:
            with rt.job("fix-bug") as job, job.session("main") as s:
                reply = s.chat(model="m", messages=[...])

    It takes Runtime's keyword arguments, typed as Runtime types them (a misspelt one is
    a type error, and a ``TypeError`` at run time), ``config=`` and ``AGENTRT_CONFIG``
    included; ``backend`` picks the event loop (``"asyncio"`` or ``"trio"``).
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint] | str | Endpoint,
        *,
        backend: Literal["asyncio", "trio"] = "asyncio",
        **kwargs: Unpack[_RuntimeOptions],
    ) -> None:
        self._args = (endpoints, kwargs)
        # Checked now, before a thread starts, with the same errors as Runtime's (its
        # settings file read as it reads it), without building a runtime.
        args = _RUNTIME_SIGNATURE.bind(None, endpoints, **configured(dict(kwargs)))
        args.apply_defaults()
        options = dict(args.arguments)
        del options["self"], options["endpoints"]
        journal = options.pop("journal")
        for unchecked in ("config", "transport", "on_job_end", "capture_content"):
            del options[unchecked]
        self._checked = check(endpoints, **options)  # (kept for the repr)
        if journal is not None:
            Journal(journal).close()  # a bad path fails here; the runtime opens its own
        self._backend = backend
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._rt: Runtime | None = None
        self._rt_cm: AbstractContextManager[Runtime] | None = None
        self._closed = False
        # What the threads run in the runtime's loop, and whether its close has begun
        # (the loop's thread only: the close cuts them, SyncRuntime._cut).
        self._held: set[_Held] = set()
        self._cutting = False
        self._wake: anyio.Event | None = None

    def __repr__(self) -> str:
        if self._rt is not None:
            states, router = self._rt._core.endpoints, self._rt._core.router
        else:
            states, router = self._checked.states, self._checked.router
        urls = [e.endpoint.url for e in states]
        state = "closed" if self._closed else "open" if self._rt is not None else "not entered"
        return (
            f"<agentrt.SyncRuntime endpoints={urls!r} routing={router.name!r} "
            f"backend={self._backend!r} {state}>"
        )

    def __enter__(self) -> SyncRuntime:
        self._portal_cm = start_blocking_portal(self._backend)
        self._portal = self._portal_cm.__enter__()
        endpoints, kwargs = self._args
        self._rt = Runtime(endpoints, **kwargs)
        # Entered and left in one task of the portal's loop (the runtime may hold a task
        # group for its background probes).
        self._rt_cm = self._portal.wrap_async_context_manager(self._rt)
        self._rt_cm.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._portal is not None and self._portal_cm is not None
        assert self._rt_cm is not None
        self._closed = True  # before the runtime closes: no call reaches its loop after
        portal = self._portal
        running: list[str] = []
        try:
            # Other threads' jobs still running are cut first, so that their reports
            # reach the journal and the hooks before the runtime closes them.
            running = portal.call(self._cut)
            self._rt_cm.__exit__(exc_type, exc, tb)
        finally:
            self._portal = None
            try:  # nothing is left by now; nothing left may keep the loop's thread alive
                portal.call(portal.stop, True)
            except RuntimeError:  # pragma: no cover (already stopped)
                pass
            self._portal_cm.__exit__(None, None, None)
        if running and exc_type is None:
            raise still_running(running)  # as the async Runtime's block raises it

    async def _cut(self) -> list[str]:
        """Cut what other threads still run in the runtime's loop as its block ends (the
        loop's thread): their calls in flight (cancelled: their threads get
        ``RuntimeClosedError``), then their tool waits' and jobs' blocks, each left with
        ``RuntimeClosedError``, so that a job ends as an async job whose runtime closed
        under its next call does (status ``error``). Returns the ids of the jobs that
        were still running."""
        self._cutting = True  # what a thread starts from now on is refused (_run)
        running = list(self.runtime._core.active_jobs)
        with anyio.move_on_after(_CUT_BOUND_S):
            for tier in (_CALL, _TOOL, _JOB):
                doomed = [held for held in self._held if held.tier == tier]
                for held in doomed:
                    if held.scope is not None:
                        held.scope.cancel()
                    else:
                        held.leave(RuntimeClosedError(CLOSED_MESSAGE))
                while any(held in self._held for held in doomed):
                    self._wake = anyio.Event()
                    await self._wake.wait()
        self._wake = None
        return running

    @property
    def runtime(self) -> Runtime:
        """The async runtime underneath."""
        if self._rt is None:
            raise AgentrtError("use the SyncRuntime inside 'with SyncRuntime(...) as rt:'")
        return self._rt

    def _open_portal(self) -> BlockingPortal:
        """The portal into the runtime's loop, while the runtime's block lasts."""
        portal = self._portal
        if portal is None or self._closed:
            if self._closed:
                # As its clients raise it: an openai client passes it on as it is.
                raise ClientClosedError(CLOSED_MESSAGE)
            raise AgentrtError("use the SyncRuntime inside 'with SyncRuntime(...) as rt:'")
        return portal

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run in the runtime's loop (awaited if it is async), from this
        thread; ``RuntimeClosedError`` if the runtime closes first or meanwhile."""
        return self._result(self._start(self._open_portal(), _CALL, fn, args))

    def _start(
        self, portal: BlockingPortal, tier: int, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> Future[Any]:
        try:
            return portal.start_task_soon(self._run, tier, fn, args)
        except RuntimeError:  # the portal stopped since it was looked up: closed
            if self._closed:
                raise ClientClosedError(CLOSED_MESSAGE) from None
            raise

    def _result(self, future: Future[Any]) -> Any:
        try:
            return future.result()
        except CancelledError:  # the portal cancelled it as it stopped: closed
            if self._closed:
                raise ClientClosedError(CLOSED_MESSAGE) from None
            raise

    async def _run(self, tier: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """(The loop's thread.) A thread's call, or ``fn(held, *args)`` for a block,
        counted where the runtime's close finds it to cut it (:meth:`_cut`)."""
        if self._cutting:
            raise ClientClosedError(CLOSED_MESSAGE)
        held = _Held(tier)
        self._held.add(held)
        try:
            if tier != _CALL:
                return await fn(held, *args)
            with anyio.CancelScope() as held.scope:
                result = fn(*args)
                if isawaitable(result):
                    result = await result
                return result
            raise ClientClosedError(CLOSED_MESSAGE)  # cut by the close
        finally:
            self._held.discard(held)
            if self._wake is not None:
                self._wake.set()

    async def _hold(
        self, held: _Held, cm: AbstractAsyncContextManager[Any], entered: Future[Any]
    ) -> None:
        """(The loop's thread.) Hold ``cm`` open while a thread runs its block: entered
        here, and left when :meth:`_Held.leave` says, with the block's exception thrown
        in as ``async with`` would (or the close's ``RuntimeClosedError``)."""
        held.left = anyio.Event()
        async with cm as value:
            entered.set_result((value, held))
            await held.left.wait()
            if held.error is not None:
                raise held.error

    @contextmanager
    def _block(self, tier: int, cm: AbstractAsyncContextManager[_T]) -> Iterator[_T]:
        """Run this thread's block inside ``cm``, which is entered and left in one task
        of the runtime's loop (as anyio's ``wrap_async_context_manager`` does). If the
        runtime closes under the block, ``cm`` is left then, with
        ``RuntimeClosedError``, and leaving the block raises it (an exception of the
        block's own goes on instead)."""
        portal = self._open_portal()
        entered: Future[Any] = Future()
        done = self._start(portal, tier, self._hold, (cm, entered))
        wait((entered, done), return_when=FIRST_COMPLETED)
        if not entered.done():
            self._result(done)  # raises: entering failed, or the runtime closed
        value, held = entered.result()
        try:
            yield value
        except BaseException as exc:
            self._leave(portal, held, done, exc)
            raise
        self._leave(portal, held, done, None)

    def _leave(
        self, portal: BlockingPortal, held: _Held, done: Future[Any], error: BaseException | None
    ) -> None:
        """Leave a block of :meth:`_block`; raises what ``cm`` raised on leaving."""
        if not self._closed:  # else the close leaves it (or has)
            try:
                portal.call(held.leave, error)
            except RuntimeError:  # the portal stopped meanwhile: the close left it
                if not self._closed:
                    raise
        try:
            self._result(done)
        except RuntimeClosedError:
            if error is None:
                raise

    def _refuses(self) -> bool:
        """Whether its block has ended (its sync clients refuse calls from then on)."""
        return self._closed

    def reports(self) -> list[JobReport]:
        """The reports of the most recently finished jobs (``keep_reports`` of them)."""
        return self.runtime.reports()

    def endpoint_loads(self) -> list[EndpointLoad]:
        """A snapshot of each endpoint's load (see :meth:`Runtime.endpoint_loads`)."""
        return self._call(self.runtime.endpoint_loads)  # type: ignore[no-any-return]

    def load_statistics(self) -> LoadStatistics | None:
        """A snapshot of what load control did (see :meth:`Runtime.load_statistics`)."""
        return self._call(self.runtime.load_statistics)  # type: ignore[no-any-return]

    def admission_statistics(self) -> list[AdmissionStatistics]:
        """A snapshot of each endpoint's admission gate (see
        :meth:`Runtime.admission_statistics`)."""
        return self._call(self.runtime.admission_statistics)  # type: ignore[no-any-return]

    @sync_block("rt.job(...) as job")
    def job(
        self,
        name: str,
        *,
        job_id: str | None = None,
        program_id: str | None = None,
        deadline_s: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Iterator[SyncJob]:
        """Run one job (see :meth:`Runtime.job`)."""
        rt = self.runtime
        check_not_nested(rt._core, name)
        job = rt._new_job(name, job_id, program_id, deadline_s, metadata)
        with self._block(_JOB, run_job(job, enforce_deadline=False)):
            token = _CURRENT_JOB.set(job)  # for this thread's sync clients (SyncTransport)
            try:
                yield SyncJob(self, job)
            finally:
                _CURRENT_JOB.reset(token)

    def http_client(self) -> httpx.Client:
        """A synchronous HTTP client whose requests go through agentrt (for frameworks
        that accept one; see :meth:`Runtime.http_client`). Its requests run in the
        runtime's event loop; inside ``job.session(...)`` they are that session's turns."""
        rt = self.runtime
        rt._check_open()
        lib = rt._lib
        return lib.mod.Client(  # type: ignore[no-any-return]
            transport=lib.derive(SyncTransport)(
                self._call, self._refuses, lib.derive(AgentTransport)(rt._core, rt._inner)
            ),
            timeout=rt._timeout,
        )

    def openai(self, **kwargs: Any) -> openai.OpenAI:
        """A synchronous ``openai.OpenAI`` whose calls go through agentrt."""
        rt = self.runtime
        rt._check_open()
        kwargs = client_kwargs(rt._core, kwargs)
        http = self.http_client()
        # openai 3.x types its client as httpx2.Client and accepts legacy httpx clients.
        return _OpenAI(http_client=http, **kwargs)  # type: ignore[arg-type,unused-ignore]


class SyncJob:
    """A :class:`Job` seen from synchronous code."""

    def __init__(self, srt: SyncRuntime, job: Job) -> None:
        self._srt = srt
        self.job = job

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def report(self) -> JobReport:
        if self.job._report is not None:
            return self.job._report
        return self._srt._call(lambda: self.job.report)  # type: ignore[no-any-return]

    @sync_block("job.session(...) as s")
    def session(
        self,
        name: str | None = None,
        *,
        session_id: str | None = None,
        parent: SyncSession | Session | str | None = None,
        blocks_parent: bool | None = None,
    ) -> Iterator[SyncSession]:
        """Open a session in this job (see :meth:`Job.session`)."""
        if isinstance(parent, SyncSession):
            parent = parent.session
        # Made on the runtime's event loop thread, whose clock stamps its start.
        session = self._srt._call(
            partial(self.job._open_session, name, session_id, parent, blocks_parent)
        )
        token = _CURRENT_SESSION.set(session)
        try:
            yield SyncSession(self._srt, session)
        finally:
            # Ended on the loop's thread, as an async session's block ends it: unpinned
            # from its endpoint, SessionClosed emitted.
            try:
                self._srt._call(session._close)
            except RuntimeClosedError:
                session._closed = True
            _CURRENT_SESSION.reset(token)
            if self.job._streams:  # its streams left unread: ended, connections closed
                with suppress(RuntimeClosedError):
                    self._srt._call(self.job._shut_streams, session)


class SyncSession:
    """A :class:`Session` seen from synchronous code."""

    def __init__(self, srt: SyncRuntime, session: Session) -> None:
        self._srt = srt
        self.session = session

    @property
    def id(self) -> str:
        return self.session.id

    def expect_idle(self, seconds: float | None) -> None:
        """Declare the idle time expected after the next reply (see :meth:`Session.expect_idle`)."""
        self.session.expect_idle(seconds)

    def expect_final(self) -> None:
        """Declare the next call the session's last (see :meth:`Session.expect_final`)."""
        self.session.expect_final()

    def _run(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        job = self.session.job
        if job.deadline_s is None:
            return self._srt._call(partial(fn, **kwargs))

        async def bounded() -> Any:
            remaining = job._t0 + (job.deadline_s or 0.0) - anyio.current_time()
            with anyio.fail_after(max(remaining, 0.0)):
                return await fn(**kwargs)

        return self._srt._call(bounded)

    @overload
    def chat(
        self,
        *,
        stream: Literal[False] | None = ...,
        final: bool = ...,
        **kwargs: Unpack[ChatArgs],
    ) -> ChatCompletion: ...
    @overload
    def chat(
        self, *, stream: Literal[True], final: bool = ..., **kwargs: Unpack[ChatArgs]
    ) -> Iterator[ChatCompletionChunk]: ...
    @overload
    def chat(
        self, *, stream: bool, final: bool = ..., **kwargs: Unpack[ChatArgs]
    ) -> ChatCompletion | Iterator[ChatCompletionChunk]: ...
    def chat(self, **kwargs: Any) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """``chat.completions.create`` through agentrt (see :meth:`Session.chat`)."""
        result = self._run(self.session.chat, **kwargs)
        if kwargs.get("stream"):
            return _sync_iter(self._srt, result)
        return result  # type: ignore[no-any-return]

    @overload
    def complete(
        self,
        *,
        stream: Literal[False] | None = ...,
        final: bool = ...,
        **kwargs: Unpack[CompleteArgs],
    ) -> Completion: ...
    @overload
    def complete(
        self, *, stream: Literal[True], final: bool = ..., **kwargs: Unpack[CompleteArgs]
    ) -> Iterator[Completion]: ...
    @overload
    def complete(
        self, *, stream: bool, final: bool = ..., **kwargs: Unpack[CompleteArgs]
    ) -> Completion | Iterator[Completion]: ...
    def complete(self, **kwargs: Any) -> Completion | Iterator[Completion]:
        """``completions.create`` through agentrt (see :meth:`Session.complete`)."""
        result = self._run(self.session.complete, **kwargs)
        if kwargs.get("stream"):
            return _sync_iter(self._srt, result)
        return result  # type: ignore[no-any-return]

    @sync_block("s.tool(...)")
    def tool(self, name: str, *, expected_s: float | None = None) -> Iterator[None]:
        """Mark a tool's execution (see :meth:`Session.tool`)."""
        with self._srt._block(_TOOL, self.session.tool(name, expected_s=expected_s)):
            yield


def _sync_iter(srt: SyncRuntime, stream: AsyncStream[_T]) -> Iterator[_T]:
    it = stream.__aiter__()
    try:
        while True:
            try:
                yield srt._call(it.__anext__)
            except StopAsyncIteration:
                return
    finally:
        if not srt._closed:  # else the runtime's close has ended it
            srt._call(stream.close)
