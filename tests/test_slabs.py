"""The shared-memory slab path: workers decode into batch slabs that become the batch
tensors without a copy. The autouse ``no_leaks`` fixture also fails any test that leaves an
``aioloader-*`` segment in /dev/shm."""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FixedShape, decode_head, decode_number, shm_mapping, shm_segments, write_sized_files

import aioloader
from aioloader import FileDataset, Loader, LoaderError
from aioloader.decode.layout import SampleLayout
from aioloader.decode.slabs import SlabPool, shm_available

pytestmark = pytest.mark.skipif(not shm_available(), reason="needs /dev/shm")


def segments() -> set[str]:
    """This process's segments (see helpers.shm_segments)."""
    return shm_segments()


def test_slab_batches_are_views_of_shared_memory(numbered: list[str]) -> None:
    with Loader(numbered, batch_size=5, shuffle=False, decode=FixedShape(), num_workers=2) as loader:
        batches = list(loader)
        live = segments()
        assert len(live) >= 1
        # Each batch's memory is one of this process's segments in /dev/shm: no copy.
        assert all(shm_mapping(b) in live for b in batches)
    values = [int(v) for b in batches for v in b[:, 0, 0]]
    assert values == list(range(37))
    assert batches[0].shape == (5, 2, 3) and batches[0].dtype == torch.uint8
    # The segments are unlinked at close even though these tensors still map them, and the
    # tensors stay valid.
    assert segments() == set()
    assert all(shm_mapping(b) in live for b in batches)
    assert int(batches[3][0, 1, 2]) == 15


def test_held_batches_never_change_and_the_pool_recycles(numbered: list[str]) -> None:
    paths = numbered * 4  # 148 samples, 30 batches: far more than the pooled slabs
    with Loader(paths, batch_size=5, shuffle=False, decode=FixedShape(), num_workers=2, prefetch=1) as loader:
        held = list(loader)  # every batch kept: the pool must not reuse their slabs
        held_in = {shm_mapping(b) for b in held}
        assert None not in held_in and len(held_in) == len(held)  # a segment each
        assert held_in <= segments()
        snapshot = [b.clone() for b in held]
        list(loader)  # another epoch while the first one is still held
        assert all(torch.equal(a, b) for a, b in zip(held, snapshot, strict=True))
        del held, snapshot
        gc.collect()
        pooled = segments()
        assert len(pooled) < len(held_in)  # one-shot slabs went away, the bounded pool stays
        seen: set[str | None] = set()
        for b in loader:  # batches dropped as we go: slabs are recycled, none made
            seen.add(shm_mapping(b))
            seen |= segments()
        assert seen <= pooled
        assert segments() <= pooled


def test_zero_copy_off_returns_owned_batches(numbered: list[str]) -> None:
    with Loader(
        numbered, batch_size=5, shuffle=False, decode=FixedShape(), num_workers=1, zero_copy=False
    ) as loader:
        held = [b for _ in range(5) for b in loader]
        assert all(shm_mapping(b) is None for b in held)  # copies, in memory of their own
        assert len(segments()) < len(held)  # so holding them pins no slab: the pool stays bounded
    assert [int(v) for b in held[:8] for v in b[:, 0, 0]] == list(range(37))


def test_samples_that_do_not_fit_fall_back_to_pickle(numbered: list[str]) -> None:
    """A sample whose shape is not the declared one comes back pickled; with a custom
    collate the batch is still built."""

    def flat(samples: list[np.ndarray]) -> list[int]:
        return [int(s.reshape(-1)[0]) for s in samples]

    with Loader(
        numbered, batch_size=5, shuffle=False, decode=FixedShape(frozenset({7})), num_workers=1
    ) as loader:
        it = iter(loader)
        assert next(it).shape == (5, 2, 3)
        with pytest.raises(LoaderError, match="collate failed for batch 1"):
            next(it)  # default collate cannot stack (4,) with (2, 3): a clear error
    with Loader(
        numbered, batch_size=5, shuffle=False, decode=FixedShape(frozenset({7})), collate=flat, num_workers=1
    ) as loader:
        assert [v for b in loader for v in b] == list(range(37))


def test_files_larger_than_the_arena_still_load(tmp_path: Path) -> None:
    sizes = [3_000_000, 100, 5_000_000, 50_000, 2_000_000, 20]
    paths = write_sized_files(tmp_path / "sized", sizes)
    with Loader(paths, batch_size=2, shuffle=False, decode=decode_head, num_workers=2) as loader:
        for _ in range(2):  # the second epoch runs with arenas grown to the sizes seen
            rows = [tuple(r.tolist()) for b in loader for r in b]
            assert rows == [(i, s) for i, s in enumerate(sizes)]


def test_images_through_slabs_match_in_process_decode(image_folder: Path) -> None:
    ds = FileDataset.from_folder(image_folder)
    decoder = aioloader.ImageDecoder(24)
    with Loader(ds, batch_size=8, shuffle=True, decode=decoder, num_workers=2) as loader:
        loader.set_epoch(3)
        batches = list(loader)
    images = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    expected = {ds.path(i): decoder(Path(ds.path(i)).read_bytes()) for i in range(len(ds))}
    matched = sum(any(np.array_equal(img.numpy(), e) for e in expected.values()) for img in images)
    assert matched == len(ds) == len(labels)


def test_shared_memory_exhaustion_is_a_clear_error(
    numbered: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with (
        Loader(numbered, batch_size=5, decode=FixedShape(), num_workers=1) as loader,
        pytest.raises(LoaderError, match=r"cannot allocate a .* MiB shared-memory batch slab in /dev/shm"),
    ):
        list(loader)
    assert segments() == set()


def test_segments_are_gone_after_errors_and_gc(numbered: list[str], tmp_path: Path) -> None:
    bad = [*numbered[:6], str(tmp_path / "missing")]
    loader = Loader(bad, batch_size=3, decode=FixedShape(), num_workers=1)
    with pytest.raises(aioloader.ReadError):
        list(loader)
    assert segments()
    del loader
    gc.collect()
    assert segments() == set()


def test_pool_unit_bounded_reuse() -> None:
    pool = SlabPool(4, pooled=2, sample=SampleLayout.declared((3,)))
    try:
        pool.want(SampleLayout.declared((3,)), in_size=1024, out_size=0)
        a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
        assert (a.pooled, b.pooled, c.pooled) == (True, True, False)
        assert pool.live == 3
        pool.release(c)  # one-shot: unlinked at once
        assert pool.live == 2 and not os.path.exists(c.path)
        pool.release(a)
        pool.release(a)  # a second release of a free slab changes nothing
        assert pool.acquire() is a  # pooled: reused
        pool.want(SampleLayout.declared((3,)), in_size=4096, out_size=0)
        pool.release(b)
        d = pool.acquire()  # b's arena is too small now: replaced
        assert d is not b and d.layout.input_size == 4096 and not os.path.exists(b.path)
        pool.want(SampleLayout.declared((5,)), in_size=4096, out_size=100)
        pool.release(d)
        e = pool.acquire()  # a new sample layout: rows blocks of another size
        assert e is not d and e.layout.sample == SampleLayout.declared((5,)) and e.layout.out_size == 100
        assert decode_number(b"sample-000001")[0] == 1
    finally:
        pool.close()
    assert segments() == set()
