"""Stage 2 alone: ``FileReader.fetch_many`` reads fast files several per hop and slow ones one
per hop, keeps their order, and maps every failure to the sample it belongs to."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import write_numbered_files

from aioloader import LoaderTimeoutError, ReadError
from aioloader.read.reader import FileReader, ReadPace


class Recording:
    """A read hook that records which thread read each file, optionally slowly or failing
    the first try of some files with ``err``."""

    def __init__(self, delay: float = 0.0, fail_once: set[str] | None = None, err: int = errno.EIO) -> None:
        self.delay = delay
        self.fail_once = set(fail_once or ())
        self.err = err
        self.threads: dict[str, str] = {}
        self.lock = threading.Lock()

    def __call__(self, path: str) -> bytes:
        with self.lock:
            self.threads[path] = threading.current_thread().name
            failing = path in self.fail_once
            self.fail_once.discard(path)
        if failing:
            raise OSError(self.err, os.strerror(self.err), path)
        if self.delay:
            time.sleep(self.delay)
        return Path(path).read_bytes()


def fetch(reader: FileReader, paths: list[str], timeout: float | None = None) -> list[Any]:
    async def go() -> list[Any]:
        return await reader.fetch_many(list(enumerate(paths)), None, timeout)

    try:
        return asyncio.run(go())
    finally:
        reader.close()


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_numbered_files(tmp_path / "f", 24)


def test_fast_reads_share_a_hop(files: list[str]) -> None:
    hook = Recording()
    got = fetch(FileReader(64, read=hook), files)
    assert got == [Path(p).read_bytes() for p in files]
    # 24 page-cached files: one group hop (it may stop early on a busy machine, never in a
    # way that spreads them over one thread each).
    assert len(set(hook.threads.values())) < len(files) / 2


def test_slow_reads_go_one_per_hop(files: list[str]) -> None:
    hook = Recording(delay=0.01)  # 10 ms: network-like
    reader = FileReader(64, read=hook)
    got = fetch(reader, files)
    assert got == [Path(p).read_bytes() for p in files]
    # The group gave up after its first slow read; the rest were read concurrently.
    assert len(set(hook.threads.values())) > len(files) / 2
    assert not reader.pace.fast


def test_a_transient_error_in_a_group_is_retried_and_counted(files: list[str]) -> None:
    retried: list[str] = []
    hook = Recording(fail_once={files[3]})
    reader = FileReader(64, read=hook, retries=2, on_retry=lambda path, exc: retried.append(path))
    got = fetch(reader, files)
    assert got == [Path(p).read_bytes() for p in files]
    assert retried == [files[3]]


def test_failures_land_on_their_own_samples(files: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    paths = [files[0], str(tmp_path / "missing"), files[1], str(empty), files[2]]
    got = fetch(FileReader(8), paths)
    assert got[0] == Path(files[0]).read_bytes() and got[2] == Path(files[1]).read_bytes()
    assert got[4] == Path(files[2]).read_bytes()
    assert isinstance(got[1], ReadError) and got[1].index == 1 and "missing" in got[1].path
    assert isinstance(got[1].__cause__, FileNotFoundError) and got[1].__cause__.__traceback__ is None
    assert isinstance(got[3], ReadError) and "empty file" in str(got[3])


def test_a_timeout_reads_one_file_per_hop(files: list[str]) -> None:
    hook = Recording(delay=0.3)
    got = fetch(FileReader(64, read=hook), files[:3], timeout=0.05)
    assert all(isinstance(g, LoaderTimeoutError) for g in got)
    time.sleep(0.4)  # let the abandoned reads finish before the leak check


def test_pace_turns_slow_and_back() -> None:
    pace = ReadPace()
    assert pace.fast
    for _ in range(5):
        pace.observe(0.02)
    assert not pace.fast
    for _ in range(30):
        pace.observe(0.00005)
    assert pace.fast
