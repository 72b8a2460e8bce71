"""Fast local reads: the blocking read functions at the edges (a file that grows or shrinks
while read, one that does not fit its arena, a directory), which way a chunk of reads goes
(:func:`~aioloader.read.routing.route`, pure), and chunks read on the loader's loop itself,
their failures on their own samples."""

from __future__ import annotations

import asyncio
import errno
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import write_numbered_files

from aioloader import ReadError
from aioloader.memory.slabs import Arena
from aioloader.read import blocking, mounts
from aioloader.read.blocking import read_file, read_into
from aioloader.read.reader import FileReader
from aioloader.read.routing import LOOP, SINGLES, THREAD, route


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_numbered_files(tmp_path / "f", 24)


def lying_fstat(monkeypatch: pytest.MonkeyPatch, path: str, delta: int) -> None:
    """``os.fstat`` says ``path`` is ``delta`` bytes longer than it is, as if it had changed
    size between the fstat and the read."""
    real = os.fstat
    ino = os.stat(path).st_ino

    class Stat:
        def __init__(self, st: os.stat_result) -> None:
            self.st_size = st.st_size + delta

    def fstat(fd: int) -> Any:
        st = real(fd)
        return Stat(st) if st.st_ino == ino else st

    monkeypatch.setattr(blocking.os, "fstat", fstat)


# -- the blocking reads --------------------------------------------------------------------


def test_read_file_reads_the_whole_file(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(300_000))
    assert read_file(str(big)) == big.read_bytes()
    assert read_file(f"file://{big}") == big.read_bytes()
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert read_file(str(empty)) == b""


@pytest.mark.parametrize("delta", [-5, 7])
def test_a_file_that_changed_size_is_read_to_its_end(
    files: list[str], monkeypatch: pytest.MonkeyPatch, delta: int
) -> None:
    """fstat says 5 bytes fewer (the file grew after it) or 7 more (it shrank): the bytes
    are the file's all the same, whole or into an arena."""
    lying_fstat(monkeypatch, files[3], delta)
    want = Path(files[3]).read_bytes()
    assert read_file(files[3]) == want
    arena = Arena(memoryview(bytearray(4096)))
    got = read_into(files[3], arena)
    assert got == want  # not in the arena: its size is not the one allocated


def test_read_into_the_arena_or_bytes_when_it_does_not_fit(files: list[str]) -> None:
    buf = bytearray(30)
    arena = Arena(memoryview(buf))
    first = read_into(files[0], arena)
    assert first == (0, 13) and bytes(buf[:13]) == b"sample-000000"
    second = read_into(files[1], arena)
    assert second == (13, 13) and bytes(buf[13:26]) == b"sample-000001"
    assert read_into(files[2], arena) == b"sample-000002"  # 4 bytes left: not in the arena


