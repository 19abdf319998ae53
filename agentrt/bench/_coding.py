"""The ``coding`` workload: agentic coding jobs drawn from a fit to the Claude Code traces.

Each job is one coding session: a long system prompt shared by every job of the agent,
a context that grows call by call (tool results and replies), now and then a rewrite
(compaction), tool waits between most calls and a person's think time between some, and
in a few sessions sub-agents that run concurrently. Every size, count and wait is drawn
from :data:`FIT`, the quantiles of the 710 Claude Code sessions in ``shared/traces``
(``python scripts/fit_coding_workload.py`` computes it; docs/benchmarks/alternatives.md
shows the numbers), so the workload needs no trace files: it runs from a plain install.

:class:`CodingScale` shrinks it for the embedded engine: tokens and times are multiplied,
long waits (a person away for an hour) and very long sessions capped.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, fields
from typing import Final

from ._plan import BLOCK_TOKENS, Call, Fanout, SessionPlan, Step

__all__ = ["DEMO_SCALE", "FIT", "QS", "CodingFit", "CodingScale", "Quantiles", "coding_job"]

QS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
"""The quantiles each fitted distribution keeps."""


@dataclass(frozen=True, slots=True)
class Quantiles:
    """A distribution kept as its values at the quantiles :data:`QS`."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.values) != len(QS) or list(self.values) != sorted(self.values):
            raise ValueError(f"need {len(QS)} non-decreasing values, got {self.values!r}")

    @property
    def median(self) -> float:
        return self.values[QS.index(0.5)]

    def sample(self, rng: random.Random) -> float:
        """One draw by inverse transform: log-linear between the kept quantiles, clamped
        to the first and last (so nothing beyond the 1st and 99th percentiles)."""
        u = min(max(rng.random(), QS[0]), QS[-1])
        i = min(max(bisect.bisect_right(QS, u) - 1, 0), len(QS) - 2)
        t = (u - QS[i]) / (QS[i + 1] - QS[i])
        lo, hi = math.log1p(self.values[i]), math.log1p(self.values[i + 1])
        value = math.expm1(lo + t * (hi - lo))
        return min(max(value, self.values[i]), self.values[i + 1])


@dataclass(frozen=True, slots=True)
class CodingFit:
    """What the generator draws from (tokens and seconds as in the traces, unscaled)."""

    sessions: int
    """Sessions the fit was computed from."""
    prefix_tokens: int
    """Tool definitions + system prompt at the head of every main-agent prompt (median)."""
    first_tokens: Quantiles
    """A session's first prompt beyond the prefix."""
    growth_tokens: Quantiles
    """Growth of the prompt from one call to the next (the reply and what the tool
    returned), over the calls that keep the previous prompt as their prefix."""
    rewrite_share: float
    """Share of calls that keep under 90% of the previous prompt (compaction)."""
    rewrite_ratio: Quantiles
    """Their prompt over the previous one."""
    calls: Quantiles
    """Calls per session (main agent)."""
    output_tokens: Quantiles
    stream_share: float
    """Share of calls that stream their reply."""
    tool_share: float
    """Share of the waits between calls that are tool waits (the reply called a tool); the
    others are think time (a person reading and typing)."""
    tool_wait_s: Quantiles
    think_s: Quantiles
    subagent_share: float
    """Share of sessions that spawn sub-agents."""
    spawns: Quantiles
    """Spawns per session that spawns any."""
    siblings: Quantiles
    """Sub-agents per spawn (concurrent; the parent resumes after them)."""
    sub_prefix_tokens: int
    sub_first_tokens: Quantiles
    sub_growth_tokens: Quantiles
    sub_calls: Quantiles
    sub_output_tokens: Quantiles
    sub_wait_s: Quantiles

    def literal(self) -> str:
        """This fit as the Python expression :data:`FIT` holds."""
        lines = ["CodingFit("]
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Quantiles):
                nums = ", ".join(repr(int(v) if v == int(v) else v) for v in value.values)
                lines.append(f"    {f.name}=Quantiles(({nums})),")
            else:
                lines.append(f"    {f.name}={value!r},")
        lines.append(")")
        return "\n".join(lines)


