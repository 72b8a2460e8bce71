"""Stage 2: read whole files on the event loop through aiofiles; failures become
:class:`~aioloader.SampleError` s naming the file (:meth:`FileReader.fetch`).

aiofiles runs blocking file calls (:mod:`aioloader.read.blocking`) on an executor. Three things
make that scale:

- its own thread pool, sized to ``io_concurrency``. The loop's default executor has
  ``min(32, cpus + 4)`` threads, which silently caps "thousands of reads in flight" at a
  handful; on network storage each read mostly waits, so threads are what buys latency
  hiding.
- one executor hop per file. ``aiofiles.open`` + ``read`` + ``close`` is three hops;
  wrapping the whole open/read/close (aiofiles' own ``wrap``) is one.
- several files per step while reads are fast (:meth:`FileReader.fetch_many`): by a reader
  process, on the loop, or in one hop to a thread (:mod:`aioloader.read.groups`), giving up
  as soon as one read is slow (see :class:`ReadPace`); what is left, and everything while
  reads are slow (network storage), goes one file per hop, thousands in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

from aiofiles.os import wrap

from aioloader.base.threads import DaemonThreadPool
from aioloader.errors import LoaderTimeoutError, SampleError
from aioloader.memory.results import Source
from aioloader.memory.slabs import Arena
from aioloader.memory.slots import OrderedSlots
from aioloader.observe.stages import StageMeter
from aioloader.read.backends import StorageBackend
from aioloader.read.blocking import (
    ReadPace,
    check_span,
    into,
    read_file,
    read_into,
    read_span,
    store,
    store_span,
    timed,
)
from aioloader.read.groups import Groups
from aioloader.read.outcomes import TRANSIENT, backoff, checked
from aioloader.read.remote import RemoteStore
from aioloader.read.routing import coalesce
from aioloader.read.urls import is_remote, redact
from aioloader.read.workers import ReadWorkers

__all__ = ["FileReader", "ReadPace", "Source", "read_file"]  # ReadPace, read_file: from .blocking


class FileReader:
    """Reads files with at most ``io_concurrency`` reads in flight, a limit
    :meth:`set_limit` may move up to ``max_io`` (default ``io_concurrency``) while reading.

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
        storage_options: Mapping[str, Any] | None = None,
        storage_backend: StorageBackend = "auto",
        meter: StageMeter | None = None,
        max_io: int | None = None,
        loop_free: bool = False,
        workers: ReadWorkers | None = None,
    ) -> None:
        #: Reads in flight at most, now (see :meth:`set_limit`).
        self.io_concurrency = io_concurrency
        self.max_io = max(io_concurrency, max_io or io_concurrency)
        #: Reads in flight (holding one of the ``io_concurrency`` slots) and their latency.
        self.meter = meter if meter is not None else StageMeter("read", bound=io_concurrency)
        # URLs go to the remote store unless a custom ``read`` takes every path itself.
        self.remote = RemoteStore(storage_options, self.max_io, storage_backend) if read is None else None
        self.retries = retries
        self._on_retry = on_retry
        self.pace = ReadPace()
        self._plain = read or read_file
        self._plain_into = read_into if read is None else partial(store, read)
        # One file per hop: timed on the I/O thread, so the pace sees the read, not its wait.
        self._read = wrap(partial(timed, self.pace, self._plain))
        self._read_into = wrap(partial(timed, self.pace, self._plain_into))
        self._read_span = wrap(
            partial(timed, self.pace, read_span if read is None else partial(store_span, read))
        )
        # Threads start on demand: as many as reads have been in flight at once.
        self._pool = DaemonThreadPool(self.max_io, thread_name_prefix="aioloader-io")
        self._sem: OrderedSlots | None = None  # first come, first served (one key)
        #: Fast groups; reader processes (closed with this reader) among their ways.
        self.groups = Groups(
            pace=self.pace,
            meter=self.meter,
            pool=self._pool,
            slots=self._slots,
            plain=self._plain,
            plain_into=self._plain_into,
            own=read is None,
            loop_free=loop_free,
            workers=workers,
        )

    def set_limit(self, limit: int) -> None:
        """At most ``limit`` (1..``max_io``) reads in flight from now on; reads over it
        finish, and no new one starts until fewer are in flight. On the loader's loop."""
        limit = max(1, min(self.max_io, limit))
        self.io_concurrency = limit
        self.meter.bound = self.meter.capacity = limit
        if self._sem is not None:
            self._sem.set_limit(limit)

    def _slots(self) -> OrderedSlots:
        if self._sem is None:  # created lazily so it binds to the loader's loop
            self._sem = OrderedSlots(self.io_concurrency)
        return self._sem

    async def read(self, path: str, failed: OSError | None = None) -> bytes:
        """The file's bytes; raises the ``OSError`` of the last failed try. ``failed``: a
        first try already failed with that (transient) error."""
        if self.remote is not None and is_remote(path):
            got: bytes = await self._retrying(path, failed, self._cat, path, None)
            return got
        data: bytes = await self._retrying(path, failed, self._read, path)
        return data

    async def read_into(self, path: str, arena: Arena, failed: OSError | None = None) -> Source:
        """Like :meth:`read`, but into ``arena`` when the file fits (one executor hop)."""
        if self.remote is not None and is_remote(path):
            got: Source = await self._retrying(path, failed, self._cat, path, arena)
            return got
        src: Source = await self._retrying(path, failed, self._read_into, path, arena)
        return src

    async def read_span(
        self, path: str, span: tuple[int, int], arena: Arena | None, failed: OSError | None = None
    ) -> Source:
        """``span = (offset, length)`` bytes of the file or object (into ``arena`` when
        given and they fit); an ``EINVAL`` OSError when it ends before the span does."""
        if self.remote is not None and is_remote(path):
            got: Source = await self._retrying(path, failed, self._cat, path, arena, span)
            return got
        src: Source = await self._retrying(path, failed, self._read_span, path, span, arena)
        return src

    async def _cat(
        self, url: str, arena: Arena | None, span: tuple[int, int] | None = None, executor: Any = None
    ) -> Source:
        """A remote object (or ``span`` of it), awaited on this loop (no thread); into
        ``arena`` when it fits."""
        assert self.remote is not None
        start, end = (None, None) if span is None else (span[0], span[0] + span[1])
        got = await self.remote.cat(url, start, end)
        # fsspec gives bytes, obstore a buffer of its own (copied once, below: into the arena)
        data: bytes | memoryview = got if isinstance(got, bytes) else memoryview(got)
        if span is not None:
            if len(data) > span[1]:  # a server that ignores Range sends the whole object
                data = data[span[0] : span[0] + span[1]]
            check_span(len(data), span)
        if arena is None:
            return data if isinstance(data, bytes) else bytes(data)
        return into(data, arena)

    async def fetch_many(
        self,
        items: list[tuple[int, str]],
        arena: Arena | None,
        timeout: float | None,
        spans: list[tuple[int, int] | None] | None = None,
    ) -> list[Source | SampleError]:
        """The bytes (or the :class:`SampleError`) of each ``(index, path)`` (only the
        ``(offset, length)`` of ``spans[i]`` when given), as :meth:`fetch` would give them;
        while reads of whole local files are fast (and no ``timeout`` bounds them), several
        are read one after another (:mod:`aioloader.read.groups`)."""
        # A plain path has no "://": that test first, per file, before any call.
        local = self.remote is None or all("://" not in path for _, path in items)
        local = local or not any(is_remote(path) for _, path in items)
        whole = spans is None or all(s is None for s in spans)
        # ``failed``: the files whose try in a group failed with a transient error, by
        # position; each is tried again below, that try charged to its ``retries`` (and
        # counted), alongside the files the groups left over.
        done, failed = await self.groups.fetch(items, arena, timeout, local and whole, self.io_concurrency)
        start = len(done)
        if not whole and not failed and start == 0:
            assert spans is not None
            return await self._fetch_coalesced(items, arena, timeout, spans)
        if failed or start < len(items):
            again = [*failed, *range(start, len(items))]
            got = await asyncio.gather(
                *(
                    self._fetch_or_error(
                        items[i][1], items[i][0], arena, timeout, failed.get(i), spans[i] if spans else None
                    )
                    for i in again
                )
            )
            for i, res in zip(failed, got[: len(failed)], strict=True):
                done[i] = res
            done.extend(got[len(failed) :])
        return cast("list[Source | SampleError]", done)  # every OSError replaced above

    async def _fetch_coalesced(
        self,
        items: list[tuple[int, str]],
        arena: Arena | None,
        timeout: float | None,
        spans: list[tuple[int, int] | None],
    ) -> list[Source | SampleError]:
        """A chunk of byte ranges, those of one file close together read as one
        (:func:`~aioloader.read.routing.coalesce`); a whole file's read (no span) alone."""
        ranged = [i for i, span in enumerate(spans) if span is not None]
        out: list[Source | SampleError] = [b""] * len(items)
        groups = coalesce([items[i][1] for i in ranged], [spans[i] or (0, 0) for i in ranged])
        jobs = [[ranged[k] for k in group] for group in groups]
        jobs += [[i] for i, span in enumerate(spans) if span is None]
        results = await asyncio.gather(
            *(self._fetch_group(items, job, arena, timeout, spans) for job in jobs)
        )
        for job, got in zip(jobs, results, strict=True):
            for i, res in zip(job, got, strict=True):
                out[i] = res
        return out

    async def _fetch_group(
        self,
        items: list[tuple[int, str]],
        job: list[int],
        arena: Arena | None,
        timeout: float | None,
        spans: list[tuple[int, int] | None],
    ) -> list[Source | SampleError]:
        """The ranges ``job`` of one file, in one read when there are several; if that read
        fails, each is read alone, so each sample gets its own retries and its own error."""
        if len(job) > 1:
            ranges = [spans[i] or (0, 0) for i in job]
            start = min(off for off, _ in ranges)
            end = max(off + length for off, length in ranges)
            path, index = items[job[0]][1], items[job[0]][0]
            try:
                whole = await self.fetch(path, index, None, timeout, None, (start, end - start))
            except SampleError:
                pass
            else:
                view = memoryview(cast(bytes, whole))
                pieces = (view[off - start : off - start + length] for off, length in ranges)
                return [into(piece, arena) if arena is not None else bytes(piece) for piece in pieces]
        return list(
            await asyncio.gather(
                *(self._fetch_or_error(items[i][1], items[i][0], arena, timeout, None, spans[i]) for i in job)
            )
        )

    async def _fetch_or_error(
        self,
        path: str,
        index: int,
        arena: Arena | None,
        timeout: float | None,
        failed: OSError | None,
        span: tuple[int, int] | None,
    ) -> Source | SampleError:
        try:
            return await self.fetch(path, index, arena, timeout, failed, span)
        except SampleError as err:
            return err

    async def fetch(
        self,
        path: str,
        index: int,
        arena: Arena | None,
        timeout: float | None,
        failed: OSError | None = None,
        span: tuple[int, int] | None = None,
    ) -> Source:
        """Sample ``index``'s bytes (only ``span = (offset, length)`` of them when given;
        into ``arena`` when given and they fit). Raises
        :class:`ReadError` (missing, unreadable, empty, I/O error after the retries) or
        :class:`LoaderTimeoutError` past ``timeout`` seconds, retries included; after a
        timeout the abandoned read may still write into ``arena``."""
        # Errors are built outside the except blocks and chained to a cause without its
        # traceback: a traceback's frames would keep ``arena`` (the whole slab) mapped for
        # as long as the error lives (in a log handler, say).
        failure: OSError | None = None
        timed_out = False
        src: Source = b""
        try:
            if span is not None:
                reading = self.read_span(path, span, arena, failed)
            elif arena is None:
                reading = self.read(path, failed)
            else:
                reading = self.read_into(path, arena, failed)
            if timeout is None:
                src = await reading
            else:
                # Not wait_for: its TimeoutError is the builtin one (3.11+), the same class a
                # read raises for a socket timeout, which is an OSError of this sample.
                task = asyncio.ensure_future(reading)
                try:
                    done, _ = await asyncio.wait({task}, timeout=timeout)
                except BaseException:  # cancelled from outside: the read goes with it
                    task.cancel()
                    raise
                if done:
                    src = task.result()
                else:
                    task.cancel()
                    timed_out = True
        except OSError as exc:
            failure = exc.with_traceback(None)
        if timed_out:
            raise LoaderTimeoutError(
                f"read took longer than sample_timeout={timeout}s", path=redact(path), index=index
            )
        result = checked(src if failure is None else failure, path, index, self.io_concurrency)
        if isinstance(result, SampleError):
            raise result
        return result

    async def _retrying(self, path: str, failed: OSError | None, fn: Callable[..., Any], *args: Any) -> Any:
        slots = self._slots()
        attempt = 0
        if failed is not None:  # the first try was part of a group read
            attempt = 1
            if attempt > self.retries:
                raise failed
            if self._on_retry is not None:
                self._on_retry(path, failed)
            await asyncio.sleep(backoff(attempt))
        while True:
            try:
                async with slots.slot(()):
                    with self.meter.timed():
                        return await fn(*args, executor=self._pool)
            except OSError as exc:
                attempt += 1
                if exc.errno not in TRANSIENT or attempt > self.retries:
                    raise
                if self._on_retry is not None:
                    self._on_retry(path, exc)
                await asyncio.sleep(backoff(attempt))

    async def aclose(self) -> None:
        """Close the remote store's connections (on the loader's loop, before it stops)."""
        if self.remote is not None:
            await self.remote.aclose()

    def close(self, grace: float = 2.0) -> list[str]:
        """Stop the I/O threads and the reader processes; returns the names of threads
        abandoned in a hung read."""
        if self.groups.workers is not None:
            self.groups.workers.close(grace)
        self._pool.shutdown(wait=True, cancel_futures=True, grace=grace)
        return self._pool.stuck
