"""The loader through both front-ends: every case runs once through ``for``/``with``
(``[sync]``) and once through ``async for``/``async with`` (``[async]``), by the ``frontend``
fixture (conftest.py, frontends.py), and each of those once in the trainer's process
(``[thread]``, ``loader_process=False``) and once in a loader process (``[process]``, the
default ``loader_process="auto"``). What only one front-end can show is a single test at
the end."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from faults import Fault
from frontends import Driver
from helpers import (
    FailOn,
    LoggedRead,
    ReadAfterTicks,
    RuntimeWatch,
    SlowDecode,
    decode_number,
    flatten,
    random_draw,
)

import aioloader
from aioloader import DecodeError, FileDataset, Loader, LoaderClosedError, LoaderError, ReadError
from aioloader.config import LoaderConfig
from aioloader.loader import CLOSED_MESSAGE


@pytest.fixture(autouse=True, params=["thread", "process"])
def where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, runtimes: RuntimeWatch) -> str:
    """Where the pipeline runs: ``[process]`` leaves every Loader of the test its default,
    ``loader_process="auto"`` (what every user gets), and ``[thread]`` gives each
    ``loader_process=False``. The test fails when one ran elsewhere (``runtimes``,
    conftest.py): in-process for ``[process]`` (no zygote could be made, or a callable that
    could not be sent), or in a loader process for ``[thread]``."""
    runtimes.expect(request.param == "process")
    if request.param == "thread":
        create = LoaderConfig.create

        def in_process(given: Mapping[str, object], remote: bool = False, early: Any = None) -> LoaderConfig:
            return create({**given, "loader_process": False}, remote, early)

        monkeypatch.setattr(LoaderConfig, "create", in_process)
    return str(request.param)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 5, 37, 64])
def test_every_sample_once_per_epoch(
    frontend: Driver, numbered: list[str], shuffle: bool, drop_last: bool, batch_size: int
) -> None:
    with frontend.opened(
        Loader(
            numbered,
            batch_size=batch_size,
            decode=decode_number,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=2,
        )
    ) as loader:
        for e in range(2):
            loader.set_epoch(e)
            batches = frontend.epoch(loader)
            assert len(batches) == len(loader)
            got = flatten(batches)
            sizes = [len(b) for b in batches]
            if drop_last:
                assert all(s == batch_size for s in sizes)
                assert len(got) == (37 // batch_size) * batch_size
                assert len(set(got)) == len(got)
            else:
                assert sorted(got) == list(range(37))
                assert all(s == batch_size for s in sizes[:-1])
            if not shuffle:
                assert got == sorted(got)


def test_order_depends_only_on_seed_and_epoch(frontend: Driver, numbered: list[str]) -> None:
    def run(seed: int, ep: int, workers: int, io: int) -> list[int]:
        with frontend.opened(
            Loader(
                numbered,
                batch_size=4,
                decode=decode_number,
                shuffle=True,
                seed=seed,
                num_workers=workers,
                io_concurrency=io,
            )
        ) as loader:
            loader.set_epoch(ep)
            return flatten(frontend.epoch(loader))

    base = run(7, 3, 1, 1)
    assert run(7, 3, 3, 64) == base  # same batches whatever the workers and read concurrency
    assert run(7, 4, 2, 8) != base
    assert run(8, 3, 2, 8) != base
    assert sorted(base) == list(range(37))


def test_epochs_advance_without_set_epoch(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(
        Loader(numbered, batch_size=8, decode=decode_number, shuffle=True, num_workers=1)
    ) as loader:
        first, second = flatten(frontend.epoch(loader)), flatten(frontend.epoch(loader))
        assert loader.epoch == 1
        loader.set_epoch(0)
        assert flatten(frontend.epoch(loader)) == first
    assert first != second and sorted(first) == sorted(second)


def test_unordered_delivers_every_sample(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(
        Loader(numbered, batch_size=5, decode=decode_number, ordered=False, shuffle=True, num_workers=2)
    ) as loader:
        batches = frontend.epoch(loader)
    assert len(batches) == len(loader) == 8
    assert sorted(flatten(batches)) == list(range(37))


def test_unordered_delivers_in_completion_order(frontend: Driver, numbered: list[str]) -> None:
    """docs/how-it-works/index.md ("Order"): with ``ordered=False`` the batch of a sample
    that is slow to decode comes last, not first; in sampler order (the default) it comes
    first."""
    slow = Fault("hang", {0}, seconds=2.0)
    for ordered, position in ((False, -1), (True, 0)):
        with frontend.opened(
            Loader(numbered, batch_size=5, shuffle=False, decode=slow, ordered=ordered, num_workers=2)
        ) as loader:
            batches = frontend.epoch(loader)
        assert 0 in flatten([batches[position]]), (ordered, [flatten([b]) for b in batches])
        assert sorted(flatten(batches)) == list(range(37))


class HeldUntil:
    """Decode numbered files; the file numbered ``held`` waits until the file ``gate``
    exists (60 s at most, so that a loader that waits for it fails the test, not hangs)."""

    def __init__(self, held: int, gate: str) -> None:
        self.held, self.gate = held, gate

    def __call__(self, data: bytes) -> np.ndarray:
        value = decode_number(data)
        if int(value[0]) == self.held:
            deadline = time.monotonic() + 60
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        return value


@pytest.mark.parametrize("batch_size", [1, 3])
def test_unordered_a_slow_first_sample_holds_back_only_itself(
    frontend: Driver, numbered: list[str], tmp_path: Path, batch_size: int
) -> None:
    """``ordered=False`` is completion order from the first sample on: the epoch's first
    sample (the one that would teach the slab layout) is held until every other batch has
    arrived; only then does the test let it finish. A loader that made the later batches
    wait for it would deliver nothing until the 60 s guard, then in the wrong order."""
    gate = tmp_path / "gate"
    n = 12
    loader = Loader(
        numbered[:n],
        batch_size=batch_size,
        shuffle=False,
        decode=HeldUntil(0, str(gate)),
        ordered=False,
        num_workers=2,
    )
    with frontend.opened(loader):
        it = frontend.iter(loader)
        early = [frontend.next(it) for _ in range(len(loader) - 1)]
        gate.touch()
        last = frontend.rest(it)
    assert 0 not in flatten(early) and 0 in flatten(last), (flatten(early), flatten(last))
    assert sorted(flatten(early + last)) == list(range(n))


def test_images_with_labels(frontend: Driver, image_folder: Path) -> None:
    ds = FileDataset.from_folder(image_folder)
    with frontend.opened(
        Loader(ds, shuffle=False, batch_size=8, decode=aioloader.ImageDecoder(32), num_workers=2)
    ) as loader:
        batches = frontend.epoch(loader)
    images, labels = batches[0]
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 32, 32)
    assert labels.dtype == torch.int64 and labels.shape == (8,)
    all_labels = torch.cat([b[1] for b in batches]).tolist()
    assert Counter(all_labels) == Counter(ds.labels.tolist())  # type: ignore[union-attr]
    # Same pixels as decoding the file in this process: nothing is lost or mixed up.
    decoder = aioloader.ImageDecoder(32)
    expected = decoder(Path(ds.path(0)).read_bytes())
    assert np.array_equal(images[0].numpy(), expected)


def test_raw_bytes_without_decode(frontend: Driver, numbered: list[str]) -> None:
    # decode=None loads in-process under "auto": True keeps [process] in a loader process.
    raw = Loader(numbered[:3], shuffle=False, batch_size=3, decode=None, loader_process=True)
    with frontend.opened(raw) as loader:
        (batch,) = frontend.epoch(loader)
    assert batch == [b"sample-000000", b"sample-000001", b"sample-000002"]


def test_raw_bytes_with_labels_skip_bad_files_by_name(
    frontend: Driver, numbered: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """decode=None, batches of many files (read in groups): each batch is its files' bytes
    and their labels; a missing file, a directory and an empty file are skipped, each
    logged by name, and the rest are delivered in order."""
    caplog.set_level(logging.WARNING, logger="aioloader")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    bad = {5: str(tmp_path / "missing.bin"), 17: str(tmp_path), 30: str(empty)}
    paths = [bad.get(i, p) for i, p in enumerate(numbered)]
    ds = FileDataset(paths, labels=list(range(37)))
    raw = Loader(ds, shuffle=False, batch_size=16, decode=None, on_error="skip", loader_process=True)
    with frontend.opened(raw) as loader:  # True: see test_raw_bytes_without_decode
        batches = frontend.epoch(loader)
        stats = loader.stats
    kept = [i for i in range(37) if i not in bad]
    assert [b for data, _ in batches for b in data] == [Path(numbered[i]).read_bytes() for i in kept]
    labels = torch.cat([lbl for _, lbl in batches])
    assert labels.dtype == torch.int64 and labels.tolist() == kept
    assert all(type(data) is list and all(type(x) is bytes for x in data) for data, _ in batches)
    assert stats.failures_by_reason == {"ReadError": 3}
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "aioloader")
    assert all(p in logged for p in bad.values())


def test_augmentation_seeded_by_seed_epoch_index(frontend: Driver, numbered: list[str]) -> None:
    def draws(workers: int, ep: int) -> dict[int, float]:
        with frontend.opened(
            Loader(numbered, batch_size=6, decode=random_draw, shuffle=True, num_workers=workers)
        ) as loader:
            loader.set_epoch(ep)
            rows = torch.cat(frontend.epoch(loader))
        return {int(r[0]): float(r[1]) for r in rows}

    one = draws(1, 0)
    assert draws(3, 0) == one
    assert draws(1, 1) != one


def test_stats(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(
        Loader(numbered, shuffle=False, batch_size=10, decode=decode_number, num_workers=1)
    ) as loader:
        frontend.epoch(loader)
        frontend.epoch(loader)
        s = loader.stats
    assert (s.samples, s.batches, s.epoch, s.epoch_samples, s.epoch_batches) == (74, 8, 1, 37, 4)
    assert s.bytes_read == 2 * sum(len(Path(p).read_bytes()) for p in numbered)
    assert s.wait_seconds >= s.epoch_wait_seconds >= 0 and s.epoch_seconds > 0
    assert s.first_batch_seconds is not None


def test_read_error_names_file_and_loader_stays_usable(
    frontend: Driver, tmp_path: Path, numbered: list[str]
) -> None:
    paths = [*numbered[:5], str(tmp_path / "missing.txt"), *numbered[5:10]]
    with frontend.opened(
        Loader(paths, shuffle=False, batch_size=2, decode=decode_number, num_workers=1)
    ) as loader:
        it = frontend.iter(loader)
        assert flatten([frontend.next(it), frontend.next(it)]) == [0, 1, 2, 3]
        with pytest.raises(ReadError) as info:
            frontend.next(it)
        assert info.value.path == paths[5] and info.value.index == 5
        assert "missing.txt" in str(info.value)
        assert isinstance(info.value.__cause__, FileNotFoundError)
        with pytest.raises(frontend.Stop):  # the failed iteration is over
            frontend.next(it)
        loader.set_epoch(1)
        with pytest.raises(ReadError):  # the next epoch runs again, and fails on the same file
            frontend.epoch(loader)


def test_empty_file_is_a_read_error(frontend: Driver, tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    loader = Loader([empty], shuffle=False, batch_size=1, decode=decode_number, num_workers=1)
    with frontend.opened(loader), pytest.raises(ReadError, match="empty file"):
        frontend.epoch(loader)


def test_decode_error_keeps_cause_and_worker_traceback(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(
        Loader(numbered, shuffle=False, batch_size=4, decode=FailOn({9}, KeyError), num_workers=2)
    ) as loader:
        with pytest.raises(DecodeError) as info:
            frontend.epoch(loader)
        err = info.value
        assert err.index == 9 and err.path == numbered[9]
        assert type(err.__cause__) is KeyError and "bad sample 9" in str(err.__cause__)
        assert "boom" in err.worker_traceback and "boom" in str(err)
        # Usable afterwards: the next iteration delivers the batches before the bad sample.
        it = frontend.iter(loader)
        assert flatten([frontend.next(it), frontend.next(it)]) == list(range(8))


def test_skip_counts_and_warns_once(
    frontend: Driver, numbered: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aioloader")
    with frontend.opened(
        Loader(numbered, shuffle=False, batch_size=5, decode=FailOn({3, 20}), on_error="skip", num_workers=2)
    ) as loader:
        got = flatten(frontend.epoch(loader))
        got2 = flatten(frontend.epoch(loader))
        stats = loader.stats
    assert sorted(got) == sorted(got2) == [i for i in range(37) if i not in (3, 20)]
    assert stats.failures == 4 and stats.failures_by_reason == {"DecodeError": 4}
    warned = [r for r in caplog.records if r.name == "aioloader"]
    assert len(warned) == 2  # once per file per loader, not once per epoch


def test_max_failures_gives_up(frontend: Driver, numbered: list[str]) -> None:
    with (
        frontend.opened(
            Loader(
                numbered,
                shuffle=False,
                batch_size=5,
                decode=FailOn(set(range(0, 37, 2))),
                on_error="skip",
                max_failures=3,
                num_workers=1,
            )
        ) as loader,
        pytest.raises(LoaderError, match="too many failed samples"),
    ):
        frontend.epoch(loader)


def test_reads_run_ahead_of_the_trainer_by_a_bound_not_by_the_dataset(
    frontend: Driver, numbered: list[str], tmp_path: Path
) -> None:
    """docs/how-it-works/index.md ("Bounded memory"): a trainer that takes its time lets the
    loader run as far ahead as it may, and that is a few batches, not the dataset: of 370
    files, never more than 10 batches' worth are read ahead of the batch the trainer holds
    (seen: 7 in the trainer's process, 3 under construction at io_concurrency=8, 2 ready,
    one in the bridge, one handed over; 9 with a loader process, whose batches also wait in
    the pipe). Reads are counted from outside, by the read hook (tests/helpers.py:
    LoggedRead)."""
    log = tmp_path / "reads"
    ahead: list[int] = []

    def train(batch: object) -> None:
        time.sleep(0.005)  # the trainer takes its time: the loader runs as far ahead as it may
        reads = log.read_bytes().count(b"\n")
        ahead.append(reads - 4 * (len(ahead) + 1))

    loader = Loader(
        numbered * 10,
        batch_size=4,
        shuffle=False,
        decode=decode_number,
        read=LoggedRead(str(log)),
        io_concurrency=8,
        prefetch=2,
        num_workers=1,
    )
    with frontend.opened(loader):
        frontend.for_each(loader, train)
    assert len(ahead) == len(loader) == 93
    assert 4 < max(ahead) <= 10 * 4, ahead


def test_break_then_next_epoch_is_complete(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(
        Loader(numbered, shuffle=False, batch_size=2, decode=SlowDecode(0.01), num_workers=2, prefetch=1)
    ) as loader:
        assert len(frontend.take(loader, 3)) == 3  # a loop left by `break`, work in flight
        assert sorted(flatten(frontend.epoch(loader))) == list(range(37))


def test_new_iteration_supersedes_the_old(frontend: Driver, numbered: list[str]) -> None:
    with frontend.opened(
        Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1)
    ) as loader:
        old = frontend.iter(loader)
        frontend.next(old)
        new = frontend.iter(loader)
        with pytest.raises(LoaderError, match="superseded"):
            frontend.next(old)
        assert len(frontend.rest(new)) == len(loader)


def test_exception_in_body_propagates_unchanged(frontend: Driver, numbered: list[str]) -> None:
    class Boom(Exception):
        pass

    def body(batch: object) -> None:
        raise Boom("from the training loop")

    loader = Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1)
    with pytest.raises(Boom, match="from the training loop"), frontend.opened(loader):
        frontend.for_each(loader, body)  # raised inside the loop's body
    assert loader.state.value == "closed"


def test_iterate_after_close(frontend: Driver, numbered: list[str]) -> None:
    loader = Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1)
    with frontend.opened(loader):
        frontend.epoch(loader)
    frontend.close(loader)  # idempotent
    with pytest.raises(LoaderClosedError, match=re.escape(CLOSED_MESSAGE)):
        frontend.iter(loader)
    with pytest.raises(LoaderClosedError):
        frontend.start(loader)  # loader.start() / entering `async with`


def test_close_while_iterating_raises_closed(frontend: Driver, numbered: list[str]) -> None:
    loader = Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1)
    it = frontend.iter(loader)
    frontend.next(it)
    frontend.close(loader)
    with pytest.raises(LoaderClosedError):
        frontend.next(it)


def test_lazy_start_without_with(frontend: Driver, numbered: list[str]) -> None:
    loader = Loader(numbered, shuffle=False, batch_size=8, decode=decode_number, num_workers=1)
    assert loader.state.value == "idle"
    assert sorted(flatten(frontend.epoch(loader))) == list(range(37))
    assert loader.state.value == "started"
    frontend.close(loader)


# -- one front-end only ---------------------------------------------------------------------
# The sync front-end inside a running event loop: test_lifecycle.py,
# test_sync_for_inside_a_running_event_loop.


@pytest.mark.asyncio
async def test_async_for_never_blocks_the_callers_loop(
    numbered: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ticker on the caller's loop keeps ticking while the loader starts, while it waits
    for each batch and while it closes: each of them waits for ticks (the reads of a batch
    for ticks after the one before it came, through files, ``helpers.ReadAfterTicks``;
    ``start`` and ``close`` on their thread), so a front-end that blocked the loop would
    never finish. Counted in ticks, not seconds."""
    k = 5
    ticks_file, arrivals_file = tmp_path / "ticks", tmp_path / "arrivals"
    ticks_file.touch()
    arrivals_file.touch()
    ticks = [0]
    stop = asyncio.Event()
    loop_thread = threading.get_ident()

    async def ticker() -> None:
        with open(ticks_file, "ab", buffering=0) as f:
            while not stop.is_set():
                await asyncio.sleep(0.001)
                f.write(b".")
                ticks[0] += 1

    held: list[tuple[str, int, int]] = []  # (call, ticks when it began, ticks when it let go)

    def held_for_ticks(name: str) -> None:
        original = getattr(Loader, name)

        def held_open(self: Loader) -> object:
            assert threading.get_ident() != loop_thread, f"{name}() ran on the caller's loop"
            began = ticks[0]
            result = original(self)
            for _ in range(30_000):  # a hang guard: the loop must tick k times meanwhile
                if ticks[0] >= began + k:
                    break
                time.sleep(0.001)
            held.append((name, began, ticks[0]))
            return result

        monkeypatch.setattr(Loader, name, held_open)

    held_for_ticks("start")
    held_for_ticks("close")
    read = ReadAfterTicks(str(ticks_file), str(arrivals_file), batch_size=3, k=k)
    tick = asyncio.create_task(ticker())
    arrived: list[int] = []  # the ticks when the caller began to wait, then as each batch came

    def arrival() -> None:
        arrived.append(ticks[0])
        with open(arrivals_file, "a") as f:
            f.write(f"{ticks[0]}\n")

    batches = []
    loader = Loader(
        numbered[:6],
        shuffle=False,
        batch_size=3,
        decode=decode_number,
        read=read,
        num_workers=1,
        io_concurrency=8,
    )
    async with loader:
        arrival()
        async for batch in loader:
            arrival()
            batches.append(batch)
    stop.set()
    await tick
    assert flatten(batches) == list(range(6))
    # The loop ticked while the caller waited for each batch.
    assert len(arrived) == 3 and all(b >= a + k for a, b in itertools.pairwise(arrived)), arrived
    # start() and close() ran off the loop, which ticked while each of them was held open.
    assert [name for name, _, _ in held] == ["start", "close"]
    assert all(let_go >= began + k for _, began, let_go in held), held
