"""Default collation: a list of samples to one batch of torch tensors.

Runs on the loader's collate thread (never on the event loop, so reads keep flowing while a
batch is stacked).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from aioloader.base.tree import flatten, unflatten

__all__ = ["ShapeMismatch", "collate_leaves", "default_collate", "files_by_shape", "plain_batch"]

#: Leaves that :func:`default_collate` gives back as a list, unchanged.
_PLAIN = (bytes, str, type(None))


def default_collate(samples: list[Any]) -> Any:
    """Stack a list of samples into one batch.

    - ``torch.Tensor`` / ``numpy.ndarray``: stacked into a tensor with a new first dimension
      (all samples must have the same shape and dtype);
    - ``bool``, ``int``, ``float`` and NumPy scalars: a 1-D tensor (``bool``, ``int64``,
      ``float64``, or the NumPy dtype);
    - ``str``, ``bytes``, ``None``: a list, unchanged;
    - ``dict`` / ``list`` / ``tuple`` / namedtuple: collated per key or position, recursively
      (every sample must have the same structure).

    Anything else raises ``TypeError`` naming the type.
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    treedef, first = flatten(samples[0])
    columns: list[list[Any]] = [[leaf] for leaf in first]
    for sample in samples[1:]:
        other, leaves = flatten(sample)
        if other != treedef:
            raise ValueError(
                "cannot collate samples of different structure in one batch (sequences of different "
                f"lengths, dicts with other keys): {_describe(samples[0])} vs {_describe(sample)}"
            )
        for column, leaf in zip(columns, leaves, strict=True):
            column.append(leaf)
    return unflatten(treedef, [collate_leaves(column) for column in columns])


def plain_batch(samples: list[Any]) -> list[Any] | None:
    """What :func:`default_collate` makes of ``samples`` when every one is a ``bytes``,
    ``str`` or ``None`` (the list, unchanged: nothing to walk or stack, so nothing worth a
    thread hop); None when any is something else."""
    if not samples or not all(type(s) in _PLAIN for s in samples):
        return None
    return list(samples)


def collate_leaves(column: list[Any]) -> Any:
    """One leaf position of every sample (see :func:`default_collate`) to its batch. A leaf
    whose type has a ``collate_batch`` static method makes the column's batch with it (the
    device decode's encoded images: :mod:`aioloader.decode.encoded`)."""
    for leaf in column:
        special = getattr(type(leaf), "collate_batch", None)
        if special is not None:
            return special(column)
    first = column[0]
    if isinstance(first, torch.Tensor):
        _check_shapes([tuple(s.shape) for s in column], "tensors")
        return torch.stack(column)
    if isinstance(first, np.ndarray):
        _check_shapes([s.shape for s in column], "arrays")
        if first.dtype.kind in "OUSV":
            raise TypeError(f"cannot collate numpy arrays of dtype {first.dtype}")
        return torch.from_numpy(np.stack(column))
    if isinstance(first, (numbers.Number, np.generic)) and not isinstance(first, complex):
        return _numbers(column)
    if first is None or isinstance(first, (str, bytes)):
        return list(column)
    raise TypeError(f"default_collate cannot collate samples of type {type(first).__qualname__}")


def _describe(sample: Any) -> str:
    if isinstance(sample, dict):
        return f"a dict with keys {list(sample)}"
    if isinstance(sample, (tuple, list)):
        return f"a {type(sample).__name__} of length {len(sample)}"
    return f"a {type(sample).__name__}"


def _numbers(samples: list[Any]) -> torch.Tensor:
    """One tensor of scalars; the dtype fits every sample, not just the first (``[1, 2.5]``
    is float64, never an int64 that truncates 2.5)."""
    if all(isinstance(s, bool) for s in samples):
        return torch.tensor(samples, dtype=torch.bool)
    if all(isinstance(s, np.generic) for s in samples):
        return torch.from_numpy(np.asarray(samples))
    if all(isinstance(s, numbers.Integral) for s in samples):
        return torch.tensor([int(s) for s in samples], dtype=torch.int64)
    if all(isinstance(s, numbers.Real) for s in samples):
        return torch.tensor([float(s) for s in samples], dtype=torch.float64)
    kinds = sorted({type(s).__name__ for s in samples})
    raise TypeError(f"cannot collate numbers of mixed kinds {kinds} into one tensor")


class ShapeMismatch(ValueError):
    """Samples of one batch whose leaves at one position differ in shape. ``shapes`` holds
    each sample's, in the batch's order, so the loader can name the files of each shape."""

    def __init__(self, message: str, shapes: list[tuple[int, ...]]) -> None:
        super().__init__(message)
        self.shapes = shapes

    def __reduce__(self) -> tuple[object, ...]:
        return (ShapeMismatch, (self.args[0], self.shapes))


def _check_shapes(shapes: list[tuple[int, ...]], what: str) -> None:
    if any(s != shapes[0] for s in shapes):
        distinct = sorted(set(shapes))
        raise ShapeMismatch(
            f"cannot stack {what} of different shapes {distinct[:4]} into one batch; "
            "resize in decode or pass a custom collate",
            shapes,
        )


def files_by_shape(
    shapes: list[tuple[int, ...]], paths: list[str], most: int = 3
) -> tuple[str, tuple[str, ...]]:
    """Which files had which shape (pure): ``"(48, 64, 3) in 1 sample: 'b.png'; (32, 32, 3)
    in 15 samples, e.g. 'a.jpg', ..."``, the rarest shapes first (the odd ones out), at most
    4 shapes and ``most`` files of each; and the files named. ``paths[i]`` is sample ``i``'s."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for shape, path in zip(shapes, paths, strict=True):
        groups.setdefault(shape, []).append(path)
    parts, named = [], []
    for shape, files in sorted(groups.items(), key=lambda g: len(g[1]))[:4]:
        shown = files[:most]
        named += shown
        listed = ", ".join(repr(f) for f in shown) + (", ..." if len(files) > most else "")
        many = (
            f"{len(files)} samples, e.g."
            if len(files) > most
            else f"{len(files)} sample{'s' * (len(files) > 1)}:"
        )
        parts.append(f"{shape} in {many} {listed}")
    return "; ".join(parts), tuple(named)
