"""Stage 2: read whole files on the event loop through aiofiles; failures become
:class:`~aioloader.SampleError` s naming the file (:meth:`FileReader.fetch`).

aiofiles runs blocking file calls on an executor. Two things make that scale:

- its own thread pool, sized to ``io_concurrency``. The loop's default executor has
  ``min(32, cpus + 4)`` threads, which silently caps "thousands of reads in flight" at a
  handful; on network storage each read mostly waits, so threads are what buys latency
  hiding.
- one executor hop per file. ``aiofiles.open`` + ``read`` + ``close`` is three hops;
  wrapping the whole open/read/close (aiofiles' own ``wrap``) is one.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from aiofiles.os import wrap

from .decode.protocol import Source
from .decode.slabs import Arena
from .errors import LoaderTimeoutError, ReadError
from .threads import DaemonThreadPool

__all__ = ["FileReader", "Source", "read_file"]


def read_file(path: str) -> bytes:
    """Read a whole file with one open and, for a stable file, one read call."""
    with open(path, "rb", buffering=0) as f:
        return f.readall()


def _read_into(path: str, arena: Arena) -> Source:
    """Read ``path`` straight into ``arena`` (no intermediate bytes object); the bytes
    themselves when it does not fit or changed size while being read."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        off = arena.alloc(size) if size > 0 else None
        if off is None:
            return f.readall()
        view = arena.buf[off : off + size]
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
        if got < size or f.read(1):  # shrank or grew under us: take what is there now
            f.seek(0)
            return f.readall()
        return (off, size)


def _store(read: Callable[[str], bytes], path: str, arena: Arena) -> Source:
    """Run a custom ``read`` and put its bytes into ``arena`` when they fit."""
    data = read(path)
    off = arena.alloc(len(data)) if data else None
    if off is None:
        return data
    arena.buf[off : off + len(data)] = data
    return (off, len(data))


#: errno values worth another try: the storage may answer next time. EMFILE/ENFILE (too many
#: open files) clear as other reads finish.
TRANSIENT = frozenset(
    {
        errno.EIO,
        errno.EAGAIN,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.EBUSY,
        errno.ESTALE,
        errno.EMFILE,
        errno.ENFILE,
    }
)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): 50 ms doubling, at most 2 s."""
    return float(min(2.0, 0.05 * 2 ** (attempt - 1)))


class FileReader:
    """Reads files with at most ``io_concurrency`` reads in flight.

    ``read`` is the blocking ``path -> bytes`` function run on the I/O threads (default
    :func:`read_file`; a custom one reads from another store, or injects faults and delays
    in tests and benchmarks). A transient ``OSError`` (:data:`TRANSIENT`) is retried
    ``retries`` times with :func:`backoff`; ``on_retry`` is told each time. Created on any
    thread; the reads must be awaited on the loader's loop.
    """

    def __init__(
        self,
        io_concurrency: int,
        read: Callable[[str], bytes] | None = None,
        retries: int = 2,
        on_retry: Callable[[str, OSError], None] | None = None,
    ) -> None:
        self.io_concurrency = io_concurrency
        self.retries = retries
        self._on_retry = on_retry
        self._read = wrap(read or read_file)
        self._read_into = wrap(_read_into) if read is None else wrap(partial(_store, read))
        self._pool = DaemonThreadPool(io_concurrency, thread_name_prefix="aioloader-io")
        self._sem: asyncio.Semaphore | None = None

    async def read(self, path: str) -> bytes:
        """The file's bytes; raises the ``OSError`` of the last failed try."""
        data: bytes = await self._retrying(path, self._read, path)
        return data

    async def read_into(self, path: str, arena: Arena) -> Source:
        """Like :meth:`read`, but into ``arena`` when the file fits (one executor hop)."""
        src: Source = await self._retrying(path, self._read_into, path, arena)
        return src

    async def fetch(self, path: str, index: int, arena: Arena | None, timeout: float | None) -> Source:
        """Sample ``index``'s bytes (into ``arena`` when given and they fit). Raises
        :class:`ReadError` (missing, unreadable, empty, I/O error after the retries) or
        :class:`LoaderTimeoutError` past ``timeout`` seconds, retries included; after a
        timeout the abandoned read may still write into ``arena``."""
        # Errors are built outside the except blocks and chained to a cause without its
        # traceback: a traceback's frames would keep ``arena`` (the whole slab) mapped for
        # as long as the error lives (in a log handler, say).
        failure: OSError | None = None
        timed_out = False
        try:
            reading = self.read(path) if arena is None else self.read_into(path, arena)
            src: Source = await asyncio.wait_for(reading, timeout)
        except asyncio.TimeoutError:
            timed_out = True
        except OSError as exc:
            failure = exc.with_traceback(None)
        if timed_out:
            raise LoaderTimeoutError(
                f"read took longer than sample_timeout={timeout}s", path=path, index=index
            )
        if failure is not None:
            hint = ""
            if failure.errno in (errno.EMFILE, errno.ENFILE):
                io = self.io_concurrency
                hint = f"; raise the open-file limit (ulimit -n) or lower io_concurrency={io}"
            why = failure.strerror or failure
            raise ReadError(f"cannot read file: {why}{hint}", path=path, index=index) from failure
        if (src[1] if isinstance(src, tuple) else len(src)) == 0:
            raise ReadError("empty file", path=path, index=index)
        return src

    async def _retrying(self, path: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self._sem is None:  # created lazily so it binds to the loader's loop
            self._sem = asyncio.Semaphore(self.io_concurrency)
        attempt = 0
        while True:
            try:
                async with self._sem:
                    return await fn(*args, executor=self._pool)
            except OSError as exc:
                attempt += 1
                if exc.errno not in TRANSIENT or attempt > self.retries:
                    raise
                if self._on_retry is not None:
                    self._on_retry(path, exc)
                await asyncio.sleep(backoff(attempt))

    def close(self, grace: float = 2.0) -> list[str]:
        """Stop the I/O threads; returns the names of those abandoned in a hung read."""
        self._pool.shutdown(wait=True, cancel_futures=True, grace=grace)
        return self._pool.stuck
