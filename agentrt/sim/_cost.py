"""The step cost model: how long one engine iteration takes, and how to fit it to measurements.

One iteration (a *step*) runs a batch made of prefill chunks and decode sequences. Its
duration is linear in five features::

    step_s = step_s                                  (fixed: weights read, launch, scheduler)
           + prefill_token_s          * P            (P: prefill tokens in the step)
           + decode_seq_s             * D            (D: decode sequences in the step)
           + decode_context_token_s   * A_dec        (A_dec: KV tokens read by the decodes)
           + prefill_pair_s           * A_pre        (A_pre: query-key pairs of the prefills)

where a decode sequence with ``c`` tokens already in its KV cache reads ``c + 1`` context
tokens, and a prefill chunk of ``n`` tokens after ``p`` cached ones attends
``n * p + n * (n + 1) / 2`` query-key pairs. docs/sim.md gives the sources of the presets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields

__all__ = ["CostModel", "StepSample", "calibrate"]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Linear model of one engine step's duration, in seconds (see the module docstring)."""

    step_s: float
    """Fixed cost of every step."""
    prefill_token_s: float
    """Per prefill token (linear layers of the prompt tokens)."""
    decode_seq_s: float
    """Per decode sequence in the batch (its token's linear layers, sampling)."""
    decode_context_token_s: float
    """Per KV-cache token a decode sequence reads (memory-bound attention)."""
    prefill_pair_s: float
    """Per query-key pair of a prefill chunk (compute-bound attention)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"CostModel.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"CostModel.{f.name} must be finite and >= 0, got {value!r}")

    def step_seconds(
        self,
        *,
        prefill_tokens: int = 0,
        decode_seqs: int = 0,
        decode_context_tokens: int = 0,
        prefill_pairs: float = 0.0,
    ) -> float:
        """Duration of one step with the given batch shape."""
        return (
            self.step_s
            + self.prefill_token_s * prefill_tokens
            + self.decode_seq_s * decode_seqs
            + self.decode_context_token_s * decode_context_tokens
            + self.prefill_pair_s * prefill_pairs
        )

    def prefill_seconds(
        self, prompt_tokens: int, cached_tokens: int = 0, *, chunk: int = 0
    ) -> float:
        """Time to prefill one prompt alone on an idle engine, in chunks of ``chunk`` tokens
        (0: a single step). Handy for sanity checks of a preset."""
        total = 0.0
        done = cached_tokens
        size = chunk if chunk > 0 else max(prompt_tokens - cached_tokens, 1)
        while done < prompt_tokens:
            n = min(size, prompt_tokens - done)
            total += self.step_seconds(prefill_tokens=n, prefill_pairs=prefill_pairs(n, done))
            done += n
        return total


def prefill_pairs(n: int, cached: int) -> float:
    """Query-key pairs of a causal prefill chunk of ``n`` tokens after ``cached`` tokens."""
    return n * cached + n * (n + 1) / 2


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measurement for :func:`calibrate`: the summed features of ``steps`` engine steps
    and the seconds they took.

    Features add up over steps, so a sample may cover one step (a measured inter-token
    interval) or several (the time to first token of a prompt prefilled in chunks).
    """

    steps: float
    prefill_tokens: float
    decode_seqs: float
    decode_context_tokens: float
    prefill_pairs: float
    seconds: float

    @classmethod
    def prefill(
        cls, prompt_tokens: int, seconds: float, *, cached_tokens: int = 0, chunk: int = 0
    ) -> StepSample:
        """A prompt prefilled alone on an idle engine (e.g. a measured TTFT with
        ``max_tokens=1``), in chunks of ``chunk`` tokens (0: one step)."""
        steps = 0
        pairs = 0.0
        done = cached_tokens
        size = chunk if chunk > 0 else max(prompt_tokens - cached_tokens, 1)
        while done < prompt_tokens:
            n = min(size, prompt_tokens - done)
            pairs += prefill_pairs(n, done)
            done += n
            steps += 1
        return cls(steps, prompt_tokens - cached_tokens, 0, 0, pairs, seconds)

    @classmethod
    def decode(cls, batch: int, context_tokens: float, seconds: float) -> StepSample:
        """One decode step of ``batch`` sequences holding ``context_tokens`` KV tokens in
        all (e.g. a measured inter-token interval while ``batch`` streams decode)."""
        return cls(1, 0, batch, context_tokens + batch, 0, seconds)


