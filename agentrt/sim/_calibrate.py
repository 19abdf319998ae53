"""Measuring a real OpenAI-compatible engine to fit the cost model.

:func:`probe_engine` sends probe requests (token-id prompts on ``/v1/completions`` with
``ignore_eos``, so lengths are exact on vLLM) and turns the latencies into
:class:`StepSample` s; :func:`~agentrt.sim.calibrate` fits a :class:`CostModel` to them. Time is
read with ``anyio.current_time()``, so the same probe runs against a real server (wall
clock) and against the embedded engine in virtual time (which is how it is tested).

Script hook, against a running engine::

    python -m agentrt.sim._calibrate --base-url http://127.0.0.1:8000/v1 --model tiny-llama
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict

import anyio
import httpx

from ._cost import CostModel, StepSample, calibrate

__all__ = ["probe_engine"]


async def probe_engine(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    model: str,
    prompt_lengths: Sequence[int] = (16, 128, 512, 1024, 2048),
    decode_batches: Sequence[int] = (1, 4, 16),
    decode_context: int | Sequence[int] = (256, 1536),
    decode_tokens: int = 64,
    repeats: int = 3,
    chunk: int = 0,
    vocab_size: int = 8000,
    seed: int = 0,
) -> list[StepSample]:
    """Measure prefill and decode steps of an idle engine at ``base_url``.

    - prefill: one request at a time, ``max_tokens=1``; its latency is the prefill of the
      prompt (in chunks of ``chunk`` tokens, 0: one step), median of ``repeats``;
    - decode: ``b`` requests at once for each ``b`` in ``decode_batches``; the extra
      latency of ``decode_tokens`` more output tokens, per token, is one decode step of
      ``b`` sequences (median of ``repeats``), at each prompt length in
      ``decode_context`` (two or more tell the per-sequence and per-context-token costs
      apart).

    Prompts are random token ids below ``vocab_size`` (seeded), so prefix caching does not
    hit. The engine must be otherwise idle.
    """
    rng = random.Random(seed)
    url = base_url.rstrip("/") + "/completions"

    def prompt(n: int) -> list[int]:
        return [rng.randrange(10, vocab_size) for _ in range(n)]

    samples: list[StepSample] = []
    for p in prompt_lengths:
        times: list[float] = []
        for _ in range(repeats):
            body = {"model": model, "prompt": prompt(p), "max_tokens": 1, "ignore_eos": True}
            t0 = anyio.current_time()
            r = await client.post(url, json=body)
            r.raise_for_status()
            times.append(anyio.current_time() - t0)
        samples.append(StepSample.prefill(p, statistics.median(times), chunk=chunk))

    contexts = [decode_context] if isinstance(decode_context, int) else list(decode_context)

    async def batch(b: int, tokens: int, context: int) -> float:
        """Median latency of ``b`` concurrent requests of ``tokens`` output tokens."""
        lat: list[float] = []

        async def one() -> None:
            body = {
                "model": model,
                "prompt": prompt(context),
                "max_tokens": tokens,
                "ignore_eos": True,
            }
            t0 = anyio.current_time()
            r = await client.post(url, json=body)
            r.raise_for_status()
            lat.append(anyio.current_time() - t0)

        async with anyio.create_task_group() as tg:
            for _ in range(b):
                tg.start_soon(one)
        return statistics.median(lat)

    # One decode step of b sequences: the extra latency of ``decode_tokens`` more output
    # tokens, per token. Whole-request latencies are used because servers coalesce
    # streamed tokens into bursts, which makes inter-chunk gaps meaningless.
    short = max(1, decode_tokens // 4)
    # Two context lengths at least, so that the per-sequence and per-context-token costs
    # can be told apart.
    for context in contexts:
        for b in decode_batches:
            diffs = []
            for _ in range(repeats):
                long = await batch(b, short + decode_tokens, context)
                diffs.append(long - await batch(b, short, context))
            per_step = statistics.median(diffs) / decode_tokens
            if per_step > 0:
                mid_ctx = context + short + decode_tokens / 2
                samples.append(StepSample.decode(b, b * mid_ctx, per_step))
    return samples


async def _main_async(args: argparse.Namespace) -> CostModel:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        samples = await probe_engine(
            client,
            args.base_url,
            model=args.model,
            prompt_lengths=[int(x) for x in args.prompt_lengths.split(",")],
            decode_batches=[int(x) for x in args.batches.split(",")],
            decode_context=[int(x) for x in args.context.split(",")],
            decode_tokens=args.tokens,
            repeats=args.repeats,
            chunk=args.chunk,
            vocab_size=args.vocab,
        )
    for s in samples:
        sys.stderr.write(f"{s}\n")
    return calibrate(samples)


def main(argv: Sequence[str] | None = None) -> int:
    """Probe an engine and print the fitted :class:`CostModel` as JSON."""
    ap = argparse.ArgumentParser(description="Fit the agentrt.sim cost model to a live engine.")
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-lengths", default="16,128,512,1024,2048")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--context", default="256,1536", help="decode context lengths")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=0, help="the engine's prefill chunk (0: none)")
    ap.add_argument("--vocab", type=int, default=8000)
    args = ap.parse_args(argv)
    model = anyio.run(_main_async, args)
    sys.stdout.write(json.dumps(asdict(model), indent=2) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
