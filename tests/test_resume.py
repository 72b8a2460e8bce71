"""Resumption and rank sharding as pure logic: state dicts, their checks, re-sharding plans
(no event loop, no processes). The loader-level cases, through both front-ends, are in
test_resume_frontends.py."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

from aioloader.plan.resume import Progress, ResumePoint, check_state, make_state, plan_for, plan_len
from aioloader.plan.sampler import epoch_order, num_batches, plan_epoch, plan_remainder, shard
from aioloader.plan.settings import Sampling, resolve_rank


def sampling(**kw: Any) -> Sampling:
    """The plan's settings of a small loader (batches of 4, seed 3), ``kw`` overriding them."""
    return Sampling(**{"batch_size": 4, "seed": 3, **kw})


def test_progress_tracks_the_received_prefix_and_out_of_order_batches() -> None:
    p = Progress(epoch=2, total=6)
    p.mark(0, 4)
    p.mark(2, 4)
    p.mark(3, 4)
    assert (p.next, p.after, p.samples) == (1, {2, 3}, 12)
    p.mark(1, 3)
    assert (p.next, p.after, p.samples) == (4, set(), 15)
    p.finish()
    assert (p.next, p.after) == (6, set())


def test_state_is_small_json_and_round_trips() -> None:
    cfg = sampling(rank=1, world_size=2)
    p = Progress(epoch=5, total=10)
    for k in (0, 1, 3):
        p.mark(k, 4)
    state = make_state(cfg, 37, p, {"samples": 12, "batches": 3, "failures_by_reason": {"DecodeError": 1}})
    text = json.dumps(state)
    assert len(text) < 1000
    again = json.loads(text)
    point = check_state(again, cfg, 37)
    assert point == ResumePoint(epoch=5, start=2, done=frozenset({3}), samples=12, base=None)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seed": 4}, "seed"),
        ({"batch_size": 5}, "batch_size"),
        ({"shuffle": False}, "shuffle"),
        ({"drop_last": True}, "drop_last"),
        ({"pad_shards": False}, "pad_shards"),
    ],
)
def test_a_state_for_other_batches_is_refused(change: dict[str, object], field: str) -> None:
    state = make_state(sampling(), 37, Progress(0, 10), {})
    with pytest.raises(ValueError, match=f"taken with {field}="):
        check_state(state, sampling(**change), 37)


def test_a_state_for_another_dataset_length_is_refused() -> None:
    state = make_state(sampling(), 37, Progress(0, 10), {})
    with pytest.raises(ValueError, match="dataset_len=37, this loader has dataset_len=38"):
        check_state(state, sampling(), 38)


def test_not_a_state_and_a_future_version_are_refused() -> None:
    with pytest.raises(ValueError, match="not an aioloader state dict"):
        check_state({"epoch": 1}, sampling(), 37)
    state = make_state(sampling(), 37, Progress(0, 10), {})
    state["version"] = 99
    with pytest.raises(ValueError, match="version 99 is not supported"):
        check_state(state, sampling(), 37)


def test_world_size_change_needs_allow_reshard_and_rank_must_match() -> None:
    state = make_state(sampling(rank=0, world_size=2), 37, Progress(0, 5), {})
    with pytest.raises(ValueError, match="world_size=2, this loader has world_size=3; pass allow_reshard"):
        check_state(state, sampling(rank=0, world_size=3), 37)
    point = check_state(state, sampling(rank=2, world_size=3), 37, allow_reshard=True)
    assert point.base == (2, 0)
    with pytest.raises(ValueError, match="the state is rank 0's, this loader is rank 1"):
        check_state(state, sampling(rank=1, world_size=2), 37)


def test_reshard_refuses_out_of_order_states() -> None:
    p = Progress(0, 5)
    p.mark(1, 4)
    state = make_state(sampling(world_size=2), 37, p, {})
    with pytest.raises(ValueError, match="out of order"):
        check_state(state, sampling(world_size=3), 37, allow_reshard=True)


def test_plan_for_resumes_only_the_states_epoch() -> None:
    cfg = sampling()
    point = ResumePoint(epoch=1, start=3, done=frozenset({5}))
    resumed = plan_for(cfg, 37, 1, point)
    assert resumed.pending() == [3, 4, 6, 7, 8, 9]
    assert plan_for(cfg, 37, 2, point).pending() == list(range(10))


