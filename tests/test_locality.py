"""The shard-local order (``Loader(locality=Locality(...))``): pure, without a loop, and
through a real loader (both runtimes' plans are the same function)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from aioloader import FileDataset, Loader, Locality
from aioloader.plan.locality import block, locality_order
from aioloader.plan.resume import Progress, ResumePoint, check_state, make_state, plan_for, plan_len
from aioloader.plan.settings import Sampling

#: 7 shards of uneven sizes: 61 samples.
SIZES = [10, 3, 12, 9, 1, 15, 11]
RUNS = np.cumsum([0, *SIZES[:-1]]).astype(np.int64)
N = sum(SIZES)


def shard_of(i: int) -> int:
    return int(np.searchsorted(RUNS, i, side="right") - 1)


def test_the_order_is_a_permutation_that_depends_only_on_seed_and_epoch() -> None:
    a = locality_order(RUNS, N, seed=3, epoch=1, buffer=8)
    assert sorted(a.tolist()) == list(range(N))
    assert np.array_equal(a, locality_order(RUNS, N, seed=3, epoch=1, buffer=8))
    assert not np.array_equal(a, locality_order(RUNS, N, seed=3, epoch=2, buffer=8))


def test_without_a_buffer_each_shard_is_read_front_to_back_and_whole() -> None:
    orders = set()
    for epoch in range(6):
        order = locality_order(RUNS, N, seed=0, epoch=epoch, buffer=0).tolist()
        shards = [shard_of(i) for i in order]
        runs = [s for k, s in enumerate(shards) if k == 0 or s != shards[k - 1]]
        assert sorted(runs) == list(range(len(SIZES)))  # each shard one run
        for s in runs:
            mine = [i for i in order if shard_of(i) == s]
            assert mine == list(range(RUNS[s], RUNS[s] + SIZES[s]))  # front to back
        orders.add(tuple(runs))
    assert len(orders) > 1  # the shard order is shuffled


def test_the_buffer_moves_a_sample_fewer_than_buffer_places_and_mixes_within_it() -> None:
    buffer = 8
    stream = locality_order(RUNS, N, seed=5, epoch=0, buffer=0)
    mixed = locality_order(RUNS, N, seed=5, epoch=0, buffer=buffer)
    where = {int(i): k for k, i in enumerate(stream)}
    moves = [abs(k - where[int(i)]) for k, i in enumerate(mixed)]
    assert max(moves) < buffer and sum(moves) > 0


def test_ranks_take_contiguous_equal_blocks() -> None:
    order = np.arange(N, dtype=np.int64)
    parts = [block(order, r, 4, pad=True) for r in range(4)]
    assert {len(p) for p in parts} == {16}
    assert np.concatenate(parts)[:N].tolist() == list(range(N))  # padding repeats the start
    dropped = [block(order, r, 4, pad=False) for r in range(4)]
    assert np.concatenate(dropped).tolist() == list(range(60))


def sampling(**kw: Any) -> Sampling:
    return Sampling(**{"batch_size": 4, "seed": 1, "locality": Locality(buffer=6), **kw})


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_resumed_epoch_is_the_rest_of_the_same_plan(world_size: int) -> None:
    for rank in range(world_size):
        s = sampling(rank=rank, world_size=world_size)
        whole = plan_for(s, N, 2, None, RUNS)
        point = ResumePoint(2, 2, frozenset(), 8)
        resumed = plan_for(s, N, 2, point, RUNS)
        assert [resumed.batch(k).tolist() for k in resumed.pending()] == [
            whole.batch(k).tolist() for k in range(2, len(whole))
        ]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2), (4, 1)])
def test_a_reshard_gives_each_undelivered_sample_once(old: int, new: int) -> None:
    consumed = 2
    delivered = set()
    for r in range(old):
        plan = plan_for(sampling(rank=r, world_size=old, pad_shards=False), N, 0, None, RUNS)
        delivered |= {int(i) for k in range(consumed) for i in plan.batch(k)}
    rest: list[int] = []
    for r in range(new):
        s = sampling(rank=r, world_size=new, pad_shards=False)
        point = ResumePoint(0, 0, frozenset(), 0, (old, consumed))
        plan = plan_for(s, N, 0, point, RUNS)
        assert len(plan) == plan_len(s, N, 0, point)
        rest += plan.indices.tolist()
    assert not delivered & set(rest) and len(rest) == len(set(rest))
    planned = {
        int(i)
        for r in range(old)
        for i in plan_for(sampling(rank=r, world_size=old, pad_shards=False), N, 0, None, RUNS).indices
    }
    assert (
        len(set(rest)) >= len(planned - delivered) - new * 4
    )  # the new ranks' equal shards drop at most a round


def test_the_setting_is_checked_and_recorded() -> None:
    with pytest.raises(ValueError, match="needs shuffle=True"):
        Sampling(shuffle=False, locality=Locality())
    with pytest.raises(TypeError, match=r"must be an aioloader\.Locality or None"):
        Sampling(locality=100)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Locality\(buffer\)=-1 must be a positive integer"):
        Locality(buffer=-1)
    state = make_state(sampling(), N, Progress(0, 16), {})
    assert state["locality"] == {"buffer": 6}
    with pytest.raises(ValueError, match="locality"):
        check_state(state, Sampling(batch_size=4, seed=1), N)
    assert check_state(state, sampling(), N).start == 0


@pytest.mark.parametrize("loader_process", [False, True])
def test_a_loader_reads_shards_in_blocks_and_resumes_exactly(loader_process: bool) -> None:
    """Entries ``(shard, offset, 1)`` in runs (a tar's samples); a custom read answers each
    with its shard and offset. Two ranks read disjoint blocks, each a few shards at a time,
    and a resumed rank delivers the rest of its epoch."""
    entries = [(f"shard{s}.tar", k, 1) for s, size in enumerate(SIZES) for k in range(size)]
    dataset = FileDataset(entries)

    def read(path: str) -> bytes:  # byte k of shard s: 16 * s + k
        s = int(path.removeprefix("shard").removesuffix(".tar"))
        return bytes(range(16 * s, 16 * s + 16))

    def make(rank: int) -> Loader:
        return Loader(
            dataset,
            batch_size=4,
            decode=None,
            collate=list,
            read=read,
            rank=rank,
            world_size=2,
            locality=Locality(buffer=4),
            loader_process=loader_process,
        )

    with make(0) as a, make(1) as b:
        first, second = list(a), list(b)
    assert len(first) == len(second) == 8
    with make(1) as again:
        it = iter(again)
        for _ in range(3):
            next(it)
        state = again.state_dict()
    with make(1) as resumed:
        resumed.load_state_dict(state)
        assert list(resumed) == second[3:]
    # Each rank's batches come from few shards: far fewer switches than a uniform order's.
    shards = [x[0] // 16 for batch in first for x in batch]
    switches = sum(1 for x, y in itertools.pairwise(shards) if x != y)
    assert switches < len(shards) // 2
    every = {16 * s + k for s, size in enumerate(SIZES) for k in range(size)}
    assert {x[0] for batch in first + second for x in batch} == every  # one sample repeated: padding
