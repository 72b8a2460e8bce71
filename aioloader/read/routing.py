"""Which way a chunk of reads goes (pure: no I/O, no event loop; the reader asks
:func:`route` before each chunk, :class:`~aioloader.read.reader.FileReader` does what it says).

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

__all__ = ["LOOP", "MAX_READ_WORKERS", "SINGLES", "THREAD", "WORKERS", "Route", "read_workers", "route"]

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
