"""Misuses that ``mypy --strict`` must reject (tests/test_typing.py): each line marked
``# E: <code>`` must be reported with that error code, and no other line. This shows the
overloads type the calls rather than letting anything through."""

from __future__ import annotations

from openai.types.chat import ChatCompletionMessageParam

import agentrt

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


async def wrong(rt: agentrt.Runtime, srt: agentrt.SyncRuntime) -> None:
    async with rt.job("wrong") as job, job.session("s") as s:
        stream = await s.chat(model="m", messages=MESSAGES, stream=True)
        print(stream.choices)  # E: attr-defined
        reply = await s.chat(model="m", messages=MESSAGES)
        async for _ in reply:  # E: attr-defined
            pass
        await s.chat(model="m", messages=MESSAGES, max_tokens="8")  # E: call-overload
        await s.chat(model="m", messages=MESSAGES, temprature=0.5)  # E: call-overload
        await s.chat(messages=MESSAGES)  # E: call-overload
        text = await s.complete(model="m", prompt="x")
        print(text.choices[0].message)  # E: attr-defined
    with srt.job("wrong") as sjob, sjob.session("s") as ss:
        print(ss.complete(model="m", prompt="x").choices[0].message)  # E: attr-defined
        print(ss.chat(model="m", messages=MESSAGES, stream=True).choices)  # E: attr-defined


def wrong_options() -> None:
    agentrt.SyncRuntime(["http://127.0.0.1:8000/v1"], concurency=4)  # E: call-arg
    agentrt.SyncRuntime(["http://127.0.0.1:8000/v1"], keep_reports="10")  # E: arg-type
    agentrt.SyncRuntime(["http://127.0.0.1:8000/v1"], backend="curio")  # E: arg-type
