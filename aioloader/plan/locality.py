"""The shard-local order (``Loader(..., locality=Locality(...))``): shards read front to back,
in a shuffled order of shards, their samples mixed through a shuffle buffer, and each rank
given a contiguous block of the epoch's order, so it reads a few shards at a time, sequentially.

For storage where a ranged read costs much more than the bytes it brings (a far bucket, an
HTTP server with a high latency per request) and datasets stored as runs of samples in a
few large files (tar shards). ``shuffle=True`` without it samples uniformly over all shards:
the better order for training, which aioloader's concurrent ranged reads can afford
elsewhere.

Pure functions of ``(runs, seed, epoch, buffer, rank, world_size)``; the order depends on
nothing else, so a resumed epoch (``state_dict``) delivers exactly the batches an
uninterrupted one would, on any number of ranks (no divisibility constraint: blocks are
made equal as :func:`~aioloader.plan.sampler.shard` makes shards, by repeating a few samples).

The buffer is the webdataset ``shuffle(n)`` window, made without a loop: each sample's key is
its position in the shard-sequential stream plus a uniform draw in ``[0, buffer)``, and the
order is the stable sort of the keys. A sample moves at most ``buffer`` places, and samples
fewer than ``buffer`` apart are mixed uniformly: the same mixing window as a reservoir of
``buffer`` samples, computed in O(n log n) NumPy time for millions of samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from aioloader.base.checks import positive_int

__all__ = ["Locality", "block", "block_remainder", "locality_order", "remainder_positions"]

IndexArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Locality:
    """Read shards front to back (see the module): ``buffer`` samples are mixed at once
    (webdataset's ``shuffle(buffer)``; 0 or 1: none). Checked when made."""

    buffer: int = 1000

    def __post_init__(self) -> None:
        if self.buffer != 0:
            positive_int("Locality(buffer)", self.buffer)


def locality_order(runs: IndexArray, n: int, *, seed: int, epoch: int, buffer: int) -> IndexArray:
    """The dataset indices of ``epoch``: the runs (each a shard's samples, ``runs`` their
    start indices, ascending from 0) in an order that depends only on ``(seed, epoch)``, each
    run front to back, then mixed within ``buffer`` places (see the module)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 1])))
    ends = np.append(runs[1:], n)
    chosen = rng.permutation(len(runs))
    lengths = (ends - runs)[chosen]
    # Each run's samples, in the chosen order of runs: its start plus 0..length-1.
    stream = np.repeat(runs[chosen] - np.cumsum(lengths) + lengths, lengths) + np.arange(n, dtype=np.int64)
    if buffer <= 1:
        return stream.astype(np.int64, copy=False)
    keys = np.arange(n, dtype=np.float64) + rng.random(n) * buffer
    return stream[np.argsort(keys, kind="stable")].astype(np.int64, copy=False)


def block(order: IndexArray, rank: int, world_size: int, *, pad: bool = True) -> IndexArray:
    """``rank``'s contiguous block of ``order``: blocks made equal first (``pad`` repeats
    samples from the start of ``order``, else the tail that does not fill a block is dropped),
    so every rank gets the same number of batches."""
    if world_size == 1:
        return order
    per = math.ceil(len(order) / world_size) if pad else len(order) // world_size
    return _padded(order, per * world_size)[rank * per : (rank + 1) * per]


def remainder_positions(n: int, *, per: int, kept: int, consumed: int, old_world_size: int) -> IndexArray:
    """Positions in an epoch's order of ``n`` that no old rank delivered, each once and in
    order: old rank ``r`` held positions ``r * per ..`` (``per`` each), planned its first
    ``kept`` and delivered its first ``consumed``. Positions past ``n`` repeat the order's
    start (padding) and are left out: those samples are in some rank's part already."""
    parts = [
        np.arange(min(r * per + consumed, n), min(r * per + kept, n), dtype=np.int64)
        for r in range(old_world_size)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def block_remainder(
    order: IndexArray,
    *,
    per: int,
    kept: int,
    consumed: int,
    old_world_size: int,
    rank: int,
    world_size: int,
    pad: bool,
) -> IndexArray:
    """The rest of an epoch cut into blocks on ``old_world_size`` ranks (see
    :func:`remainder_positions`), cut into blocks again for ``rank`` of ``world_size``."""
    rest = order[
        remainder_positions(len(order), per=per, kept=kept, consumed=consumed, old_world_size=old_world_size)
    ]
    return block(rest, rank, world_size, pad=pad)


def _padded(order: IndexArray, total: int) -> IndexArray:
    n = len(order)
    if total <= n:
        return order[:total]
    reps = math.ceil((total - n) / max(n, 1))
    return np.concatenate([order, np.tile(order, reps)[: total - n]])
