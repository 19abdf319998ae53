"""The CPU telemetry costs per call: agentrt's transport with no hooks, with a no-op hook,
the journal, OpenTelemetry (API only, then an SDK with in-memory exporters) and Prometheus.

As in ``transport_micro.py`` (whose ``run`` this calls): a prebuilt request goes straight
into the transport, a stub transport answers at once, each job makes ``--calls-per-job``
calls in one session, and the figure is CPU microseconds per call (``time.process_time``;
the job's report and its end events included, its start events not), the stub's own cost
taken off, median over rounds. The configurations' rounds are interleaved, so that drift
in the machine's speed hits them alike.
Writes ``results/telemetry_cost.json``.

    .venv/bin/python benchmarks/telemetry_cost.py
    .venv/bin/python benchmarks/telemetry_cost.py --calls 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from _harness import add_run_args, write_result
from transport_micro import run, stub_only  # this folder: run as a script

from agentrt.telemetry import Event

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--calls-per-job", type=int, default=50)
    add_run_args(parser, out="telemetry_cost.json", rounds=5)
    args = parser.parse_args()

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


if __name__ == "__main__":
    sys.exit(main())
