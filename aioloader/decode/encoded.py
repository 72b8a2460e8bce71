"""Samples the device decodes: what crosses from the loader to the bridging thread.

In the loader process the device decode stage (:mod:`aioloader.decode.ondevice`) answers a
JPEG the GPU takes with an :class:`EncodedImage`: its file's bytes, the crop window drawn
for it exactly as the CPU path draws it (from ``(seed, epoch, index)``), and its flip. The
default collate (which asks a leaf's type for ``collate_batch``) makes the batch's column
of samples, CPU-decoded arrays and encoded images mixed, into one :class:`EncodedBatch`:

- ``images``, ``cpu_rows``: the rows the CPU workers decoded, stacked, and where they go;
- ``data``, ``offsets``: the encoded images' bytes end to end (image ``i`` is
  ``data[offsets[i]:offsets[i + 1]]``), ``gpu_rows``: where they go, with their ``boxes``
  (``x0, y0, x1, y1`` in the image's pixels), ``flips``, dataset ``indices`` and ``paths``;
- ``rows``, ``height``, ``width``: the batch's shape, ``(rows, 3, height, width)``.

It is a namedtuple of arrays, so it crosses to the trainer's process as any batch does: its
large arrays as views of shared memory (:mod:`aioloader.run.wire`). The bridging thread
(:mod:`aioloader.run.devdecode`) turns it into the batch's ``uint8`` tensor on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = ["EncodedBatch", "EncodedImage"]


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """One sample the device decodes (see the module docstring): its file's ``data``, crop
    ``box`` and ``flip``, dataset ``index`` and ``path``; the output is ``(3, height,
    width)``."""

    data: bytes
    box: tuple[float, float, float, float]
    flip: bool
    index: int
    path: str
    height: int
    width: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            EncodedImage,
            (self.data, self.box, self.flip, self.index, self.path, self.height, self.width),
        )

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
    rows: int
    height: int
    width: int

    @classmethod
    def of(cls, column: list[Any]) -> EncodedBatch:
        encoded = [(r, s) for r, s in enumerate(column) if isinstance(s, EncodedImage)]
        decoded = [(r, np.asarray(s)) for r, s in enumerate(column) if not isinstance(s, EncodedImage)]
        if not encoded:
            raise TypeError("an encoded batch needs at least one EncodedImage")
        height, width = encoded[0][1].height, encoded[0][1].width
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
