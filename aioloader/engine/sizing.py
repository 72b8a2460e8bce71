"""How big the engine's moving parts are, from its settings and what it has seen: batches
built at once, slabs and input arenas kept for reuse, samples per decode task, the input
arena for the file sizes seen. Pure: no I/O, no loop."""

from __future__ import annotations

import math

__all__ = [
    "SizeTracker",
    "chunk_cuts",
    "chunk_size",
    "opening_chunk",
    "pooled_arenas",
    "pooled_slabs",
    "window_size",
]


def window_size(io_concurrency: int, batch_size: int) -> int:
    """Batches built at once: enough samples in flight to use every read slot, at least 2."""
    return max(2, math.ceil(io_concurrency / batch_size) + 1)


def pooled_slabs(io_concurrency: int, batch_size: int, prefetch: int) -> int:
    """Slabs kept for reuse: enough for every batch the pipeline itself holds (under
    construction, one being queued, queued, in the bridge, in the hand-off, one whose rows
    repacking carries over) and the two a ``for b in loader`` holds around each ``next()``:
    the new one, and the old one until ``b`` is rebound."""
    return window_size(io_concurrency, batch_size) + prefetch + 5


def pooled_arenas(io_concurrency: int, batch_size: int) -> int:
    """Input arenas kept for reuse: one per batch under construction, and one for the batch
    that starts while the one before it gives its arena back. An arena is needed only until
    its batch's samples are decoded; rows slabs live on, queued and held by the trainer."""
    return window_size(io_concurrency, batch_size) + 1


def chunk_size(batch_size: int, num_workers: int) -> int:
    """Samples per decode task: a batch split into one task per worker, at most 32; with no
    decode workers (``num_workers=0``), the whole batch.

    Each task costs a round trip (the loop, the executor's threads, the worker: about 1.5
    ms of CPU on a 2-core VM, RESULTS §38), so fewer, larger tasks leave more CPU to the
    decode; one per worker still spreads a batch over every worker, and the batch window
    (at least two batches) keeps a second task queued for each."""
    if num_workers <= 0:
        return batch_size
    return max(1, min(32, math.ceil(batch_size / num_workers)))


def opening_chunk(chunk: int) -> int:
    """Samples per decode task in an epoch's first batch: half of ``chunk``. The trainer
    waits for that batch alone, and its tasks are shared by workers still starting and (hot
    start) the loader's own thread; smaller ones end together (RESULTS §38: whole chunks
    of 32 made the first batch 30-50 ms later)."""
    return max(1, -(-chunk // 2))


def chunk_cuts(n: int, chunk: int, probes: int = 0) -> list[tuple[int, int]]:
    """A batch of ``n`` samples as decode tasks of ``chunk``: ``(start, end)`` row ranges in
    order; the first ``probes`` rows one per task first (each may teach the layout)."""
    head = [(r, r + 1) for r in range(min(probes, n))]
    return head + [(a, min(a + chunk, n)) for a in range(len(head), n, chunk)]


class SizeTracker:
    """Running mean of file sizes, to size the input arenas (+50% headroom)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.total = 0
        self.count = 0

    def add(self, size: int, files: int = 1) -> None:
        """``files`` more files, of ``size`` bytes in all."""
        self.total += size
        self.count += files

    def arena_bytes(self) -> int:
        mean = self.total / self.count if self.count else 128 * 1024
        per_sample = int(mean * 1.5) + 4096
        return -(-self.batch_size * per_sample // 65536) * 65536  # whole 64 KiB
