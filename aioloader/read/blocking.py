"""What runs on the read threads, one call per executor hop: a whole file, a byte range, a
custom ``read``, each straight into a slab's arena when it fits; and a group of files read
one after another while reads are fast (:class:`ReadPace`), on one thread or, for the
library's own reads with nothing else waiting on the loop, on the loop itself
(:mod:`aioloader.read.groups`). Blocking, no event loop: the loop side is
:class:`aioloader.read.reader.FileReader`.

Every function returns a :data:`~aioloader.memory.results.Source`: ``(offset, length)`` in
the arena, or the bytes themselves when they do not fit.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from aioloader.memory.results import Source
from aioloader.memory.slabs import Arena
from aioloader.read.mounts import Mounts
from aioloader.read.urls import local_path

__all__ = [
    "GROUP_THREADS",
    "HINT_MAX",
    "MOUNTS",
    "HintedRead",
    "ReadPace",
    "check_span",
    "into",
    "named",
    "own_time",
    "read_file",
    "read_group",
    "read_into",
    "read_span",
    "run_queue_seconds",
    "store",
    "store_span",
    "timed",
]


#: The largest size hint a read trusts (:func:`read_file`): a read allocates what it is
#: hinted, and past glibc's mmap threshold (128 KiB) each allocation would map fresh pages.
HINT_MAX = 64 * 1024


def read_file(path: str, hint: int = 0) -> bytes:
    """Read a whole file: open, fstat, one read of its size and a byte more, close.

    Four system calls and no file object: a page-cached file of a few KB reads faster than
    through ``open(...).readall()``, which adds a file object, an lseek, a second fstat and a
    last read to see the end (RESULTS, "Figures moved out of the code"). The byte more sees
    the end in the same read; a file that grew while read is read on to its end, one that
    shrank gives what is there.

    ``hint``: the size the file probably has (the largest of its neighbours': see
    :class:`HintedRead`). Up to :data:`HINT_MAX`, the read asks for that and a byte more
    without an fstat (a fifth less time for a page-cached file of a few KB); a file that
    turns out larger is read on to its end. A short answer is then taken for the end of the
    file: hint only where the filesystem says so (:mod:`aioloader.read.mounts`).
    """
    fd = _open(path)
    try:
        if 0 < hint <= HINT_MAX:
            data = os.read(fd, hint + 1)
            return data if len(data) <= hint else _read_rest(fd, data)
        return _read_all(fd, os.fstat(fd).st_size)
    except OSError as exc:
        raise named(exc, path) from None
    finally:
        os.close(fd)


class HintedRead:
    """:func:`read_file` (or :func:`read_into` ``arena``) for the files of one group, one
    after another on one thread, each hinted with the largest size read before it (files of
    a dataset tend to be alike) where its filesystem answers reads whole
    (:mod:`aioloader.read.mounts`)."""

    def __init__(self, arena: Arena | None = None) -> None:
        self.arena = arena
        self.hint = 0

    def __call__(self, path: str) -> Source:
        hint = self.hint
        if hint:
            local = local_path(path)
            if not MOUNTS.whole_reads(local[: local.rfind(os.sep) + 1]):
                hint = 0
        got = read_file(path, hint) if self.arena is None else read_into(path, self.arena, hint)
        size = got[1] if isinstance(got, tuple) else len(got)
        if size > self.hint:
            self.hint = size
        return got


def read_into(path: str, arena: Arena, hint: int = 0) -> Source:
    """Read ``path`` straight into ``arena`` (no intermediate bytes object); the bytes
    themselves when it does not fit or changed size while being read. ``hint``: as for
    :func:`read_file` (the arena gives back what the file did not take)."""
    fd = _open(path)
    try:
        if 0 < hint <= HINT_MAX and (at := arena.alloc(hint + 1)) is not None:
            n = os.readv(fd, [arena.buf[at : at + hint + 1]])
            if n <= hint:
                arena.shrink(at, hint + 1, n)
                return (at, n)
            head = bytes(arena.buf[at : at + n])  # larger than hinted: not in the arena
            arena.shrink(at, hint + 1, 0)
            return _read_rest(fd, head)
        size = os.fstat(fd).st_size
        off = arena.alloc(size) if size > 0 else None
        if off is None:
            return _read_all(fd, size)
        view = arena.buf[off : off + size]
        extra = bytearray(1)  # a byte past the end, in the same call: whether it grew
        got = 0
        while got < size:
            n = os.readv(fd, [view[got:], extra])
            if not n:
                break
            got += n
        if got < size:  # shrank under us: what is there
            return bytes(view[:got])
        if got > size:  # grew under us: read on to its end
            return _read_rest(fd, bytes(view) + bytes(extra))
        return (off, size)
    except OSError as exc:
        raise named(exc, path) from None
    finally:
        os.close(fd)


def _open(path: str) -> int:
    return os.open(local_path(path), os.O_RDONLY | os.O_CLOEXEC)


def _read_all(fd: int, size: int) -> bytes:
    """The rest of ``fd``, ``size`` bytes long as far as fstat knows: one read when it is
    (a byte more than that sees the end); read on when it grew, or when the filesystem
    answered short of it."""
    data = os.read(fd, size + 1)
    return data if len(data) == size else _read_rest(fd, data)


def _read_rest(fd: int, head: bytes) -> bytes:
    """``head`` and whatever follows it in ``fd``, to the end."""
    parts = [head]
    want = max(os.fstat(fd).st_size - len(head), 0) + 1
    while more := os.read(fd, want):
        parts.append(more)
        want = max(want, 65536)
    return b"".join(parts)


def named(exc: OSError, path: str) -> OSError:
    """``exc`` naming ``path`` (a failed read or fstat, unlike a failed open, names no file)."""
    if exc.filename is None:
        exc.filename = path
    return exc


def read_span(path: str, span: tuple[int, int], arena: Arena | None) -> Source:
    """``span = (offset, length)`` bytes of a local file, into ``arena`` when given and they
    fit; an ``EINVAL`` OSError when the file ends before the span does."""
    offset, length = span
    with open(local_path(path), "rb", buffering=0) as f:
        off = arena.alloc(length) if arena is not None else None
        if arena is None or off is None:
            data = os.pread(f.fileno(), length, offset)
            check_span(len(data), span)
            return data
        view = arena.buf[off : off + length]
        got = 0
        while got < length:
            n = os.preadv(f.fileno(), [view[got:]], offset + got)
            if not n:
                break
            got += n
        check_span(got, span)
        return (off, length)


def check_span(got: int, span: tuple[int, int]) -> None:
    if got < span[1]:
        raise OSError(
            errno.EINVAL,
            f"bytes {span[0]}-{span[0] + span[1] - 1} asked for, but it ends after {span[0] + got} bytes",
        )


def store_span(read: Callable[[str], bytes], path: str, span: tuple[int, int], arena: Arena | None) -> Source:
    """A custom ``read`` gives the whole file: the span is cut out of it."""
    data = read(path)[span[0] : span[0] + span[1]]
    check_span(len(data), span)
    return data if arena is None else into(data, arena)


def store(read: Callable[[str], bytes], path: str, arena: Arena) -> Source:
    """Run a custom ``read`` and put its bytes into ``arena`` when they fit."""
    return into(read(path), arena)


def into(data: bytes | memoryview, arena: Arena) -> Source:
    """``data`` copied into ``arena`` when it fits, else ``data`` itself (as ``bytes``)."""
    off = arena.alloc(len(data)) if data else None
    if off is None:
        return data if isinstance(data, bytes) else bytes(data)
    arena.buf[off : off + len(data)] = data
    return (off, len(data))


#: This process's answers: which folders' filesystems answer reads whole.
MOUNTS = Mounts()

#: Group hops at once. Fast reads need no parallelism (one thread reads page-cached files
#: at tens of thousands a second), and every extra thread in the GIL's queue delays the
#: trainer's own threads.
GROUP_THREADS = 2


_SCHEDSTAT = "/proc/thread-self/schedstat"
_schedstat = os.path.exists(_SCHEDSTAT)


def run_queue_seconds() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU, since it
    started (the second field of ``/proc/thread-self/schedstat``); 0.0 where the kernel
    does not say (not Linux, or no ``CONFIG_SCHED_INFO``).

    A read that took long on the clock may have waited for a CPU, not for storage: on a
    machine whose cores the decode workers keep busy, reads in groups outlasted the slow mark
    while nearly all of their time went to waiting to run (RESULTS §24). Such a read says
    nothing about the storage, and counting it as slow sent the rest of its chunk one read
    per hop."""
    global _schedstat
    if not _schedstat:
        return 0.0
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)  # cheap; per thread, so not kept
        try:
            return int(os.read(fd, 128).split()[1]) / 1e9
        finally:
            os.close(fd)
    except (ValueError, IndexError, FileNotFoundError):  # the kernel does not say: asked no more
        _schedstat = False
        return 0.0
    except OSError:  # out of descriptors for a moment, say: this read goes by the clock
        return 0.0


