"""What crosses between the loader and a decode worker: one task.

A :class:`Chunk` is one task: several samples of one batch, each ``(row, dataset index,
source)``, where the source is ``(offset, length)`` in the slab's input arena (or the bytes
themselves), plus the slab's handle (a name, a path, an inode: :mod:`aioloader.memory.segments`)
and where outputs may go. A worker answers with one typed result per sample
(:mod:`aioloader.memory.results`), writing the arrays into the slab on the way
(:mod:`aioloader.memory.writer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioloader.memory.layout import SlabLayout
from aioloader.memory.results import Source
from aioloader.memory.segments import SegmentHandle

__all__ = ["Chunk"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One decode task. ``slab`` is how to map the batch's slab (None: no slab, results
    pickled); ``out`` is ``(offset, size)`` of this chunk's share of the output area, if
    any; ``inputs`` how to map the batch's input arena, where an item's ``(offset, size)``
    source lies from ``inputs_at`` on; ``forget``, names of slabs closed lately, that the
    worker unmaps if it still maps them; ``shrink``, ``(max_side, quality, rows)``: the rows
    whose file the sample cache keeps downscaled, made once each decodes
    (:mod:`aioloader.decode.shrink`; their results come back :class:`~aioloader.memory.results.Shrunk`)."""

    slab: SegmentHandle | None
    layout: SlabLayout | None
    items: list[tuple[int, int, Source]]
    seed: int
    epoch: int
    out: tuple[int, int] | None = None
    inputs: SegmentHandle | None = None
    inputs_at: int = 0
    forget: tuple[str, ...] = ()
    shrink: tuple[int, int, frozenset[int]] | None = None

    # Every task and every answer crosses a pipe pickled, several per batch: a slotted
    # dataclass pickles through its __getstate__ (a dict of its fields), several times
    # slower than a constructor call (RESULTS, "Figures moved out of the code").
    # ``tests/test_protocol.py`` round-trips each field.
    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.slab, self.layout, self.items, self.seed, self.epoch)
        return (Chunk, (*fields, self.out, self.inputs, self.inputs_at, self.forget, self.shrink))
