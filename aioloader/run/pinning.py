"""Page-locking the trainer's mappings of the loader's slabs, once for each mapping's life.

A host-to-device copy with ``non_blocking=True`` is asynchronous only from page-locked
memory. Rather than copying each batch into a pinned staging buffer (one more pass over every
batch, and, through ``Tensor.copy_``, work for every thread of PyTorch's intra-op pool),
the trainer page-locks the slab itself when it first maps it (``cudaHostRegister``, as
torchstore does for ``/dev/shm`` tensors) and copies straight from it. A mapping stays
registered while it is mapped: :class:`~aioloader.run.wire.SlabMaps` calls :meth:`HostPins.pin`
after mapping and :meth:`HostPins.unpin` before unmapping, and a slab is reused only after the
copies reading it have completed (:meth:`~aioloader.run.device.DeviceCopier.settle`).

The contract, per mapping ``[address, address + size)``:

- registered at most once, on the thread that owns the device (the bridge), never while
  another registration of it stands;
- unregistered before it is unmapped, and only when no copy from it is in flight;
- where registration is refused, the mapping's batches take the single-threaded staging copy
  (:mod:`aioloader.run.staging`); a lasting refusal (a driver without it, WSL, no
  permission) stops every further try (the reason is the machine's, not the mapping's); one
  that may pass (no memory to lock now) leaves that mapping unlocked, and the next ones are
  tried.

The CUDA calls are a part (:class:`Registrar`): the tests drive the same bookkeeping with a
registrar that records calls and checks the memory is still mapped when it is let go.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from collections.abc import Callable
from typing import Protocol

import numpy as np

__all__ = ["CudaRegistrar", "HostPins", "Registrar", "address_of"]

log = logging.getLogger("aioloader")


class Registrar(Protocol):
    """Page-locks and releases host memory for one device."""

    def register(self, address: int, size: int) -> tuple[str, bool] | None:
        """Lock ``size`` bytes at ``address``; None when done, else why it was refused and
        whether that lasts (a driver without it) or may pass (no memory to lock now)."""

    def unregister(self, address: int) -> None:
        """Release what :meth:`register` locked at ``address``."""


def address_of(m: mmap.mmap) -> int:
    """The address ``m`` is mapped at in this process."""
    view = np.frombuffer(m, dtype=np.uint8)
    try:
        return int(view.ctypes.data)
    finally:
        del view  # an export left behind would keep the mapping from ever closing


class HostPins:
    """Which mappings are page-locked now (see the module docstring). Thread-safe only in
    that :meth:`pin` and :meth:`covers` run on the bridge thread; :meth:`unpin` and
    :meth:`close` may run on another once the bridge has stopped."""

    def __init__(self, registrar: Registrar, before_unpin: Callable[[], None] = lambda: None) -> None:
        self._registrar = registrar
        self._before_unpin = before_unpin
        self._pinned: dict[int, int] = {}  # address -> size
        self.refused: str | None = None  # why the first refusal was made

    def pin(self, m: mmap.mmap) -> bool:
        """Page-lock ``m`` (once); False where it is not (refused now or before)."""
        if self.refused is not None or len(m) == 0:
            return False
        address = address_of(m)
        if address in self._pinned:
            return True
        refusal = self._registrar.register(address, len(m))
        if refusal is not None:
            why, lasting = refusal
            if lasting:
                self.refused = why
            log.info(
                "aioloader: page-locking a slab refused (%s): its batches are staged, single-threaded", why
            )
            return False
        self._pinned[address] = len(m)
        return True

    def covers(self, address: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at ``address`` lie wholly in a page-locked mapping."""
        for start, size in self._pinned.items():
            if start <= address and address + nbytes <= start + size:
                return True
        return False

    @property
    def pinned(self) -> int:
        """Mappings page-locked now."""
        return len(self._pinned)

    def unpin(self, m: mmap.mmap) -> None:
        """Release ``m`` (before it is unmapped); nothing if it was never locked."""
        if m.closed:
            return
        address = address_of(m)
        if address in self._pinned:
            self._before_unpin()  # every copy that may read it has completed
            del self._pinned[address]
            self._registrar.unregister(address)

    def close(self) -> None:
        """Release every mapping still locked (their slabs are about to be unmapped)."""
        while self._pinned:
            address, _ = self._pinned.popitem()
            self._registrar.unregister(address)


class CudaRegistrar:
    """``cudaHostRegister`` / ``cudaHostUnregister`` for ``device`` (a CUDA index)."""

    #: ``cudaHostRegisterPortable``: locked for every CUDA context, not only the current one.
    PORTABLE = 1

    def __init__(self, device: int) -> None:
        import torch

        self._torch = torch
        self.device = device

    #: ``cudaErrorMemoryAllocation``: no memory to lock now; any other refusal lasts.
    NO_MEMORY = 2

    def register(self, address: int, size: int) -> tuple[str, bool] | None:
        cudart = self._torch.cuda.cudart()  # type: ignore[no-untyped-call]
        with self._torch.cuda.device(self.device):
            err = cudart.cudaHostRegister(address, size, self.PORTABLE)
        if int(err) == 0:
            return None
        _clear_last_error()
        return f"cudaHostRegister: {cudart.cudaGetErrorString(err)}", int(err) != self.NO_MEMORY

    def unregister(self, address: int) -> None:
        cudart = self._torch.cuda.cudart()  # type: ignore[no-untyped-call]
        with self._torch.cuda.device(self.device):
            err = cudart.cudaHostUnregister(address)
        if int(err) != 0:
            _clear_last_error()


def _clear_last_error() -> None:
    """Reset this thread's CUDA "last error": a refused registration leaves it set (PyTorch's
    binding does not clear it), and PyTorch's next kernel launch on the thread would raise it
    as its own. The runtime is the one loaded in this process, found in ``/proc/self/maps``
    (PyTorch's wheels load ``libcudart`` from the ``nvidia-cuda-runtime`` package), else
    next to torch's own libraries."""
    paths: set[str] = set()
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line}
    except OSError:
        pass
    if not paths:
        import glob
        import os

        import torch

        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        paths = set(glob.glob(os.path.join(lib, "libcudart*.so*")))
    for path in paths:
        try:
            ctypes.CDLL(path).cudaGetLastError()
        except (OSError, AttributeError):
            pass
