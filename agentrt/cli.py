"""The ``agentrt`` command: ``demo``, ``bench``, ``report``, ``tune``, ``check``,
``sim serve`` and ``traces fetch``.

Each command's arguments, and what it runs, live with its package (``bench/_cli.py``,
``report/_cli.py``, ``tune/_cli.py``, ``check/_cli.py``, ``sim/_cli.py``); this module
puts them together and reports any failure. Only the standard library is imported up
front, so ``agentrt --help`` starts fast; each subcommand imports what it needs when it
runs. Errors are one line on stderr (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Final

from ._cliparts import CommandError, Formatter, Parser, examples, print_help
from .bench._cli import add_bench, add_demo, add_traces
from .check._cli import add_check
from .report._cli import add_report
from .sim._cli import add_sim
from .tune._cli import add_tune

__all__ = ["main"]

_STARTED: Final = time.perf_counter()
"""When the command started (its interpreter start-up aside): the demo's wall time."""

_EXTRAS: Final = {
    "matplotlib": "report",
    "rich": "report",
    "uvicorn": "serve",
    "prometheus_client": "prometheus",
    "opentelemetry": "otel",
    "ray": "ray",
}
"""Optional modules and the extra that installs each."""


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="agentrt",
        formatter_class=Formatter,
        description="agentrt: jobs, sessions and tool waits for LLM calls. Compare a plain "
        "client with agentrt on the embedded engine (simulated replicas, in process), "
        "benchmark workloads, read journals, or serve simulated replicas.",
        epilog=examples(
            "agentrt demo                    # the main job: plain client vs agentrt",
            "agentrt sim serve               # an OpenAI-compatible server on :8000",
            "agentrt report journal.jsonl    # JCT tables from a Runtime's journal",
            "agentrt check URL [URL ...]     # what agentrt reads from your replicas",
        ),
    )
    parser.add_argument("--version", action="version", version=f"agentrt {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help_text: str, description: str, epilog: str) -> Parser:
        p: Parser = sub.add_parser(
            name,
            help=help_text,
            description=description,
            epilog=epilog,
            formatter_class=Formatter,
        )
        return p

    add_demo(command, _STARTED)
    add_bench(command)
    add_report(command)
    add_tune(command)
    add_check(command)
    add_sim(command)
    add_traces(command)
    parser.set_defaults(run=lambda _: print_help(parser))
    return parser


def _version() -> str:
    from ._version import __version__

    return __version__


def _missing_extra(exc: ModuleNotFoundError) -> str:
    module = (exc.name or "").split(".")[0]
    extra = _EXTRAS.get(module)
    if extra is None:
        return f"{exc}; reinstall agentrt: pip install --force-reinstall agentjct"
    return f"this command needs {module}, from the {extra} extra: pip install 'agentjct[{extra}]'"


def _unreachable(exc: BaseException) -> bool:
    """A server that could not be reached (httpx's or httpx2's connect errors, raised by
    a command that talks to a server the user named)."""
    return type(exc).__module__.split(".")[0] in ("httpx", "httpx2") and type(exc).__name__ in (
        "ConnectError",
        "ConnectTimeout",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit status (0 on success, 2 on an error)."""
    args = _parser().parse_args(argv)  # --help and bad options exit here, fast
    from ._errors import AgentrtError  # (imports openai: after the parse)

    try:
        status: int = args.run(args)
    except ModuleNotFoundError as exc:
        message = _missing_extra(exc)
    except (CommandError, AgentrtError, ValueError, FileNotFoundError, ImportError) as exc:
        message = str(exc)  # agentrt's errors say what to do (a server not there: its URL)
    except KeyboardInterrupt:
        message = "interrupted"
    except Exception as exc:
        if os.environ.get("AGENTRT_TRACEBACK"):
            raise
        if _unreachable(exc):
            url = getattr(getattr(exc, "request", None), "url", None)
            where = f" at {url}" if url is not None else ""
            message = (
                f"could not connect{where} ({type(exc).__name__}: {exc}); is the server "
                "running there? Check the URL (scheme, host, port and path)"
            )
        else:
            message = (
                f"unexpected {type(exc).__name__}: {exc} (a bug: please report it; "
                "AGENTRT_TRACEBACK=1 shows where)"
            )
    else:
        return status
    from ._config import redact_userinfo  # (stdlib only: no cost at start-up)

    print(f"agentrt: error: {redact_userinfo(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
