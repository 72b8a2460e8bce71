"""Zero-copy for any decoder: outputs nobody declared travel through shared memory.

The loader learns the layout of a plain function's samples from the first batch; after it,
workers write each array of a sample into its row of the batch slab, and the batch tensors
are the slab itself. Whether a tensor views shared memory (a ``/memfd:aioloader-...``
mapping, or a ``/dev/shm/aioloader-...`` one for the fallback) is read from the outside, in
/proc/self/maps, never from the loader's internals. A loader whose memory a test reads here,
or whose collate records here what it was given, runs in-process (``loader_process=False``);
a loader process's slabs are test_loader_process.py's.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import (
    FailingImage,
    number_dict,
    number_image,
    number_ragged,
    number_tensor,
    shm_mapping,
    shm_segments,
    slab_mappings,
)

from aioloader import Loader
from aioloader.memory.slabs import shm_available

pytestmark = pytest.mark.skipif(not shm_available(), reason="needs shared memory (memfd or /dev/shm)")


def in_shared_memory(t: torch.Tensor) -> bool:
    """``t`` views one of this process's slabs (helpers.shm_mapping)."""
    return shm_mapping(t) is not None


def numbers(batch: torch.Tensor) -> list[int]:
    return [int(v) for v in batch.reshape(len(batch), -1)[:, 0]]


def test_plain_function_batches_become_views_of_shared_memory(numbered: list[str]) -> None:
    with Loader(
        numbered,
        batch_size=4,
        decode=number_image,
        shuffle=False,
        num_workers=2,
        io_concurrency=4,
        loader_process=False,
    ) as loader:
        epochs = [list(loader) for _ in range(2)]
    for batches in epochs:
        assert [n for b in batches for n in numbers(b)] == list(range(37))
        assert all(b.dtype == torch.uint8 and b.shape[1:] == (3, 4, 5) for b in batches)
    # The first batches (those begun before one finished: a window of 2 here) teach the
    # layout and come through the pipe; the rest, and the whole second epoch, are the slabs.
    assert all(in_shared_memory(b) for b in epochs[1][:-1])
    assert [in_shared_memory(b) for b in epochs[0]][2:-1] == [True] * 7
    # Held batches stay valid after close; the slabs are closed, and once no batch is held
    # nothing of them is left in this process.
    assert numbers(epochs[1][3]) == [12, 13, 14, 15]
    del epochs, batches
    gc.collect()
    assert shm_segments() == set() and slab_mappings() == []


def test_tensor_outputs_stay_tensors_and_travel_by_shared_memory(numbered: list[str]) -> None:
    kw = {"decode": number_tensor, "num_workers": 2, "loader_process": False}
    with Loader(numbered, batch_size=5, shuffle=False, **kw) as loader:
        list(loader)
        batches = list(loader)
    assert all(b.dtype == torch.float32 and b.shape[1:] == (2, 3) for b in batches)
    assert [n for b in batches for n in numbers(b)] == list(range(37))
    assert all(in_shared_memory(b) for b in batches[:-1])


def test_nested_dict_outputs_collate_in_place(numbered: list[str]) -> None:
    kw = {"decode": number_dict, "num_workers": 2, "loader_process": False}
    with Loader(numbered, batch_size=4, shuffle=False, **kw) as loader:
        list(loader)
        batches = list(loader)
    b = batches[2]
    assert b["image"].dtype == torch.int32 and b["image"].shape == (4, 2, 2)
    assert b["meta"]["n"].tolist() == [8, 9, 10, 11] and b["meta"]["n"].dtype == torch.int64
    assert b["meta"]["half"].tolist() == [4.0, 4.5, 5.0, 5.5] and b["meta"]["half"].dtype == torch.float64
    assert b["meta"]["name"] == ["s8", "s9", "s10", "s11"]
    assert b["meta"]["none"] == [None] * 4
    assert torch.equal(b["pair"][0][:, 0], torch.tensor([8.0, 9.0, 10.0, 11.0], dtype=torch.float64))
    assert b["pair"][1].tolist() == [True, False, True, False]
    assert isinstance(b["pair"], tuple)
    assert in_shared_memory(b["image"]) and in_shared_memory(b["pair"][0])
    assert [n for batch in batches for n in batch["meta"]["n"].tolist()] == list(range(37))


