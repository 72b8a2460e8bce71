"""Which version of its source each sample is, as an entry's key needs it
(:func:`~aioloader.cache.entries.entry_key`), on the loader's loop.

- **A file** is stat'ed every epoch, so a file changed between epochs has another key and is
  read again. Its path enters the key absolute (two runs in other folders never share a
  relative path's entry). Stats go one hop for a chunk while they are fast (cached inodes:
  microseconds, less than a hop), one hop per file in parallel from the first slow one on
  (network storage: a round trip each).
- **An object** is asked for once per run (a HEAD), however many samples (byte ranges) it
  holds and whatever the epoch; later epochs of the run trust the answer, so an epoch served
  from the cache makes no request (objects are taken not to change during a run). With a
  memory cache the HEAD runs beside the sample's first read; a disk cache needs the key
  before it (it may hold the object from an earlier run). An object whose server gives no
  version (ETag, Last-Modified) has none a disk cache can trust next run, and one whose HEAD
  fails is not asked again: neither is kept on disk this run.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import Executor

from aioloader.cache.entries import Identity, entry_key
from aioloader.read.remote import RemoteStore
from aioloader.read.urls import is_remote, local_path

__all__ = ["SLOW_STAT", "Fill", "Identities", "stat_identities"]

#: A stat slower than this (seconds) is a network round trip, not a cached inode.
SLOW_STAT = 0.001
#: What keeps a miss (:meth:`aioloader.cache.samples.SampleCache.keep`): its key, or the future
#: of the key an object's HEAD will give (None: no identity after all).
Fill = str | asyncio.Future[str | None]
Span = tuple[int, int] | None


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


class Identities:
    """The keys of one cache's samples (``fingerprint``: its settings'); ``pool`` runs the
    stats; :attr:`remote`, the reader's client of URLs (None: URLs have no identity);
    ``disk``: keys of objects are needed before their reads (a disk cache)."""

    def __init__(self, fingerprint: str, pool: Executor, disk: bool) -> None:
        self.remote: RemoteStore | None = None
        self._fp = fingerprint
        self._pool = pool
        self._disk = disk
        self._slow = False
        #: URL -> its identity this run (bounded by the objects read), or the HEAD asking.
        self._objects: dict[str, Identity] = {}
        self._asking: dict[str, asyncio.Future[Identity | None]] = {}
        #: URLs with no identity this run (no version, or a HEAD that failed).
        self._unknown: set[str] = set()
        #: Key -> (the length its object's HEAD announced, its URL), until the read is kept.
        self._expect: dict[str, tuple[int, str]] = {}
        #: The futures of keys still asked for (each a sample's miss, kept once it answers).
        self.asking: set[asyncio.Future[str | None]] = set()

    async def keys(self, paths: list[str], spans: list[Span] | None) -> list[Fill | None]:
        """Each sample's key now, the future of an object's key not known yet this run, or
        None (no identity: not kept)."""
        span = spans or [None] * len(paths)
        keys: list[Fill | None] = [None] * len(paths)
        local = [i for i, p in enumerate(paths) if not is_remote(p)]
        if local:
            ids = await self._stat([paths[i] for i in local])
            for i, ident in zip(local, ids, strict=True):
                if ident is not None:
                    where = os.path.abspath(local_path(paths[i]))
                    keys[i] = entry_key(self._fp, where, span[i], ident)
        asked: list[int] = []
        for i, url in enumerate(paths):
            if not is_remote(url) or url in self._unknown or self.remote is None:
                continue
            known = self._objects.get(url)
            if known is not None:
                keys[i] = self._key(url, span[i], known)
            else:
                fut: asyncio.Future[str | None] = asyncio.ensure_future(self._key_after_head(url, span[i]))
                keys[i] = fut
                self.asking.add(fut)
                fut.add_done_callback(self.asking.discard)
                asked.append(i)
        if asked and self._disk:
            futures = [f for i in asked if isinstance(f := keys[i], asyncio.Future)]
            await asyncio.gather(*futures, return_exceptions=True)
            for i, done in zip(asked, futures, strict=True):
                keys[i] = done.result() if not done.cancelled() and done.exception() is None else None
        return keys

    def check(self, key: str, size: int) -> bool:
        """Whether a miss read ``size`` bytes where its object's HEAD announced as many; if
        not (the object changed between the two), it is asked for again next time."""
        expected = self._expect.pop(key, None)
        if expected is None or expected[0] == size:
            return True
        self._objects.pop(expected[1], None)
        return False

    def _key(self, url: str, span: Span, ident: Identity) -> str:
        key = entry_key(self._fp, url, span, ident)
        self._expect[key] = (ident[0] if span is None else span[1], url)
        return key

    async def _key_after_head(self, url: str, span: Span) -> str | None:
        ident = await self._head(url)
        return None if ident is None else self._key(url, span, ident)

    async def _head(self, url: str) -> Identity | None:
        """The object's identity: one HEAD per URL, however many samples ask at once."""
        asking = self._asking.get(url)
        if asking is None:
            asking = self._asking[url] = asyncio.ensure_future(self._ask(url))
            asking.add_done_callback(lambda _: self._asking.pop(url, None))
        return await asyncio.shield(asking)

    async def _ask(self, url: str) -> Identity | None:
        assert self.remote is not None
        try:
            size, tag = await self.remote.head(url)
        except Exception:  # noqa: BLE001 - the read says what is wrong; only the entry is lost
            self._unknown.add(url)
            return None
        if not tag and self._disk:
            self._unknown.add(url)  # a disk entry must be told apart from a changed object
            return None
        ident = self._objects[url] = (size, tag)
        return ident

    async def _stat(self, paths: list[str]) -> list[Identity | None]:
        loop = asyncio.get_running_loop()
        if not self._slow:
            ids, self._slow = await loop.run_in_executor(self._pool, stat_identities, paths)
            return ids
        hops = [loop.run_in_executor(self._pool, stat_identities, [p]) for p in paths]
        return [got[0][0] for got in await asyncio.gather(*hops)]
