"""Which samples go into which batch, for one epoch and one rank.

Pure functions of ``(n, seed, epoch, rank, world_size, batch_size, drop_last)``: no I/O, no
event loop, so every sampling decision is unit-tested directly (``tests/test_sampler.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from aioloader.plan.locality import block, block_remainder, locality_order, remainder_positions

__all__ = [
    "EpochPlan",
    "epoch_order",
    "num_batches",
    "plan_epoch",
    "plan_remainder",
    "rank_share",
    "remainder_len",
    "remainder_span",
    "shard",
    "shard_size",
]

IndexArray = npt.NDArray[np.int64]


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> IndexArray:
    """Dataset indices in the order of ``epoch``: ``0..n-1``, or a permutation of them that
    depends only on ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(n).astype(np.int64, copy=False)


def shard(order: IndexArray, rank: int, world_size: int, *, pad: bool = True) -> IndexArray:
    """The part of ``order`` that ``rank`` sees, like ``DistributedSampler``.

    Shards are made equal first, so every rank gets the same number of batches (uneven
    counts hang collective ops): ``pad`` repeats samples from the start of ``order`` to fill
    the last round; otherwise the tail that does not fill a round is dropped. Rank ``r``
    takes every ``world_size``-th index starting at ``r``.
    """
    if world_size == 1:
        return order
    n = len(order)
    if pad:
        total = math.ceil(n / world_size) * world_size
        if total > n:
            reps = math.ceil((total - n) / max(n, 1))
            order = np.concatenate([order, np.tile(order, reps)[: total - n]])
    else:
        order = order[: (n // world_size) * world_size]
    return order[rank::world_size]


def shard_size(n: int, world_size: int, pad: bool = True) -> int:
    """Samples each rank sees in an epoch of ``n`` (see :func:`shard`)."""
    return math.ceil(n / world_size) if pad else n // world_size


def num_batches(num_samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``num_samples``: the last partial batch counts unless
    ``drop_last``."""
    if drop_last:
        return num_samples // batch_size
    return math.ceil(num_samples / batch_size)


@dataclass(frozen=True)
class EpochPlan:
    """The samples of one epoch on one rank, cut into batches.

    ``indices`` holds exactly the samples that will be delivered (the tail that
    ``drop_last`` drops is already removed). A resumed epoch skips what was delivered
    before: every batch below ``start``, and the batches in ``done`` (delivered out of order
    with ``ordered=False``).
    """

    epoch: int
    indices: IndexArray
    batch_size: int
    start: int = 0
    done: frozenset[int] = frozenset()

    def __len__(self) -> int:
        return math.ceil(len(self.indices) / self.batch_size)

    def batch(self, k: int) -> IndexArray:
        """Dataset indices of batch ``k`` (0-based within the epoch)."""
        return self.indices[k * self.batch_size : (k + 1) * self.batch_size]

    def pending(self) -> list[int]:
        """The batches still to produce, in order."""
        return [k for k in range(self.start, len(self)) if k not in self.done]


def plan_epoch(
    n: int,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    drop_last: bool,
    rank: int = 0,
    world_size: int = 1,
    pad: bool = True,
    start: int = 0,
    done: frozenset[int] = frozenset(),
    runs: IndexArray | None = None,
    buffer: int = 0,
) -> EpochPlan:
    """Plan ``epoch``: order, shard for ``rank``, then drop the last partial batch if asked.
    With ``runs`` (the start index of each shard's run of samples), the shard-local order
    of :mod:`aioloader.plan.locality`, mixed within ``buffer``, cut into contiguous blocks."""
    if runs is not None:
        order = locality_order(runs, n, seed=seed, epoch=epoch, buffer=buffer)
        indices = block(order, rank, world_size, pad=pad)
    else:
        indices = shard(epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch), rank, world_size, pad=pad)
    keep = num_batches(len(indices), batch_size, drop_last) * batch_size
    return EpochPlan(epoch=epoch, indices=indices[:keep], batch_size=batch_size, start=start, done=done)


def rank_share(n: int, *, batch_size: int, drop_last: bool, world_size: int, pad: bool = True) -> int:
    """Samples each rank delivers in a whole epoch of ``n``: its shard (:func:`shard_size`),
    less the partial batch ``drop_last`` leaves out."""
    per_rank = shard_size(n, world_size, pad)
    return min(per_rank, num_batches(per_rank, batch_size, drop_last) * batch_size)


def remainder_span(
    n: int, *, batch_size: int, drop_last: bool, old_world_size: int, consumed_batches: int, pad: bool = True
) -> tuple[int, int]:
    """``(start, stop)``: where the rest of an epoch interrupted on ``old_world_size`` ranks
    lies in the epoch's order (:func:`plan_remainder`), without making that order.

    Rank ``r`` takes every ``old_world_size``-th sample of the (padded) order from ``r``, so
    the first ``k`` samples of every old rank are, together, the order's first
    ``k * old_world_size``; padding repeats the order's start, which is in that prefix
    already. What the old epoch planned is the prefix of each rank's :func:`rank_share`, what
    the old ranks delivered the prefix of ``consumed_batches`` batches each, and the rest is
    the part of the order between the two, each sample once."""
    kept = rank_share(n, batch_size=batch_size, drop_last=drop_last, world_size=old_world_size, pad=pad)
    stop = min(n, kept * old_world_size)
    start = min(stop, min(consumed_batches * batch_size, kept) * old_world_size)
    return start, stop


def remainder_len(
    n: int,
    *,
    batch_size: int,
    drop_last: bool,
    old_world_size: int,
    consumed_batches: int,
    pad: bool = True,
    blocks: bool = False,
) -> int:
    """Samples :func:`plan_remainder` spreads over the new ranks, without making the order:
    a slice of it (:func:`remainder_span`), or with ``blocks`` (the shard-local order) the
    parts of each old rank's block it had not delivered."""
    if not blocks:
        start, stop = remainder_span(
            n,
            batch_size=batch_size,
            drop_last=drop_last,
            old_world_size=old_world_size,
            consumed_batches=consumed_batches,
            pad=pad,
        )
        return stop - start
    per, kept, consumed = _block_counts(n, batch_size, drop_last, old_world_size, consumed_batches, pad)
    return len(remainder_positions(n, per=per, kept=kept, consumed=consumed, old_world_size=old_world_size))


def _block_counts(
    n: int, batch_size: int, drop_last: bool, old_world_size: int, consumed_batches: int, pad: bool
) -> tuple[int, int, int]:
    """Each old rank's block size, the samples it planned and those it delivered."""
    kept = rank_share(n, batch_size=batch_size, drop_last=drop_last, world_size=old_world_size, pad=pad)
    return shard_size(n, old_world_size, pad), kept, min(consumed_batches * batch_size, kept)


def plan_remainder(
    n: int,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    drop_last: bool,
    old_world_size: int,
    consumed_batches: int,
    rank: int,
    world_size: int,
    pad: bool = True,
    runs: IndexArray | None = None,
    buffer: int = 0,
) -> EpochPlan:
    """The rest of an epoch interrupted on ``old_world_size`` ranks, re-sharded over
    ``world_size`` ranks.

    Ranks run in lockstep (a collective op per step), so when one rank had consumed
    ``consumed_batches`` batches, every old rank had consumed its first
    ``consumed_batches`` batches. The samples none of them delivered, in epoch order and
    each once (:func:`remainder_span`: a slice of the epoch's order, made once here), are
    sharded again over the new ranks; the new shards are made equal like any epoch's
    (``pad`` repeats a few of them), so each new rank gets the same number of batches. With
    ``runs``, the shard-local order's blocks (:func:`~aioloader.plan.locality.block_remainder`).
    """
    if runs is not None:
        order = locality_order(runs, n, seed=seed, epoch=epoch, buffer=buffer)
        per, kept, consumed = _block_counts(n, batch_size, drop_last, old_world_size, consumed_batches, pad)
        indices = block_remainder(
            order,
            per=per,
            kept=kept,
            consumed=consumed,
            old_world_size=old_world_size,
            rank=rank,
            world_size=world_size,
            pad=pad,
        )
        keep = num_batches(len(indices), batch_size, drop_last) * batch_size
        return EpochPlan(epoch=epoch, indices=indices[:keep], batch_size=batch_size)
    start, stop = remainder_span(
        n,
        batch_size=batch_size,
        drop_last=drop_last,
        old_world_size=old_world_size,
        consumed_batches=consumed_batches,
        pad=pad,
    )
    rest = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch)[start:stop]
    indices = shard(rest, rank, world_size, pad=pad)
    keep = num_batches(len(indices), batch_size, drop_last) * batch_size
    return EpochPlan(epoch=epoch, indices=indices[:keep], batch_size=batch_size)
