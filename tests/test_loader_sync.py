"""The loader through ``for`` and ``with``. Mirrored case for case by test_loader_async.py."""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FailOn, SlowDecode, decode_number, flatten, random_draw

import aioloader
from aioloader import DecodeError, FileDataset, Loader, LoaderClosedError, LoaderError, ReadError
from aioloader.loader import CLOSED_MESSAGE


def epoch(loader: Loader) -> list[object]:
    return list(loader)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 5, 37, 64])
def test_every_sample_once_per_epoch(
    numbered: list[str], shuffle: bool, drop_last: bool, batch_size: int
) -> None:
    with Loader(
        numbered,
        batch_size=batch_size,
        decode=decode_number,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=2,
    ) as loader:
        for e in range(2):
            loader.set_epoch(e)
            batches = epoch(loader)
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


def test_order_depends_only_on_seed_and_epoch(numbered: list[str]) -> None:
    def run(seed: int, ep: int, workers: int, io: int) -> list[int]:
        with Loader(
            numbered,
            batch_size=4,
            decode=decode_number,
            shuffle=True,
            seed=seed,
            num_workers=workers,
            io_concurrency=io,
        ) as loader:
            loader.set_epoch(ep)
            return flatten(epoch(loader))

    base = run(7, 3, 1, 1)
    assert run(7, 3, 3, 64) == base  # same batches whatever the workers and read concurrency
    assert run(7, 4, 2, 8) != base
    assert run(8, 3, 2, 8) != base
    assert sorted(base) == list(range(37))


def test_epochs_advance_without_set_epoch(numbered: list[str]) -> None:
    with Loader(numbered, batch_size=8, decode=decode_number, shuffle=True, num_workers=1) as loader:
        first, second = flatten(epoch(loader)), flatten(epoch(loader))
        assert loader.epoch == 1
        loader.set_epoch(0)
        assert flatten(epoch(loader)) == first
    assert first != second and sorted(first) == sorted(second)


def test_unordered_delivers_every_sample(numbered: list[str]) -> None:
    with Loader(
        numbered, batch_size=5, decode=decode_number, ordered=False, shuffle=True, num_workers=2
    ) as loader:
        batches = epoch(loader)
    assert len(batches) == len(loader) == 8
    assert sorted(flatten(batches)) == list(range(37))


def test_images_with_labels(image_folder: Path) -> None:
    ds = FileDataset.from_folder(image_folder)
    with Loader(ds, shuffle=False, batch_size=8, decode=aioloader.ImageDecoder(32), num_workers=2) as loader:
        batches = epoch(loader)
    images, labels = batches[0]
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 32, 32)
    assert labels.dtype == torch.int64 and labels.shape == (8,)
    all_labels = torch.cat([b[1] for b in batches]).tolist()
    assert Counter(all_labels) == Counter(ds.labels.tolist())  # type: ignore[union-attr]
    # Same pixels as decoding the file in this process: nothing is lost or mixed up.
    decoder = aioloader.ImageDecoder(32)
    expected = decoder(Path(ds.path(0)).read_bytes())
    assert np.array_equal(images[0].numpy(), expected)


def test_raw_bytes_without_decode(numbered: list[str]) -> None:
    with Loader(numbered[:3], shuffle=False, batch_size=3, decode=None) as loader:
        (batch,) = epoch(loader)
    assert batch == [b"sample-000000", b"sample-000001", b"sample-000002"]


def test_augmentation_seeded_by_seed_epoch_index(numbered: list[str]) -> None:
    def draws(workers: int, ep: int) -> dict[int, float]:
        with Loader(numbered, batch_size=6, decode=random_draw, shuffle=True, num_workers=workers) as loader:
            loader.set_epoch(ep)
            rows = torch.cat(epoch(loader))
        return {int(r[0]): float(r[1]) for r in rows}

    one = draws(1, 0)
    assert draws(3, 0) == one
    assert draws(1, 1) != one


def test_stats(numbered: list[str]) -> None:
    with Loader(numbered, shuffle=False, batch_size=10, decode=decode_number, num_workers=1) as loader:
        epoch(loader)
        epoch(loader)
        s = loader.stats
    assert (s.samples, s.batches, s.epoch, s.epoch_samples, s.epoch_batches) == (74, 8, 1, 37, 4)
    assert s.bytes_read == 2 * sum(len(Path(p).read_bytes()) for p in numbered)
    assert s.wait_seconds >= s.epoch_wait_seconds >= 0 and s.epoch_seconds > 0
    assert s.first_batch_seconds is not None


