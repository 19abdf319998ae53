"""agentrt tune: replay a journal in the embedded cluster (a digital twin) under a grid of
settings and pick the best. Its entry point is the command ``agentrt tune JOURNAL...``
(docs/tune.md); the modules are private."""

__all__: list[str] = []
