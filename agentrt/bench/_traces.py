"""The Claude Code traces: the sample shipped in the package, and the full set fetched from
its public repository.

The traces are 739 recorded Claude Code sessions (sizes, timings and block hashes; no
text) from callanjfox/kv-cache-tester, folder ``traces/``, under the Apache License 2.0.
The package ships :data:`SAMPLE_COUNT` of them (``agentrt/bench/traces/claude-code``,
with the license), so ``agentrt bench --workload claude-code`` runs from a plain install;
``agentrt traces fetch`` downloads the repository at :data:`SOURCE_COMMIT`, checks each
trace against the git blob hash listed in ``kv-cache-tester.sha1`` (shipped beside the
sample) and writes the set the project's benchmarks use (the 710 files under 4 MiB) as
``trace_NNNN.json.gz`` to :func:`user_trace_dir`, where the workloads look for it.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "MAX_BYTES",
    "SAMPLE_COUNT",
    "SOURCE_COMMIT",
    "SOURCE_REPO",
    "TARBALL_URL",
    "FetchError",
    "Manifest",
    "fetch",
    "missing_traces_message",
    "read_manifest",
    "sample_dir",
    "user_trace_dir",
]

SOURCE_REPO: Final = "callanjfox/kv-cache-tester"
SOURCE_COMMIT: Final = "94f6046dfd9c0c8bc0cdb24a5aa6579bac8669bf"
TARBALL_URL: Final = f"https://codeload.github.com/{SOURCE_REPO}/tar.gz/{SOURCE_COMMIT}"
"""GitHub's archive of the repository at :data:`SOURCE_COMMIT`."""
MAX_BYTES: Final = 4 * 1024 * 1024
"""Traces this large or larger are left out unless asked for (as in the set the project's
benchmarks ran on: a 4 MiB session holds a person's whole day)."""
SAMPLE_COUNT: Final = 40
"""Traces in the package's sample."""
_HERE: Final = Path(__file__).resolve().parent / "traces"


def sample_dir() -> Path:
    """The package's sample of the Claude Code traces (with their LICENSE)."""
    return _HERE / "claude-code"


