"""Runtime settings from a TOML file: ``Runtime(config=...)`` and ``AGENTRT_CONFIG``.

The file holds ``Runtime`` keyword arguments, at its top level or in a ``[runtime]``
table; ``agentrt tune`` writes one (docs/tune.md). Arguments the caller passes win over
the file's; the file's win over Runtime's defaults. Everything is checked when the file is
read, before any request: a missing file, bad TOML, an unknown key (named, with the valid
ones listed) and a value of the wrong type are errors that name the file.
"""

from __future__ import annotations

import functools
import math
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

from ._config import RETRY_KEYWORDS, Retry

__all__ = ["CONFIG_ENV", "CONFIG_KEYS", "load_config", "with_config"]

CONFIG_ENV: Final = "AGENTRT_CONFIG"
"""The environment variable naming a settings file for runtimes built without
``config=``."""

_NONE: Final = "none"
"""TOML has no null: the string ``"none"`` stands for ``None`` where a setting takes it."""


def _fail(where: str, key: str, wants: str, value: object) -> TypeError:
    return TypeError(f"{where}: {key} must be {wants}, got {value!r}")


def _bool(where: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, key, "true or false", value)
    return value


def _int(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _name(where: str, key: str, value: object, check: Callable[[str], object]) -> str:
    if not isinstance(value, str):
        raise _fail(where, key, "a string", value)
    try:
        check(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {key}: {exc}") from None
    return value


def _dialect(where: str, key: str, value: object) -> object:
    from .dialects import resolve_dialect

    if isinstance(value, list):
        if not value or not all(isinstance(v, str) for v in value):
            raise _fail(where, key, "a dialect name or a non-empty array of names", value)
        value = tuple(value)
    elif not isinstance(value, str):
        raise _fail(where, key, "a dialect name or an array of names", value)
    try:
        resolve_dialect(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {key}: {exc}") from None
    return value


def _routing(where: str, key: str, value: object) -> object:
    from .scheduling._routing import make_router

    return _name(where, key, value, make_router)


def _policy(where: str, key: str, value: object) -> object:
    from .scheduling._queue import make_policy

    return _name(where, key, value, make_policy)


def _concurrency(where: str, key: str, value: object) -> object:
    if _int(value, 1) or value in ("auto", "engine"):
        return value
    if value == _NONE:
        return None
    raise _fail(where, key, 'an int >= 1, "auto", "engine" or "none"', value)


def _token_budget(where: str, key: str, value: object) -> object:
    if _int(value, 1):
        return value
    if value == _NONE:
        return None
    raise _fail(where, key, 'an int >= 1 or "none"', value)


def _send_priority(where: str, key: str, value: object) -> object:
    if isinstance(value, bool) or value == "auto":
        return value
    raise _fail(where, key, 'true, false or "auto"', value)


def _retry(where: str, key: str, value: object) -> object:
    fields = RETRY_KEYWORDS
    if not isinstance(value, dict):
        raise _fail(where, key, f"a table of {', '.join(fields)}", value)
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown key {key}.{unknown[0]}; valid: {', '.join(fields)}")
    for name, v in value.items():
        if name == "attempts" and not _int(v, 1):
            raise _fail(where, f"{key}.{name}", "an int >= 1", v)
        if name != "attempts" and not (_number(v) or (_int(v, 0))):
            raise _fail(where, f"{key}.{name}", "a number >= 0", v)
    return Retry(**value)


def _timeout(where: str, key: str, value: object) -> object:
    if not _number(value):
        raise _fail(where, key, "a number of seconds > 0", value)
    return value


def _seconds_or_none(where: str, key: str, value: object) -> object:
    if _number(value):
        return value
    if value == _NONE:
        return None
    raise _fail(where, key, 'a number of seconds > 0 or "none"', value)


def _keep_reports(where: str, key: str, value: object) -> object:
    if not _int(value, 0):
        raise _fail(where, key, "an int >= 0", value)
    return value


def _path(where: str, key: str, value: object) -> object:
    if not isinstance(value, str) or not value:
        raise _fail(where, key, "a file path", value)
    return value


_READERS: Final[dict[str, Callable[[str, str, object], object]]] = {
    "dialect": _dialect,
    "routing": _routing,
    "policy": _policy,
    "concurrency": _concurrency,
    "token_budget": _token_budget,
    "send_priority": _send_priority,
    "retry": _retry,
    "timeout_s": _timeout,
    "keep_reports": _keep_reports,
    "poll_metrics_s": _seconds_or_none,
    "journal": _path,
    "otel": _bool,
    "prometheus": _bool,
    "capture_content": _bool,
    "learn_waits": _bool,
    "load_control": _bool,
}

CONFIG_KEYS: Final = tuple(sorted(_READERS))
"""The Runtime keyword arguments a settings file may set."""

_NOT_IN_FILES: Final = {
    "endpoints": "pass them to Runtime",
    "api_key": "a secret stays out of settings files: pass it or set OPENAI_API_KEY",
    "transport": "an object: pass it to Runtime",
    "on_job_end": "a callable: pass it to Runtime",
    "hooks": "callables: pass them to Runtime",
    "config": "one settings file is read, the one given",
}


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The Runtime keyword arguments in the TOML file at ``path``, checked and converted
    (``"none"`` to None, a ``retry`` table to :class:`~agentrt.Retry`, a dialect array to
    a tuple). The keys are at the top level or in a ``[runtime]`` table."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"agentrt settings file {where!r} not found (from config= or ${CONFIG_ENV}); "
            "write one with 'agentrt tune JOURNAL' or fix the path"
        ) from None
    except IsADirectoryError:
        raise IsADirectoryError(f"agentrt settings file {where!r} is a directory") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not valid TOML: {exc}") from None
    if "runtime" in data:
        table = data.pop("runtime")
        if not isinstance(table, dict):
            raise _fail(where, "runtime", "a table of Runtime keyword arguments", table)
        if data:
            raise ValueError(
                f"{where}: settings are either at the top level or in [runtime], not both "
                f"(found {', '.join(sorted(data))} outside [runtime])"
            )
        data = table
    out: dict[str, Any] = {}
    for key, value in data.items():
        reader = _READERS.get(key)
        if reader is None:
            why = _NOT_IN_FILES.get(key)
            if why is not None:
                raise ValueError(f"{where}: {key} cannot be set in a settings file ({why})")
            raise ValueError(f"{where}: unknown key {key!r}; valid keys: {', '.join(CONFIG_KEYS)}")
        out[key] = reader(where, key, value)
    return out


_S = TypeVar("_S")
_P = ParamSpec("_P")


def with_config(
    init: Callable[Concatenate[_S, _P], None],
) -> Callable[Concatenate[_S, _P], None]:
    """Wrap ``Runtime.__init__``: the settings file named by its ``config`` argument, or
    else by ``$AGENTRT_CONFIG``, fills in every keyword argument the caller did not pass.
    The signature (and its defaults) stays as written, for readers and type checkers."""

    @functools.wraps(init)
    def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        configured(kwargs)
        init(self, *args, **kwargs)

    return wrapper


def configured(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` (Runtime's keyword arguments), filled in from the settings file named by
    their ``config``, or else by ``$AGENTRT_CONFIG``, where the caller passed none."""
    path = kwargs.get("config")
    if path is None:
        path = os.environ.get(CONFIG_ENV) or None
    if path is not None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"config must be a file path, got {path!r}")
        for key, value in load_config(Path(path)).items():
            kwargs.setdefault(key, value)
    return kwargs
