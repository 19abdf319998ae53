"""agentrt tune: a journal recorded on the embedded cluster comes back as the same
workload, and the command turns it into a ranked table and a TOML file of Runtime
keyword arguments; bad input is one line."""

from __future__ import annotations

import pickle
import tomllib
from pathlib import Path

import pytest

from agentrt import Runtime
from agentrt.bench import BenchConfig, run_bench
from agentrt.bench._plan import Call, JobPlan, SessionPlan
from agentrt.bench._runner import ClientRun, prepare, replay_part
from agentrt.cli import main
from agentrt.sim import PRESETS, CostModel
from agentrt.tune._fit import from_journal
from agentrt.tune._search import Setting, TwinConfig, replay
from agentrt.tune._workload import load, to_plans, window
from tests.tune._helpers import record_journal

_record = record_journal


def _calls(session: SessionPlan) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for step in session.steps:
        if isinstance(step, Call):
            out.append((step.prompt_tokens, step.output_tokens))
        else:
            for sub in step.sessions:
                out.extend(_calls(sub))
    return out


def _shape(session: SessionPlan) -> list[object]:
    return [
        "call" if isinstance(s, Call) else [_shape(x) for x in s.sessions] for s in session.steps
    ]


def _waits(session: SessionPlan) -> list[tuple[float, str | None]]:
    out: list[tuple[float, str | None]] = []
    for step in session.steps:
        if isinstance(step, Call):
            out.append((step.wait_s, step.tool))
    return out


def test_a_recorded_journal_comes_back_as_the_workload(tmp_path: Path) -> None:
    path = _record(tmp_path, "mixed", 8)
    original = {p.name: p for p in prepare(BenchConfig(workload="mixed", jobs=8, rate=0.5, seed=4))}
    observed = load([path])
    assert observed.recorded_known and observed.replicas == 2
    # The bench's client: no concurrency limit, no priorities (its journal's runtime).
    recorded = Setting(routing="session_affinity", concurrency=None, send_priority=False)
    assert Setting.of(observed.recorded) == recorded
    plans = to_plans(observed.reports)
    assert len(plans) == 8
    by_plan = {
        r.metadata["plan"]: p
        for r, p in zip(observed.reports, to_plans_unsorted(observed), strict=False)
    }
    first = min(p.arrival_s for p in original.values())
    for name, plan in by_plan.items():
        want = original[name]
        # The same calls (prompt and output tokens, in session order), the same tree.
        assert sorted(_calls(plan.root)) == sorted(_calls(want.root))
        assert _shape(plan.root) == _shape(want.root)
        assert plan.arrival_s == pytest.approx(want.arrival_s - first, abs=1e-6)
        # The root session's waits, tool or think, as the plan slept them.
        for (got, tool), (exp, exp_tool) in zip(_waits(plan.root), _waits(want.root), strict=True):
            assert got == pytest.approx(exp, abs=1e-3)
            assert (tool is None) == (exp_tool is None or exp == 0)


def to_plans_unsorted(observed: object) -> list[JobPlan]:
    from agentrt.tune._workload import job_plan_root

    reports = observed.reports  # type: ignore[attr-defined]
    t0 = min(r.arrival_s for r in reports)
    out = []
    for i, r in enumerate(reports):
        root = job_plan_root(r, f"j{i}")
        assert root is not None
        out.append(JobPlan(r.name, r.name, r.arrival_s - t0, root))
    return out


def test_the_twin_replays_the_recorded_jcts(tmp_path: Path) -> None:
    path = _record(tmp_path, "react", 6)
    observed = load([path])
    plans = to_plans(observed.reports)
    recorded = sorted(r.jct_s for r in observed.reports)
    cfg = TwinConfig(clients=("agentrt:session",), replicas=2, stretch=False, api="http")
    run = replay_part(cfg, plans, 0)
    replayed = sorted(r.jct_s for r in run.results)  # type: ignore[union-attr]
    for got, want in zip(replayed, recorded, strict=True):
        assert got == pytest.approx(want, rel=0.1)


def test_tune_end_to_end_writes_runtime_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _record(tmp_path, "react", 6)
    out = tmp_path / "tuned.toml"
    args = ["tune", str(path), "--out", str(out), "--sample", "4", "--seeds", "2"]
    assert main([*args, "--workers", "1", "--top", "1"]) == 0
    text = capsys.readouterr().out
    table = [line for line in text.splitlines() if str(out) not in line]
    assert all(len(line) <= 80 for line in table), text
    assert "session+fcfs@none,noprio*" in text  # the recorded settings, marked
    assert len([line for line in table if line[:2].strip().isdigit()]) >= 2  # ranked
    assert "confidence" in text and str(out) in text
    settings = tomllib.loads(out.read_text())
    keys = {"routing", "policy", "concurrency", "send_priority", "learn_waits"}
    if settings["concurrency"] == "engine":  # the adaptive cap, polling as replayed
        keys.add("poll_metrics_s")
    assert set(settings) == keys
    rt = Runtime(["http://127.0.0.1:9/v1"], config=out)  # the loader takes it
    assert rt._core.settings is not None and rt._core.settings["routing"] == settings["routing"]


