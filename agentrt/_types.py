"""Types of agentrt's call arguments, for type checkers only (the openai types they
extend cost an import that agent code at run time need not pay)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TypedDict

    from openai import NotGiven, Omit, Timeout
    from openai.types import completion_create_params as _text_params
    from openai.types.chat import completion_create_params as _chat_params

    class _Extras(TypedDict, total=False):
        # The request options every openai ``create`` takes besides the API's fields.
        extra_headers: Mapping[str, str | Omit] | None
        extra_query: Mapping[str, object] | None
        extra_body: object | None
        timeout: float | Timeout | NotGiven | None

    class ChatArgs(_chat_params.CompletionCreateParamsBase, _Extras, total=False):
        """The keyword arguments of ``chat.completions.create`` but ``stream``, typed as
        the installed openai types them (``Session.chat``'s overloads take ``stream``)."""

    class CompleteArgs(_text_params.CompletionCreateParamsBase, _Extras, total=False):
        """The keyword arguments of ``completions.create`` but ``stream``."""
