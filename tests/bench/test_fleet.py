"""Fleets in the bench: K independent clients of one spec sharing one embedded cluster."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import pickle
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from agentrt import Runtime
from agentrt.bench import (
    BenchConfig,
    BenchResult,
    ClientResult,
    ClientSpec,
    _drivers,
    _runner,
    run_bench,
    run_study,
)
from agentrt.bench._fleet import Fleet, assign_members, plain_starts
from agentrt.bench._output import fleet_lines, print_table
from agentrt.bench._plan import Fanout, JobPlan, SessionPlan
from agentrt.bench._runner import ClientRun, prepare, replay_part
from agentrt.cli import main
from agentrt.telemetry import read_journal

K = 4


def small(**changes: Any) -> BenchConfig:
    """16 react jobs on 4 replicas, a plain client and agentrt's session routing."""
    fields: dict[str, Any] = {
        "workload": "react",
        "jobs": 16,
        "rate": 0.5,
        "seed": 5,
        "replicas": 4,
        "clients": ("plain", "agentrt:session"),
        "stretch": False,
    }
    return BenchConfig(**(fields | changes))


@cache
def fleet_run(assign: str = "round_robin") -> BenchResult:
    return run_bench(small(fleet=K, fleet_assign=assign), workers=1)


def summary(c: ClientResult) -> dict[str, Any]:
    row = dataclasses.asdict(c)
    row.pop("journal")
    return row


def sessions(plan: JobPlan) -> int:
    def count(s: SessionPlan) -> int:
        return 1 + sum(
            count(x) for step in s.steps if isinstance(step, Fanout) for x in step.sessions
        )

    return count(plan.root)


def test_a_fleet_of_one_is_the_lone_client(monkeypatch: pytest.MonkeyPatch) -> None:
    lone = run_bench(small(), workers=1)
    assert [summary(c) for c in run_bench(small(fleet=1), workers=1).clients] == [
        summary(c) for c in lone.clients
    ]
    # The same client wrapped in a one-member Fleet: not a float moves.
    original = _runner._driver

    def as_fleet(cfg: BenchConfig, spec: ClientSpec, plans: list[JobPlan], *rest: Any) -> Any:
        return Fleet([original(cfg, spec, plans, *rest)], plans, "round_robin")

    monkeypatch.setattr(_runner, "_driver", as_fleet)
    wrapped = run_bench(small(), workers=1)
    for a, b in zip(wrapped.clients, lone.clients, strict=True):
        assert [r["jct_s"] for r in a.job_rows] == [r["jct_s"] for r in b.job_rows]
        assert summary(a) == summary(b)
    assert lone.clients[0].fleet == 1 and {r["worker"] for r in lone.clients[0].job_rows} == {0}