def test_tune_from_python_is_what_the_command_prints_and_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # agentrt.tune.tune: the command's one path; it returns the ranking and writes nothing.
    from agentrt.tune import LOADS, TuneResult, tune

    path = _record(tmp_path, "react", 6)
    monkeypatch.chdir(tmp_path)
    header: list[str] = []
    result = tune(path, sample=4, seeds=2, top=1, workers=1, echo=header.append)
    assert isinstance(result, TuneResult) and not list(tmp_path.glob("*.toml"))
    assert header[0].startswith("agentrt tune: 6 jobs") and capsys.readouterr().out == ""
    assert result.journals == (path,) and result.jobs == 6
    scores = [s.score for s in result.ranked]
    assert len(scores) >= 2 and scores == sorted(scores)  # best first
    assert all(set(s.p50) == set(LOADS) == set(s.p90) for s in result.ranked)
    pick = result.chosen
    assert pick is not None and pick in result.ranked
    assert Setting.of(result.runtime_kwargs()) == pick.setting
    written = tomllib.loads(result.to_toml())
    assert {k: None if v == "none" else v for k, v in written.items()} == result.runtime_kwargs()

    # The command: the same header and table (but its timing), the same file's settings.
    out = tmp_path / "tuned.toml"
    args = ["tune", str(path), "--out", str(out), "--sample", "4", "--seeds", "2"]
    assert main([*args, "--workers", "1", "--top", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    said = "\n".join(header).splitlines()
    assert printed[: len(said)] == said
    assert printed[len(said) : -2] == result.table()[:-1]  # "N replays in S s" aside
    assert printed[-1] == f"best settings: {out}"
    assert tomllib.loads(out.read_text()) == written


def test_a_plain_clients_journal_is_tuned_against_the_plain_client(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's journal-plain.jsonl: recorded by a bare client, so the baseline is that
    client replayed, not agentrt settings it never ran with."""
    path = _record(tmp_path, "react", 6, client="plain")
    assert path.name == "journal-plain.jsonl"
    observed = load([path])
    assert observed.recorded_known and Setting.of(observed.recorded) == Setting(plain=True)
    out = tmp_path / "tuned.toml"
    args = ["tune", str(path), "--out", str(out), "--sample", "4", "--seeds", "1"]
    assert main([*args, "--workers", "1", "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "recorded with: plain client\n  (no agentrt:" in text
    assert "every ratio to the plain client's replay" in text
    assert "Ratios to the plain client's replay (*)" in text
    rows = [line for line in text.splitlines() if line[:2].strip().isdigit()]
    assert [r for r in rows if "plain client*" in r]  # the baseline ran, and is marked
    assert not [r for r in rows if r.rstrip().endswith("*") and "plain" not in r]
    assert "noprio" not in text  # no agentrt setting stands in for what was recorded
    assert all(len(line) <= 80 for line in text.splitlines() if str(out) not in line)
    assert "# recorded with: plain client" in out.read_text()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        ("", "is empty: no job reports in it"),
        ('not json\n{"job_id": 1}\n', "no valid job report: none of its 2 lines"),
    ],
    ids=["missing", "empty", "invalid"],
)
def test_bad_journals_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, needle: str
) -> None:
    path = tmp_path / "runs.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["tune", str(path), "--out", str(tmp_path / "t.toml")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("agentrt: error:"), err
    assert needle in err and str(path) in err
    assert not (tmp_path / "t.toml").exists()


def test_bad_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("")
    assert main(["tune", str(path), "--sample", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--sample" in err


def test_the_engine_is_calibrated_to_the_journals_latencies(tmp_path: Path) -> None:
    base = PRESETS["h100-8b"]
    c = base.cost
    # Recorded on an engine whose prefill is twice and whose decode half the preset's.
    slower = base.replace(
        cost=CostModel(
            step_s=c.step_s * 0.5,
            prefill_token_s=c.prefill_token_s * 2,
            decode_seq_s=c.decode_seq_s * 0.5,
            decode_context_token_s=c.decode_context_token_s * 0.5,
            prefill_pair_s=c.prefill_pair_s * 2,
        )
    )
    cfg = TwinConfig(
        workload="react",
        jobs=8,
        rate=0.5,
        seed=5,
        replicas=2,
        clients=("agentrt:session",),
        stretch=False,
        api="http",
        journal_dir=tmp_path,
        engine=slower,
    )
    run_bench(cfg, workers=1)
    (path,) = tmp_path.glob("journal-*.jsonl")
    engine, fit = from_journal(load([path]).reports, base)
    assert fit.source == "journal"
    assert fit.prefill_scale == pytest.approx(2.0, rel=0.2)
    assert fit.decode_scale == pytest.approx(0.5, rel=0.2)
    assert engine.cost.prefill_token_s == pytest.approx(c.prefill_token_s * fit.prefill_scale)


def test_a_replay_travels_to_a_pool_worker(tmp_path: Path) -> None:
    """What a pool worker receives (its description and the pickled jobs) pickles, and
    gives the replay's result as in this process."""
    path = _record(tmp_path, "react", 3)
    plans = to_plans(load([path]).reports)
    cfg = TwinConfig(clients=("agentrt:session",), replicas=2, stretch=False, api="http")
    description = pickle.loads(pickle.dumps((cfg, 0, "k")))
    got = replay(description, pickle.dumps(plans))
    want = replay_part(cfg, plans, 0)
    assert isinstance(got, ClientRun) and isinstance(want, ClientRun)
    assert [r.jct_s for r in got.results] == [r.jct_s for r in want.results]


def test_a_window_starts_after_its_warm_up_jobs() -> None:
    root = SessionPlan("main", ())
    plans = [JobPlan(f"j{i}", "react", 2.0 * i, root) for i in range(10)]
    jobs, counted = window(plans, 3, 1, 2, warmup=2)  # the last window: jobs 7-9
    assert [p.name for p in jobs] == ["j5", "j6", "j7", "j8", "j9"]
    assert counted == {"j7", "j8", "j9"}
    assert [p.arrival_s for p in jobs] == [0.0, 2.0, 4.0, 6.0, 8.0]  # gaps kept
    jobs, counted = window(plans, 3, 0, 2, warmup=2)  # the first: nothing before it
    assert [p.name for p in jobs] == ["j0", "j1", "j2"] and len(counted) == 3


def test_a_window_ends_with_the_jobs_arriving_while_its_jobs_run() -> None:
    """The jobs arriving within ``cooldown_s`` of the window's last arrival are replayed
    (they compete with the window's jobs, as when recorded) but not counted."""
    root = SessionPlan("main", ())
    plans = [JobPlan(f"j{i}", "react", 2.0 * i, root) for i in range(10)]
    jobs, counted = window(plans, 3, 0, 2, warmup=2, cooldown_s=4.0)  # jobs 0-2, then 3-4
    assert [p.name for p in jobs] == ["j0", "j1", "j2", "j3", "j4"]
    assert counted == {"j0", "j1", "j2"}
    jobs, counted = window(plans, 3, 1, 2, warmup=2, cooldown_s=100.0)  # none after j9
    assert [p.name for p in jobs] == ["j5", "j6", "j7", "j8", "j9"]
    assert counted == {"j7", "j8", "j9"}


def test_a_journal_shorter_than_one_sample_is_one_line_before_any_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's 32 jobs against the default --sample of 200 replayed for minutes to
    say "confidence low, score 1.000 +/- 0.000": now it says at once what would help."""
    from agentrt.tune import _search

    path = _record(tmp_path, "react", 6)
    replayed: list[object] = []

    def run(self: object, *args: object) -> object:
        replayed.append(args)
        raise RuntimeError("replayed")

    monkeypatch.setattr(_search.Twin, "run", run)
    out = tmp_path / "t.toml"
    assert main(["tune", str(path), "--out", str(out), "--sample", "8"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("agentrt: error: "), err
    assert "6 jobs" in err and "8" in err and "--sample" in err and "--force" in err
    assert "record more jobs" in err
    assert not replayed and not out.exists()
    # --force replays what there is, as before
    monkeypatch.setenv("AGENTRT_TRACEBACK", "1")  # (the spy's error raised, not printed)
    with pytest.raises(RuntimeError, match="replayed"):
        main(["tune", str(path), "--out", str(out), "--sample", "8", "--force"])
    assert replayed


def test_tune_behind_a_gateway_replays_every_setting_behind_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _record(tmp_path, "react", 6)
    out = tmp_path / "tuned.toml"
    args = ["tune", str(path), "--out", str(out), "--sample", "4", "--seeds", "1"]
    assert main([*args, "--workers", "1", "--top", "1", "--gateway", "vllm-router"]) == 0
    text = capsys.readouterr().out
    assert "behind vllm-router:cache_aware" in text and "vllm-router" in text
    assert tomllib.loads(out.read_text())["routing"]
    assert main([*args, "--gateway", "nginx"]) == 2
    assert "unknown gateway 'nginx'" in capsys.readouterr().err


def test_the_twin_behind_a_gateway_sends_every_call_through_it() -> None:
    from agentrt.tune._search import Twin

    twin = Twin([], PRESETS["h100-8b"], 2, 1, 1, lambda: None, gateway="vllm-router:round_robin")
    cfg = twin._cfg("agentrt:session")
    assert cfg.clients == ("agentrt:session>vllm-router:round_robin",)
