"""Where a study's replays run: in this process, on a pool of spawned processes, or on Ray.

A study (:func:`~agentrt.bench.run_study`) is a list of independent replays, each a
picklable description and a key naming the data it shares with others (its jobs, pickled
once per workload). :func:`run_replays` hands them to a module-level function on N
processes (:mod:`concurrent.futures`, spawn: a fresh interpreter per worker, reused for
every replay it runs) or on Ray (the ``ray`` extra, imported lazily: the cluster
``ray.init()`` finds through ``RAY_ADDRESS``, or a local one started and shut down for the
study). It blocks: from async code call the study off the event loop
(``await anyio.to_thread.run_sync(...)``).
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Any, Final, Literal, TypeVar

__all__ = [
    "RAY_MISSING",
    "Workers",
    "check_workers",
    "default_workers",
    "import_ray",
    "parse_workers",
    "portable",
    "run_replays",
]

Workers = int | Literal["auto", "ray"]
"""Where a study's replays run: N processes (1: one by one in this process), ``"auto"``
(one process per core) or ``"ray"``."""

RAY_MISSING: Final = "running replays on Ray needs the ray extra: pip install 'agentjct[ray]'"

D = TypeVar("D")
R = TypeVar("R")


def default_workers() -> int:
    """The cores this process may run on (``"auto"`` workers)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def parse_workers(text: str) -> Workers:
    """``--workers``: an int >= 1, ``auto`` or ``ray``."""
    if text in ("auto", "ray"):
        return text  # type: ignore[return-value]
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"workers must be an int >= 1, auto or ray, not {text!r}")
    return n


def check_workers(workers: Workers) -> int | Literal["ray"]:
    """``workers`` checked, ``"auto"`` resolved to the cores; Ray imported when asked for,
    so that a missing extra fails before anything runs."""
    if workers == "auto":
        return default_workers()
    if workers == "ray":
        import_ray()
        return "ray"
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise ValueError(f"workers must be an int >= 1, 'auto' or 'ray', not {workers!r}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return workers


def import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ModuleNotFoundError(RAY_MISSING, name="ray") from None


def portable(exc: Exception) -> Exception:
    """``exc``, or a RuntimeError saying what it was where it does not survive pickling
    (a worker's error goes back to the caller pickled)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def run_replays(
    fn: Callable[[D, bytes], R],
    replays: Sequence[tuple[D, str]],
    shared: Mapping[str, bytes],
    workers: int | Literal["ray"],
    done: Callable[[int, R | BaseException], None],
) -> None:
    """Run ``fn(description, shared[key])`` for each ``(description, key)`` of ``replays``
    on ``workers`` processes (at most one per replay) or on Ray, calling ``done(index,
    result or exception)`` in this thread as each ends. ``fn`` is a module-level function
    (workers import it by name). An exception out of ``done`` stops the replays still
    running and is raised."""
    if workers == "ray":
        _on_ray(fn, replays, shared, done)
    else:
        _on_pool(fn, replays, shared, min(workers, len(replays)), done)


def _on_pool(
    fn: Callable[[D, bytes], R],
    replays: Sequence[tuple[D, str]],
    shared: Mapping[str, bytes],
    n: int,
    done: Callable[[int, R | BaseException], None],
) -> None:
    # spawn: a fresh interpreter per worker (fork would copy this process's threads and
    # locks), started once per study and reused for every replay.
    pool = ProcessPoolExecutor(max_workers=max(1, n), mp_context=get_context("spawn"))
    try:
        pending: dict[Future[R], int] = {}
        for index, (description, key) in enumerate(replays):
            pending[pool.submit(fn, description, shared[key])] = index
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                index = pending.pop(future)
                error = future.exception()
                done(index, error if error is not None else future.result())
    except BaseException:
        # An error (or Ctrl-C) ends the study: stop the replays still running rather
        # than wait for them.
        processes: dict[int, Any] = getattr(pool, "_processes", None) or {}
        for process in list(processes.values()):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _on_ray(
    fn: Callable[[D, bytes], R],
    replays: Sequence[tuple[D, str]],
    shared: Mapping[str, bytes],
    done: Callable[[int, R | BaseException], None],
) -> None:
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(fn)
        refs = {key: ray.put(shared[key]) for key in {key for _, key in replays}}
        pending: dict[Any, int] = {}
        for index, (description, key) in enumerate(replays):
            pending[task.remote(description, refs[key])] = index
        try:
            while pending:
                finished, _ = ray.wait(list(pending), num_returns=1)
                for ref in finished:
                    index = pending.pop(ref)
                    try:
                        result: R | BaseException = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        cause = getattr(exc, "cause", None)
                        result = cause if isinstance(cause, BaseException) else exc
                    done(index, result)
        finally:
            for ref in pending:
                ray.cancel(ref)
    finally:
        if started:
            ray.shutdown()
