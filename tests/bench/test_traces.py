"""The Claude Code traces a user can get: the package's sample, and `agentrt traces fetch`
(a real HTTP server on loopback serves the archive; nothing is mocked)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrt.bench._traces import (
    SAMPLE_COUNT,
    SOURCE_COMMIT,
    SOURCE_REPO,
    FetchError,
    Manifest,
    fetch,
    missing_traces_message,
    read_manifest,
    sample_dir,
)
from agentrt.bench._workloads import TraceOptions, claude_code_jobs
from agentrt.cli import main


def _blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sample() -> dict[str, bytes]:
    """The sample's traces as the source repository holds them (JSON, not gzipped)."""
    return {
        p.name.removesuffix(".gz"): gzip.decompress(p.read_bytes())
        for p in sorted(sample_dir().glob("trace_*.json.gz"))
    }


def _archive(files: dict[str, bytes]) -> bytes:
    """A tar.gz laid out as GitHub's archive of the repository."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"kv-cache-tester-{SOURCE_COMMIT}/traces/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        readme = b"not a trace"
        info = tarfile.TarInfo(f"kv-cache-tester-{SOURCE_COMMIT}/README.md")
        info.size = len(readme)
        tar.addfile(info, io.BytesIO(readme))
    return buf.getvalue()


def test_the_sample_is_small_licensed_and_genuine() -> None:
    folder = sample_dir()
    files = list(folder.iterdir())
    assert sum(p.stat().st_size for p in files) <= 1_000_000
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert SOURCE_REPO in (folder / "README.md").read_text()
    sample = _sample()
    assert len(sample) == SAMPLE_COUNT
    manifest = read_manifest()
    assert len(manifest.files) == 739 and len(manifest.wanted(False)) == 710
    # Each sampled trace is byte for byte the source's file at the pinned commit.
    for name, data in sample.items():
        assert _blob(data) == manifest.files[name][0], name
        assert len(data) == manifest.files[name][1], name


def test_the_sample_replays_by_default_without_the_shared_traces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = claude_code_jobs(TraceOptions(directory=sample_dir(), limit=3))
    assert len(jobs) == 3 and all(j.steps for j in jobs)


def _subset(files: dict[str, bytes]) -> Manifest:
    return Manifest({name: (_blob(data), len(data)) for name, data in files.items()})


def test_fetch_checks_each_trace_and_writes_what_the_workload_reads(tmp_path: Path) -> None:
    files = dict(list(_sample().items())[:4])
    archive = tmp_path / "source.tar.gz"
    archive.write_bytes(_archive(files))
    dest = tmp_path / "traces"
    fetch(dest, archive=archive, manifest=_subset(files), echo=lambda _: None)
    written = sorted(p.name for p in dest.glob("trace_*.json.gz"))
    assert written == sorted(f"{n}.gz" for n in files)
    assert (dest / "LICENSE").is_file() and SOURCE_COMMIT in (dest / "SOURCE").read_text()
    assert len(claude_code_jobs(TraceOptions(directory=dest))) == 4


def test_fetch_refuses_a_changed_or_missing_trace_and_writes_nothing(tmp_path: Path) -> None:
    files = dict(list(_sample().items())[:3])
    manifest = _subset(files)
    name = next(iter(files))
    changed = {**files, name: files[name].replace(b'"requests"', b'"requestz"', 1)}
    archive = tmp_path / "source.tar.gz"
    archive.write_bytes(_archive(changed))
    dest = tmp_path / "traces"
    with pytest.raises(FetchError, match=f"{name}: content differs"):
        fetch(dest, archive=archive, manifest=manifest, echo=lambda _: None)
    assert not dest.exists()
    archive.write_bytes(_archive(dict(list(files.items())[1:])))
    with pytest.raises(FetchError, match="1 traces missing"):
        fetch(dest, archive=archive, manifest=manifest, echo=lambda _: None)
    assert not dest.exists()
    assert not list(tmp_path.glob(".agentrt-traces-*"))  # no temporary left behind


@pytest.fixture
def archive_server(tmp_path: Path) -> Iterator[tuple[str, Manifest]]:
    files = dict(list(_sample().items())[:2])
    (tmp_path / "archive.tar.gz").write_bytes(_archive(files))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _subset(files)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_fetch_downloads_over_http(archive_server: tuple[str, Manifest], tmp_path: Path) -> None:
    base, manifest = archive_server
    lines: list[str] = []
    dest = fetch(
        tmp_path / "out", url=f"{base}/archive.tar.gz", manifest=manifest, echo=lines.append
    )
    assert len(list(dest.glob("trace_*.json.gz"))) == 2
    assert lines[0].startswith("downloading ") and "2 traces checked" in lines[-1]
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch(tmp_path / "x", url=f"{base}/nope.tar.gz", manifest=manifest, echo=lines.append)


def test_the_error_for_a_folder_without_traces_names_the_source_and_the_fetch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = missing_traces_message(tmp_path)
    assert SOURCE_REPO in message and "agentrt traces fetch" in message
    assert str(sample_dir()) in message
    out = ["--no-plots", "--no-journal", "--out", str(tmp_path / "out"), "--workers", "1"]
    status = main(["bench", "--workload", "claude-code", "--traces", str(tmp_path), *out])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert SOURCE_REPO in err and "agentrt traces fetch" in err


def test_traces_fetch_command_reports_a_bad_archive_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not an archive")
    status = main(["traces", "fetch", "--archive", str(bad), "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert status == 2 and "not a readable tar.gz archive" in err and err.count("\n") == 1


def _refused_url() -> str:
    """A loopback URL where nothing listens (a port bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/archive.tar.gz"


def test_fetch_writes_its_files_and_touches_nothing_else_in_the_folder(tmp_path: Path) -> None:
    files = dict(list(_sample().items())[:2])
    archive = tmp_path / "source.tar.gz"
    archive.write_bytes(_archive(files))
    dest = tmp_path / "mine"
    (dest / "notes").mkdir(parents=True)
    (dest / "notes" / "todo.txt").write_text("keep me")
    (dest / "report.md").write_text("mine too")
    (dest / "trace_9999.json.gz").write_bytes(b"an earlier fetch's trace")
    fetch(dest, archive=archive, manifest=_subset(files), echo=lambda _: None)
    assert (dest / "notes" / "todo.txt").read_text() == "keep me"
    assert (dest / "report.md").read_text() == "mine too"
    assert (dest / "trace_9999.json.gz").read_bytes() == b"an earlier fetch's trace"
    written = {f"{n}.gz" for n in files}
    assert written <= {p.name for p in dest.iterdir()}
    assert not list(dest.glob(".*"))  # no temporary left behind


def test_fetch_into_the_current_folder_keeps_what_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = dict(list(_sample().items())[:2])
    archive = tmp_path / "source.tar.gz"
    archive.write_bytes(_archive(files))
    here = tmp_path / "project"
    here.mkdir()
    (here / "main.py").write_text("print('mine')")
    monkeypatch.chdir(here)
    fetch(Path("."), archive=archive, manifest=_subset(files), echo=lambda _: None)
    assert (here / "main.py").read_text() == "print('mine')"
    assert sorted(p.name for p in here.glob("trace_*.json.gz")) == sorted(f"{n}.gz" for n in files)
    assert {"LICENSE", "SOURCE"} <= {p.name for p in here.iterdir()}


def test_a_fetch_that_cannot_download_creates_nothing_and_names_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    status = main(["traces", "fetch", "--url", _refused_url()])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert "could not download" in err and "--archive FILE" in err
    assert not cache.exists()  # no empty cache folder left behind
