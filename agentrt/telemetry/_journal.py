"""The journal: one JSON line per finished job, appended and flushed as each job ends.

``Runtime(journal="runs.jsonl")`` installs a :class:`Journal` hook. Each line is one
:class:`JobReport` (every call and tool wait included), written unbuffered in one
``write``, so a crash loses at most the jobs still running. :func:`read_journal` reads a
journal back, validating each line with pydantic; a corrupt line is reported (by number,
in a :class:`JournalWarning`) and skipped.

The file is opened in append mode; lines are written from the event loop's thread. It
is closed when the runtime's block ends; a job that ends later is not journaled.
Writes are small and buffered by the OS, so they do not block the loop measurably; a
journal on a slow network filesystem would (put it on local disk).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from ._events import Event, JobEnded
from ._report import JobReport

__all__ = ["Journal", "JournalWarning", "iter_journal", "read_journal"]


class JournalWarning(UserWarning):
    """A journal line could not be read back (it is skipped)."""


class Journal:
    """A hook that appends each finished job's report to a JSON-lines file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"journal path {self.path} is a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered: each line goes out in one write() call, so a crash never leaves
        # half a line behind a buffer (at most the line being written is cut short).
        self._file: IO[bytes] | None = self.path.open("ab", buffering=0)
        self.jobs = 0

    def __repr__(self) -> str:
        return f"<agentrt Journal {str(self.path)!r} jobs={self.jobs}>"

    def __call__(self, event: Event) -> None:
        # A job that ends after its runtime closed (a stream read past the runtime's
        # block, a framework run ended late) is not journaled: the file is closed.
        if isinstance(event, JobEnded) and self._file is not None:
            self.write(event.report)

    def write(self, report: JobReport) -> None:
        """Append one report as one line, and flush it."""
        if self._file is None:
            raise ValueError(f"journal {self.path} is closed")
        self._file.write(report.model_dump_json().encode() + b"\n")
        self.jobs += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def iter_journal(path: str | os.PathLike[str]) -> Iterator[JobReport]:
    """The reports in a journal, in order. A line that is not a valid report (a crash
    cut it short, or it was edited) is skipped with a :class:`JournalWarning` that names
    the file and the line number."""
    p = Path(path)
    with p.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield JobReport.model_validate_json(line)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(x) for x in first.get("loc", ())) or "line"
                warnings.warn(
                    f"{p}:{number}: not a valid job report ({where}: {first.get('msg')}); skipped",
                    JournalWarning,
                    stacklevel=2,
                )


def read_journal(path: str | os.PathLike[str]) -> list[JobReport]:
    """All valid reports in a journal (see :func:`iter_journal`)."""
    return list(iter_journal(path))
