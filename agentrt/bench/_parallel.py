"""Parallel replays: a study's independent replays on a process pool, or on Ray.

A study is a list of embedded-cluster runs (:class:`BenchConfig`: several clients,
configurations or loads). Each run splits into replays that share nothing: each client on
its own fresh cluster, and the solo runs that give each job's JCT stretch, each in its own
virtual-time event loop from time 0 (:func:`~agentrt.bench._runner.replay_part`). So they
can run anywhere, in any order, and give the same results as one by one:

- ``workers=1``: one by one, in this process;
- ``workers=N`` (or ``"auto"``: one per core): on a pool of N spawned processes
  (:mod:`concurrent.futures`), each replay a picklable description (its configuration and
  which part) plus its jobs, pickled once per workload and unpickled once per process;
- ``workers="ray"``: on Ray (the ``ray`` extra): the cluster ``ray.init()`` finds
  (``RAY_ADDRESS``), or a local one started for the study and shut down after it.

:func:`run_study` blocks: from async code call it off the event loop
(``await anyio.to_thread.run_sync(run_study, configs)``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, Final, Literal, overload

from ._plan import JobPlan
from ._runner import (
    BenchConfig,
    BenchResult,
    PartResult,
    Progress,
    bench_result,
    check_config,
    clear_journals,
    journal_paths,
    part_label,
    prepare,
    replay_part,
    sim_clients,
    sim_parts,
    workload_key,
)

__all__ = ["Workers", "default_workers", "parse_workers", "run_study"]

Workers = int | Literal["auto", "ray"]
"""Where a study's replays run: N processes (1: one by one in this process), ``"auto"``
(one process per core) or ``"ray"``."""

RAY_MISSING: Final = "running replays on Ray needs the ray extra: pip install 'agentjct[ray]'"


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


@dataclass(frozen=True, slots=True)
class _Replay:
    """One replay, as a pool worker or a Ray task receives it (with its jobs, pickled)."""

    cfg: BenchConfig
    part: int
    jobs_id: str
    """Names the pickled jobs: a worker that has unpickled them keeps them for the next
    replay of the same workload."""


_jobs_cache: dict[str, list[JobPlan]] = {}
"""A worker process's last unpickled jobs (one workload: a study's replays arrive grouped
by configuration)."""


def _run_replay(replay: _Replay, jobs: bytes) -> PartResult:
    """A worker's entry point (a pool process or a Ray task)."""
    plans = _jobs_cache.get(replay.jobs_id)
    if plans is None:
        _jobs_cache.clear()
        plans = _jobs_cache[replay.jobs_id] = pickle.loads(jobs)
    try:
        return replay_part(replay.cfg, plans, replay.part)
    except Exception as exc:
        raise _portable(exc) from None


def _portable(exc: Exception) -> Exception:
    """``exc``, or a RuntimeError saying what it was where it does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


@dataclass(slots=True)
class _Run:
    """One configuration of a study: its jobs, its replays' results, its error."""

    cfg: BenchConfig
    plans: list[JobPlan] | None = None
    jobs_id: str = ""
    parts: dict[int, PartResult | BaseException] | None = None
    error: BaseException | None = None
    done_s: float = 0.0


Done = Callable[[int, "PartResult | BaseException"], None]


@overload
def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = ...,
    progress: Progress | None = ...,
    return_exceptions: Literal[False] = ...,
) -> list[BenchResult]: ...


@overload
def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = ...,
    progress: Progress | None = ...,
    return_exceptions: Literal[True],
) -> list[BenchResult | Exception]: ...


@overload
def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = ...,
    progress: Progress | None = ...,
    return_exceptions: bool,
) -> list[BenchResult] | list[BenchResult | Exception]: ...


