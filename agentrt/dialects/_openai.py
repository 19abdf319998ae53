"""The ``openai`` dialect: the OpenAI API (or a server that mirrors its caching key).

Body ``prompt_cache_key`` = the session id: OpenAI uses the key to route requests that
share a prefix to the same cache, which is what a session's turns do. No other body
field is added: the OpenAI API is strict about the arguments it accepts.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding

__all__ = ["OPENAI"]


def _encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
    enc = base_encoding(meta)
    enc.body["prompt_cache_key"] = meta.session_id
    return enc


OPENAI: Final = Dialect(
    name="openai",
    encode=_encode,
    doc="OpenAI API: body prompt_cache_key = session id.",
)
"""The ``openai`` dialect: the session id as the body's ``prompt_cache_key``."""
