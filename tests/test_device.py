"""Stage 6, the device copy. The CPU cases run everywhere and go through the same bridging
thread, copier and hand-off as CUDA; the cases marked ``cuda`` need a GPU and are skipped
without one (conftest.py). The loader cases run in both runtimes (``[thread]``, and
``[process]`` with ``loader_process=True``, where the bridge in the trainer's process copies
views of the loader process's slabs), those parametrized by ``device`` once on the CPU and
once on the GPU."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import decode_number, flatten

import aioloader
from aioloader import FileDataset, Loader
from aioloader.base.items import Batch
from aioloader.run.device import SMALL, DeviceCopier, PinnedPool, map_tensors

Pair = namedtuple("Pair", "a b")
RUNTIMES = pytest.mark.parametrize("loader_process", [False, True], ids=["thread", "process"])
DEVICES = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])


def nested_decode(data: bytes) -> dict[str, Any]:
    n = int(decode_number(data)[0])
    return {
        "x": np.full((2, 3), n, dtype=np.float32),
        "meta": {"name": f"s{n}", "none": None},
        "t": (n, [n * 2]),
    }


def test_map_tensors_nested_structures() -> None:
    value = {
        "a": torch.ones(2),
        "b": [np.zeros(3, dtype=np.int16), "text", None, 3, 2.5],
        "c": (torch.zeros(1), b"raw"),
        "d": Pair(np.ones(1), "x"),
    }
    seen: list[torch.Tensor] = []
    out = map_tensors(value, lambda t: seen.append(t) or t * 2)
    assert len(seen) == 4
    assert torch.equal(out["a"], torch.full((2,), 2.0))
    assert isinstance(out["b"][0], torch.Tensor) and out["b"][0].dtype == torch.int16
    assert out["b"][1:] == ["text", None, 3, 2.5]
    assert isinstance(out["c"], tuple) and out["c"][1] == b"raw"
    assert isinstance(out["d"], Pair) and out["d"].b == "x"


def test_cpu_copier_is_a_no_op_that_makes_tensors() -> None:
    copier = DeviceCopier(torch.device("cpu"), pin_memory=True)
    assert copier.pin_memory is False  # pinning means nothing without CUDA
    t = torch.arange(4)
    value, event = copier.to_device({"t": t, "n": np.arange(3)})
    assert event is None and value["t"] is t and isinstance(value["n"], torch.Tensor)
    assert copier.receive(Batch(0, value, 1, event)) is value


class FakeEvent:
    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def test_pinned_pool_reuses_only_after_the_copy_completes() -> None:
    pool = PinnedPool(limit=2, allocate=lambda n: torch.empty(n, dtype=torch.uint8))
    a = pool.acquire(100)
    ev = FakeEvent()
    pool.release_after(ev, [a])
    b = pool.acquire(100)  # a's copy still running: a new buffer, not a
    assert b is not a and pool.allocated == 2
    ev.done = True
    c = pool.acquire(100)
    assert c is a  # reclaimed once its event completed


def test_pinned_pool_is_bounded_and_waits_for_the_oldest_copy() -> None:
    pool = PinnedPool(limit=2, allocate=lambda n: torch.empty(n, dtype=torch.uint8))
    events = []
    for _ in range(100):
        buf = pool.acquire(64)
        ev = FakeEvent()
        events.append(ev)
        pool.release_after(ev, [buf])
    assert pool.allocated == 2
    assert sum(e.waited for e in events) == 98  # every reuse past the bound waited, in order


def test_pinned_pool_goes_over_its_bound_rather_than_fail() -> None:
    """A batch that needs more buffers than the bound (many leaves, or many rows decoded
    again) holds them all, none in flight yet: the pool lends one more."""
    pool = PinnedPool(limit=2, allocate=lambda n: torch.empty(n, dtype=torch.uint8))
    held = [pool.acquire(64) for _ in range(3)]
    assert pool.allocated == 3 and len({b.data_ptr() for b in held}) == 3


def test_pinned_pool_evicts_other_sizes_at_the_bound() -> None:
    pool = PinnedPool(limit=1, allocate=lambda n: torch.empty(n, dtype=torch.uint8))
    pool.release_after(FakeEvent(), [pool.acquire(10)])
    pool._in_flight[0][0].done = True
    assert pool.acquire(20).numel() == 20 and pool.allocated == 1


@RUNTIMES
@DEVICES
def test_nested_batches_through_the_bridge_in_order(
    numbered: list[str], device: str, loader_process: bool
) -> None:
    with Loader(
        numbered,
        shuffle=False,
        batch_size=4,
        decode=nested_decode,
        num_workers=2,
        device=device,
        loader_process=loader_process,
    ) as loader:
        batches = list(loader)
    first = batches[0]
    assert first["x"].device.type == device and first["t"][1][0].device.type == device
    assert [int(v) for b in batches for v in b["x"][:, 0, 0].cpu()] == list(range(37))
    assert first["meta"]["name"] == ["s0", "s1", "s2", "s3"] and first["meta"]["none"] == [None] * 4
    assert first["t"][0].cpu().tolist() == [0, 1, 2, 3] and first["t"][1][0].cpu().tolist() == [0, 2, 4, 6]


def same_batches(got: list[Any], expected: list[Any], device: str) -> None:
    """``got`` on ``device``, equal to ``expected`` (on the CPU), images and labels."""
    assert len(got) == len(expected) > 1
    for (x, y), (xe, ye) in zip(got, expected, strict=True):
        assert x.device.type == device and y.device.type == device
        assert x.dtype == torch.uint8 and y.dtype == torch.int64
        assert torch.equal(x.cpu(), xe) and torch.equal(y.cpu(), ye)


@RUNTIMES
@DEVICES
def test_batches_arrive_on_the_device_equal_to_the_cpu_batches(
    image_folder: Path, device: str, loader_process: bool
) -> None:
    """The same loader with ``device=None`` and with ``device``: the same images and labels,
    bit for bit (random crops and flips included), the batches on ``device``. With CUDA, a
    loader process's batches are copied straight from its slabs (page-locked in the
    trainer), this process's own through pinned staging buffers: a batch's images are above
    ``SMALL`` (a leaf under it is copied from where it lies, staged by the driver, the last
    batch's here). ``close()`` leaves nothing: no staging buffer, no side stream, no GPU
    memory once the batches are dropped (threads, processes, descriptors and slabs: the
    ``no_leaks`` fixture)."""
    ds = FileDataset.from_folder(image_folder)
    assert SMALL < 7 * 3 * 64 * 64  # a full batch's images take the staging path in-process
    kw: dict[str, Any] = {
        "batch_size": 7,
        "decode": aioloader.ImageDecoder(64, crop="random", hflip=True),
        "num_workers": 2,
        "shuffle": True,
        "seed": 3,
        "loader_process": loader_process,
    }
    with Loader(ds, **kw) as reference:
        expected = list(reference)
    on_gpu = torch.cuda.memory_allocated() if device == "cuda" else 0
    with Loader(ds, device=device, **kw) as loader:
        got = list(loader)
        # Internal on purpose: the pinned staging blocks are not observable from outside
        # (torch's caching host allocator pools them with everything else pinned).
        assert loader._runtime is not None
        copier = loader._runtime.copier
        staged = copier.pool.allocated
    same_batches(got, expected, device)
    if device == "cuda":
        # A loader process's slabs are page-locked in the trainer and copied in place; this
        # process's own slabs are not registered: their batches go through staging buffers.
        if loader_process:
            assert copier.direct_bytes > 0 and copier.staged_bytes == 0 and staged == 0
        else:
            assert copier.pin_memory and staged > 0 and copier.staged_bytes > 0, "no pinned staging"
        assert got[0][0].device == torch.device("cuda", torch.cuda.current_device())
    else:
        assert not copier.pin_memory and staged == 0
    assert copier.pool.allocated == 0 and copier.stream is None  # what close() released
    del got
    if device == "cuda":
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == on_gpu  # the batches were the only GPU memory


def test_device_errors_at_construction(numbered: list[str]) -> None:
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            Loader(numbered, device="cuda")
    with pytest.raises(ValueError, match="'cuda:99'"):
        Loader(numbered, device="cuda:99")
    with pytest.raises(ValueError, match="'mps'"):
        Loader(numbered, device="mps")


# -- CUDA only -------------------------------------------------------------------------------


@RUNTIMES
@pytest.mark.cuda
def test_cuda_receive_does_not_synchronise_the_host(numbered: list[str], loader_process: bool) -> None:
    """A long kernel queued on the trainer's stream is still running after a batch is
    received: the hand-off made the stream wait on an event, it did not block the host."""
    with Loader(
        numbered,
        shuffle=False,
        batch_size=4,
        decode=decode_number,
        num_workers=1,
        device="cuda",
        loader_process=loader_process,
    ) as loader:
        it = iter(loader)
        first = next(it)
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time on the trainer's stream
        second = next(it)
        assert not stream.query(), "receiving a batch synchronised the trainer's stream"
        assert second.is_cuda
        torch.cuda.synchronize()
        assert flatten([first.cpu(), second.cpu()]) == list(range(8))


@RUNTIMES
@pytest.mark.cuda
def test_cuda_memory_is_not_reused_while_the_trainer_reads_it(
    numbered: list[str], loader_process: bool
) -> None:
    """Each batch is read by a kernel queued behind a long sleep on the trainer's stream;
    meanwhile the bridge copies more batches. Wrong stream protection (no record_stream,
    or staging reused early) shows up as corrupted sums."""
    sums = []
    with Loader(
        numbered * 3,
        shuffle=False,
        batch_size=3,
        decode=decode_number,
        num_workers=2,
        device="cuda",
        prefetch=4,
        loader_process=loader_process,
    ) as loader:
        for batch in loader:
            torch.cuda._sleep(20_000_000)
            sums.append(batch.sum())
            del batch
        got = [int(s) for s in torch.stack(sums).cpu()]
    values = list(range(37)) * 3
    assert got == [sum(values[i : i + 3]) for i in range(0, len(values), 3)]


@RUNTIMES
@pytest.mark.cuda
def test_cuda_staging_buffers_are_reused(numbered: list[str], loader_process: bool) -> None:
    """256 KiB a batch, 100 batches: in the trainer's process through a few staging buffers
    reused; from a loader process straight from its slabs, page-locked once each (as many
    registrations as the trainer has mappings, not one per batch)."""
    paths = (numbered * 11)[:400]
    with Loader(
        paths,
        shuffle=False,
        batch_size=4,
        decode=big_number,
        num_workers=2,
        device="cuda",
        loader_process=loader_process,
    ) as loader:
        values = [int(b[:, 0, 0].sum()) for b in loader]
        # Internal on purpose: the pinned staging blocks are not observable from outside
        # (torch's caching host allocator pools them with everything else pinned).
        runtime = loader._runtime
        assert runtime is not None
        copier = runtime.copier
        assert len(values) == 100
        if loader_process:
            assert copier.pool.allocated == 0 and copier.staged_bytes == 0
            assert copier.pins is not None and 0 < copier.pins.pinned <= 64
        else:
            assert 0 < copier.pool.allocated <= 4, copier.pool.allocated


def big_number(data: bytes) -> np.ndarray:
    """The file's number in a 64 KiB sample: above the size copied without staging."""
    return np.full((64, 64, 4), float(decode_number(data)[0]), dtype=np.float32)


@RUNTIMES
@pytest.mark.cuda
def test_cuda_bridge_thread_uses_the_loader_device(numbered: list[str], loader_process: bool) -> None:
    last = torch.cuda.device_count() - 1
    with Loader(
        numbered,
        shuffle=False,
        batch_size=4,
        decode=decode_number,
        num_workers=1,
        device=f"cuda:{last}",
        loader_process=loader_process,
    ) as loader:
        batch = next(iter(loader))
        assert batch.device == torch.device("cuda", last)
        # Internal on purpose: a thread's current CUDA device cannot be read from another thread.
        assert loader._runtime is not None and loader._runtime.copier.thread_device == last
        for other in range(torch.cuda.device_count()):
            if other != last:  # no stray context or allocation on another GPU
                assert torch.cuda.memory_reserved(other) == 0
