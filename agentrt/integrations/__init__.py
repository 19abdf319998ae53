"""Framework adapters: LangChain / LangGraph, LlamaIndex and the OpenAI Agents SDK.

Each lives in its own module and imports its framework lazily (install the matching
extra: ``agentjct[langchain]``, ``agentjct[llamaindex]``, ``agentjct[openai-agents]``).
Import the module you need: ``from agentrt.integrations import langchain``. See
docs/integrations.md.
"""
