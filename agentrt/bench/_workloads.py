"""Workloads: synthetic agent jobs and the Claude Code trace replay, with arrivals.

Every generator is seeded, so a workload is the same list of :class:`JobPlan` each time.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from ._coding import DEMO_SCALE, CodingScale, coding_job
from ._plan import BLOCK_TOKENS, Call, Fanout, JobPlan, SessionPlan, Step

__all__ = [
    "WORKLOADS",
    "Arrivals",
    "TraceOptions",
    "chat_job",
    "claude_code_jobs",
    "coding_scale",
    "fanout_job",
    "make_workload",
    "react_job",
    "react_longtail_job",
    "too_few_traces",
]

SYSTEM_BLOCKS: Final = 24
"""A synthetic agent's system prompt and tool definitions: 24 blocks (1536 tokens)."""


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


class _Conversation:
    """A growing prompt: shared system blocks, then the session's own blocks."""

    def __init__(self, namespace: str, shared: int, stream: bool = False) -> None:
        self.namespace = namespace
        self.shared = shared
        self.own = 0
        self.stream = stream

    def call(self, rng_wait: float, tool: str | None, add_tokens: int, out: int) -> Call:
        self.own += max(1, round(add_tokens / BLOCK_TOKENS))
        blocks = tuple(range(self.shared)) + tuple(range(100_000, 100_000 + self.own))
        call = Call(
            wait_s=rng_wait,
            tool=tool,
            blocks=blocks,
            namespace=self.namespace,
            shared_blocks=self.shared,
            tail_tokens=0,
            output_tokens=out,
            stream=self.stream,
        )
        self.own += max(1, round(out / BLOCK_TOKENS))  # the reply joins the conversation
        return call


def react_job(rng: random.Random, name: str, *, tool_wait_s: float = 2.0) -> SessionPlan:
    """A tool loop: 4-12 turns; each turn's tool result grows the prompt."""
    conv = _Conversation(name, SYSTEM_BLOCKS)
    steps: list[Step] = [conv.call(0.0, None, rng.randint(200, 600), rng.randint(60, 250))]
    for _ in range(rng.randint(3, 11)):
        wait = _lognormal(rng, tool_wait_s, 1.0)
        steps.append(
            conv.call(
                wait,
                rng.choice(("bash", "grep", "read")),
                rng.randint(150, 900),
                rng.randint(40, 300),
            )
        )
    return SessionPlan("agent", tuple(steps))


LONGTAIL_TOOLS: Final = (
    # name, share of calls, median wait (s), sigma of log(wait), result tokens (low, high)
    ("read_file", 0.35, 0.5, 0.5, (600, 4000)),
    ("grep", 0.25, 1.5, 0.6, (200, 1500)),
    ("bash", 0.25, 6.0, 1.0, (200, 2000)),
    ("run_tests", 0.10, 45.0, 0.8, (500, 3000)),
    ("web_research", 0.05, 150.0, 0.7, (1000, 4000)),
)
"""``react-longtail``'s tools: each with its own lognormal wait (most take seconds, a
few minutes) and result size."""

LONGTAIL_REPEAT: Final = 0.5
"""Chance that a ``react-longtail`` turn calls the same tool as the last turn."""


def react_longtail_job(rng: random.Random, name: str, *, tool_wait_s: float = 2.0) -> SessionPlan:
    """A long tool loop (6-20 turns) over :data:`LONGTAIL_TOOLS`: heavy-tailed waits that
    depend on the tool, large tool results (a session's prompt reaches ~10-40k tokens).
    A turn repeats the last tool with probability :data:`LONGTAIL_REPEAT`, else draws
    one by share. ``tool_wait_s`` scales every median (2.0: the table's values)."""
    scale = tool_wait_s / 2.0
    conv = _Conversation(name, SYSTEM_BLOCKS)
    steps: list[Step] = [conv.call(0.0, None, rng.randint(300, 1500), rng.randint(60, 300))]
    shares = [t[1] for t in LONGTAIL_TOOLS]
    tool = rng.choices(LONGTAIL_TOOLS, shares)[0]
    for _ in range(rng.randint(5, 19)):
        if rng.random() >= LONGTAIL_REPEAT:
            tool = rng.choices(LONGTAIL_TOOLS, shares)[0]
        tool_name, _, median, sigma, (low, high) = tool
        wait = _lognormal(rng, median * scale, sigma)
        steps.append(conv.call(wait, tool_name, rng.randint(low, high), rng.randint(50, 400)))
    return SessionPlan("agent", tuple(steps))


