"""Client specs with a routing, an ordering policy and admission limits, and a queueing run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentrt.bench import BenchConfig, ClientSpec, run_bench
from agentrt.cli import main


def test_existing_spellings_still_parse() -> None:
    assert ClientSpec.parse("plain").kind == "plain"
    bare = ClientSpec.parse("agentrt")
    assert (bare.name, bare.routing, bare.policy, bare.concurrency) == (
        "agentrt:round-robin",
        "round_robin",
        "fcfs",
        None,
    )
    assert ClientSpec.parse("agentrt:session").routing == "session_affinity"
    assert ClientSpec.parse("agentrt:round-robin").name == "agentrt:round-robin"


@pytest.mark.parametrize(
    ("text", "routing", "policy", "concurrency", "budget", "priority"),
    [
        ("agentrt:plas+round_robin@auto", "round_robin", "plas", "auto", None, False),
        ("agentrt:mlfq@16", "round_robin", "mlfq", 16, None, False),
        ("agentrt:session+atlas@none", "session_affinity", "atlas", None, None, False),
        ("agentrt:hash+edf", "hash", "edf", None, None, False),
        ("agentrt:plas,priority=on", "round_robin", "plas", None, None, True),
        (
            "agentrt:routing=least_loaded,policy=mlfq,concurrency=8,token_budget=50000",
            "least_loaded",
            "mlfq",
            8,
            50_000,
            False,
        ),
    ],
)
def test_new_options_parse(
    text: str,
    routing: str,
    policy: str,
    concurrency: int | str | None,
    budget: int | None,
    priority: bool,
) -> None:
    spec = ClientSpec.parse(text)
    assert spec.name == text and spec.kind == "agentrt"
    assert (spec.routing, spec.policy, spec.concurrency) == (routing, policy, concurrency)
    assert (spec.token_budget, spec.send_priority) == (budget, priority)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("agentrt:fast", "neither a routing nor a policy"),
        ("agentrt:plas+mlfq", "policy given twice"),
        ("agentrt:plas@0", "concurrency must be >= 1"),
        ("agentrt:plas@lots", "concurrency must be an int"),
        ("agentrt:colour=blue", "unknown option 'colour'"),
        ("agentrt:plas,priority=maybe", "priority must be on or off"),
        ("agentrt:token_budget=-3", "token_budget must be >= 1"),
        ("agentrt:routing=nearest", "unknown routing 'nearest'"),
        ("agentrt:plas,8", "not key=value"),
        ("agentrt:", "unknown client"),
        ("openai", "unknown client"),
    ],
)
def test_bad_specs_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        ClientSpec.parse(text)


def test_queueing_policies_complete_in_virtual_time() -> None:
    started = time.perf_counter()
    cfg = BenchConfig(
        workload="react",
        jobs=8,
        replicas=2,
        clients=(
            "agentrt:fcfs+round_robin",
            "agentrt:plas+round_robin@1",
            "agentrt:mlfq+round_robin@auto",
            "agentrt:plas+round_robin,priority=on",
        ),
        stretch=False,
        api="http",
    )
    result = run_bench(cfg)
    assert result.virtual_time
    by = {c.client: c for c in result.clients}
    assert all(c.jobs == 8 and c.failed == 0 for c in result.clients)
    # All eight jobs arrive at once: with one call in flight per replica, calls wait in
    # agentrt's queue, so they take longer than when every call goes out at once.
    capped, free = by["agentrt:plas+round_robin@1"], by["agentrt:fcfs+round_robin"]
    assert capped.call_latency["p50"] > free.call_latency["p50"]
    assert capped.makespan_s > free.makespan_s
    # Priorities reach replicas that schedule by priority (a non-zero priority is a 400
    # error on an FCFS replica): every job completed above.
    assert time.perf_counter() - started < 10


def test_cli_rejects_bad_specs_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--client", "agentrt:plas@0", "--jobs", "1"]) == 2
    assert "concurrency must be >= 1" in capsys.readouterr().err


def _journal_runtime(path: Path) -> dict[str, object]:
    """The settings the runtime of a bench journal's first job ran with."""
    first = json.loads(path.read_text().splitlines()[0])
    runtime = first["runtime"]
    assert isinstance(runtime, dict)
    return runtime


