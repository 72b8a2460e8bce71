"""Which way a chunk of reads goes (pure: no I/O, no event loop; the reader asks
:func:`route` before each chunk, :class:`~aioloader.read.reader.FileReader` does what it says),
and which of a chunk's byte ranges are read together (:func:`coalesce`: samples of one tar
shard asked together, as the shard-local order asks them, cost one ranged read).

Four ways, cheapest for the loader's own thread first:

- ``WORKERS``: the files one after another in a reader process
  (:mod:`aioloader.read.workers`), into shared memory; the loop only copies each out. With
  ``decode=None`` reading is all a loader does, and this puts the system calls on other
  cores. Only what ``LOOP`` could take, once a worker has started.
- ``LOOP``: the files one after another on the event loop itself, no executor hop. A
  page-cached file reads in a few microseconds, less than a hop costs (a thread wake-up,
  two futures, the loop's callbacks and GIL hand-offs between the threads: a read thread
  gives up the GIL at each system call, and the loop takes it each time). Only for the
  library's own reads of whole local files, which cannot hang the loop for longer than a
  slow read (the group stops at its first) or the group's budget, and only where nothing
  else on the loop needs it at short notice: not while Ray tasks wait on it. A local decode
  pool does not: each worker has a chunk queued behind the one it decodes.
- ``THREAD``: the files one after another on one read thread (one hop for the chunk); a
  custom ``read`` may block in ways only the reader's pace sees, so it goes here.
- ``SINGLES``: one hop (or, for a URL, one coroutine) per file, thousands in flight: what
  slow storage needs, and what a ``sample_timeout`` needs (a read past it is abandoned
  alone).
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "COALESCE_GAP",
    "COALESCE_MOST",
    "LOOP",
    "MAX_READ_WORKERS",
    "SINGLES",
    "THREAD",
    "WORKERS",
    "Route",
    "coalesce",
    "read_workers",
    "route",
]

Route = Literal["workers", "loop", "thread", "singles"]
WORKERS: Route = "workers"
LOOP: Route = "loop"
THREAD: Route = "thread"
SINGLES: Route = "singles"


def route(
    *,
    files: int,
    fast: bool,
    local: bool,
    whole: bool,
    timeout: float | None,
    own_read: bool,
    loop_free: bool,
    workers: bool = False,
) -> Route:
    """The way ``files`` reads go.

    ``fast``: recent reads were fast (:class:`~aioloader.read.blocking.ReadPace`); ``local``:
    no URL among them; ``whole``: whole files, no byte ranges; ``timeout``: the
    ``sample_timeout``; ``own_read``: the library's reads, not a custom ``read``;
    ``loop_free``: nothing else on the loop waits on it at short notice (no Ray tasks); ``workers``: a
    reader process has started.
    """
    if files < 2 or not fast or not local or not whole or timeout is not None:
        return SINGLES
    if own_read and loop_free:
        return WORKERS if workers else LOOP
    return THREAD


#: Reader processes at most: one loop copies out what four read (a few hundred thousand
#: small files a second); more would only hold memory.
MAX_READ_WORKERS = 4


def read_workers(
    num_workers: int, cpus: int, *, decoding: bool, own_read: bool, timeout: float | None
) -> int:
    """Reader processes to start where groups could go to them (no decode, the library's
    reads, no ``sample_timeout``), else 0: ``num_workers``, but no more than the ``cpus``
    (usable CPUs) less the one the loop and the trainer take, at most
    :data:`MAX_READ_WORKERS`. On 2 CPUs, one: a second would take turns on the same cores
    with the loop and the trainer (slower, RESULTS §20d)."""
    if decoding or not own_read or timeout is not None:
        return 0
    return max(0, min(num_workers, cpus - 1, MAX_READ_WORKERS))


#: Bytes between two byte ranges of one file read as one: a tar's members between two images
#: (a label, a JSON, their headers) are a few KiB; a far object's round trip costs more.
COALESCE_GAP = 64 << 10
#: The most bytes one coalesced read brings.
COALESCE_MOST = 8 << 20


def coalesce(
    paths: list[str], spans: list[tuple[int, int]], gap: int = COALESCE_GAP, most: int = COALESCE_MOST
) -> list[list[int]]:
    """The positions of a chunk's byte-range reads, grouped into reads of one file each:
    ranges of one path at most ``gap`` bytes apart (after sorting by offset), the group's
    whole span at most ``most`` bytes. Every position is in exactly one group; a group of one
    is a read of its own. Groups keep the chunk's order of their first position."""
    by_path: dict[str, list[int]] = {}
    for i, path in enumerate(paths):
        by_path.setdefault(path, []).append(i)
    groups: list[list[int]] = []
    for members in by_path.values():
        members.sort(key=lambda i: spans[i][0])
        group = [members[0]]
        start, end = spans[members[0]][0], sum(spans[members[0]])
        for i in members[1:]:
            off, length = spans[i]
            if off - end <= gap and max(end, off + length) - start <= most:
                group.append(i)
                end = max(end, off + length)
            else:
                groups.append(group)
                group, start, end = [i], off, off + length
        groups.append(group)
    return sorted(groups, key=min)
