"""How long `import agentrt` and the first `Runtime` take, and where the time goes.

Each figure is the median of ``--runs`` fresh interpreters (wall and CPU seconds):
``import agentrt``; entering the first ``Runtime`` (which imports openai, httpx and the
HTTP stack); and, for comparison, ``import openai`` alone in its own interpreter (the part
no openai user avoids). Writes ``--out`` (JSON) and prints a table.

    python -m benchmarks load startup                 # 7 runs each
    python -m benchmarks load startup --runs 15 --out results/first_use.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from ._harness import add_run_args, write_result

_FIRST_USE = """
import json, time
w0, c0 = time.perf_counter(), time.process_time()
import agentrt, anyio
w1, c1 = time.perf_counter(), time.process_time()

async def main():
    w2, c2 = time.perf_counter(), time.process_time()
    async with agentrt.Runtime(["http://127.0.0.1:9/v1"]):
        w3, c3 = time.perf_counter(), time.process_time()
    return {"import_wall": w1 - w0, "import_cpu": c1 - c0,
            "runtime_wall": w3 - w2, "runtime_cpu": c3 - c2}

print(json.dumps(anyio.run(main)))
"""

_OPENAI = """
import json, time
w0, c0 = time.perf_counter(), time.process_time()
import openai
print(json.dumps({"openai_wall": time.perf_counter() - w0, "openai_cpu": time.process_time() - c0}))
"""


def _run(code: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(runs: int) -> dict[str, Any]:
    """The medians over ``runs`` fresh interpreters of each figure."""
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        for code in (_FIRST_USE, _OPENAI):
            for key, value in _run(code).items():
                samples.setdefault(key, []).append(value)
    return {
        "runs": runs,
        "median_s": {k: round(statistics.median(v), 4) for k, v in samples.items()},
        "samples_s": {k: [round(x, 4) for x in v] for k, v in samples.items()},
    }


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--runs", type=int, default=7)
    add_run_args(ap, out="first_use.json")


def main(args: argparse.Namespace) -> dict[str, Any]:
    result = measure(args.runs)
    m = result["median_s"]
    print(f"{'':<28}{'wall s':>8}{'CPU s':>8}")
    for label, key in (
        ("import agentrt", "import"),
        ("first Runtime (enter)", "runtime"),
        ("import openai (alone)", "openai"),
    ):
        print(f"{label:<28}{m[key + '_wall']:>8.3f}{m[key + '_cpu']:>8.3f}")
    write_result(args.out, result, __doc__)
    print(f"results: {args.out}")
    return result
