"""A runtime's lifetime against the fault server: a ``SyncRuntime`` whose block ends while
another thread's job still runs (a call in flight, a tool wait, a stream half read).

Closing must not wait for that thread: it cuts the job's calls (``cancelled``, the
connection closed at the server), ends its job with status ``error``
(``RuntimeClosedError``, as an async job whose runtime closed under it), raises
``AgentrtError`` naming the job as the async ``Runtime`` does, and the other thread gets
``RuntimeClosedError`` (from its call, its next call, or leaving its blocks).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from _faultserver import MODEL, Fault, FaultServer, chunk, fault_server

import agentrt
from agentrt import AgentrtError, RuntimeClosedError
from agentrt.telemetry import read_journal

pytestmark = pytest.mark.timeout(60)

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
CLOSE_BOUND_S = 5.0
"""Closing under another thread's job returns within this (it waits for nothing)."""
BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])


@pytest.fixture
def server() -> Any:
    with fault_server() as srv:
        yield srv


class Worker(threading.Thread):
    """Runs ``body(rt, ready)`` in a thread; records the exception it ended with."""

    rt: agentrt.SyncRuntime  # set by close_under

    def __init__(self, body: Callable[[Worker], None]) -> None:
        super().__init__(daemon=True)
        self.body = body
        self.ready = threading.Event()
        self.caught: BaseException | None = None
        self.job: agentrt.SyncJob | None = None

    def run(self) -> None:
        try:
            self.body(self)
        except BaseException as exc:
            self.caught = exc


def close_under(
    srt: agentrt.SyncRuntime,
    worker: Worker,
    until: Callable[[], bool],
    closed: Callable[[], None] | None = None,
) -> Any:
    """Enter ``srt``, start ``worker``, leave the block once ``until()`` (then call
    ``closed``, if given); returns what the block raised. Fails (rather than hangs) when
    leaving takes longer than the bound."""
    outcome: dict[str, Any] = {}

    def main() -> None:
        try:
            with srt as rt:
                worker.rt = rt
                worker.start()
                end = time.monotonic() + 10.0
                while not until() and time.monotonic() < end:
                    time.sleep(0.01)
                assert until(), "the worker never got going"
                outcome["left_at"] = time.monotonic()
        except BaseException as exc:
            outcome["raised"] = exc
        outcome["closed_at"] = time.monotonic()
        if closed is not None:
            closed()

    closer = threading.Thread(target=main, daemon=True)
    closer.start()
    closer.join(15.0)
    assert not closer.is_alive(), "leaving the SyncRuntime's block hung"
    assert outcome["closed_at"] - outcome["left_at"] < CLOSE_BOUND_S
    worker.join(CLOSE_BOUND_S)
    assert not worker.is_alive(), "the other thread never returned"
    return outcome.get("raised")


def cut(raised: BaseException | None, worker: Worker) -> agentrt.JobReport:
    """The report of the worker's job, checked as cut by the close: the main thread heard
    of the job (as the async Runtime says it), the worker got the closed error (not
    anyio's "This portal is not running"), the job ended with it."""
    assert worker.job is not None
    assert isinstance(raised, AgentrtError) and "still running" in str(raised)
    assert worker.job.id in str(raised)
    assert isinstance(worker.caught, RuntimeClosedError), repr(worker.caught)
    report = worker.job.report
    assert report.status == "error" and report.error is not None
    assert report.error.startswith("RuntimeClosedError: this Runtime is closed")
    return report


def runtime(server: FaultServer, backend: str, **kwargs: Any) -> agentrt.SyncRuntime:
    return agentrt.SyncRuntime(
        [server.url], backend=backend, otel=False, retry=agentrt.Retry(attempts=1), **kwargs
    )


@BACKENDS
def test_closing_under_a_call_in_flight_cuts_it(server: FaultServer, backend: str) -> None:
    server.push(Fault.stall())

    def body(w: Worker) -> None:
        with w.rt.job("bg") as job, job.session("s") as s:
            w.job = job
            s.chat(model=MODEL, messages=MESSAGES)

    worker = Worker(body)
    raised = close_under(runtime(server, backend), worker, lambda: bool(server.chat_requests))
    (call,) = cut(raised, worker).call_reports
    assert call.status == "cancelled"
    assert server.wait_disconnect(server.chat_requests[0], CLOSE_BOUND_S) is not None


