"""Placement and load control by KV working set on two vLLM CPU replicas whose KV evicts.

The real-engine check: two vLLM CPU replicas (the tiny random-weight model of
``.engine/``, one core each, dev mode so that each run starts on empty prefix caches),
each given a KV cache (``--num-gpu-blocks-override``) that holds one session's context
many times over but not every session's at once. N agents, each a tool loop whose
context grows every turn (a system prompt all sessions share, the session's own task,
then a tool result and the reply per turn; short tool waits drawn per turn), are sent
by the clients named (``--clients``):

- ``plain``: one bare ``openai.AsyncOpenAI`` per replica, round robin over the two (what
  ``plain`` means in ``agentrt bench``): each replica ends up holding a copy of every
  session's context, twice the working set of a placement that keeps a session on one
  replica, and evicts;
- ``agentrt``: ``agentrt.Runtime([url_a, url_b])`` with its defaults (sessions, jobs and
  tool waits written as a user writes them; the only argument is an observing hook that
  records why sessions moved); load control is on (the engines publish their capacity);
- ``agentrt:load_control=off``: the same without load control
  (``Runtime(load_control=False)``); ``agentrt:max_hold_s=S``: with a bound of S seconds
  on a hold (``LoadControl(max_hold_s=S)``).

Two schedules. By default each agent runs one session, 0.3 s after the previous one (a
burst, run to its end). ``--loop S`` runs a closed loop instead: each agent starts a new
session as soon as its job ends, for ``--warmup`` seconds and then ``S`` measured
seconds, when every agent is cancelled; throughput (jobs and turns ended in the window,
per second), tokens and the engines' counters are those of the window.

The clients run in alternating order (``--runs 2``: plain, agentrt, agentrt, plain),
each run on emptied prefix caches (``POST /reset_prefix_cache``). Per run: JCT per job
(mean, p50, p90), throughput, prompt tokens, cached tokens (the replies'
``usage.prompt_tokens_details``), uncached = prompt - cached, re-prefilled tokens
(uncached beyond what the turn added to the session's context: the context an eviction
or a scatter lost), the engines' own prefix-cache counters (``vllm:prefix_cache_queries``
/ ``_hits``, deltas), each session's worst wait (the longest time from a call entering
the client to its reply, a call still waiting when the window closed counting what it
had waited), and for agentrt its session moves by reason, the KV capacity and working
set it saw (``rt.endpoint_loads()``) and what load control did
(``rt.load_statistics()``). Ratios of agentrt to each other client are given per round
(run order matters on a shared 2-core machine).

    bash scripts/engine_setup.sh
    python -m benchmarks engine kv       # results/real_kv_small.json, ~2 min here
    python -m benchmarks engine kv --blocks 128 --out results/real_kv_tight.json
    python -m benchmarks engine kv --sessions 32 --turns 8 --task-words 500 \\
        --step-words 400 --blocks 128 --loop 120 --warmup 40 --runs 2 \\
        --clients agentrt agentrt:load_control=off plain --out results/real_kv_oversub.json

Small on purpose: the model is a 2-layer random-weight Llama on CPU, so a prefill of a
few thousand tokens takes ~0.1-0.5 s; the KV pressure, not the model, is what is real.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import anyio
import anyio.to_thread
import httpx
from openai.types.chat import ChatCompletionMessageParam

import agentrt
from agentrt.telemetry import Event, SessionMoved
from agentrt.testing.vllm_cpu import SETUP_MESSAGE, ReplicaServer, ReplicaSpec, find_engine, launch

from ._harness import add_run_args, plain_clients, quantile, write_result

WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan "
    "file line patch test build error trace commit diff branch merge review"
).split()
CLIENTS = ("plain", "agentrt")
ENGINE_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
)
BLOCK_TOKENS = 128  # vLLM CPU's block size (its cache_config_info says so)


# -- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The workload's size; the same for every client and run."""

    sessions: int = 12
    """Agents: each runs one session (a burst), or sessions back to back (``loop_s``)."""
    turns: int = 8
    system_words: int = 300
    task_words: int = 300
    step_words: int = 200
    max_tokens: int = 16
    tool_s: tuple[float, float] = (0.2, 1.2)
    stagger_s: float = 0.3
    seed: int = 0
    salt: str = ""
    """Put before the system prompt: another salt, prompts no cache holds (where the
    prefix caches cannot be emptied between runs)."""
    loop_s: float = 0.0
    """A closed loop measured for this many seconds after ``warmup_s``: each agent starts
    a new session as soon as its job ends (0: one session per agent, run to the end)."""
    warmup_s: float = 0.0


