"""Does each modelled peer place requests where the real router does?

The same small deterministic workload goes, one request at a time (so the history is the
same both ways), through

(a) the real router (vllm-router 0.1.17; sglang-router 0.3.2 where it starts) in front
    of ``agentrt sim serve --replicas N`` (one process, replica ``i`` at
    ``http://127.0.0.1:PORT/replica-i``, the worker URLs the router is given), in wall
    clock time, fresh caches for each policy; and
(b) the modelled gateway (:func:`agentrt.sim.peers.make_policy`) in front of a
    ``Cluster`` of the same preset in virtual time, its replica views bound to the *same*
    worker URLs (the ring and rendezvous hashes depend on the URL string).

The workload: ``--sessions`` sessions of ``--turns`` turns each (a shared system prompt,
growing chat histories with fixed assistant replies, an ``x-session-id`` header), turns
interleaved across sessions, and ``--plain`` requests without a session id in between.
The replica that served a request is read from its reply id (``sim-replica-i-N``: the
simulator's own request id) or, where the router set an ``x-request-id``, from the
replicas' ``vllm:request_success_total`` counters (sequential requests: exactly one
moves).

Reported per policy: the share of requests placed on the same replica, the prefix-cache
hit share of each side (the replicas' ``vllm:prefix_cache_*`` counters) and its gap in
points, the mean session JCT (sum of its calls' latencies) of each side and their ratio,
and every disagreement (request, real replica, modelled replica).

    python -m benchmarks routing peers          # results/peer_agreement.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from agentrt.sim import Cluster
from agentrt.sim.peers import ReplicaView
from agentrt.testing.vllm_cpu import (
    ROUTER_SETUP_MESSAGE,
    RouterSpec,
    engine_dir,
    find_router,
    parse_prometheus,
    start_router,
)

from ._harness import add_run_args, write_result

VLLM_POLICIES = ("round_robin", "consistent_hash", "cache_aware", "sticky_least_loaded")
SGLANG_POLICIES = ("round_robin", "cache_aware")
"""sglang-router's policies compared with the vllm-router model of the same name (the
vllm-router is a fork of SGLang's router: the same tree and thresholds)."""

SYSTEM = (
    "You are a careful coding agent working in a large Python repository. "
    "Read the files you need, run the tests, and make the smallest change that fixes "
    "the problem. Explain what you changed and why in one short paragraph. "
) * 6


NOTES = {
    "sequential": "one request at a time: every router load is 0 at each pick, so the "
    "load terms (cache_aware's imbalance switch, least-loaded ties) are not exercised",
    "vllm:cache_aware": "0.1.17 prepares its prefix key as token ids from the worker's "
    "POST /v1/chat/completions/render (or /v1/completions/render, /tokenize); agentrt sim "
    "serve has none, so the router logs render_unavailable and counts every request as "
    "prefix_routing_decisions_total{outcome=missing_tokens}: it never matched a prefix "
    "here and sent everything to its first worker, as the idle model does. Its tree is "
    "not validated against the binary.",
    "sglang:cache_aware": "compared with the vllm-router cache_aware model; sequential "
    "and idle, both send every request to the first worker, so its text tree is not "
    "validated either",
    "cache_aware (held)": "a stream held open on the first worker, then new and "
    "continued prefixes: both real routers kept every request on the held worker (a new "
    "prefix too, with three workers idle); the model sends a miss to the least loaded. "
    "For vllm-router 0.1.17 the cause is measured (no prefix key without the render "
    "endpoint, missing_tokens, and a fallback that is not least-loaded); for "
    "sglang-router 0.3.2 it is not known (its chat routing text may be empty too). Not "
    "fixed in the model, which follows the router in front of vLLM, where render works.",
    "litellm": "not run: agentrt.sim.peers has no LiteLLM model to agree with, and the "
    "proxy's strategies are random (simple-shuffle: a weighted random pick; "
    "least-busy / usage-based: random among ties)",
    "jct": "real JCT is wall clock through HTTP on a shared 2-core machine; the direct "
    "row (no router) isolates the router hop",
}