def _remainder_by_sets(
    n: int, bs: int, shuffle: bool, drop_last: bool, pad: bool, old_ws: int, consumed: int, rank: int, ws: int
) -> list[int]:
    """The re-sharded remainder as ``plan_remainder`` first made it (commit 115aeaf): every old
    rank's plan made, the samples they delivered and planned gathered as sets, the rest of the
    order filtered."""
    common = {"batch_size": bs, "shuffle": shuffle, "seed": 5, "epoch": 3, "drop_last": drop_last}
    olds = [plan_epoch(n, rank=r, world_size=old_ws, pad=pad, **common).indices for r in range(old_ws)]  # type: ignore[arg-type]
    delivered = {i for old in olds for i in old[: consumed * bs].tolist()}
    planned = np.unique(np.concatenate(olds)) if olds else np.zeros(0, np.int64)
    order = epoch_order(n, shuffle=shuffle, seed=5, epoch=3)
    order = order[np.isin(order, planned)]
    rest = order[~np.isin(order, list(delivered))] if delivered else order
    if len(rest) == 0:
        return []
    indices = shard(rest, rank, ws, pad=pad)
    keep = num_batches(len(indices), bs, drop_last) * bs
    return [int(i) for i in indices[:keep]]


@pytest.mark.parametrize(("n", "bs"), [(1, 1), (2, 3), (7, 2), (41, 3), (64, 8)])
def test_the_remainder_is_a_slice_of_one_order_as_sets_of_every_old_rank_gave(n: int, bs: int) -> None:
    """``plan_remainder`` makes the epoch's order once and slices it (``remainder_span``): the
    same samples, in the same order, as gathering what every old rank planned and delivered."""
    for shuffle, drop_last, pad, old_ws, ws in itertools.product(
        (True, False), (False, True), (True, False), (1, 2, 3, 5), (1, 2, 3)
    ):
        common = {
            "batch_size": bs,
            "shuffle": shuffle,
            "seed": 5,
            "epoch": 3,
            "drop_last": drop_last,
            "pad": pad,
        }
        whole = len(plan_epoch(n, world_size=old_ws, **common))  # type: ignore[arg-type]
        for consumed, rank in itertools.product(range(whole + 2), range(ws)):
            got = plan_remainder(
                n, old_world_size=old_ws, consumed_batches=consumed, rank=rank, world_size=ws, **common
            )  # type: ignore[arg-type]
            want = _remainder_by_sets(n, bs, shuffle, drop_last, pad, old_ws, consumed, rank, ws)
            assert got.indices.tolist() == want, (shuffle, drop_last, pad, old_ws, consumed, rank, ws)


