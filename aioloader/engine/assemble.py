"""Stage 4: a batch from its decoded rows (collation).

Three ways, cheapest first:

1. Every kept sample was written into its row of the slab's rows blocks and the default
   collate is in use: each rows block *is* that leaf's batch tensor (zero-copy). With every
   row kept, the tensors view the slab, which goes back to the pool once the last of them
   is garbage; rows left out by ``on_error="skip"`` are gathered into a copy instead.
2. Otherwise each sample is rebuilt: arrays as views of the slab (rows blocks or the
   output area), plain leaves as they came back, pickled samples as they are, and the
   collate function (default or the user's) runs on the collate thread. The slab lives as
   long as any view of it; with ``zero_copy=False`` the views are copied out first.
   Samples that came back pickled (decoded before the layout was learned: a first batch
   whose probe sample taught nothing) but have the layout learned since are written into
   a new slab's rows on the collate thread instead, under the default collate: the batch
   is then a slab view like the others, and a loader process sends it as one (no spill,
   :mod:`aioloader.run.wire`). The probes' own samples are written into their rows of their batch's
   slab (:meth:`Assembler.settle_probes`), the rest having been decoded into its rows.
3. Without a slab (no decoding, no shared memory) samples are the values themselves; file
   bytes (``decode=None``) under the default collate are the batch as they are, with no
   hop to the collate thread.

Labels are gathered here, never by a worker: a batch is ``value`` or ``(value, labels)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np
import torch

from aioloader.base.items import Batch
from aioloader.base.tree import unflatten
from aioloader.collate import ShapeMismatch, collate_leaves, default_collate, files_by_shape, plain_batch
from aioloader.errors import CollateError
from aioloader.memory.layout import ArraySpec
from aioloader.memory.results import ArrayRef, Deferred, InArea, Pickled, RowResult, Written
from aioloader.memory.slabs import Slab, SlabPool
from aioloader.memory.writer import RowWriter
from aioloader.observe.stages import StageMeter

__all__ = ["Assembler", "view_array"]


def view_array(buf: np.ndarray[Any, Any], offset: int, spec: ArraySpec, rows: int | None = None) -> Any:
    """The array of ``spec`` at ``offset`` in ``buf`` (uint8), as the decoder returned it
    (a NumPy array or a torch tensor); with ``rows``, ``rows`` of them stacked."""
    shape = spec.shape if rows is None else (rows, *spec.shape)
    raw = buf[offset : offset + spec.nbytes * (1 if rows is None else rows)].view(np.ndarray)
    if spec.torch:
        return torch.from_numpy(raw).view(getattr(torch, spec.dtype)).reshape(shape)
    return raw.view(np.dtype(spec.dtype)).reshape(shape)


class Assembler:
    """Builds batches for one loader (see the module docstring)."""

    def __init__(
        self,
        labels: np.ndarray[Any, Any] | None,
        slabs: SlabPool | None,
        collate: Callable[[list[Any]], Any] | None,
        zero_copy: bool,
        collate_pool: Executor,
        meter: StageMeter | None = None,
        path_of: Callable[[int], str] | None = None,
    ) -> None:
        self._meter = meter if meter is not None else StageMeter("collate")
        self._labels = labels
        self._slabs = slabs
        self._custom = collate
        self._collate = collate or default_collate
        self._zero_copy = zero_copy
        self._pool = collate_pool
        self._path_of = path_of  # a dataset index's file, for collate errors

    async def assemble(
        self, k: int, indices: list[int], results: list[RowResult | None], slab: Slab | None
    ) -> tuple[Batch, Slab | None]:
        """Batch ``k`` from ``results`` (None: a sample left out); returns the slab too,
        unless what was handed out now owns it."""
        kept = [r for r, res in enumerate(results) if res is not None]
        if not kept:  # every sample skipped: an empty marker keeps the resume position exact
            return Batch(index=k, value=None, size=0), slab
        labels = None
        if self._labels is not None:
            labels = torch.from_numpy(self._labels[[indices[r] for r in kept]].astype(np.int64))
        sample = slab.layout.sample if slab is not None else None
        if sample is not None and self._custom is None and all(isinstance(results[r], Written) for r in kept):
            assert slab is not None
            with self._meter.timed():
                value, slab = self._from_blocks(results, kept, slab)
            return Batch(index=k, value=value if labels is None else (value, labels), size=len(kept)), slab
        if (
            self._custom is None
            and slab is not None
            and self._slabs is not None
            and self._slabs.sample is not None  # a layout learned since: no hop without one
            and all(isinstance(results[r], Pickled) for r in kept)
        ):
            loop = asyncio.get_running_loop()
            moved = await loop.run_in_executor(self._pool, self._into_rows, results, kept)
            if moved is not None:
                self._release(slab)
                value, slab = moved
                value = value if labels is None else (value, labels)
                return Batch(index=k, value=value, size=len(kept)), slab
        samples, slab = self._samples(results, kept, slab)
        plain = plain_batch(samples) if self._custom is None and slab is None else None
        if plain is not None:  # file bytes (decode=None): the list is the batch, here and now
            with self._meter.timed():  # nothing to collate: counted, as no time
                pass
            return Batch(index=k, value=plain if labels is None else (plain, labels), size=len(plain)), None
        if labels is not None:
            samples = [(s, int(lbl)) for s, lbl in zip(samples, labels.tolist(), strict=True)]
        loop = asyncio.get_running_loop()
        try:
            value = await loop.run_in_executor(self._pool, self._metered, samples)
        except Exception as exc:
            raise self._collate_error(k, [indices[r] for r in kept], exc) from exc
        return Batch(index=k, value=value, size=len(samples)), slab

    def _collate_error(self, k: int, indices: list[int], exc: Exception) -> CollateError:
        """The error of batch ``k`` (of samples ``indices``) that ``collate`` raised ``exc``
        on; samples of different shapes name the files of each."""
        message = f"collate failed for batch {k}: {type(exc).__name__}: {exc}"
        if isinstance(exc, ShapeMismatch) and self._path_of is not None and len(exc.shapes) == len(indices):
            which, paths = files_by_shape(exc.shapes, [self._path_of(i) for i in indices])
            return CollateError(f"{message}; the samples by shape: {which}", batch=k, paths=paths)
        return CollateError(message, batch=k)

    def _metered(self, samples: list[Any]) -> Any:
        """``collate`` on the collate thread, timed there (not its wait for the thread)."""
        with self._meter.timed():
            return self._collate(samples)

    def _into_rows(self, results: list[RowResult | None], kept: list[int]) -> tuple[Any, Slab | None] | None:
        """The kept pickled samples written into the rows of a new slab of the layout learned
        since, then handed out as its blocks; None when there is none or one does not fit."""
        assert self._slabs is not None
        with self._meter.timed():
            return self._write_rows(results, kept)

    def _write_rows(self, results: list[RowResult | None], kept: list[int]) -> tuple[Any, Slab | None] | None:
        assert self._slabs is not None
        slab = self._slabs.acquire()
        try:
            if slab.layout.sample is None:
                self._release(slab)
                return None
            writer = RowWriter(slab.mmap, slab.layout, None)
            written: list[RowResult | None] = []
            for row, r in enumerate(kept):
                res = writer.put(row, results[r].value)  # type: ignore[union-attr]
                if not isinstance(res, Written):
                    self._release(slab)
                    return None
                written.append(res)
            del writer
            return self._from_blocks(written, list(range(len(kept))), slab)
        except BaseException:
            self._release(slab)
            raise

    def settle_probes(self, results: list[RowResult | None], probes: int, slab: Slab | None) -> None:
        """The first batch's probe samples (its first ``probes`` rows) came back pickled, one
        having taught the layout: written into their rows of ``slab`` when every other sample
        is in its row there, so that the batch is the slab's rows like any other."""
        if not probes or slab is None or slab.layout.sample is None:
            return
        if not all(r is None or isinstance(r, Written) for r in results[probes:]):
            return
        writer = RowWriter(slab.mmap, slab.layout, None)
        for row, res in enumerate(results[:probes]):
            if isinstance(res, Pickled) and isinstance(written := writer.put(row, res.value), Written):
                results[row] = written

    def _release(self, slab: Slab) -> None:
        assert self._slabs is not None
        self._slabs.release(slab)

    def _from_blocks(
        self, results: list[RowResult | None], kept: list[int], slab: Slab
    ) -> tuple[Any, Slab | None]:
        layout = slab.layout
        assert layout.sample is not None
        n = len(results)
        whole = len(kept) == n and self._zero_copy
        buf = slab.owner(self._release) if whole else np.frombuffer(slab.mmap, dtype=np.uint8)
        blocks = iter(layout.blocks)
        plain = iter(zip(*(results[r].plain for r in kept), strict=True))  # type: ignore[union-attr]
        leaves: list[Any] = []
        for spec in layout.sample.leaves:
            if spec is None:
                leaves.append(collate_leaves(list(next(plain))))
                continue
            rows = view_array(buf, next(blocks), spec, n)
            rows = torch.from_numpy(rows) if isinstance(rows, np.ndarray) else rows
            if not whole:  # a copy: the slab is free again at once
                rows = rows[kept] if len(kept) < n else rows.clone()
            leaves.append(rows)
        del buf
        return unflatten(layout.sample.treedef, leaves), (None if whole else slab)

    def _samples(
        self, results: list[RowResult | None], kept: list[int], slab: Slab | None
    ) -> tuple[list[Any], Slab | None]:
        """Each kept sample as the decoder returned it, arrays viewing the slab."""
        if slab is None:
            return [results[r].value for r in kept], None  # type: ignore[union-attr]
        copy = not self._zero_copy
        buf = np.frombuffer(slab.mmap, dtype=np.uint8) if copy else slab.owner(self._release)
        layout = slab.layout
        samples = []
        for r in kept:
            res = results[r]
            if isinstance(res, (Pickled, Deferred)):
                samples.append(res.value)
            elif isinstance(res, InArea):
                leaves = [
                    _own(view_array(buf, x.offset, x.spec), copy) if isinstance(x, ArrayRef) else x
                    for x in res.leaves
                ]
                samples.append(unflatten(res.treedef, leaves))
            else:
                assert isinstance(res, Written) and layout.sample is not None
                blocks, plain = iter(layout.blocks), iter(res.plain)
                leaves = [
                    next(plain)
                    if spec is None
                    else _own(view_array(buf, next(blocks) + r * spec.nbytes, spec), copy)
                    for spec in layout.sample.leaves
                ]
                samples.append(unflatten(layout.sample.treedef, leaves))
        del buf
        # With views, the slab goes back once they are all garbage (the owner's finalizer).
        return samples, (slab if copy else None)


def _own(array: Any, copy: bool) -> Any:
    if not copy:
        return array
    return array.clone() if isinstance(array, torch.Tensor) else array.copy()
