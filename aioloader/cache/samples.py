"""The sample cache on the loader's event loop: which samples it serves, which it fills.

For each chunk of reads the engine asks :meth:`SampleCache.serve`; each sample is then

- **a hit**: its entry's bytes go straight into the batch's input arena (from memory, or
  read from the entry file on a cache thread, its checks passed); the source is not read;
- **a miss to fill**: read from the source as without a cache, then, once its decode
  succeeded, kept by :meth:`SampleCache.keep` (its bytes, or what the worker made of them
  with ``max_side``) under the key :meth:`serve` gave it;
- **a miss not kept**: the bound is reached, or its identity is unknown (a file that cannot
  be stat'ed now, a custom ``read`` whose paths are not files, an object whose server gives
  no ETag or Last-Modified to a disk cache): read from the source, every epoch.

Identity (:mod:`aioloader.cache.entries`): a file is stat'ed every epoch (one thread hop per
chunk), so a file changed between epochs is read again. An object is asked for once per run
(a HEAD, beside its first read); later epochs of the run trust what it said, so an epoch
served from the cache makes no request at all (objects are taken not to change during a
run). Loop-bound, but for the blocking parts on its own daemon threads.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from aioloader.base.threads import DaemonThreadPool
from aioloader.cache.diskstore import BAD, DiskStore
from aioloader.cache.entries import Identity, entry_key
from aioloader.cache.memstore import MemoryStore
from aioloader.cache.settings import Cache
from aioloader.memory.results import Source
from aioloader.memory.slabs import Arena
from aioloader.observe.cachestats import CacheStats
from aioloader.read.remote import RemoteStore
from aioloader.read.urls import is_remote, local_path

__all__ = ["Fill", "SampleCache"]

#: What :meth:`SampleCache.keep` needs of a miss: its key, or the HEAD that will give it.
Fill = str | asyncio.Future[str | None]


#: A stat slower than this (seconds) is a network round trip, not a cached inode.
SLOW_STAT = 0.001
#: Cache threads at most: stats of files on network storage, one per hop, wait in parallel.
THREADS = 64


def stat_identities(paths: list[str]) -> tuple[list[Identity | None], bool]:
    """On a cache thread: each local file's ``(size, st_mtime_ns)``, None where it cannot be
    stat'ed (the read then says why, or succeeds through a custom ``read``); and whether a
    stat took longer than :data:`SLOW_STAT`."""
    out: list[Identity | None] = []
    slow = False
    for path in paths:
        t0 = time.perf_counter()
        try:
            st = os.stat(local_path(path))
        except (OSError, ValueError):
            out.append(None)
            continue
        finally:
            slow = slow or time.perf_counter() - t0 > SLOW_STAT
        out.append((st.st_size, str(st.st_mtime_ns)))
    return out, slow


class SampleCache:
    """One loader's cache of ``settings``, at most ``max_bytes``; :attr:`remote`: the
    reader's client of URLs (None with a custom ``read``: URLs then have no identity);
    ``publish`` is given each new :class:`CacheStats`. Made where the pipeline is built
    (a disk cache's folder made there, its entries counted on a cache thread); closed with
    the pipeline."""

    def __init__(
        self,
        settings: Cache,
        max_bytes: int,
        remote: RemoteStore | None,
        publish: Callable[[CacheStats], None] = lambda _: None,
    ) -> None:
        self.settings = settings
        self.remote = remote
        self._publish = publish
        self._pool = DaemonThreadPool(THREADS, thread_name_prefix="aioloader-cache")
        self._slow_stats = False
        folder = settings.folder
        self._disk = DiskStore(folder, max_bytes) if folder is not None else None
        self._memory = MemoryStore(max_bytes) if folder is None else None
        self._opened: Future[None] | None = None
        if self._disk is not None:
            self._disk.folder.mkdir(parents=True, exist_ok=True)  # an error here names it
            if not os.access(self._disk.folder, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "cannot write the folder", str(self._disk.folder))
            self._opened = self._pool.submit(self._disk.open)
        #: URL -> key, for objects identified in this run (bounded by the entries).
        self._known: dict[str, str] = {}
        #: URLs whose server gave no version this run: a disk cache keeps none of them, and
        #: does not ask again each epoch.
        self._versionless: set[str] = set()
        self.stats = CacheStats(max_bytes=max_bytes)
        self._pending: set[asyncio.Future[Any]] = set()
        #: Key -> the length its object's HEAD announced, until the read is kept.
        self._expect: dict[str, int] = {}

    @property
    def shrink(self) -> tuple[int, int] | None:
        """``(max_side, quality)`` for the workers, while there is room to keep more."""
        s = self.settings
        return None if s.max_side is None or not self._room() else (s.max_side, s.quality)

    def _room(self) -> bool:
        store = self._memory if self._memory is not None else self._disk
        assert store is not None
        return store.room()

    async def serve(
        self, paths: list[str], spans: list[tuple[int, int] | None] | None, arena: Arena | None, epoch: int
    ) -> tuple[list[Source | None], list[Fill | None]]:
        """For each of ``paths`` (``spans``: the byte ranges the samples are), its bytes from
        the cache (into ``arena`` when given and they fit) or None to read it; and, for each
        miss to fill, what :meth:`keep` needs."""
        if epoch != self.stats.epoch:
            # The last epoch's writes land first: its last samples are hits in this one,
            # not read again (and written twice) while a cache thread still writes them.
            if self._pending:
                await asyncio.wait(list(self._pending), timeout=5.0)
            if epoch != self.stats.epoch:
                self.stats = replace(self.stats, epoch=epoch, epoch_hits=0, epoch_misses=0)
        keys = await self._keys(paths, spans)
        got: list[Source | None] = [None] * len(paths)
        fills: list[Fill | None] = [None] * len(paths)
        wanted = [i for i, k in enumerate(keys) if isinstance(k, str)]
        found = await self._lookup([str(keys[i]) for i in wanted], arena) if wanted else []
        rejected = 0
        for i, src in zip(wanted, found, strict=True):
            if src is BAD:
                rejected += 1
            elif src is not None:
                got[i] = src  # type: ignore[assignment]
        room = self._room()
        for i, key in enumerate(keys):
            if got[i] is None and key is not None and room:
                fills[i] = key
        hits = sum(src is not None for src in got)
        served = sum(src[1] if isinstance(src, tuple) else len(src) for src in got if src is not None)
        self._count(hits=hits, misses=len(paths) - hits, rejected=rejected, served=served)
        return got, fills

    async def _keys(self, paths: list[str], spans: list[tuple[int, int] | None] | None) -> list[Fill | None]:
        """Each sample's key now, a HEAD's future for an object not yet identified in this
        run, or None (no identity)."""
        fp = self.settings.fingerprint
        span = spans or [None] * len(paths)
        keys: list[Fill | None] = [None] * len(paths)
        local = [i for i, p in enumerate(paths) if not is_remote(p)]
        if local:
            ids = await self._stat([paths[i] for i in local])
            for i, ident in zip(local, ids, strict=True):
                keys[i] = None if ident is None else entry_key(fp, paths[i], span[i], ident)
        heads: list[tuple[int, asyncio.Future[str | None]]] = []
        for i, p in enumerate(paths):
            if is_remote(p):
                known = self._known.get(p)
                if known is not None:
                    keys[i] = known
                elif self.remote is not None and p not in self._versionless:
                    head: asyncio.Future[str | None] = asyncio.ensure_future(self._head(p, span[i]))
                    self._pending.add(head)
                    head.add_done_callback(self._pending.discard)
                    keys[i] = head
                    heads.append((i, head))
        # A disk cache may hold an object from an earlier run: its key is needed before the
        # read (one HEAD, then maybe no GET). A memory cache holds nothing not known here, so
        # the HEAD runs beside the read instead.
        if heads and self._disk is not None:
            await asyncio.wait([h for _, h in heads])
            for i, head in heads:
                keys[i] = head.result() if not head.cancelled() else None
        return keys

    async def _stat(self, paths: list[str]) -> list[Identity | None]:
        """Identities of local files: one hop for the chunk while stats are fast (cached
        inodes: microseconds, less than a hop), one hop per file, in parallel, from the first
        slow one on (network storage: a round trip each)."""
        loop = asyncio.get_running_loop()
        if not self._slow_stats:
            ids, self._slow_stats = await loop.run_in_executor(self._pool, stat_identities, paths)
            return ids
        hops = [loop.run_in_executor(self._pool, stat_identities, [p]) for p in paths]
        return [got[0][0] for got in await asyncio.gather(*hops)]

    async def _head(self, url: str, span: tuple[int, int] | None) -> str | None:
        assert self.remote is not None
        try:
            size, tag = await self.remote.head(url)
        except Exception:  # noqa: BLE001 - the read says what is wrong; this sample is not kept
            return None
        if not tag and self._disk is not None:
            self._versionless.add(url)
            return None  # a disk entry must be told apart from a changed object next run
        key = entry_key(self.settings.fingerprint, url, span, (size, tag))
        self._known[url] = key
        self._expect[key] = size if span is None else span[1]
        return key

    async def _lookup(self, keys: list[str], arena: Arena | None) -> list[Source | str | None]:
        if self._memory is not None:
            return [self._from_memory(k, arena) for k in keys]
        assert self._disk is not None
        disk = self._disk
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
        """Keep ``data`` for the miss ``fill`` (:meth:`serve`), once its key is known.
        ``size``: the source's length as read; an object whose HEAD announced another (it
        changed between the two requests) is not kept, and is asked for again."""
        if isinstance(fill, str):
            self._checked(fill, data, size)
            return

        def keyed(head: asyncio.Future[str | None]) -> None:
            key = None if head.cancelled() or head.exception() else head.result()
            if key is not None:
                self._checked(key, data, size)

        if fill.done():
            keyed(fill)
        else:
            data = bytes(data)  # the arena it may lie in is reused before the HEAD answers
            fill.add_done_callback(keyed)

    def _checked(self, key: str, data: bytes | memoryview, size: int) -> None:
        expected = self._expect.pop(key, size)
        if expected != size:
            self._known = {url: k for url, k in self._known.items() if k != key}
            return
        self._store(key, data)

    def _store(self, key: str, data: bytes | memoryview) -> None:
        if self._memory is not None:
            self._done(self._memory.put(key, data))
            return
        assert self._disk is not None
        # Copied now: the batch's arena the bytes may lie in is reused once it is decoded.
        fut = asyncio.wrap_future(self._pool.submit(self._put, key, bytes(data)))
        self._pending.add(fut)
        fut.add_done_callback(self._stored)

    def _put(self, key: str, data: bytes) -> bool:
        """On a cache thread: write the entry once the store has counted what its folder
        held (its bound counts from there; the open, submitted first, has its thread)."""
        assert self._disk is not None and self._opened is not None
        self._opened.result()
        return self._disk.put(key, data)

    def _stored(self, fut: asyncio.Future[bool]) -> None:
        self._pending.discard(fut)
        if not fut.cancelled():
            self._done(fut.exception() is None and bool(fut.result()))

    def _done(self, kept: bool) -> None:
        if kept:
            self._count(stored=1)
        else:
            self._count(over_bound=1)

    def _count(self, **more: int) -> None:
        s = self.stats
        hits, misses = more.pop("hits", 0), more.pop("misses", 0)
        store = self._memory if self._memory is not None else self._disk
        assert store is not None
        self.stats = replace(
            s,
            hits=s.hits + hits,
            misses=s.misses + misses,
            epoch_hits=s.epoch_hits + hits,
            epoch_misses=s.epoch_misses + misses,
            stored=s.stored + more.get("stored", 0),
            over_bound=s.over_bound + more.get("over_bound", 0),
            rejected=s.rejected + more.get("rejected", 0),
            bytes_served=s.bytes_served + more.get("served", 0),
            bytes_held=store.held,
            entries=len(store) if isinstance(store, MemoryStore) else store.entries,
        )
        self._publish(self.stats)

    async def aclose(self) -> None:
        """Let the writes under way finish (on the loader's loop, before it stops)."""
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=5.0)

    def close(self, grace: float = 2.0) -> None:
        """Stop the cache's threads; give a memory cache's memory back."""
        self._pool.shutdown(wait=True, cancel_futures=True, grace=grace)
        if self._memory is not None:
            self._memory.close()
