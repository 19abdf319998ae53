"""The call path: every request an agentrt client makes, from the HTTP library's hand to
the engine and back, in the order it passes these modules:

1. ``_entry``: :class:`AgentTransport`, the httpx-family transport a client is built on;
   it finds the call's session (or opens a one-call job) and hands over.
2. ``_call``: :class:`~agentrt._transport._call.TransportCall`, one call: its request read
   once, its turn claimed, its record and ticket, its outcome checked, its end accounted.
3. ``_attempts``: the call's attempts, route -> admit -> send -> check, retried per
   :class:`~agentrt.Retry` (one plain loop; ``_retry`` says what is retried and when).
4. ``_outgoing``: what each attempt sends (the metadata, the dialect's headers and fields).
5. ``_stream``: a streamed reply observed on its way to the caller.
6. ``_events``: what a call tells as it goes (hooks' events, log lines); it decides nothing.

What other packages share stays outside: ``_wire`` (the JSON of requests and replies),
``_httplib`` (the HTTP library and its copies), ``_state`` (the runtime's shared state),
``scheduling/`` (where a call goes and when), ``telemetry/`` (what it reports).
"""

from ._entry import AgentTransport, SharedTransport

__all__ = ["AgentTransport", "SharedTransport"]
