"""Default collation: a list of samples to one batch of torch tensors.

Runs on the loader's collate thread (never on the event loop, so reads keep flowing while a
batch is stacked).
"""

from __future__ import annotations

import collections.abc as cabc
import numbers
from typing import Any

import numpy as np
import torch

__all__ = ["default_collate"]


def default_collate(samples: list[Any]) -> Any:
    """Stack a list of samples into one batch.

    - ``torch.Tensor`` / ``numpy.ndarray``: stacked into a tensor with a new first dimension
      (all samples must have the same shape and dtype);
    - ``bool``, ``int``, ``float`` and NumPy scalars: a 1-D tensor (``bool``, ``int64``,
      ``float64``, or the NumPy dtype);
    - ``str``, ``bytes``, ``None``: a list, unchanged;
    - ``dict`` / ``list`` / ``tuple`` / namedtuple: collated per key or position, recursively.

    Anything else raises ``TypeError`` naming the type.
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    first = samples[0]
    if isinstance(first, torch.Tensor):
        _check_shapes([tuple(s.shape) for s in samples], "tensors")
        return torch.stack(samples)
    if isinstance(first, np.ndarray):
        _check_shapes([s.shape for s in samples], "arrays")
        if first.dtype.kind in "OUSV":
            raise TypeError(f"cannot collate numpy arrays of dtype {first.dtype}")
        return torch.from_numpy(np.stack(samples))
    if isinstance(first, (numbers.Number, np.generic)) and not isinstance(first, complex):
        return _numbers(samples)
    if first is None or isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, cabc.Mapping):
        return {key: default_collate([s[key] for s in samples]) for key in first}
    if isinstance(first, (tuple, list)):
        if any(len(s) != len(first) for s in samples):
            raise ValueError("cannot collate sequences of different lengths in one batch")
        columns = [default_collate(list(col)) for col in zip(*samples, strict=True)]
        if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
            return type(first)(*columns)
        return tuple(columns) if isinstance(first, tuple) else columns
    raise TypeError(f"default_collate cannot collate samples of type {type(first).__qualname__}")


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


def _check_shapes(shapes: list[tuple[int, ...]], what: str) -> None:
    if any(s != shapes[0] for s in shapes):
        distinct = sorted(set(shapes))
        raise ValueError(
            f"cannot stack {what} of different shapes {distinct[:4]} into one batch; "
            "resize in decode or pass a custom collate"
        )
