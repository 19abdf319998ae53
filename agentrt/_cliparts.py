"""The parts every command's arguments are made of: the help formatter, the parser whose
errors are one line, the error a command reports as one line, and small helpers. The
``agentrt`` command (``cli.py``) puts together each package's command line (``_cli.py``
of ``bench``, ``sim``, ``report``, ``tune``) from these. Standard library only, so that
``agentrt --help`` starts fast."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from typing import NoReturn

__all__ = [
    "Command",
    "CommandError",
    "Formatter",
    "Parser",
    "examples",
    "listing",
    "positive",
    "print_help",
]


class Formatter(argparse.HelpFormatter):
    """Wraps prose to the terminal, keeps indented lists and examples as written, and adds
    each option's default to its help."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            if any(line.startswith(" ") for line in paragraph.splitlines()):
                paragraphs.append(paragraph)
            else:
                paragraphs.append(textwrap.fill(" ".join(paragraph.split()), width))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or not action.option_strings
            or isinstance(default, list)
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line that says what to do."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


class CommandError(Exception):
    """A failure the command reports as one line (exit status 2)."""


Command = Callable[[str, str, str, str], Parser]
"""Makes one subcommand's parser: ``command(name, help, description, epilog)``."""


def examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def listing(items: dict[str, str], columns: int = 79) -> str:
    width = max(map(len, items))
    return "\n".join(
        textwrap.fill(
            text,
            columns,
            initial_indent=f"  {name.ljust(width)}  ",
            subsequent_indent=" " * (width + 4),
            break_on_hyphens=False,
        )
        for name, text in items.items()
    )


def positive(value: int | float | None, option: str) -> None:
    if value is not None and value <= 0:
        raise CommandError(f"{option} must be positive, got {value}")


def print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 0