@dataclass(frozen=True)
class Request:
    label: str
    session: str | None
    messages: tuple[dict[str, str], ...]
    user: str | None = None
    """The body's OpenAI ``user`` field (a session key for some peers), or None."""

    def body(self, model: str, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": list(self.messages),
            "max_tokens": max_tokens,
        }
        if self.user is not None:
            body["user"] = self.user
        return body

    def headers(self) -> dict[str, str]:
        return {} if self.session is None else {"x-session-id": self.session}


def workload(sessions: int, turns: int, plain: int) -> list[Request]:
    """Two plain requests first (every replica idle and empty: tie-breaks decide), then
    turns interleaved across the sessions, with the other plain requests in between,
    then a session keyed only by the body's OpenAI ``user`` field (no header)."""
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": SYSTEM}] for _ in range(sessions)
    ]
    out: list[Request] = []
    left = list(range(plain))

    def plain_request() -> None:
        n = left.pop(0)
        msgs = (
            {"role": "system", "content": "You answer one question briefly."},
            {"role": "user", "content": f"Question {n}: what is {n} squared? " * 3},
        )
        out.append(Request(f"p{n}", None, msgs))

    for _ in range(min(2, len(left))):
        plain_request()
    for t in range(turns):
        for s in range(sessions):
            hist = histories[s]
            hist.append(
                {
                    "role": "user",
                    "content": f"Session {s}, step {t}: look at module_{s}_{t}.py and "
                    + f"report what function f{t}() returns for input {s * 7 + t}. " * 4,
                }
            )
            out.append(Request(f"s{s}t{t}", f"agent-session-{s}", tuple(dict(m) for m in hist)))
            hist.append(
                {
                    "role": "assistant",
                    "content": f"Checked module_{s}_{t}.py: f{t}() returns {s + t}. " * 3,
                }
            )
        if left:
            plain_request()
    hist = [{"role": "system", "content": "You are a helpful assistant."}]
    for t in range(2):
        hist.append({"role": "user", "content": f"Body-keyed turn {t}: summarise step {t}. " * 3})
        out.append(Request(f"u0t{t}", None, tuple(dict(m) for m in hist), user="user-0"))
        hist.append({"role": "assistant", "content": f"Step {t} summarised. " * 3})
    return out


def held_workload() -> tuple[Request, list[Request]]:
    """For the load terms: a long streamed request held open on one worker while four
    short ones go out (two new prefixes, then a turn continuing each held or earlier
    prefix). With a working prefix tree, the continuation of the held prefix goes to the
    held (busier) worker; without one, to an idle worker."""
    a = [{"role": "system", "content": "Held history A. " + SYSTEM}]
    b = [{"role": "system", "content": "Another history B: " + SYSTEM[::-1]}]
    c = [{"role": "system", "content": "A third history C; " + SYSTEM.upper()}]
    more = {"role": "user", "content": "and one more question about it " * 4}
    hold = Request("hold", None, (*a, {"role": "user", "content": "go on at length"}))
    return hold, [
        Request("B", None, (*b, {"role": "user", "content": "first"})),
        Request("A+", None, (*a, {"role": "user", "content": "go on at length"}, more)),
        Request("B+", None, (*b, {"role": "user", "content": "first"}, more)),
        Request("C", None, (*c, {"role": "user", "content": "first"})),
    ]


