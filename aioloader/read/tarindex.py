"""The indexes of a list of tar shards, local and remote (see :mod:`aioloader.read.tarscan`
for where an index comes from and its format).

A remote shard is scanned in one pass front to back, in ranged reads of :data:`CHUNK` bytes
awaited one after another on an event loop of this module's own (on a thread of its own, as
``read/remote.py``'s ``list_folder``: it works inside a running loop too), through the
asynchronous fsspec client the reader uses; the headers are parsed on a thread as the
chunks arrive, through a bounded queue, so a shard is never held whole in memory
(:data:`AHEAD` chunks at most). A shard's identity (a HEAD) is asked first: an index cached
for it is used, else a sidecar ``<shard>.idx``, else the shard is scanned; identities and
sidecars are asked :data:`ASKS` at once, shards scanned :data:`~aioloader.read.tarscan.SCANS`
at once. The client is closed when the last index is in: nothing outlives the call.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aioloader.base.threads import run_apart
from aioloader.read.backends import FsspecBackend
from aioloader.read.tars import Member, sample_entries
from aioloader.read.tarsample import MemberNames
from aioloader.read.tarscan import SCANS, cached, keep, local_index, read_index, scan, scan_local
from aioloader.read.urls import is_remote, local_path, options_for, redact, scheme

__all__ = ["AHEAD", "ASKS", "CHUNK", "load_indexes", "sample_table", "scan_fresh"]

#: Requests for shards' identities and sidecars at once (small answers: a round trip each).
ASKS = 64
#: Bytes a remote scan asks for at once.
CHUNK = 8 << 20
#: Chunks a remote scan may have read ahead of its parser.
AHEAD = 2
#: Seconds a parser waits for its next chunk before the shard is given up.
WAIT = 300.0


def load_indexes(shards: list[str], storage_options: Mapping[str, Any] | None) -> list[list[Member]]:
    """Each shard's members, in order: sidecar, cache or scan."""
    out: list[list[Member] | None] = [None] * len(shards)
    remote = [i for i, s in enumerate(shards) if is_remote(s)]
    with ThreadPoolExecutor(SCANS, thread_name_prefix="aioloader-index") as pool:
        local = [i for i, s in enumerate(shards) if not is_remote(s)]
        for i, members in zip(
            local, pool.map(lambda i: local_index(local_path(shards[i])), local), strict=True
        ):
            out[i] = members
        if remote:
            got = _on_own_loop([shards[i] for i in remote], storage_options, pool, fresh=False)
            for i, members in zip(remote, got, strict=True):
                out[i] = members
    return [m if m is not None else [] for m in out]


def sample_table(
    shards: list[str],
    storage_options: Mapping[str, Any] | None,
    image: str | None,
    label: str | tuple[str, str] | None,
    extra: tuple[str, ...] | None,
) -> tuple[list[tuple[str, int, int]], list[int], MemberNames]:
    """The entries, labels and member names of every shard's samples, in order (see
    :func:`~aioloader.read.tars.sample_entries`)."""
    entries: list[tuple[str, int, int]] = []
    labels: list[int] = []
    names = MemberNames()
    for shard, members in zip(shards, load_indexes(shards, storage_options), strict=True):
        got, got_labels, got_names = sample_entries(shard, members, image, label, extra)
        entries += got
        labels += got_labels
        names.add(got_names)
    return entries, labels, names


def scan_fresh(shards: list[str], storage_options: Mapping[str, Any] | None = None) -> list[list[Member]]:
    """A new scan of each shard (no sidecar, no cache): what ``aioloader index`` writes."""
    with ThreadPoolExecutor(SCANS, thread_name_prefix="aioloader-index") as pool:
        remote = [s for s in shards if is_remote(s)]
        got = iter(_on_own_loop(remote, storage_options, pool, fresh=True) if remote else [])
        return [next(got) if is_remote(s) else scan_local(local_path(s)) for s in shards]


