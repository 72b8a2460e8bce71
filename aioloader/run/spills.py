"""The loader process's segments for spilled leaves (:func:`aioloader.run.wire.spill`), kept
for reuse once the trainer lets go of them.

A new segment costs a page fault per 4 KiB page the first time it is written, in this
process, and again the first time the trainer reads it through a new mapping: for a batch of
256 images of 224x224 (38 MiB), some ten thousand faults each side, on every batch (RESULTS,
"Figures moved out of the code"). A segment that comes back is kept (up to ``keep`` of them)
under its name, so the next batch of about the same size writes pages that already exist,
and the trainer, whose mappings are cached by name (:class:`~aioloader.run.wire.SlabMaps`),
maps nothing new. A segment is reused only once the trainer has said it no longer views it
(its ``R`` line), never while a batch shows it.

Without a custom collate, a batch spills only where its samples came back pickled and could
not be written into rows of a learned layout (:mod:`aioloader.engine.assemble`). The first
batches do so only when the first batch's probes taught nothing (every one failed, say:
:mod:`aioloader.engine.opening`, RESULTS §25). Once ``keep`` batches in a row crossed
without a spill, the kept segments are closed (:meth:`SpillPool.unused`): a batch of memory
each, that would otherwise stay for the loader's life.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading

from aioloader.memory.segments import Segment
from aioloader.memory.slabs import PREFIX

__all__ = ["SpillPool"]


class SpillPool:
    """Segments of ``kind`` (``"memfd"`` or ``"devshm"``) for spilled leaves; thread-safe."""

    def __init__(self, kind: str, keep: int) -> None:
        self.kind = kind
        self.keep = keep
        self.made = 0
        self._free: list[Segment] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._quiet = 0  # batches in a row that spilled nothing

    def take(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes`` bytes: a free one no more than twice that size
        (the best fit), else a new one."""
        with self._lock:
            self._quiet = 0
            fits = [s for s in self._free if nbytes <= s.size <= 2 * nbytes]
            if fits:
                best = min(fits, key=lambda s: s.size)
                self._free.remove(best)
                return best
        name = f"{PREFIX}{os.getpid()}-s{next(self._ids)}-{secrets.token_hex(4)}"
        segment = Segment(name, nbytes, self.kind)
        self.made += 1
        return segment

    def give(self, segment: Segment) -> None:
        """``segment`` is no longer viewed by the trainer: keep it, or close it when
        ``keep`` are kept already (the oldest goes) or the pool is closed."""
        with self._lock:
            if self._closed or self._quiet >= self.keep:
                segment.close()
                return
            self._free.append(segment)
            old = self._free.pop(0) if len(self._free) > self.keep else None
        if old is not None:
            old.close()

    def unused(self) -> None:
        """A batch crossed without spilling anything. After ``keep`` in a row, the free
        segments are closed, and so are those given back until the next :meth:`take`."""
        with self._lock:
            self._quiet += 1
            if self._quiet < self.keep:
                return
            free, self._free = self._free, []
        for segment in free:
            segment.close()

    def close(self) -> None:
        """Close the free segments; a segment given back later is closed then. Idempotent."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for segment in free:
            segment.close()
