"""Measuring a real OpenAI-compatible engine to fit the cost model.

:func:`probe_engine` sends probe requests (token-id prompts on ``/v1/completions`` with
``ignore_eos``, so lengths are exact on vLLM) and turns the latencies into
:class:`StepSample` s; :func:`~agentrt.sim.calibrate` fits a :class:`CostModel` to them. Time is
read with ``anyio.current_time()``, so the same probe runs against a real server (wall
clock) and against the simulator in virtual time (which is how it is tested).

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
    decode_context: int = 256,
    decode_tokens: int = 64,
    repeats: int = 3,
    chunk: int = 0,
    vocab_size: int = 8000,
    seed: int = 0,
) -> list[StepSample]:
    """Measure prefill and decode steps of an idle engine at ``base_url``.

    - prefill: one request at a time, ``max_tokens=1``; its latency is the prefill of the
      prompt (in chunks of ``chunk`` tokens, 0: one step), median of ``repeats``;
    - decode: ``b`` streams at once for each ``b`` in ``decode_batches``; the median
      interval between streamed chunks (one token each) in the middle of the streams is one
      decode step of ``b`` sequences.

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

    async def stream(body: dict[str, object], out: list[float]) -> None:
        async with client.stream("POST", url, json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    doc = json.loads(line[6:])
                    if doc.get("choices"):
                        out.append(anyio.current_time())

    for b in decode_batches:
        arrivals: list[list[float]] = [[] for _ in range(b)]
        async with anyio.create_task_group() as tg:
            for i in range(b):
                body = {
                    "model": model,
                    "prompt": prompt(decode_context),
                    "max_tokens": decode_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
                tg.start_soon(stream, body, arrivals[i])
        gaps: list[float] = []
        lo, hi = decode_tokens // 4, (3 * decode_tokens) // 4
        for times in arrivals:
            gaps.extend(
                t2 - t1 for t1, t2 in zip(times[lo:hi], times[lo + 1 : hi + 1], strict=False)
            )
        if gaps:
            mid_ctx = decode_context + decode_tokens / 2
            samples.append(StepSample.decode(b, b * mid_ctx, statistics.median(gaps)))
    return samples


async def _main_async(args: argparse.Namespace) -> CostModel:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        samples = await probe_engine(
            client,
            args.base_url,
            model=args.model,
            prompt_lengths=[int(x) for x in args.prompt_lengths.split(",")],
            decode_batches=[int(x) for x in args.batches.split(",")],
            decode_context=args.context,
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
    ap.add_argument("--context", type=int, default=256)
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