def fanout_job(rng: random.Random, name: str, *, tool_wait_s: float = 2.0) -> SessionPlan:
    """A planner, k concurrent sub-agents (3-5 turns each), and a reducing turn."""
    planner = _Conversation(f"{name}.planner", SYSTEM_BLOCKS)
    steps: list[Step] = [planner.call(0.0, None, rng.randint(300, 800), rng.randint(150, 400))]
    subs = []
    for k in range(rng.randint(3, 6)):
        conv = _Conversation(f"{name}.sub{k}", SYSTEM_BLOCKS)
        sub_steps: list[Step] = [conv.call(0.0, None, rng.randint(200, 500), rng.randint(60, 200))]
        for _ in range(rng.randint(2, 4)):
            sub_steps.append(
                conv.call(
                    _lognormal(rng, tool_wait_s, 1.0),
                    "search",
                    rng.randint(200, 1200),
                    rng.randint(40, 200),
                )
            )
        subs.append(SessionPlan(f"sub{k}", tuple(sub_steps)))
    steps.append(Fanout(tuple(subs)))
    steps.append(planner.call(0.0, None, 64 * len(subs) * 4, rng.randint(200, 500)))
    return SessionPlan("planner", tuple(steps))


def chat_job(rng: random.Random, name: str, *, think_s: float = 15.0) -> SessionPlan:
    """A person chatting: 3-8 turns with human think times, a short system prompt; the
    replies are streamed (a person reads them as they come)."""
    conv = _Conversation(name, 4, stream=True)
    steps: list[Step] = [conv.call(0.0, None, rng.randint(20, 200), rng.randint(100, 400))]
    for _ in range(rng.randint(2, 7)):
        steps.append(
            conv.call(
                _lognormal(rng, think_s, 0.7), None, rng.randint(20, 200), rng.randint(100, 400)
            )
        )
    return SessionPlan("chat", tuple(steps))


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How the Claude Code traces are replayed."""

    directory: Path | None = None
    """Folder of ``trace_NNNN.json.gz`` (None: see :meth:`folder`)."""
    limit: int | None = None
    """Replay only the first ``limit`` traces."""
    token_scale: float = 1.0
    """Multiply prompt and output sizes (small engines)."""
    time_scale: float = 1.0
    """Multiply think and tool times."""
    max_wait_s: float | None = None
    """Cap one think or tool wait (a person away for an hour is not a tool wait)."""
    max_context: int | None = None
    """Skip the traces with a call longer than this many tokens (prompt and output,
    scaled), as a model's context window would refuse it; ``limit`` then counts the
    traces kept, in file order."""

    def folder(self) -> Path:
        """The folder the traces are read from: :attr:`directory`; else
        ``$AGENTRT_TRACES``; else ``shared/traces/claude-code`` beside a checkout; else
        the full set ``agentrt traces fetch`` wrote; else the package's sample."""
        return self.directory or default_trace_dir()


def default_trace_dir() -> Path:
    """Where the Claude Code traces are read from unless a folder is given:
    ``$AGENTRT_TRACES``; else ``shared/traces/claude-code`` beside a checkout; else the
    full set ``agentrt traces fetch`` wrote (:func:`~agentrt.bench._traces.user_trace_dir`);
    else the package's sample (:func:`~agentrt.bench._traces.sample_dir`)."""
    import os

    from ._traces import sample_dir, user_trace_dir

    env = os.environ.get("AGENTRT_TRACES")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" / "traces" / "claude-code"
        if candidate.is_dir():
            return candidate
    fetched = user_trace_dir()
    if any(fetched.glob("trace_*.json.gz")):
        return fetched
    return sample_dir()


_HASH_KEY: Final = b'"hash_ids":'
_LIST: Final = "\x00blocks "
"""What a block list the loader left unparsed reads as: this, then its index."""


