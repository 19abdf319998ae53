"""``agentrt demo``: a plain client and agentrt on the same coding jobs, side by side.

The jobs come from the ``coding`` workload (drawn from a fit to 710 Claude Code sessions,
``agentrt/bench/_coding.py``); they run on the embedded engine's simulated H100-class
replicas in virtual time, once through a plain openai client and once through agentrt with
its defaults. The demo prints a table that fits 80 columns, two or three sentences saying
what was compared and what the numbers mean, and writes one summary figure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ..report._tables import TextTable, wrap
from ._coding import FIT
from ._runner import BenchConfig, BenchResult, ClientResult

__all__ = [
    "DEMO_CLIENTS",
    "DEMO_GPU_BLOCKS",
    "DEMO_JOBS",
    "DEMO_RATE",
    "DEMO_REPLICAS",
    "Headline",
    "cache_bars",
    "demo_config",
    "demo_figure",
    "demo_table",
    "headline",
    "run_demo",
    "summary",
]

DEMO_JOBS: Final = 32
"""Coding jobs (sessions), arriving at :data:`DEMO_RATE`."""
DEMO_RATE: Final = 0.2
"""Poisson arrivals, jobs per (simulated) second: the plain client keeps the replicas
about 70% busy and its calls queue behind prefills."""
DEMO_REPLICAS: Final = 8
DEMO_GPU_BLOCKS: Final = 16_384
"""KV blocks per replica (16 tokens each: 262k tokens, about 60% of the h100-8b preset's):
the cluster's cache holds every session's context once, not once per replica."""
DEMO_CLIENTS: Final = ("plain", "agentrt:session")
"""The plain client and agentrt's defaults (session routing, FCFS, no client-side limit)."""
LABELS: Final = {"plain": "plain", "agentrt:session": "agentrt"}


def demo_config(seed: int = 0, *, jobs: int = DEMO_JOBS) -> BenchConfig:
    """The demo's benchmark: ``agentrt bench --workload coding --jobs 32 --rate 0.2
    --replicas 8 --gpu-blocks 16384 --client plain --client agentrt:session
    --no-stretch`` runs the same."""
    return BenchConfig(
        workload="coding",
        jobs=jobs,
        rate=DEMO_RATE,
        seed=seed,
        clients=DEMO_CLIENTS,
        replicas=DEMO_REPLICAS,
        preset="h100-8b",
        gpu_blocks=DEMO_GPU_BLOCKS,
        stretch=False,
    )


class Headline:
    """agentrt's ratios to the plain client, from one run."""

    def __init__(self, plain: ClientResult, agentrt: ClientResult) -> None:
        self.plain = plain
        self.agentrt = agentrt
        self.jct_mean = _ratio(agentrt.jct["mean"], plain.jct["mean"])
        self.jct_p50 = _ratio(agentrt.jct["p50"], plain.jct["p50"])
        self.jct_p90 = _ratio(agentrt.jct["p90"], plain.jct["p90"])
        self.ttft_p50 = _ratio(_ttft(agentrt), _ttft(plain))
        self.cache_hit = _ratio(cache_share(agentrt), cache_share(plain))


def _journal_totals(c: ClientResult) -> tuple[int, int, int] | None:
    """Prompt tokens, cached prompt tokens and session moves summed over the client's
    journal (None without one)."""
    if c.journal is None or not Path(c.journal).is_file():
        return None
    from ..telemetry import read_journal

    reports = read_journal(c.journal)
    return (
        sum(r.prompt_tokens for r in reports),
        sum(r.cached_tokens for r in reports),
        sum(r.session_moves for r in reports),
    )


def cache_share(c: ClientResult) -> float | None:
    """Prompt tokens served from the prefix cache over all prompt tokens, as the calls'
    usage reports them: the figure ``agentrt report`` shows for the client's journal.
    Without a journal, the engines' counters (which count a prompt looked up again after
    a preemption once more, so they can differ in the last digits)."""
    totals = _journal_totals(c)
    if totals is None or not totals[0]:
        return c.prefix_cache_hit_rate
    return totals[1] / totals[0]


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def _ttft(c: ClientResult) -> float | None:
    return c.ttft["p50"] if c.ttft else None


def headline(result: BenchResult) -> Headline:
    """The ratios of the run's second client (agentrt) to its first (plain)."""
    return Headline(result.clients[0], result.clients[1])


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else fmt.format(value)


def demo_table(result: BenchResult, title: str) -> TextTable:
    """One row per client and agentrt's ratio to plain (under 1x: faster; over 1x for
    cache hit: more of the prompt served from cache). Fits 80 columns."""
    rows = []
    for c in result.clients:
        rows.append(
            (
                LABELS.get(c.client, c.client),
                _num(c.jct["mean"], "{:.0f}"),
                _num(c.jct["p50"], "{:.0f}"),
                _num(c.jct["p90"], "{:.0f}"),
                _num(_ttft(c), "{:.3f}"),
                _num(cache_share(c), "{:.0%}"),
            )
        )
    h = headline(result)
    rows.append(
        (
            "agentrt / plain",
            _x(h.jct_mean),
            _x(h.jct_p50),
            _x(h.jct_p90),
            _x(h.ttft_p50),
            _x(h.cache_hit),
        )
    )
    return TextTable(
        title,
        ("client", "JCT mean", "JCT p50", "JCT p90", "TTFT p50", "cache hit"),
        tuple(rows),
        "JCT: job completion time (s); TTFT: time to first token of streamed calls (s); "
        "cache hit: prompt tokens served from the prefix cache, as agentrt report counts "
        "them in the journals (the engines' counters with --no-journal). Lower JCT and "
        "TTFT are better, a higher cache hit is better.",
    )


def summary(result: BenchResult) -> list[str]:
    """Three plain sentences: what the plain client is, what agentrt changed, and the
    ratios measured in this run with the reason for them."""
    h = headline(result)
    p, a = h.plain, h.agentrt
    replicas = result.config.get("replicas", DEMO_REPLICAS)
    p_hit = cache_share(p) or 0.0
    a_hit = cache_share(a) or 0.0
    totals = _journal_totals(a)
    moves = "" if totals is None else f": {totals[2]} of its {result.calls} calls in this run"

    def secs(value: float | None, fmt: str) -> str:
        return _num(value, fmt) + " s"

    return [
        "plain is a bare openai client per replica, as most agent code uses today: each "
        f"call goes out at once, round-robin over the {replicas} replicas, so a session's "
        "turns land on different replicas. agentrt, with its defaults (session routing, "
        "no client-side limit), sends a session's turns to the replica that holds its "
        "context, and moves a session to another only when that replica is overloaded or "
        f"has likely evicted it{moves}.",
        f"Measured in this run: agentrt's median job completion time is {_x(h.jct_p50)} "
        f"plain's ({secs(a.jct['p50'], '{:.0f}')} against {secs(p.jct['p50'], '{:.0f}')}), "
        f"its median time to first token {_x(h.ttft_p50)} ({secs(_ttft(a), '{:.3f}')} "
        f"against {secs(_ttft(p), '{:.3f}')}), and its prefix-cache hit rate "
        f"{_x(h.cache_hit)} ({a_hit:.0%} against {p_hit:.0%}).",
        "Why: with plain, every replica's KV cache has to hold every session's long "
        f"context, so it evicts them and {1 - p_hit:.0%} of prompt tokens are computed "
        "again; those prefills make every other call queue. agentrt keeps each context on "
        f"one replica, so a turn computes little more than its new tokens ({1 - a_hit:.0%} "
        "of prompt tokens).",
    ]


def cache_bars(result: BenchResult) -> list[float]:
    """Each client's cache-hit bar in the figure, in percent: :func:`cache_share`, the
    one source of the table's column and the panel's title ratio too (the bars read the
    engines' counters, which differ in the last digits, and disagreed with both)."""
    return [100 * (cache_share(c) or 0.0) for c in result.clients]


def demo_figure(result: BenchResult, path: Path) -> Path:
    """One PNG: the JCT CDF of each client (left) beside the prefix-cache hit rates and
    the median TTFT (right). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..report._plots import plain_text
    from ._output import client_styles

    with plain_text():
        h = headline(result)
        fig, (ax, ax_hit, ax_ttft) = plt.subplots(
            1, 3, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2.6, 1, 1]}
        )
        styles = client_styles([c.client for c in result.clients])
        for c, (color, style) in zip(result.clients, styles, strict=True):
            jcts = sorted(r["jct_s"] for r in c.job_rows if r["status"] == "ok")
            if not jcts:
                continue
            ys = [(k + 1) / len(jcts) for k in range(len(jcts))]
            label = f"{LABELS.get(c.client, c.client)} (median {c.jct['p50']:.0f} s)"
            ax.step(jcts, ys, where="post", color=color, linestyle=style, lw=2.2, label=label)
            ax.plot([c.jct["p50"]], [0.5], "o", color=color)
        ax.axhline(0.5, color="black", lw=0.5, alpha=0.4)
        ax.set_xlabel("job completion time (s)")
        ax.set_ylabel("fraction of jobs done")
        ax.set_title(f"Jobs finish sooner: median JCT {_x(h.jct_p50)}")
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")

        names = [LABELS.get(c.client, c.client) for c in result.clients]
        colors = [color for color, _ in styles]
        hits = cache_bars(result)
        bars = ax_hit.bar(names, hits, color=colors)
        ax_hit.bar_label(bars, labels=[f"{v:.0f}%" for v in hits])
        ax_hit.set_ylim(0, 110)
        ax_hit.set_ylabel("prompt tokens from cache (%)")
        ax_hit.set_title(f"Cache hits {_x(h.cache_hit)}")

        ttfts = [_ttft(c) or 0.0 for c in result.clients]
        bars = ax_ttft.bar(names, ttfts, color=colors)
        ax_ttft.bar_label(bars, labels=[f"{v:.2f} s" for v in ttfts])
        ax_ttft.set_ylim(0, max([*ttfts, 0.001]) * 1.2)
        ax_ttft.set_ylabel("median time to first token (s)")
        ax_ttft.set_title(f"TTFT {_x(h.ttft_p50)}")

        jobs = result.clients[0].jobs
        replicas = result.config.get("replicas", DEMO_REPLICAS)
        fig.suptitle(
            f"agentrt demo: {jobs} coding jobs on {replicas} simulated replicas, "
            "plain client vs agentrt's defaults"
        )
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return path


def _echo_wrapped(text: str, width: int, echo: Callable[[str], None]) -> None:
    for line in wrap(text, width):
        echo(line)


def run_demo(
    out: Path,
    *,
    plots: bool = True,
    journal: bool = True,
    seed: int = 0,
    started: float | None = None,
    _jobs: int = DEMO_JOBS,
) -> int:
    """Run the demo, print the table, the summary and where the files are; 0 when done.

    ``out`` receives ``results.json``, the journals (``journal-<client>.jsonl``, unless
    ``journal`` is false) and ``demo.png`` (unless ``plots`` is false or matplotlib is
    missing). ``started``: the ``time.perf_counter()`` the command started at (its wall
    time is counted from there: imports included). ``_jobs``: fewer jobs, for tests."""
    from ._output import run_with_progress, show_tables, terminal_width

    wall0 = started if started is not None else time.perf_counter()
    cfg = demo_config(seed, jobs=_jobs)
    if journal:
        cfg.journal_dir = out
    width = min(terminal_width(), 100)
    _echo_wrapped(
        f"agentrt demo: {_jobs} agentic coding jobs (drawn from a fit to 710 Claude Code "
        "sessions: long shared system prompts, contexts growing turn by turn, tool waits, "
        f"sub-agents in {FIT.subagent_share:.0%} of sessions), arriving at random, "
        f"{DEMO_RATE:g} a second, on "
        f"{DEMO_REPLICAS} simulated H100-class replicas in virtual time; first through a "
        "plain client, then through agentrt.",
        width,
        print,
    )
    result = run_with_progress(cfg, LABELS)
    print()
    show_tables([demo_table(result, f"{result.calls} LLM calls per client, identical for both")])
    print()
    for sentence in summary(result):
        _echo_wrapped(sentence, width, print)
    print()
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / "results.json")
    print(f"results: {out / 'results.json'}")
    journals = [c.journal for c in result.clients if c.journal]
    if journals:
        print("journals (one report per job; agentrt report --compare A B compares them):")
        for path in journals:
            print(f"  {path}")
    if plots:
        try:
            figure = demo_figure(result, out / "demo.png")
        except ImportError:
            print("figure: install the report extra for it: pip install 'agentjct[report]'")
        else:
            print(f"figure: {figure}")
    wall, cpu = time.perf_counter() - wall0, time.process_time()
    virtual = max(c.makespan_s for c in result.clients)
    _echo_wrapped(
        f"Done in {wall:.1f} s wall, {cpu:.1f} s of CPU (start-up included; the replays "
        f"alone {result.wall_s:.1f} s: wall_s in results.json), for {virtual / 60:.0f} min "
        "of simulated time per client. More: agentrt bench --help",
        width,
        print,
    )
    return 0
