"""The first batch's probe (aioloader/engine/epoch.py, ``Opening`` in engine/opening.py, the
slabs the probes ran with in engine/batch.py's ``BatchSlabs``).

While the slabs' layout is unknown (a decoder that declares nothing, at the start), the
epoch's first samples decode alone, one per worker (probes), and the first to finish teaches
it; the first batch's other chunks then decode straight into the rows of a slab of that
layout instead of crossing back pickled, and they take the workers before any later batch
does. The probes' own samples are written into their rows, so the first batch is a slab's
rows like every other one. A slow probe holds up no worker: the others teach.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from aioloader import Loader
from aioloader.decode.contract import DecodeRequest
from aioloader.engine.batch import BatchSlabs
from aioloader.engine.opening import Opening, OpeningState, Phase, Wake
from aioloader.engine.sizing import chunk_cuts, chunk_size, opening_chunk
from aioloader.memory.results import Pickled
from aioloader.memory.slots import OrderedSlots


def test_chunk_cuts_put_the_probes_first_then_whole_chunks() -> None:
    assert chunk_cuts(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert chunk_cuts(8, 3, probes=1) == [(0, 1), (1, 4), (4, 7), (7, 8)]
    assert chunk_cuts(8, 3, probes=2) == [(0, 1), (1, 2), (2, 5), (5, 8)]
    assert chunk_cuts(2, 3, probes=4) == [(0, 1), (1, 2)]  # probes are the whole batch
    assert chunk_cuts(0, 3, probes=2) == []
    for n in range(1, 40):
        for probes in (0, 1, 2, 5):
            cuts = chunk_cuts(n, 16, probes)
            assert [a for a, _ in cuts[1:]] == [b for _, b in cuts[:-1]]  # contiguous, in order
            assert cuts[0][0] == 0 and cuts[-1][1] == n
            assert all(0 < b - a <= 16 for a, b in cuts)


def test_a_batch_is_one_task_per_worker_and_an_epochs_first_is_cut_in_half() -> None:
    assert [chunk_size(64, w) for w in (1, 2, 3, 16, 64, 100)] == [32, 32, 22, 4, 1, 1]
    assert [chunk_size(256, w) for w in (2, 8, 12)] == [32, 32, 22]
    assert chunk_size(64, 0) == 64  # no workers: the whole batch
    assert [opening_chunk(c) for c in (32, 31, 2, 1)] == [16, 16, 1, 1]


def _record_tasks(loader: Loader) -> list[tuple[DecodeRequest, list[Any]]]:
    """Wrap the in-process engine's decode stage: each task it ran, with its outcomes, in the
    order they ended."""
    stage = loader._runtime.engine._stage  # type: ignore[union-attr]
    run = stage.run
    tasks: list[tuple[DecodeRequest, list[Any]]] = []

    async def recorded(request: DecodeRequest) -> Any:
        outcomes = await run(request)
        tasks.append((request, outcomes))
        return outcomes

    stage.run = recorded
    return tasks


def test_each_epochs_first_batch_decodes_in_half_size_tasks_the_rest_in_whole_ones(
    numbered: list[str],
) -> None:
    """Real workers: every later batch goes out as one task per worker; an epoch's first
    batch, which the trainer waits for alone, in tasks of half that (its probes, one sample
    each, first while the layout is unknown)."""
    with Loader(
        numbered, batch_size=16, decode=_number, num_workers=2, shuffle=False, loader_process=False
    ) as loader:
        tasks = _record_tasks(loader)
        for _ in range(2):
            assert sum(len(b) for b in loader) == len(numbered)
    sizes: dict[tuple[int, int], list[int]] = {}
    for request, _ in tasks:
        sizes.setdefault((request.epoch, request.k), []).append(len(request.items))
    assert sorted(sizes[0, 0]) == [1, 1, 2, 4, 4, 4]  # two probes, then 14 rows in fours
    assert sorted(sizes[1, 0]) == [4, 4, 4, 4]  # the layout known: no probes
    assert sizes[0, 1] == sizes[1, 1] == [8, 8]
    assert sizes[0, 2] == sizes[1, 2] == [5]  # 37 files: the last batch's 5


# -- the opening's states and events, pure (OpeningState: no loop) ---------------------------


def test_the_opening_starts_learning_or_learned() -> None:
    assert OpeningState.start(need_layout=True).phase is Phase.LEARNING
    assert OpeningState.start(need_layout=False).phase is Phase.LEARNED
    state = OpeningState.start(need_layout=True)
    state.cut(4)  # no probes: nobody waits for one
    assert state.phase is Phase.LEARNING and not state.followers_wait and state.need_layout


def test_a_probe_teaches_the_followers_go_then_the_later_batches() -> None:
    state = OpeningState.start(need_layout=True)
    state.cut(3, probes=1)  # a probe and two followers
    assert state.phase is Phase.PROBING and state.followers_wait
    assert state.chunk_read() is Wake.NONE  # the probe's read
    assert state.layout_learned() is Wake.FOLLOWERS  # the followers have yet to ask for slots
    assert state.phase is Phase.LEARNED and not state.followers_wait and not state.need_layout
    assert state.chunk_read() is Wake.NONE
    assert state.chunk_read() is Wake.LATER and state.is_open  # the last follower lets them in
    assert state.probe_ended() is Wake.NONE  # the probe that taught, ending
    assert state.batch_done() is Wake.NONE  # open already: opens once


def test_a_layout_learned_once_every_chunk_is_read_wakes_both_followers_first() -> None:
    state = OpeningState.start(need_layout=True)
    state.cut(2, probes=1)
    assert state.chunk_read() is Wake.NONE  # the probe
    assert state.chunk_read() is Wake.NONE  # a follower whose reads all failed: nothing to wait for
    assert state.layout_learned() == Wake.FOLLOWERS | Wake.LATER


def test_probes_that_all_end_without_teaching_let_the_followers_go_still_learning() -> None:
    state = OpeningState.start(need_layout=True)
    state.cut(4, probes=2)
    assert state.probe_ended() is Wake.NONE and state.phase is Phase.PROBING  # one may still teach
    assert state.probe_ended() is Wake.FOLLOWERS and state.phase is Phase.LEARNING
    for _ in range(4):
        assert state.chunk_read() is Wake.NONE  # every file read, no layout yet: the later batches wait
    assert state.layout_learned() is Wake.LATER  # a follower's chunk taught it
    assert state.phase is Phase.LEARNED


def test_the_first_batch_done_opens_whatever_it_learned() -> None:
    state = OpeningState.start(need_layout=True)
    state.cut(1)
    assert state.chunk_read() is Wake.NONE  # every sample failed: nothing to learn from
    assert state.batch_done() is Wake.LATER and state.is_open and state.need_layout


def test_in_completion_order_the_gate_does_not_wait_for_the_layout_pure() -> None:
    state = OpeningState.start(need_layout=True, wait_for_layout=False)
    state.cut(1, probes=1)
    assert state.chunk_read() is Wake.LATER  # open while the probe still decodes
    assert state.phase is Phase.PROBING
    assert state.layout_learned() is Wake.FOLLOWERS  # open already
    state = OpeningState.start(need_layout=False)
    state.cut(2)
    assert state.chunk_read() is Wake.NONE
    assert state.chunk_read() is Wake.LATER  # nothing to learn: the last read opens it


# -- a batch's slabs (engine/batch.py: BatchSlabs), on a fake pool --------------------------


class _Slabs:
    """What :class:`BatchSlabs` asks of a slab pool: slabs handed out and given back, and the
    layout a new slab gets (``sample``)."""

    def __init__(self) -> None:
        self.sample: Any = None
        self.out: list[Any] = []
        self.back: list[Any] = []
        self.made = 0

    def acquire(self) -> Any:
        self.made += 1
        slab = SimpleNamespace(n=self.made, layout=SimpleNamespace(sample=self.sample), tainted=False)
        self.out.append(slab)
        return slab

    def release(self, slab: Any) -> None:
        assert slab in self.out and slab not in self.back, "given back twice"
        self.back.append(slab)


def test_a_batchs_slabs_the_probes_old_one_kept_until_the_batch_ends() -> None:
    rows, arenas = _Slabs(), _Slabs()
    slabs = BatchSlabs(rows, arenas, take_rows=True)  # type: ignore[arg-type]
    probed = slabs.rows
    assert probed is not None and slabs.inputs is not None and slabs.rows_for_decode() is probed
    slabs.relayout()  # nothing learned yet: the same slab
    assert slabs.rows is probed and slabs.earlier == []
    rows.sample = "learned"  # a probe taught the layout: the followers get a slab of it
    slabs.relayout()
    assert slabs.rows is not probed and slabs.rows.layout.sample == "learned"
    assert slabs.earlier == [probed] and rows.back == []  # a probe may still decode into it
    slabs.relayout()  # already of the layout: kept
    assert rows.made == 2
    slabs.decoded()
    assert arenas.back == arenas.out and slabs.inputs is None
    current = slabs.rows
    slabs.release()
    assert rows.back == [current, probed] and slabs.rows is None and slabs.earlier == []
    slabs.release()  # once only
    assert len(rows.back) == 2 and len(arenas.back) == 1


def test_a_later_batch_takes_its_rows_slab_when_it_first_decodes() -> None:
    rows = _Slabs()
    slabs = BatchSlabs(rows, None, take_rows=False)  # type: ignore[arg-type]
    assert slabs.rows is None and slabs.inputs is None and rows.made == 0
    rows.sample = "learned"
    taken = slabs.rows_for_decode()
    assert taken is not None and taken.layout.sample == "learned" and slabs.rows_for_decode() is taken
    assert BatchSlabs(None, None, take_rows=True).rows_for_decode() is None  # pickled: no slabs


def test_a_failed_batch_taints_every_slab_it_held() -> None:
    rows, arenas = _Slabs(), _Slabs()
    slabs = BatchSlabs(rows, arenas, take_rows=True)  # type: ignore[arg-type]
    rows.sample = "learned"
    slabs.relayout()
    held = [slabs.rows, *slabs.earlier, slabs.inputs]
    slabs.taint()
    slabs.release()
    assert all(s is not None and s.tainted for s in held)
    assert sorted(s.n for s in rows.back) == [1, 2] and len(arenas.back) == 1


# -- the waiting, on a loop (Opening) ---------------------------------------------------------


@pytest.mark.asyncio
async def test_the_probes_followers_take_the_slots_before_the_later_batches() -> None:
    """The probe teaches the layout: the first batch's other chunks resume first and ask for
    decode slots first, then the later batches, smallest key first."""
    opening = Opening(need_layout=True)
    opening.cut(3, probes=1)  # the probe and two chunks
    slots = OrderedSlots(2)
    granted: list[tuple[int, int]] = []

    async def chunk(k: int, row: int) -> None:
        if k == 0:
            await opening.after_probe()
            opening.chunk_read()
        else:
            await opening.wait((k, row))
        async with slots.slot((k, row)):
            granted.append((k, row))
            await asyncio.sleep(0.01)

    async def probe() -> None:
        opening.chunk_read()
        await asyncio.sleep(0.01)  # its decode
        opening.layout_learned()

    later = [asyncio.ensure_future(chunk(k, 0)) for k in (2, 1)]  # their reads done first
    await asyncio.sleep(0)
    followers = [asyncio.ensure_future(chunk(0, row)) for row in (1, 9)]
    await asyncio.sleep(0.005)
    assert granted == []  # nobody decodes before the probe taught the layout
    await opening.probe_with(probe())
    await asyncio.gather(*later, *followers)
    assert granted == [(0, 1), (0, 9), (1, 0), (2, 0)]


@pytest.mark.asyncio
async def test_a_later_batch_read_just_as_the_probe_ends_waits_for_the_followers() -> None:
    """A later batch's chunk whose read completes just as the probe teaches the layout (it
    resumes before the followers do) must still find the opening closed: the later batches
    are let in by the last follower, once it asks for its slot, not when the reads are done."""
    opening = Opening(need_layout=True)
    opening.cut(3, probes=1)  # a probe and two followers
    slots = OrderedSlots(4)  # free: whoever asks first gets one first
    granted: list[tuple[int, int]] = []
    read_done = asyncio.Event()

    async def follower(row: int) -> None:
        await opening.after_probe()
        opening.chunk_read()  # as the engine does: then straight to its slot
        async with slots.slot((0, row)):
            granted.append((0, row))

    async def late() -> None:
        await read_done.wait()
        await opening.wait((1, 0))
        async with slots.slot((1, 0)):
            granted.append((1, 0))

    tasks = [asyncio.ensure_future(c) for c in (follower(1), follower(2), late())]
    await asyncio.sleep(0)
    opening.chunk_read()  # the probe's read
    read_done.set()  # the later chunk resumes first...
    opening.layout_learned()  # ...then the followers, let go by the probe
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert granted == [(0, 1), (0, 2), (1, 0)]


@pytest.mark.asyncio
async def test_a_probe_that_fails_lets_its_followers_go() -> None:
    """A probe that raises (a read or decode that failed, a cancellation) still lets the
    first batch's other chunks go: they decode without a layout, as before there was one."""
    opening = Opening(need_layout=True)
    opening.cut(2, probes=1)
    follower = asyncio.ensure_future(opening.after_probe())
    await asyncio.sleep(0)
    assert not follower.done()

    async def failing() -> None:
        raise OSError("the probe's file is gone")

    with pytest.raises(OSError):
        await opening.probe_with(failing())
    await asyncio.wait_for(follower, 1)
    assert opening.need_layout  # nothing was learned: later batches wait for the first to end
    await asyncio.wait_for(opening.after_probe(), 1)  # once over, never waits


