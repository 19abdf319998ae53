"""The Claude Code trace loader reads only the blocks a replay keeps, with the results of
parsing every block list as JSON (issue 18: loading the 710 traces took 19 s of CPU)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from agentrt.bench import TraceOptions
from agentrt.bench._plan import BLOCK_TOKENS, Fanout, SessionPlan
from agentrt.bench._workloads import claude_code_jobs


def _reference(requests: list[dict[str, Any]], scale: float) -> list[Any]:
    """Each call's blocks as the loader computed them before, from fully parsed JSON."""
    out: list[Any] = []
    for req in requests:
        if req.get("type") == "subagent":
            out.append(_reference(req.get("requests") or [], scale))
            continue
        hashes = req.get("hash_ids") or []
        keep = min(len(hashes), max(1, round(len(hashes) * scale))) if hashes else 0
        out.append(tuple(int(h) for h in hashes[:keep]))
    return out


def _blocks(session: SessionPlan) -> list[Any]:
    out: list[Any] = []
    for step in session.steps:
        if isinstance(step, Fanout):
            out.extend(_blocks(s) for s in step.sessions)
        else:
            out.append(step.blocks)
    return out


def _flatten(items: list[Any]) -> list[Any]:
    return [x for i in items for x in (_flatten(i) if isinstance(i, list) else [i])]


REQUESTS: list[dict[str, Any]] = [
    {"type": "n", "in": 900, "out": 10, "hash_ids": list(range(1, 13)), "think_time": 1.5},
    # The context grows: the kept blocks of the last call are reused.
    {"type": "s", "in": 1300, "out": 5, "hash_ids": list(range(1, 21)), "stop": "tool_use"},
    # It shrinks (compaction) and changes: read afresh.
    {"type": "n", "in": 300, "out": 5, "hash_ids": [1, 2, 30, 31, 32]},
    # A number that extends the previous kept block's digits (3 -> 31): no false reuse.
    {"type": "n", "in": 300, "out": 5, "hash_ids": [1, 2, 301, 31, 32, 33, 34, 35]},
    {"type": "n", "in": 10, "out": 1, "hash_ids": []},
    {"type": "n", "in": 10, "out": 1},
    {"type": "n", "in": 10, "out": 1, "hash_ids": None},
    # Not all integers: parsed as JSON, as before.
    {"type": "n", "in": 200, "out": 1, "hash_ids": [1.0, 2.0, 7.0, 9.0]},
    {"type": "n", "in": 200, "out": 1, "hash_ids": [-4, 0, 12345678901234567890]},
    {
        "type": "subagent",
        "agent_id": "a1",
        "requests": [
            {"type": "n", "in": 500, "out": 3, "hash_ids": [40, 41, 42, 43, 44, 45, 46, 47]},
            {"type": "n", "in": 600, "out": 3, "hash_ids": [40, 41, 42, 43, 44, 45, 46, 47, 48]},
        ],
    },
    {"type": "n", "in": 1300, "out": 5, "hash_ids": list(range(1, 24)), "stop": "end_turn"},
]


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("scale", [0.25, 0.5, 1.0, 0.01])
def test_kept_blocks_match_a_full_json_parse(tmp_path: Path, compact: bool, scale: float) -> None:
    seps = (",", ":") if compact else (", ", ": ")
    data = {"tool_tokens": 64, "system_tokens": 64, "requests": REQUESTS}
    with gzip.open(tmp_path / "trace_0001.json.gz", "wt") as f:
        f.write(json.dumps(data, separators=seps))
    (root,) = claude_code_jobs(TraceOptions(directory=tmp_path, token_scale=scale))
    assert _flatten(_blocks(root)) == _flatten(_reference(REQUESTS, scale))
    # Not reading the lists fully changes nothing else: the tails follow the kept blocks.
    calls = [s for s in root.steps if not isinstance(s, Fanout)]
    assert calls[0].tail_tokens == min(
        BLOCK_TOKENS - 1, max(0, round(900 * scale) - len(calls[0].blocks) * BLOCK_TOKENS)
    )
    assert calls[1].stream and calls[2].tool == "tool"


def test_a_list_with_strings_or_nested_lists_is_read_as_json(tmp_path: Path) -> None:
    requests = [
        {"type": "n", "in": 10, "out": 1, "hash_ids": ["7", "8"]},
        {"type": "n", "in": 10, "out": 1, "hash_ids": [[1], [2]], "note": '"hash_ids": [1'},
    ]
    with gzip.open(tmp_path / "trace_0001.json.gz", "wt") as f:
        f.write(json.dumps({"requests": requests[:1]}))
    (root,) = claude_code_jobs(TraceOptions(directory=tmp_path, token_scale=1.0))
    assert _blocks(root) == [(7, 8)]
    with gzip.open(tmp_path / "trace_0001.json.gz", "wt") as f:
        f.write(json.dumps({"requests": requests[1:]}))
    with pytest.raises(TypeError):  # int([1]) fails, as it did on the parsed JSON
        claude_code_jobs(TraceOptions(directory=tmp_path, token_scale=1.0))


def test_max_context_skips_the_traces_a_context_window_would_refuse(tmp_path: Path) -> None:
    from agentrt.bench._workloads import _longest_call

    for n, longest in enumerate([500, 5_000, 800, 300_000, 900]):
        calls = [
            {"type": "n", "in": 100, "out": 5, "hash_ids": [1]},
            {"type": "n", "in": longest, "out": 5, "hash_ids": list(range(longest // 64))},
        ]
        with gzip.open(tmp_path / f"trace_{n:04d}.json.gz", "wt") as f:
            f.write(json.dumps({"requests": calls}))
    every = claude_code_jobs(TraceOptions(directory=tmp_path))
    assert [_longest_call(s) for s in every] == [505, 5_005, 805, 300_005, 905]
    kept = claude_code_jobs(TraceOptions(directory=tmp_path, limit=3, max_context=1_000))
    assert [_longest_call(s) for s in kept] == [505, 805, 905]  # the next ones fill in
    with pytest.raises(ValueError, match="max_context"):
        claude_code_jobs(TraceOptions(directory=tmp_path, max_context=0))
