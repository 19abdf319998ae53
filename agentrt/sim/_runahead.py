"""Multi-step planning: the steps the loop can sleep through at once.

When nothing but an arrival, an abort or a timed event (a pin expiry, a prefetch) can
change the coming steps, the step loop (``_engine``) need not sleep once per step:

- a **decode leap** (:func:`decode_leap`): every running request decodes and nothing
  waiting can be admitted; the steps' durations are in closed form
  (:func:`leap_seconds`), so the loop sleeps through ``k`` of them at once, up to the next
  finish, streamed chunk, KV block it cannot get, or timed event;
- a **prefill run-ahead** (:func:`run_ahead`): prefills run under the same conditions; the
  coming steps are computed as the scheduler would and slept through at once, up to the
  first visible outcome (a finish, a streamed chunk).

This module only plans: it reads the running batch and changes nothing. The loop sleeps,
cuts the sleep short when interrupted (:func:`leap_steps_done` says how many steps of a
leap completed by then) and applies the steps that ran.
"""

from __future__ import annotations

import math
from typing import Final

from ._config import EngineConfig
from ._request import SimRequest

__all__ = ["Step", "decode_leap", "leap_seconds", "leap_steps_done", "run_ahead"]

Step = list[tuple[SimRequest, int]]
"""One step's batch: each scheduled request and the tokens it computes."""

_RUN_AHEAD_STEPS: Final = 256
"""Most prefill steps computed ahead in one go."""


def run_ahead(
    cfg: EngineConfig,
    running: list[SimRequest],
    sched: Step,
    first: float,
    now: float,
    next_event: float | None,
    avail: int,
    pending: bool,
) -> list[tuple[Step, float]]:
    """The steps that follow ``sched`` (lasting ``first``) while prefills run and nothing
    can change: each step's batch and duration, computed as the scheduler would, up to the
    first step with a visible outcome (a finish, a streamed chunk), a step needing more
    than the ``avail`` KV blocks, one that would admit a waiting request (``pending``:
    some wait that only the token budget kept out), one ending after ``next_event``, or
    one with no prefill left (the decode leap takes over)."""
    cost = cfg.cost
    bs = cfg.block_size
    comp = {r: r.num_computed for r in running}
    out = {r: r.num_output for r in running}
    held = {r: r.tree_blocks + r.private for r in running}
    steps = [(sched, first)]
    if _visible(sched, comp, out):
        return steps
    limit = next_event - now if next_event is not None else math.inf
    total = first
    budget0 = cfg.max_num_batched_tokens
    thr = cfg.long_prefill_token_threshold
    while len(steps) < _RUN_AHEAD_STEPS:
        budget = budget0
        step: Step = []
        grow: list[tuple[SimRequest, int]] = []
        n_prefill = n_decode = ctx = need = 0
        pairs = 0.0
        for r in running:
            if budget <= 0:
                break
            c = comp[r]
            t = r.prompt_len + out[r]
            n = t - c
            if n > budget:
                n = budget
            if thr and n > thr:
                n = thr
            nb = -(-(c + n) // bs) - held[r]
            if nb > 0:
                need += nb
                grow.append((r, nb))
            step.append((r, n))
            budget -= n
            if n == 1 and out[r] and c + 1 == t:
                n_decode += 1
                ctx += c + 1
            else:
                n_prefill += n
                pairs += n * c + n * (n + 1) / 2
        if not n_prefill or need > avail:
            break
        if pending and budget > 0 and len(running) < cfg.max_num_seqs:
            break  # the scheduler would admit a waiting request in this step
        d = cost.step_seconds(
            prefill_tokens=n_prefill,
            decode_seqs=n_decode,
            decode_context_tokens=ctx,
            prefill_pairs=pairs,
        )
        if total + d > limit:
            break
        avail -= need
        for r, nb in grow:
            held[r] += nb
        steps.append((step, d))
        total += d
        if _visible(step, comp, out):
            break
    return steps


def _visible(step: Step, comp: dict[SimRequest, int], out: dict[SimRequest, int]) -> bool:
    """Advance the local counters by one step; whether the step ends with something a
    client sees (a finish or a streamed chunk)."""
    seen = False
    for r, n in step:
        c = comp[r] = comp[r] + n
        if c == r.prompt_len + out[r]:
            o = out[r] = out[r] + 1
            if o >= r.max_tokens or (r.stream and (o == 1 or o - r.notified >= r.notify_every)):
                seen = True
    return seen


def decode_leap(
    cfg: EngineConfig,
    running: list[SimRequest],
    now: float,
    first: float,
    slope: float,
    next_event: float | None,
    avail: int,
) -> int:
    """How many decode steps the ``running`` batch (all decoding; its steps lasting
    :func:`leap_seconds` of ``first`` and ``slope``) can run before anything can change:
    up to the next finish, the next streamed chunk, the step whose KV blocks exceed
    ``avail``, or the step ending after ``next_event``."""
    k = min(r.max_tokens - r.num_output for r in running)
    if k <= 1:
        return 1
    for r in running:
        if r.stream:
            k = min(k, max(1, r.notify_every - (r.num_output - r.notified)))
    if k <= 1:
        return 1
    # KV: blocks the later steps need beyond this step's allocation.
    bs = cfg.block_size

    def extra(steps: int) -> int:
        total = 0
        for r in running:
            c = r.num_computed
            total += -(-(c + steps) // bs) - -(-(c + 1) // bs)
        return total

    if extra(k) > avail:
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if extra(mid) <= avail:
                lo = mid
            else:
                hi = mid - 1
        k = lo
    if k > 1 and next_event is not None:
        limit = next_event - now
        while k > 1 and leap_seconds(first, slope, k) > limit:
            k = max(1, min(k - 1, int(limit / first) if first > 0 else 1))
    return k


def leap_seconds(first: float, slope: float, steps: int) -> float:
    """How long the first ``steps`` steps of a decode leap last: each step reads one more
    KV token per request than the one before, ``slope`` seconds more
    (``decode_context_token_s`` times the requests)."""
    return steps * first + slope * steps * (steps - 1) / 2


def leap_steps_done(first: float, slope: float, k: int, elapsed: float) -> int:
    """The steps of a ``k``-step decode leap done when it is cut short ``elapsed``
    seconds after its start, the step in progress included (it completes)."""
    # steps completed by now: the largest s with leap_seconds(s) <= elapsed
    b = slope
    if b > 0:
        a = first - b / 2
        s = int((-a + math.sqrt(a * a + 2 * b * elapsed)) / b) if elapsed > 0 else 0
    else:
        s = int(elapsed / first) if first > 0 else k
    s = max(0, min(s, k))
    while s > 0 and leap_seconds(first, b, s) > elapsed:
        s -= 1
    while s < k and leap_seconds(first, b, s + 1) <= elapsed:
        s += 1
    return min(k, s + 1)
