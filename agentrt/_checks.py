"""The checks of what agent code gives jobs, sessions and tool waits (names, expected
idle times, a job's metadata): each refuses bad input with an error naming it, before
any request is sent."""

from __future__ import annotations

from typing import Any, Final

from pydantic_core import to_json

from ._protocol import validate_nonneg

__all__ = ["MAX_EXPECTED_S", "MAX_NAME_BYTES", "check_expected", "check_metadata", "check_name"]

MAX_NAME_BYTES: Final = 256
"""The longest job, session or tool name (UTF-8 bytes)."""


def check_name(value: str | None, what: str) -> str | None:
    """A name (or None): UTF-8 text of at most ``MAX_NAME_BYTES``, without CR, LF or NUL.

    A name holding a lone surrogate (what ``os.fsdecode`` makes of a file name that is
    not UTF-8) is refused: the journal, Prometheus and OpenTelemetry all write names as
    UTF-8, and would lose the job's line or every later export to it."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    _check_text(value, what)
    if len(value.encode("utf-8")) > MAX_NAME_BYTES:
        raise ValueError(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    if any(c in value for c in "\r\n\x00"):
        raise ValueError(f"{what} {value[:40]!r} contains CR, LF or NUL")
    return value


def _check_text(value: str, what: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} {value[:40]!r} is not valid UTF-8 text (it holds a lone surrogate at "
            f"index {exc.start}, as a name decoded from a non-UTF-8 file name does); "
            "decode it with errors='replace' or give a plain str"
        ) from None


MAX_EXPECTED_S: Final = 86_400.0
"""The longest idle a tool wait or ``expect_idle`` may declare (a day): more is a typo
(``1e12``), refused before any request rather than sent to engines as a wait."""


def check_expected(seconds: float | None, what: str) -> float | None:
    """An expected idle: a finite number of seconds in [0, a day], or None."""
    value = validate_nonneg(seconds, what)
    if value is not None and value > MAX_EXPECTED_S:
        raise ValueError(
            f"{what} must be at most {MAX_EXPECTED_S:.0f} s (a day), got {seconds!r}; "
            "give the tool's expected duration in seconds"
        )
    return value


def check_metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of a job's metadata, if its report can carry it: str keys, and values that
    serialize to JSON as the report does (pydantic's serializer: what the journal writes).
    Checked when the job opens, before any request, so that the job's journal line
    cannot be lost to it later."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"job metadata must be a dict, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise TypeError(f"job metadata keys must be str, got {key!r}")
        _check_text(key, "job metadata key")
        try:
            to_json(value)
        except (TypeError, ValueError) as exc:  # PydanticSerializationError is a ValueError
            raise TypeError(
                f"job metadata {key!r}: a {type(value).__name__} that cannot be written as "
                f"JSON ({str(exc).splitlines()[0]}); give str, numbers, bools, None, or "
                "lists and dicts of them"
            ) from None
    return dict(metadata)
