"""Forgetting ``async with`` (or ``with``) on a job, session or tool block gives one
clear line (issue 35, item 11), as every other misuse of the blocks does; and
``WrongLoopError``, raised to users, is importable from ``agentrt``."""

from __future__ import annotations

import re

import pytest

import agentrt
from agentrt import Runtime, SyncRuntime
from agentrt._errors import WrongLoopError

URL = "http://engine.test/v1"


@pytest.mark.anyio
async def test_a_job_used_without_async_with_says_how_to_write_it() -> None:
    async with Runtime(URL) as rt:
        job = rt.job("x")
        with pytest.raises(AttributeError) as caught:
            job.session("s")  # type: ignore[attr-defined]
        message = str(caught.value)
        assert "\n" not in message
        assert "write 'async with rt.job(...) as job:'" in message
        assert "'job.session'" in message
        await job.__aenter__()  # the block still works once entered
        await job.__aexit__(None, None, None)
        async with rt.job("y") as entered:
            block = entered.session("s")
            with pytest.raises(
                AttributeError, match=re.escape("write 'async with job.session(...) as s:'")
            ):
                block.chat  # type: ignore[attr-defined]  # noqa: B018
            tool = block  # private names stay plain AttributeErrors
            with pytest.raises(AttributeError, match=r"^_nope$"):
                tool._nope  # type: ignore[attr-defined]  # noqa: B018


def test_a_sync_job_used_without_with_says_how_to_write_it() -> None:
    with SyncRuntime(URL) as rt:
        job = rt.job("x")
        with pytest.raises(AttributeError, match=re.escape("write 'with rt.job(...) as job:'")):
            job.session("s")  # type: ignore[attr-defined]


def test_wrong_loop_error_is_exported() -> None:
    assert agentrt.WrongLoopError is WrongLoopError
    assert "WrongLoopError" in agentrt.__all__
