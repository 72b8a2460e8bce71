"""Mid-epoch resumption: what ``Loader.state_dict()`` holds, how a state is checked, and the
epoch plan it resumes to. Pure: no I/O, no event loop (``tests/test_resume.py``).

Position is counted in *batches the trainer received*, never in work started: batches
still being read, decoded or waiting in the prefetch queue when the state is taken are not
consumed, so they are produced again after a resume. A batch's samples depend only on
``(seed, epoch, rank, world_size, batch index)``, so the batches after a resume are exactly
the ones an uninterrupted run would have delivered, whatever ``num_workers``,
``io_concurrency`` or ``prefetch`` either side used.

The state is a small JSON-serialisable dict::

    {"format": "aioloader.state", "version": 1,
     "dataset_len": 50000, "seed": 0, "shuffle": true, "batch_size": 256, "drop_last": false,
     "rank": 0, "world_size": 2, "pad_shards": true, "locality": null,
     "epoch": 3, "batches_done": 41, "batches_done_after": [], "samples_done": 10496,
     "resharded_from": null,
     "stats": {"samples": ..., "batches": ..., "failures_by_reason": {...}}}

``batches_done``: every batch below it was received; ``batches_done_after``: batches past it
received out of order (``ordered=False``). ``resharded_from``: ``{"world_size", "batches_done"}``
when this epoch's plan is the remainder of an epoch begun on another number of ranks.
``locality``: ``{"buffer": n}`` for the shard-local order (:mod:`aioloader.plan.locality`);
a state without it (saved before it existed) was taken with the uniform one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from aioloader.plan.sampler import (
    EpochPlan,
    IndexArray,
    num_batches,
    plan_epoch,
    plan_remainder,
    remainder_len,
    shard_size,
)
from aioloader.plan.settings import Sampling

__all__ = [
    "FORMAT",
    "VERSION",
    "Progress",
    "ResumePoint",
    "check_state",
    "make_state",
    "plan_for",
    "plan_len",
]

FORMAT = "aioloader.state"
VERSION = 1
#: Settings that decide which sample is in which batch: a state must agree on all of them.
_MUST_MATCH = ("dataset_len", "seed", "shuffle", "batch_size", "drop_last", "pad_shards", "locality")
#: The sampling settings a state records as they are (by :class:`~aioloader.plan.settings.Sampling`'s
#: names); ``locality`` is recorded as ``{"buffer": n}`` or None (absent before it existed: None).
_SAMPLING = (*_MUST_MATCH[1:-1], "rank", "world_size")


@dataclass(frozen=True)
class ResumePoint:
    """Where a loaded state resumes: ``epoch``, batches below ``start`` and in ``done``
    already received, and ``base`` = ``(old world size, batches each old rank consumed)``
    when the epoch is re-sharded."""

    epoch: int
    start: int = 0
    done: frozenset[int] = frozenset()
    samples: int = 0
    base: tuple[int, int] | None = None


class Progress:
    """The batches of one epoch's plan the trainer has received so far."""

    def __init__(self, epoch: int, total: int, point: ResumePoint | None = None) -> None:
        self.epoch = epoch
        self.total = total
        self.next = point.start if point else 0  # every batch below it was received
        self.after: set[int] = set(point.done) if point else set()
        self.samples = point.samples if point else 0
        self.base = point.base if point else None

    def mark(self, k: int, size: int) -> None:
        """Batch ``k`` (of ``size`` samples) reached the trainer."""
        self.after.add(k)
        while self.next in self.after:
            self.after.discard(self.next)
            self.next += 1
        self.samples += size

    def finish(self) -> None:
        """The epoch's last batch was received (batches that came out empty included)."""
        self.next = self.total
        self.after.clear()

    def point(self) -> ResumePoint:
        return ResumePoint(self.epoch, self.next, frozenset(self.after), self.samples, self.base)