@pytest.mark.asyncio
async def test_followers_go_once_one_probe_taught_or_every_probe_ended() -> None:
    """Two probes: the first to teach the layout lets the followers go, however long the
    other takes; probes that all end without teaching let them go too."""
    opening = Opening(need_layout=True)
    opening.cut(3, probes=2)
    slow = asyncio.Event()

    async def probe(teaches: bool, wait: asyncio.Event | None = None) -> None:
        if wait is not None:
            await wait.wait()
        if teaches:
            opening.layout_learned()

    slow_probe = asyncio.ensure_future(opening.probe_with(probe(True, slow)))
    follower = asyncio.ensure_future(opening.after_probe())
    await opening.probe_with(probe(True))
    await asyncio.wait_for(follower, 1)  # the other probe still runs
    assert not slow_probe.done()
    slow.set()
    await slow_probe

    opening = Opening(need_layout=True)
    opening.cut(3, probes=2)
    follower = asyncio.ensure_future(opening.after_probe())
    await opening.probe_with(probe(False))
    await asyncio.sleep(0)
    assert not follower.done()  # one probe left that may still teach
    await opening.probe_with(probe(False))
    await asyncio.wait_for(follower, 1)
    assert opening.need_layout


@pytest.mark.asyncio
async def test_a_cancelled_follower_leaves_the_others_waiting_for_the_probe() -> None:
    opening = Opening(need_layout=True)
    opening.cut(3, probes=1)
    a = asyncio.ensure_future(opening.after_probe())
    b = asyncio.ensure_future(opening.after_probe())
    await asyncio.sleep(0)
    a.cancel()
    await asyncio.sleep(0)
    assert a.cancelled() and not b.done()
    opening.layout_learned()
    await asyncio.wait_for(b, 1)