def test_every_member_runs_its_share_in_arrival_order() -> None:
    result = fleet_run()
    for c in result.clients:
        assert c.fleet == K and c.failed == 0 and c.jobs == 16
        rows = c.job_rows  # in arrival order
        assert [r["worker"] for r in rows] == [i % K for i in range(len(rows))]
        assert Counter(r["worker"] for r in rows) == dict.fromkeys(range(K), 16 // K)


def test_per_replica_figures_add_up() -> None:
    result = fleet_run()
    plans = prepare(small(fleet=K))
    for c in result.clients:
        assert c.replicas is not None and len(c.replicas) == 4
        assert (
            sum(r["calls"] for r in c.replicas)
            == result.calls
            == sum(r["calls"] for r in c.job_rows)
        )
        assert sum(r["first_turns"] for r in c.replicas) == sum(map(sessions, plans))
        assert all(r["busy_s"] > 0 and r["prefill_tokens"] > 0 for r in c.replicas)
        calls = [r["calls"] for r in c.replicas]
        assert c.call_imbalance == pytest.approx(max(calls) / (sum(calls) / len(calls)))
        assert c.load_imbalance is not None and c.load_imbalance >= 1.0


def test_hash_assignment_is_stable_and_not_round_robin() -> None:
    plans = prepare(small())
    by_hash = assign_members(plans, K, "hash")
    assert by_hash == assign_members(list(plans), K, "hash")
    assert by_hash == [
        int.from_bytes(hashlib.blake2b(p.name.encode(), digest_size=8).digest(), "big") % K
        for p in plans
    ]
    assert by_hash != assign_members(plans, K, "round_robin")
    workers = {p.name: m for p, m in zip(plans, by_hash, strict=True)}
    for c in fleet_run("hash").clients:
        assert c.failed == 0
        assert {r["name"]: r["worker"] for r in c.job_rows} == workers


def test_round_robin_follows_arrival_order_not_list_order() -> None:
    root = SessionPlan("main", ())
    plans = [JobPlan(f"j{i}", "react", t, root) for i, t in enumerate([3.0, 1.0, 2.0, 0.0])]
    assert assign_members(plans, 2, "round_robin") == [1, 1, 0, 0]  # j3, j1, j2, j0
    assert assign_members(plans, 1, "hash") == [0, 0, 0, 0]


def test_plain_fleet_members_start_at_seeded_random_replicas() -> None:
    assert plain_starts(1, 8, seed=3) == [0]
    starts = plain_starts(K, 4, seed=5)
    assert starts == plain_starts(K, 4, seed=5) and set(starts) != {0}
    assert all(0 <= s < 4 for s in starts)
    # Each plain member's first call (its first job's turn 0) went to its start replica.
    cfg = small(fleet=K, clients=("plain",))
    run = replay_part(cfg, prepare(cfg), 0)
    assert isinstance(run, ClientRun)
    first: dict[int, str | None] = {}
    for job in sorted(run.results, key=lambda r: r.start_s):
        call = min(job.calls, key=lambda c: job.start_s + c.start_s)
        first.setdefault(job.worker, call.endpoint)
    urls = [f"http://replica-{i}.sim/v1" for i in range(4)]
    assert [first[m] for m in range(K)] == [urls[s] for s in starts]


def test_defaults_spec_parses_alone() -> None:
    spec = ClientSpec.parse("agentrt:defaults")
    assert (spec.name, spec.kind, spec.defaults) == ("agentrt:defaults", "agentrt", True)
    assert (spec.routing, spec.policy, spec.concurrency) == ("session_affinity", "fcfs", "engine")
    for text in ("agentrt:defaults+plas", "agentrt:defaults@4", "agentrt:defaults,declare=none"):
        with pytest.raises(ValueError, match="give no other option with it") as err:
            ClientSpec.parse(text)
        assert "\n" not in str(err.value)
    assert "agentrt:defaults" in _drivers.CLIENT_SPEC_HELP


def test_defaults_spec_builds_runtime_as_a_user_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given: list[set[str]] = []
    real = Runtime

    def recording(*args: Any, **kwargs: Any) -> Runtime:
        given.append(set(kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(_drivers, "Runtime", recording)
    cfg = small(jobs=3, clients=("agentrt:defaults",), journal_dir=tmp_path)
    (client,) = run_bench(cfg, workers=1).clients
    assert client.client == "agentrt:defaults" and client.failed == 0
    assert given == [{"transport", "timeout_s", "keep_reports", "journal", "dialect"}]
    defaults = inspect.signature(Runtime).parameters
    assert client.journal is not None
    for report in read_journal(client.journal):
        assert report.runtime is not None
        for key in ("routing", "policy", "concurrency"):
            assert report.runtime[key] == defaults[key].default


def test_fleet_members_share_their_clients_journal(tmp_path: Path) -> None:
    cfg = small(fleet=K, journal_dir=tmp_path)
    result = run_bench(cfg, workers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "journal-agentrt_session.jsonl",
        "journal-plain.jsonl",
    ]
    for c in result.clients:
        assert c.journal is not None
        reports = read_journal(c.journal)  # a mixed line would warn (an error here)
        assert sorted(r.metadata["plan"] for r in reports) == sorted(r["name"] for r in c.job_rows)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"fleet": 0}, "fleet"),
        ({"fleet": -2}, "fleet"),
        ({"fleet": 1.5}, "fleet"),
        ({"fleet": True}, "fleet"),
        ({"fleet_assign": "random"}, "fleet_assign"),
    ],
)
def test_bad_fleet_options_are_rejected(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        run_bench(small(**changes))


def test_cli_rejects_bad_fleets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--fleet", "0", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--fleet must be positive" in err and err.count("\n") == 1
    for argv in (["--fleet", "two"], ["--fleet-assign", "random"]):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", *argv])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert argv[0] in err and err.count("\n") == 1


def test_cli_runs_a_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--workload", "react", "--jobs", "8", "--replicas", "2", "--seed", "5"]
    argv += ["--client", "plain", "--fleet", "2", "--fleet-assign", "hash", "--no-stretch"]
    assert main([*argv, "--out", str(tmp_path), "--no-plots", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "each client ran as 2 independent clients" in out and "first turns [" in out
    shown = [line for line in out.splitlines() if not line.startswith(("results:", "journals:"))]
    assert all(len(line) <= 80 for line in shown)


def test_fleet_lines_fit_80_columns() -> None:
    result = fleet_run()
    lines: list[str] = []
    print_table(result, "agentrt bench: react", echo=lines.append)
    fleet = fleet_lines(result)
    assert fleet and fleet[0].startswith("fleet: each client ran as 4")
    assert lines[-len(fleet) :] == fleet and all(len(line) <= 80 for line in lines)
    for c in result.clients:
        assert c.replicas is not None
        first = " ".join(str(int(r["first_turns"])) for r in c.replicas)
        assert any(f"first turns [{first}]" in line for line in fleet)
    assert fleet_lines(run_bench(small(jobs=2), workers=1)) == []


def test_fleet_options_reach_parallel_replays() -> None:
    cfg = small(jobs=8, fleet=2, fleet_assign="hash")
    again = pickle.loads(pickle.dumps(cfg))
    assert (again.fleet, again.fleet_assign) == (2, "hash")
    (here,) = run_study([cfg], workers=1)
    (there,) = run_study([cfg], workers=2)
    assert [summary(c) for c in there.clients] == [summary(c) for c in here.clients]
    assert there.config["fleet"] == 2 and there.clients[0].fleet == 2


def test_a_fleets_load_control_counters_are_summed_over_its_members() -> None:
    cfg = small(
        jobs=8,
        fleet=2,
        clients=("agentrt:defaults", "agentrt:defaults,load_control=off", "plain"),
    )
    on, off, plain = run_bench(cfg, workers=1).clients
    assert on.load_control is not None
    assert set(on.load_control) == {"held", "held_s", "hold_max_s", "forced_resumes"}
    assert on.load_control["held"] >= on.load_control["forced_resumes"] >= 0
    assert off.load_control is None and plain.load_control is None