@dataclass(frozen=True)
class SessionPlan:
    index: int
    start_s: float
    task: str
    steps: tuple[str, ...]
    """The tool result added before each turn after the first."""
    waits: tuple[float, ...]
    """The tool wait before each turn after the first, in seconds."""


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Workload:
    """The shared system prompt, then session plans one after another (seeded: the n-th
    session drawn is the same in every run, whichever agent starts it)."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self._rng = random.Random(shape.seed)
        self.system = shape.salt + "You are a coding agent. " + words(self._rng, shape.system_words)
        self._count = 0

    def next(self) -> SessionPlan:
        shape, rng, i = self.shape, self._rng, self._count
        self._count += 1
        task = f"task {i} {uuid.UUID(int=rng.getrandbits(128)).hex}: " + words(
            rng, shape.task_words
        )
        steps = tuple(
            f"tool result {t}: " + words(rng, shape.step_words) for t in range(shape.turns - 1)
        )
        waits = tuple(rng.uniform(*shape.tool_s) for _ in range(shape.turns - 1))
        start = i * shape.stagger_s if i < shape.sessions else 0.0
        return SessionPlan(i, start, task, steps, waits)


def plan(shape: Shape) -> tuple[str, list[SessionPlan]]:
    """The shared system prompt and the first session of each agent (seeded)."""
    workload = Workload(shape)
    return workload.system, [workload.next() for _ in range(shape.sessions)]


def context_tokens(shape: Shape, tokens_per_word: float) -> tuple[float, float]:
    """A session's context at its first and at its last turn, in tokens (estimated at
    ``tokens_per_word``; the tiny model's tokenizer gives 1.72 on these words)."""
    first = (shape.system_words + shape.task_words) * tokens_per_word
    last = first + (shape.turns - 1) * (shape.step_words * tokens_per_word + shape.max_tokens)
    return first, last


@dataclass
class CallRecord:
    session: int
    turn: int
    replica: int
    prompt: int
    cached: int
    completion: int
    latency_s: float
    """From the call entering the client to its reply (load control's hold included)."""
    start_s: float = 0.0
    """When the call entered the client, from the run's start."""
    end_s: float = 0.0
    held_s: float = 0.0
    """Of its latency, the time load control held it (agentrt)."""


@dataclass
class JobRecord:
    session: int
    jct_s: float
    calls: list[CallRecord] = field(default_factory=list)
    end_s: float = 0.0


Ask = Callable[[list[ChatCompletionMessageParam]], Awaitable[tuple[str, CallRecord]]]
Wait = Callable[[float], Awaitable[None]]


@dataclass
class Tracker:
    """The run's clock and what is in flight: the calls (by session) entered and not
    answered, and every call answered, in order."""

    t0: float
    waiting: dict[int, float] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)

    def now(self) -> float:
        return anyio.current_time() - self.t0


async def play(
    session: SessionPlan, system: str, ask: Ask, wait: Wait, tracker: Tracker | None = None
) -> list[CallRecord]:
    """One session's turns: the context grows by a tool result and the reply each turn."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": system},
        {"role": "user", "content": session.task},
    ]
    calls = []
    for turn in range(len(session.steps) + 1):
        if turn:
            await wait(session.waits[turn - 1])
            messages.append({"role": "user", "content": session.steps[turn - 1]})
        if tracker is not None:
            tracker.waiting[session.index] = tracker.now()
        reply, record = await ask(messages)
        record.session, record.turn = session.index, turn
        if tracker is not None:
            record.end_s = tracker.now()
            record.start_s = tracker.waiting.pop(session.index)
            tracker.calls.append(record)
        calls.append(record)
        messages.append({"role": "assistant", "content": reply})
    return calls


def usage_of(reply: Any) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of a chat completion."""
    usage = reply.usage
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    return int(usage.prompt_tokens), int(cached), int(usage.completion_tokens)