# -- the real side -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout: float = 5.0) -> str:
    with _OPENER.open(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[dict[str, Any], str]:
    req = urllib.request.Request(url, body, {"content-type": "application/json", **headers})
    with _OPENER.open(req, timeout=60.0) as resp:
        return json.loads(resp.read()), str(resp.headers.get("x-request-id") or "")


@contextlib.contextmanager
def sim_serve(replicas: int, preset: str, log: Path) -> Iterator[list[str]]:
    """``agentrt sim serve`` in its own process; yields the replicas' root URLs."""
    port = _free_port()
    cmd = [sys.executable, "-m", "agentrt", "sim", "serve", "--replicas", str(replicas)]
    cmd += ["--port", str(port), "--preset", preset]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/health", timeout=1.0)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"agentrt sim serve did not start; see {log}") from None
                time.sleep(0.1)
        yield [f"http://127.0.0.1:{port}/replica-{i}" for i in range(replicas)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Side:
    """One side's run: the replica per request, latencies, cache counters."""

    placed: list[int] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    hits: float = 0.0
    queries: float = 0.0
    how: str = ""
    order: list[int] = field(default_factory=list)
    """The replicas in the router's own worker order (its registry's, not the command
    line's: round robin walks it, ties go to its first)."""


def _counters(roots: Sequence[str]) -> list[dict[str, float]]:
    return [parse_prometheus(_get(r + "/metrics")) for r in roots]


def _replica_of(rid: str, body: dict[str, Any]) -> int | None:
    for value in (rid, str(body.get("id", ""))):
        marker = "sim-replica-"
        at = value.find(marker)
        if at >= 0:
            digits = value[at + len(marker) :].split("-", 1)[0]
            if digits.isdigit():
                return int(digits)
    return None


def worker_order(front: str, roots: Sequence[str]) -> list[int]:
    """The router's worker order: vllm-router's ``GET /list_workers``, sglang-router's
    ``GET /workers``; the command line's if neither answers."""
    for path in ("/list_workers", "/workers"):
        try:
            doc = json.loads(_get(front + path))
        except (OSError, ValueError):
            continue
        urls = doc.get("urls") or [w.get("url") for w in doc.get("workers", [])]
        if sorted(urls) == sorted(roots):
            return [list(roots).index(u) for u in urls]
    return list(range(len(roots)))


def run_real(
    front: str | None,
    roots: Sequence[str],
    reqs: Sequence[Request],
    args: Any,
    hold: Request | None = None,
) -> Side:
    """``reqs`` one at a time through the router at ``front`` (its root URL); None:
    straight to the replicas in turn (no router: its hop's share of the latency).
    ``hold``: a streamed request kept open (its first bytes read) while ``reqs`` run;
    its replica comes first in :attr:`Side.placed`."""
    order = list(range(len(roots))) if front is None else worker_order(front, roots)
    if hold is None:
        return _run_real(front, roots, reqs, args, Side(order=order))
    assert front is not None
    body = {**hold.body(args.model, args.hold_tokens), "stream": True}
    start = _counters(roots)  # the held request's prefix-cache query counts too
    with (
        httpx.Client(timeout=60.0, trust_env=False) as http,
        http.stream("POST", front + "/v1/chat/completions", json=body) as resp,
    ):
        resp.raise_for_status()
        # The routers replace the replica's x-request-id; its first chunk's id stays.
        held = _replica_of(next(resp.iter_raw()).decode("utf-8", "replace"), {})
        side = _run_real(front, roots, reqs, args, Side(order=order), start)
    side.placed.insert(0, -1 if held is None else held)
    side.latency.insert(0, 0.0)
    return side


def _run_real(
    front: str | None,
    roots: Sequence[str],
    reqs: Sequence[Request],
    args: Any,
    side: Side,
    start: list[dict[str, float]] | None = None,
) -> Side:
    last = _counters(roots)
    before = last if start is None else start
    ids = counts = 0
    for n, r in enumerate(reqs):
        raw = json.dumps(r.body(args.model, args.max_tokens)).encode()
        url = roots[n % len(roots)] if front is None else front
        t0 = time.perf_counter()
        body, rid = _post(url + "/v1/chat/completions", raw, r.headers())
        side.latency.append(time.perf_counter() - t0)
        index = _replica_of(rid, body)
        now = _counters(roots)
        if index is None:
            moved = [
                i
                for i, (a, b) in enumerate(zip(now, last, strict=True))
                if a.get("vllm:request_success_total", 0) != b.get("vllm:request_success_total", 0)
            ]
            index = moved[0] if len(moved) == 1 else -1
            counts += 1
        else:
            ids += 1
        last = now
        side.placed.append(index)
    side.hits = sum(
        a.get("vllm:prefix_cache_hits_total", 0) - b.get("vllm:prefix_cache_hits_total", 0)
        for a, b in zip(last, before, strict=True)
    )
    side.queries = sum(
        a.get("vllm:prefix_cache_queries_total", 0) - b.get("vllm:prefix_cache_queries_total", 0)
        for a, b in zip(last, before, strict=True)
    )
    side.how = f"reply id {ids}, /metrics counters {counts}"
    return side


@contextlib.contextmanager
def sglang_router(policy: str, roots: Sequence[str], log: Path) -> Iterator[str]:
    exe = engine_dir() / "sglang-router" / "bin" / "sglang-router"
    port = _free_port()
    cmd = [str(exe), "launch", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--worker-urls", *roots, "--policy", policy, "--log-level", "warn"]
    cmd += ["--prometheus-port", str(_free_port()), "--prometheus-host", "127.0.0.1"]
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    front = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        # It answers /health before it has registered its workers (asynchronously).
        while True:
            with contextlib.suppress(OSError, ValueError):
                workers = json.loads(_get(front + "/workers", timeout=1.0)).get("workers", [])
                if len(workers) == len(roots) and all(w.get("is_healthy") for w in workers):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router did not start; see {log}")
            time.sleep(0.2)
        yield front
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# -- the modelled side ---------------------------------------------------------------------


async def _run_model(
    name: str,
    roots: Sequence[str],
    order: Sequence[int],
    reqs: Sequence[Request],
    args: Any,
    hold: Request | None,
) -> Side:
    cluster = Cluster(len(roots), args.preset, gateway=name)
    gw = cluster.gateway
    assert gw is not None
    # Bind the policy to the real router's worker URLs: hashes depend on the string.
    gw.views = tuple(
        ReplicaView(r.index, r.name, url, r.engine)
        for r, url in zip(cluster.replicas, roots, strict=True)
    )
    # ... and in the router's worker order (the same view objects: loads are shared).
    gw.policy.bind([gw.views[i] for i in order])
    side = Side(how="x-request-id of the in-process gateway's reply", order=list(order))
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(cluster)
        http = await stack.enter_async_context(httpx.AsyncClient(transport=cluster.transport()))
        if hold is not None:
            body = {**hold.body(args.model, args.hold_tokens), "stream": True}
            resp = await stack.enter_async_context(
                http.stream("POST", cluster.gateway_url + "/chat/completions", json=body)
            )
            first = await resp.aiter_raw().__anext__()
            held = _replica_of(first.decode("utf-8", "replace"), {})
            side.placed.append(-1 if held is None else held)
            side.latency.append(0.0)
        for r in reqs:
            t0 = anyio.current_time()
            resp = await http.post(
                cluster.gateway_url + "/chat/completions",
                content=json.dumps(r.body(args.model, args.max_tokens)).encode(),
                headers={"content-type": "application/json", **r.headers()},
            )
            resp.raise_for_status()
            side.latency.append(anyio.current_time() - t0)
            index = _replica_of(resp.headers.get("x-request-id", ""), resp.json())
            side.placed.append(-1 if index is None else index)
    stats = cluster.stats()
    side.hits = float(sum(s.prefix_cache_hits for s in stats))
    side.queries = float(sum(s.prefix_cache_queries for s in stats))
    return side


def run_model(
    name: str,
    roots: Sequence[str],
    order: Sequence[int],
    reqs: Sequence[Request],
    args: Any,
    hold: Request | None = None,
) -> Side:
    from trio.testing import MockClock

    return anyio.run(
        _run_model,
        name,
        roots,
        order,
        reqs,
        args,
        hold,
        backend="trio",
        backend_options={"clock": MockClock(autojump_threshold=0)},
    )


# -- comparison ----------------------------------------------------------------------------


def _jct(side: Side, reqs: Sequence[Request]) -> float:
    per: dict[str, float] = {}
    for r, lat in zip(reqs, side.latency, strict=True):
        if r.session is not None:
            per[r.session] = per.get(r.session, 0.0) + lat
    return statistics.fmean(per.values()) if per else float("nan")


def _relabelled(a: Sequence[int], b: Sequence[int]) -> int:
    """Requests placed alike under the best one-to-one renaming of replicas (greedy on
    co-occurrence counts): agreement on *grouping*, whatever the names."""
    pairs: dict[tuple[int, int], int] = {}
    for x, y in zip(a, b, strict=True):
        pairs[(x, y)] = pairs.get((x, y), 0) + 1
    used_a: set[int] = set()
    used_b: set[int] = set()
    total = 0
    for (x, y), n in sorted(pairs.items(), key=lambda kv: -kv[1]):
        if x not in used_a and y not in used_b:
            used_a.add(x)
            used_b.add(y)
            total += n
    return total


def compare(
    peer: str,
    model: str,
    real: Side,
    sim: Side,
    reqs: Sequence[Request],
    roots: Sequence[str],
) -> dict[str, Any]:
    same = sum(a == b for a, b in zip(real.placed, sim.placed, strict=True))
    real_hit = real.hits / real.queries if real.queries else float("nan")
    sim_hit = sim.hits / sim.queries if sim.queries else float("nan")
    real_jct, sim_jct = _jct(real, reqs), _jct(sim, reqs)
    return {
        "peer": peer,
        "model": model,
        "requests": len(reqs),
        "same_replica": same,
        "agreement": same / len(reqs),
        "cached_real": real_hit,
        "cached_model": sim_hit,
        "cached_gap_points": 100 * (sim_hit - real_hit),
        "jct_real_s": real_jct,
        "jct_model_s": sim_jct,
        "jct_ratio": sim_jct / real_jct if real_jct else float("nan"),
        "agreement_relabelled": _relabelled(real.placed, sim.placed) / len(reqs),
        "worker_order": real.order,
        "worker_urls": list(roots),
        "placed_real": real.placed,
        "placed_model": sim.placed,
        "replica_from": real.how,
        "disagreements": [
            {"request": r.label, "real": a, "model": b}
            for r, a, b in zip(reqs, real.placed, sim.placed, strict=True)
            if a != b
        ],
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        f"{'peer':26} {'same':>6} {'relab':>5} {'cached real':>11} {'model':>6} {'gap':>5} "
        f"{'JCT real':>8} {'model':>6} {'ratio':>5}"
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['peer']:26} could not run: {r['error']}")
            continue
        lines.append(
            f"{r['peer']:26} {r['same_replica']:>2}/{r['requests']:<3} "
            f"{r['agreement_relabelled']:5.0%} {r['cached_real']:11.1%} "
            f"{r['cached_model']:6.1%} {r['cached_gap_points']:5.1f} {r['jct_real_s']:8.3f} "
            f"{r['jct_model_s']:6.3f} {r['jct_ratio']:5.2f}"
        )
    return "\n".join(lines)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--preset", default="cpu-tiny", choices=("cpu-tiny", "h100-8b"))
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--plain", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--hold-tokens", type=int, default=2500, help="the held stream's")
    parser.add_argument("--only", default="", help="comma-separated peers (e.g. vllm:cache_aware)")
    parser.add_argument("--no-sglang", action="store_true")
    parser.add_argument("--router-log-level", default="warning")
    add_run_args(parser, out="peer_agreement.json")


def main(args: argparse.Namespace) -> None:
    args.model = "tiny-llama" if args.preset == "cpu-tiny" else "sim-llama-3.1-8b"
    router_bin = find_router()
    if router_bin is None:
        raise SystemExit(ROUTER_SETUP_MESSAGE)
    reqs = workload(args.sessions, args.turns, args.plain)
    print(f"{len(reqs)} requests: {' '.join(r.label for r in reqs)}", flush=True)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrt-peer-agreement-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    peers = [(f"vllm:{p}", p) for p in VLLM_POLICIES]
    sglang = engine_dir() / "sglang-router" / "bin" / "sglang-router"
    if not args.no_sglang:
        peers += [(f"sglang:{p}", p) for p in SGLANG_POLICIES]
    if args.only:
        wanted = set(args.only.split(","))
        peers = [p for p in peers if p[0] in wanted]
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for peer, policy in peers:
        model = f"vllm-router:{policy}"
        with sim_serve(args.replicas, args.preset, log_dir / "sim-serve.log") as roots:
            try:
                if peer.startswith("vllm:"):
                    router = start_router(
                        RouterSpec(policy=policy, log_level=args.router_log_level),
                        roots,
                        binary=router_bin,
                        log_dir=log_dir,
                    )
                    try:
                        real = run_real(router.url, roots, reqs, args)
                    finally:
                        router.stop()
                else:
                    if not sglang.exists() or shutil.which(str(sglang)) is None:
                        raise RuntimeError("sglang-router is not installed under .engine")
                    with sglang_router(policy, roots, log_dir / f"sglang-{policy}.log") as front:
                        real = run_real(front, roots, reqs, args)
            except (RuntimeError, OSError, urllib.error.URLError) as e:
                rows.append({"peer": peer, "model": model, "error": str(e)[:300]})
                print(f"{peer}: could not run: {e}", flush=True)
                continue
        sim = run_model(model, roots, real.order, reqs, args)
        row = compare(peer, model, real, sim, reqs, roots)
        rows.append(row)
        print(
            f"{peer}: {row['same_replica']}/{row['requests']} same; real {real.placed} "
            f"model {sim.placed}",
            flush=True,
        )
    hold, held_reqs = held_workload()
    for peer, policy in peers:
        if policy != "cache_aware":
            continue
        model = f"vllm-router:{policy}"
        with sim_serve(args.replicas, args.preset, log_dir / "sim-serve.log") as roots:
            try:
                if peer.startswith("vllm:"):
                    router = start_router(
                        RouterSpec(policy=policy, log_level=args.router_log_level),
                        roots,
                        binary=router_bin,
                        log_dir=log_dir,
                    )
                    try:
                        real = run_real(router.url, roots, held_reqs, args, hold)
                    finally:
                        router.stop()
                else:
                    with sglang_router(policy, roots, log_dir / f"sglang-{policy}.log") as front:
                        real = run_real(front, roots, held_reqs, args, hold)
            except (RuntimeError, OSError, urllib.error.URLError, httpx.HTTPError) as e:
                rows.append({"peer": peer + " (held)", "model": model, "error": str(e)[:300]})
                continue
        sim = run_model(model, roots, real.order, held_reqs, args, hold)
        row = compare(peer + " (held)", model, real, sim, [hold, *held_reqs], roots)
        rows.append(row)
        print(f"{row['peer']}: real {real.placed} model {sim.placed}", flush=True)
    with sim_serve(args.replicas, args.preset, log_dir / "sim-serve.log") as roots:
        direct = run_real(None, roots, reqs, args)
    sim = run_model("vllm-router:round_robin", roots, direct.order, reqs, args)
    baseline = compare("direct (no router)", "vllm-router:round_robin", direct, sim, reqs, roots)
    rows.append(baseline)
    wall = time.monotonic() - started
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "requests": [r.label for r in reqs],
        "router": "vllm-router 0.1.17; sglang-router 0.3.2",
        "wall_s": wall,
        "rows": rows,
        "notes": NOTES,
    }
    write_result(args.out, result, __doc__)
    print(table(rows))
    print(f"wrote {args.out} ({wall:.0f} s)")