def _read_trace(path: Path) -> tuple[Any, list[bytes]]:
    """A trace file's JSON, its block lists (``hash_ids``: most of the file, as a request's
    list holds its whole context) left as raw bytes, for :class:`_KeptBlocks` to read only the
    blocks a replay keeps. Each list so left reads as ``_LIST + index`` into the raw lists
    returned; a list with anything but scalars in it is parsed as JSON, as is the rest."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    lists: list[bytes] = []
    parts: list[bytes] = []
    pos = 0
    while (i := raw.find(_HASH_KEY, pos)) >= 0:
        start = i + len(_HASH_KEY)
        while raw[start : start + 1] in (b" ", b"\n", b"\r", b"\t"):
            start += 1
        end = raw.find(b"]", start)
        body = raw[start + 1 : end]
        if (
            end < 0
            or raw[start : start + 1] != b"["
            or raw[i - 1 : i] == b"\\"
            or b"[" in body
            or b'"' in body
            or b"{" in body
        ):
            parts.append(raw[pos:start])  # JSON reads it
            pos = start
            continue
        parts.append(raw[pos:start])
        parts.append(json.dumps(f"{_LIST}{len(lists)}").encode())
        lists.append(body)
        pos = end + 1
    parts.append(raw[pos:])
    return json.loads(b"".join(parts)), lists


class _KeptBlocks:
    """Reads the blocks a replay keeps of each request's block list, in a session's order.

    A request's context is mostly the previous request's plus what the turn added, so when
    a list starts with the bytes of the blocks kept from the previous one, those blocks are
    reused and only the rest is read: the cost follows what each turn adds, not the
    context's length. The result is what ``tuple(int(h) for h in hashes[:keep])`` gives on
    the parsed list (a list that is not all integers is parsed as JSON, then so)."""

    __slots__ = ("_cut", "_kept", "_lists", "_prefix")

    def __init__(self, lists: Sequence[bytes]) -> None:
        self._lists = lists
        self._prefix = b""
        """The bytes of the previous list's kept blocks (up to, not with, its comma)."""
        self._kept: tuple[int, ...] = ()
        self._cut = 0

    def kept(self, value: Any, scale: float) -> tuple[int, ...]:
        """The first ``round(len * scale)`` blocks (at least one) of a request's list."""
        if not (isinstance(value, str) and value.startswith(_LIST)):
            return self._parsed(value or [], scale)
        body = self._lists[int(value[len(_LIST) :])]
        n = body.count(b",") + 1 if body.strip() else 0
        if not n:
            return ()
        keep = min(n, max(1, round(n * scale)))
        try:
            return self._read(body, keep)
        except ValueError:  # not all integers
            self._prefix, self._kept = b"", ()
            return self._parsed(json.loads(b"[" + body + b"]"), scale)

    def _read(self, body: bytes, keep: int) -> tuple[int, ...]:
        prev, cut = self._kept, len(self._prefix)
        if (
            prev
            and keep >= len(prev)
            and body.startswith(self._prefix)
            and body[cut : cut + 1] in (b",", b"")
        ):
            more = keep - len(prev)
            if not more:
                return prev
            pieces = body[cut + 1 :].split(b",", more)[:more]
            blocks = prev + tuple(map(int, pieces))
            self._prefix = body[: cut + 1 + sum(map(len, pieces)) + more - 1]
        else:
            pieces = body.split(b",", keep)[:keep]
            blocks = tuple(map(int, pieces))
            self._prefix = body[: sum(map(len, pieces)) + keep - 1]
        self._kept = blocks
        return blocks

    @staticmethod
    def _parsed(hashes: Sequence[Any], scale: float) -> tuple[int, ...]:
        keep = min(len(hashes), max(1, round(len(hashes) * scale))) if hashes else 0
        return tuple(int(h) for h in hashes[:keep])