def test_a_settings_file_decides_the_bench_client(tmp_path: Path) -> None:
    """``agentrt:config=FILE``: the runtime runs with the file's settings (Runtime's
    defaults where it is silent), as where the file is applied."""
    tuned = tmp_path / "tuned.toml"
    tuned.write_text('routing = "least_loaded"\npolicy = "plas"\nconcurrency = 3\n')
    text = f"agentrt:config={tuned}"
    spec = ClientSpec.parse(text)
    assert (spec.name, spec.config) == (text, str(tuned))
    assert (spec.routing, spec.policy, spec.concurrency) == ("least_loaded", "plas", 3)
    assert ClientSpec.parse(f"{text},declare=oracle").declare == "oracle"
    same = "agentrt:least_loaded+plas@3,poll=auto"  # the same settings as spec options
    cfg = BenchConfig(
        workload="react",
        jobs=4,
        replicas=2,
        clients=(text, same),
        stretch=False,
        api="http",
        journal_dir=tmp_path,
    )
    result = run_bench(cfg, workers=1)
    client, twin = result.clients
    assert client.client == text and client.jobs == 4 and client.failed == 0
    # Virtual time: the same settings replay the same jobs alike (within 2%: with the
    # engines' metrics polled, as Runtime's defaults do, the two runtimes' polls and
    # routing ties fall differently).
    assert client.jct["mean"] == pytest.approx(twin.jct["mean"], rel=0.02)
    assert client.makespan_s == pytest.approx(twin.makespan_s, rel=0.02)
    assert client.journal is not None
    runtime = _journal_runtime(Path(client.journal))
    assert (runtime["routing"], runtime["policy"], runtime["concurrency"]) == (
        "least_loaded",
        "plas",
        3,
    )
    # What the file does not set is Runtime's default, not the bench spec's.
    assert runtime["send_priority"] == "auto" and runtime["learn_waits"] is True


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ("policy=mlfq", "config= sets policy from the file"),
        ("concurrency=4", "config= sets concurrency from the file"),
        ("priority=on", "config= sets priority from the file"),
        ("token_budget=100", "config= sets token_budget from the file"),
    ],
)
def test_a_settings_file_and_options_do_not_mix(tmp_path: Path, options: str, why: str) -> None:
    tuned = tmp_path / "tuned.toml"
    tuned.write_text('policy = "plas"\n')
    with pytest.raises(ValueError, match=why):
        ClientSpec.parse(f"agentrt:config={tuned},{options}")
    with pytest.raises(ValueError, match="config= sets routing"):
        ClientSpec.parse(f"agentrt:session,config={tuned}")


def test_a_bad_settings_file_is_one_line_before_any_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "gone.toml"
    assert main(["bench", "--client", f"agentrt:config={gone}", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "gone.toml" in err and "not found" in err, err
    bad = tmp_path / "bad.toml"
    bad.write_text('policy = "fastest"\n')
    out = tmp_path / "out"
    args = ["bench", "--client", f"agentrt:config={bad}", "--jobs", "1", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "bad.toml" in err and "fastest" in err, err
    assert not out.exists() or not any(out.iterdir())  # nothing ran


def test_replicas_scheduling_is_a_spec_option_even_with_defaults() -> None:
    """``scheduling=`` sets the embedded replicas' queue order; it is the only option
    ``agentrt:defaults`` takes (it is the replicas', not the runtime's)."""
    spec = ClientSpec.parse("agentrt:defaults,scheduling=priority")
    assert spec.defaults and spec.scheduling == "priority" and not spec.send_priority
    assert ClientSpec.parse("agentrt:defaults").scheduling is None
    behind = ClientSpec.parse("agentrt:defaults,scheduling=priority>llm-d")
    assert behind.scheduling == "priority" and behind.gateway == "llm-d"
    assert ClientSpec.parse("agentrt:plas,scheduling=fcfs").scheduling == "fcfs"
    with pytest.raises(ValueError, match="scheduling must be fcfs or priority"):
        ClientSpec.parse("agentrt:defaults,scheduling=lifo")
    with pytest.raises(ValueError, match="give no other option with it"):
        ClientSpec.parse("agentrt:defaults,scheduling=priority,policy=plas")


def test_kv_events_is_a_spec_option_even_with_defaults() -> None:
    """``kv_events=on``: the runtime reads the embedded replicas' KV-cache events."""
    spec = ClientSpec.parse("agentrt:defaults,kv_events=on")
    assert spec.defaults and spec.kv_events
    assert not ClientSpec.parse("agentrt:defaults").kv_events
    assert ClientSpec.parse("agentrt:session,kv_events=off").kv_events is False
    with pytest.raises(ValueError, match="kv_events must be on or off"):
        ClientSpec.parse("agentrt:defaults,kv_events=maybe")
