"""The sample cache on the loader's event loop: which samples it serves, which it fills.

For each chunk of reads the engine asks :meth:`SampleCache.serve`; each sample is then

- **a hit**: its entry's bytes go straight into the batch's input arena (from memory, or
  read from the entry file on a cache thread, its checks passed); the source is not read;
- **a miss to keep**: read from the source as without a cache, then, once its decode
  succeeded, kept by :meth:`SampleCache.keep` (its bytes, or the small image its worker made
  with ``max_side``) under the key :meth:`serve` gave it;
- **a miss not kept** (:data:`UNKEPT`): the bound is reached, the disk said it is full, or
  its identity is unknown (a file that cannot be stat'ed now, a custom ``read`` whose paths
  are not files, an object of :mod:`aioloader.cache.identity`'s exceptions), or the cache
  did not answer within ``sample_timeout``: read from the source, as every epoch will.

Identities, and so keys, are :mod:`aioloader.cache.identity`'s. A cache that fails (an entry
that cannot be read, a write refused) loses its entry, never the sample: the source is read,
one WARNING on the ``aioloader`` logger per kind of failed write (its errno: ENOSPC, EACCES,
EIO, ...) says why, and ``CacheStats.write_errors`` counts them. Loop-bound, but for the
blocking parts on the cache's own daemon threads: stats and lookups on one pool, writes on
another (a write waits for the disk store's count of its folder; lookups never wait behind
writes).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import TypeVar

from aioloader.base.threads import DaemonThreadPool
from aioloader.cache.diskstore import BAD, DiskStore, failed_write
from aioloader.cache.identity import Fill, Identities
from aioloader.cache.memstore import MemoryStore
from aioloader.cache.settings import Cache
from aioloader.memory.results import Source
from aioloader.memory.slabs import Arena
from aioloader.observe.cachestats import CacheStats
from aioloader.read.remote import RemoteStore

__all__ = ["THREADS", "UNKEPT", "Fill", "SampleCache"]

log = logging.getLogger("aioloader")
T = TypeVar("T")

#: Cache threads for stats and lookups at most: stats of files on network storage, one per
#: hop, wait in parallel.
THREADS = 64
#: A miss :meth:`SampleCache.serve` will not keep (read from the source every epoch).
UNKEPT = ""


class SampleCache:
    """One loader's cache of ``settings``, at most ``max_bytes``; ``timeout``: the loader's
    ``sample_timeout``, which bounds the cache's answer for a chunk too; ``publish`` is
    given each new :class:`CacheStats`. :attr:`remote`: the reader's client of URLs (None
    with a custom ``read``: URLs then have no identity). Made where the pipeline is built
    (a disk cache's folder made and checked there, its entries counted on a cache thread);
    closed with the pipeline."""

    def __init__(
        self,
        settings: Cache,
        max_bytes: int,
        timeout: float | None = None,
        publish: Callable[[CacheStats], None] = lambda _: None,
    ) -> None:
        self.settings = settings
        self._timeout = timeout
        self._publish = publish
        folder = settings.folder
        self._disk = DiskStore(folder, max_bytes) if folder is not None else None
        self._memory = MemoryStore(max_bytes) if folder is None else None
        if self._disk is not None:  # an error here names the folder
            self._disk.folder.mkdir(parents=True, exist_ok=True)
            if not os.access(self._disk.folder, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "cannot write the folder", str(self._disk.folder))
        self._pool = DaemonThreadPool(THREADS, thread_name_prefix="aioloader-cache")
        self._writer = DaemonThreadPool(2, thread_name_prefix="aioloader-cache-write")
        self._opened: Future[None] | None = None
        if self._disk is not None:
            self._opened = self._writer.submit(self._disk.open)
        self.ids = Identities(settings.fingerprint, self._pool, disk=self._disk is not None)
        self.stats = CacheStats(max_bytes=max_bytes)
        self._writing: dict[str, asyncio.Future[bool]] = {}
        #: The same writes as the writer threads run them: :meth:`close` counts those that
        #: landed once the loop no longer could (each write counted once, by whoever pops it).
        self._jobs: dict[str, Future[bool]] = {}
        self._warned: set[str] = set()

    @property
    def remote(self) -> RemoteStore | None:
        return self.ids.remote

    @remote.setter
    def remote(self, remote: RemoteStore | None) -> None:
        self.ids.remote = remote

    @property
    def shrink(self) -> tuple[int, int] | None:
        """``(max_side, quality)`` for the workers: every miss's file is decoded small
        (kept or not), so the model sees one resolution whatever the bound."""
        s = self.settings
        return None if s.max_side is None else (s.max_side, s.quality)

    def _store(self) -> MemoryStore | DiskStore:
        store = self._memory if self._memory is not None else self._disk
        assert store is not None
        return store

    async def begin(self, epoch: int) -> None:
        """An epoch begins: the last one's misses are kept first (their HEADs answered,
        their writes landed: they are hits here, not read and written again), then its
        figures start from zero."""
        if self.ids.asking:
            await self._within(asyncio.wait(list(self.ids.asking)), None)
        if self._writing:
            await self._within(asyncio.wait(list(self._writing.values())), None)
        self.stats = replace(self.stats, epoch=epoch, epoch_hits=0, epoch_misses=0)
        self._publish(self.stats)

    async def _within(self, work: Awaitable[T], default: T) -> T:
        """``work``, or ``default`` past ``sample_timeout`` (a cache thread may go on)."""
        if self._timeout is None:
            return await work
        try:
            return await asyncio.wait_for(work, self._timeout)
        except asyncio.TimeoutError:
            return default

    async def serve(
        self, paths: list[str], spans: list[tuple[int, int] | None] | None, arena: Arena | None
    ) -> tuple[list[Source | None], list[Fill | None]]:
        """For each of ``paths`` (``spans``: the byte ranges the samples are), its bytes from
        the cache (into ``arena`` when given and they fit) or None to read it; and what
        :meth:`keep` needs of each miss: its key (or the future of it), or :data:`UNKEPT`."""
        n = len(paths)
        nothing: list[Fill | None] = [None] * n
        keys = await self._within(self.ids.keys(paths, spans), nothing)
        got: list[Source | None] = [None] * n
        wanted = [i for i, k in enumerate(keys) if isinstance(k, str)]
        lost: list[Source | str | None] = []
        found = (
            await self._within(self._lookup([str(keys[i]) for i in wanted], arena), lost) if wanted else []
        )
        rejected = 0
        for i, src in zip(wanted, found, strict=False):  # none found: the lookup timed out
            if src == BAD:
                rejected += 1
            elif src is not None and not isinstance(src, str):
                got[i] = src
        room = self._store().room()
        fills: list[Fill | None] = [
            None if src is not None else (key if key is not None and room else UNKEPT)
            for src, key in zip(got, keys, strict=True)
        ]
        hits = n - got.count(None)
        served = sum(s[1] if isinstance(s, tuple) else len(s) for s in got if s is not None)
        over = sum(1 for f, k in zip(fills, keys, strict=True) if f == UNKEPT and k is not None)
        full = self._disk is not None and self._disk.full is not None  # not the bound: the disk
        unkept = {"write_errors" if full else "over_bound": over}
        self._count(hits=hits, misses=n - hits, rejected=rejected, served=served, **unkept)
        return got, fills

    async def _lookup(self, keys: list[str], arena: Arena | None) -> list[Source | str | None]:
        if self._memory is not None:
            return [self._from_memory(k, arena) for k in keys]
        disk = self._disk
        assert disk is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: [disk.read(k, arena) for k in keys])

    def _from_memory(self, key: str, arena: Arena | None) -> Source | None:
        assert self._memory is not None
        view = self._memory.get(key)
        if view is None:
            return None
        at = arena.alloc(len(view)) if arena is not None and len(view) else None
        if at is None:
            return bytes(view)
        assert arena is not None
        arena.buf[at : at + len(view)] = view
        return (at, len(view))

    def keep(self, fill: Fill, data: bytes | memoryview, size: int) -> None:
        """Keep ``data`` for the miss ``fill`` (:meth:`serve`; :data:`UNKEPT`: nothing), once
        its key is known. ``size``: the source's length as read, checked against what an
        object's HEAD announced (:meth:`Identities.check`)."""
        if isinstance(fill, str):
            if fill != UNKEPT and self.ids.check(fill, size):
                self._put(fill, data)
            return

        def keyed(head: asyncio.Future[str | None]) -> None:
            key = None if head.cancelled() or head.exception() else head.result()
            if key is not None and self.ids.check(key, size):
                self._put(key, data)

        if fill.done():
            keyed(fill)
        else:
            data = bytes(data)  # the arena it may lie in is reused before the HEAD answers
            fill.add_done_callback(keyed)

    def _put(self, key: str, data: bytes | memoryview) -> None:
        if self._memory is not None:
            new = self._memory.get(key) is None
            self._done(self._memory.put(key, data), new)
            return
        if key in self._writing:  # the same file twice in flight (a repeated sample)
            return
        # Copied now: the batch's arena the bytes may lie in is reused once it is decoded.
        job = self._writer.submit(self._write, key, bytes(data))
        fut = asyncio.wrap_future(job)
        self._writing[key] = fut
        self._jobs[key] = job
        fut.add_done_callback(lambda f: self._written(key, f))

    def _write(self, key: str, data: bytes) -> bool:
        """On the writer thread: the entry, once the store counted what its folder held."""
        assert self._disk is not None and self._opened is not None
        self._opened.result()
        return self._disk.put(key, data)

    def _written(self, key: str, fut: asyncio.Future[bool]) -> None:
        self._writing.pop(key, None)
        if self._jobs.pop(key, None) is None or fut.cancelled():  # None: counted by close
            return
        exc = fut.exception()
        if exc is None:
            self._done(bool(fut.result()), True)
        else:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """A write that raised: counted, and one WARNING per kind (:func:`failed_write`): a
        full log helps no one."""
        self._count(write_errors=1)
        kind, why = failed_write(exc)
        if kind not in self._warned:
            self._warned.add(kind)
            folder = self._disk.folder if self._disk is not None else None
            log.warning("the sample cache could not keep an entry in %s (%s)", folder, why)

    def _done(self, kept: bool, new: bool) -> None:
        self._count(stored=int(kept and new), over_bound=int(not kept))

    def _count(self, **more: int) -> None:
        s, store = self.stats, self._store()
        hits, misses = more.get("hits", 0), more.get("misses", 0)
        self.stats = replace(
            s,
            hits=s.hits + hits,
            misses=s.misses + misses,
            epoch_hits=s.epoch_hits + hits,
            epoch_misses=s.epoch_misses + misses,
            stored=s.stored + more.get("stored", 0),
            over_bound=s.over_bound + more.get("over_bound", 0),
            write_errors=s.write_errors + more.get("write_errors", 0),
            rejected=s.rejected + more.get("rejected", 0),
            bytes_served=s.bytes_served + more.get("served", 0),
            bytes_held=store.held,
            entries=len(store) if isinstance(store, MemoryStore) else store.entries,
        )
        self._publish(self.stats)

    async def aclose(self, timeout: float = 1.0) -> None:
        """Let the writes under way finish, for ``timeout`` seconds at most (on the loader's
        loop, before it stops)."""
        if self._writing:
            await asyncio.wait(list(self._writing.values()), timeout=timeout)

    def close(self, grace: float = 2.0) -> None:
        """Stop the cache's threads (the writes under way finish within ``grace``, those not
        begun are dropped) and count the writes that landed since the loop last could, so
        the last :class:`CacheStats` published holds every entry written; give a memory
        cache's memory back. Once the loop stopped (or on it, from its last coroutine)."""
        self._pool.shutdown(wait=True, cancel_futures=True, grace=grace)
        self._writer.shutdown(wait=True, cancel_futures=True, grace=grace)
        for key in list(self._jobs):
            job = self._jobs.pop(key, None)
            self._writing.pop(key, None)
            if job is None or not job.done() or job.cancelled():
                continue
            exc = job.exception()
            if exc is None:
                self._done(bool(job.result()), True)
            else:
                self._failed(exc)
        if self._memory is not None:
            self._memory.close()