def test_read_error_names_file_and_loader_stays_usable(tmp_path: Path, numbered: list[str]) -> None:
    paths = [*numbered[:5], str(tmp_path / "missing.txt"), *numbered[5:10]]
    with Loader(paths, shuffle=False, batch_size=2, decode=decode_number, num_workers=1) as loader:
        it = iter(loader)
        assert flatten([next(it), next(it)]) == [0, 1, 2, 3]
        with pytest.raises(ReadError) as info:
            next(it)
        assert info.value.path == paths[5] and info.value.index == 5
        assert "missing.txt" in str(info.value)
        assert isinstance(info.value.__cause__, FileNotFoundError)
        with pytest.raises(StopIteration):
            next(it)
        loader.set_epoch(1)
        with pytest.raises(ReadError):  # the next epoch runs again, and fails on the same file
            epoch(loader)


def test_empty_file_is_a_read_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with (
        Loader([empty], shuffle=False, batch_size=1, decode=decode_number, num_workers=1) as loader,
        pytest.raises(ReadError, match="empty file"),
    ):
        epoch(loader)


def test_decode_error_keeps_cause_and_worker_traceback(numbered: list[str]) -> None:
    with Loader(numbered, shuffle=False, batch_size=4, decode=FailOn({9}, KeyError), num_workers=2) as loader:
        with pytest.raises(DecodeError) as info:
            epoch(loader)
        err = info.value
        assert err.index == 9 and err.path == numbered[9]
        assert type(err.__cause__) is KeyError and "bad sample 9" in str(err.__cause__)
        assert "boom" in err.worker_traceback and "boom" in str(err)
        # Usable afterwards: the next iteration delivers the batches before the bad sample.
        it = iter(loader)
        assert flatten([next(it), next(it)]) == list(range(8))


def test_skip_counts_and_warns_once(numbered: list[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioloader")
    with Loader(
        numbered, shuffle=False, batch_size=5, decode=FailOn({3, 20}), on_error="skip", num_workers=2
    ) as loader:
        got = flatten(epoch(loader))
        got2 = flatten(epoch(loader))
        stats = loader.stats
    assert sorted(got) == sorted(got2) == [i for i in range(37) if i not in (3, 20)]
    assert stats.failures == 4 and stats.failures_by_reason == {"DecodeError": 4}
    warned = [r for r in caplog.records if r.name == "aioloader"]
    assert len(warned) == 2  # once per file per loader, not once per epoch


def test_max_failures_gives_up(numbered: list[str]) -> None:
    with (
        Loader(
            numbered,
            shuffle=False,
            batch_size=5,
            decode=FailOn(set(range(0, 37, 2))),
            on_error="skip",
            max_failures=3,
            num_workers=1,
        ) as loader,
        pytest.raises(LoaderError, match="too many failed samples"),
    ):
        epoch(loader)


def test_break_then_next_epoch_is_complete(numbered: list[str]) -> None:
    with Loader(
        numbered, shuffle=False, batch_size=2, decode=SlowDecode(0.01), num_workers=2, prefetch=1
    ) as loader:
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert sorted(flatten(epoch(loader))) == list(range(37))


def test_new_iteration_supersedes_the_old(numbered: list[str]) -> None:
    with Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1) as loader:
        old = iter(loader)
        next(old)
        new = iter(loader)
        with pytest.raises(LoaderError, match="superseded"):
            next(old)
        assert len(list(new)) == len(loader)


def test_exception_in_body_propagates_unchanged(numbered: list[str]) -> None:
    class Boom(Exception):
        pass

    loader = Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1)
    with pytest.raises(Boom, match="from the training loop"), loader:
        for _ in loader:
            raise Boom("from the training loop")
    assert loader.state.value == "closed"


def test_iterate_after_close(numbered: list[str]) -> None:
    loader = Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1)
    with loader:
        epoch(loader)
    loader.close()  # idempotent
    with pytest.raises(LoaderClosedError, match=re.escape(CLOSED_MESSAGE)):
        iter(loader)
    with pytest.raises(LoaderClosedError):
        loader.start()


def test_close_while_iterating_raises_closed(numbered: list[str]) -> None:
    loader = Loader(numbered, shuffle=False, batch_size=4, decode=decode_number, num_workers=1)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(LoaderClosedError):
        next(it)


def test_lazy_start_without_with(numbered: list[str]) -> None:
    loader = Loader(numbered, shuffle=False, batch_size=8, decode=decode_number, num_workers=1)
    assert loader.state.value == "idle"
    assert sorted(flatten(epoch(loader))) == list(range(37))
    assert loader.state.value == "started"
    loader.close()
