"""Stage 2 alone: ``FileReader.fetch_many`` reads fast files several per hop and slow ones one
per hop, keeps their order, and maps every failure to the sample it belongs to.

Which thread read which file is recorded by the ``read`` hook (it runs on the read threads).
Where a case needs reads in flight together, the hook makes them wait for each other (a
barrier) instead of relying on how long a read takes; where it needs every read to count as
fast, the reader's ``pace`` is told no read is slow."""

from __future__ import annotations

import asyncio
import errno
import math
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from helpers import write_numbered_files

from aioloader import LoaderTimeoutError, ReadError
from aioloader.read.blocking import GROUP_THREADS
from aioloader.read.reader import FileReader, ReadPace

#: How long the hook waits for reads that should be in flight together before it gives up
#: (and says so in ``broken``): long enough never to be reached when they are.
MEET_TIMEOUT = 20.0


class Recording:
    """A read hook that records which thread read each file (every attempt, in order).

    ``delay``: seconds each read takes (past ``ReadPace.slow``: a slow read). ``meet``: the
    first ``meet`` reads (of ``meet_paths`` only, when given) wait until all of them are in
    flight at once, which they can only be on as many threads. ``hold``: every read waits
    for this event. ``fail_once``: the first try of these files raises ``OSError(err)``;
    ``fail_always``: every try of these does.
    """

    def __init__(
        self,
        *,
        delay: float = 0.0,
        meet: int = 0,
        meet_paths: Iterable[str] | None = None,
        hold: threading.Event | None = None,
        fail_once: Iterable[str] = (),
        fail_always: Iterable[str] = (),
        err: int = errno.EIO,
    ) -> None:
        self.delay = delay
        self.barrier = threading.Barrier(meet, timeout=MEET_TIMEOUT) if meet else None
        self.meet_left = meet
        self.meet_paths = set(meet_paths) if meet_paths is not None else None
        self.hold = hold
        self.fail_once = set(fail_once)
        self.fail_always = set(fail_always)
        self.err = err
        self.reads: list[tuple[int, str]] = []  # (thread, path), as the reads began
        self.in_flight = 0
        self.most_in_flight = 0
        self.broken = False  # reads that should have been in flight together were not
        self.lock = threading.Lock()

    def __call__(self, path: str) -> bytes:
        with self.lock:
            self.reads.append((threading.get_ident(), path))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            failing = path in self.fail_once or path in self.fail_always
            self.fail_once.discard(path)
            meets = self.meet_left > 0 and (self.meet_paths is None or path in self.meet_paths)
            self.meet_left -= meets
        try:
            if self.delay:
                time.sleep(self.delay)
            if meets and self.barrier is not None:
                try:
                    self.barrier.wait()
                except threading.BrokenBarrierError:
                    self.broken = True
            if self.hold is not None:
                self.hold.wait(MEET_TIMEOUT)
            if failing:
                raise OSError(self.err, os.strerror(self.err), path)
            return Path(path).read_bytes()
        finally:
            with self.lock:
                self.in_flight -= 1

    def tries(self) -> dict[str, int]:
        """How many times each file was read."""
        out: dict[str, int] = {}
        for _, p in self.reads:
            out[p] = out.get(p, 0) + 1
        return out

    def thread(self, path: str) -> int:
        """The thread of ``path``'s first read."""
        return next(t for t, p in self.reads if p == path)

    def files_per_thread(self) -> dict[int, list[str]]:
        """Each thread's reads, in order."""
        out: dict[int, list[str]] = {}
        for t, p in self.reads:
            out.setdefault(t, []).append(p)
        return out


def never_slow(reader: FileReader) -> FileReader:
    """No read counts as slow (nor any group as long): the reader groups whatever the
    machine's load, so the grouping itself is what a test sees."""
    reader.pace.slow = reader.pace.budget = math.inf
    return reader


def fetch(reader: FileReader, paths: list[str], timeout: float | None = None) -> list[Any]:
    async def go() -> list[Any]:
        return await reader.fetch_many(list(enumerate(paths)), None, timeout)

    try:
        return asyncio.run(go())
    finally:
        reader.close()


def contents(paths: list[str]) -> list[bytes]:
    return [Path(p).read_bytes() for p in paths]


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_numbered_files(tmp_path / "f", 24)


