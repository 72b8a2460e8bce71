"""Stage 6: copying ready batches to the device, on the bridging thread.

The bridging thread (:mod:`aioloader.run.bridge`) calls :meth:`DeviceCopier.to_device` for every
batch. Without CUDA the copy is a no-op (NumPy arrays still become tensors), so the CPU tests
exercise the same thread, hand-off and code path the GPU uses.

With CUDA, per batch:

1. each CPU tensor that lies in a page-locked slab (:mod:`aioloader.run.pinning`: the
   trainer's mappings of the loader process's slabs, registered once for their life) is the
   copy's source itself; any other (a loader in the trainer's process, a non-contiguous leaf,
   registration refused) is first copied, on this thread alone, into a pinned staging buffer
   (:mod:`aioloader.run.staging`);
2. the bridge issues ``non_blocking`` host-to-device copies on its own side stream and
   records an event after them;
3. the trainer's thread makes *its* current stream wait on that event (no host sync) and
   calls ``record_stream`` on the delivered tensors (see :meth:`DeviceCopier.receive`);
4. the bridge keeps the batch's host tensors until the event has completed
   (:meth:`DeviceCopier.settle`, after the hand-off): only then may their slab go back to the
   loader and be written again.

What CUDA does is one part, :class:`DeviceOps`: the tests run the same copier with a part
whose "device" copies complete later, on another thread, so that releasing a slab before its
copy completed shows as wrong data.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import numpy as np
import torch

from aioloader.base.items import Batch
from aioloader.base.tree import flatten, map_leaves
from aioloader.run.pinning import CudaRegistrar, HostPins, Registrar
from aioloader.run.staging import PinnedPool, host_copy

__all__ = ["SMALL", "CudaOps", "DeviceCopier", "DeviceOps", "PinnedPool", "map_tensors"]

#: A leaf of ordinary memory smaller than this is copied from where it is: a copy from
#: pageable memory is synchronous (the driver stages it), which for a few KiB costs less than
#: a staging buffer.
SMALL = 1 << 16


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor inside nested dict/list/tuple/namedtuple; NumPy arrays
    become tensors first; str, bytes, None and numbers pass through unchanged."""

    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return fn(x)
        if isinstance(x, np.ndarray) and x.dtype.kind not in "OUSV":
            return fn(torch.from_numpy(x))
        return x

    return map_leaves(value, leaf)


class Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class DeviceOps(Protocol):
    """What the copier asks of a device (CUDA: :class:`CudaOps`)."""

    def start(self) -> None:
        """Bind the calling thread (the bridge) to the device; make the side stream."""

    def copy(self, src: torch.Tensor) -> torch.Tensor:
        """``src`` (host memory) copied to the device on the side stream, not waited for."""

    def record(self) -> Event:
        """An event recorded on the side stream after the copies issued so far."""

    def wait(self, event: Any) -> Any:
        """Make the calling thread's current stream wait for ``event``; returns that stream."""

    def protect(self, t: torch.Tensor, stream: Any) -> None:
        """Tell the allocator ``stream`` uses ``t`` too."""

    def allocate_pinned(self, nbytes: int) -> torch.Tensor:
        """A page-locked staging buffer of ``nbytes`` bytes."""

    def registrar(self) -> Registrar:
        """Page-locks host memory for this device."""

    def close(self) -> None:
        """Wait for the side stream; drop it."""


