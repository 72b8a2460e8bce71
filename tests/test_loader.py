"""The loader through both front-ends: every case runs once through ``for``/``with``
(``[sync]``) and once through ``async for``/``async with`` (``[async]``), by the ``frontend``
fixture (conftest.py, frontends.py), and each of those once in the trainer's process
(``[thread]``) and once with ``loader_process=True`` (``[process]``). What only one
front-end can show is a single test at the end."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from frontends import Driver
from helpers import FailOn, RuntimeWatch, SlowDecode, decode_number, flatten, random_draw

import aioloader
from aioloader import DecodeError, FileDataset, Loader, LoaderClosedError, LoaderError, ReadError
from aioloader.config import LoaderConfig
from aioloader.loader import CLOSED_MESSAGE


@pytest.fixture(autouse=True, params=["thread", "process"])
def where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, runtimes: RuntimeWatch) -> str:
    """Where the pipeline runs: every Loader of the test gets ``loader_process=True`` for
    ``[process]`` (the argument every user would pass). The test fails when one ran
    elsewhere (``runtimes``, conftest.py): in-process for ``[process]`` (no zygote could be
    made), or in a loader process for ``[thread]``."""
    runtimes.expect(request.param == "process")
    if request.param == "process":
        create = LoaderConfig.create

        def with_process(**kw: object) -> LoaderConfig:
            return create(**{**kw, "loader_process": True})

        monkeypatch.setattr(LoaderConfig, "create", with_process)
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
    with frontend.opened(Loader(numbered[:3], shuffle=False, batch_size=3, decode=None)) as loader:
        (batch,) = frontend.epoch(loader)
    assert batch == [b"sample-000000", b"sample-000001", b"sample-000002"]


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
async def test_async_for_never_blocks_the_callers_loop(numbered: list[str]) -> None:
    """A ticker on the caller's loop keeps ticking while batches are slow to come: waiting
    for data, starting and closing all happen off the caller's loop."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t - 0.005)

    tick = asyncio.create_task(ticker())
    # Each batch takes ~0.6 s to decode: a blocking front-end would stall the ticker that long.
    async with Loader(
        numbered[:6], shuffle=False, batch_size=3, decode=SlowDecode(0.3), num_workers=1
    ) as loader:
        batches = [b async for b in loader]
    stop.set()
    await tick
    assert len(batches) == 2
    assert len(lags) > 50  # it kept ticking the whole time
    assert max(lags) < 0.25, f"the caller's loop stalled for {max(lags):.3f} s"