def test_holding_one_leaf_keeps_its_slab(numbered: list[str]) -> None:
    """A slab is reused only when every tensor viewing it is gone: keeping one leaf of a
    batch keeps the whole slab, and its values never change."""
    with Loader(
        numbered, batch_size=4, decode=number_dict, shuffle=False, num_workers=2, prefetch=1
    ) as loader:
        held = [b["pair"][0] for b in loader]  # the other leaves are dropped at once
        snapshot = [t.clone() for t in held]
        for _ in range(3):
            for batch in loader:
                del batch
        gc.collect()
        assert all(torch.equal(a, b) for a, b in zip(held, snapshot, strict=True))


class Collected:
    """A custom collate that records what it was given (the loader calls it on a thread)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def __call__(self, samples: list[Any]) -> list[Any]:
        self.kinds.extend(type(s).__name__ for s in samples)
        return samples


def test_varying_shapes_reach_a_custom_collate_as_shared_memory_views(numbered: list[str]) -> None:
    collate = Collected()
    with Loader(
        numbered,
        batch_size=6,
        decode=number_ragged,
        collate=collate,
        shuffle=False,
        num_workers=2,
        loader_process=False,
    ) as loader:
        first = list(loader)
        views_seen: list[bool] = []
        second = []
        for batch in loader:
            # Numpy stays numpy inside the collate; the bridge makes tensors of what it returns.
            views_seen.extend(in_shared_memory(arr) for arr in batch)
            second.append(batch)
    assert set(collate.kinds) == {"ndarray"}
    for batches in (first, second):
        got = [(int(arr[0, 0]), tuple(arr.shape)) for batch in batches for arr in batch]
        assert got == [(n, (n % 4 + 1, 2)) for n in range(37)]
    # Once the loader knows the shapes vary, samples come as views of the output area.
    assert all(views_seen)


def test_skipped_rows_are_gathered_into_a_copy(numbered: list[str]) -> None:
    with Loader(
        numbered,
        batch_size=5,
        decode=FailingImage(frozenset({7, 8})),
        on_error="skip",
        shuffle=False,
        num_workers=2,
        loader_process=False,
    ) as loader:
        list(loader)
        batches = list(loader)
    got = [n for b in batches for n in numbers(b)]
    assert got == [n for n in range(37) if n not in (7, 8)]
    assert len(batches[1]) == 3 and not in_shared_memory(batches[1])  # rows 7, 8 left out
    assert in_shared_memory(batches[2])


def test_zero_copy_off_hands_out_owned_memory(numbered: list[str]) -> None:
    with Loader(
        numbered,
        batch_size=4,
        decode=number_dict,
        shuffle=False,
        num_workers=1,
        zero_copy=False,
        loader_process=False,
    ) as loader:
        batches = [b for _ in range(2) for b in loader]
    assert not any(in_shared_memory(b["image"]) for b in batches)
    assert [n for b in batches[:10] for n in b["meta"]["n"].tolist()] == list(range(37))


def test_first_batch_samples_match_in_process_decode(numbered: list[str], tmp_path: Path) -> None:
    with Loader(numbered, batch_size=8, decode=number_image, shuffle=True, seed=3, num_workers=2) as loader:
        batches = list(loader)
    flat = torch.cat(batches)
    by_number = {numbers(flat[i : i + 1])[0]: flat[i] for i in range(len(flat))}
    for path in numbered:
        expected = number_image(Path(path).read_bytes())
        n = int(expected[0, 0, 0])
        assert np.array_equal(by_number[n].numpy(), expected)