# -- the schedule ---------------------------------------------------------------------------

RunJob = Callable[[SessionPlan, Tracker], Awaitable[JobRecord]]
Snapshot = Callable[[], list[dict[str, float]]]


async def drive(
    shape: Shape,
    workload: Workload,
    run_job: RunJob,
    snapshot: Snapshot | None,
    at_end: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The agents: each runs its first session at its stagger; in a closed loop
    (``shape.loop_s``), then one new session after another until the window closes,
    when the engines' counters are read (``snapshot``), ``at_end`` is called and every
    agent is cancelled."""
    jobs: list[JobRecord] = []
    tracker = Tracker(anyio.current_time())
    loop = shape.loop_s > 0

    async def agent() -> None:
        s = workload.next()
        await anyio.sleep_until(tracker.t0 + s.start_s)
        while True:
            jobs.append(await run_job(s, tracker))
            if not loop:
                return
            s = workload.next()

    out: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        for _ in range(shape.sessions):
            tg.start_soon(agent)
        if loop:
            await anyio.sleep_until(tracker.t0 + shape.warmup_s)
            if snapshot is not None:
                out["engine_before"] = await anyio.to_thread.run_sync(snapshot)
            await anyio.sleep_until(tracker.t0 + shape.warmup_s + shape.loop_s)
            if snapshot is not None:
                out["engine_after"] = await anyio.to_thread.run_sync(snapshot)
            out["waiting_at_end"] = {
                s: tracker.now() - since for s, since in tracker.waiting.items()
            }
            out["window"] = (shape.warmup_s, tracker.now())
            if at_end is not None:
                at_end()
            tg.cancel_scope.cancel()
    makespan = tracker.now()
    if not loop:
        out["window"] = (0.0, makespan)
        out["waiting_at_end"] = {}
    return {"jobs": jobs, "calls": tracker.calls, "makespan_s": makespan, **out}


# -- the clients ----------------------------------------------------------------------------


def _body(shape: Shape) -> dict[str, Any]:
    # Random weights: greedy decoding and ignore_eos give every run the same replies.
    return {"max_tokens": shape.max_tokens, "temperature": 0.0, "extra_body": {"ignore_eos": True}}


def runtime_options(client: str) -> dict[str, Any] | None:
    """``Runtime`` keyword arguments of an ``agentrt[:key=value,...]`` client (None:
    ``plain``); a clear error for any other name."""
    name, _, options = client.partition(":")
    if name == "plain" and not options:
        return None
    if name != "agentrt":
        raise ValueError(f"unknown client {client!r}: plain, agentrt or agentrt:OPTIONS")
    out: dict[str, Any] = {}
    for part in filter(None, options.split(",")):
        key, _, value = part.partition("=")
        if key == "load_control" and value in ("on", "off"):
            out["load_control"] = value == "on"
        elif key == "max_hold_s":
            try:
                out["load_control"] = agentrt.LoadControl(max_hold_s=float(value))
            except ValueError as exc:
                raise ValueError(f"client {client!r}: {exc}") from None
        else:
            raise ValueError(
                f"client {client!r}: unknown option {part!r} (load_control=on|off, max_hold_s=S)"
            )
    return out


async def run_plain(
    urls: Sequence[str], model: str, shape: Shape, snapshot: Snapshot | None = None
) -> dict[str, Any]:
    """One ``openai.AsyncOpenAI`` per replica, round robin over them (``agentrt bench``'s
    ``plain``)."""
    workload = Workload(shape)
    body = _body(shape)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as http:
        clients = plain_clients(urls, http)
        turn = itertools.cycle(range(len(urls)))

        async def ask(messages: list[ChatCompletionMessageParam]) -> tuple[str, CallRecord]:
            i = next(turn)
            started = anyio.current_time()
            reply = await clients[i].chat.completions.create(
                model=model,
                messages=messages,
                **body,
            )
            prompt, cached, completion = usage_of(reply)
            record = CallRecord(
                -1, -1, i, prompt, cached, completion, anyio.current_time() - started
            )
            return reply.choices[0].message.content or "", record

        async def run_job(s: SessionPlan, tracker: Tracker) -> JobRecord:
            started = tracker.now()
            calls = await play(s, workload.system, ask, anyio.sleep, tracker)
            end = tracker.now()
            return JobRecord(s.index, end - started, calls, end)

        return await drive(shape, workload, run_job, snapshot)


async def run_agentrt(
    urls: Sequence[str],
    model: str,
    shape: Shape,
    snapshot: Snapshot | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``agentrt.Runtime(urls, **options)`` (its defaults: no options); a job with one
    session per agent, its tool waits in ``session.tool`` blocks."""
    workload = Workload(shape)
    body = _body(shape)
    moves: Counter[str] = Counter()

    def hook(event: Event) -> None:  # observes only: routing is the defaults'
        if isinstance(event, SessionMoved):
            moves[event.reason] += 1

    loads: list[list[dict[str, Any]]] = []
    gates: list[list[list[Any]]] = []
    async with agentrt.Runtime(list(urls), hooks=[hook], **(options or {})) as rt:

        async def run_job(s: SessionPlan, tracker: Tracker) -> JobRecord:
            started = tracker.now()
            async with rt.job(f"agent-{s.index}") as job, job.session("agent") as session:

                async def ask(messages: list[ChatCompletionMessageParam]) -> tuple[str, CallRecord]:
                    began = anyio.current_time()
                    reply = await session.chat(model=model, messages=messages, **body)
                    prompt, cached, completion = usage_of(reply)
                    record = CallRecord(
                        -1, -1, -1, prompt, cached, completion, anyio.current_time() - began
                    )
                    return reply.choices[0].message.content or "", record

                async def wait(seconds: float) -> None:
                    async with session.tool("tool"):
                        await anyio.sleep(seconds)

                calls = await play(s, workload.system, ask, wait, tracker)
            end = tracker.now()
            return JobRecord(s.index, end - started, calls, end)

        timeline: list[dict[str, Any]] = []
        t0 = anyio.current_time()

        def gate_view() -> list[list[Any]]:
            # The capacity load control fills on each replica, and whence: the engine's
            # figure while this process is alone there, else the learned share
            # (``WorkingSet.gate_capacity``; no public accessor).
            out: list[list[Any]] = []
            for e in rt._core.endpoints:
                shadow = e.working_set
                alone = shadow.capacity is not None and shadow.shared_at is None
                out.append([shadow.gate_capacity, shadow.source if not alone else "engine"])
            return out

        async def watch() -> None:
            for n in itertools.count():
                loads.append([_load(e) for e in rt.endpoint_loads()])
                gates.append(gate_view())
                if n % 10 == 0:  # every 5 s: what load control saw and did
                    gate = rt.load_statistics()
                    timeline.append(
                        {
                            "t": round(anyio.current_time() - t0, 1),
                            "kv_capacity": [round(x["kv_capacity"] or 0) for x in loads[-1]],
                            "kv_demand": [round(x["kv_demand"] or 0) for x in loads[-1]],
                            "gate_capacity": [round(c or 0) for c, _ in gates[-1]],
                            "held_now": None if gate is None else gate.held_now,
                        }
                    )
                await anyio.sleep(0.5)

        stats: list[Any] = []

        async with anyio.create_task_group() as outer:
            outer.start_soon(watch)
            result = await drive(
                shape, workload, run_job, snapshot, lambda: stats.append(rt.load_statistics())
            )
            outer.cancel_scope.cancel()
        final = [_load(e) for e in rt.endpoint_loads()]
        gates.append(gate_view())
        load_stats = stats[-1] if stats else rt.load_statistics()
        # Which replica served each call, and how long load control held it, from the
        # jobs' reports (in the session's order; a job cancelled at the window's end may
        # have none).
        by_job = {r.name: r for r in rt.reports()}
        for record in result["calls"]:
            report = by_job.get(f"agent-{record.session}")
            if report is None:
                continue
            served = sorted(report.call_reports, key=lambda c: c.turn)
            if record.turn < len(served):
                record.replica = _index(urls, served[record.turn].endpoint)
                record.held_s = served[record.turn].held_s
        moved_calls = sum(r.session_moves for r in by_job.values())
    peak_demand = [
        max((snap[i]["kv_demand"] or 0.0) for snap in loads) if loads else None
        for i in range(len(urls))
    ]
    # What placement assumed of each replica's KV, each change in the order seen.
    seen: list[list[list[Any]]] = [[] for _ in urls]
    for snap_ in [*loads, final]:
        for i, load in enumerate(snap_):
            now = [load["kv_capacity"], load["kv_capacity_source"]]
            if now[0] is not None and (not seen[i] or seen[i][-1] != now):
                seen[i].append(now)
    gate_seen: list[list[list[Any]]] = [[] for _ in urls]
    for snap__ in gates:
        for i, now_ in enumerate(snap__):
            if now_[0] is not None and (not gate_seen[i] or gate_seen[i][-1] != now_):
                gate_seen[i].append(now_)
    return {
        **result,
        "kv_capacity_seen": seen,
        "gate_capacity_seen": gate_seen,
        "moves": dict(moves),
        "moved_calls": moved_calls,
        "endpoint_loads": final,
        "peak_kv_demand": peak_demand,
        "load_control": None if load_stats is None else asdict(load_stats),
        "timeline": timeline,
    }


def _load(e: Any) -> dict[str, Any]:
    return {
        "kv_capacity": e.kv_capacity,
        "kv_capacity_source": e.kv_capacity_source,
        "kv_demand": e.kv_demand,
        "sessions": e.sessions,
    }


def _index(urls: Sequence[str], url: str | None) -> int:
    for i, u in enumerate(urls):
        if url is not None and url.rstrip("/").startswith(u.rstrip("/")):
            return i
    return -1


# -- one run ------------------------------------------------------------------------------


def _by_session(calls: Iterable[CallRecord]) -> dict[int, list[CallRecord]]:
    out: dict[int, list[CallRecord]] = {}
    for c in calls:
        out.setdefault(c.session, []).append(c)
    for v in out.values():
        v.sort(key=lambda c: c.turn)
    return out


def tokens(
    calls: Iterable[CallRecord], counted: Callable[[CallRecord], bool] = lambda c: True
) -> dict[str, int]:
    """Prompt, cached, uncached and re-prefilled tokens over the calls (those
    ``counted``). A call's re-prefill is its uncached tokens beyond what the turn added to
    the session's context (its prompt minus the previous call's prompt and reply):
    context that was sent before and had to be prefilled again."""
    prompt = cached = again = 0
    for session in _by_session(calls).values():
        previous = 0
        for c in session:
            if counted(c):
                prompt += c.prompt
                cached += c.cached
                added = max(0, c.prompt - previous)
                again += max(0, c.prompt - c.cached - added)
            previous = c.prompt + c.completion
    return {
        "prompt": prompt,
        "cached": cached,
        "uncached": prompt - cached,
        "reprefilled": again,
    }


def evictions(
    calls: Iterable[CallRecord], counted: Callable[[CallRecord], bool] = lambda c: True
) -> dict[str, int]:
    """Turns that came back to a replica holding the session's earlier context and found
    less of it cached than the session left there (less one block, vLLM caches whole
    blocks, and a reply's tokens may split differently when sent back: two blocks of
    slack): evictions of a session that came back, and the tokens they lost."""
    n = lost = 0
    for session in _by_session(calls).values():
        left: dict[int, int] = {}  # replica -> context the session left there
        for c in session:
            there = left.get(c.replica, 0)
            if counted(c) and c.cached + 2 * BLOCK_TOKENS < there:
                n += 1
                lost += there - BLOCK_TOKENS - c.cached
            left[c.replica] = c.prompt + c.completion
    return {"calls": n, "tokens": lost}


def worst_waits(
    calls: Iterable[CallRecord], waiting: dict[int, float], counted: Callable[[CallRecord], bool]
) -> dict[int, float]:
    """Each session's worst wait: its longest call (from entering the client to the
    reply) among those counted, or the wait so far of a call still waiting at the end."""
    out: dict[int, float] = {}
    for c in calls:
        if counted(c):
            out[c.session] = max(out.get(c.session, 0.0), c.latency_s)
    for s, waited in waiting.items():
        out[s] = max(out.get(s, 0.0), waited)
    return out


def peak_in_flight(calls: Iterable[CallRecord], replicas: int) -> list[int]:
    """Per replica, the most calls in flight there at once (from the end of a call's hold,
    if any, to its reply): 1 means its sessions ran one at a time."""
    out = []
    for i in range(replicas):
        edges = sorted(
            edge
            for c in calls
            if c.replica == i
            for edge in ((c.start_s + c.held_s, 1), (c.end_s, -1))
        )
        live = peak = 0
        for _, step in edges:  # at a tie the reply (-1) counts first
            live += step
            peak = max(peak, live)
        out.append(peak)
    return out


def summarize_run(client: str, result: dict[str, Any], before: Any, after: Any) -> dict[str, Any]:
    lo, hi = (float(x) for x in result["window"])
    window = hi - lo

    def inside(x: CallRecord | JobRecord) -> bool:
        return lo <= x.end_s <= hi

    jobs: list[JobRecord] = [j for j in result["jobs"] if inside(j)]
    calls: list[CallRecord] = result["calls"]
    counted = [c for c in calls if inside(c)]
    jct = [j.jct_s for j in jobs]
    engine = {
        key.removeprefix("vllm:").removesuffix("_total"): [
            a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before, strict=True)
        ]
        for key in ENGINE_COUNTERS
    }
    queries = sum(engine["prefix_cache_queries"])
    waits = worst_waits(calls, result["waiting_at_end"], inside)
    worst = list(waits.values())
    out: dict[str, Any] = {
        "client": client,
        "jobs": len(jobs),
        "calls": len(counted),
        "window_s": window,
        "jobs_per_s": len(jobs) / window if window > 0 else math.nan,
        "turns_per_s": len(counted) / window if window > 0 else math.nan,
        "calls_per_replica": [sum(c.replica == i for c in counted) for i in range(len(before))],
        "peak_in_flight": peak_in_flight(counted, len(before)),
        "jct_mean": statistics.fmean(jct) if jct else math.nan,
        "jct_p50": quantile(sorted(jct), 0.5),
        "jct_p90": quantile(sorted(jct), 0.9),
        "makespan_s": result["makespan_s"],
        "call_latency_mean": statistics.fmean(c.latency_s for c in counted),
        "worst_wait": {
            "sessions": len(worst),
            "p50": quantile(sorted(worst), 0.5),
            "p90": quantile(sorted(worst), 0.9),
            "max": max(worst, default=math.nan),
            "still_waiting_at_end": len(result["waiting_at_end"]),
        },
        "held_s_in_window": sum(c.held_s for c in counted),
        "tokens": tokens(calls, inside),
        "evicted": evictions(calls, inside),
        "engine": engine,
        "engine_hit_rate": sum(engine["prefix_cache_hits"]) / queries if queries else math.nan,
    }
    t = out["tokens"]
    out["cached_share"] = t["cached"] / t["prompt"] if t["prompt"] else math.nan
    out["uncached_per_turn"] = t["uncached"] / len(counted) if counted else math.nan
    for key in (
        "moves",
        "moved_calls",
        "kv_capacity_seen",
        "gate_capacity_seen",
        "endpoint_loads",
        "peak_kv_demand",
        "load_control",
        "timeline",
    ):
        if key in result:
            out[key] = result[key]
    out["jct_s"] = {
        str(j.session): round(j.jct_s, 4) for j in sorted(jobs, key=lambda j: j.session)
    }
    out["calls_detail"] = [asdict(c) for c in sorted(calls, key=lambda c: (c.session, c.turn))]
    return out


