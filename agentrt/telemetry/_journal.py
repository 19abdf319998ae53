"""The journal: one JSON line per finished job, appended and flushed as each job ends.

``Runtime(journal="runs.jsonl")`` installs a :class:`Journal` hook. Each line is one
:class:`JobReport` (every call and tool wait included), written unbuffered in one
``write``, so a crash loses at most the jobs still running. :func:`read_journal` reads a
journal back, validating each line with pydantic; a corrupt line is reported (by number,
in a :class:`JournalWarning`) and skipped.

The file is opened in append mode; lines are written from the event loop's thread. It
is closed when the runtime's block ends; a job that ends later is not journaled (it is
counted as lost).

Nothing is lost silently: every job that ends is either written whole or counted as lost
(:meth:`Journal.statistics`, ``rt.journal_statistics()``, the Prometheus and
OpenTelemetry counters), and each loss is logged on the ``agentrt.journal`` logger (at most one
record per :data:`LOG_INTERVAL_S`, carrying the count of losses since the last one).
Writes are small and buffered by the OS, so they do not block the loop measurably; a
journal on a slow network filesystem would (put it on local disk).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from pydantic import ValidationError

from .._log import journal_log
from ._events import Event, JobEnded
from ._report import JobReport

__all__ = [
    "LOG_INTERVAL_S",
    "Journal",
    "JournalStatistics",
    "JournalWarning",
    "RateLimitedLog",
    "iter_journal",
    "read_journal",
]

LOG_INTERVAL_S: Final = 10.0
"""At most one log record per this many seconds for each kind of loss."""


class RateLimitedLog:
    """Logs every occurrence of one kind of problem, at most one record per
    ``interval_s``: the first at once, later ones counted into the next record (or into
    :meth:`flush`'s), as WARNING records of ``log`` (``agentrt.journal`` unless given)."""

    def __init__(
        self, what: str, interval_s: float = LOG_INTERVAL_S, log: logging.Logger = journal_log
    ) -> None:
        self.what = what
        self.interval_s = interval_s
        self.log = log
        self._last = -float("inf")
        self._pending = 0
        self.total = 0

    def __call__(self, detail: str) -> None:
        self.total += 1
        self._pending += 1
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._emit(detail)
            self._last = now

    def _emit(self, detail: str) -> None:
        self.log.warning(
            "%s: %d more (%d in all); last: %s", self.what, self._pending, self.total, detail
        )
        self._pending = 0

    def flush(self, detail: str = "") -> None:
        """Log the occurrences not logged yet, if any."""
        if self._pending:
            self._emit(detail or "see above")


@dataclass(frozen=True, slots=True)
class JournalStatistics:
    """A snapshot of a runtime's journal and hooks (``rt.journal_statistics()``)."""

    written: int
    """Job reports written to the journal, each one whole line."""
    lost: int
    """Finished jobs whose line was not written: the report could not be serialized, the
    write failed or was cut short (a full disk), or the job ended after the journal was
    closed. Each is logged (``agentrt.journal`` logger, rate-limited)."""
    hook_errors: int
    """Events that a hook (the journal, Prometheus, OpenTelemetry or your own) raised
    on: what that hook records is missing them. Each is logged, rate-limited."""
    last_error: str | None
    """The last loss or hook error, for diagnosis."""


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
        """Lines written."""
        self.lost = 0
        """Finished jobs not written (see :class:`JournalStatistics`)."""
        self.last_error: str | None = None
        self.observers: list[Callable[[bool], None]] = []
        """Called with True for each line written, False for each line lost (the
        Prometheus and OpenTelemetry counters)."""
        self._log = RateLimitedLog(f"agentrt journal {self.path} lost job reports")
        self._cut = False
        """A write failed part-way: the next line starts on a new line."""

    def __repr__(self) -> str:
        return f"<agentrt Journal {str(self.path)!r} jobs={self.jobs} lost={self.lost}>"

    def __call__(self, event: Event) -> None:
        if isinstance(event, JobEnded):
            if self._file is None:
                # A job that ends after its runtime closed (a stream read past the
                # runtime's block, a framework run ended late): the file is closed.
                self._lose(event.report.job_id, "the journal was closed (the runtime ended)")
                return
            self._append(event.report)

    def write(self, report: JobReport) -> None:
        """Append one report as one line, and flush it. Raises what went wrong (the loss
        is counted and logged first)."""
        if self._file is None:
            raise ValueError(f"journal {self.path} is closed")
        error = self._append(report)
        if error is not None:
            raise error

    def _append(self, report: JobReport) -> Exception | None:
        """Write one report; count and log a failure, and return it."""
        assert self._file is not None
        try:
            line = report.model_dump_json().encode() + b"\n"
        except Exception as exc:  # a value pydantic cannot serialize
            self._lose(report.job_id, f"its report cannot be serialized: {exc}")
            return exc
        if self._cut:
            line = b"\n" + line
        try:
            view = memoryview(line)
            while view:  # an unbuffered write may take part of the line
                n = self._file.write(view)
                if not n:
                    raise OSError(f"write() took {n!r} of {len(view)} bytes")
                view = view[n:]
            self._cut = False
        except Exception as exc:  # OSError: a full disk, a lost mount
            self._cut = True  # (whether part of it went out is not known)
            self._lose(report.job_id, f"{type(exc).__name__}: {exc}")
            return exc
        self.jobs += 1
        for observe in self.observers:
            observe(True)
        return None

    def _lose(self, job_id: str, why: str) -> None:
        self.lost += 1
        self.last_error = f"job {job_id}: {why}"
        self._log(self.last_error)
        if self._file is None:
            self._log.flush(self.last_error)  # closed: no later record would carry it
        for observe in self.observers:
            observe(False)

    def close(self) -> None:
        """Closes the file; a loss not yet logged is logged now."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._log.flush(self.last_error or "")


def _lines(p: Path) -> Iterator[tuple[int, JobReport | str]]:
    """Each non-empty line of journal ``p``: its number, and its report or why it is
    not one (pydantic's first error: ``field: reason``, or the reason alone)."""
    with p.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield number, JobReport.model_validate_json(line)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(x) for x in first.get("loc", ()))
                yield number, f"{where}: {first.get('msg')}" if where else str(first.get("msg"))


def iter_journal(path: str | os.PathLike[str]) -> Iterator[JobReport]:
    """The reports in a journal, in order. A line that is not a valid report (a crash
    cut it short, or it was edited) is skipped with a :class:`JournalWarning` that names
    the file and the line number."""
    p = Path(path)
    for number, read in _lines(p):
        if isinstance(read, str):
            warnings.warn(
                f"{p}:{number}: not a valid job report ({read}); skipped",
                JournalWarning,
                stacklevel=2,
            )
        else:
            yield read


@dataclass(frozen=True, slots=True)
class JournalScan:
    """A journal read whole (:func:`scan_journal`): its valid reports, in order, and its
    invalid lines as ``(line number, reason)``."""

    path: Path
    reports: list[JobReport]
    invalid: list[tuple[int, str]]

    def no_report(self) -> str | None:
        """Why the journal holds no job report, in one line (None when it holds one):
        empty, or what is wrong with its lines (how many, the first's number and
        reason)."""
        if self.reports:
            return None
        if not self.invalid:
            return f"journal {self.path} is empty: no job reports in it"
        number, reason = self.invalid[0]
        n = len(self.invalid)
        lines = "its one line is not" if n == 1 else f"none of its {n} lines is"
        return (
            f"journal {self.path} has no valid job report: {lines} a JobReport (first: "
            f"line {number}, {reason}); a journal is one JSON JobReport per line, as "
            "Runtime(journal=...) and agentrt bench write"
        )


def scan_journal(
    path: str | os.PathLike[str], *, stop_after_invalid: int | None = None
) -> JournalScan:
    """Read a journal whole: its valid reports and its invalid lines, with no warning
    (for a command that says what is wrong itself). With ``stop_after_invalid``, only its
    head: up to its first report, or that many invalid lines before any (is the file a
    journal at all?)."""
    p = Path(path)
    reports: list[JobReport] = []
    invalid: list[tuple[int, str]] = []
    for number, read in _lines(p):
        if isinstance(read, str):
            invalid.append((number, read))
            if not reports and len(invalid) == stop_after_invalid:
                break
        else:
            reports.append(read)
            if stop_after_invalid is not None:
                break
    return JournalScan(p, reports, invalid)


def read_journal(path: str | os.PathLike[str]) -> list[JobReport]:
    """All valid reports in a journal (see :func:`iter_journal`)."""
    return list(iter_journal(path))
