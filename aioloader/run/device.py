"""Stage 6: copying ready batches to the device, on the bridging thread.

The bridging thread (:mod:`aioloader.run.bridge`) calls :meth:`DeviceCopier.to_device` for every
batch. Without CUDA the copy is a no-op (NumPy arrays still become tensors), so the CPU tests
exercise the same thread, hand-off and code path the GPU uses.

With CUDA, per batch:

1. each CPU tensor is copied into a pinned staging buffer from a bounded pool (pinned
   allocations are slow, so they are reused, not made per batch);
2. the bridge issues ``non_blocking`` host-to-device copies on its own side stream and
   records an event after them;
3. the trainer's thread makes *its* current stream wait on that event (no host sync) and
   calls ``record_stream`` on the delivered tensors (see :meth:`DeviceCopier.receive`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from aioloader.base.items import Batch
from aioloader.base.tree import flatten, map_leaves

__all__ = ["DeviceCopier", "PinnedPool", "map_tensors"]


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


def _allocate_pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class PinnedPool:
    """Reusable page-locked staging buffers, at most ``limit`` of them.

    A buffer goes back to the free list only once the CUDA event recorded after the copy
    that reads it has completed. Reusing it earlier is a race: the host would overwrite the
    bytes with the next batch while the GPU's asynchronous copy is still reading them, and
    the trainer would receive a mix of two batches.
    """

    def __init__(self, limit: int, allocate: Callable[[int], torch.Tensor] | None = None) -> None:
        self.limit = limit
        self.allocated = 0
        self._allocate = allocate or _allocate_pinned
        self._free: dict[int, list[torch.Tensor]] = {}
        self._in_flight: deque[tuple[Any, list[torch.Tensor]]] = deque()

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A pinned uint8 buffer of exactly ``nbytes`` bytes."""
        self._reclaim(block=False)
        while True:
            free = self._free.get(nbytes)
            if free:
                return free.pop()
            if self.allocated < self.limit:
                break
            if self._in_flight:
                self._reclaim(block=True)  # wait (here, never in the trainer) for the oldest copy
                continue
            self._evict_one()  # all free but of other sizes (a last partial batch)
        self.allocated += 1
        return self._allocate(nbytes)

    def release_after(self, event: Any, buffers: list[torch.Tensor]) -> None:
        """Return ``buffers`` to the pool once ``event`` (recorded after their copy) completes."""
        if buffers:
            self._in_flight.append((event, buffers))

    def clear(self) -> None:
        """Drop every buffer (waiting for copies still reading them)."""
        while self._in_flight:
            self._reclaim(block=True)
        self._free.clear()
        self.allocated = 0

    def _reclaim(self, block: bool) -> None:
        while self._in_flight:
            event, buffers = self._in_flight[0]
            if not event.query():
                if not block:
                    return
                event.synchronize()
                block = False
            self._in_flight.popleft()
            for b in buffers:
                self._free.setdefault(b.numel(), []).append(b)

    def _evict_one(self) -> None:
        for size, free in self._free.items():
            if free:
                free.pop()
                self.allocated -= 1
                if not free:
                    del self._free[size]
                return
        raise RuntimeError("pinned pool exhausted with nothing in flight")  # cannot happen


class DeviceCopier:
    """Moves batches to ``device``. ``start`` runs on the bridging thread; ``receive`` on
    the consumer's thread."""

    def __init__(self, device: torch.device, pin_memory: bool, pool_limit: int = 16) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pin_memory = pin_memory and self.cuda
        # Copies in flight are few (the hand-off holds one batch, the bridge copies the next),
        # so a handful of buffers per tensor of a batch is all the pool ever needs.
        self.pool = PinnedPool(pool_limit)
        self.stream: Any = None
        self.thread_device: int | None = None  # the bridge thread's current CUDA device

    def start(self) -> None:
        """Bind the calling thread to the device and create the side stream."""
        if self.cuda:
            # Without this the thread's first CUDA call would create a context on GPU 0.
            torch.cuda.set_device(self.device)
            self.thread_device = torch.cuda.current_device()
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def to_device(self, value: Any) -> tuple[Any, Any]:
        """``(value on the device, event recorded after its copies or None)``."""
        if not self.cuda:
            # Only NumPy arrays change (into tensors): a batch without one, file bytes say,
            # is not rebuilt.
            if not any(isinstance(x, np.ndarray) for x in flatten(value)[1]):
                return value, None
            return map_tensors(value, lambda t: t), None
        staged: list[torch.Tensor] = []

        def copy(t: torch.Tensor) -> torch.Tensor:
            if t.device == self.device:
                return t
            src = t
            if self.pin_memory and t.device.type == "cpu" and t.numel() > 0:
                t = t.contiguous()
                buf = self.pool.acquire(t.numel() * t.element_size())
                staged.append(buf)
                src = buf.view(t.dtype).view(t.shape)
                src.copy_(t)
            with torch.cuda.stream(self.stream):
                return src.to(self.device, non_blocking=True)

        moved = map_tensors(value, copy)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self.stream)
        self.pool.release_after(event, staged)
        return moved, event

    def receive(self, batch: Batch) -> Any:
        """Make the consumer's current stream wait for the copy; protect the memory.

        ``wait_event`` orders the trainer's kernels after the copy without blocking the host.
        The tensors were allocated on the side stream; ``record_stream`` tells the caching
        allocator that the trainer's stream uses them too, so their memory is not handed to
        the next batch's copy while the trainer's kernels may still read it.
        """
        if batch.event is None:
            return batch.value
        current = torch.cuda.current_stream(self.device)
        current.wait_event(batch.event)

        def protect(t: torch.Tensor) -> torch.Tensor:
            if t.device.type == "cuda":
                t.record_stream(current)
            return t

        map_tensors(batch.value, protect)
        return batch.value

    def close(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        self.pool.clear()
        self.stream = None
