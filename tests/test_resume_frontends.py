"""Mid-epoch resume and rank sharding on real files and workers, through both front-ends
(the ``frontend`` fixture: ``[sync]`` is ``for``/``with``, ``[async]`` is ``async
for``/``async with``). The pure state-dict logic is in test_resume.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from frontends import Driver
from helpers import FailOn, decode_number, finish_script, flatten, start_script

from aioloader import Loader

Batches = list[list[int]]


def batches(frontend: Driver, loader: Loader, epoch: int, limit: int | None = None) -> Batches:
    """Batches of ``epoch`` as lists of sample numbers; stop after ``limit`` batches
    (mid-epoch: whatever is prefetched then is not consumed)."""
    loader.set_epoch(epoch)
    got = frontend.epoch(loader) if limit is None else frontend.take(loader, limit)
    return [flatten([b]) for b in got]


def make(paths: list[str], **kw: Any) -> Loader:
    args: dict[str, Any] = {"batch_size": 4, "decode": decode_number, "num_workers": 1, "prefetch": 1}
    args.update(kw)
    return Loader(paths, **args)


@pytest.mark.parametrize(
    ("stop_at", "shuffle", "drop_last"),
    [
        (0, True, False),  # before the first batch
        (4, True, True),  # in the middle
        (4, False, False),
        (8, False, True),  # at the last batch (drop_last: 9 batches)
        (9, True, False),  # at the last batch (10 batches)
        ("end", True, False),  # after the last batch: across the epoch boundary
    ],
)
def test_resume_equals_an_uninterrupted_run(
    frontend: Driver, numbered: list[str], stop_at: int | str, shuffle: bool, drop_last: bool
) -> None:
    kw = {"shuffle": shuffle, "drop_last": drop_last}
    with frontend.opened(make(numbered, **kw)) as loader:
        reference = [batches(frontend, loader, 0), batches(frontend, loader, 1)]
    with frontend.opened(make(numbered, **kw, num_workers=1, prefetch=3)) as first:
        limit = None if stop_at == "end" else int(stop_at)
        before = batches(frontend, first, 0, limit)
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint file would
    with frontend.opened(make(numbered, **kw, num_workers=3, prefetch=1, io_concurrency=2)) as second:
        second.load_state_dict(state)
        after = [batches(frontend, second, 0), batches(frontend, second, 1)]
    assert before + after[0] == reference[0]
    assert after[1] == reference[1]
    if stop_at == "end":
        assert after[0] == []


def test_resume_without_set_epoch_continues_the_states_epoch(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(make(numbered)) as loader:
        reference = flatten(frontend.epoch(loader))
    with frontend.opened(make(numbered)) as first:
        it = frontend.iter(first)
        head = [flatten([frontend.next(it)]) for _ in range(3)]
        state = first.state_dict()
    with frontend.opened(make(numbered, num_workers=2)) as second:
        second.load_state_dict(state)
        assert len(second) == 10  # batches per epoch; the resumed epoch delivers the rest
        rest = flatten(frontend.epoch(second))
    assert [i for b in head for i in b] + rest == reference


def test_resume_after_unordered_delivery_loses_and_repeats_nothing(
    frontend: Driver, numbered: list[str]
) -> None:
    with frontend.opened(make(numbered, ordered=False, num_workers=2, prefetch=3)) as first:
        before = batches(frontend, first, 0, 5)
        state = first.state_dict()
    with frontend.opened(make(numbered, num_workers=2)) as second:
        second.load_state_dict(state)
        after = batches(frontend, second, 0)
    got = sorted(i for b in before + after for i in b)
    assert got == list(range(37))


def test_state_carries_failure_counters(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(make(numbered, shuffle=False, decode=FailOn({2, 30}), on_error="skip")) as first:
        batches(frontend, first, 0, 2)
        state = first.state_dict()
    assert state["stats"]["failures_by_reason"] == {"DecodeError": 1}
    with frontend.opened(make(numbered, shuffle=False, decode=FailOn({2, 30}), on_error="skip")) as second:
        second.load_state_dict(state)
        rest = batches(frontend, second, 0)
        stats = second.stats
    assert stats.failures_by_reason == {"DecodeError": 2}
    assert stats.samples == 7 + sum(len(b) for b in rest) == 35


def test_a_different_dataset_or_world_size_is_refused(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(make(numbered)) as first:
        batches(frontend, first, 0, 2)
        state = first.state_dict()
    with frontend.opened(make(numbered[:-1])) as other, pytest.raises(ValueError, match="dataset_len=37"):
        other.load_state_dict(state)
    with (
        frontend.opened(make(numbered, rank=0, world_size=2)) as other,
        pytest.raises(ValueError, match="allow_reshard"),
    ):
        other.load_state_dict(state)


def test_each_rank_resumes_its_own_shard(frontend: Driver, numbered: list[str]) -> None:
    """Two ranks stop after 2 and 3 batches; each resumes from its own state and delivers
    exactly the rest of its shard, so together they deliver what an uninterrupted run does.
    A rank's state is refused by another rank."""
    whole: list[Batches] = []
    for r in range(2):
        with frontend.opened(make(numbered, rank=r, world_size=2)) as loader:
            whole.append(batches(frontend, loader, 0))
    assert len(whole[0]) == len(whole[1]) == 5  # 37 samples padded to 2 x 19: 5 batches each
    before: list[Batches] = []
    states = []
    for r, stop in ((0, 2), (1, 3)):
        with frontend.opened(make(numbered, rank=r, world_size=2, prefetch=3)) as first:
            before.append(batches(frontend, first, 0, stop))
            states.append(json.loads(json.dumps(first.state_dict())))
    after: list[Batches] = []
    for r in range(2):
        with frontend.opened(make(numbered, rank=r, world_size=2, num_workers=2)) as second:
            second.load_state_dict(states[r])
            after.append(batches(frontend, second, 0))
    assert [len(b) for b in before] == [2, 3]
    assert before[0] + after[0] == whole[0]
    assert before[1] + after[1] == whole[1]
    together = sorted(i for r in range(2) for b in before[r] + after[r] for i in b)
    assert together == sorted(i for rank in whole for b in rank for i in b)
    assert set(together) == set(range(37)) and len(together) == 38  # one sample repeated to pad
    with (
        frontend.opened(make(numbered, rank=0, world_size=2)) as other,
        pytest.raises(ValueError, match="the state is rank 1's, this loader is rank 0"),
    ):
        other.load_state_dict(states[1])


