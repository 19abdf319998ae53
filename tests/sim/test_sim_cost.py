"""The cost model, its presets, and fitting it to measurements."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import httpx
import pytest

from agentrt.sim import (
    PRESETS,
    Cluster,
    CostModel,
    EngineConfig,
    StepSample,
    calibrate,
    probe_engine,
)
from agentrt.sim._calibrate import main as calibrate_main
from tests.sim._helpers import virtual_backend

TRUE = CostModel(
    step_s=4e-3,
    prefill_token_s=25e-6,
    decode_seq_s=150e-6,
    decode_context_token_s=40e-9,
    prefill_pair_s=2e-9,
)


def test_step_formula() -> None:
    c = TRUE
    assert c.step_seconds() == c.step_s
    t = c.step_seconds(
        prefill_tokens=100, decode_seqs=3, decode_context_tokens=900, prefill_pairs=5050
    )
    assert t == pytest.approx(4e-3 + 100 * 25e-6 + 3 * 150e-6 + 900 * 40e-9 + 5050 * 2e-9)
    # chunked prefill: attention of later chunks covers the earlier ones
    one = c.prefill_seconds(1000)
    chunks = c.prefill_seconds(1000, chunk=250)
    assert chunks == pytest.approx(one + 3 * c.step_s)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(CostModel)])
def test_cost_model_rejects_negative_or_nan(field: str) -> None:
    values = dataclasses.asdict(TRUE)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=field):
            CostModel(**{**values, field: bad})
    with pytest.raises(TypeError):
        CostModel(**{**values, field: "1"})


def test_presets() -> None:
    assert set(PRESETS) == {"h100-8b", "cpu-tiny"}
    h100 = PRESETS["h100-8b"]
    # about 150 tokens/s for one stream, a 2k-token prompt in about 0.1 s
    itl = h100.cost.step_seconds(decode_seqs=1, decode_context_tokens=2000)
    assert 5e-3 < itl < 8e-3
    assert 0.05 < h100.cost.prefill_seconds(2048) < 0.15
    assert h100.num_gpu_blocks * h100.block_size > 400_000  # ~52 GB of KV at 128 KiB/token
    tiny = PRESETS["cpu-tiny"]
    assert tiny.block_size == 128 and tiny.max_model_len == 4096
    with pytest.raises(TypeError):
        PRESETS["x"] = h100  # type: ignore[index]


def test_calibrate_recovers_a_linear_model() -> None:
    rng = random.Random(3)
    samples = []
    for _ in range(40):
        steps = rng.randint(1, 4)
        p = rng.choice([0, rng.randint(1, 4000)])
        d = rng.randint(0, 64)
        ctx = d * rng.randint(10, 3000)
        pairs = p * p / 2 + p * rng.randint(0, 2000)
        secs = (
            steps * TRUE.step_s
            + p * TRUE.prefill_token_s
            + d * TRUE.decode_seq_s
            + ctx * TRUE.decode_context_token_s
            + pairs * TRUE.prefill_pair_s
        )
        samples.append(StepSample(steps, p, d, ctx, pairs, secs))
    fit = calibrate(samples)
    for f in dataclasses.fields(CostModel):
        assert getattr(fit, f.name) == pytest.approx(getattr(TRUE, f.name), rel=1e-6), f.name


def test_calibrate_clamps_at_zero_and_needs_samples() -> None:
    # decode-only samples say nothing about prefill: those coefficients come out 0
    samples = [
        StepSample.decode(b, b * 500, 5e-3 + b * 1e-4 + b * 501 * 1e-8) for b in (1, 2, 4, 8)
    ]
    fit = calibrate(samples)
    assert fit.prefill_token_s == 0 and fit.prefill_pair_s == 0
    assert fit.step_seconds(decode_seqs=3, decode_context_tokens=3 * 501) == pytest.approx(
        5e-3 + 3e-4 + 3 * 501e-8, rel=1e-3
    )
    with pytest.raises(ValueError, match="at least 2"):
        calibrate(samples[:1])
    with pytest.raises(ValueError, match="> 0"):
        calibrate([*samples, StepSample(1, 0, 0, 0, 0, 0.0)])


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [virtual_backend()])
async def test_probe_and_calibrate_against_the_simulator(anyio_backend: Any) -> None:
    """The probe measures the simulator in virtual time and recovers its cost model."""
    cfg = EngineConfig(cost=TRUE, block_size=16, num_gpu_blocks=20_000, model_name="probe")
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        samples = await probe_engine(
            http,
            cluster.base_urls[0],
            model="probe",
            prompt_lengths=(32, 500, 2000, 6000),
            decode_batches=(1, 4, 16),
            repeats=1,
        )
    fit = calibrate(samples)
    # prefill: exact; decode: the probe approximates the context by its mean, so close
    for p in (100, 3000):
        assert fit.prefill_seconds(p) == pytest.approx(TRUE.prefill_seconds(p), rel=0.02)
    for b in (1, 8):
        ctx = b * 300
        assert fit.step_seconds(decode_seqs=b, decode_context_tokens=ctx) == pytest.approx(
            TRUE.step_seconds(decode_seqs=b, decode_context_tokens=ctx), rel=0.02
        )


def test_calibrate_script_needs_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        calibrate_main([])
    assert "--base-url" in capsys.readouterr().err