@pytest.mark.asyncio
async def test_without_a_probe_nobody_waits_for_one() -> None:
    opening = Opening(need_layout=False)
    opening.cut(2)
    await asyncio.wait_for(opening.after_probe(), 1)


@pytest.mark.asyncio
async def test_in_completion_order_the_later_batches_do_not_wait_for_the_layout() -> None:
    """``ordered=False``: once the first batch's chunks are read, the later batches go on
    while the probe still decodes; in sampler order they wait for what it teaches."""
    for wait_for_layout in (True, False):
        opening = Opening(need_layout=True, wait_for_layout=wait_for_layout)
        opening.cut(1, probes=1)  # the probe alone (batch_size=1)
        opening.chunk_read()  # the probe read its file and decodes, slowly
        later = asyncio.ensure_future(opening.wait((1, 0)))
        await asyncio.sleep(0.01)
        assert later.done() is not wait_for_layout
        opening.layout_learned()
        await asyncio.wait_for(later, 1)


def _number(data: bytes) -> np.ndarray:
    """The file's number (``sample-000123``), 4 KiB of it: an array whose layout nothing
    declares."""
    return np.full((4, 32, 32), int(data[-6:]), dtype=np.uint8)


_first_call = {"failed": False}


def _number_but_a_workers_first(data: bytes) -> np.ndarray:
    """:func:`_number`, except that the first call in each worker process raises (the
    dictionary goes to each worker by value)."""
    if not _first_call["failed"]:
        _first_call["failed"] = True
        raise ValueError("a worker's first sample")
    return _number(data)


