"""The suites: the entry points of ``python -m benchmarks``. Each answers one question,
has its page in docs/benchmarks/, and one argument parser: where a suite answers its
question in parts, the part is its first parameter (``python -m benchmarks cost
transport --rounds 3``; the first part when none is named). A part's logic is a private
module of this package with ``add_args(parser)`` (its options, on the harness's shared
ones: ``_harness.add_run_args``) and ``main(args)``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from . import _harness


class _Module(Protocol):
    add_args: Callable[[argparse.ArgumentParser], None]
    main: Callable[[argparse.Namespace], Any]


@dataclass(frozen=True)
class Part:
    name: str
    """The parameter that picks it (``python -m benchmarks SUITE NAME``)."""
    module: str
    """Its module, ``benchmarks/MODULE.py``."""
    what: str
    """What it measures, one line."""
    results: tuple[str, ...] = ()
    """The files of results/ it wrote (their names by what they measure)."""

    def load(self) -> _Module:
        return cast(_Module, importlib.import_module(f"{__package__}.{self.module}"))


@dataclass(frozen=True)
class Suite:
    name: str
    question: str
    page: str
    """Its page under docs/benchmarks/."""
    parts: tuple[Part, ...]

    def parser(self, part: Part) -> argparse.ArgumentParser:
        """The suite's one parser, with ``part``'s options (the other parts are listed,
        their options loaded only when picked: a part's module may be heavy)."""
        prog = f"python -m benchmarks {self.name}"
        usage = f"{prog} [OPTIONS]" if len(self.parts) == 1 else f"{prog} [PART] [OPTIONS]"
        parser = argparse.ArgumentParser(prog=prog, usage=usage, description=self.question)
        if len(self.parts) == 1:
            part.load().add_args(parser)
            return parser
        sub = parser.add_subparsers(
            dest="part", metavar="PART", title=f"parts (default: {self.parts[0].name})"
        )
        for p in self.parts:
            one = sub.add_parser(
                p.name, help=p.what, description=p.what, usage=f"{prog} {p.name} [OPTIONS]"
            )
            if p is part:
                p.load().add_args(one)
        return parser

    def run(self, argv: Sequence[str]) -> Any:
        names = {p.name: p for p in self.parts}
        argv = list(argv)
        if len(self.parts) > 1 and not (argv and (argv[0] in names or argv[0] in ("-h", "--help"))):
            argv.insert(0, self.parts[0].name)
        part = names[argv[0]] if len(self.parts) > 1 and argv[0] in names else self.parts[0]
        args = self.parser(part).parse_args(argv)
        _harness.ENTRY[:] = [self.name, part.name] if len(self.parts) > 1 else [self.name]
        return part.load().main(args)


def _p(name: str, what: str, *results: str, module: str = "") -> Part:
    return Part(name, module or f"_{name}", what, results)


SUITES: Final = (
    Suite(
        "alternatives",
        "How does agentrt compare with the alternatives a team would deploy instead, "
        "at steady state and at SLO?",
        "steady.md",
        (
            _p(
                "steady",
                "JCT curves at steady state (closed loop of N agents, open-loop rates "
                "below capacity) for every configuration, with bootstrap intervals",
                "steady_claude_code.json",
                "steady_claude_code_pressure.json",
                "steady_coding.json",
                "steady_claude_code_small.json",
                "steady_claude_code_seed1.json",
                "steady_claude_code_retention.json",
                "steady_claude_code_seed1_peers.json",
                "steady_claude_code_pressure_retention.json",
                "steady_claude_code_priority.json",
                "steady_claude_code_kv_events.json",
                "steady_claude_code_kv_events_pressure.json",
                "steady_claude_code_peers_oversub.json",
                "steady_claude_code_oversub.json",
                "steady_claude_code_oversub_waits.json",
                "steady_claude_code_oversub_host.json",
                "steady_claude_code_oversub_pressure.json",
                "steady_claude_code_oversub_wc.json",
                module="_steady_state",
            ),
            _p(
                "slo",
                "throughput at SLO of agentrt beside and on top of the modelled peers, "
                "then JCT at half and all of the best peer's rate",
                "alternatives_kv_ample.json",
                "alternatives_kv_pressure.json",
                "alternatives_fleet16.json",
                "alternatives_tuned_coding.toml",
                module="_alternatives",
            ),
        ),
    ),
    Suite(
        "kv",
        "What should the engine do with a waiting session's KV?",
        "alternatives.md",
        (_p("policy", "each KV policy's JCT and cache hits, on the twin", module="_kv_policy"),),
    ),
    Suite(
        "cost",
        "What does agentrt cost per call, on its hot path?",
        "cost.md",
        (
            _p(
                "overhead",
                "per-call overhead against a bare openai client on loopback",
            ),
            _p(
                "instructions",
                "CPU instructions per call (callgrind), per client",
                "call_instructions_retried.json",
                "call_instructions_endpoints.json",
                module="_call_instructions",
            ),
            _p(
                "transport",
                "the transport's own CPU per call, no network (--telemetry: and each "
                "telemetry hook's)",
            ),
            _p("scheduler", "the scheduler's decision cost and memory", module="_scheduler_micro"),
            _p(
                "http",
                "per-call latency over HTTP against agentrt sim serve",
                module="_http_latency",
            ),
        ),
    ),
    Suite(
        "load",
        "How does agentrt hold up under load, at start and with many idle sessions?",
        "cost.md",
        (
            _p(
                "load",
                "thousands of jobs against a fast server; soak",
                "load.json",
                "load_soak.json",
                "load_agentrt_2000_concurrent.json",
                "load_2000_concurrent_cap1000.json",
                "load_default_pool.json",
            ),
            _p(
                "burst",
                "a fresh client's first N calls at once",
                "first_burst.json",
                module="_first_burst",
            ),
            _p(
                "startup",
                "import agentrt and the first Runtime",
                "first_use.json",
                module="_first_use",
            ),
            _p("idle", "memory of 10,000 open idle sessions", module="_idle_sessions"),
        ),
    ),
    Suite(
        "fleet",
        "How does agentrt behave as a fleet of many processes on one cluster?",
        "fleet.md",
        (
            _p(
                "twin",
                "K runtimes on one embedded cluster, in virtual time",
                "fleet_coding.json",
                "fleet_claude_code.json",
                "fleet_load_control.json",
                module="_fleet",
            ),
            _p(
                "processes",
                "K OS processes on one set of replicas, in wall-clock time",
                "fleet_real_sim.json",
                "fleet_real_vllm.json",
                module="_fleet_real",
            ),
            _p(
                "first-turns",
                "16 OS processes' first turns on agentrt sim serve: the busiest replica "
                "over the mean",
                "first_turns.json",
                module="_first_turns",
            ),
        ),
    ),
    Suite(
        "faults",
        "Do healthy replicas stay up under faults that are not the endpoint's?",
        "fleet.md",
        (
            _p(
                "soak",
                "a soak of agent jobs on two sim replicas with faults injected",
                "fault_soak.json",
                module="_fault_soak",
            ),
        ),
    ),
    Suite(
        "twin",
        "How close is the twin (embedded engine, modelled workloads) to the real thing, "
        "and what does a replay cost?",
        "twin.md",
        (
            _p("fidelity", "the embedded engine against the real vLLM CPU engine"),
            _p(
                "replay-cost",
                "CPU (and instructions) per simulated call of a replay",
                "replay_cost.json",
                "scale_claude_code_710.json",
                module="_replay_cost",
            ),
        ),
    ),
    Suite(
        "routing",
        "Does agentrt place requests as the routers it models do, and how does it do "
        "with and against vLLM's router?",
        "twin.md",
        (
            _p(
                "peers",
                "each modelled peer places requests where the real router does",
                "peer_agreement.json",
                module="_peer_agreement",
            ),
            _p(
                "router",
                "agentrt with, and against, vLLM's router (vLLM CPU and the twin)",
                "router_vllm.json",
                "router_sim.json",
            ),
        ),
    ),
    Suite(
        "tune",
        "Does agentrt tune pick the best settings?",
        "engine.md",
        (
            _p(
                "twin",
                "agentrt tune's recommendation against the measured best, on the twin",
                "tune_check.json",
                module="_tune_check",
            ),
            _p(
                "vllm",
                "tune's loop on two vLLM CPU replicas",
                "tune_real.json",
                "tune_real_polled.json",
                module="_tune_real",
            ),
        ),
    ),
    Suite(
        "engine",
        "What does agentrt do on a real engine (vLLM CPU)?",
        "engine.md",
        (
            _p(
                "kv",
                "placement and load control by KV working set on two vLLM CPU replicas "
                "whose KV evicts: agentrt's defaults against plain round robin (and "
                "without load control)",
                "real_kv_small.json",
                "real_kv_tight.json",
                "real_kv_oversub.json",
                "real_kv_oversub_short.json",
                module="_real_kv",
            ),
            _p(
                "ordering",
                "client-side ordering of short and long jobs on vLLM's priority queue",
                "real_ordering.json",
                module="_real_ordering",
            ),
            _p("cache", "one session's prefix-cache reuse, by routing", module="_cache_reuse"),
        ),
    ),
)
"""Every suite, in the order of docs/benchmarks.md."""


def find(name: str) -> Suite:
    for suite in SUITES:
        if suite.name == name:
            return suite
    known = ", ".join(s.name for s in SUITES)
    print(f"no suite {name!r}; known: {known} (python -m benchmarks list)", file=sys.stderr)
    raise SystemExit(2)
