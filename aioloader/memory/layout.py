"""Where decoded samples go in a batch slab, learned from the samples themselves (pure).

A decoded sample is a tree (:mod:`aioloader.base.tree`) whose leaves are *arrays* (NumPy arrays
of a numeric dtype, CPU torch tensors) or plain values (numbers, strings, ``None``, ...).
Its :class:`SampleLayout` is the tree's structure plus an :class:`ArraySpec` (shape, dtype,
numpy or torch) per array leaf. When every sample of a batch has the same layout, each
array leaf gets a block of ``batch_size`` rows in the slab, a worker writes the sample's
arrays into its row, and the block *is* the collated batch (zero-copy).

:class:`LayoutTracker` learns that layout from the first sample decoded (the first batch's
probe, :mod:`aioloader.engine.epoch`), then from each batch (or takes a declared
``output_shape``), and falls back to a per-chunk output area of the slab when shapes vary:
samples then reach the collate as views of shared memory. Nothing is declared by the user.

:func:`plan_slab` places everything inside one slab (byte offsets, 64-byte aligned)::

    [ status: rows x 16 | input arena | rows block per array leaf | output area ]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioloader.base.tree import LEAF, TreeDef, flatten

__all__ = [
    "ArraySpec",
    "LayoutTracker",
    "SampleLayout",
    "SlabLayout",
    "array_spec",
    "declared_layout",
    "describe",
    "plan_slab",
]

ALIGN = 64
STATUS_ROW_BYTES = 16  # (pid, start) as two float64


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class ArraySpec:
    """One array leaf: ``shape``, ``dtype`` (a NumPy dtype string such as ``'|u1'``, or a
    torch dtype name such as ``'bfloat16'`` when ``torch``), and whether it is a tensor."""

    shape: tuple[int, ...]
    dtype: str
    torch: bool
    nbytes: int

    def __reduce__(self) -> tuple[Any, ...]:  # in every task: see protocol.Chunk
        return (ArraySpec, (self.shape, self.dtype, self.torch, self.nbytes))


def array_spec(leaf: Any) -> ArraySpec | None:
    """The spec of an array leaf, or None for a leaf that travels as a plain value. Never
    imports torch: a tensor can only exist where torch is already imported."""
    if isinstance(leaf, np.ndarray):
        if leaf.dtype.kind in "OUSV" or leaf.dtype.hasobject:
            return None
        return ArraySpec(tuple(leaf.shape), leaf.dtype.str, False, int(leaf.nbytes))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(leaf, torch.Tensor):
        if leaf.device.type != "cpu" or leaf.layout != torch.strided or leaf.is_quantized:
            return None
        nbytes = leaf.numel() * leaf.element_size()
        return ArraySpec(tuple(leaf.shape), str(leaf.dtype).removeprefix("torch."), True, int(nbytes))
    return None


def describe(value: Any) -> tuple[TreeDef, list[Any], tuple[ArraySpec | None, ...]]:
    """``(treedef, leaves, spec per leaf)`` of a decoded sample."""
    treedef, leaves = flatten(value)
    return treedef, leaves, tuple(array_spec(leaf) for leaf in leaves)


@dataclass(frozen=True)
class SampleLayout:
    """The structure of every sample of a batch: ``treedef`` and, per leaf, its
    :class:`ArraySpec` (None for a plain-value leaf). At least one leaf is an array."""

    treedef: TreeDef
    leaves: tuple[ArraySpec | None, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return (SampleLayout, (self.treedef, self.leaves))

    @classmethod
    def declared(cls, shape: object, dtype: object = np.uint8) -> SampleLayout:
        """The layout of a decoder that declares ``output_shape`` (and ``output_dtype``)."""
        dims = tuple(int(d) for d in shape)  # type: ignore[attr-defined]
        dt = np.dtype(dtype)  # type: ignore[call-overload]
        nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
        return cls(LEAF, (ArraySpec(dims, dt.str, False, nbytes),))

    @property
    def arrays(self) -> list[tuple[int, ArraySpec]]:
        """``(leaf position, spec)`` of each array leaf, in leaf order."""
        return [(i, s) for i, s in enumerate(self.leaves) if s is not None]

    @property
    def sample_bytes(self) -> int:
        return sum(s.nbytes for s in self.leaves if s is not None)


@dataclass(frozen=True)
class SlabLayout:
    """Byte offsets inside one slab of ``rows`` samples (see the module docstring).

    ``blocks[j]`` is the offset of the rows block of ``sample.arrays[j]``; ``out`` and
    ``out_size`` the output area that chunks of samples of another layout are written to.
    """

    rows: int
    input: int
    input_size: int
    sample: SampleLayout | None
    blocks: tuple[int, ...]
    out: int
    out_size: int
    size: int

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (
            self.rows,
            self.input,
            self.input_size,
            self.sample,
            self.blocks,
            self.out,
            self.out_size,
            self.size,
        )
        return (SlabLayout, fields)


def declared_layout(decode: object) -> SampleLayout | None:
    """The layout a decoder declares with ``output_shape`` (and ``output_dtype``), if any."""
    shape = getattr(decode, "output_shape", None)
    if shape is None:
        return None
    return SampleLayout.declared(shape, getattr(decode, "output_dtype", "uint8"))


def plan_slab(rows: int, sample: SampleLayout | None, input_size: int, out_size: int) -> SlabLayout:
    """The layout of a slab for ``rows`` samples of ``sample`` (None: no rows blocks), an
    input arena of ``input_size`` bytes and an output area of ``out_size`` bytes."""
    at = align(rows * STATUS_ROW_BYTES)
    inp, at = at, align(at + input_size)
    blocks = []
    for _, spec in sample.arrays if sample is not None else []:
        blocks.append(at)
        at = align(at + rows * spec.nbytes)
    out, at = at, at + out_size
    return SlabLayout(rows, inp, input_size, sample, tuple(blocks), out, out_size, max(at, 1))


class LayoutTracker:
    """Learns where decoded samples go, batch by batch (pure; the engine feeds it).

    States: *unknown* (nothing seen: samples come back pickled), *fixed* (every sample of
    the first batch had one layout: rows blocks), *varying* (shapes differ: each chunk gets
    a share of the slab's output area and samples come back as views). A fixed layout turns
    varying when more than a quarter of a batch's samples miss it, and stays so.
    """

    def __init__(self, declared: SampleLayout | None = None) -> None:
        self.sample: SampleLayout | None = declared
        self.varying = False
        self._per_sample = 0  # largest array bytes of one sample seen, for the output area

    @property
    def known(self) -> bool:
        return self.sample is not None or self.varying

    def observe(
        self,
        layouts: list[tuple[TreeDef, tuple[ArraySpec | None, ...]]],
        fitted: int,
        slab_sample: SampleLayout | None,
    ) -> None:
        """One batch: the layouts of its samples that were *not* written into rows blocks
        (pickled or in the output area), ``fitted``, how many were, and the rows layout its
        slab had (misses count against the layout they were offered; the samples of a slab
        made before any layout was learned are judged against the one learned since)."""
        for _, specs in layouts:
            need = sum(align(s.nbytes) for s in specs if s is not None)
            self._per_sample = max(self._per_sample, need)
        arrays = [(t, s) for t, s in layouts if any(x is not None for x in s)]
        if not arrays or self.varying:
            return
        if self.sample is None:
            first = arrays[0]
            if fitted == 0 and all(other == first for other in arrays):
                self.sample = SampleLayout(*first)
            else:
                self.varying = True
            return
        if slab_sample is None:
            # A slab made before the layout was learned (every sample came pickled): judge
            # its samples against the layout now, or a layout learned from one small batch
            # that finished first (a last batch of one sample) would outlive a whole epoch of
            # samples that miss it.
            fits = sum(1 for a in arrays if SampleLayout(*a) == self.sample)
            missed, fitted = len(arrays) - fits, fitted + fits
        elif slab_sample == self.sample:
            missed = len(arrays)
        else:
            return  # offered another layout: says nothing about this one
        if missed * 4 > missed + fitted:
            self.sample, self.varying = None, True

    def out_bytes_per_sample(self) -> int:
        """Bytes of output area to reserve per sample of a chunk (0: none needed)."""
        return int(self._per_sample * 1.25) + ALIGN if self.varying else 0