def user_trace_dir() -> Path:
    """Where ``agentrt traces fetch`` writes the full set by default:
    ``$XDG_CACHE_HOME/agentrt/traces/claude-code`` (``~/.cache`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrt" / "traces" / "claude-code"


def missing_traces_message(directory: Path) -> str:
    """The one-line error for a traces folder without traces: where the traces come
    from, the shipped sample and the command that fetches the full set."""
    return (
        f"no trace_*.json.gz in {directory}. The Claude Code traces are "
        f"{SOURCE_REPO} (GitHub, Apache-2.0): without --traces or AGENTRT_TRACES the "
        f"package's sample of {SAMPLE_COUNT} is used ({sample_dir()}); "
        f"'agentrt traces fetch' downloads and checks the full set into {user_trace_dir()}"
    )


class FetchError(RuntimeError):
    """The download failed, or a file did not match the manifest (the message says which)."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """The traces of :data:`SOURCE_COMMIT`: file name to (git blob SHA-1, size or None
    where the size is :data:`MAX_BYTES` or more and not recorded)."""

    files: dict[str, tuple[str, int | None]]

    def wanted(self, include_large: bool) -> set[str]:
        """The names a fetch must find: all, or those known to be under :data:`MAX_BYTES`."""
        return {
            name
            for name, (_, size) in self.files.items()
            if include_large or (size is not None and size < MAX_BYTES)
        }


def read_manifest(path: Path | None = None) -> Manifest:
    """``kv-cache-tester.sha1``: one ``name sha1 size`` line per trace, ``#`` comments."""
    text = (path or _HERE / "kv-cache-tester.sha1").read_text(encoding="utf-8")
    files: dict[str, tuple[str, int | None]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sha1, size = line.split()
        files[name] = (sha1, None if size == "-" else int(size))
    return Manifest(files)


def _blob_sha1(data: bytes) -> str:
    """What git names a file with this content (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _download(url: str, to: Path, echo: Callable[[str], None]) -> None:
    import httpx

    echo(f"downloading {url}")
    offline = (
        "; without a connection, download that archive elsewhere and give it with "
        "'agentrt traces fetch --archive FILE'"
    )
    try:
        with httpx.stream("GET", url, follow_redirects=True, timeout=60.0) as response:
            if response.status_code != 200:
                raise FetchError(f"could not download {url}: HTTP {response.status_code}{offline}")
            got = 0
            with to.open("wb") as f:
                for chunk in response.iter_bytes(1 << 20):
                    f.write(chunk)
                    got += len(chunk)
            echo(f"downloaded {got / 1e6:.1f} MB")
    except httpx.HTTPError as exc:
        raise FetchError(
            f"could not download {url} ({type(exc).__name__}: {exc}){offline}"
        ) from None


def _place(files: Path, dest: Path) -> None:
    """Move each file of ``files`` into ``dest`` (created if need be), each replacing the
    file of its name there at once (written beside it, then renamed); nothing else in
    ``dest`` is touched."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in sorted(files.iterdir()):
        part = dest / f".{src.name}.part"
        try:
            shutil.copyfile(src, part)
            os.replace(part, dest / src.name)
        finally:
            part.unlink(missing_ok=True)


def fetch(
    dest: Path | None = None,
    *,
    url: str = TARBALL_URL,
    archive: Path | None = None,
    include_large: bool = False,
    manifest: Manifest | None = None,
    echo: Callable[[str], None] = print,
) -> Path:
    """Download the repository's archive (or read ``archive``, one already downloaded),
    check every trace the manifest lists against its blob hash, and write them gzipped to
    ``dest`` (default :func:`user_trace_dir`) with the license.

    The download and the checked traces wait in a temporary folder (the system's:
    ``$TMPDIR``); only once every file checked out are they written to ``dest``, each
    replacing the file of its name. Nothing else in ``dest`` is touched, and a fetch that
    fails (offline, a file missing or changed: :class:`FetchError`) creates nothing.
    Returns ``dest``."""
    dest = dest or user_trace_dir()
    if dest.exists() and not dest.is_dir():
        raise FetchError(f"{dest} is a file: give a folder for the traces (--out DIR)")
    manifest = manifest or read_manifest()
    wanted = manifest.wanted(include_large)
    with tempfile.TemporaryDirectory(prefix="agentrt-traces-") as tmp:
        work = Path(tmp)
        if archive is None:
            archive = work / "source.tar.gz"
            _download(url, archive, echo)
        out = work / "claude-code"
        out.mkdir()
        found: set[str] = set()
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar:
                    parts = member.name.split("/")
                    name = parts[-1]
                    if len(parts) < 2 or parts[-2] != "traces" or name not in wanted:
                        continue
                    f = tar.extractfile(member)
                    if f is None:
                        continue
                    data = f.read()
                    if _blob_sha1(data) != manifest.files[name][0]:
                        raise FetchError(
                            f"{name}: content differs from {SOURCE_REPO}@{SOURCE_COMMIT[:7]} "
                            "(hash mismatch); nothing was written"
                        )
                    target = out / (Path(name).stem + ".json.gz")
                    with gzip.GzipFile(target, "wb", mtime=0) as gz:
                        gz.write(data)
                    found.add(name)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise FetchError(f"{archive}: not a readable tar.gz archive ({exc})") from exc
        missing = sorted(wanted - found)
        if missing:
            raise FetchError(
                f"{len(missing)} traces missing from the archive (first: {missing[0]}); "
                "nothing was written"
            )
        shutil.copy(sample_dir() / "LICENSE", out / "LICENSE")
        (out / "SOURCE").write_text(
            f"{SOURCE_REPO} at {SOURCE_COMMIT}, folder traces/, Apache-2.0 (LICENSE);\n"
            f"{len(found)} files, each checked against its git blob hash, gzipped.\n",
            encoding="utf-8",
        )
        try:
            _place(out, dest)
        except OSError as exc:
            raise FetchError(f"could not write the traces to {dest}: {exc}") from None
    echo(f"{len(found)} traces checked and written to {dest}")
    return dest