def test_fast_reads_share_a_hop(files: list[str]) -> None:
    """While reads are fast, one call's 24 files are one hop: one thread reads them all, in
    order, each once."""
    hook = Recording()
    got = fetch(never_slow(FileReader(64, read=hook)), files)
    assert got == contents(files)
    assert list(hook.files_per_thread().values()) == [files]


def test_fast_groups_run_on_at_most_group_threads(files: list[str]) -> None:
    """Six calls at once, four fast files each: each call is one hop (its files on one
    thread, in order), and GROUP_THREADS hops read at once, never more. The first
    GROUP_THREADS reads wait for each other: with fewer hops at once they could not meet."""
    hook = Recording(meet=GROUP_THREADS)
    reader = never_slow(FileReader(64, read=hook))
    calls = [files[i : i + 4] for i in range(0, len(files), 4)]

    async def go() -> list[list[Any]]:
        return await asyncio.gather(*(reader.fetch_many(list(enumerate(c)), None, None) for c in calls))

    try:
        got = asyncio.run(go())
    finally:
        reader.close()
    assert got == [contents(c) for c in calls]
    assert sorted(p for _, p in hook.reads) == sorted(files)  # each file read once
    per_thread = hook.files_per_thread()
    for c in calls:
        (thread,) = {hook.thread(p) for p in c}
        mine = per_thread[thread]
        start = mine.index(c[0])
        assert mine[start : start + len(c)] == c  # one hop: the call's files back to back
    assert not hook.broken
    assert hook.most_in_flight == GROUP_THREADS


def test_slow_reads_go_one_per_hop(files: list[str]) -> None:
    """10 ms reads (network-like): the group gives up after its first slow read, and the
    other 23 files go one per hop, all in flight at once, on a thread each."""
    hook = Recording(delay=0.01, meet=len(files) - 1, meet_paths=files[1:])
    reader = FileReader(64, read=hook)
    got = fetch(reader, files)
    assert got == contents(files)
    assert hook.reads[0][1] == files[0]  # the group began with it
    assert sorted(p for _, p in hook.reads) == sorted(files)  # each file read once
    # The 23 were in flight together: none was in the group hop (no single starts before
    # it returns), so the group ended with its first, slow, read.
    assert not hook.broken
    assert len({hook.thread(p) for p in files[1:]}) == len(files) - 1
    assert not reader.pace.fast


def test_a_transient_error_in_a_group_is_retried_and_counted(files: list[str]) -> None:
    """The first try of a file in the middle of a group fails with EIO: that file is tried
    again (counted once); the files after it come from the same group hop, read once."""
    retried: list[str] = []
    hook = Recording(fail_once={files[10]})
    reader = never_slow(FileReader(64, read=hook, retries=2, on_retry=lambda path, exc: retried.append(path)))
    got = fetch(reader, files)
    assert got == contents(files)
    assert retried == [files[10]]
    # One thread read the whole group, in order (the failed try among them); the file was
    # tried again, once; every other file was read once.
    (group,) = {hook.thread(p) for p in files}
    assert hook.files_per_thread()[group][: len(files)] == files
    assert hook.tries() == {p: 2 if p == files[10] else 1 for p in files}


def test_transient_errors_of_every_file_in_a_group_are_each_retried_and_counted(files: list[str]) -> None:
    """The first try of every file fails with EIO: each is tried again once and counted
    once, never read a third time; the bytes come back in order."""
    retried: list[str] = []
    hook = Recording(fail_once=files)
    reader = never_slow(FileReader(64, read=hook, retries=2, on_retry=lambda path, exc: retried.append(path)))
    got = fetch(reader, files)
    assert got == contents(files)
    assert sorted(retried) == files
    assert hook.tries() == {p: 2 for p in files}


def test_a_transient_error_in_a_group_is_charged_to_its_files_retries(files: list[str]) -> None:
    """With ``retries=0`` a transient error in a group is that file's ReadError, wherever it
    falls in the group: no file gets a try its budget does not have."""
    retried: list[str] = []
    hook = Recording(fail_once={files[3], files[7]})
    reader = never_slow(FileReader(64, read=hook, retries=0, on_retry=lambda path, exc: retried.append(path)))
    got = fetch(reader, files)
    for i in (3, 7):
        assert isinstance(got[i], ReadError) and (got[i].index, got[i].path) == (i, files[i])
        assert isinstance(got[i].__cause__, OSError) and got[i].__cause__.errno == errno.EIO
    assert [g for i, g in enumerate(got) if i not in (3, 7)] == contents(files[:3] + files[4:7] + files[8:])
    assert retried == []
    assert hook.tries() == {p: 1 for p in files}