@pytest.mark.parametrize("n", [1, 5, 37, 40])
def test_plan_len_is_the_plans_length_without_making_an_order(n: int) -> None:
    """The trainer counts an epoch's batches with ``plan_len``: the length of the plan the
    runtime makes, for a whole epoch, a resumed one, and a re-sharded remainder."""
    for bs, drop_last, pad, ws, old_ws in itertools.product(
        (1, 4, 7), (False, True), (True, False), (1, 2, 3), (1, 2, 4)
    ):
        cfg = sampling(batch_size=bs, drop_last=drop_last, pad_shards=pad, world_size=ws, rank=ws - 1)
        points: list[ResumePoint | None] = [None, ResumePoint(epoch=2, start=1, done=frozenset({3}))]
        points += [ResumePoint(epoch=2, base=(old_ws, consumed)) for consumed in range(n // bs + 2)]
        for point in points:
            for epoch in (1, 2):
                assert plan_len(cfg, n, epoch, point) == len(plan_for(cfg, n, epoch, point)), (
                    bs,
                    point,
                    epoch,
                )


@pytest.mark.parametrize("old_ws", [1, 2, 3, 4])
@pytest.mark.parametrize("new_ws", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_reshard_covers_every_remaining_sample_once(old_ws: int, new_ws: int, drop_last: bool) -> None:
    n, bs = 41, 3
    common = {"batch_size": bs, "shuffle": True, "seed": 7, "epoch": 2, "drop_last": drop_last}
    old = [plan_epoch(n, rank=r, world_size=old_ws, **common) for r in range(old_ws)]  # type: ignore[arg-type]
    for consumed in (0, 2, len(old[0])):
        seen = [i for p in old for i in p.indices[: consumed * bs].tolist()]
        planned = {i for p in old for i in p.indices.tolist()}  # what the old epoch would deliver
        remaining = planned - set(seen)
        new = [
            plan_remainder(
                n, old_world_size=old_ws, consumed_batches=consumed, rank=r, world_size=new_ws, **common
            )  # type: ignore[arg-type]
            for r in range(new_ws)
        ]
        got = Counter(i for p in new for i in p.indices.tolist())
        assert len({len(p) for p in new}) == 1, "every new rank gets the same number of batches"
        assert not set(got) & set(seen), "nothing received before is delivered again"
        if drop_last:
            assert set(got) <= remaining
        else:
            assert set(got) == remaining, "every remaining sample is delivered"
            assert sum(got.values()) - len(got) < new_ws, "repeats are only the padding of the last round"


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("pad", [True, False])
def test_rank_shards_are_disjoint_cover_and_equal(world_size: int, pad: bool) -> None:
    n = 37
    plans = [
        plan_epoch(
            n,
            batch_size=4,
            shuffle=True,
            seed=0,
            epoch=1,
            drop_last=False,
            rank=r,
            world_size=world_size,
            pad=pad,
        )
        for r in range(world_size)
    ]
    counts = Counter(i for p in plans for i in p.indices.tolist())
    assert len({len(p) for p in plans}) == 1 and len({len(p.indices) for p in plans}) == 1
    if pad:
        assert set(counts) == set(range(n))
        assert sum(counts.values()) - n < world_size
    else:
        assert all(c == 1 for c in counts.values())
        assert len(counts) == (n // world_size) * world_size


def test_rank_and_world_size_are_validated_and_default_to_one_process() -> None:
    assert resolve_rank(None, None) == (0, 1)
    assert resolve_rank(2, 3) == (2, 3)
    with pytest.raises(ValueError, match="rank=3 must be below world_size=3"):
        resolve_rank(3, 3)
    with pytest.raises(ValueError, match="world_size=0 must be a positive integer"):
        resolve_rank(0, 0)
    with pytest.raises(ValueError, match="rank=-1 must be a non-negative integer"):
        resolve_rank(-1, 2)


def test_repacker_cuts_survivors_into_full_batches_and_tracks_done_batches() -> None:
    import torch

    from aioloader.base.items import Batch
    from aioloader.plan.repack import Repacker

    def batch(k: int, rows: list[int]) -> Batch:
        return Batch(index=k, value=(torch.tensor(rows), [f"s{r}" for r in rows]), size=len(rows))

    r = Repacker(4)
    full = batch(0, [0, 1, 2, 3])
    assert r.push(full) == [full]  # nothing carried: passes through untouched
    assert r.push(batch(1, [4, 6, 7])) == []  # lost sample 5: carried
    assert r.push(batch(2, [])) == []  # lost everything, while rows are carried
    out = r.push(batch(3, [12, 13, 14, 15]))
    assert len(out) == 1 and out[0].size == 4
    assert out[0].value[0].tolist() == [4, 6, 7, 12] and out[0].value[1] == ["s4", "s6", "s7", "s12"]
    assert out[0].done == (1, 2)  # batch 3 still has rows carried
    out = r.push(batch(4, [16, 17, 18]))
    assert [b.value[0].tolist() for b in out] == [[13, 14, 15, 16]] and out[0].done == (3,)
    assert r.push(batch(5, [20])) == []  # 3 rows carried
    out = r.push(batch(6, [24]))
    assert [b.value[0].tolist() for b in out] == [[17, 18, 20, 24]] and out[0].done == (4, 5, 6)


# -- Epochs: which epoch the next iteration runs (plan/epochs.py) ------------------------------


def test_epochs_count_up_unless_set() -> None:
    from aioloader.plan.epochs import Epochs

    epochs = Epochs(sampling(), 20)  # 5 batches of 4
    seen = []
    for _ in range(3):
        progress, point = epochs.begin()
        seen.append((epochs.epoch, progress.epoch, progress.total, point))
    assert seen == [(0, 0, 5, None), (1, 1, 5, None), (2, 2, 5, None)]
    epochs.set(7)
    epochs.set(5)  # the last word counts
    assert epochs.epoch == 5 and epochs.begin()[0].epoch == 5
    assert epochs.begin()[0].epoch == 6
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(ValueError, match=f"epoch={bad!r} must be a non-negative integer"):
            epochs.set(bad)  # type: ignore[arg-type]
    assert epochs.epoch == 6  # a refused value changes nothing


def test_epochs_progress_for_a_state_dict() -> None:
    from aioloader.plan.epochs import Epochs

    epochs = Epochs(sampling(), 20)
    before = epochs.progress(5)
    assert (before.epoch, before.total, before.next) == (0, 5, 0)
    running, _ = epochs.begin()
    running.mark(0, 4)
    assert epochs.progress(5) is running  # mid-epoch: the iteration's own progress
    epochs.set(3)  # chosen for the next iteration: a state taken now starts epoch 3 afresh
    chosen = epochs.progress(5)
    assert (chosen.epoch, chosen.next) == (3, 0)


def test_epochs_resume_once_then_start_afresh() -> None:
    from aioloader.plan.epochs import Epochs

    cfg = sampling()
    epochs = Epochs(cfg, 20)
    point = ResumePoint(epoch=4, start=2, done=frozenset({3}), samples=12)
    epochs.resume(point)
    assert epochs.epoch == 4 and epochs.progress(5).next == 2  # a state dict right away agrees
    progress, got = epochs.begin()
    assert got == point and (progress.epoch, progress.total) == (4, len(plan_for(cfg, 20, 4, point)))
    assert (progress.epoch, progress.next, progress.after) == (4, 2, {3})
    progress, got = epochs.begin()
    assert got is None and progress.epoch == 5 and progress.total == 5
    epochs.resume(point)
    epochs.set(9)  # another epoch chosen: the point waits for epoch 4, never applies to 9
    assert epochs.begin()[1] is None
