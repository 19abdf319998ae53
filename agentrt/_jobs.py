"""Running a job: the lifecycle of ``rt.job(...)``'s block (and of ``SyncRuntime.job``'s),
a job's status from the exception that ended it, and the checks around it."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from ._context import _CURRENT_JOB, Job
from ._errors import AgentrtError, only_cancelled

if TYPE_CHECKING:
    from ._state import _Core
    from .telemetry._report import JobReport, JobStatus

__all__ = ["check_not_nested", "close_job", "outcome", "run_job", "still_running"]


def outcome(exc: BaseException | None) -> tuple[JobStatus, str | None]:
    """A job's status and error for the exception that ended it (None: it succeeded)."""
    if exc is None:
        return "ok", None
    if only_cancelled(exc):  # trio's may come in a group (a nursery)
        return "cancelled", "cancelled"
    return "error", f"{type(exc).__name__}: {exc}"


def still_running(running: list[str]) -> AgentrtError:
    """The error of a runtime's block that ended while jobs (their ids) still ran."""
    names = ", ".join(repr(job_id) for job_id in running[:5])
    return AgentrtError(
        f"Runtime closed while {len(running)} job(s) were still running ({names}); "
        "end every job's block before leaving the Runtime's block"
    )


def check_not_nested(core: _Core, name: str) -> None:
    """Refuse a job opened in the block of another job of the same runtime that still
    runs (in it, or in a task or thread of it): jobs do not nest."""
    outer = _CURRENT_JOB.get()
    if outer is not None and outer._core is core and not outer._closed:
        raise AgentrtError(
            f"rt.job({name!r}) was opened inside job {outer.name!r} ({outer.id}), which "
            "is still running: jobs do not nest (a job is one piece of work whose "
            "completion time is measured). Make the inner work a session of that job "
            "(job.session(..., parent=...)), or run it as a job of its own outside "
            "that job's block"
        )


@asynccontextmanager
async def run_job(job: Job, *, enforce_deadline: bool) -> AsyncIterator[Job]:
    """A job's lifecycle. Without ``enforce_deadline`` (sync code, whose calls run in
    other tasks) each call enforces the deadline itself."""
    job._start()
    status: JobStatus = "ok"
    error: str | None = None
    deadline = math.inf if job.deadline_s is None else job._t0 + job.deadline_s
    token = _CURRENT_JOB.set(job)  # its calls outside any session: its default session
    try:
        if deadline == math.inf:
            # No cancel scope without a deadline: every scope around the job's calls
            # makes each of the HTTP stack's own scopes and checkpoints on those calls
            # walk one level more (about 500 bytecodes a call in anyio).
            yield job
            return
        if enforce_deadline:
            with anyio.CancelScope(deadline=deadline) as scope:
                yield job
            late = scope.cancelled_caught
        else:
            # Sync code cannot be cancelled: each call is bounded by the transport,
            # and a block that ends past the deadline ends as the async one would.
            yield job
            late = anyio.current_time() >= deadline
        if late or job._deadline_hit:
            status, error = "deadline", f"deadline of {job.deadline_s} s exceeded"
            raise TimeoutError(f"job {job.id!r} exceeded its deadline of {job.deadline_s} s")
    except BaseException as exc:
        if status == "ok":
            if job._deadline_hit or (
                isinstance(exc, TimeoutError) and anyio.current_time() >= deadline
            ):
                status, error = "deadline", f"deadline of {job.deadline_s} s exceeded"
            else:
                status, error = outcome(exc)
        raise
    finally:
        _CURRENT_JOB.reset(token)
        job._finish(status, error)
        if job._streams:  # streams left unread (their calls ended): connections closed
            await job._shut_streams(None)


def close_job(job: Job, exc: BaseException | None = None) -> JobReport:
    """End a job started without a block (``Runtime._open_job``), with the status
    ``rt.job`` gives: ``ok``, or ``cancelled`` / ``error`` for the exception that ended
    its work. A second call returns the report."""
    if job._report is not None:
        return job._report
    status, error = outcome(exc)
    return job._finish(status, error)