def test_a_file_failing_transiently_for_good_in_a_group_fails_alone(files: list[str]) -> None:
    """Every try of a file in the middle of a group fails with EIO: it is tried ``retries``
    more times (each counted), then is a ReadError of its own; the others are read once."""
    retried: list[str] = []
    hook = Recording(fail_always={files[10]})
    reader = never_slow(FileReader(64, read=hook, retries=2, on_retry=lambda path, exc: retried.append(path)))
    got = fetch(reader, files)
    assert isinstance(got[10], ReadError) and (got[10].index, got[10].path) == (10, files[10])
    assert isinstance(got[10].__cause__, OSError) and got[10].__cause__.errno == errno.EIO
    assert got[:10] + got[11:] == contents(files[:10] + files[11:])
    assert retried == [files[10]] * 2
    assert hook.tries() == {p: 3 if p == files[10] else 1 for p in files}


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
    assert (got[3].index, got[3].path) == (3, str(empty))


def test_a_timeout_reads_one_file_per_hop(files: list[str]) -> None:
    """With a ``timeout`` (``sample_timeout``), fast files are not grouped: each is a hop of
    its own (so a read past the timeout is abandoned alone). The six reads wait for each
    other: all in flight at once, on six threads, a file each. The timeout is never reached."""
    paths = files[:6]
    hook = Recording(meet=len(paths))
    got = fetch(never_slow(FileReader(64, read=hook)), paths, timeout=120.0)
    assert got == contents(paths)
    assert not hook.broken
    assert sorted(map(sorted, hook.files_per_thread().values())) == [[p] for p in sorted(paths)]


def test_reads_past_the_timeout_fail_on_their_own_samples(files: list[str]) -> None:
    """Reads that hang until the test releases them: each becomes a LoaderTimeoutError
    naming its own file; the abandoned reads end once released, before the reader closes."""
    paths = files[:3]
    release = threading.Event()
    reader = FileReader(64, read=Recording(hold=release))

    async def go() -> list[Any]:
        return await reader.fetch_many(list(enumerate(paths)), None, 0.05)

    try:
        got = asyncio.run(go())
    finally:
        release.set()
        reader.close()
    assert all(isinstance(g, LoaderTimeoutError) for g in got)
    assert [(g.index, g.path) for g in got] == list(enumerate(paths))


def test_pace_turns_slow_and_back() -> None:
    pace = ReadPace()
    assert pace.fast
    for _ in range(5):
        pace.observe(0.02)
    assert not pace.fast
    for _ in range(30):
        pace.observe(0.00005)
    assert pace.fast


@pytest.mark.parametrize("timeout", [None, 120.0])
def test_a_read_that_raises_timeouterror_is_that_samples_read_error(
    files: list[str], timeout: float | None
) -> None:
    """A socket timeout inside a custom ``read`` (the builtin ``TimeoutError``, which
    ``asyncio.TimeoutError`` is on Python 3.11+) is an OSError of that sample, tried again
    and then a ReadError naming it, never mistaken for ``sample_timeout`` running out."""
    tries: list[str] = []

    def read(path: str) -> bytes:
        tries.append(path)
        if path == files[1]:
            raise TimeoutError("the socket timed out")
        return Path(path).read_bytes()

    reader = FileReader(64, read=read, retries=1)
    got = fetch(reader, files[:3], timeout=timeout)
    assert got[0] == Path(files[0]).read_bytes() and got[2] == Path(files[2]).read_bytes()
    assert isinstance(got[1], ReadError) and not isinstance(got[1], LoaderTimeoutError)
    assert (got[1].index, got[1].path) == (1, files[1]) and "the socket timed out" in str(got[1])
    assert isinstance(got[1].__cause__, TimeoutError)
    assert tries.count(files[1]) == 1  # no errno: not a transient error, not tried again
