"""aioloader.plan.sampler: epoch order, sharding, batching. Pure functions, no event loop."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from aioloader.plan.sampler import EpochPlan, epoch_order, num_batches, plan_epoch, shard

SIZES = [1, 2, 7, 37, 64, 100]
WORLD_SIZES = [1, 2, 3, 4, 5]


def _all_indices(plan: EpochPlan) -> list[int]:
    return [int(i) for k in range(len(plan)) for i in plan.batch(k)]


# -- epoch_order ----------------------------------------------------------------------------


def test_epoch_order_is_a_permutation() -> None:
    for shuffle in (False, True):
        for n in SIZES:
            order = epoch_order(n, shuffle=shuffle, seed=3, epoch=1)
            assert order.dtype == np.int64
            assert order.shape == (n,)
            assert sorted(order.tolist()) == list(range(n)), (shuffle, n)


def test_epoch_order_without_shuffle_is_identity() -> None:
    for epoch in range(3):
        assert epoch_order(10, shuffle=False, seed=epoch, epoch=epoch).tolist() == list(range(10))
    assert epoch_order(0, shuffle=True, seed=0, epoch=0).tolist() == []
    assert epoch_order(0, shuffle=False, seed=0, epoch=0).tolist() == []


def test_same_seed_and_epoch_give_same_order() -> None:
    a = epoch_order(1000, shuffle=True, seed=7, epoch=4)
    b = epoch_order(1000, shuffle=True, seed=7, epoch=4)
    assert np.array_equal(a, b)


def test_shuffle_actually_shuffles() -> None:
    order = epoch_order(1000, shuffle=True, seed=0, epoch=0)
    assert not np.array_equal(order, np.arange(1000))


def test_different_epoch_gives_different_order() -> None:
    orders = [epoch_order(1000, shuffle=True, seed=0, epoch=e).tolist() for e in range(5)]
    assert len({tuple(o) for o in orders}) == 5


def test_different_seed_gives_different_order() -> None:
    orders = [epoch_order(1000, shuffle=True, seed=s, epoch=0).tolist() for s in range(5)]
    assert len({tuple(o) for o in orders}) == 5


def test_seed_and_epoch_are_not_interchangeable() -> None:
    # (seed=1, epoch=2) must not collide with (seed=2, epoch=1) or (seed=3, epoch=0).
    a = epoch_order(500, shuffle=True, seed=1, epoch=2)
    b = epoch_order(500, shuffle=True, seed=2, epoch=1)
    c = epoch_order(500, shuffle=True, seed=3, epoch=0)
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_epoch_order_does_not_depend_on_global_numpy_state() -> None:
    np.random.seed(1)
    a = epoch_order(200, shuffle=True, seed=5, epoch=5)
    np.random.seed(2)
    np.random.random(10)
    b = epoch_order(200, shuffle=True, seed=5, epoch=5)
    assert np.array_equal(a, b)


# -- num_batches ----------------------------------------------------------------------------


NUM_BATCHES_CASES = [
    (0, 4, False, 0),
    (0, 4, True, 0),
    (1, 4, False, 1),
    (1, 4, True, 0),
    (8, 4, False, 2),
    (8, 4, True, 2),
    (9, 4, False, 3),
    (9, 4, True, 2),
    (37, 10, False, 4),
    (37, 10, True, 3),
    (37, 1, False, 37),
    (37, 37, True, 1),
    (37, 100, False, 1),
    (37, 100, True, 0),
]


def test_num_batches() -> None:
    for samples, batch, drop_last, expected in NUM_BATCHES_CASES:
        assert num_batches(samples, batch, drop_last) == expected, (samples, batch, drop_last)


# -- plan_epoch (single rank) -----------------------------------------------------------------


PLAN_SIZES = [(n, batch_size) for n in (1, 7, 37, 64) for batch_size in (1, 4, 8, 37, 100)]


def test_every_index_exactly_once_without_drop_last() -> None:
    for (n, batch_size), shuffle in itertools.product(PLAN_SIZES, (False, True)):
        plan = plan_epoch(n, batch_size=batch_size, shuffle=shuffle, seed=1, epoch=2, drop_last=False)
        seen = _all_indices(plan)
        assert sorted(seen) == list(range(n)), (n, batch_size)
        assert len(plan) == math.ceil(n / batch_size) == num_batches(n, batch_size, False)
        for k in range(len(plan) - 1):
            assert len(plan.batch(k)) == batch_size, (n, batch_size, k)
        assert 1 <= len(plan.batch(len(plan) - 1)) <= batch_size


def test_drop_last_drops_only_the_tail() -> None:
    for (n, batch_size), shuffle in itertools.product(PLAN_SIZES, (False, True)):
        kw = {"batch_size": batch_size, "shuffle": shuffle, "seed": 1, "epoch": 2}
        full = plan_epoch(n, drop_last=False, **kw)
        dropped = plan_epoch(n, drop_last=True, **kw)
        keep = (n // batch_size) * batch_size
        # Same order, only the partial tail removed.
        assert dropped.indices.tolist() == full.indices.tolist()[:keep], (n, batch_size)
        assert len(dropped) == n // batch_size == num_batches(n, batch_size, True)
        for k in range(len(dropped)):
            assert len(dropped.batch(k)) == batch_size, (n, batch_size, k)
        seen = _all_indices(dropped)
        assert len(seen) == len(set(seen)) == keep, (n, batch_size)


def test_drop_last_when_batch_size_divides_n_drops_nothing() -> None:
    a = plan_epoch(64, batch_size=8, shuffle=True, seed=0, epoch=0, drop_last=True)
    b = plan_epoch(64, batch_size=8, shuffle=True, seed=0, epoch=0, drop_last=False)
    assert np.array_equal(a.indices, b.indices)
    assert len(a) == len(b) == 8


def test_plan_follows_epoch_order() -> None:
    plan = plan_epoch(50, batch_size=7, shuffle=True, seed=9, epoch=3, drop_last=False)
    assert np.array_equal(plan.indices, epoch_order(50, shuffle=True, seed=9, epoch=3))
    assert plan.epoch == 3
    assert plan.batch_size == 7


def test_plan_is_deterministic_and_depends_on_epoch() -> None:
    kw = {"batch_size": 5, "shuffle": True, "seed": 0, "drop_last": False}
    a = plan_epoch(100, epoch=0, **kw)
    b = plan_epoch(100, epoch=0, **kw)
    c = plan_epoch(100, epoch=1, **kw)
    assert np.array_equal(a.indices, b.indices)
    assert not np.array_equal(a.indices, c.indices)


def test_plan_without_shuffle_is_sequential_batches() -> None:
    plan = plan_epoch(10, batch_size=4, shuffle=False, seed=0, epoch=0, drop_last=False)
    assert [plan.batch(k).tolist() for k in range(len(plan))] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_epoch_plan_batch_slices() -> None:
    plan = EpochPlan(epoch=0, indices=np.arange(10, 20, dtype=np.int64), batch_size=3)
    assert len(plan) == 4
    assert plan.batch(0).tolist() == [10, 11, 12]
    assert plan.batch(2).tolist() == [16, 17, 18]
    assert plan.batch(3).tolist() == [19]
    assert plan.batch(4).tolist() == []  # past the end: empty, never wraps
    assert plan.start == 0


def test_epoch_plan_is_frozen() -> None:
    plan = EpochPlan(epoch=0, indices=np.arange(4, dtype=np.int64), batch_size=2)
    with pytest.raises(AttributeError):
        plan.start = 1  # type: ignore[misc]


def test_plan_start_is_kept_and_does_not_change_the_batches() -> None:
    a = plan_epoch(37, batch_size=4, shuffle=True, seed=2, epoch=1, drop_last=False)
    b = plan_epoch(37, batch_size=4, shuffle=True, seed=2, epoch=1, drop_last=False, start=5)
    assert a.start == 0
    assert b.start == 5
    assert np.array_equal(a.indices, b.indices)
    assert len(a) == len(b)
    # Resuming at batch 5 delivers exactly the batches 5.. of the un-resumed epoch.
    rest_a = [i for k in range(5, len(a)) for i in a.batch(k).tolist()]
    rest_b = [i for k in range(b.start, len(b)) for i in b.batch(k).tolist()]
    assert rest_a == rest_b
    assert len(rest_b) == 37 - 5 * 4


# -- shard -----------------------------------------------------------------------------------


def test_shard_with_pad_covers_everything_in_equal_shards() -> None:
    for world_size in WORLD_SIZES:
        for n in (1, 2, 7, 10, 37):
            _check_padded_shards(n, world_size)


def _check_padded_shards(n: int, world_size: int) -> None:
    order = epoch_order(n, shuffle=True, seed=0, epoch=0)
    shards = [shard(order, r, world_size) for r in range(world_size)]
    per_rank = math.ceil(n / world_size)
    assert all(len(s) == per_rank for s in shards), (n, world_size)
    union = np.concatenate(shards)
    assert set(union.tolist()) == set(range(n))
    padding = per_rank * world_size - n
    # Every sample once, plus the padding: the order repeated from its start.
    extras = Counter(union.tolist()) - Counter(order.tolist())
    assert extras == Counter(np.resize(order, padding).tolist()), (n, world_size)


def test_shard_without_pad_is_disjoint_and_equal() -> None:
    for world_size in WORLD_SIZES:
        for n in (2, 7, 10, 37):
            _check_unpadded_shards(n, world_size)


def _check_unpadded_shards(n: int, world_size: int) -> None:
    order = epoch_order(n, shuffle=True, seed=1, epoch=0)
    shards = [shard(order, r, world_size, pad=False) for r in range(world_size)]
    per_rank = n // world_size
    assert all(len(s) == per_rank for s in shards), (n, world_size)
    union = np.concatenate(shards).tolist()
    assert len(union) == len(set(union)) == per_rank * world_size
    # Only the tail that does not fill a round is dropped.
    assert set(union) == set(order[: per_rank * world_size].tolist())


def test_shard_is_strided_like_distributed_sampler() -> None:
    order = np.arange(100, 137, dtype=np.int64)
    for world_size in (2, 3, 4, 5):
        for r in range(world_size):
            s = shard(order, r, world_size, pad=False)
            assert s.tolist() == order[: (37 // world_size) * world_size][r::world_size].tolist()


def test_shard_pad_repeats_from_the_start() -> None:
    n = 7
    order = np.array([60, 50, 40, 30, 20, 10, 0], dtype=np.int64)
    for world_size in (2, 3, 4, 5):
        total = math.ceil(n / world_size) * world_size
        padded = order.tolist() + order.tolist()[: total - n]
        for r in range(world_size):
            assert shard(order, r, world_size).tolist() == padded[r::world_size], (world_size, r)


def test_shard_pad_concrete_example() -> None:
    order = np.arange(10, dtype=np.int64)
    # 10 over 4 ranks: padded to 12 with [0, 1].
    assert shard(order, 0, 4).tolist() == [0, 4, 8]
    assert shard(order, 1, 4).tolist() == [1, 5, 9]
    assert shard(order, 2, 4).tolist() == [2, 6, 0]
    assert shard(order, 3, 4).tolist() == [3, 7, 1]
    assert shard(order, 2, 4, pad=False).tolist() == [2, 6]


def test_shard_pad_when_world_size_exceeds_n() -> None:
    # 2 samples, 5 ranks: padding needs the order repeated more than once.
    order = np.array([8, 3], dtype=np.int64)
    shards = [shard(order, r, 5).tolist() for r in range(5)]
    assert shards == [[8], [3], [8], [3], [8]]
    assert [shard(order, r, 5, pad=False).tolist() for r in range(5)] == [[]] * 5


def test_shard_world_size_one_is_identity() -> None:
    order = epoch_order(13, shuffle=True, seed=0, epoch=0)
    assert np.array_equal(shard(order, 0, 1), order)
    assert np.array_equal(shard(order, 0, 1, pad=False), order)


def test_plan_epoch_ranks_get_equal_batch_counts() -> None:
    for world_size in WORLD_SIZES:
        for drop_last in (False, True):
            _check_rank_plans(world_size, drop_last)


def _check_rank_plans(world_size: int, drop_last: bool) -> None:
    n, bs = 37, 4
    plans = [
        plan_epoch(
            n,
            batch_size=bs,
            shuffle=True,
            seed=0,
            epoch=0,
            drop_last=drop_last,
            rank=r,
            world_size=world_size,
        )
        for r in range(world_size)
    ]
    per_rank = math.ceil(n / world_size)
    assert {len(p) for p in plans} == {num_batches(per_rank, bs, drop_last)}
    if not drop_last:
        covered = {i for p in plans for i in p.indices.tolist()}
        assert covered == set(range(n))
    else:
        for p in plans:
            assert len(p.indices) == (per_rank // bs) * bs
    # Each rank's plan is exactly its shard of the epoch order (then truncated).
    order = epoch_order(n, shuffle=True, seed=0, epoch=0)
    for r, p in enumerate(plans):
        s = shard(order, r, world_size)
        assert p.indices.tolist() == s.tolist()[: len(p.indices)]
