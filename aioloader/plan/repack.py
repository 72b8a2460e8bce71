"""Full batches despite skipped samples: with ``drop_last=True`` and ``on_error="skip"``, a
batch that lost samples is topped up with the next samples of the epoch (pure logic).

Batches arrive in epoch order; their surviving samples form one stream that is cut into
batches of exactly ``batch_size``, and what is left at the end of the epoch is dropped (that
is what ``drop_last`` asks for). Only batches that lost samples cost anything: a full batch
with nothing carried passes through untouched (zero-copy); otherwise rows are sliced and
concatenated (``torch.cat``; lists are joined), which copies them.

Resume position: a plan batch counts as received once all its surviving samples were
delivered (``Batch.done``). Samples carried over when a state is taken are produced again
after a resume: a few may repeat, none is lost.
"""

from __future__ import annotations

from typing import Any

import torch

from aioloader.base.items import Batch
from aioloader.base.tree import flatten, map_leaves, unflatten

__all__ = ["Repacker", "concat_rows", "take_rows"]


def is_batch_leaf(value: Any) -> bool:
    """In a collated batch, a tensor or a list of per-sample values (strings, ``None``, ...)
    is one leaf; other lists are nodes (the columns of list samples)."""
    if isinstance(value, torch.Tensor):
        return True
    nodes = (list, tuple, dict, torch.Tensor)
    return isinstance(value, list) and not any(isinstance(v, nodes) for v in value)


def take_rows(value: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a collated batch (tensors, lists, and dicts/tuples of them)."""

    def rows(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor | list):
            return leaf[start:stop]
        raise TypeError(f"cannot take rows of a {type(leaf).__name__} in a batch")

    return map_leaves(value, rows, is_batch_leaf)


def concat_rows(a: Any, b: Any) -> Any:
    """``a``'s rows then ``b``'s, for two batches of the same structure."""
    treedef, left = flatten(a, is_batch_leaf)
    other, right = flatten(b, is_batch_leaf)
    if other != treedef:
        raise ValueError("cannot join rows of batches of different structure")
    joined = []
    for x, y in zip(left, right, strict=True):
        if isinstance(x, torch.Tensor):
            joined.append(torch.cat([x, y]))
        elif isinstance(x, list):
            joined.append(x + y)
        else:
            raise TypeError(f"cannot join rows of a {type(x).__name__} in a batch")
    return unflatten(treedef, joined)


class Repacker:
    """Cuts the stream of surviving samples into full batches (see the module docstring)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._carry: Any = None
        self._carry_rows = 0
        self._open: list[int] = []  # plan batches with samples still in the carry

    def push(self, batch: Batch) -> list[Batch]:
        """The full batches that ``batch`` (next in epoch order) completes, possibly none."""
        bs = self.batch_size
        if batch.size == 0:  # every sample skipped: nothing to deliver, but it is done
            if self._carry_rows:
                self._open.append(batch.index)  # done with the delivery that empties the carry
                return []
            return [batch]
        if self._carry_rows == 0 and batch.size == bs:
            return [batch]
        value = batch.value if self._carry_rows == 0 else concat_rows(self._carry, batch.value)
        rows = self._carry_rows + batch.size
        self._open.append(batch.index)
        out: list[Batch] = []
        start = 0
        while rows - start >= bs:
            start += bs
            # The plan batches whose last sample is now delivered are done.
            done = self._open[:-1] if rows - start > 0 else self._open
            out.append(
                Batch(index=batch.index, value=take_rows(value, start - bs, start), size=bs, done=tuple(done))
            )
            self._open = self._open[len(done) :]
        self._carry_rows = rows - start
        self._carry = take_rows(value, start, rows) if self._carry_rows else None
        return out
