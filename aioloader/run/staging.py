"""Staging host memory: the copy a batch takes to the GPU where its slab is not page-locked.

A batch's tensors are copied from their slab into a page-locked buffer of a bounded pool,
and the device copy reads that buffer. This is the fallback of
:mod:`aioloader.run.pinning`: for a loader in the trainer's process, a spilled leaf of a
custom ``collate``, a non-contiguous leaf, or a machine where registration is refused.

The host copy is single-threaded (:func:`host_copy`, NumPy's ``copyto`` with the GIL
released), never ``Tensor.copy_``: above 32k elements that runs ``at::parallel_for`` on every
thread of PyTorch's intra-op pool, and 15 threads of the trainer's process then spin for a
38 MB batch (RESULTS, issue 32). ``torch.set_num_threads(1)`` on the bridge, DataLoader's way,
would not do: it stores a process-wide default that every thread of the trainer initialised
later (its own worker threads, say) would take.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["PinnedPool", "host_copy"]

#: Integer dtypes by element size: a leaf NumPy cannot hold (bfloat16, float8) is copied as these.
_SAME_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """``t``'s memory as a NumPy array of the same shape and strides (no copy)."""
    t = t.detach().resolve_conj().resolve_neg()  # copies only where such a bit is set
    try:
        return t.numpy()
    except TypeError:  # a dtype NumPy does not have: its bits, as integers of its size
        return t.view(_SAME_SIZE[t.element_size()]).numpy()


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst`` (same shape and dtype, CPU), on this thread only."""
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(f"host_copy: {tuple(src.shape)} {src.dtype} into {tuple(dst.shape)} {dst.dtype}")
    np.copyto(_numpy(dst), _numpy(src), casting="no")


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
            if not any(self._free.values()):
                break  # the batch being copied holds them all: one more, over the bound
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