def run_one(
    client: str, replicas: Sequence[ReplicaServer], shape: Shape, reset: bool = True
) -> dict[str, Any]:
    """One client's run on emptied prefix caches, with the engines' counters around it
    (around the measured window, in a closed loop)."""
    options = runtime_options(client)
    if reset:
        for r in replicas:
            r.reset_prefix_cache()
    urls = [r.base_url for r in replicas]
    model = replicas[0].model

    def snapshot() -> list[dict[str, float]]:
        return [r.metrics() for r in replicas]

    def go() -> Awaitable[dict[str, Any]]:
        if options is None:
            return run_plain(urls, model, shape, snapshot)
        return run_agentrt(urls, model, shape, snapshot, options)

    before = snapshot()
    load = os.getloadavg()[0]
    result = anyio.run(go)
    after = snapshot()
    out = summarize_run(
        client, result, result.get("engine_before", before), result.get("engine_after", after)
    )
    out["load_avg"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    return out


# -- report ---------------------------------------------------------------------------------


def _row(n: int, r: dict[str, Any]) -> str:
    t = r["tokens"]
    moves = ",".join(f"{k}={v}" for k, v in sorted(r.get("moves", {}).items())) or "-"
    lc = r.get("load_control")
    held = f"{lc['holds']}/{lc['forced']}/{lc['longest_s']:.0f}" if lc else "-"
    return (
        f"{n:3d} {r['client'][:24]:24} {r['jobs_per_s']:6.3f} {r['turns_per_s']:6.2f} "
        f"{r['jct_mean']:7.2f} {r['jct_p90']:7.2f} {r['worst_wait']['p90']:6.2f} "
        f"{r['worst_wait']['max']:6.1f} {t['prompt']:8d} {t['uncached']:8d} "
        f"{t['reprefilled']:8d} {r['evicted']['calls']:4d} {r['engine_hit_rate']:6.1%} "
        f"{held:>11} {moves:>12}  {r['load_avg'][0]:.1f}-{r['load_avg'][1]:.1f}"
    )


HEADER = (
    f"{'run':>3} {'client':24} {'jobs/s':>6} {'turn/s':>6} {'JCT':>7} {'p90':>7} "
    f"{'wait90':>6} {'waitmx':>6} {'prompt':>8} {'uncached':>8} {'reprefil':>8} {'evic':>4} "
    f"{'hits':>6} {'hold/frc/mx':>11} {'moves':>12}  load avg"
)
RATIO_KEYS = (
    "jobs_per_s",
    "turns_per_s",
    "jct_mean",
    "jct_p50",
    "jct_p90",
    "uncached",
    "reprefilled",
)


def _value(r: dict[str, Any], key: str) -> float:
    return float(r["tokens"][key] if key in r["tokens"] else r[key])


def order(clients: Sequence[str], rounds: int) -> list[str]:
    """The clients' runs in alternating order: as given, reversed, as given, ..."""
    return [c for n in range(rounds) for c in (clients if n % 2 == 0 else clients[::-1])]


def ratios(runs: Sequence[dict[str, Any]], clients: Sequence[str]) -> list[dict[str, Any]]:
    """Per round (each client once, runs in alternating order), ``agentrt``'s figures over
    each other client's."""
    out = []
    k = len(clients)
    for n in range(0, len(runs) - k + 1, k):
        group = {r["client"]: r for r in runs[n : n + k]}
        ours = group.get("agentrt")
        if ours is None:
            continue
        for other, r in group.items():
            if other == "agentrt":
                continue
            out.append(
                {
                    "runs": [n + 1 + i for i in range(k)],
                    "over": other,
                    **{
                        key: _value(ours, key) / _value(r, key) if _value(r, key) else math.nan
                        for key in RATIO_KEYS
                    },
                }
            )
    return out


def add_args(parser: argparse.ArgumentParser) -> None:
    d = Shape()
    parser.add_argument("--sessions", type=int, default=d.sessions, help="agents")
    parser.add_argument("--turns", type=int, default=d.turns)
    parser.add_argument("--system-words", type=int, default=d.system_words)
    parser.add_argument("--task-words", type=int, default=d.task_words)
    parser.add_argument("--step-words", type=int, default=d.step_words)
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens)
    parser.add_argument("--tool-s", type=float, nargs=2, default=d.tool_s, metavar=("MIN", "MAX"))
    parser.add_argument("--stagger-s", type=float, default=d.stagger_s)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--loop",
        type=float,
        default=0.0,
        metavar="S",
        help="a closed loop measured for S seconds (after --warmup): each agent starts a new "
        "session when its job ends (default: one session per agent)",
    )
    parser.add_argument("--warmup", type=float, default=0.0, metavar="S")
    parser.add_argument(
        "--clients",
        nargs="+",
        default=list(CLIENTS),
        help="plain, agentrt, agentrt:load_control=off, agentrt:max_hold_s=S "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--blocks", type=int, default=160, help="KV blocks of 128 tokens per replica"
    )
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=2, help="runs per client (alternating)")
    add_run_args(parser, out="real_kv_small.json")


