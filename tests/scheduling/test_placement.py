"""Placement on its own (scheduling/_placement.py): a session's calls routed over the
replicas' views and the router alone, no runtime, and what a finished call's
:class:`CallOutcome` teaches the replica that answered it."""

from __future__ import annotations

import dataclasses

import pytest

from agentrt.scheduling import CallOutcome, EndpointLoad, RetentionEstimator, SessionAffinity
from agentrt.scheduling._placement import Placement, Replicas
from agentrt.scheduling._workingset import WorkingSet


@dataclasses.dataclass
class View:
    load: EndpointLoad = dataclasses.field(default_factory=EndpointLoad)
    working_set: WorkingSet = dataclasses.field(default_factory=lambda: WorkingSet(100_000))
    retention: RetentionEstimator = dataclasses.field(default_factory=RetentionEstimator)


def outcome(replica: int, **kw: object) -> CallOutcome:
    fields: dict[str, object] = {
        "replica": replica,
        "session_id": "s",
        "prompt_tokens": 300,
        "completion_tokens": 100,
        "cached_tokens": None,
        "moved": False,
        "held_s": 0.0,
        "idle_s": None,
        "next_in_s": None,
        "ended_at": 0.0,
    }
    fields.update(kw)
    return CallOutcome(**fields)  # type: ignore[arg-type]


def test_a_session_is_placed_and_taught_over_views_alone() -> None:
    views = [View(), View()]
    replicas = Replicas(views, SessionAffinity(salt=b"x"))
    now = 100.0
    replicas.clock = lambda: now
    assert replicas.kv_aware and replicas.learn_retention
    p = Placement("s", stable=False)

    home, moved = p.route(replicas, (), (), 400)  # its first turn: no move
    assert moved is None and p.unserved
    assert views[home].load.sessions == 1 and views[1 - home].load.sessions == 0
    assert views[home].working_set.context("s") == 400

    now = 101.0
    assert p.replied(replicas, now)
    p.learn(replicas, outcome(home, ended_at=now, next_in_s=5.0))
    assert p.last_reply_at == 101.0 and not p.unserved
    assert p.cacheable == (home, 400)
    assert views[home].working_set.context("s") == 400  # prompt + completion

    # Resumed at home after 9 s, its 400 tokens cached: a hit, for the retention estimate.
    now = 110.0
    assert p.route(replicas, (), (), 500) == (home, None)
    p.learn(replicas, outcome(home, prompt_tokens=500, cached_tokens=400, idle_s=9.0))
    assert len(views[home].retention) == 1 and len(views[1 - home].retention) == 0
    assert views[home].working_set.context("s") == 600

    # A moved call teaches no retention (its previous replica is not this one).
    p.learn(replicas, outcome(home, cached_tokens=0, idle_s=20.0, moved=True))
    assert len(views[home].retention) == 1

    changed: list[int] = []
    replicas.load_control(lambda: changed.append(1))
    p.failed(replicas)
    p.unpin(replicas)
    assert changed == [1, 1]
    assert views[home].load.sessions == 0 and views[home].working_set.context("s") == 0


def test_one_replica_learns_nothing_from_replies() -> None:
    replicas = Replicas([View()], SessionAffinity(salt=b"x"))
    assert not (replicas.kv_aware or replicas.learn_retention)
    p = Placement("s", stable=False)
    assert p.route(replicas, (), (), 400) == (0, None)
    assert not p.replied(replicas, 1.0)  # nothing more to tell: no outcome is built
    assert p.last_reply_at == 1.0


def test_the_outcome_is_a_frozen_record() -> None:
    record = outcome(0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.replica = 1  # type: ignore[misc]
    assert not hasattr(record, "__dict__")  # slots
