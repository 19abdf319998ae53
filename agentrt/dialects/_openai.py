"""The ``openai`` dialect: the OpenAI API (or a server that mirrors its caching key).

Body ``prompt_cache_key`` = the session id: OpenAI uses the key to route requests that
share a prefix to the same cache, which is what a session's turns do. No other body
field is added by default: the OpenAI API is strict about the arguments it accepts.

``openai_dialect(cache_options=True)`` (name ``openai:cache-options``) also sends
``prompt_cache_options: {"ttl": "30m"}`` on every call that is not its session's last:
the minimum lifetime of the cache entries the request writes. ``prompt_cache_options``
replaces the deprecated ``prompt_cache_retention`` (which agentrt never sent); it is
"supported for gpt-5.6 and later models" and ``30m`` is "currently the only supported
value" (openai/openai-python ``src/openai/types/chat/completion_create_params.py`` at
e43b422), so the session's expected idle decides nothing but whether a next turn comes.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding

__all__ = ["OPENAI", "OPENAI_CACHE_TTL", "openai_dialect"]

OPENAI_CACHE_TTL: Final = "30m"
"""The one ``prompt_cache_options.ttl`` the OpenAI API accepts."""


def openai_dialect(*, cache_options: bool = False) -> Dialect:
    """Build the OpenAI dialect; ``cache_options`` sends ``prompt_cache_options``."""
    if not isinstance(cache_options, bool):
        raise TypeError(f"cache_options must be a bool, got {type(cache_options).__name__}")

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.body["prompt_cache_key"] = meta.session_id
        if cache_options and not meta.final:
            enc.body["prompt_cache_options"] = {"ttl": OPENAI_CACHE_TTL}
        return enc

    if cache_options:
        return Dialect(
            name="openai:cache-options",
            encode=encode,
            doc="OpenAI API: body prompt_cache_key = session id; prompt_cache_options "
            "ttl 30m on a session's calls but its last.",
        )
    return Dialect(
        name="openai",
        encode=encode,
        doc="OpenAI API: body prompt_cache_key = session id.",
    )


OPENAI: Final = openai_dialect()
"""The ``openai`` dialect: the session id as the body's ``prompt_cache_key``."""