@BACKENDS
def test_closing_under_a_tool_wait_ends_the_job(
    server: FaultServer, backend: str, tmp_path: Path
) -> None:
    release = threading.Event()
    after: list[BaseException] = []

    def body(w: Worker) -> None:
        with w.rt.job("bg") as job, job.session("s") as s:
            w.job = job
            s.chat(model=MODEL, messages=MESSAGES)
            try:
                with s.tool("pytest", expected_s=1.0):
                    w.ready.set()
                    release.wait(10.0)  # the runtime closes meanwhile
            finally:
                try:  # a call after the close is refused before anything is sent
                    s.chat(model=MODEL, messages=MESSAGES)
                except RuntimeClosedError as exc:
                    after.append(exc)

    worker = Worker(body)

    def until() -> bool:
        return worker.ready.is_set()

    journal = tmp_path / "runs.jsonl"
    srt = runtime(server, backend, journal=journal)
    # The tool ends once the block is left (not after a time that a loaded machine's
    # close may outlast).
    raised = close_under(srt, worker, until, closed=release.set)
    report = cut(raised, worker)
    assert len(after) == 1
    assert [c.status for c in report.call_reports] == ["ok"]
    assert len(server.chat_requests) == 1
    (tool,) = report.tool_reports  # ended before the job's report was made
    assert tool.name == "pytest" and tool.status == "error"
    # Handed on and journaled before the runtime closed its journal: nothing is lost.
    assert srt.reports()[-1].job_id == report.job_id
    assert [r.job_id for r in read_journal(journal)] == [report.job_id]


@BACKENDS
def test_closing_under_an_openai_client_call(server: FaultServer, backend: str) -> None:
    """Through ``rt.openai()``'s sync client the error arrives as it is, not wrapped in
    openai's APIConnectionError; a call outside any session (its implicit job) too."""
    server.default = Fault.stall()

    def body(w: Worker) -> None:
        client = w.rt.openai()
        with w.rt.job("bg") as job, job.session("s"):
            w.job = job
            client.chat.completions.create(model=MODEL, messages=MESSAGES)

    worker = Worker(body)
    outside: list[BaseException] = []

    def lone(w: Worker) -> None:
        try:
            w.rt.openai().chat.completions.create(model=MODEL, messages=MESSAGES)
        except BaseException as exc:
            outside.append(exc)

    srt = runtime(server, backend)
    second = Worker(lone)

    def until() -> bool:
        if worker.job is not None and not second.is_alive() and second.ident is None:
            second.rt = worker.rt
            second.start()
        return len(server.chat_requests) == 2

    raised = close_under(srt, worker, until)
    second.join(CLOSE_BOUND_S)
    assert "2 job(s)" in str(raised) and len(outside) == 1
    assert cut(raised, worker).status == "error"
    for caught in (worker.caught, *outside):
        assert isinstance(caught, RuntimeClosedError), repr(caught)
        assert not isinstance(caught, openai.APIConnectionError)
    implicit = [r for r in srt.reports() if r.name == "call"]
    assert len(implicit) == 1 and implicit[0].status == "cancelled"


@BACKENDS
def test_closing_under_a_half_read_stream(server: FaultServer, backend: str) -> None:
    server.push(Fault.stream([chunk("a")], then_stall=30.0))
    got: list[Any] = []

    def body(w: Worker) -> None:
        with w.rt.job("bg") as job, job.session("s") as s:
            w.job = job
            chunks = iter(s.chat(model=MODEL, messages=MESSAGES, stream=True))
            got.append(next(chunks))
            w.ready.set()
            got.extend(chunks)  # the next read waits in the runtime's loop: closing cuts it

    worker = Worker(body)
    raised = close_under(runtime(server, backend), worker, worker.ready.is_set)
    assert len(got) == 1
    assert cut(raised, worker).call_reports[0].status == "cancelled"