def calibrate(samples: Iterable[StepSample]) -> CostModel:
    """Fit a :class:`CostModel` to measurements by non-negative least squares.

    Each sample is weighted by 1/seconds, so the fit minimises relative errors: short decode
    steps count as much as long prefills. Coefficients the samples cannot tell apart (a
    feature that is always 0) come out as 0. At least 2 samples are needed.
    """
    rows: list[list[float]] = []
    ys: list[float] = []
    for s in samples:
        if s.seconds <= 0 or not math.isfinite(s.seconds):
            raise ValueError(f"sample seconds must be finite and > 0, got {s.seconds!r}")
        w = 1.0 / s.seconds
        feats = astuple(s)[:5]
        rows.append([float(x) * w for x in feats])
        ys.append(1.0)
    if len(rows) < 2:
        raise ValueError("calibrate needs at least 2 samples")
    coef = _nnls(rows, ys)
    return CostModel(*coef)


def _nnls(a: Sequence[Sequence[float]], b: Sequence[float]) -> list[float]:
    """Lawson-Hanson non-negative least squares, min |A x - b| with x >= 0 (small n)."""
    m = len(a)
    n = len(a[0])
    scale = [math.sqrt(sum(a[i][j] ** 2 for i in range(m))) for j in range(n)]
    cols = [j for j in range(n) if scale[j] > 0]
    an = [[a[i][j] / scale[j] if scale[j] > 0 else 0.0 for j in range(n)] for i in range(m)]
    x = [0.0] * n
    passive: list[int] = []
    tol = 1e-12

    def gradient(xv: list[float]) -> list[float]:
        r = [b[i] - sum(an[i][j] * xv[j] for j in range(n)) for i in range(m)]
        return [sum(an[i][j] * r[i] for i in range(m)) for j in range(n)]

    for _ in range(3 * n + 10):
        w = gradient(x)
        candidates = [j for j in cols if j not in passive and w[j] > tol]
        if not candidates:
            break
        passive.append(max(candidates, key=lambda j: w[j]))
        while True:
            z = _lstsq_subset(an, b, passive, n)
            if all(z[j] > tol for j in passive):
                x = z
                break
            alpha = (
                min(x[j] / (x[j] - z[j]) for j in passive if z[j] <= tol and x[j] - z[j] > 0)
                if any(z[j] <= tol and x[j] - z[j] > 0 for j in passive)
                else 0.0
            )
            x = [x[j] + alpha * (z[j] - x[j]) for j in range(n)]
            passive = [j for j in passive if x[j] > tol]
            for j in range(n):
                if j not in passive:
                    x[j] = 0.0
            if not passive:
                break
    return [x[j] / scale[j] if scale[j] > 0 else 0.0 for j in range(n)]


def _lstsq_subset(a: list[list[float]], b: Sequence[float], cols: list[int], n: int) -> list[float]:
    """Unconstrained least squares on the given columns (normal equations, pivoting)."""
    k = len(cols)
    ata = [[sum(row[p] * row[q] for row in a) for q in cols] for p in cols]
    atb = [sum(row[p] * bi for row, bi in zip(a, b, strict=True)) for p in cols]
    for i in range(k):
        ata[i][i] += 1e-12
    # Gaussian elimination with partial pivoting.
    mat = [ata[i] + [atb[i]] for i in range(k)]
    for c in range(k):
        piv = max(range(c, k), key=lambda r: abs(mat[r][c]))
        mat[c], mat[piv] = mat[piv], mat[c]
        if abs(mat[c][c]) < 1e-300:
            continue
        for r in range(k):
            if r != c:
                f = mat[r][c] / mat[c][c]
                if f:
                    mat[r] = [vr - f * vc for vr, vc in zip(mat[r], mat[c], strict=True)]
    sol = [mat[i][k] / mat[i][i] if abs(mat[i][i]) >= 1e-300 else 0.0 for i in range(k)]
    out = [0.0] * n
    for idx, j in enumerate(cols):
        out[j] = sol[idx]
    return out
