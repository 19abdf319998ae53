"""An adapter for a framework agentrt does not know, written on agentrt's adapter protocol,
and an assistant with two tools and a helper agent run through it.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/custom_adapter_agent.py

The first part is a toy agent framework (stand-in for yours): agents that call an OpenAI
model with tools, and a callback interface that says when a run, a model request and a
tool call start and end, each with the framework's own ids. The second part is the whole
adapter (docs/integrations.md, "Write an adapter"): ``model(rt, name)`` returns the
framework's model object on agentrt's client, ``instrument(rt)`` its callback object,
which maps each top-level run onto a job, each agent's run onto a session (a helper run
from a tool call under the caller's), each model request onto a turn of that session
and each tool call onto a tool wait, with :class:`agentrt.integrations.Bridge` and
:func:`agentrt.integrations.bind`. The default question carries the embedded engine's
``CALL``/``ANSWER`` directives (docs/sim.md), so the run is the same every time.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import sys
import uuid
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio
import openai

import agentrt
from agentrt.integrations import Binding, Bridge, bind, unbind

# The tools' logic, the command line and the report, shared by the examples
from _shared import (
    arg_parser,
    calculate,
    count_words,
    one_line_errors,
    print_report,
    scripted_question,
)

# -- a toy agent framework (not agentrt's: the one you adapt) -----------------------------

Tool = Callable[..., Awaitable[str] | str]


class Callbacks:
    """The toy framework's hook interface: each method is called in the task that runs
    what it names (as most frameworks' callbacks are)."""

    def on_run_start(self, run_id: str, agent: str, caller: tuple[str, str] | None) -> None:
        """An agent's run starts; ``caller``: (run id, tool call id) it runs inside."""

    def on_run_end(self, run_id: str, error: BaseException | None) -> None:
        """The run ended, returning or raising ``error``."""

    def on_model_start(self, run_id: str) -> None:
        """The run's next model request is about to be sent, from this task."""

    def on_model_end(self, run_id: str) -> None:
        """The model request ended."""

    def on_tool_start(self, call_id: str, run_id: str, tool: str) -> None:
        """A tool call starts."""

    def on_tool_end(self, call_id: str, error: BaseException | None) -> None:
        """The tool call ended, returning or raising ``error``."""


@dataclass
class ToyModel:
    """The toy framework's model: an OpenAI client and the model's name."""

    client: openai.AsyncOpenAI
    name: str


_CALLER: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "toy_caller", default=None
)


@dataclass
class ToyAgent:
    """The toy framework's agent: asks its model, runs the tools it asks for, repeats."""

    name: str
    model: ToyModel
    tools: list[Tool]
    callbacks: list[Callbacks] = field(default_factory=list)

    async def run(self, question: str) -> str:
        run_id = uuid.uuid4().hex
        for cb in self.callbacks:
            cb.on_run_start(run_id, self.name, _CALLER.get())
        try:
            answer = await self._loop(run_id, question)
        except BaseException as exc:
            for cb in self.callbacks:
                cb.on_run_end(run_id, exc)
            raise
        for cb in self.callbacks:
            cb.on_run_end(run_id, None)
        return answer

    async def _loop(self, run_id: str, question: str) -> str:
        tools = {t.__name__: t for t in self.tools}
        specs: list[Any] = [_spec(t) for t in self.tools]
        messages: list[Any] = [{"role": "user", "content": question}]
        for _ in range(8):
            for cb in self.callbacks:
                cb.on_model_start(run_id)
            try:
                reply = await self.model.client.chat.completions.create(
                    model=self.model.name, messages=messages, tools=specs, max_tokens=256
                )
            finally:
                for cb in self.callbacks:
                    cb.on_model_end(run_id)
            message = reply.choices[0].message
            calls = [c for c in message.tool_calls or [] if c.type == "function"]
            if not calls:
                return (message.content or "").strip()
            messages.append(message.model_dump(exclude_none=True))
            for call in calls:
                result = await self._call(run_id, call.id, tools[call.function.name], call)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return "(no answer: out of steps)"

    async def _call(self, run_id: str, call_id: str, tool: Tool, call: Any) -> str:
        for cb in self.callbacks:
            cb.on_tool_start(call_id, run_id, call.function.name)
        token = _CALLER.set((run_id, call_id))
        try:
            result = tool(**json.loads(call.function.arguments or "{}"))
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            for cb in self.callbacks:
                cb.on_tool_end(call_id, exc)
            raise
        finally:
            _CALLER.reset(token)
        for cb in self.callbacks:
            cb.on_tool_end(call_id, None)
        return str(result)


