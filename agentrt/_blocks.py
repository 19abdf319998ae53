"""``with`` and ``async with`` blocks that say how they are written when entered the
other way (``rt.job(...)``, ``job.session(...)``, ``s.tool(...)`` and their sync twins),
instead of Python's bare protocol error."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from types import TracebackType
from typing import TYPE_CHECKING, ParamSpec, TypeVar

__all__ = ["async_block", "sync_block"]

_P = ParamSpec("_P")
_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


class _AsyncBlock(AbstractAsyncContextManager[_T_co]):
    """An ``async with`` block (what ``@asynccontextmanager`` makes) that, entered with a
    plain ``with``, says how to write it instead of Python's bare protocol error."""

    __slots__ = ("_cm", "_usage")

    def __init__(self, cm: AbstractAsyncContextManager[_T_co], usage: str) -> None:
        self._cm = cm
        self._usage = usage

    async def __aenter__(self) -> _T_co:
        return await self._cm.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._cm.__aexit__(exc_type, exc, tb)

    if not TYPE_CHECKING:  # (type checkers reject a plain ``with`` on their own)

        def __enter__(self):
            raise TypeError(
                f"{self._usage.split(' as ')[0]} is an async context manager: write "
                f"'async with {self._usage}:' (code that is not async uses "
                "agentrt.SyncRuntime, whose blocks take a plain 'with')"
            )

        def __exit__(self, *exc_info):
            return None

        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            raise _not_entered(self._usage, name, "async with")


class _SyncBlock(AbstractContextManager[_T_co]):
    """A ``with`` block of :class:`~agentrt.SyncRuntime` that, entered with ``async
    with``, says how to write it instead of Python's bare protocol error."""

    __slots__ = ("_cm", "_usage")

    def __init__(self, cm: AbstractContextManager[_T_co], usage: str) -> None:
        self._cm = cm
        self._usage = usage

    def __enter__(self) -> _T_co:
        return self._cm.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return self._cm.__exit__(exc_type, exc, tb)

    if not TYPE_CHECKING:

        async def __aenter__(self):
            raise TypeError(
                f"a SyncRuntime's {self._usage.split(' as ')[0]} is a plain context "
                f"manager: write 'with {self._usage}:' (async code uses agentrt.Runtime, "
                "whose blocks take 'async with')"
            )

        async def __aexit__(self, *exc_info):
            return None

        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            raise _not_entered(self._usage, name, "with")


def _not_entered(usage: str, name: str, keyword: str) -> AttributeError:
    """The error for ``block.name`` where ``block`` was never entered (``job =
    rt.job("x"); job.session(...)``): one line that says how to write it."""
    block, _, what = usage.partition(" as ")
    inside = f" and use '{what}.{name}' inside it" if what else ""
    return AttributeError(
        f"{block} is a block that must be entered before use ({name!r} is not an "
        f"attribute of the block): write '{keyword} {usage}:'{inside}"
    )


def async_block(
    usage: str,
) -> Callable[[Callable[_P, AsyncIterator[_T]]], Callable[_P, AbstractAsyncContextManager[_T]]]:
    """``@asynccontextmanager``, whose blocks say how to write them (``usage``, as in
    ``"rt.job(...) as job"``) when entered with a plain ``with``."""

    def wrap(
        fn: Callable[_P, AsyncIterator[_T]],
    ) -> Callable[_P, AbstractAsyncContextManager[_T]]:
        make = asynccontextmanager(fn)

        @functools.wraps(fn)
        def block(*args: _P.args, **kwargs: _P.kwargs) -> AbstractAsyncContextManager[_T]:
            return _AsyncBlock(make(*args, **kwargs), usage)

        return block

    return wrap


def sync_block(
    usage: str,
) -> Callable[[Callable[_P, Iterator[_T]]], Callable[_P, AbstractContextManager[_T]]]:
    """``@contextmanager``, whose blocks say how to write them when entered with ``async
    with`` (a SyncRuntime's)."""

    def wrap(fn: Callable[_P, Iterator[_T]]) -> Callable[_P, AbstractContextManager[_T]]:
        make = contextmanager(fn)

        @functools.wraps(fn)
        def block(*args: _P.args, **kwargs: _P.kwargs) -> AbstractContextManager[_T]:
            return _SyncBlock(make(*args, **kwargs), usage)

        return block

    return wrap
