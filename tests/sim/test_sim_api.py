"""agentrt.sim's public surface: complete, sorted, documented."""

from __future__ import annotations

import inspect

import agentrt.sim


def _isort_key(name: str) -> tuple[int, str]:
    if name.isupper():
        return (0, name)
    if name[0].isupper():
        return (1, name)
    return (2, name)


def test_all_is_sorted_complete_and_documented() -> None:
    names = agentrt.sim.__all__
    assert names == sorted(names, key=_isort_key)
    public = {n for n in dir(agentrt.sim) if not n.startswith("_")}
    assert set(names) <= public
    for name in names:
        obj = getattr(agentrt.sim, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name
