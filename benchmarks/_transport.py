"""agentrt's transport alone: the CPU one call spends in ``AgentTransport`` (tag, route,
encode, observe, account), with the openai client and the network taken away; with
``--telemetry``, what each telemetry hook adds to it.

A prebuilt request goes straight into the transport; underneath, a stub transport
answers at once with a prebuilt reply. Reported: microseconds per call (median over
rounds, the stub's own cost taken off), with the job's report built after each
``--calls-per-job`` calls.

``--telemetry``: the transport with no hooks, with a no-op hook, the journal,
OpenTelemetry (API only, then an SDK with in-memory exporters) and Prometheus, each
job ``--calls-per-job`` calls in one session, CPU microseconds per call
(``time.process_time``; the job's report and its end events included, its start events
not); the configurations' rounds are interleaved, so that drift in the machine's speed
hits them alike. Writes ``--out`` (``results/telemetry_cost.json``).

    python -m benchmarks cost transport
    python -m benchmarks cost transport --dialect vllm --profile
    python -m benchmarks cost transport --telemetry --calls 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

try:  # the HTTP library agentrt runs on: httpx2 under openai 3.x, httpx under 2.x
    import httpx2
except ImportError:
    import httpx as httpx2  # type: ignore[no-redef]

import agentrt
from agentrt.telemetry import Event

from ._harness import add_run_args, write_result

URL = "http://engine.test/v1"
REPLY = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
BODY = json.dumps(
    {"messages": [{"role": "user", "content": "hi"}], "model": "m", "max_tokens": 16}
).encode()


class Stub(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=[(b"content-type", b"application/json")], content=REPLY)


async def run(
    calls: int,
    per_job: int,
    dialect: str,
    prof: cProfile.Profile | None,
    keep: int = 0,
    options: dict[str, Any] | None = None,
) -> float:
    """CPU microseconds per call; ``options``: more Runtime arguments (``--telemetry``)."""
    async with agentrt.Runtime(
        [URL], transport=Stub(), dialect=dialect, keep_reports=keep, **(options or {})
    ) as rt:
        transport: Any = rt.http_client()._transport
        headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer x")]
        headers += [(f"x-stainless-{i}".encode(), b"value") for i in range(8)]
        request = httpx2.Request("POST", URL + "/chat/completions", headers=headers, content=BODY)
        total = 0.0
        done = 0
        while done < calls:
            # the session's block: the transport finds its calls' session there, as for
            # calls through rt.http_client() or rt.openai() (no session.chat around them)
            async with rt.job("micro") as job, job.session():
                if prof:
                    prof.enable()
                t = time.process_time()
                for _ in range(per_job):
                    response = await transport.handle_async_request(request)
                    await response.aread()
            total += time.process_time() - t  # includes the job's report
            if prof:
                prof.disable()
            done += per_job
        return total / done * 1e6


async def stub_only(calls: int) -> float:
    """The stub's own cost (building and reading its reply), subtracted from the figure."""
    stub = Stub()
    request = httpx2.Request("POST", URL + "/chat/completions", content=BODY)
    t = time.process_time()
    for _ in range(calls):
        response = await stub.handle_async_request(request)
        await response.aread()
    return (time.process_time() - t) / calls * 1e6


Options = Callable[[Path], dict[str, Any]]


def _noop(event: Event) -> None:
    return None


