"""The device copy without a host staging copy (issue 32, part 1), run without a GPU.

The copier's CUDA calls are one part (:class:`~aioloader.run.device.DeviceOps`); here a part
whose "device copy" completes later, on a thread of its own that reads the source only
then, stands in for a side stream. A slab given back to the loader before its copy completed
would be written with the next batch before it is read, and a batch would differ from the
reference: so these tests fail if a slab is released early. Registration goes through a
registrar that records its calls and checks, in ``/proc/self/maps``, that what it releases is
still mapped. The real CUDA calls run in the ``cuda``-marked tests of test_device.py.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import aioloader
from aioloader import FileDataset, Loader
from aioloader.run import procruntime, runtime
from aioloader.run.device import DeviceCopier
from aioloader.run.pinning import HostPins
from aioloader.run.staging import host_copy
from aioloader.synthetic import make_image_folder


def mapped(address: int) -> bool:
    """Whether ``address`` lies in a mapping of this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


class Registrar:
    """Records registrations; ``refuse`` makes every one fail, as a driver without it would."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.live: dict[int, int] = {}
        self.registered = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def register(self, address: int, size: int) -> tuple[str, bool] | None:
        with self.lock:
            if self.refuse:
                return "operation not supported", True
            if address in self.live:
                self.errors.append(f"{address:#x} registered twice")
            if not mapped(address) or not mapped(address + size - 1):
                self.errors.append(f"{address:#x} registered but not mapped")
            self.live[address] = size
            self.registered += 1
            return None

    def unregister(self, address: int) -> None:
        with self.lock:
            if self.live.pop(address, None) is None:
                self.errors.append(f"{address:#x} released but not registered")
            if not mapped(address):
                self.errors.append(f"{address:#x} released after it was unmapped")


class LateEvent:
    def __init__(self, ops: LateOps) -> None:
        self.ops = ops
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.ops.complete(self)


class LateOps:
    """A "device" as slow as the rules allow: a copy from page-locked memory happens only
    when an event recorded after it is waited for (or at close), in issue order, and reads
    its source then, by address (as a GPU's DMA engine does). Memory given back before its
    copy's event was waited for has been reused by then, and the batch differs."""

    def __init__(self, registrar: Registrar) -> None:
        self._registrar = registrar
        self._work: list[Any] = []
        self._lock = threading.Lock()
        self.stream: object | None = None
        self.thread_device = 0
        self.staging: set[int] = set()  # addresses of the staging buffers

    def start(self) -> None:
        self.stream = object()

    def complete(self, upto: LateEvent | None) -> None:
        """Do the copies issued before ``upto`` (None: all of them)."""
        with self._lock:
            while self._work and (upto is None or not upto.done):
                job = self._work.pop(0)
                if isinstance(job, LateEvent):
                    job.done = True
                    continue
                address, nbytes, out = job
                raw = (ctypes.c_uint8 * nbytes).from_address(address)
                out.view(-1).view(torch.uint8).copy_(torch.frombuffer(raw, dtype=torch.uint8))

    def copy(self, src: torch.Tensor) -> torch.Tensor:
        """As CUDA does: from page-locked memory (registered, or a staging buffer) the copy
        is asynchronous and, like a DMA engine, holds the source's address, not a reference
        to it, so the memory must stay as it is until the copy's event completes; from
        pageable memory it is done before the call returns."""
        out = torch.empty(src.shape, dtype=src.dtype)
        nbytes = src.numel() * src.element_size()
        locked = self.locked(src.data_ptr(), nbytes) or src.data_ptr() in self.staging
        if not (src.is_contiguous() and locked):
            out.copy_(src)
            return out
        with self._lock:
            self._work.append((src.data_ptr(), nbytes, out))
        return out

    def locked(self, address: int, nbytes: int) -> bool:
        with self._registrar.lock:
            return any(a <= address and address + nbytes <= a + n for a, n in self._registrar.live.items())

    def record(self) -> LateEvent:
        event = LateEvent(self)
        with self._lock:
            self._work.append(event)
        return event

    def wait(self, event: Any) -> None:
        """As a stream's ``wait_event``: the host does not wait. The tests read what they
        received only after the loader closed (which waits for every copy)."""

    def protect(self, t: torch.Tensor, stream: Any) -> None:
        pass

    def allocate_pinned(self, nbytes: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        self.staging.add(buf.data_ptr())
        return buf

    def registrar(self) -> Registrar:
        return self._registrar

    def close(self) -> None:
        self.complete(None)
        self.stream = None


@pytest.fixture
def late(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Every loader of the test copies through :class:`LateOps` to a stand-in "cuda"."""
    made: dict[str, Any] = {"registrar": Registrar(refuse=getattr(request, "param", False)), "copiers": []}

    def copier(device: torch.device, pin_memory: bool) -> DeviceCopier:
        c = DeviceCopier(torch.device("cuda"), True, ops=LateOps(made["registrar"]))
        made["copiers"].append(c)
        return c

    monkeypatch.setattr(procruntime, "DeviceCopier", copier)
    monkeypatch.setattr(runtime, "DeviceCopier", copier)
    return made


def load(folder: Path, **kw: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ds = FileDataset.from_folder(folder)
    with Loader(
        ds,
        batch_size=4,
        decode=aioloader.ImageDecoder(80, crop="random", hflip=True),  # 77 KB a batch: above SMALL
        num_workers=2,
        shuffle=True,
        seed=5,
        prefetch=1,
        **kw,
    ) as loader:
        # Kept as received, read after close: a late copy may still be filling them now.
        return list(loader)


def same(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected) > 1
    for (x, y), (xe, ye) in zip(got, expected, strict=True):
        assert torch.equal(x, xe) and torch.equal(y, ye)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough images (30 batches) for the loader to reuse each slab several times."""
    return make_image_folder(tmp_path_factory.mktemp("pinning"), num_images=120, num_classes=3, size=(96, 72))


@pytest.fixture(scope="module")
def reference(images: Path) -> list[Any]:
    return load(images, loader_process=False)


def test_copies_read_the_page_locked_slabs_where_they_are(
    images: Path, late: dict[str, Any], reference: list[Any]
) -> None:
    """In a loader process (the default), every batch's copy reads the trainer's mapping of
    its slab, page-locked once when mapped and released before it is unmapped; no byte is
    staged; each slab goes back only once its copy completed (else the batches would differ:
    the copies are late and the pool is small)."""
    got = load(images, loader_process=True)
    same(got, reference)
    (copier,) = late["copiers"]
    registrar: Registrar = late["registrar"]
    assert copier.direct_bytes > 0 and copier.staged_bytes == 0
    assert copier.pool.allocated == 0
    assert registrar.registered >= 1 and not registrar.errors
    assert registrar.live == {}  # every registration released at close, each while still mapped


@pytest.mark.parametrize("late", [True], indirect=True, ids=["refused"])
def test_refused_registration_stages_every_batch(
    images: Path, late: dict[str, Any], reference: list[Any]
) -> None:
    got = load(images, loader_process=True)
    same(got, reference)
    (copier,) = late["copiers"]
    assert copier.direct_bytes == 0 and copier.staged_bytes > 0
    assert copier.pins is not None and copier.pins.refused == "operation not supported"
    assert late["registrar"].registered == 0


def test_in_the_trainers_process_batches_are_staged(
    images: Path, late: dict[str, Any], reference: list[Any]
) -> None:
    """``loader_process=False``: the slabs are this process's own, not registered; the
    staging copy (single-threaded) carries them, and the staging buffers are reused only once
    their copy completed."""
    got = load(images, loader_process=False)
    same(got, reference)
    (copier,) = late["copiers"]
    assert copier.staged_bytes > 0 and copier.direct_bytes == 0
    assert late["registrar"].registered == 0


@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex128]
)
def test_host_copy_is_exact_for_every_dtype_and_layout(dtype: torch.dtype) -> None:
    src = (torch.arange(2 * 3 * 5 * 7) % 251).reshape(2, 3, 5, 7).to(dtype)
    views = [src, src.transpose(1, 3), src[:, ::2], src.permute(3, 2, 1, 0)]
    if dtype.is_complex:
        views.append(src.conj())  # a lazy conjugate: its bit resolved, not its memory copied
    for view in views:
        dst = torch.empty(view.shape, dtype=dtype)
        host_copy(dst, view)
        assert torch.equal(dst, view.resolve_conj())


def test_host_copy_leaves_the_intra_op_pool_alone() -> None:
    """The staging copy is NumPy's, on the calling thread: PyTorch's thread setting is not
    touched (``set_num_threads(1)`` would be a process-wide default)."""
    before = torch.get_num_threads()
    big = torch.ones(4_000_000, dtype=torch.uint8)
    out = torch.empty_like(big)
    host_copy(out, big)
    assert torch.equal(out, big) and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="host_copy"):
        host_copy(torch.empty(3), torch.empty(4))


def test_host_pins_bookkeeping() -> None:
    import mmap

    registrar = Registrar()
    pins = HostPins(registrar)
    a, b = mmap.mmap(-1, 1 << 16), mmap.mmap(-1, 1 << 12)
    assert pins.pin(a) and pins.pin(a) and pins.pin(b)  # a second pin is no new registration
    assert registrar.registered == 2 and pins.pinned == 2
    base = np.frombuffer(a, dtype=np.uint8).ctypes.data
    assert pins.covers(base + 100, 1000) and not pins.covers(base + (1 << 16) - 10, 100)
    pins.unpin(a)
    assert pins.pinned == 1 and not pins.covers(base, 1)
    pins.close()
    assert registrar.live == {} and not registrar.errors
    a.close()
    b.close()