def _spec(tool: Tool) -> dict[str, Any]:
    params = list(inspect.signature(tool).parameters)
    return {
        "type": "function",
        "function": {
            "name": tool.__name__,
            "description": inspect.getdoc(tool) or "",
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string"} for p in params},
                "required": params,
            },
        },
    }


# -- the adapter: the toy framework on agentrt's adapter protocol -------------------------


def model(rt: agentrt.Runtime, name: str) -> ToyModel:
    """The framework's model object, its calls through agentrt (``rt.openai()``)."""
    return ToyModel(rt.openai(), name)


def instrument(rt: agentrt.Runtime) -> AgentrtCallbacks:
    """The framework's callback object that maps its runs onto ``rt``'s jobs."""
    return AgentrtCallbacks(rt)


class AgentrtCallbacks(Callbacks):
    """A top-level run is a job; each run a session of it (a run started from a tool call
    is the calling run's child); each model request a turn of its run's session; each
    tool call a tool wait. The bridge keeps them by the framework's ids."""

    def __init__(self, rt: agentrt.Runtime) -> None:
        self._bridge = Bridge(rt)
        self._job_of: dict[str, Hashable] = {}  # each open run's job (its top run's id)
        self._bindings: dict[str, Binding] = {}

    def on_run_start(self, run_id: str, agent: str, caller: tuple[str, str] | None) -> None:
        job_key = None if caller is None else self._job_of.get(caller[0])
        if job_key is None:  # a top-level run: a job (None if the runtime is closed)
            if self._bridge.start_job(run_id, agent) is None:
                return
            job_key = run_id
        parent = None if caller is None else self._bridge.session(caller[0])
        self._bridge.start_session(run_id, job_key, agent, parent=parent)
        self._job_of[run_id] = job_key

    def on_run_end(self, run_id: str, error: BaseException | None) -> None:
        job_key = self._job_of.pop(run_id, None)
        if job_key == run_id:  # ok, error or cancelled; ends what is still open in it
            self._bridge.end_job(run_id, error)
        elif job_key is not None:
            self._bridge.end_session(run_id)

    def on_model_start(self, run_id: str) -> None:
        session = self._bridge.session(run_id)
        if session is not None:  # the request sent next from this task: its turn
            self._bindings[run_id] = bind(session)

    def on_model_end(self, run_id: str) -> None:
        binding = self._bindings.pop(run_id, None)
        if binding is not None:
            unbind(binding)

    def on_tool_start(self, call_id: str, run_id: str, tool: str) -> None:
        self._bridge.start_tool(call_id, run_id, tool)

    def on_tool_end(self, call_id: str, error: BaseException | None) -> None:
        self._bridge.end_tool(call_id, error)


# -- the run -------------------------------------------------------------------------------

QUESTION = scripted_question(helper_arg="task")


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    llm = model(rt, model_name)
    callbacks: list[Callbacks] = [instrument(rt)]

    async def word_count(path: str) -> str:
        """Count the words of a local text file."""
        return await count_words(path)

    researcher = ToyAgent("researcher", llm, [word_count], callbacks)

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
        return calculate(expression)

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return await researcher.run(task)

    assistant = ToyAgent("assistant", llm, [calculator, ask_researcher], callbacks)
    answer = await assistant.run(question)
    return answer, rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