def _install_otel_sdk() -> Callable[[], None]:
    """Install SDK tracer and meter providers with in-memory exporters (once per process);
    returns a function that empties the exported spans between rounds."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return exporter.clear


def _prometheus(_: Path) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    return {"otel": False, "prometheus": CollectorRegistry()}


CONFIGS: dict[str, Options] = {
    "off": lambda d: {"otel": False},
    "no-op hook": lambda d: {"otel": False, "hooks": [_noop]},
    "journal": lambda d: {"otel": False, "journal": d / "journal.jsonl"},
    "prometheus": _prometheus,
    "otel (API only, the default: no hook)": lambda d: {"otel": True},
    "otel (SDK, in-memory)": lambda d: {"otel": True},
    "all (journal, otel SDK, prometheus)": lambda d: {
        **_prometheus(d),
        "otel": True,
        "journal": d / "all.jsonl",
    },
}
SDK = ("otel (SDK, in-memory)", "all (journal, otel SDK, prometheus)")


def _have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--calls-per-job", type=int, default=50)
    parser.add_argument("--dialect", default="generic")
    parser.add_argument("--profile", action="store_true", help="and where the time goes")
    parser.add_argument(
        "--telemetry", action="store_true", help="each telemetry hook's cost (writes --out)"
    )
    add_run_args(parser, out="telemetry_cost.json", rounds=5)


def main(args: argparse.Namespace) -> int:
    return telemetry(args) if args.telemetry else transport(args)


def transport(args: argparse.Namespace) -> int:
    prof = cProfile.Profile() if args.profile else None
    per_call = [
        anyio.run(run, args.calls, args.calls_per_job, args.dialect, prof)
        for _ in range(args.rounds)
    ]
    stub = statistics.median(anyio.run(stub_only, args.calls) for _ in range(args.rounds))
    own = [x - stub for x in per_call]
    print(
        f"agentrt transport ({args.dialect}): {statistics.median(own):.1f} µs/call of its own "
        f"(rounds: {', '.join(f'{x:.1f}' for x in own)}; the stub's {stub:.1f} µs taken off)"
    )
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return 0


def telemetry(args: argparse.Namespace) -> int:
    needs = {
        "otel (API only, the default: no hook)": "opentelemetry.trace",
        "prometheus": "prometheus_client",
    }
    needs |= {n: "opentelemetry.sdk" for n in SDK}
    names = [n for n in CONFIGS if n not in needs or _have(needs[n])]
    if SDK[1] in names and not _have("prometheus_client"):
        names.remove(SDK[1])
    skipped = [n for n in CONFIGS if n not in names]
    rounds: dict[str, list[float]] = {n: [] for n in names}
    # The SDK's providers are a process-wide, one-time switch: the configurations without
    # them run first, then those with them (and "off" again, as the baseline of both).
    phases = [[n for n in names if n not in SDK], ["off", *(n for n in names if n in SDK)]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        clear: Callable[[], None] | None = None
        for phase in phases:
            if phase is phases[1]:
                if len(phase) == 1:
                    break
                clear = _install_otel_sdk()
            for _ in range(args.rounds):
                for name in phase:  # interleaved: drift hits every configuration alike
                    if clear is not None:
                        clear()
                    options = CONFIGS[name](folder)
                    per_job = args.calls_per_job
                    value = anyio.run(run, args.calls, per_job, "generic", None, 0, options)
                    rounds[name].append(value)
    stub = statistics.median(anyio.run(stub_only, args.calls) for _ in range(args.rounds))
    own = {n: statistics.median(v) - stub for n, v in rounds.items()}
    base = own["off"]

    header = f"{'telemetry':<38} {'µs/call':>8} {'added':>8}"
    print(header)
    print("-" * len(header))
    for name, value in own.items():
        print(f"{name:<38} {value:8.1f} {value - base:+8.1f}")
    print(
        f"({args.calls} calls x {args.rounds} rounds per row, 'off' twice, "
        f"{args.calls_per_job} calls per job; the stub's {stub:.1f} µs/call taken off)"
    )
    for name in skipped:
        print(f"skipped {name!r}: its package is not installed")

    write_result(
        args.out,
        {
            "calls": args.calls,
            "calls_per_job": args.calls_per_job,
            "rounds": args.rounds,
            "stub_us": stub,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "us_per_call": own,
            "added_us_per_call": {n: v - base for n, v in own.items()},
            "rounds_us": {n: [x - stub for x in v] for n, v in rounds.items()},
            "skipped": skipped,
        },
        __doc__,
    )
    print(f"results: {args.out}")
    return 0
