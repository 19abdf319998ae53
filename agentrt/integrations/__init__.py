"""Framework adapters: LangChain / LangGraph, LlamaIndex, the OpenAI Agents SDK,
PydanticAI, Strands, Google ADK and AG2, and ``agents``: a job, a session per agent and
tool waits for any framework that takes an OpenAI client (Agno, AutoGen).

Each lives in its own module and imports its framework lazily (install the matching
extra: ``agentjct[langchain]``, ``agentjct[llamaindex]``, ``agentjct[openai-agents]``).
Import the module you need: ``from agentrt.integrations import langchain``. See
docs/integrations.md.
"""
