"""What a journal line carries for a replay (issue 19): idle and its cause, the session
tree, the arrival, the runtime's settings, and the prefix-sharing fingerprints. Against
the embedded engine in process, on asyncio and trio."""

from __future__ import annotations

import itertools
from pathlib import Path

import anyio
import pytest

from agentrt import Runtime
from agentrt.sim import Cluster
from agentrt.telemetry import read_journal
from agentrt.telemetry._prefix import BLOCK_BYTES, PrefixTracker
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio

SYSTEM = " ".join(f"rule{i} the agent must follow carefully" for i in range(200))
"""A system prompt of about 7 KiB, shared by every session."""


def _messages(history: list[str]) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}] + [
        {"role": "user", "content": text} for text in history
    ]


async def test_a_journal_line_holds_what_a_replay_needs(tmp_path: Path) -> None:
    journal = tmp_path / "runs.jsonl"
    async with Cluster(2, small_config(num_gpu_blocks=20_000)) as cluster:
        async with Runtime(
            list(cluster.base_urls),
            transport=cluster.transport(),
            journal=journal,
            policy="plas",
            concurrency=4,
        ) as rt:
            client = rt.openai()
            await anyio.sleep(0.5)
            async with rt.job("agent") as job:
                async with job.session("main") as main:
                    history = ["first question " * 200]
                    await main.chat(model="m", messages=_messages(history), max_tokens=4)
                    async with main.tool("grep"):
                        await anyio.sleep(0.05)
                    history.append("tool result " * 300)
                    await main.chat(model="m", messages=_messages(history), max_tokens=4)
                    async with job.session("sub", parent=main) as sub:
                        await sub.chat(
                            model="m", messages=_messages(["sub task " * 100]), max_tokens=4
                        )
                    history.append("sub-agent result " * 100)
                    await main.chat(model="m", messages=_messages(history), max_tokens=4)
                    await anyio.sleep(0.05)
                    history.append("the user again " * 50)
                    await client.chat.completions.create(
                        model="m", messages=_messages(history), max_tokens=4
                    )
    (report,) = read_journal(journal)
    assert report.arrival_s is not None and report.arrival_s >= 0.5
    runtime = dict(report.runtime or {})
    # Whose load routing compared when the job ended (the polls' answers so far), and
    # which runtime wrote the line (a fleet's journals tell their processes apart).
    assert runtime.pop("load_view") in ("engine", "local", "mixed")
    assert len(runtime.pop("runtime_id")) == 12
    # What placement assumed of each replica's KV (the simulated replicas' gauge).
    capacities = runtime.pop("kv_capacity")
    assert len(capacities) == 2 and all(c is None or c > 0 for c in capacities)
    assert set(runtime.pop("kv_capacity_source")) <= {"engine", "learned", None}
    assert runtime == {
        "routing": "session_affinity",
        "policy": "plas",
        "concurrency": 4,
        "token_budget": None,
        "send_priority": "auto",  # Runtime's default
        "learn_waits": True,
        "load_control": True,  # Runtime's default
        "poll_metrics_s": "auto",  # Runtime's default: polled, two endpoints
        "endpoints": 2,
    }
    sessions = {s.name: s for s in report.session_reports}
    assert sessions["main"].parent_id is None
    assert sessions["sub"].parent_id == sessions["main"].session_id
    main_calls = [c for c in report.call_reports if c.session_name == "main"]
    sub_call = next(c for c in report.call_reports if c.session_name == "sub")
    assert [c.turn for c in main_calls] == [0, 1, 2, 3]
    assert main_calls[0].idle_s is None and main_calls[0].idle_cause is None
    assert [c.idle_cause for c in main_calls[1:]] == ["tool", "subagents", "think"]
    for c in main_calls[1:]:
        assert c.idle_s is not None and c.idle_s > 0
    # Each turn resends the whole conversation: it shares the previous prompt but for
    # the last, partly filled 1 KiB block (and the bytes after the messages).
    for prev, call in itertools.pairwise(main_calls):
        assert prev.prompt_tokens is not None and call.prefix_prev_tokens is not None
        assert 0.7 * prev.prompt_tokens <= call.prefix_prev_tokens <= prev.prompt_tokens
    # The sub-agent starts with the same system prompt as main: shared across sessions.
    assert main_calls[0].prefix_common_tokens == 0 and main_calls[0].prefix_common_id is None
    assert sub_call.prefix_common_tokens and sub_call.prefix_common_id
    assert sub_call.prompt_tokens is not None
    assert sub_call.prefix_common_tokens < sub_call.prompt_tokens
    assert sub_call.prefix_prev_tokens == 0
    # Never the text: only numbers and an 8-digit fingerprint.
    line = journal.read_text()
    assert "rule1" not in line and "tool result" not in line


def test_prefix_tracker_counts_shared_blocks() -> None:
    tracker = PrefixTracker()
    head = b"s" * (3 * BLOCK_BYTES)
    a = tracker.observe("a", head + b"x" * (2 * BLOCK_BYTES))
    assert a == (0, 0, None, 5 * BLOCK_BYTES)
    a2 = tracker.observe("a", head + b"x" * (2 * BLOCK_BYTES) + b"y" * (4 * BLOCK_BYTES))
    assert a2 is not None and a2[0] == 5 * BLOCK_BYTES
    b = tracker.observe("b", head + b"z" * (2 * BLOCK_BYTES))
    assert b is not None and b[1] == 3 * BLOCK_BYTES and b[2] is not None
    # A body shorter than a block tells nothing.
    assert tracker.observe("c", b"short") is None