def _on_own_loop(
    urls: list[str], storage_options: Mapping[str, Any] | None, pool: ThreadPoolExecutor, fresh: bool
) -> list[list[Member]]:
    async def main() -> list[list[Member]]:
        clients: dict[str, FsspecBackend] = {}
        try:
            for protocol in {scheme(u) or "file" for u in urls}:
                clients[protocol] = FsspecBackend(protocol, options_for(storage_options, protocol), SCANS)
                if hasattr(clients[protocol].fs, "set_session"):
                    await clients[protocol].fs.set_session()
            bounds = (asyncio.Semaphore(ASKS), asyncio.Semaphore(SCANS))

            async def one(url: str) -> list[Member]:
                return await _remote_index(clients[scheme(url) or "file"].fs, url, pool, fresh, bounds)

            return list(await asyncio.gather(*(one(u) for u in urls)))
        finally:
            for client in clients.values():
                await client.aclose()

    return run_apart(main, "aioloader-index")


async def _remote_index(
    fs: Any,
    url: str,
    pool: ThreadPoolExecutor,
    fresh: bool,
    bounds: tuple[asyncio.Semaphore, asyncio.Semaphore],
) -> list[Member]:
    """The shard's identity (a HEAD), then its index from the cache, else its sidecar (a
    GET), else a scan; ``bounds``: the requests of the first two at once, the scans at once."""
    shown = redact(url)
    key = None
    async with bounds[0]:
        try:
            info = await fs._info(url)
        except FileNotFoundError:
            raise FileNotFoundError(f"from_tars: shard {shown} does not exist") from None
        if not fresh:
            names = ("ETag", "LastModified", "Last-Modified", "last_modified")
            version = next((info[n] for n in names if info.get(n)), None)
            key = None if version is None else f"{url}\0{info.get('size')}\0{version}"
            found = cached(key)
            if found is not None:
                return found
            try:
                return read_index((await fs._cat_file(url + ".idx")).decode("utf-8"), shown + ".idx")
            except (FileNotFoundError, OSError):
                pass
    async with bounds[1]:
        members = await _stream_scan(fs, url, int(info["size"]), pool)
    keep(key, members)
    return members


class _Chunks:
    """What a parser thread reads: the chunks a loop task puts in a bounded queue (b"" at
    the end, an exception where the read failed). A read copies only what it returns, a skip
    nothing: the chunk is kept whole with a position in it (slicing off what was read would
    copy the rest of an 8 MiB chunk for each 512-byte header)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[bytes | BaseException] = queue.Queue(AHEAD)
        self.done = threading.Event()
        self._buf = b""
        self._pos = 0
        self._ended = False

    def _more(self) -> bool:
        """The next chunk after what is left of this one; False at the end."""
        if self._ended:
            return False
        try:
            part = self.queue.get(timeout=WAIT)
        except queue.Empty:
            raise TimeoutError(f"no data for {WAIT:.0f} s") from None
        if isinstance(part, BaseException):
            raise part
        self._ended = not part
        self._buf, self._pos = self._buf[self._pos :] + part, 0
        return not self._ended

    def read(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n and self._more():
            pass
        out = self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    def skip(self, n: int) -> int:
        """Move past ``n`` bytes; how many there were."""
        got = 0
        while True:
            step = min(n - got, len(self._buf) - self._pos)
            self._pos += step
            got += step
            if got == n or not self._more():
                return got


async def _stream_scan(fs: Any, url: str, size: int, pool: ThreadPoolExecutor) -> list[Member]:
    chunks = _Chunks()
    loop = asyncio.get_running_loop()
    parsing = loop.run_in_executor(pool, _parse, chunks, redact(url))

    async def put(item: bytes | BaseException) -> bool:
        while not chunks.done.is_set():
            try:
                chunks.queue.put_nowait(item)
                return True
            except queue.Full:
                await asyncio.sleep(0.005)
        return False

    try:
        for start in range(0, size, CHUNK):
            if not await put(await fs._cat_file(url, start=start, end=min(start + CHUNK, size))):
                break
        await put(b"")
    except Exception as exc:  # noqa: BLE001 - any client's error: the parser raises it, named
        await put(OSError(f"{redact(url)}: {exc}"))
    return await parsing


def _parse(chunks: _Chunks, shown: str) -> list[Member]:
    try:
        return scan(chunks, shown, skip=chunks.skip)
    finally:
        chunks.done.set()  # the feeder stops: the parser has what it needs, or failed
