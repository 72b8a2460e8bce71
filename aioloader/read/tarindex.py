"""The indexes of a list of tar shards, local and remote (see :mod:`aioloader.read.tarscan`
for where an index comes from and its format).

A remote shard is scanned in ranged GETs where the parser reads
(:mod:`aioloader.read.tarranges`), through the asynchronous fsspec client the reader uses,
on an event loop of this module's own (on a thread of its own, as ``read/remote.py``'s
``list_folder``: it works inside a running loop too); the headers are parsed on a thread as
the ranges arrive.
A shard's identity (a HEAD) is asked first: an index cached
for it is used, else a sidecar ``<shard>.idx``, else the shard is scanned; identities and
sidecars are asked :data:`ASKS` at once, shards scanned :data:`~aioloader.read.tarscan.SCANS`
at once. The client is closed when the last index is in: nothing outlives the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from aioloader.base.threads import run_apart
from aioloader.read.backends import FsspecBackend
from aioloader.read.tarranges import Ranges
from aioloader.read.tars import Member, sample_entries
from aioloader.read.tarsample import MemberNames
from aioloader.read.tarscan import SCANS, cached, keep, local_index, read_index, scan, scan_local
from aioloader.read.urls import is_remote, local_path, options_for, redact, scheme

__all__ = ["ASKS", "load_indexes", "sample_table", "scan_fresh"]

#: Requests for shards' identities and sidecars at once (small answers: a round trip each).
ASKS = 64


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


async def _stream_scan(fs: Any, url: str, size: int, pool: ThreadPoolExecutor) -> list[Member]:
    """The members of the remote shard ``url`` (``size`` bytes), parsed on a ``pool``
    thread from the ranges :class:`~aioloader.read.tarranges.Ranges` fetches on this loop."""
    loop, shown = asyncio.get_running_loop(), redact(url)

    def fetch(start: int, end: int) -> Future[bytes]:
        return asyncio.run_coroutine_threadsafe(fs._cat_file(url, start=start, end=end), loop)

    ranges = Ranges(fetch, size, shown)
    try:
        return await loop.run_in_executor(pool, lambda: scan(ranges, shown, skip=ranges.skip))
    finally:
        ranges.close()
