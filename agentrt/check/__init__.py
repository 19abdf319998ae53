"""agentrt check: what each of a deployment's URLs answers (its OpenAI API, models,
metrics and KV capacity) and what a runtime will do with them, before any job runs. Its
entry point is the command ``agentrt check URL...`` (docs/deploy.md); the modules are
private."""

__all__: list[str] = []