class ReadPace:
    """Whether reads are fast enough to group (pure; fed from the I/O threads).

    A read is *slow* past ``slow`` seconds (1 ms: far above a page-cache hit, far below a
    network round trip); in a group, not counting the time its thread waited for a CPU
    (:func:`run_queue_seconds`). Reads one per hop are timed on the clock alone: there
    thousands of threads may read at once, and asking each one's run-queue time cost
    throughput behind slow storage (RESULTS §24, tried and reverted). Reads are grouped while the
    recent slow share is small; a group stops at its first slow read, and at ``budget``
    seconds in all, so a group never holds back the files after it for long.
    """

    slow = 0.001
    budget = 0.004

    def __init__(self) -> None:
        self.slow_share = 0.0  # exponentially weighted share of slow reads

    def observe(self, seconds: float) -> None:
        self.slow_share = 0.9 * self.slow_share + 0.1 * (seconds > self.slow)

    def observe_all(self, times: list[float]) -> None:
        """:meth:`observe` each of ``times`` in order (a reader process's group)."""
        share, slow = self.slow_share, self.slow
        for seconds in times:
            share = 0.9 * share + 0.1 * (seconds > slow)
        self.slow_share = share

    @property
    def fast(self) -> bool:
        return self.slow_share < 0.2


def timed(pace: ReadPace, fn: Callable[..., Source], *args: Any) -> Source:
    """``fn(*args)``, its time told to ``pace``."""
    start = time.perf_counter()
    try:
        return fn(*args)
    finally:
        pace.observe(time.perf_counter() - start)