class CudaOps:
    """:class:`DeviceOps` on a CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream: Any = None
        self.thread_device: int | None = None  # the bridge thread's current CUDA device

    def start(self) -> None:
        # Without this the thread's first CUDA call would create a context on GPU 0.
        torch.cuda.set_device(self.device)
        self.thread_device = torch.cuda.current_device()
        self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def copy(self, src: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(self.stream):
            return src.to(self.device, non_blocking=True)

    def record(self) -> Event:
        # Blocking: the bridge's wait for it (settle) sleeps instead of spinning a core.
        event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> Any:
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        return current

    def protect(self, t: torch.Tensor, stream: Any) -> None:
        if t.device.type == "cuda":
            t.record_stream(stream)

    def allocate_pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def registrar(self) -> Registrar:
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return CudaRegistrar(index)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        self.stream = None


class DeviceCopier:
    """Moves batches to ``device``. ``start``, ``to_device`` and ``settle`` run on the
    bridging thread; ``receive`` on the consumer's.

    ``ops``: the device's part (default: :class:`CudaOps` for a CUDA device, none otherwise);
    a test passes its own to run the CUDA path without a GPU."""

    def __init__(
        self, device: torch.device, pin_memory: bool, pool_limit: int = 16, ops: DeviceOps | None = None
    ) -> None:
        self.device = device
        if ops is None and device.type == "cuda":
            ops = CudaOps(device)
        self.ops: DeviceOps | None = ops
        self.pin_memory = pin_memory and ops is not None
        # Copies in flight are few (the hand-off holds one batch, the bridge copies the next),
        # so a handful of buffers per tensor of a batch is all the pool ever needs.
        self.pool = PinnedPool(pool_limit, self.ops.allocate_pinned if self.ops is not None else None)
        #: The page-locked slabs (None without pinning); the trainer's slab mappings
        #: (:class:`~aioloader.run.wire.SlabMaps`) register with it.
        self.pins: HostPins | None = None
        #: Host tensors copied straight from their slab, each batch's with its event: kept
        #: until the copy completed (:meth:`settle`).
        self._held: deque[tuple[Event, list[Any]]] = deque()
        # The batch being copied: its staging buffers and the host memory its copies read.
        self._staged: list[torch.Tensor] = []
        self._holding: list[Any] = []
        #: Bytes copied straight from page-locked slabs, and through staging (the tests and
        #: the benchmarks read them).
        self.direct_bytes = 0
        self.staged_bytes = 0

    @property
    def stream(self) -> Any:
        return getattr(self.ops, "stream", None)

    @property
    def thread_device(self) -> int | None:
        return getattr(self.ops, "thread_device", None)

    def start(self) -> None:
        """Bind the calling thread to the device and create the side stream."""
        if self.ops is not None:
            self.ops.start()
            if self.pin_memory:
                # A mapping is released only once no copy reads it (it is unmapped on this
                # thread, between batches: SlabMaps.get).
                self.pins = HostPins(self.ops.registrar(), before_unpin=self.settle)

    def to_device(self, value: Any) -> tuple[Any, Any]:
        """``(value on the device, event recorded after its copies or None)``: every tensor
        of ``value`` through :meth:`copy_tensor`, then the event that ends the batch."""
        if self.ops is None:
            # Only NumPy arrays change (into tensors): a batch without one, file bytes say,
            # is not rebuilt.
            if not any(isinstance(x, np.ndarray) for x in flatten(value)[1]):
                return value, None
            return map_tensors(value, lambda t: t), None
        moved = map_tensors(value, self.copy_tensor)
        event = self.ops.record()
        self.pool.release_after(event, self._staged)
        if self._holding:
            self._held.append((event, self._holding))
        self._staged, self._holding = [], []
        return moved, event

    def copy_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the device, its copy issued on the side stream as part of the batch
        being copied (whose event :meth:`to_device` records): from its slab where that is
        page-locked (the slab then held until the event), else through a staging buffer
        (small tensors: from where they are). Without a device part, ``t`` itself."""
        ops = self.ops
        if ops is None or t.device == self.device:
            return t
        if not self.pin_memory or t.device.type != "cpu" or t.numel() == 0:
            return ops.copy(t)
        nbytes = t.numel() * t.element_size()
        if t.is_contiguous() and self.pins is not None and self.pins.covers(t.data_ptr(), nbytes):
            self._holding.append(t)  # its slab is page-locked: the copy reads it where it is
            self.direct_bytes += nbytes
            return ops.copy(t)
        if nbytes < SMALL:  # labels, say: the driver stages them itself, synchronously
            return ops.copy(t)
        buf = self.pool.acquire(nbytes)
        self._staged.append(buf)
        src = buf.view(t.dtype).view(t.shape)
        host_copy(src, t)
        self.staged_bytes += nbytes
        return ops.copy(src)

    def hold(self, value: Any) -> None:
        """Keep ``value`` (host memory work on the side stream reads) until the event of the
        batch being copied has completed."""
        if self.ops is not None:
            self._holding.append(value)

    def on_stream(self) -> AbstractContextManager[Any]:
        """The side stream made current (CUDA), for work a batch needs beside its copies."""
        if isinstance(self.ops, CudaOps):
            return torch.cuda.stream(self.ops.stream)
        return nullcontext()

    def settle(self, keep: int = 0) -> None:
        """Wait (here, on the bridge) for the copies still reading slabs, all but the
        ``keep`` newest batches', and let go of their host memory, so that the slabs can go
        back to the loader. The bridge calls it after each hand-off with ``keep=1``: the
        batch just handed over may still be copying (or decoding on the device) while the
        next one is fetched, and the slab pool counts one batch in the bridge; an older one
        kept could be the slab the loader waits for to make the next batch."""
        while len(self._held) > keep:
            event, _ = self._held[0]
            event.synchronize()
            self._held.popleft()

    def settle_failed(self) -> None:
        """A batch failed part way: wait for what its copies already issued, then forget
        its staging buffers and held memory (nothing on the device will read them)."""
        if self.ops is not None and (self._staged or self._holding):
            event = self.ops.record()
            event.synchronize()
            self.pool.release_after(event, self._staged)
        self._staged, self._holding = [], []

    def receive(self, batch: Batch) -> Any:
        """Make the consumer's current stream wait for the copy; protect the memory.

        ``wait`` orders the trainer's kernels after the copy without blocking the host.
        The tensors were allocated on the side stream; ``protect`` (``record_stream``) tells
        the caching allocator that the trainer's stream uses them too, so their memory is not
        handed to the next batch's copy while the trainer's kernels may still read it.
        """
        if batch.event is None or self.ops is None:
            return batch.value
        ops = self.ops
        current = ops.wait(batch.event)

        def protect(t: torch.Tensor) -> torch.Tensor:
            ops.protect(t, current)
            return t

        map_tensors(batch.value, protect)
        return batch.value

    def close(self) -> None:
        if self.ops is not None:
            self.ops.close()
        self._held.clear()
        self.pool.clear()
