"""The twin's KV capacity: ``agentrt tune --gpu-blocks`` (and ``--host-blocks``) sets
the blocks of each replayed replica, ``--endpoint`` reads them from vLLM's
``vllm:cache_config_info`` gauge (the embedded engine serves it too, on loopback here),
an explicit ``--gpu-blocks`` wins, and bad values are one line."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from agentrt.bench._runner import ClientRun, prepare, replay_part
from agentrt.cli import main
from agentrt.sim import PRESETS, serve_async
from agentrt.tune import tune
from agentrt.tune._command import TuneOptions, kv_capacity
from agentrt.tune._fit import parse_cache_config, read_cache_config
from agentrt.tune._search import TwinConfig
from tests.tune._helpers import record_journal

H100 = PRESETS["h100-8b"]


def _opts(**kw: object) -> TuneOptions:
    return TuneOptions(journals=(Path("j.jsonl"),), **kw)  # type: ignore[arg-type]


def _replay(engine: object, tmp: Path) -> ClientRun:
    cfg = TwinConfig(
        workload="react",
        jobs=8,
        rate=4.0,
        seed=3,
        replicas=1,
        clients=("agentrt:session",),
        stretch=False,
        api="http",
        engine=engine,  # type: ignore[arg-type]
    )
    run = replay_part(cfg, prepare(cfg), 0)
    assert isinstance(run, ClientRun)
    assert all(r.status == "ok" for r in run.results)
    return run


def test_gpu_blocks_reach_the_replayed_engine(tmp_path: Path) -> None:
    """The twin built from ``--gpu-blocks 600`` replays on 600 blocks: the same jobs
    that fit the preset's 26,624 blocks now evict cached blocks, lose prefix hits and
    run slower."""
    engine, line = kv_capacity(_opts(gpu_blocks=600, host_blocks=50), H100)
    assert (engine.num_gpu_blocks, engine.num_host_blocks) == (600, 50)
    assert "600 + 50 host blocks of 16 tokens" in line and "--gpu-blocks" in line
    cfg = TwinConfig(clients=("agentrt:session",), engine=engine)
    assert cfg.engine_config().num_gpu_blocks == 600
    roomy = _replay(H100, tmp_path)
    tight = _replay(engine.replace(num_host_blocks=0), tmp_path)
    assert roomy.kv["gpu_blocks"] == H100.num_gpu_blocks and tight.kv["gpu_blocks"] == 600
    assert roomy.kv["evicted_blocks"] == 0.0
    assert tight.kv["evicted_blocks"] > 0.0
    assert tight.kv["prefix_cache_hits"] < 0.8 * roomy.kv["prefix_cache_hits"]
    assert tight.makespan > roomy.makespan


def test_other_block_sizes_are_converted() -> None:
    engine, line = kv_capacity(_opts(gpu_blocks=100, block_size=128), H100)
    assert engine.num_gpu_blocks == 800  # 12,800 tokens in 16-token blocks
    assert "converted" in line


def test_without_a_capacity_the_preset_is_kept_and_said() -> None:
    engine, line = kv_capacity(_opts(), H100)
    assert engine == H100
    assert "26,624" in line and "preset" in line and "--gpu-blocks" in line
    assert all(len(row) <= 80 for row in line.splitlines())


def test_the_gauge_is_parsed_as_vllm_writes_it() -> None:
    page = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
        'num_gpu_blocks="None"} 1.0\n'
        'vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="1",'
        'num_cpu_blocks="0",num_gpu_blocks="2048"} 1.0\n'
    )
    info = parse_cache_config(page)
    assert info is not None and (info.gpu_blocks, info.block_size) == (2048, 32)
    assert parse_cache_config('vllm:num_requests_running{engine="0"} 1.0\n') is None


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_the_endpoint_s_capacity_is_read_from_its_metrics(anyio_backend: str) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    served = PRESETS["cpu-tiny"].replace(num_gpu_blocks=300)  # 128-token blocks
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, served)
        info = await anyio.to_thread.run_sync(read_cache_config, urls[0])
        probed = _opts(endpoint=urls[0])
        engine, line = await anyio.to_thread.run_sync(kv_capacity, probed, H100)
        told = _opts(endpoint=urls[0], gpu_blocks=1000)
        explicit, _ = await anyio.to_thread.run_sync(kv_capacity, told, H100)
        tg.cancel_scope.cancel()
    assert info is not None and (info.gpu_blocks, info.block_size) == (300, 128)
    assert engine.num_gpu_blocks == 300 * 128 // 16
    assert "metrics" in line and "converted" in line
    assert explicit.num_gpu_blocks == 1000  # --gpu-blocks wins


def test_an_endpoint_without_the_gauge_keeps_the_preset() -> None:
    # Nothing listens on port 9: no metrics, no gauge.
    engine, line = kv_capacity(_opts(endpoint="http://127.0.0.1:9/v1"), H100)
    assert engine.num_gpu_blocks == H100.num_gpu_blocks
    assert "no vllm:cache_config_info" in line


def test_tune_says_and_writes_the_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = record_journal(tmp_path, "react", 4, replicas=1)
    out = tmp_path / "tuned.toml"
    args = ["tune", str(journal), "--out", str(out), "--sample", "2", "--seeds", "1"]
    assert main([*args, "--top", "1", "--workers", "1", "--gpu-blocks", "4096"]) == 0
    text = capsys.readouterr().out
    assert all(len(line) <= 80 for line in text.splitlines() if str(out) not in line), text
    assert "kv: 4,096 blocks of 16 tokens per replica, from --gpu-blocks" in text
    assert "# twin kv: 4,096 blocks" in out.read_text()


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--gpu-blocks", "0", "--gpu-blocks must be positive"),
        ("--gpu-blocks", "-5", "--gpu-blocks must be positive"),
        ("--gpu-blocks", "lots", "invalid int value"),
        ("--host-blocks", "0", "--host-blocks must be positive"),
    ],
)
def test_bad_capacities_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, needle: str
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("")
    try:
        code = main(["tune", str(path), option, value])
    except SystemExit as exc:  # argparse's own errors (a value that is no number)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("blocks", [0, -1, True])
def test_bad_capacities_are_refused_before_the_journals_are_read(blocks: int) -> None:
    # (the journal does not exist: the capacity is refused first)
    with pytest.raises(ValueError, match="--gpu-blocks must be a whole number"):
        tune("j.jsonl", gpu_blocks=blocks)
