"""What a slab's rows hold once decoded, as every stage answers it: one typed result per
sample, and the status table at the start of each slab.

A decode (a worker, a Ray task, the loader's own thread) answers each sample with:

- :class:`Written`: the sample's arrays are in its row of the slab's rows blocks; the plain
  leaves (numbers, strings, ...) come back with it, in leaf order;
- :class:`InArea`: the sample's arrays are in the chunk's share of the slab's output area;
  the tree comes back with :class:`ArrayRef` in place of each array;
- :class:`Pickled`: the sample itself, pickled (no slab room, or no array in it);
- :class:`Deferred`: the sample is decoded later, on the device (its encoded bytes);
- :class:`Failed`: the exception (a copy that unpickles) and the decoder's traceback;
- :class:`Shrunk`: one of those, and the bytes the sample cache keeps (``max_side``).

A sample's file bytes reach a decode as a :data:`Source`: ``(offset, length)`` in the
batch's input arena, or the bytes themselves.

The status table has one ``(pid, start)`` float64 pair per row at the start of the slab: the
process decoding the row writes its pid and ``time.monotonic()`` first and ``-pid`` when
done, so the loader knows which sample a hung or dead worker was on.
"""

from __future__ import annotations

import mmap
import os
import pickle
import time
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from aioloader.base.tree import TreeDef
from aioloader.memory.layout import ArraySpec, describe

__all__ = [
    "ArrayRef",
    "Deferred",
    "Failed",
    "InArea",
    "Pickled",
    "RowResult",
    "Shrunk",
    "Source",
    "StatusTable",
    "Written",
    "layout_evidence",
]

#: Where a sample's file bytes are: ``(offset, length)`` in the input arena, or the bytes.
Source = tuple[int, int] | bytes


@dataclass(frozen=True, slots=True)
class Written:
    plain: tuple[Any, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Written, (self.plain,))


@dataclass(frozen=True, slots=True)
class ArrayRef:
    offset: int
    spec: ArraySpec

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArrayRef, (self.offset, self.spec))


@dataclass(frozen=True, slots=True)
class InArea:
    treedef: TreeDef
    leaves: tuple[Any, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return (InArea, (self.treedef, self.leaves))


@dataclass(frozen=True, slots=True)
class Pickled:
    value: Any

    def __reduce__(self) -> tuple[Any, ...]:
        return (Pickled, (self.value,))


@dataclass(frozen=True, slots=True)
class Deferred:
    """A sample decoded later, on the device: ``value`` is what travels to it (the file's
    bytes and crop window, :class:`~aioloader.decode.encoded.EncodedImage`). It says nothing
    about the slabs' layout, and reaches the collate as it is."""

    value: Any


@dataclass(frozen=True, slots=True)
class Failed:
    error: BaseException
    traceback: str

    def __reduce__(self) -> tuple[Any, ...]:
        # The error's class goes by value where it must (one defined in a notebook or in
        # __main__ is not found by name in a worker): cloudpickle gives the loader back its
        # own class, so ``except TheirError`` still matches the cause.
        return (_failed, (cloudpickle.dumps(self.error), self.traceback))


def _failed(error: bytes, traceback: str) -> Failed:
    return Failed(pickle.loads(error), traceback)


RowResult = Written | InArea | Pickled | Deferred | Failed


@dataclass(frozen=True, slots=True)
class Shrunk:
    """A sample's result and the bytes the sample cache keeps for its file, made just before
    its decode, which decoded them (``Cache(max_side=...)``, :mod:`aioloader.decode.shrink`):
    a smaller JPEG, or None to keep the file's bytes as they are (what was decoded). The
    decode stage takes it apart: the engine sees ``result``, the cache ``kept``."""

    result: RowResult
    kept: bytes | None

    def __reduce__(self) -> tuple[Any, ...]:
        return (Shrunk, (self.result, self.kept))


def layout_evidence(
    results: list[RowResult | None] | list[RowResult],
) -> tuple[list[tuple[TreeDef, tuple[ArraySpec | None, ...]]], int]:
    """What ``results`` say about the samples' layout: ``(misses, fitted)``, the tree and
    array specs of each sample that did not go into its row, and how many did."""
    misses = []
    fitted = 0
    for res in results:
        if isinstance(res, Written):
            fitted += 1
        elif isinstance(res, InArea):
            misses.append(
                (res.treedef, tuple(x.spec if isinstance(x, ArrayRef) else None for x in res.leaves))
            )
        elif isinstance(res, Pickled):
            treedef, _, specs = describe(res.value)
            misses.append((treedef, specs))
    return misses, fitted


class StatusTable:
    """The ``(pid, start)`` pairs of a slab's rows, over any mapping of the slab."""

    def __init__(self, buf: mmap.mmap, rows: int) -> None:
        self.array = np.frombuffer(buf, dtype=np.float64, count=2 * rows).reshape(rows, 2)

    def start(self, row: int) -> None:
        self.array[row] = (float(os.getpid()), time.monotonic())

    def done(self, row: int) -> None:
        self.array[row, 0] = -float(os.getpid())

    def busy(self, row: int) -> tuple[int, float]:
        """``(pid, since)`` of the process decoding ``row`` now; pid 0 when none is."""
        pid, since = self.array[row]
        return (int(pid), float(since)) if pid > 0 else (0, 0.0)

    def last(self, row: int) -> int:
        """The pid that started ``row`` last (decoding or done); 0 if none did."""
        return abs(int(self.array[row, 0]))

    def clear(self) -> None:
        self.array[:] = 0.0