def _pickled_by_batch(tasks: list[tuple[DecodeRequest, list[Any]]]) -> dict[int, int]:
    """The samples that came back pickled, by batch number (summed over epochs)."""
    counts: dict[int, int] = {}
    for request, outcomes in tasks:
        counts[request.k] = counts.get(request.k, 0) + sum(isinstance(o, Pickled) for o in outcomes)
    return counts


def test_only_the_probes_cross_pickled_and_the_first_batch_is_right(numbered: list[str]) -> None:
    with Loader(
        numbered, batch_size=8, decode=_number, num_workers=2, shuffle=False, loader_process=False
    ) as loader:
        tasks = _record_tasks(loader)
        batches = [b.clone() for b in loader]
        pickled = _pickled_by_batch(tasks)
        assert pickled[0] == 2 and sum(pickled.values()) == 2  # a probe per worker; the rest in rows
        got = [int(row[0, 0, 0]) for b in batches for row in b]
        assert got == list(range(len(numbered)))  # the probes' samples are rows 0 and 1
        assert batches[0].shape == (8, 4, 32, 32)


def test_a_failed_probe_falls_back_to_learning_from_the_first_chunk(numbered: list[str]) -> None:
    """The probe's sample fails (skipped): nothing is learned from it, its batch's other chunks
    decode without a layout and come back pickled as before the probe existed, and the
    layout is learned from them; every other sample arrives, in order."""
    with Loader(
        numbered,
        batch_size=8,
        decode=_number_but_a_workers_first,
        num_workers=1,
        shuffle=False,
        on_error="skip",
        loader_process=False,
    ) as loader:
        tasks = _record_tasks(loader)
        got = [int(row[0, 0, 0]) for b in loader for row in b]
        assert got == list(range(1, len(numbered)))  # sample 0 was the probe, and failed
        pickled = _pickled_by_batch(tasks)
        assert pickled.get(0) == 7 and sum(pickled.values()) == 7
        assert loader.stats.failures_by_reason
        got = [int(row[0, 0, 0]) for b in loader for row in b]  # the next epoch: rows only
        assert got == list(range(len(numbered)))