def read_group(
    one: Callable[[str], Source], paths: list[str], pace: ReadPace
) -> tuple[list[Source | OSError], bool]:
    """Read ``paths`` in order on this thread until one read is slow or the budget is spent:
    the results of those attempted (the rest are left to the caller), and whether the last
    was slow."""
    out: list[Source | OSError] = []
    queued = run_queue_seconds()  # asked again only after a read that looks slow
    start = t = time.perf_counter()
    slow = pace.slow
    for path in paths:
        try:
            out.append(one(path))
        except OSError as exc:
            out.append(exc.with_traceback(None))
        now = time.perf_counter()
        took = now - t
        if took > slow:
            took, queued = own_time(took, queued)
        pace.observe(took)
        if took > slow:
            return out, True
        if now - start > pace.budget:
            break
        t = now
    return out, False


def own_time(took: float, queued: float) -> tuple[float, float]:
    """A read's ``took`` seconds less what this thread waited for a CPU since ``queued``
    (:func:`run_queue_seconds` at the group's start or its last slow-looking read), and the
    mark for the next. The wait counted may include what the group's earlier, fast reads
    waited, so a read up to that much slower than the mark may be taken for fast; that is
    bounded by the group's ``budget`` (4 ms): a read slower than the budget and the mark
    together always stops the group."""
    now = run_queue_seconds()
    return max(0.0, took - (now - queued)), now