# fmt: off
FIT: Final = CodingFit(
    sessions=710,
    prefix_tokens=14900,
    first_tokens=Quantiles((246, 519, 1220, 3650, 7160, 89400, 246000, 366000, 701000)),
    growth_tokens=Quantiles((109, 154, 191, 329, 652, 1540, 3490, 6030, 15500)),
    rewrite_share=0.0188,
    rewrite_ratio=Quantiles((0.135, 0.176, 0.223, 0.623, 1, 1.02, 1.15, 1.6, 4.78)),
    calls=Quantiles((3, 4, 7, 18, 45, 94, 155, 232, 330)),
    output_tokens=Quantiles((58, 89, 105, 137, 216, 429, 899, 1540, 3660)),
    stream_share=0.174,
    tool_share=0.861,
    tool_wait_s=Quantiles((2, 3, 4, 5, 9, 19, 71, 154, 612)),
    think_s=Quantiles((0, 5, 14, 37, 127, 469, 1890, 3230, 15000)),
    subagent_share=0.0239,
    spawns=Quantiles((1, 1, 1, 1, 2, 2, 5, 8, 8)),
    siblings=Quantiles((1, 1, 1, 1, 1, 2, 3, 3, 3)),
    sub_prefix_tokens=8680,
    sub_first_tokens=Quantiles((167, 214, 485, 717, 1720, 3270, 3320, 3750, 9540)),
    sub_growth_tokens=Quantiles((190, 345, 489, 926, 2530, 5750, 13300, 22300, 63300)),
    sub_calls=Quantiles((2, 4, 5, 7, 11, 13, 17, 22, 24)),
    sub_output_tokens=Quantiles((83, 111, 131, 176, 235, 306, 529, 2980, 4760)),
    sub_wait_s=Quantiles((1, 2, 2, 3, 4, 6, 29, 47, 75)),
)
"""The fit to the 710 Claude Code sessions of ``shared/traces`` (Apache-2.0, from
callanjfox/kv-cache-tester): ``python scripts/fit_coding_workload.py`` prints it."""
# fmt: on


@dataclass(frozen=True, slots=True)
class CodingScale:
    """How the fitted sessions are shrunk for a run."""

    token_scale: float = 1.0
    """Multiplies prompt and output sizes."""
    time_scale: float = 1.0
    """Multiplies tool waits and think times."""
    max_wait_s: float | None = None
    """Caps one wait (after scaling)."""
    max_calls: int | None = None
    """Caps the calls of one session (main agent or sub-agent)."""

    def __post_init__(self) -> None:
        if not (self.token_scale > 0 and self.time_scale > 0):
            raise ValueError("token_scale and time_scale must be > 0")
        if self.max_wait_s is not None and not self.max_wait_s >= 0:
            raise ValueError("max_wait_s must be >= 0")
        if self.max_calls is not None and self.max_calls < 1:
            raise ValueError("max_calls must be >= 1")


DEMO_SCALE: Final = CodingScale(token_scale=0.4, time_scale=0.1, max_wait_s=5.0, max_calls=60)
"""The ``coding`` workload's own scale (the demo's): ``agentrt bench``'s ``--token-scale``,
``--time-scale`` and ``--max-wait`` multiply or replace it."""

SUB_PREFIX_BASE: Final = 1_000_000
"""Sub-agents' shared prefix block ids (the main agent's start at 0)."""
OWN_BASE: Final = 100_000
"""A session's own block ids start here; a rewrite starts a fresh range."""
REWRITE_STRIDE: Final = 10_000_000


