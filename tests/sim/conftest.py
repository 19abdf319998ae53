"""Fixtures for the simulator's tests.

``anyio_backend`` runs a test on asyncio (wall clock) and on trio under
``MockClock(autojump_threshold=0)`` (virtual time). Modules that need virtual time only
(long simulated runs) override it with :func:`virtual_backend`.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim._helpers import virtual_backend


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "trio":
        return virtual_backend()
    return "asyncio"
