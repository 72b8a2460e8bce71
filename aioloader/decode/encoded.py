"""Samples the device decodes: what crosses from the loader to the bridging thread.

In the loader process the device decode stage (:mod:`aioloader.decode.ondevice.loaderside`)
answers a JPEG the GPU takes with an :class:`EncodedImage`: its file's bytes, the crop
window drawn for it exactly as the CPU path draws it (from ``(seed, epoch, index)``), and
its flip. The default collate (which asks a leaf's type for ``collate_batch``) makes the
batch's column of samples, CPU-decoded arrays and encoded images mixed, into one
:class:`EncodedBatch`:

- ``images``, ``cpu_rows``: the rows the CPU workers decoded, stacked, and where they go;
- ``data``, ``offsets``: the encoded images' bytes end to end (image ``i`` is
  ``data[offsets[i]:offsets[i + 1]]``), ``gpu_rows``: where they go, with their ``boxes``
  (``x0, y0, x1, y1`` in the image's pixels), ``flips``, dataset ``indices`` and ``paths``;
- the resize's plan (:func:`~aioloader.decode.taps.plan_batch`), made here, in the loader's
  process, in parallel with training, so that the bridge only launches work: the images'
  ``sizes`` (height, width, from their frame headers), each axis's taps in Pillow's fixed
  point with the crop and the flip folded in (``xindex``, ``xcoef``, ``yindex``, ``ycoef``),
  their ``digits`` and ``across_first``; the encoded images are in the plan's order;
- ``rows``, ``height``, ``width``: the batch's shape, ``(rows, 3, height, width)``.

It is a namedtuple of arrays, so it crosses to the trainer's process as any batch does: its
large arrays as views of shared memory (:mod:`aioloader.run.wire`). The bridging thread
(:mod:`aioloader.decode.ondevice.bridgeside`) turns it into the batch's ``uint8`` tensor on
the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from aioloader.decode.taps import plan_batch

__all__ = ["EncodedBatch", "EncodedImage"]


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """One sample the device decodes (see the module docstring): its file's ``data``, crop
    ``box`` and ``flip``, dataset ``index`` and ``path``, the image's ``size`` (height, width,
    from its frame header); the output is ``(3, height, width)``, resized with Pillow's
    ``resample`` filter."""

    data: bytes
    box: tuple[float, float, float, float]
    flip: bool
    index: int
    path: str
    height: int
    width: int
    size: tuple[int, int]
    resample: str

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.data, self.box, self.flip, self.index, self.path, self.height, self.width)
        return (EncodedImage, (*fields, self.size, self.resample))

    @staticmethod
    def collate_batch(column: list[Any]) -> EncodedBatch:
        """The batch of ``column``: :class:`EncodedImage` s and the ``(3, H, W)`` arrays
        the CPU decoded, mixed, in row order."""
        return EncodedBatch.of(column)


class EncodedBatch(NamedTuple):
    """A batch half decoded (see the module docstring)."""

    images: np.ndarray[Any, Any]
    cpu_rows: np.ndarray[Any, Any]
    data: np.ndarray[Any, Any]
    offsets: np.ndarray[Any, Any]
    gpu_rows: np.ndarray[Any, Any]
    boxes: np.ndarray[Any, Any]
    flips: np.ndarray[Any, Any]
    indices: np.ndarray[Any, Any]
    paths: tuple[str, ...]
    sizes: np.ndarray[Any, Any]
    xindex: np.ndarray[Any, Any]
    xcoef: np.ndarray[Any, Any]
    yindex: np.ndarray[Any, Any]
    ycoef: np.ndarray[Any, Any]
    digits: tuple[int, int, int, int]
    across_first: int
    rows: int
    height: int
    width: int

    @classmethod
    def of(cls, column: list[Any]) -> EncodedBatch:
        found = [(r, s) for r, s in enumerate(column) if isinstance(s, EncodedImage)]
        decoded = [(r, np.asarray(s)) for r, s in enumerate(column) if not isinstance(s, EncodedImage)]
        if not found:
            raise TypeError("an encoded batch needs at least one EncodedImage")
        first = found[0][1]
        height, width = first.height, first.width
        plan = plan_batch(
            np.array([s.box for _, s in found], dtype=np.float64).reshape(-1, 4),
            np.array([s.flip for _, s in found], dtype=np.bool_),
            np.array([s.size for _, s in found], dtype=np.int64).reshape(-1, 2),
            height,
            width,
            first.resample,
        )
        encoded = [found[int(i)] for i in plan.order]
        for r, arr in decoded:
            if arr.shape != (3, height, width) or arr.dtype != np.uint8:
                raise ValueError(
                    f"row {r}: a CPU-decoded sample of {arr.shape} {arr.dtype}, "
                    f"not (3, {height}, {width}) uint8"
                )
        images = np.empty((len(decoded), 3, height, width), dtype=np.uint8)
        for i, (_, arr) in enumerate(decoded):
            images[i] = arr
        sizes = [len(s.data) for _, s in encoded]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        for (_, s), a, b in zip(encoded, offsets[:-1], offsets[1:], strict=True):
            data[a:b] = np.frombuffer(s.data, dtype=np.uint8)
        return cls(
            images=images,
            cpu_rows=np.array([r for r, _ in decoded], dtype=np.int64),
            data=data,
            offsets=offsets,
            gpu_rows=np.array([r for r, _ in encoded], dtype=np.int64),
            boxes=np.array([s.box for _, s in encoded], dtype=np.float64).reshape(-1, 4),
            flips=np.array([s.flip for _, s in encoded], dtype=np.bool_),
            indices=np.array([s.index for _, s in encoded], dtype=np.int64),
            paths=tuple(s.path for _, s in encoded),
            sizes=plan.sizes,
            xindex=plan.x.pos,
            xcoef=plan.x.coef,
            yindex=plan.y.pos,
            ycoef=plan.y.coef,
            digits=plan.digits,
            across_first=plan.across_first,
            rows=len(column),
            height=height,
            width=width,
        )

    def encoded(self, i: int) -> memoryview:
        """The bytes of the ``i``-th encoded image (no copy)."""
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])].data

    def box(self, i: int) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = (float(v) for v in self.boxes[i])
        return (x0, y0, x1, y1)
