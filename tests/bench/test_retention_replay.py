"""What a retention directive buys, measured in the twin: the same KV-pressure replay on
replicas that honour directives and on replicas that do not (plain LRU, as released vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrt.bench import BenchConfig, run_bench


def _uncached(seed: int, honour: bool) -> tuple[int, int]:
    cfg = BenchConfig(
        workload="react-longtail",
        jobs=40,
        rate=0.5,
        seed=seed,
        replicas=2,
        clients=["agentrt:session,declare=oracle"],
        stretch=False,
        api="http",
        gpu_blocks=8192,
        retention_directives=honour,
    )
    result = run_bench(cfg)
    assert result.config["retention_directives"] is honour
    client = result.clients[0]
    assert client.failed == 0 and client.replicas is not None and client.kv is not None
    applied = int(client.kv["directives_retained"] + client.kv["directives_ended"])
    return sum(int(r["prefill_tokens"]) for r in client.replicas), applied


@pytest.mark.parametrize("seed", [0, 1])
def test_honouring_directives_prefills_fewer_uncached_tokens(seed: int) -> None:
    """Declared tool waits and session ends (``declare=oracle``: ``expect_idle`` and
    ``expect_final``), 40 long-tailed tool loops on 2 replicas of 8,192 blocks: replicas
    that honour the directives prefill at most 0.9x the uncached tokens of LRU replicas
    (measured 0.68-0.83x over seeds 0-3)."""
    lru, applied_lru = _uncached(seed, False)
    honour, applied = _uncached(seed, True)
    assert applied_lru == 0 and applied > 100
    assert honour <= 0.9 * lru, (honour, lru, honour / lru)


def test_cli_runs_replicas_that_honour_directives(tmp_path: Path) -> None:
    from agentrt.cli import main

    rc = main(
        [
            *("bench", "--workload", "react-longtail", "--jobs", "2", "--replicas", "1"),
            *("--client", "agentrt:session,declare=oracle", "--retention-directives"),
            *("--no-stretch", "--no-plots", "--no-journal", "--out", str(tmp_path)),
        ]
    )
    assert rc == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"]["retention_directives"] is True
    kv = data["clients"][0]["kv"]
    assert kv["directives_ended"] == 2 and kv["directives_retained"] > 0


def test_sim_serve_config_takes_the_switch() -> None:
    """``agentrt sim serve --retention-directives`` builds replicas that honour them."""
    from agentrt.cli import _parser

    args = _parser().parse_args(["sim", "serve", "--retention-directives"])
    assert args.retention_directives is True


def test_retention_is_a_per_client_option_beside_the_same_client_without_it() -> None:
    """``retention=on`` gives one client replicas that honour directives, side by side in
    one run with the same client on LRU replicas; ``agentrt:defaults`` takes it (it is the
    replicas', not the runtime's)."""
    from agentrt.bench._drivers import ClientSpec

    spec = ClientSpec.parse("agentrt:defaults,retention=on")
    assert spec.defaults and spec.retention and spec.routing == "session_affinity"
    with pytest.raises(ValueError, match="retention must be on or off"):
        ClientSpec.parse("agentrt:session,retention=maybe")
    cfg = BenchConfig(
        workload="react-longtail",
        jobs=12,
        rate=0.5,
        seed=0,
        replicas=2,
        clients=["agentrt:session,declare=oracle", "agentrt:session,declare=oracle,retention=on"],
        stretch=False,
        api="http",
        gpu_blocks=8192,
    )
    lru, honour = run_bench(cfg).clients
    assert lru.kv is not None and honour.kv is not None
    assert lru.kv["directives_retained"] + lru.kv["directives_ended"] == 0
    assert honour.kv["directives_ended"] == 12 and honour.kv["directives_retained"] > 0
