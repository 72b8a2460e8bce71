"""The sample cache in the engine's stages (``Loader(cache=...)``): reads served from it or
from the source (stage 2), decoded samples kept (after stage 3). The cache itself, its
stores and its keys are :mod:`aioloader.cache`'s; this is only where the engine meets it.

A sample is kept only once it succeeded: read, for ``decode=None``; decoded, otherwise (a
failed sample is never kept, so it fails the same way next epoch, judged by ``on_error``
and ``max_failures`` as without a cache). With ``max_side``, every miss is decoded from the
small image its worker makes first (kept or not: one resolution whatever the bound), and
only what a worker made is kept (:class:`~aioloader.memory.results.Shrunk`: the small
image, or the file where it needs none).
"""

from __future__ import annotations

from typing import cast

from aioloader.cache.samples import UNKEPT, Fill, SampleCache
from aioloader.decode.contract import ChunkItem, Outcome, Shrink
from aioloader.engine.batch import Fills
from aioloader.errors import SampleError
from aioloader.memory.results import RowResult, Shrunk, Source
from aioloader.memory.slabs import Arena
from aioloader.read.reader import FileReader

__all__ = ["keep_decoded", "keep_read", "read_through", "shrink_for"]


async def read_through(
    cache: SampleCache | None,
    reader: FileReader,
    items: list[tuple[int, str]],
    spans: list[tuple[int, int] | None] | None,
    arena: Arena | None,
    timeout: float | None,
) -> tuple[list[Source | SampleError], list[Fill | None], int]:
    """Each ``(index, path)``'s bytes as :meth:`FileReader.fetch_many` gives them, from
    the cache where it has them; for each miss, what keeps it (None for a hit); and how
    many of the bytes came from the cache."""
    if cache is None:
        return await reader.fetch_many(items, arena, timeout, spans), [None] * len(items), 0
    served, fills = await cache.serve([p for _, p in items], spans, arena)
    hit_bytes = sum(s[1] if isinstance(s, tuple) else len(s) for s in served if s is not None)
    miss = [i for i, src in enumerate(served) if src is None]
    out: list[Source | SampleError] = [src for src in served if src is not None] if not miss else []
    if miss:
        got = await reader.fetch_many(
            [items[i] for i in miss], arena, timeout, [spans[i] for i in miss] if spans else None
        )
        merged: list[Source | SampleError | None] = list(served)
        for i, res in zip(miss, got, strict=True):
            merged[i] = res
        out = [res for res in merged if res is not None]
    return out, fills, hit_bytes


def _bytes(src: Source, arena: Arena | None) -> bytes | memoryview:
    if isinstance(src, tuple):
        assert arena is not None
        return arena.buf[src[0] : src[0] + src[1]]
    return src


def keep_read(cache: SampleCache, fills: Fills, row: int, src: Source, arena: Arena | None) -> None:
    """``decode=None``: row ``row`` was read, so its bytes are kept as they are."""
    fill = fills.pop(row, None)
    if fill is not None and fill[0] != UNKEPT:
        cache.keep(fill[0], bytes(_bytes(src, arena)), fill[1])


def shrink_for(cache: SampleCache | None, fills: Fills, items: list[ChunkItem]) -> Shrink | None:
    """The chunk's misses, whose files its workers decode small (and hand the small image
    to the cache); None without ``max_side``. Hits are small already."""
    spec = cache.shrink if cache is not None else None
    rows = frozenset(r for r, _, _ in items if r in fills)
    return None if spec is None or not rows else Shrink(*spec, rows)


def keep_decoded(
    cache: SampleCache | None,
    fills: Fills,
    items: list[ChunkItem],
    outcomes: list[Outcome],
    arena: Arena | None,
) -> list[RowResult | SampleError]:
    """The chunk's outcomes as the engine takes them (:class:`Shrunk` taken apart); on the
    way, each decoded miss the cache wants is kept: what its worker made (``max_side``) or
    its bytes as read."""
    if cache is None:  # no cache, no Shrunk: nothing to take apart, nothing to keep
        return cast(list[RowResult | SampleError], outcomes)
    shrinking = cache.settings.max_side is not None
    taken: list[RowResult | SampleError] = []
    for (row, _, src), outcome in zip(items, outcomes, strict=True):
        fill = fills.pop(row, None)
        if fill is not None and fill[0] == UNKEPT:
            fill = None
        if isinstance(outcome, Shrunk):
            if fill is not None:
                kept = outcome.kept
                cache.keep(fill[0], kept if kept is not None else bytes(_bytes(src, arena)), fill[1])
            outcome = outcome.result
        elif fill is not None and not shrinking and not isinstance(outcome, SampleError):
            cache.keep(fill[0], _bytes(src, arena), fill[1])
        taken.append(outcome)
    return taken
