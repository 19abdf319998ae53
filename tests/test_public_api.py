"""The public surface: complete, sorted, and nothing leaks from private modules."""

from __future__ import annotations

import pytest

import agentrt
import agentrt.dialects
import agentrt.integrations
import agentrt.scheduling
import agentrt.telemetry


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions and the rest.
    if name.isupper() or (name.upper() == name and "_" in name):
        return (0, name)
    if name[0].isupper():
        return (1, name)
    return (2, name)


def test_all_is_sorted_and_complete() -> None:
    for module in (agentrt, agentrt.telemetry, agentrt.scheduling, agentrt.integrations):
        names = module.__all__
        assert names == sorted(names, key=_isort_key), module.__name__
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_public_names_do_not_point_into_tests() -> None:
    public = {n for n in dir(agentrt) if not n.startswith("_")}
    assert set(agentrt.__all__) - {"__version__"} <= public


def test_version() -> None:
    assert agentrt.__version__


def test_every_public_name_has_a_home() -> None:
    assert set(agentrt._HOMES) == set(agentrt.__all__) - {"__version__"}
    for name, home in agentrt._HOMES.items():
        module = __import__(f"agentrt{home}", fromlist=[name])
        assert getattr(agentrt, name) is getattr(module, name)


def test_import_is_lazy() -> None:
    # `import agentrt` (and so the agentrt command) does not import the runtime until a
    # public name is used.
    import subprocess
    import sys

    code = (
        "import sys, agentrt\n"
        "assert 'agentrt._runtime' not in sys.modules and 'openai' not in sys.modules\n"
        "from agentrt import Runtime\n"
        "assert Runtime.__module__ == 'agentrt._runtime'\n"
        "assert 'Runtime' in dir(agentrt)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_public_exceptions_are_named_by_the_public_module() -> None:
    """Tracebacks and reprs say ``agentrt.EndpointError`` (as httpx's say
    ``httpx.ConnectError``), and the exceptions pickle by that name."""
    import pickle
    import traceback

    errors = [getattr(agentrt, n) for n in agentrt.__all__ if n.endswith("Error")]
    assert len(errors) >= 5
    for cls in errors:
        assert issubclass(cls, agentrt.AgentrtError)
        assert cls.__module__ == "agentrt", cls
    exc = agentrt.EndpointError("endpoint http://h/v1 failed", endpoint="http://h/v1", attempts=3)
    line = traceback.format_exception_only(type(exc), exc)[-1]
    assert line == "agentrt.EndpointError: endpoint http://h/v1 failed\n"
    back = pickle.loads(pickle.dumps(exc))
    assert (type(back), str(back), back.endpoint, back.attempts) == (
        agentrt.EndpointError,
        str(exc),
        "http://h/v1",
        3,
    )
    assert isinstance(pickle.loads(pickle.dumps(agentrt.JobClosedError("x"))), agentrt.AgentrtError)


def test_the_runtime_docstring_lists_every_parameter() -> None:
    # A parameter list, as httpx's Client documents its own.
    import inspect

    doc = agentrt.Runtime.__doc__ or ""
    params = [p for p in inspect.signature(agentrt.Runtime.__init__).parameters if p != "self"]
    assert [p for p in params if f"**{p}**" not in doc] == []


def test_testing_names_renamed_since_0_2_warn_and_resolve() -> None:
    import agentrt.testing as testing
    import agentrt.testing.vllm_cpu as vllm_cpu

    with pytest.warns(DeprecationWarning, match="ReplicaServer"):
        assert testing.Replica is vllm_cpu.ReplicaServer  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="RouterServer"):
        assert vllm_cpu.Router is vllm_cpu.RouterServer
    with pytest.raises(AttributeError):
        vllm_cpu.Nope  # noqa: B018