def test_reshard_two_ranks_to_three(frontend: Driver, numbered: list[str]) -> None:
    """Two ranks stop after 2 batches each; three ranks finish the epoch: every sample is
    delivered, nothing received before is repeated, every new rank has as many batches.
    Either old rank's state says the same (lockstep ranks): new ranks 0 and 2 load rank 0's,
    new rank 1 loads rank 1's."""
    seen: list[int] = []
    states = []
    for r in range(2):
        with frontend.opened(make(numbered, rank=r, world_size=2)) as old:
            seen += [i for b in batches(frontend, old, 0, 2) for i in b]
            states.append(old.state_dict())
    rest: list[Batches] = []
    for r in range(3):
        with frontend.opened(make(numbered, rank=r, world_size=3)) as new:
            new.load_state_dict(states[r % 2], allow_reshard=True)
            rest.append(batches(frontend, new, 0))
    later = [i for rank in rest for b in rank for i in b]
    assert set(seen) | set(later) == set(range(37))
    assert not set(seen) & set(later)
    assert len({len(rank) for rank in rest}) == 1


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_ranks_see_disjoint_shards_with_equal_batch_counts(
    frontend: Driver, numbered: list[str], world_size: int
) -> None:
    shards = []
    for r in range(world_size):
        with frontend.opened(make(numbered, rank=r, world_size=world_size, pad_shards=False)) as loader:
            got = batches(frontend, loader, 1)
            assert len(got) == len(loader)
            shards.append(got)
    flat = [i for s in shards for b in s for i in b]
    assert len(flat) == len(set(flat)) == (37 // world_size) * world_size
    assert len({len(s) for s in shards}) == 1


# -- where each epoch's plan is made -----------------------------------------------------------

#: A trainer that counts every epoch order made (``sampler.epoch_order``, wrapped before its
#: first loader, so the zygote and the loader processes it forks count too): a line
#: ``<pid> <epoch>`` each, appended to ``argv[2]`` after the trainer's ``mark <phase>`` (each
#: phase takes a batch of each of its loaders, so their plans are made before the next mark).
COUNTED = """
import json, os, sys

import aioloader.plan.sampler as sampler
from aioloader import Loader

paths, log = json.loads(sys.argv[1]), sys.argv[2]
made = sampler.epoch_order


def write(line):
    with open(log, "a") as f:
        f.write(line + "\\n")


def counted(n, *, shuffle, seed, epoch):
    write(f"{os.getpid()} {epoch}")
    return made(n, shuffle=shuffle, seed=seed, epoch=epoch)


sampler.epoch_order = counted
where = {}
for runtime in ("process", "thread"):  # a loader process first: no loader threads yet
    kw = {"batch_size": 4, "decode": None, "num_workers": 1, "loader_process": runtime == "process"}
    write(f"mark {runtime}/epochs")
    with Loader(paths, **kw) as loader:
        for epoch in range(3):  # 0, then 1 and 2 without set_epoch
            assert sum(1 for _ in loader) == len(loader)
        loader.set_epoch(5)
        for k, _ in enumerate(loader):
            if k == 1:
                break
        state = loader.state_dict()
        len(loader)
        where[runtime] = loader.runtime
    write(f"mark {runtime}/resume")
    with Loader(paths, **kw) as loader:
        loader.load_state_dict(state)
        loader.state_dict()
        assert sum(1 for _ in loader) == len(loader) - 2  # the rest of epoch 5
    write(f"mark {runtime}/reshard")
    with Loader(paths, **kw, rank=0, world_size=2) as loader:
        loader.set_epoch(7)
        next(iter(loader))
        state = loader.state_dict()
    with Loader(paths, **kw, rank=1, world_size=3) as loader:
        loader.load_state_dict(state, allow_reshard=True)
        list(loader)
print(json.dumps({"trainer": os.getpid(), "where": where}))
"""


def test_each_epochs_plan_is_made_once_where_its_batches_are(tmp_path: Path, numbered: list[str]) -> None:
    """An epoch's order is made once, by the runtime that produces its batches: in the
    trainer's process with ``loader_process=False``, in the loader process by default (the
    trainer never makes one); after ``load_state_dict`` too, re-sharded or not. A
    ``state_dict``, ``len`` and the progress of an epoch make none."""
    log = tmp_path / "orders.log"
    script = tmp_path / "counted.py"
    # One OS thread (one OpenBLAS thread): its zygote is a fork of it, so the loader process
    # has the script's counting epoch_order (a zygote started clean would not).
    env = {"OPENBLAS_NUM_THREADS": "1"}
    proc = start_script(script, COUNTED, args=[str(script), json.dumps(numbered), str(log)], env=env)
    out, err = finish_script(proc, timeout=120)
    assert proc.returncode == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result["where"] == {"process": "process", "thread": "thread"}
    made: dict[str, list[tuple[int, int]]] = {}
    for line in log.read_text().splitlines():
        first, second = line.split()
        if first == "mark":
            phase = made.setdefault(second, [])
        else:
            phase.append((int(first), int(second)))
    trainer = result["trainer"]
    for runtime in ("process", "thread"):
        epochs = made[f"{runtime}/epochs"]
        resumed = made[f"{runtime}/resume"] + made[f"{runtime}/reshard"]
        assert [e for _, e in epochs] == [0, 1, 2, 5] and [e for _, e in resumed] == [5, 7, 7]
        pids = {pid for pid, _ in epochs + resumed}
        if runtime == "thread":
            assert pids == {trainer}
        else:
            assert trainer not in pids and len(pids) == 4  # one loader process per loader
