"""Reader processes (``decode=None``): groups of small local files read in other processes
into shared memory, the loop copying each file out; failures on their own files; a worker
that dies leaves its group to the loop; nothing left after close (the ``no_leaks``
fixture)."""

from __future__ import annotations

import asyncio
import errno
import math
import os
import pickle
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import write_numbered_files

from aioloader import ReadError
from aioloader.read import readproc
from aioloader.read import workers as workers_mod
from aioloader.read.blocking import ReadPace
from aioloader.read.reader import FileReader
from aioloader.read.readmsgs import GroupRead
from aioloader.read.routing import LOOP, MAX_READ_WORKERS, WORKERS, read_workers, route
from aioloader.read.workers import ReadWorkers

#: How long a test waits for the zygote to fork a worker before it gives up (never reached
#: when things work).
START_TIMEOUT = 60.0


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_numbered_files(tmp_path / "f", 24)


def started(n: int) -> ReadWorkers:
    """``n`` workers, started and known to be up."""
    workers = ReadWorkers(n)
    workers.start()
    deadline = time.monotonic() + START_TIMEOUT
    while len(workers.pids()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(workers.pids()) == n, "the reader processes did not start"
    return workers


def on_loop(fn: Callable[[], Any]) -> Any:
    async def go() -> Any:
        return await fn()

    return asyncio.run(go())


def read_once(paths: list[str]) -> Any:
    """What one started reader process answers for ``paths`` (closed afterwards): every
    path's result, in order, whether its last group stopped at a slow read, and each read's
    time. A group may
    stop early at a read that looked slow or at its time budget (a loaded machine: a CI run
    beside other work) and leave the rest to the caller, who sends them again, as the reader
    does; so does this."""
    workers = started(1)
    got: list[Any] = []
    times: list[float] = []
    slow = False
    try:
        while len(got) < len(paths):
            rest = paths[len(got) :]
            answer = on_loop(lambda rest=rest: workers.read(rest))
            if answer is None:
                return None
            assert answer.files, "a group answered nothing"
            got += answer.files
            slow = answer.slow
            times += answer.times
    finally:
        workers.close()
    return got, slow, times


# -- pure: when and how many ----------------------------------------------------------------


def test_route_fast_own_reads_go_to_workers_once_one_started() -> None:
    fast = {"files": 16, "fast": True, "local": True, "whole": True, "timeout": None}
    assert route(**fast, own_read=True, loop_free=True, workers=True) == WORKERS
    assert route(**fast, own_read=True, loop_free=True, workers=False) == LOOP
    assert route(**{**fast, "fast": False}, own_read=True, loop_free=True, workers=True) != WORKERS
    assert route(**{**fast, "timeout": 1.0}, own_read=True, loop_free=True, workers=True) != WORKERS


def test_read_workers_leave_a_cpu_and_come_only_without_decode_custom_read_or_timeout() -> None:
    plain = {"decoding": False, "own_read": True, "timeout": None}
    assert read_workers(2, 2, **plain) == 1  # a CPU for the loop and the trainer
    assert read_workers(2, 8, **plain) == 2
    assert read_workers(64, 64, **plain) == MAX_READ_WORKERS
    assert read_workers(2, 1, **plain) == 0  # one CPU: the loop reads
    assert read_workers(2, 8, **{**plain, "decoding": True}) == 0
    assert read_workers(2, 8, **{**plain, "own_read": False}) == 0
    assert read_workers(2, 8, **{**plain, "timeout": 3.0}) == 0


# -- the workers ----------------------------------------------------------------------------


def test_a_group_comes_back_as_bytes_and_errors_in_order(files: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    paths = [*files[:3], str(tmp_path / "missing"), str(tmp_path), str(empty), *files[3:]]
    answer = read_once(paths)
    assert answer is not None
    got, _, times = answer
    assert len(got) == len(times) == len(paths)
    assert [got[i] for i in (0, 1, 2)] == [Path(p).read_bytes() for p in files[:3]]
    assert got[6:] == [Path(p).read_bytes() for p in files[3:]]
    assert isinstance(got[3], FileNotFoundError) and got[3].filename == paths[3]
    assert isinstance(got[4], IsADirectoryError) and got[4].filename == paths[4]
    assert got[5] == b""


def test_a_file_larger_than_the_buffer_comes_through_the_pipe(
    files: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers_mod, "BUFFER_BYTES", 64)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1000))
    paths = [files[0], str(big), files[1], files[2], files[3], files[4], files[5]]
    answer = read_once(paths)
    assert answer is not None
    assert answer[0] == [Path(p).read_bytes() for p in paths]  # 64 bytes hold 4 of the small ones