def _trace_session(
    requests: Sequence[dict[str, Any]],
    name: str,
    namespace: str,
    shared_blocks: int,
    opts: TraceOptions,
    lists: Sequence[bytes] = (),
) -> SessionPlan:
    steps: list[Step] = []
    group: list[SessionPlan] = []
    prev_stop = ""
    reader = _KeptBlocks(lists)
    for i, req in enumerate(requests):
        if req.get("type") == "subagent":
            sub_name = str(req.get("agent_id") or f"sub{i}")
            group.append(
                _trace_session(
                    req.get("requests") or [], sub_name, namespace, shared_blocks, opts, lists
                )
            )
            continue
        if group:
            steps.append(Fanout(tuple(group)))
            group = []
        blocks = reader.kept(req.get("hash_ids"), opts.token_scale)
        keep = len(blocks)
        tokens_in = int(req.get("in") or 0)
        tokens_out = max(1, int(req.get("out") or 1))
        scale = opts.token_scale
        tail = max(0, round(tokens_in * scale) - keep * BLOCK_TOKENS)
        tail = min(tail, BLOCK_TOKENS - 1)
        wait = float(req.get("think_time") or 0.0) * opts.time_scale
        if opts.max_wait_s is not None:
            wait = min(wait, opts.max_wait_s)
        steps.append(
            Call(
                wait_s=wait,
                tool="tool" if prev_stop == "tool_use" else None,
                blocks=blocks,
                namespace=namespace,
                shared_blocks=min(shared_blocks, keep),
                tail_tokens=tail,
                output_tokens=max(1, round(tokens_out * scale)),
                stream=req.get("type") == "s",
            )
        )
        prev_stop = str(req.get("stop") or "")
    if group:
        steps.append(Fanout(tuple(group)))
    return SessionPlan(name, tuple(steps))


def claude_code_jobs(opts: TraceOptions) -> list[SessionPlan]:
    """One root session per trace file, in file order."""
    directory = opts.folder()
    files = sorted(directory.glob("trace_*.json.gz"))
    if not files:
        from ._traces import missing_traces_message

        raise FileNotFoundError(missing_traces_message(directory))
    if opts.max_context is not None and opts.max_context < 1:
        raise ValueError(f"max_context must be >= 1 token or None, got {opts.max_context!r}")
    if opts.limit is not None and opts.max_context is None:
        files = files[: opts.limit]
    out: list[SessionPlan] = []
    for path in files:
        if opts.limit is not None and len(out) >= opts.limit:
            break
        data, lists = _read_trace(path)
        # The tool definitions and system prompt head every prompt of every session: their
        # blocks are shared across traces (hash ids are otherwise local to a file).
        prefix_tokens = int(data.get("tool_tokens") or 0) + int(data.get("system_tokens") or 0)
        shared = round(prefix_tokens * opts.token_scale) // BLOCK_TOKENS
        session = _trace_session(data.get("requests") or [], "main", path.stem, shared, opts, lists)
        if opts.max_context is not None and _longest_call(session) > opts.max_context:
            continue
        out.append(session)
    return out


def too_few_traces(asked: int, found: int, opts: TraceOptions, what: str = "jobs") -> str:
    """The one-line error for ``asked`` Claude Code replays where the traces give only
    ``found``: the folder, why (``max_context``), and what to do."""
    from ._traces import sample_dir

    directory = opts.folder()
    sample = directory.resolve() == sample_dir().resolve()
    where = f"the package's sample ({directory})" if sample else str(directory)
    if opts.max_context is not None:
        why = f"only {found} traces of {where} fit max_context (--max-context)"
    else:
        why = f"{where} holds only {found} Claude Code traces"
    fetch = "; 'agentrt traces fetch' gets the full set of 710" if sample else ""
    return f"{asked} {what} asked for, but {why}: ask for {found} or fewer{fetch}"


def _longest_call(session: SessionPlan) -> int:
    """The tokens (prompt and output) of the session tree's longest call."""
    longest = 0
    for step in session.steps:
        if isinstance(step, Call):
            longest = max(longest, step.prompt_tokens + step.output_tokens)
        else:
            for sub in step.sessions:
                longest = max(longest, _longest_call(sub))
    return longest


@dataclass(frozen=True, slots=True)
class Arrivals:
    """When jobs arrive: a Poisson process of ``rate`` jobs/s, or all at once (rate None)."""

    rate: float | None = None
    seed: int = 0

    def times(self, n: int) -> Iterator[float]:
        """The arrival times of ``n`` jobs, in seconds from the first (which is 0);
        the same for the same seed."""
        rng = random.Random(self.seed ^ 0x5EED)
        t = 0.0
        for _ in range(n):
            yield t
            if self.rate:
                t += rng.expovariate(self.rate)


