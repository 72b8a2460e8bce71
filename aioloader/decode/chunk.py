"""What crosses between the loader and a decode worker: one task, and its answer.

loader -> worker (:class:`~concurrent.futures.ProcessPoolExecutor` tasks,
:mod:`aioloader.decode.pool`):

- :class:`Chunk`, one task: several samples of one batch, each ``(row, dataset index,
  source)``, where the source is ``(offset, length)`` in bytes in the slab's input arena (or
  the bytes themselves), plus the slab's handle (a name, a path, an inode:
  :mod:`aioloader.memory.segments`), where outputs may go and, with ``Cache(max_side=...)``,
  which rows to decode small (:class:`Shrink`). Run by
  :func:`~aioloader.decode.worker.run_chunk`.
- ``warm_up`` (no arguments), once per worker as the pool starts.

worker -> loader, each task's return value:

- for a :class:`Chunk`, one typed result per sample, in order
  (:mod:`aioloader.memory.results`: ``Written``, ``InArea``, ``Pickled``, ``Failed``,
  ``Shrunk``), the arrays written into the slab on the way (:mod:`aioloader.memory.writer`);
- for ``warm_up``, the worker's pid (or its ``NotLoaded``: the ``decode`` did not unpickle).

A chunk's items stay ``(row, index, source)`` tuples: there are many per task, each
unpacked by name where it is read, and a record per sample would cost the pipe a class
reference each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioloader.memory.layout import SlabLayout
from aioloader.memory.results import Source
from aioloader.memory.segments import SegmentHandle

__all__ = ["Chunk", "Shrink"]


@dataclass(frozen=True, slots=True)
class Shrink:
    """``Cache(max_side=...)``'s part of a chunk: its ``rows`` whose file the sample cache
    keeps downscaled, each made once that row decodes: at most ``max_side`` pixels on its
    longer side, a JPEG of ``quality`` (1..95) (:mod:`aioloader.decode.shrink`)."""

    max_side: int
    quality: int
    rows: frozenset[int]

    def __reduce__(self) -> tuple[Any, ...]:
        return (Shrink, (self.max_side, self.quality, self.rows))


@dataclass(frozen=True, slots=True)
class Chunk:
    """One decode task. ``slab`` is how to map the batch's slab (None: no slab, results
    pickled); ``out`` is ``(offset, size)`` of this chunk's share of the output area, if
    any; ``inputs`` how to map the batch's input arena, where an item's ``(offset, size)``
    source lies from ``inputs_at`` on; ``forget``, names of slabs closed lately, that the
    worker unmaps if it still maps them; ``shrink``, the rows whose file the sample cache keeps
    downscaled, made once each decodes (their results come back
    :class:`~aioloader.memory.results.Shrunk`)."""

    slab: SegmentHandle | None
    layout: SlabLayout | None
    items: list[tuple[int, int, Source]]
    seed: int
    epoch: int
    out: tuple[int, int] | None = None
    inputs: SegmentHandle | None = None
    inputs_at: int = 0
    forget: tuple[str, ...] = ()
    shrink: Shrink | None = None

    # Every task and every answer crosses a pipe pickled, several per batch: a slotted
    # dataclass pickles through its __getstate__ (a dict of its fields), several times
    # slower than a constructor call (RESULTS, "Figures moved out of the code").
    # ``tests/test_protocol.py`` round-trips each field.
    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.slab, self.layout, self.items, self.seed, self.epoch)
        return (Chunk, (*fields, self.out, self.inputs, self.inputs_at, self.forget, self.shrink))