class _Session:
    """One session's growing prompt: the shared prefix, then its own blocks."""

    def __init__(self, namespace: str, prefix: tuple[int, ...], own_tokens: float) -> None:
        self.namespace = namespace
        self.prefix = prefix
        self.own_tokens = own_tokens
        self.epoch = 0

    def call(self, wait: float, tool: str | None, out: int, stream: bool) -> Call:
        base = OWN_BASE + self.epoch * REWRITE_STRIDE
        own = max(1, round(self.own_tokens / BLOCK_TOKENS))
        return Call(
            wait_s=wait,
            tool=tool,
            blocks=self.prefix + tuple(range(base, base + own)),
            namespace=self.namespace,
            shared_blocks=len(self.prefix),
            tail_tokens=0,
            output_tokens=out,
            stream=stream,
        )


def _count(q: Quantiles, rng: random.Random, cap: int | None) -> int:
    n = max(1, round(q.sample(rng)))
    return min(n, cap) if cap is not None else n


def _wait(seconds: float, scale: CodingScale) -> float:
    wait = seconds * scale.time_scale
    return min(wait, scale.max_wait_s) if scale.max_wait_s is not None else wait


def _subagent(
    rng: random.Random, name: str, namespace: str, fit: CodingFit, scale: CodingScale
) -> SessionPlan:
    ts = scale.token_scale
    prefix = tuple(
        range(SUB_PREFIX_BASE, SUB_PREFIX_BASE + round(fit.sub_prefix_tokens * ts) // BLOCK_TOKENS)
    )
    s = _Session(namespace, prefix, fit.sub_first_tokens.sample(rng) * ts)
    steps: list[Step] = []
    for k in range(_count(fit.sub_calls, rng, scale.max_calls)):
        wait = _wait(fit.sub_wait_s.sample(rng), scale) if k else 0.0
        out = max(1, round(fit.sub_output_tokens.sample(rng) * ts))
        steps.append(s.call(wait, "tool" if k else None, out, rng.random() < fit.stream_share))
        s.own_tokens += fit.sub_growth_tokens.sample(rng) * ts
    return SessionPlan(name, tuple(steps))


def coding_job(
    rng: random.Random,
    name: str,
    *,
    fit: CodingFit = FIT,
    scale: CodingScale = DEMO_SCALE,
) -> SessionPlan:
    """One coding session drawn from ``fit``, shrunk by ``scale``: its calls, the waits
    before them (a tool wait with probability ``fit.tool_share``, else think time), and
    for ``fit.subagent_share`` of the sessions, spawns of concurrent sub-agents at random
    points (the session resumes after them)."""
    ts = scale.token_scale
    prefix = tuple(range(round(fit.prefix_tokens * ts) // BLOCK_TOKENS))
    s = _Session(name, prefix, fit.first_tokens.sample(rng) * ts)
    n_calls = _count(fit.calls, rng, scale.max_calls)
    spawn_at: dict[int, int] = {}
    if rng.random() < fit.subagent_share:
        for _ in range(_count(fit.spawns, rng, None)):
            at = rng.randrange(n_calls)
            spawn_at[at] = spawn_at.get(at, 0) + _count(fit.siblings, rng, None)
    steps: list[Step] = []
    n_subs = 0
    for k in range(n_calls):
        if k in spawn_at:
            subs = []
            for _ in range(spawn_at[k]):
                subs.append(_subagent(rng, f"sub{n_subs}", f"{name}.sub{n_subs}", fit, scale))
                n_subs += 1
            steps.append(Fanout(tuple(subs)))
        tool: str | None = None
        wait = 0.0
        if k and k not in spawn_at:  # a spawn is the tool the previous reply called
            if rng.random() < fit.tool_share:
                tool = "tool"
                wait = _wait(fit.tool_wait_s.sample(rng), scale)
            else:
                wait = _wait(fit.think_s.sample(rng), scale)
        if k and rng.random() < fit.rewrite_share:
            s.own_tokens *= fit.rewrite_ratio.sample(rng)
            s.epoch += 1
        out = max(1, round(fit.output_tokens.sample(rng) * ts))
        steps.append(s.call(wait, tool, out, rng.random() < fit.stream_share))
        s.own_tokens += fit.growth_tokens.sample(rng) * ts
    return SessionPlan("main", tuple(steps))