def test_groups_share_the_workers_and_a_dead_one_is_left_out(files: list[str]) -> None:
    """Four groups at once on two workers: each comes back whole. Then one worker is killed:
    the next groups go to the other; once both are dead, ``read`` says None (the reader
    reads on the loop)."""
    workers = started(2)
    groups = [files[i : i + 6] for i in range(0, 24, 6)]

    async def go() -> list[Any]:
        first = await asyncio.gather(*(workers.read(g) for g in groups))
        os.kill(workers.pids()[0], signal.SIGKILL)
        after = [await workers.read(g) for g in groups]
        os.kill(workers.pids()[1], signal.SIGKILL)
        last = [await workers.read(g) for g in groups]
        return [first, after, last]

    try:
        first, after, last = on_loop(go)
    finally:
        workers.close()
    want = [[Path(p).read_bytes() for p in g] for g in groups]
    assert [a.files for a in first] == want
    # The killed worker's group (if it got one) came back None; every other is whole.
    assert sum(a is None for a in after) <= 1
    assert all(a.files == w for a, w in zip(after, want, strict=True) if a is not None)
    assert all(a is None for a in last)


def test_a_worker_reads_the_next_group_while_the_loop_takes_the_last(files: list[str]) -> None:
    """One worker is sent two groups before it answers the first, each into a part of its
    buffer of its own: both come back whole, in order. A group whose wait was cancelled
    does not hand its bytes to the next; the part is used again by a third group."""
    workers = started(1)
    g1, g2, g3 = files[:8], files[8:16], files[16:]

    async def go() -> tuple[int, Any, Any, Any]:
        first = asyncio.ensure_future(workers.read(g1))
        second = asyncio.ensure_future(workers.read(g2))
        await asyncio.sleep(0)  # both sent, neither answered yet
        in_flight = max(len(w.sent) for w in workers._all)
        first.cancel()
        got2 = await second
        got3 = await workers.read(g3)
        again = await asyncio.gather(workers.read(g1), workers.read(g2))
        return in_flight, got2, got3, again

    try:
        in_flight, got2, got3, again = on_loop(go)
    finally:
        workers.close()
    assert in_flight == readproc.PARTS == 2
    assert got2.files == [Path(p).read_bytes() for p in g2]
    assert got3.files == [Path(p).read_bytes() for p in g3]
    assert [a.files for a in again] == [[Path(p).read_bytes() for p in g] for g in (g1, g2)]


def test_a_worker_killed_with_groups_in_flight_fails_each_of_them(files: list[str], tmp_path: Path) -> None:
    """Both groups sent to a worker that dies come back None (the reader reads them on the
    loop); nothing waits for ever. The first group holds the worker on a FIFO with no
    writer (its open blocks), so neither is answered before the kill."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    workers = started(1)

    async def go() -> tuple[int, list[Any]]:
        reads = [asyncio.ensure_future(workers.read(g)) for g in ([str(fifo)], files)]
        await asyncio.sleep(0.2)  # the worker is in the FIFO's open
        in_flight = len(workers._all[0].sent)
        os.kill(workers.pids()[0], signal.SIGKILL)
        return in_flight, await asyncio.wait_for(asyncio.gather(*reads), 30)

    try:
        in_flight, got = on_loop(go)
    finally:
        workers.close()
    assert in_flight == 2 and got == [None, None]


def test_parts_of_a_worker_dead_before_its_first_group_go_to_another(
    files: list[str], tmp_path: Path
) -> None:
    """Groups wait while the one live worker is held on a FIFO; a second worker, dead before
    the loop first sees it, has its two parts handed to them. The first to send finds it
    dead; the other does not hang on the dead worker (nor the loop spin on its pipe): it
    waits for the live one, which answers once the FIFO opens."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    workers = started(2)
    live, dead = workers._started  # neither seen by the loop yet
    workers._started = [live]

    async def go() -> list[Any]:
        held = [asyncio.ensure_future(workers.read(g)) for g in ([str(fifo)], [str(fifo)])]
        await asyncio.sleep(0.2)  # both parts of the live worker hold a group
        waiting = [asyncio.ensure_future(workers.read(files[i : i + 4])) for i in (0, 4)]
        await asyncio.sleep(0)
        os.kill(dead.proc.pid, signal.SIGKILL)
        dead.proc.join(10)
        workers._started = [dead]
        later = asyncio.ensure_future(workers.read(files[8:12]))  # its take hands the dead parts out
        await asyncio.sleep(0.2)
        for _ in held:  # one open each: the worker's reads of the FIFO end
            os.close(os.open(fifo, os.O_WRONLY))
            await asyncio.sleep(0.1)
        return await asyncio.wait_for(asyncio.gather(*held, *waiting, later), 30)

    try:
        got = on_loop(go)
    finally:
        workers.close()
    want = [[Path(p).read_bytes() for p in files[i : i + 4]] for i in (0, 4, 8)]
    first, second, later = got[2:]
    assert first is None  # sent to the dead worker: the reader reads it on the loop
    assert [second.files, later.files] == want[1:]  # passed over to the live worker, not hung


def test_a_reader_with_workers_reads_like_one_without(files: list[str], tmp_path: Path) -> None:
    """Through ``FileReader.fetch_many``: the same bytes and the same ReadErrors naming
    their files, the groups read by the workers (their reads counted once each)."""
    paths = [*files[:10], str(tmp_path / "missing"), *files[10:]]
    reader = FileReader(64, loop_free=True, workers=started(2))
    reader.pace.slow = reader.pace.budget = math.inf

    async def go() -> list[Any]:
        return await reader.fetch_many(list(enumerate(paths)), None, None)

    try:
        got = asyncio.run(go())
    finally:
        reader.close()
    assert [g for i, g in enumerate(got) if i != 10] == [Path(p).read_bytes() for p in files]
    assert isinstance(got[10], ReadError) and (got[10].index, got[10].path) == (10, paths[10])
    assert isinstance(got[10].__cause__, FileNotFoundError)
    assert reader.meter.snapshot().items == len(paths)


