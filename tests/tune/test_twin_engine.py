"""The twin replays ``concurrency="engine"`` as Runtime's adaptive cap (the client polls
the replicas' metrics), not as no cap; a journal's ``"engine"`` without polling never
capped and is replayed as no cap; the file tune writes polls beside ``"engine"``."""

from __future__ import annotations

import json
from pathlib import Path

from agentrt import Runtime
from agentrt.bench import ClientSpec
from agentrt.bench._drivers import ENGINE_POLL_S
from agentrt.bench._runner import ClientRun, prepare, replay_part
from agentrt.sim import PRESETS
from agentrt.tune import TuneResult
from agentrt.tune._fit import Fit
from agentrt.tune._search import Setting, TwinConfig
from agentrt.tune._workload import runtime_defaults


def test_engine_is_the_adaptive_cap_in_the_twin() -> None:
    engine = Setting(concurrency="engine")
    spec = ClientSpec.parse(engine.spec())
    assert spec.concurrency == "engine"
    assert ClientSpec.parse(Setting(concurrency=None).spec()).concurrency is None
    assert ClientSpec.parse("agentrt:session+mlfq@engine").concurrency == "engine"
    assert engine.runtime_kwargs()["poll_metrics_s"] == ENGINE_POLL_S
    assert "poll_metrics_s" not in Setting(concurrency="auto").runtime_kwargs()


def test_engine_without_polling_is_replayed_as_no_cap() -> None:
    # Runtime's defaults ("engine", no polling) never cap: the same as no limit.
    assert Setting.of(runtime_defaults()).concurrency is None
    assert Setting.of({"concurrency": "engine", "poll_metrics_s": None}).concurrency is None
    polled = Setting.of({"concurrency": "engine", "poll_metrics_s": 0.5})
    assert polled.concurrency == "engine"


def _queued_s(journal: Path) -> float:
    return sum(json.loads(line)["queue_s"] for line in journal.read_text().splitlines())


def test_an_engine_replay_caps_an_overloaded_cluster(tmp_path: Path) -> None:
    """One replica of 4-sequence batches and 16 jobs at once: with ``@engine`` the
    engine's queue is seen and calls wait in agentrt's queue (in the policy's order);
    with no limit none ever does. The cap is the engine's batch and more, so it does not
    throttle the engine: the makespan stays about the same. Virtual time: deterministic."""
    clients = ("agentrt:session+mlfq", "agentrt:session+mlfq@engine")
    cfg = TwinConfig(
        workload="react",
        jobs=16,
        seed=1,
        replicas=1,
        clients=clients,
        stretch=False,
        api="http",
        journal_dir=tmp_path,
        engine=PRESETS["h100-8b"].replace(max_num_seqs=4),
    )
    plans = prepare(cfg)
    free, capped = (replay_part(cfg, plans, i) for i in range(2))
    assert isinstance(free, ClientRun) and isinstance(capped, ClientRun)
    assert all(r.status == "ok" for r in (*free.results, *capped.results))
    journals = {p.name: p for p in tmp_path.glob("journal-*.jsonl")}
    free_journal = journals["journal-agentrt_session_mlfq.jsonl"]
    capped_journal = journals["journal-agentrt_session_mlfq_engine.jsonl"]
    assert _queued_s(free_journal) == 0.0
    assert _queued_s(capped_journal) > 1.0
    runtime = json.loads(capped_journal.read_text().splitlines()[0])["runtime"]
    assert runtime["concurrency"] == "engine" and runtime["poll_metrics_s"] == ENGINE_POLL_S
    assert capped.makespan < 1.1 * free.makespan


def test_the_file_polls_beside_engine(tmp_path: Path) -> None:
    from agentrt.tune._search import Score

    best = Setting(policy="mlfq", concurrency="engine")
    loads = {1.0: 0.9, 1.5: 0.9, 2.0: 0.9}
    ranked = [Score(best, loads, loads, 1.0, 1.0, 0.9, 0.0, [0.9])]
    recorded = Setting(concurrency=None)
    ranked.append(Score(recorded, loads, loads, 1.0, 1.0, 1.0, 0.0, [1.0]))
    fit = Fit("journal", 1.0, 1.0, 0.0, None, 10)
    result = TuneResult(
        ranked, recorded, True, fit, 10, 10, 1, 1, 1.0, "low", journals=(tmp_path / "j.jsonl",)
    )
    out = tmp_path / "tuned.toml"
    out.write_text(result.to_toml())
    rt = Runtime(["http://127.0.0.1:9/v1"], config=out)
    assert rt._core.settings is not None
    assert rt._core.settings["concurrency"] == "engine"
    assert rt._core.settings["poll_metrics_s"] == ENGINE_POLL_S
    assert Setting.of(rt._core.settings) == best