def make_state(
    sampling: Sampling, dataset_len: int, progress: Progress, stats: dict[str, Any]
) -> dict[str, Any]:
    """The state dict for ``progress`` (see the module docstring)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "dataset_len": dataset_len,
        **{key: getattr(sampling, key) for key in _SAMPLING},
        "locality": _locality(sampling),
        "epoch": progress.epoch,
        "batches_done": progress.next,
        "batches_done_after": sorted(progress.after),
        "samples_done": progress.samples,
        "resharded_from": None
        if progress.base is None
        else {"world_size": progress.base[0], "batches_done": progress.base[1]},
        "stats": stats,
    }


def check_state(
    state: object, sampling: Sampling, dataset_len: int, *, allow_reshard: bool = False
) -> ResumePoint:
    """The resume point of ``state`` for this loader, or ``ValueError`` saying what differs."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError("load_state_dict: not an aioloader state dict (no 'format': 'aioloader.state')")
    if state.get("version") != VERSION:
        raise ValueError(f"load_state_dict: state version {state.get('version')!r} is not supported")
    ours = {"dataset_len": dataset_len, **{k: getattr(sampling, k) for k in _MUST_MATCH[1:-1]}}
    ours["locality"] = _locality(sampling)
    for key in _MUST_MATCH:
        if state.get(key) != ours[key]:
            raise ValueError(
                f"load_state_dict: the state was taken with {key}={state.get(key)!r}, "
                f"this loader has {key}={ours[key]!r}; the batches would differ"
            )
    epoch, start = int(state["epoch"]), int(state["batches_done"])
    done = frozenset(int(k) for k in state["batches_done_after"])
    samples = int(state.get("samples_done", 0))
    old = state.get("resharded_from")
    base = None if old is None else (int(old["world_size"]), int(old["batches_done"]))
    if state["world_size"] != sampling.world_size:
        if not allow_reshard:
            raise ValueError(
                f"load_state_dict: the state was taken with world_size={state['world_size']}, this "
                f"loader has world_size={sampling.world_size}; pass allow_reshard=True to spread the "
                "rest of the epoch over the new ranks"
            )
        if done or base is not None:
            raise ValueError(
                "load_state_dict: cannot re-shard this state: "
                + (
                    "it has batches received out of order (ordered=False)"
                    if done
                    else "its epoch was already re-sharded once; finish it on the same world size"
                )
            )
        return ResumePoint(epoch, 0, frozenset(), 0, (int(state["world_size"]), start))
    if state["rank"] != sampling.rank:
        raise ValueError(
            f"load_state_dict: the state is rank {state['rank']}'s, this loader is rank {sampling.rank}"
        )
    return ResumePoint(epoch, start, done, samples, base)


def _locality(sampling: Sampling) -> dict[str, int] | None:
    return None if sampling.locality is None else {"buffer": sampling.locality.buffer}


def plan_for(
    sampling: Sampling,
    dataset_len: int,
    epoch: int,
    resume: ResumePoint | None,
    runs: IndexArray | None = None,
) -> EpochPlan:
    """The plan of ``epoch``: from its start, or from ``resume`` when that is this epoch's.
    ``runs``: the start index of each shard's run of samples, for ``sampling.locality``.

    It makes the epoch's order (:func:`~aioloader.plan.sampler.epoch_order`), once: only
    the runtime that produces the epoch's batches calls it, when the run starts (in the
    trainer's process, or in the loader process from ``(epoch, resume)``). Whoever needs
    only the plan's length asks :func:`plan_len`."""
    rank, world_size = sampling.shard
    common: dict[str, Any] = {
        "batch_size": sampling.batch_size,
        "shuffle": sampling.shuffle,
        "seed": sampling.seed,
        "epoch": epoch,
        "drop_last": sampling.drop_last,
        "rank": rank,
        "world_size": world_size,
        "pad": sampling.pad_shards,
    }
    if sampling.locality is not None:
        assert runs is not None, "the shard-local order needs the dataset's runs"
        common.update(runs=runs, buffer=sampling.locality.buffer)
    if resume is None or resume.epoch != epoch:
        return plan_epoch(dataset_len, **common)
    if resume.base is None:
        plan = plan_epoch(dataset_len, **common)
    else:
        plan = plan_remainder(
            dataset_len, old_world_size=resume.base[0], consumed_batches=resume.base[1], **common
        )
    return dataclasses.replace(plan, start=min(resume.start, len(plan)), done=resume.done)


def plan_len(sampling: Sampling, dataset_len: int, epoch: int, resume: ResumePoint | None) -> int:
    """``len(plan_for(sampling, dataset_len, epoch, resume))``, from the sizes alone: no order
    is made (the trainer counts its progress in it; the plan itself is made where the
    batches are)."""
    n = dataset_len
    if resume is not None and resume.epoch == epoch and resume.base is not None:
        n = remainder_len(
            dataset_len,
            batch_size=sampling.batch_size,
            drop_last=sampling.drop_last,
            old_world_size=resume.base[0],
            consumed_batches=resume.base[1],
            pad=sampling.pad_shards,
            blocks=sampling.locality is not None,
        )
    per_rank = shard_size(n, sampling.shard[1], sampling.pad_shards)
    return num_batches(per_rank, sampling.batch_size, sampling.drop_last)