def main(args: argparse.Namespace) -> int:
    d = Shape()
    for client in args.clients:
        try:
            runtime_options(client)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    if args.loop < 0 or args.warmup < 0:
        raise SystemExit("--loop and --warmup must be >= 0")
    if args.sessions < 1 or args.turns < 1:
        raise SystemExit("--sessions and --turns must be >= 1")
    shape = replace(
        d,
        sessions=args.sessions,
        turns=args.turns,
        system_words=args.system_words,
        task_words=args.task_words,
        step_words=args.step_words,
        max_tokens=args.max_tokens,
        tool_s=tuple(args.tool_s),
        stagger_s=args.stagger_s,
        seed=args.seed,
        loop_s=args.loop,
        warmup_s=args.warmup,
    )
    if find_engine() is None:
        print(SETUP_MESSAGE, file=sys.stderr)
        return 2
    specs = [
        ReplicaSpec(
            name=f"kv-{i}",
            num_gpu_blocks=args.blocks,
            max_model_len=args.max_model_len,
            kv_cache_space_gib=1,
            cpu_bind=str(i % 2),
            dev_mode=True,  # POST /reset_prefix_cache before each run
        )
        for i in range(2)
    ]
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    with launch(specs) as replicas:
        print(f"replicas up in {max(r.startup_s or 0.0 for r in replicas):.0f} s", flush=True)
        print(HEADER, flush=True)
        for client in order(args.clients, args.runs):
            r = run_one(client, replicas, shape)
            runs.append(r)
            print(_row(len(runs), r), flush=True)
    wall = time.monotonic() - started
    compared = ratios(runs, args.clients)
    print("\nagentrt / other per round:")
    for p in compared:
        print(
            f"  runs {p['runs']} over {p['over']}: "
            + "  ".join(f"{k} {p[k]:.2f}x" for k in RATIO_KEYS),
            flush=True,
        )
    first, last = context_tokens(shape, 1.72)
    doc = {
        "config": {
            "shape": asdict(shape),
            "clients": args.clients,
            "blocks": args.blocks,
            "kv_tokens_per_replica": args.blocks * BLOCK_TOKENS,
            "context_tokens_first_last": [round(first), round(last)],
            "max_model_len": args.max_model_len,
            "runs": args.runs,
        },
        "engine": "2 x vLLM CPU (tiny-llama, random weights), one core each, dev mode",
        "cpus": os.cpu_count(),
        "ratios": compared,
        "runs": runs,
        "wall_s": wall,
    }
    write_result(args.out, doc, __doc__)
    print(f"({wall:.0f} s)")
    return 0