def run_study(
    configs: Sequence[BenchConfig],
    *,
    workers: Workers = "auto",
    progress: Progress | None = None,
    return_exceptions: bool = False,
) -> list[BenchResult] | list[BenchResult | Exception]:
    """Run every configuration, their replays spread over ``workers``; one result per
    configuration, in order, the same as ``[run_bench(c) for c in configs]`` except for
    ``wall_s`` (here: seconds from the study's start to the configuration's last replay).

    Configurations that replay the same jobs (the same workload, jobs, rate, seed, traces,
    ...) share them: they are made once. Real servers (``endpoints``) run in this process,
    one configuration after the other, before the rest. ``progress`` is called with the
    replay's label (``alone`` or the client's name) once per job, as the replay ends when
    it runs elsewhere. ``return_exceptions``: a configuration that fails (a bad option, an
    engine error) gives its exception in its place and the others run; otherwise the first
    error is raised and the replays not yet started are cancelled. Blocking."""
    from ._runner import run_bench

    if workers == "auto":
        workers = default_workers()
    elif workers != "ray" and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise ValueError(f"workers must be an int >= 1, 'auto' or 'ray', not {workers!r}")
    elif workers != "ray" and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == "ray":
        _import_ray()  # a missing extra fails before anything runs
    report: Progress = progress or (lambda label: None)
    runs = [_Run(cfg) for cfg in configs]
    _check_journals(configs)
    study = uuid.uuid4().hex
    made: dict[tuple[object, ...], tuple[list[JobPlan], str]] = {}
    for run in runs:
        try:
            if run.cfg.endpoints:
                continue
            key = workload_key(run.cfg)
            if key not in made:
                made[key] = (prepare(run.cfg), f"{study}-{len(made)}")
            else:
                check_config(run.cfg)
            run.plans, run.jobs_id = made[key]
        except Exception as exc:
            if not return_exceptions:
                raise
            run.error = exc
    results: list[BenchResult | Exception] = []
    for run in runs:  # real servers: wall-clock time, one client at a time, here
        if run.cfg.endpoints and run.error is None:
            try:
                results.append(run_bench(run.cfg, progress))
            except Exception as exc:
                if not return_exceptions:
                    raise
                run.error = exc

    jobs = [
        (i, part)
        for i, run in enumerate(runs)
        if run.plans is not None and run.error is None
        for part in sim_parts(run.cfg)
    ]
    for run in runs:
        if run.plans is not None and run.error is None:
            clear_journals(run.cfg)
            run.parts = {}
    started = time.perf_counter()

    def done(index: int, result: PartResult | BaseException) -> None:
        i, part = jobs[index]
        run = runs[i]
        assert run.parts is not None and run.plans is not None
        run.parts[part] = result
        run.done_s = time.perf_counter() - started
        if isinstance(result, BaseException):
            if not return_exceptions:
                raise result
            return
        if workers != 1:  # one by one, the replay reported each job as it ended
            label = part_label(run.cfg, part)
            for _ in run.plans:
                report(label)

    if workers == "ray":
        _on_ray(runs, jobs, done)
    elif workers == 1 or len(jobs) <= 1:
        for index, (i, part) in enumerate(jobs):
            run = runs[i]
            assert run.plans is not None
            try:
                result: PartResult | BaseException = replay_part(run.cfg, run.plans, part, report)
            except Exception as exc:
                result = exc
            done(index, result)
    else:
        _on_pool(runs, jobs, min(workers, len(jobs)), done)

    out: list[BenchResult | Exception] = []
    real = iter(results)
    for run in runs:
        if run.error is not None:
            out.append(_as_exception(run.error))
        elif run.cfg.endpoints:
            out.append(next(real))
        else:
            assert run.parts is not None and run.plans is not None
            failed = [r for p, r in sorted(run.parts.items()) if isinstance(r, BaseException)]
            if failed:
                out.append(_as_exception(failed[0]))
            else:
                parts = {p: r for p, r in run.parts.items() if not isinstance(r, BaseException)}
                clients = sim_clients(run.cfg, parts)
                out.append(bench_result(run.cfg, run.plans, clients, run.done_s))
    return out


def _as_exception(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else RuntimeError(f"{type(exc).__name__}: {exc}")


def _check_journals(configs: Sequence[BenchConfig]) -> None:
    seen: set[str] = set()
    for cfg in configs:
        for path in journal_paths(cfg):
            if path is None:
                continue
            name = str(path.resolve())
            if name in seen:
                raise ValueError(
                    f"two configurations of the study write the journal {path}: give each "
                    "its own journal_dir"
                )
            seen.add(name)


def _pickled(runs: list[_Run]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for run in runs:
        if run.plans is not None and run.jobs_id not in out:
            out[run.jobs_id] = pickle.dumps(run.plans, protocol=pickle.HIGHEST_PROTOCOL)
    return out


def _on_pool(runs: list[_Run], jobs: list[tuple[int, int]], n: int, done: Done) -> None:
    blobs = _pickled(runs)
    # spawn: a fresh interpreter per worker (fork would copy this process's threads and
    # locks), started once per study and reused for every replay.
    pool = ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn"))
    try:
        pending: dict[Future[PartResult], int] = {}
        for index, (i, part) in enumerate(jobs):
            run = runs[i]
            replay = _Replay(run.cfg, part, run.jobs_id)
            pending[pool.submit(_run_replay, replay, blobs[run.jobs_id])] = index
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


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ModuleNotFoundError(RAY_MISSING, name="ray") from None


def _on_ray(runs: list[_Run], jobs: list[tuple[int, int]], done: Done) -> None:
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_run_replay)
        refs = {key: ray.put(blob) for key, blob in _pickled(runs).items()}
        pending: dict[Any, int] = {}
        for index, (i, part) in enumerate(jobs):
            run = runs[i]
            replay = _Replay(run.cfg, part, run.jobs_id)
            pending[task.remote(replay, refs[run.jobs_id])] = index
        try:
            while pending:
                finished, _ = ray.wait(list(pending), num_returns=1)
                for ref in finished:
                    index = pending.pop(ref)
                    try:
                        result: PartResult | BaseException = ray.get(ref)
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