def coding_scale(opts: TraceOptions) -> CodingScale:
    """The ``coding`` workload's scale: :data:`DEMO_SCALE` with ``opts``' token and time
    scales multiplied in, and ``opts.max_wait_s`` (where set) as the cap on one wait."""
    return replace(
        DEMO_SCALE,
        token_scale=DEMO_SCALE.token_scale * opts.token_scale,
        time_scale=DEMO_SCALE.time_scale * opts.time_scale,
        max_wait_s=opts.max_wait_s if opts.max_wait_s is not None else DEMO_SCALE.max_wait_s,
    )


Generator = Callable[[random.Random, str], SessionPlan]
WORKLOADS: Final[dict[str, Generator | None]] = {
    "coding": coding_job,
    "react": react_job,
    "react-longtail": react_longtail_job,
    "fanout": fanout_job,
    "chat": chat_job,
    "mixed": None,
    "claude-code": None,
    "mixed-cc": None,
}
"""The workloads by name, with the generator of one job's root session; ``None``
for those :func:`make_workload` builds otherwise (mixes and trace replays)."""


def make_workload(
    name: str,
    jobs: int,
    arrivals: Arrivals,
    *,
    seed: int = 0,
    traces: TraceOptions | None = None,
    tool_wait_s: float = 2.0,
    long_share: float = 0.2,
) -> list[JobPlan]:
    """``jobs`` job plans of workload ``name`` (``coding``, ``react``, ``react-longtail``,
    ``fanout``, ``chat``, ``mixed``, ``claude-code``, ``mixed-cc``) with their arrival
    times.

    ``coding`` draws coding sessions from the fit to the Claude Code traces at
    :data:`~agentrt.bench._coding.DEMO_SCALE`; ``traces``' scales multiply it and its
    ``max_wait_s`` replaces the cap (:func:`coding_scale`).

    ``mixed-cc`` mixes short ReAct jobs with long Claude Code replays: each job is a
    Claude Code trace (``round(jobs * long_share)`` of them at seeded random positions,
    the traces in file order, replayed with ``traces``' options), the others ReAct jobs."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    if jobs < 1:
        raise ValueError("a workload needs at least one job")
    if not 0.0 <= long_share <= 1.0:
        raise ValueError(f"long_share must be between 0 and 1, got {long_share!r}")
    rng = random.Random(seed)
    roots: list[tuple[str, SessionPlan]] = []
    if name == "mixed-cc":
        n_long = round(jobs * long_share)
        chosen = set(rng.sample(range(jobs), n_long))
        kinds = ["claude-code" if i in chosen else "react" for i in range(jobs)]
        long_opts = replace(traces or TraceOptions(), limit=n_long)
        found = claude_code_jobs(long_opts) if n_long else []
        if len(found) < n_long:
            raise ValueError(too_few_traces(n_long, len(found), long_opts, "Claude Code jobs"))
        long_roots = iter(found)
        for i, kind in enumerate(kinds):
            if kind == "react":
                roots.append((kind, react_job(rng, f"react-{i}", tool_wait_s=tool_wait_s)))
            else:
                roots.append((kind, next(long_roots)))
    elif name == "coding":
        scale = coding_scale(traces or TraceOptions())
        roots = [("coding", coding_job(rng, f"coding-{i}", scale=scale)) for i in range(jobs)]
    elif name == "claude-code":
        opts = traces or TraceOptions()
        if opts.limit is None or opts.limit > jobs:
            opts = replace(opts, limit=jobs)
        roots = [("claude-code", r) for r in claude_code_jobs(opts)]
    else:
        kinds = ["react", "fanout", "chat"] if name == "mixed" else [name]
        weights = [0.5, 0.3, 0.2] if name == "mixed" else [1.0]
        for i in range(jobs):
            kind = rng.choices(kinds, weights)[0]
            gen = WORKLOADS[kind]
            assert gen is not None
            if kind == "chat":
                roots.append((kind, gen(rng, f"{kind}-{i}")))
            else:
                roots.append((kind, gen(rng, f"{kind}-{i}", tool_wait_s=tool_wait_s)))  # type: ignore[call-arg]
    return [
        JobPlan(name=f"{kind}-{i}", kind=kind, arrival_s=t, root=root)
        for i, ((kind, root), t) in enumerate(zip(roots, arrivals.times(len(roots)), strict=True))
    ]