class FlakyWorkers:
    """Stands in for started reader processes: answers each group as one would (each file's
    bytes, or its ``OSError``), the first try of the ``fail_once`` files an EIO; records the
    files each group read."""

    ready = True

    def __init__(self, fail_once: set[str]) -> None:
        self.fail_once = fail_once
        self.reads: list[str] = []

    async def read(self, paths: list[str]) -> Any:
        out: list[Any] = []
        for path in paths:
            self.reads.append(path)
            if path in self.fail_once:
                self.fail_once.discard(path)
                out.append(OSError(errno.EIO, "I/O error", path))
            else:
                out.append(Path(path).read_bytes())
        return GroupRead(out, False, [0.0] * len(out))

    def close(self, grace: float = 2.0) -> None:
        pass


def test_transient_errors_in_a_workers_group_are_each_retried_and_counted(files: list[str]) -> None:
    """Two files of a group read by the reader processes fail with EIO: each is tried again
    (counted once); every other file comes from the group, read once."""
    workers = FlakyWorkers({files[4], files[9]})
    retried: list[str] = []
    reader = FileReader(
        64,
        loop_free=True,
        workers=workers,
        on_retry=lambda path, exc: retried.append(path),  # type: ignore[arg-type]
    )
    reader.pace.slow = reader.pace.budget = math.inf

    async def go() -> list[Any]:
        return await reader.fetch_many(list(enumerate(files)), None, None)

    try:
        got = asyncio.run(go())
    finally:
        reader.close()
    assert got == [Path(p).read_bytes() for p in files]
    assert sorted(retried) == [files[4], files[9]]
    assert workers.reads == files  # one group; the two tried again on their own


def test_closing_with_a_group_in_flight_is_quiet(files: list[str], capfd: pytest.CaptureFixture[str]) -> None:
    """Closed while a worker reads a long group: it ends without a word (no traceback of a
    broken pipe on stderr), and nothing is left (the ``no_leaks`` fixture)."""
    workers = started(1)

    async def go() -> None:
        reading = asyncio.ensure_future(workers.read(files * 400))
        await asyncio.sleep(0)  # sent
        workers.close()
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)

    on_loop(go)
    assert "Traceback" not in capfd.readouterr().err


# -- what a worker runs, here ----------------------------------------------------------------


def test_a_workers_group_read_lands_in_its_buffer(files: list[str], tmp_path: Path) -> None:
    """Hinted reads straight into the buffer, one after another; a larger file read whole
    and copied in; one that does not fit comes back as bytes; failures name their files."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(100))
    paths = [files[0], files[1], str(big), files[2], str(tmp_path / "missing"), str(tmp_path), files[3]]
    buf = memoryview(bytearray(140))
    answer = readproc.read_into(buf, paths, ReadPace())
    got, slow, times = answer.files, answer.slow, answer.times
    assert not slow and len(got) == len(times) == len(paths)
    placed = [bytes(buf[o : o + n]) if type(r) is tuple and (o := r[0], n := r[1]) else r for r in got]
    assert placed[:4] == [Path(p).read_bytes() for p in paths[:4]]
    assert [got[0], got[1], got[2], got[3]] == [(0, 13), (13, 13), (26, 100), (126, 13)]
    assert isinstance(got[4], FileNotFoundError) and got[4].filename == paths[4]
    assert isinstance(got[5], IsADirectoryError) and got[5].filename == paths[5]
    assert got[6] == Path(files[3]).read_bytes()  # 1 byte left: not in the buffer


def test_a_workers_group_stops_at_a_slow_read_or_its_budget(files: list[str]) -> None:
    buf = memoryview(bytearray(1 << 16))
    every_read_slow = ReadPace()
    every_read_slow.slow = -1.0
    answer = readproc.read_into(buf, files, every_read_slow)
    assert answer.slow and len(answer.files) == 1
    no_budget = ReadPace()
    no_budget.slow, no_budget.budget = math.inf, -1.0
    answer = readproc.read_into(buf, files, no_budget)
    assert not answer.slow and len(answer.files) == 1


def test_a_group_that_cannot_be_sent_holds_no_part(files: list[str]) -> None:
    """Paths that do not pickle fail in the caller before a part is taken: the next groups
    get both parts, each answer paired with its own."""
    workers = started(1)

    async def go() -> list[Any]:
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            await workers.read([lambda: None])  # type: ignore[list-item]
        return await asyncio.gather(workers.read(files[:3]), workers.read(files[3:6]))

    try:
        got = on_loop(go)
    finally:
        workers.close()
    assert [a.files for a in got] == [[Path(p).read_bytes() for p in g] for g in (files[:3], files[3:6])]
