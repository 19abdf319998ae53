"""The suites: one question each, its page in docs/benchmarks/, and the scripts that
answer it (the first present one is the suite's main entry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Entry:
    name: str
    """The script, ``benchmarks/NAME.py``."""
    what: str
    """What it measures, one line."""
    results: tuple[str, ...] = ()
    """The files of results/ it wrote (their names by what they measure)."""

    @property
    def script(self) -> Path:
        return HERE / f"{self.name}.py"


@dataclass(frozen=True)
class Suite:
    name: str
    question: str
    page: str
    """Its page under docs/benchmarks/."""
    entries: tuple[Entry, ...]

    def main(self) -> Entry:
        """The first entry that is in this tree."""
        return next(e for e in self.entries if e.script.exists())


SUITES: Final = (
    Suite(
        "alternatives",
        "How does agentrt compare with the alternatives a team would deploy instead?",
        "alternatives.md",
        (
            Entry(
                "steady_state",
                "JCT curves at steady state (closed loop of N agents, open-loop rates "
                "below capacity) for every configuration, with bootstrap intervals",
                (
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
                ),
            ),
            Entry(
                "alternatives",
                "throughput at SLO of agentrt beside and on top of the modelled peers, "
                "then JCT at half and all of the best peer's rate",
                (
                    "alternatives_kv_ample.json",
                    "alternatives_kv_pressure.json",
                    "alternatives_fleet16.json",
                    "alternatives_tuned_coding.toml",
                ),
            ),
            Entry("kv_policy", "what the engine does with a waiting session's KV"),
        ),
    ),
    Suite(
        "cost",
        "What does agentrt cost per call, and to start?",
        "cost.md",
        (
            Entry("overhead", "per-call overhead against a bare openai client on loopback"),
            Entry(
                "call_instructions",
                "CPU instructions per call (callgrind), per client",
                ("call_instructions_retried.json", "call_instructions_endpoints.json"),
            ),
            Entry("transport_micro", "the transport's own CPU per call, no network"),
            Entry("telemetry_cost", "CPU per call of each telemetry hook"),
            Entry("scheduler_micro", "the scheduler's decision cost and memory"),
            Entry("http_latency", "per-call latency over HTTP against agentrt sim serve"),
            Entry("idle_sessions", "memory of 10,000 open idle sessions"),
            Entry(
                "load",
                "thousands of jobs against a fast server; soak",
                (
                    "load.json",
                    "load_soak.json",
                    "load_agentrt_2000_concurrent.json",
                    "load_2000_concurrent_cap1000.json",
                    "load_default_pool.json",
                ),
            ),
            Entry("first_burst", "a fresh client's first N calls at once", ("first_burst.json",)),
            Entry("first_use", "import agentrt and the first Runtime", ("first_use.json",)),
        ),
    ),
    Suite(
        "fleet",
        "How does agentrt behave as a fleet of many processes on one cluster?",
        "fleet.md",
        (
            Entry(
                "fleet",
                "K runtimes on one embedded cluster, in virtual time",
                ("fleet_coding.json", "fleet_claude_code.json"),
            ),
            Entry(
                "fleet_real",
                "K OS processes on one set of replicas, in wall-clock time",
                ("fleet_real_sim.json", "fleet_real_vllm.json"),
            ),
            Entry(
                "fault_soak",
                "healthy replicas stay up under faults that are not the endpoint's",
                ("fault_soak.json",),
            ),
            Entry(
                "first_turns",
                "16 OS processes' first turns on agentrt sim serve: the busiest replica over "
                "the mean",
                ("first_turns.json",),
            ),
        ),
    ),
    Suite(
        "twin",
        "How close is the twin (embedded engine, modelled peers) to the real engines, "
        "and what does a replay cost?",
        "twin.md",
        (
            Entry("fidelity", "the embedded engine against the real vLLM CPU engine"),
            Entry(
                "peer_agreement",
                "each modelled peer places requests where the real router does",
                ("peer_agreement.json",),
            ),
            Entry(
                "replay_cost",
                "CPU (and instructions) per simulated call of a replay",
                ("replay_cost.json", "scale_claude_code_710.json"),
            ),
            Entry(
                "tune_check",
                "agentrt tune's recommendation against the measured best, on the twin",
                ("tune_check.json",),
            ),
            Entry("fit_coding_workload", "the coding workload's fit to the Claude Code traces"),
        ),
    ),
    Suite(
        "engine",
        "What does agentrt do on a real engine (vLLM CPU)?",
        "engine.md",
        (
            Entry(
                "real_ordering",
                "client-side ordering of short and long jobs on vLLM's priority queue",
                ("real_ordering.json",),
            ),
            Entry("cache_reuse", "one session's prefix-cache reuse, by routing"),
            Entry(
                "real_kv",
                "placement and load control by KV working set on two vLLM CPU replicas "
                "whose KV evicts: agentrt's defaults against plain round robin (and "
                "without load control)",
                (
                    "real_kv_small.json",
                    "real_kv_tight.json",
                    "real_kv_oversub.json",
                    "real_kv_oversub_short.json",
                ),
            ),
            Entry(
                "router",
                "agentrt with, and against, vLLM's router (vLLM CPU and the twin)",
                ("router_vllm.json", "router_sim.json"),
            ),
            Entry(
                "tune_real",
                "tune's loop on two vLLM CPU replicas",
                ("tune_real.json", "tune_real_polled.json"),
            ),
        ),
    ),
)
"""Every suite, in the order of docs/benchmarks.md."""


def find(name: str) -> Suite:
    for suite in SUITES:
        if suite.name == name:
            return suite
    raise SystemExit(f"no suite {name!r}; known: {', '.join(s.name for s in SUITES)}")
