"""The openai clients agentrt builds (``rt.openai()``, ``SyncRuntime.openai()``, the
framework adapters' models): their keyword arguments, and copies that keep agentrt's
one retry layer (``max_retries=0``) and the platform tag."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Self

import openai

from ._config import check_api_key
from ._platform import give_platform
from ._state import PLACEHOLDER_KEY

if TYPE_CHECKING:
    from ._state import _Core

__all__ = ["AgentOpenAI", "client_kwargs", "copy_kwargs"]

_OWN_RETRIES = "agentrt owns retries; configure them with Runtime(retry=...)"


def client_kwargs(core: _Core, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for an openai client that agentrt builds over ``core``."""
    if kwargs.get("max_retries", 0) != 0:
        raise ValueError(_OWN_RETRIES)
    if "http_client" in kwargs:
        raise ValueError(
            "rt.openai() builds its own HTTP client; to use yours, wrap agentrt's "
            "transport instead (rt.http_client())"
        )
    out = dict(kwargs, max_retries=0)
    out.setdefault("base_url", core.endpoints[0].endpoint.url)
    if "api_key" not in out:
        key = core.api_key
        if key is None:
            key = os.environ.get("OPENAI_API_KEY") or None
            if key is not None:
                check_api_key(key, "OPENAI_API_KEY")  # before any request, as ours
        out["api_key"] = key or PLACEHOLDER_KEY
    return out


def copy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A copy's keyword arguments (``with_options``/``copy`` of a client agentrt built):
    openai's own retries are refused there as in ``rt.openai(max_retries=...)``."""
    retries = kwargs.get("max_retries", 0)
    if not isinstance(retries, openai.NotGiven) and retries != 0:
        raise ValueError(
            f"{_OWN_RETRIES}; a client rt.openai() built keeps max_retries=0 "
            f"(with_options(max_retries={retries!r}) would retry on top of agentrt)"
        )
    return kwargs


class AgentOpenAI(openai.AsyncOpenAI):
    """The ``openai.AsyncOpenAI`` of ``rt.openai()``: its copies (``with_options``,
    ``copy``) keep ``max_retries=0`` and the platform tag."""

    def copy(self, *args: Any, **kwargs: Any) -> Self:
        client = super().copy(*args, **copy_kwargs(kwargs))
        give_platform(client, self._platform)
        return client

    with_options = copy
