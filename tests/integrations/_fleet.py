"""A fleet of real OS processes on one set of replicas, each with its own ``Runtime``.

:func:`run_fleet` starts K processes of this file (``python _fleet.py SPEC``), each
building ``agentrt.Runtime(urls, journal=...)`` with the defaults, and waits for them.
Each process runs ``jobs`` jobs one after another, one session each of ``turns`` turns
with a tool wait between turns: its first session with a generated id, the others with
caller-given ids (``fleet-<k>-<j>``). It then hands those sessions' conversations over
(``handoff-<k>.json``, as a conversation store would), waits for process ``k + 1``'s,
and continues them for ``more_turns`` turns under the same ids: another process, which
has never seen them. Every call is in the process's journal; the replies' ids and
``rt.endpoint_loads()``'s views at the end are in ``out-<k>.json``.

Used by tests/integrations/test_fleet_processes.py (``agentrt sim serve``) and
tests/engine/test_fleet_processes_vllm.py (two vLLM CPU replicas).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan"
).split()
HANDOFF_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Call:
    """One call of the fleet, from its process's journal."""

    worker: int
    job: str  # "work" (the session's first process) or "continue" (another process)
    session_id: str
    turn: int
    endpoint: str | None
    prompt_tokens: int
    cached_tokens: int


@dataclass
class FleetRun:
    """What the processes did: their calls, the journals' runtime fields, their views."""

    calls: list[Call] = field(default_factory=list)
    runtimes: list[dict[str, Any]] = field(default_factory=list)  # one per job
    statuses: list[str] = field(default_factory=list)  # one per job
    views: list[list[str]] = field(default_factory=list)  # per process, per endpoint
    reply_ids: dict[str, list[str]] = field(default_factory=dict)  # by session id
    wall_s: float = 0.0

    def sessions(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = defaultdict(list)
        for c in self.calls:
            out[c.session_id].append(c)
        return dict(out)

    def first_turns(self) -> dict[str, int]:
        """First turns (of ``work`` jobs) per endpoint."""
        out: dict[str, int] = defaultdict(int)
        for c in self.calls:
            if c.job == "work" and c.turn == 0 and c.endpoint is not None:
                out[c.endpoint] += 1
        return dict(out)


def run_fleet(
    urls: list[str],
    model: str,
    folder: Path,
    *,
    fleet: int = 8,
    jobs: int = 3,
    turns: int = 3,
    more_turns: int = 2,
    words: int = 300,
    max_tokens: int = 8,
    tool_s: float = 0.1,
    timeout_s: float = 300.0,
) -> FleetRun:
    """Run ``fleet`` worker processes to the end and read back what they did."""
    spec = {
        "urls": urls,
        "model": model,
        "fleet": fleet,
        "jobs": jobs,
        "turns": turns,
        "more_turns": more_turns,
        "words": words,
        "max_tokens": max_tokens,
        "tool_s": tool_s,
        "folder": str(folder),
    }
    t0 = time.monotonic()
    procs = []
    for k in range(fleet):
        path = folder / f"spec-{k}.json"
        path.write_text(json.dumps({**spec, "index": k}))
        log = (folder / f"worker-{k}.log").open("wb")
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, __file__, str(path)], stdout=log, stderr=subprocess.STDOUT
                ),
                log,
            )
        )
    deadline = t0 + timeout_s
    try:
        for k, (proc, log) in enumerate(procs):
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            log.close()
            if code != 0:
                tail = (folder / f"worker-{k}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"fleet worker {k} exited with {code}:\n{tail}")
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            log.close()
    run = FleetRun(wall_s=time.monotonic() - t0)
    from agentrt.telemetry import read_journal

    for k in range(fleet):
        for report in read_journal(folder / f"journal-{k}.jsonl"):
            run.statuses.append(report.status)
            run.runtimes.append(dict(report.runtime or {}))
            run.calls += [
                Call(
                    worker=k,
                    job=report.name,
                    session_id=c.session_id,
                    turn=c.turn,
                    endpoint=c.endpoint,
                    prompt_tokens=c.prompt_tokens or 0,
                    cached_tokens=c.cached_tokens or 0,
                )
                for c in report.call_reports
            ]
        out = json.loads((folder / f"out-{k}.json").read_text())
        run.views.append(out["views"])
        for sid, reply_id in out["replies"]:
            run.reply_ids.setdefault(sid, []).append(reply_id)
    return run


# --- the worker process -----------------------------------------------------------------


def _text(rng: random.Random, words: int) -> str:
    return uuid.UUID(int=rng.getrandbits(128)).hex + " " + " ".join(rng.choices(WORDS, k=words))


async def _worker(spec: dict[str, Any]) -> None:
    import anyio

    import agentrt

    k, fleet, folder = spec["index"], spec["fleet"], Path(spec["folder"])
    rng = random.Random(os.urandom(16))
    replies: list[tuple[str, str]] = []

    async def session(
        rt: agentrt.Runtime, job_name: str, sid: str | None, messages: list[Any], turns: int
    ) -> str:
        async with rt.job(job_name) as job, job.session("agent", session_id=sid) as s:
            for turn in range(turns):
                if turn:
                    async with s.tool("search", expected_s=spec["tool_s"]):
                        await anyio.sleep(spec["tool_s"])
                messages.append({"role": "user", "content": f"step {turn}: " + _text(rng, 20)})
                reply = await s.chat(
                    model=spec["model"], messages=messages, max_tokens=spec["max_tokens"]
                )
                content = reply.choices[0].message.content or ""  # type: ignore[union-attr]
                messages.append({"role": "assistant", "content": content})
                replies.append((s.id, reply.id))
            return s.id

    async with agentrt.Runtime(spec["urls"], journal=folder / f"journal-{k}.jsonl") as rt:
        handoff: dict[str, list[Any]] = {}
        for j in range(spec["jobs"]):
            messages: list[Any] = [{"role": "system", "content": _text(rng, spec["words"])}]
            sid = None if j == 0 else f"fleet-{k}-{j}"  # the first id is generated
            await session(rt, "work", sid, messages, spec["turns"])
            if sid is not None:
                handoff[sid] = messages
        tmp = folder / f"handoff-{k}.tmp"
        tmp.write_text(json.dumps(handoff))
        tmp.rename(folder / f"handoff-{k}.json")
        theirs = folder / f"handoff-{(k + 1) % fleet}.json"
        for _ in range(int(HANDOFF_TIMEOUT_S / 0.05)):  # another process writes it
            if theirs.exists():
                break
            await anyio.sleep(0.05)
        else:
            raise TimeoutError(f"no {theirs.name} after {HANDOFF_TIMEOUT_S:.0f} s")
        for sid, messages in json.loads(theirs.read_text()).items():
            await session(rt, "continue", sid, messages, spec["more_turns"])
        views = [load.view for load in rt.endpoint_loads()]
    (folder / f"out-{k}.json").write_text(json.dumps({"views": views, "replies": replies}))


if __name__ == "__main__":
    import anyio

    anyio.run(_worker, json.loads(Path(sys.argv[1]).read_text()))
