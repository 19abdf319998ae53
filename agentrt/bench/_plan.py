"""What a benchmark job does, independent of the client that runs it.

A :class:`JobPlan` is one agent job: a root session of steps. A step is a :class:`Call`
(wait, then one LLM call whose prompt is a list of block ids) or a :class:`Fanout` (sub-agent
sessions run concurrently; the parent resumes after them all).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BLOCK_TOKENS", "Call", "Fanout", "JobPlan", "SessionPlan", "Step"]

BLOCK_TOKENS = 64
"""Tokens per prompt block in plans (the Claude Code traces' block size)."""


@dataclass(frozen=True, slots=True)
class Call:
    """Wait ``wait_s`` (a tool wait when ``tool`` is set, else think time), then call."""

    wait_s: float
    tool: str | None
    blocks: tuple[int, ...]
    """Prompt block ids: two prompts share a cached prefix as long as their ids agree."""
    namespace: str
    """Block ids are unique within a namespace (a trace, a synthetic job, a shared prefix)."""
    shared_blocks: int
    """How many leading blocks are in the global ``shared`` namespace (a system prompt all
    jobs of the same agent share)."""
    tail_tokens: int
    output_tokens: int
    stream: bool = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.blocks) * BLOCK_TOKENS + self.tail_tokens


@dataclass(frozen=True, slots=True)
class Fanout:
    """Sub-agent sessions that run concurrently; the parent waits for all of them."""

    sessions: tuple[SessionPlan, ...]


Step = Call | Fanout


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """One session of a job: its steps (calls and fan-outs to sub-agent sessions), in
    order."""

    name: str
    steps: tuple[Step, ...]

    def calls(self) -> int:
        """LLM calls of the session, its sub-agents' included."""
        return sum(
            1 if isinstance(s, Call) else sum(x.calls() for x in s.sessions) for s in self.steps
        )


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One benchmark job: when it arrives and its root session."""

    name: str
    kind: str
    """The workload it came from: ``react``, ``fanout``, ``chat``, ``claude-code``."""
    arrival_s: float
    root: SessionPlan
    worker: int | None = None
    """The fleet member that runs it under ``BenchConfig.fleet_assign="plan"`` (a tuned
    journal's: the process that ran it); None: dealt round-robin by arrival."""

    def calls(self) -> int:
        """LLM calls of the whole job."""
        return self.root.calls()
