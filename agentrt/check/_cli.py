"""The command line of ``agentrt check``: its arguments and what it runs (``_probe``,
imported when it runs)."""

from __future__ import annotations

import argparse
import os

from .._cliparts import Command, CommandError, examples, positive

__all__ = ["add_check"]


def add_check(command: Command) -> None:
    """``agentrt check``."""
    check = command(
        "check",
        "check a deployment's URLs before use: API, models, dialect, KV capacity",
        "Asks each URL what a Runtime would ask it (GET /models, and its /metrics "
        "page where the runtime's polls look for it; no completion is sent) and says, "
        "one entry per URL: whether it can be used (if not, why), the models it serves, "
        "the dialect it looks like (from its metric names and reply headers), the KV "
        "capacity agentrt reads from it, and what Runtime(URLs) with its defaults does "
        "with them: routing by session, metrics polls, KV placement. Exit status 1 if "
        "any URL is unusable, 2 on a bad argument.",
        examples(
            "agentrt check http://10.0.0.1:8000/v1 http://10.0.0.2:8000/v1",
            "agentrt check http://127.0.0.1:8000/replica-0/v1 --model sim-llama-3.1-8b",
            "agentrt check https://api.openai.com/v1 --api-key-env OPENAI_API_KEY",
        ),
    )
    check.add_argument(
        "urls", nargs="+", metavar="URL", help="base URLs of the replicas, as given to Runtime"
    )
    check.add_argument("--model", metavar="M", help="a model each URL must serve")
    check.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="the environment variable holding the API key to send (default: none sent)",
    )
    check.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds to wait for each answer",
    )
    check.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
    positive(args.timeout, "--timeout")
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise CommandError(
                f"--api-key-env {args.api_key_env}: that environment variable is not set "
                "or empty; export it, or leave the option out to send no key"
            )
    import inspect

    import anyio

    from .._config import Endpoint, check_api_key
    from .._runtime import Runtime
    from ._probe import check_endpoints, lines, plan

    if api_key is not None:
        check_api_key(api_key, f"the key in {args.api_key_env}")
    endpoints = [Endpoint(url) for url in args.urls]  # a bad URL: one line, nothing sent
    seen = set()
    for ep in endpoints:
        if ep.url in seen:
            raise CommandError(f"{ep.url} is listed twice (Runtime refuses that too)")
        seen.add(ep.url)
    checks = anyio.run(
        lambda: check_endpoints(endpoints, api_key=api_key, model=args.model, answer_s=args.timeout)
    )
    defaults = {name: p.default for name, p in inspect.signature(Runtime).parameters.items()}
    for line in lines(checks, plan(checks, defaults)):
        print(line)
    return 0 if all(c.usable for c in checks) else 1
