"""Writing one decoded sample into a slab (:class:`RowWriter`): into its row of the rows
blocks when it has the slab's sample layout, else into the chunk's share of the output area,
else nowhere (it crosses pickled). Runs wherever a sample is decoded: a decode worker, a Ray
task, the loader's own thread during hot start.
"""

from __future__ import annotations

import mmap
import sys
from typing import Any

import numpy as np

from aioloader.memory.layout import ALIGN, ArraySpec, SlabLayout, describe
from aioloader.memory.results import ArrayRef, InArea, Pickled, RowResult, Written

__all__ = ["RowWriter"]


class RowWriter:
    """Writes one sample's arrays into the slab: its row of the rows blocks when it has the
    slab's sample layout, else the chunk's share of the output area, else nowhere."""

    def __init__(self, m: mmap.mmap, layout: SlabLayout, area: tuple[int, int] | None) -> None:
        self.m = m
        self.layout = layout
        self.at, self.end = (area[0], area[0] + area[1]) if area is not None else (0, 0)

    def put(self, row: int, value: Any) -> RowResult:
        treedef, leaves, specs = describe(value)
        arrays = [(leaf, spec) for leaf, spec in zip(leaves, specs, strict=True) if spec is not None]
        if not arrays:
            return Pickled(value)
        sample = self.layout.sample
        if sample is not None and sample.treedef == treedef and sample.leaves == specs:
            for (leaf, spec), block in zip(arrays, self.layout.blocks, strict=True):
                self._write(block + row * spec.nbytes, leaf, spec)
            return Written(tuple(leaf for leaf, spec in zip(leaves, specs, strict=True) if spec is None))
        need = sum(-(-spec.nbytes // ALIGN) * ALIGN for _, spec in arrays)
        if self.at + need > self.end:
            return Pickled(value)  # no room: the pipe carries it
        refs: list[Any] = []
        for leaf, maybe in zip(leaves, specs, strict=True):
            if maybe is None:
                refs.append(leaf)
                continue
            refs.append(ArrayRef(self.at, maybe))
            self._write(self.at, leaf, maybe)
            self.at += -(-maybe.nbytes // ALIGN) * ALIGN
        return InArea(treedef, tuple(refs))

    def _write(self, offset: int, leaf: Any, spec: ArraySpec) -> None:
        if spec.nbytes == 0:
            return
        dest = np.frombuffer(self.m, dtype=np.uint8, count=spec.nbytes, offset=offset)
        if spec.torch:
            torch = sys.modules["torch"]
            flat = leaf.detach().contiguous().reshape(-1)
            target = torch.from_numpy(dest).view(flat.dtype)
            target.copy_(flat)
            del target
        else:
            np.copyto(dest.view(leaf.dtype).reshape(leaf.shape), leaf, casting="no")
        del dest