def test_a_directory_is_an_oserror_naming_it(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as info:
        read_file(str(tmp_path))
    assert info.value.filename == str(tmp_path)
    with pytest.raises(FileNotFoundError) as missing:
        read_file(str(tmp_path / "missing"))
    assert missing.value.filename == str(tmp_path / "missing")


def test_reads_leave_no_descriptor_open(files: list[str], tmp_path: Path) -> None:
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        read_file(files[0])
        read_into(files[1], Arena(memoryview(bytearray(64))))
        with pytest.raises(IsADirectoryError):
            read_file(str(tmp_path))
    assert set(os.listdir("/proc/self/fd")) <= before


# -- which way a chunk goes ---------------------------------------------------------------

FAST = {"files": 16, "fast": True, "local": True, "whole": True, "timeout": None}


def test_route_fast_own_reads_go_on_the_loop_when_it_is_free() -> None:
    assert route(**FAST, own_read=True, loop_free=True) == LOOP
    assert route(**FAST, own_read=True, loop_free=False) == THREAD  # a decode stage waits on it
    assert route(**FAST, own_read=False, loop_free=True) == THREAD  # a custom read may block


@pytest.mark.parametrize(
    "change",
    [{"files": 1}, {"fast": False}, {"local": False}, {"whole": False}, {"timeout": 5.0}],
    ids=["one-file", "slow", "url", "byte-range", "sample-timeout"],
)
def test_route_one_per_hop(change: dict[str, Any]) -> None:
    """A lone file, slow storage, a URL, byte ranges, a ``sample_timeout``: one hop each."""
    for own_read in (True, False):
        assert route(**{**FAST, **change}, own_read=own_read, loop_free=True) == SINGLES


# -- chunks read on the loop ---------------------------------------------------------------


def fetch(reader: FileReader, paths: list[str], arena: Arena | None = None) -> list[Any]:
    async def go() -> list[Any]:
        return await reader.fetch_many(list(enumerate(paths)), arena, None)

    try:
        return asyncio.run(go())
    finally:
        reader.close()


def io_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aioloader-io")]


def test_fast_reads_on_a_free_loop_start_no_read_thread(files: list[str]) -> None:
    reader = FileReader(64, loop_free=True)
    reader.pace.slow = reader.pace.budget = math.inf
    got = fetch(reader, files)
    assert got == [Path(p).read_bytes() for p in files]
    assert reader.meter.snapshot().items == len(files)
    assert not io_threads()


def test_groups_go_on_past_the_budget(files: list[str]) -> None:
    """Each group reads one file (no time budget) and the next group follows: fast reads
    never fall back to one hop per file just because a chunk is long."""
    reader = FileReader(64, loop_free=True)
    reader.pace.slow, reader.pace.budget = math.inf, 0.0
    arena = Arena(memoryview(bytearray(1 << 16)))
    got = fetch(reader, files, arena)
    assert [bytes(arena.buf[o : o + n]) for o, n in got] == [Path(p).read_bytes() for p in files]
    assert not io_threads()


def test_a_read_that_waited_for_a_cpu_is_not_slow(files: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that took 3 ms on the clock while its thread waited longer than that for a
    CPU (as the kernel's run-queue time says) is not slow: the group goes on. One that
    waited for storage stops the group and counts as slow."""
    import time

    def sleepy(path: str) -> bytes:
        time.sleep(0.003)
        return Path(path).read_bytes()

    waits = iter([0.0, 1.0, 2.0])  # at the group's start; after each slow-looking read (1 s each)
    monkeypatch.setattr(blocking, "run_queue_seconds", lambda: next(waits))
    pace = blocking.ReadPace()
    got, slow = blocking.read_group(sleepy, files[:2], pace)
    assert len(got) == 2 and not slow
    assert pace.slow_share == 0

    monkeypatch.setattr(blocking, "run_queue_seconds", lambda: 0.0)
    got, slow = blocking.read_group(sleepy, files[:2], pace)
    assert len(got) == 1 and slow
    assert pace.slow_share > 0


def test_own_time_is_the_clock_less_the_wait_for_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocking, "run_queue_seconds", lambda: 1.0025)
    took, mark = blocking.own_time(0.003, 1.0)
    assert took == pytest.approx(0.0005) and mark == 1.0025  # the mark for the next read
    assert blocking.own_time(0.002, 1.0) == (0.0, 1.0025)  # waited longer than it took: 0, never < 0


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="no schedstat here")
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_run_queue_seconds_counts_the_wait_for_a_busy_cpu() -> None:
    """This thread and a spinning child process share one CPU: the time this thread then
    waits to run grows, as the kernel counts it; alone, it hardly does."""
    import multiprocessing as mp
    import time

    cpu = min(os.sched_getaffinity(0))
    before_affinity = os.sched_getaffinity(0)
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    child = ctx.Process(target=_spin_on, args=(cpu, stop), daemon=True)
    child.start()
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.05)  # the child is spinning
        start = blocking.run_queue_seconds()
        end_at = time.perf_counter() + 0.2
        while time.perf_counter() < end_at:
            pass
        waited = blocking.run_queue_seconds() - start
    finally:
        os.sched_setaffinity(0, before_affinity)
        stop.set()
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
    assert waited > 0.02  # about half of 0.2 s, each taking turns; far more than none


def _spin_on(cpu: int, stop: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        pass


def test_failures_on_the_loop_land_on_their_own_samples(files: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    paths = [files[0], str(tmp_path / "missing"), files[1], str(empty), str(tmp_path), files[2]]
    reader = FileReader(8, loop_free=True)
    reader.pace.slow = reader.pace.budget = math.inf
    got = fetch(reader, paths)
    assert [got[0], got[2], got[5]] == [Path(p).read_bytes() for p in (files[0], files[1], files[2])]
    for i, cause, text in [
        (1, FileNotFoundError, "No such file"),
        (3, None, "empty file"),
        (4, IsADirectoryError, "Is a directory"),
    ]:
        assert isinstance(got[i], ReadError) and (got[i].index, got[i].path) == (i, paths[i])
        assert text in str(got[i])
        assert cause is None or (
            isinstance(got[i].__cause__, cause) and got[i].__cause__.__traceback__ is None
        )


def test_a_transient_error_on_the_loop_is_retried(files: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first try of two files fails with EIO inside a loop group: each is tried again
    (counted once); every other file comes from the group, opened once."""
    real_open = blocking._open
    failing = {files[4], files[9]}
    opened: list[str] = []

    def flaky_open(path: str) -> int:
        opened.append(path)
        if path in failing:
            failing.discard(path)
            raise OSError(errno.EIO, "I/O error", path)
        return real_open(path)

    monkeypatch.setattr(blocking, "_open", flaky_open)
    retried: list[str] = []
    reader = FileReader(64, loop_free=True, on_retry=lambda path, exc: retried.append(path))
    reader.pace.slow = reader.pace.budget = math.inf
    got = fetch(reader, files)
    assert got == [Path(p).read_bytes() for p in files]
    assert sorted(retried) == [files[4], files[9]]
    assert sorted(opened) == sorted([*files, files[4], files[9]])


@pytest.mark.parametrize("hint", [1, 13, 4096, blocking.HINT_MAX, blocking.HINT_MAX + 1])
def test_a_size_hint_never_changes_the_bytes(tmp_path: Path, files: list[str], hint: int) -> None:
    """Hinted smaller, equal or larger than the file (or past what a hint may be): the
    file's bytes, whole."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(200_000))
    for p in [files[0], str(big)]:
        assert read_file(p, hint) == Path(p).read_bytes()


def test_hinted_reads_learn_the_size(files: list[str], tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(5000))
    one = blocking.HintedRead()
    for p in [files[0], files[1], str(big), files[2]]:
        assert one(p) == Path(p).read_bytes()
    assert one.hint == 5000


# -- which filesystems answer reads whole ---------------------------------------------------

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
29 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
41 29 0:45 / /mnt/fuse rw,nosuid,nodev,relatime shared:20 master:3 - fuse.sshfs host:/ rw,user_id=0
garbage line
"""


def test_parse_mountinfo_gives_each_device_its_type() -> None:
    assert mounts.parse_mountinfo(MOUNTINFO) == {(0, 21): "proc", (254, 0): "ext4", (0, 45): "fuse.sshfs"}
    assert mounts.whole_reads("ext4") and mounts.whole_reads("tmpfs") and mounts.whole_reads("nfs4")
    assert not mounts.whole_reads("fuse.sshfs") and not mounts.whole_reads("cifs")
    assert not mounts.whole_reads(None)


def fake_mounts(tmp_path: Path, fstype: str) -> mounts.Mounts:
    """Mounts that say ``tmp_path``'s filesystem is ``fstype``."""
    dev = os.stat(tmp_path).st_dev
    info = tmp_path / "mountinfo"
    info.write_text(f"1 1 {os.major(dev)}:{os.minor(dev)} / / rw - {fstype} /dev/x rw\n")
    return mounts.Mounts(str(info))


@pytest.mark.parametrize(("fstype", "whole"), [("ext4", True), ("fuse.sshfs", False)])
def test_hints_only_where_reads_come_back_whole(
    tmp_path: Path, files: list[str], monkeypatch: pytest.MonkeyPatch, fstype: str, whole: bool
) -> None:
    """On ext4 the files after the first are read without an fstat; on a FUSE mount (which
    may answer a read short in the middle of a file) every file is read to its fstat size."""
    fake = fake_mounts(tmp_path, fstype)
    assert fake.whole_reads(str(tmp_path) + "/") is whole
    assert fake.whole_reads(str(tmp_path / "missing") + "/") is False  # cannot tell: no hint
    monkeypatch.setattr(blocking, "MOUNTS", fake)
    stats: list[int] = []
    real = os.fstat

    def counted(fd: int) -> Any:
        stats.append(fd)
        return real(fd)

    monkeypatch.setattr(blocking.os, "fstat", counted)
    for arena in (None, Arena(memoryview(bytearray(1 << 12)))):
        stats.clear()
        one = blocking.HintedRead(arena)
        got = [one(p) for p in files[:5]]
        if arena is None:
            assert got == [Path(p).read_bytes() for p in files[:5]]
        else:
            assert [bytes(arena.buf[o : o + n]) for o, n in got] == [Path(p).read_bytes() for p in files[:5]]
            assert [o for o, _ in got] == [13 * i for i in range(5)]  # no room left unused
        assert len(stats) == (1 if whole else 5)


def test_a_filesystem_that_answers_short_is_read_to_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads that come back 1,000 bytes at a time (a FUSE server's way): the whole file
    all the same, where no hint is trusted."""
    data = os.urandom(10_000)
    (tmp_path / "f.bin").write_bytes(data)
    real = os.read
    monkeypatch.setattr(blocking.os, "read", lambda fd, n: real(fd, min(n, 1000)))
    assert read_file(str(tmp_path / "f.bin")) == data


def test_a_pace_told_a_group_at_once_is_the_pace_told_each_read() -> None:
    times = [0.0001, 0.002, 0.0001, 0.003, 0.005, 0.0001]
    one, all_at_once = blocking.ReadPace(), blocking.ReadPace()
    for seconds in times:
        one.observe(seconds)
    all_at_once.observe_all(times)
    assert all_at_once.slow_share == pytest.approx(one.slow_share) and one.slow_share > 0
