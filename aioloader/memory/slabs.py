"""Shared-memory batch slabs: where file bytes go in and decoded samples come out.

A slab is one shared-memory segment (:mod:`aioloader.memory.segments`: anonymous shared memory on Linux,
reached by descriptor, else a file in ``/dev/shm``) laid out by
:func:`aioloader.memory.layout.plan_slab`::

    [ status table | input arena: file bytes | rows blocks | output area ]

A batch takes two, from two pools: a *rows slab* (rows blocks and output area, no arena)
that becomes the batch, and an *input arena* (an arena alone) that its file bytes are read
into and that goes back to its pool as soon as the batch's samples are decoded. So only the
batches under construction hold file bytes, not the ones queued or held by the trainer.

The reader threads read each file straight into the input arena (``readinto``); a worker
decodes from there into the sample's row of each rows block (when the batch's samples share
the learned layout: the blocks *are* the collated batch, handed out as tensors without a
copy) or into its chunk's share of the output area (samples then reach the collate as
views). Only offsets, small metadata and the segments' handles cross the process boundary.

Slabs are recycled through a free list (the way Caffe's prefetch_free_/prefetch_full_ queues
recycle buffers). A slab returns to it only when nobody can see it: :meth:`Slab.owner` is
the array every view handed out derives from, and the slab is released when it is garbage,
so a trainer that keeps batches never sees them change. The free list is bounded
(``pooled``); slabs made beyond it while batches are held are one-shot and closed on
release. The free list is last in, first out, so a slab that a busy moment made (an
epoch's start, a trainer holding one batch more) sinks to its bottom once the pipeline
needs fewer: a pool made with ``give_back`` returns the pages of a free slab passed over by
:data:`IDLE_TAKES` takes in a row to the system (``MADV_REMOVE``), keeping the segment. Only
memfd slabs (a ``/dev/shm`` one had its pages reserved, a check against ``/dev/shm`` filling
up), and only where no process page-locked them (no CUDA device: a page-locked slab's pages
must stay the ones the device copies from).

Closing a slab makes it unreachable for other processes (its memfd descriptor closed, its
``/dev/shm`` name unlinked); memory that a held tensor still maps stays valid until that
tensor dies. A memfd slab is gone with its last holder, so a trainer killed at any moment,
even by SIGKILL, leaves nothing once its helpers end with it (:mod:`aioloader.safety.lifeline`).
A ``/dev/shm`` slab is registered with multiprocessing's resource tracker once its name
exists and before it has pages, and the tracker unlinks what is still registered once every
process holding its pipe is gone. Names carry the maker's pid
(``aioloader-<pid>-<n>-<random>``), so ``aioloader doctor`` can find ``/dev/shm`` slabs of
processes that are gone (a tracker killed too, say), and ``/proc/<pid>/maps`` shows whose a
memfd mapping is. ``AIOLOADER_SLABS=devshm`` forces ``/dev/shm`` (see
:mod:`aioloader.memory.segments`).
"""

from __future__ import annotations

import itertools
import mmap
import os
import secrets
import threading
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from aioloader.errors import LoaderError
from aioloader.memory.layout import SampleLayout, SlabLayout, plan_slab
from aioloader.memory.lifecycle import SlabMoveError, SlabState, check_move
from aioloader.memory.results import StatusTable
from aioloader.memory.segments import SHM_DIR, Segment, SegmentHandle, choose_kind

__all__ = ["IDLE_TAKES", "SHM_DIR", "Arena", "Slab", "SlabPool", "shm_available"]

PREFIX = "aioloader-"
#: How long the name of a closed slab is sent to the workers (``Chunk.forget``), seconds.
FORGET_SECONDS = 5.0
#: A free slab passed over by this many takes in a row gives its pages back (``give_back``):
#: about a second of batches; a slab the pipeline cycles through is taken long before.
IDLE_TAKES = 8
_ids = itertools.count()


def shm_available() -> bool:
    """Whether slabs can be made here (memfd or ``/dev/shm``, as ``AIOLOADER_SLABS`` says)."""
    return choose_kind() is not None


class Arena:
    """Bump allocator over a region of a slab (thread-safe: the reader threads share it)."""

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self._used = 0
        self._lock = threading.Lock()

    def alloc(self, size: int) -> int | None:
        """Offset of ``size`` free bytes, or None when they do not fit."""
        with self._lock:
            if self._used + size > len(self.buf):
                return None
            off = self._used
            self._used += size
            return off

    def shrink(self, offset: int, size: int, used: int) -> None:
        """Of the ``size`` bytes allocated at ``offset``, only ``used`` were needed: the
        rest is free again if nothing was allocated after them."""
        with self._lock:
            if offset + size == self._used:
                self._used = offset + used

    def reset(self) -> None:
        with self._lock:
            self._used = 0


class _Owner(np.ndarray):
    """The slab's bytes as one array that every view handed out derives from. A subclass,
    so NumPy does not collapse views' ``.base`` past it: it lives exactly as long as the
    last view (``Slab.owner``)."""


class Slab:
    """One segment of ``kind`` (see :mod:`aioloader.memory.segments`) laid out by ``layout``;
    ``input`` is its input arena, ``status`` its status table
    (:class:`~aioloader.memory.results.StatusTable`) and ``handle`` how another process maps it."""

    def __init__(self, layout: SlabLayout, pooled: bool, kind: str) -> None:
        self.layout = layout
        self.pooled = pooled
        #: Set when something may still write into the slab after its batch is abandoned (a
        #: read that timed out, a worker still decoding): such a slab is never reused.
        self.tainted = False
        #: Where the slab is in its lifecycle (:mod:`aioloader.memory.lifecycle`): made for a
        #: batch that acquired it, so taken.
        self.state = SlabState.TAKEN
        #: The pool's take count when it was last freed; whether its pages may be resident.
        self.freed_at = 0
        self.resident = True
        self.name = f"{PREFIX}{os.getpid()}-{next(_ids)}-{secrets.token_hex(4)}"
        self._segment = Segment(self.name, layout.size, kind)
        self._mmap = self._segment.mmap
        self.handle: SegmentHandle = self._segment.handle
        #: Where the segment is mapped in this process (to find which slab a view is of).
        self.address = int(np.frombuffer(self._mmap, dtype=np.uint8).ctypes.data)
        view = memoryview(self._mmap)
        self.input = Arena(view[layout.input : layout.input + layout.input_size])
        self._out = Arena(view[layout.out : layout.out + layout.out_size])
        self.status = StatusTable(self._mmap, layout.rows)

    @property
    def mmap(self) -> mmap.mmap:
        """The whole segment, mapped in this process."""
        return self._mmap

    @property
    def closed(self) -> bool:
        return self._segment.closed

    def advance(self, to: SlabState) -> None:
        """Move to ``to`` along the lifecycle (:mod:`aioloader.memory.lifecycle`), or raise."""
        check_move(self.name, self.state, to)
        self.state = to

    def reset(self) -> None:
        """Ready for a new batch: empty arenas, clear status."""
        self.input.reset()
        self._out.reset()
        self.status.clear()

    def out_share(self, size: int) -> tuple[int, int] | None:
        """``(offset, size)`` of ``size`` bytes of the output area for one chunk, or None."""
        off = self._out.alloc(size) if size > 0 else None
        return None if off is None else (self.layout.out + off, size)

    def owner(self, release: Any) -> np.ndarray[Any, Any]:
        """A new array over the whole segment; ``release(self)`` runs once it and every view
        derived from it are garbage (from whichever thread drops the last one)."""
        self.advance(SlabState.OUT)
        owner = np.frombuffer(self._mmap, dtype=np.uint8).view(_Owner)
        weakref.finalize(owner, release, self)
        return owner

    def give_back(self) -> None:
        """Return the segment's pages to the system; it reads as zeros until written again.
        Only for a FREE slab: nothing may view its contents."""
        if self.state is not SlabState.FREE:
            raise SlabMoveError(f"slab {self.name}: pages given back while {self.state.value}")
        self._mmap.madvise(mmap.MADV_REMOVE)
        self.resident = False

    def close(self) -> None:
        """Unreachable for other processes from now on (the memory lives on while something
        maps it); idempotent."""
        self.advance(SlabState.CLOSED)  # from any state: the pool is closed, or it is let go
        self._segment.close()


class SlabPool:
    """Hands out slabs for batches of ``rows`` samples; thread-safe; never blocks.

    ``pooled`` slabs are kept for reuse: enough for every batch the pipeline itself can hold
    (under construction, queued, in the bridge and the hand-off). Past that, while the
    trainer holds batches, one-shot slabs are made and closed when released. A free slab
    that no longer fits what :meth:`want` asks (a new sample layout, bigger files, or files
    much smaller than its arena was made for) is closed and replaced. ``kind``: where the
    segments live (``"memfd"`` or ``"devshm"``);
    by default as ``AIOLOADER_SLABS`` says, read now (see :mod:`aioloader.memory.segments`).
    ``give_back``: free memfd slabs left idle give their pages back (see the module; never
    for slabs a process may page-lock).
    """

    def __init__(
        self,
        rows: int,
        pooled: int,
        sample: SampleLayout | None = None,
        kind: str | None = None,
        give_back: bool = False,
    ) -> None:
        if kind is None:
            kind = choose_kind()
            if kind is None:
                raise LoaderError(f"no shared memory for batch slabs here (memfd, {SHM_DIR})")
        self.kind = kind
        self.give_back = give_back and kind == "memfd"
        self._takes = 0
        self.rows = rows
        self.pooled = pooled
        self._sample = sample
        self._in_size = 0
        self._out_size = 0
        self._lock = threading.Lock()
        self._free: list[Slab] = []
        self._all: dict[str, Slab] = {}
        self._pooled_count = 0
        self._closed = False
        self.created = 0
        # (when, name) of the slabs closed lately: a worker that still maps one unmaps it when
        # a task names it (``Chunk.forget``), so a closed slab's memory is not kept alive by
        # the workers' caches of mappings. Every worker gets tasks all the time while a loader
        # loads: a few seconds of names reach them all.
        self._gone: deque[tuple[float, str]] = deque(maxlen=64)

    @property
    def sample(self) -> SampleLayout | None:
        """The rows layout the next slabs get (see :meth:`want`)."""
        with self._lock:
            return self._sample

    @property
    def live(self) -> int:
        """Segments that exist now (free, in the pipeline, or held by the trainer)."""
        with self._lock:
            return len(self._all)

    def want(self, sample: SampleLayout | None, in_size: int, out_size: int) -> None:
        """Future slabs get rows blocks for ``sample``, an input arena of ``in_size`` bytes
        and an output area of ``out_size`` bytes."""
        with self._lock:
            self._sample, self._in_size, self._out_size = sample, in_size, out_size

    def _fits(self, layout: SlabLayout) -> bool:
        # An input arena far bigger than the files seen need is replaced too: the first ones
        # are sized before any file was read (for 128 KiB files), and would stay for good.
        roomy = max(self._in_size * 5 // 4, self._in_size + 65536)
        return (
            layout.sample == self._sample
            and self._in_size <= layout.input_size <= roomy
            and layout.out_size >= self._out_size
        )

    def acquire(self) -> Slab:
        with self._lock:
            if self._closed:
                raise LoaderError("the slab pool is closed")
            self._takes += 1
            while self._free:
                slab = self._free.pop()
                if self._fits(slab.layout):
                    slab.advance(SlabState.TAKEN)
                    slab.resident = True
                    slab.reset()
                    self._give_back_idle()
                    return slab
                self._forget(slab)
            pooled = self._pooled_count < self.pooled
            if pooled:
                self._pooled_count += 1
            layout = plan_slab(self.rows, self._sample, self._in_size, self._out_size)
        try:
            slab = Slab(layout, pooled, self.kind)
        except BaseException:
            if pooled:
                with self._lock:
                    self._pooled_count -= 1
            raise
        with self._lock:
            self._all[slab.name] = slab
            self.created += 1
            if self._closed:  # closed while we were making it
                self._forget(slab)
        return slab

    def release(self, slab: Slab) -> None:
        """Give ``slab`` back (from any thread, e.g. a finalizer); a second release of the
        same slab while it is free is ignored."""
        with self._lock:
            if slab.name not in self._all or slab in self._free:
                return
            keep = self._pooled_count <= self.pooled  # the bound may have come down meanwhile
            if slab.pooled and not slab.tainted and not self._closed and keep:
                slab.advance(SlabState.FREE)
                slab.freed_at = self._takes
                self._free.append(slab)
            else:
                self._forget(slab)

    def _give_back_idle(self) -> None:
        """Give back the pages of the free slabs passed over by :data:`IDLE_TAKES` takes
        (under the lock: a take never races it; once each, until taken again)."""
        if not self.give_back:
            return
        for slab in self._free:
            if slab.resident and self._takes - slab.freed_at >= IDLE_TAKES:
                try:
                    slab.give_back()
                except (OSError, ValueError):  # not possible here: keep the pages, ask no more
                    self.give_back = False
                    return

    def set_pooled(self, pooled: int) -> None:
        """Keep ``pooled`` slabs for reuse from now on (the pipeline holds more batches or
        fewer: ``io_concurrency="auto"`` moved); free slabs over it are closed now, held
        ones when they come back."""
        with self._lock:
            self.pooled = pooled
            while self._pooled_count > pooled and self._free:
                self._forget(self._free.pop())

    def live_slabs(self) -> list[Slab]:
        """Every segment that exists now."""
        with self._lock:
            return list(self._all.values())

    def recently_closed(self, within: float = FORGET_SECONDS) -> tuple[str, ...]:
        """The names of the slabs closed in the last ``within`` seconds (at most 64)."""
        with self._lock:
            since = time.monotonic() - within
            while self._gone and self._gone[0][0] < since:
                self._gone.popleft()
            return tuple(name for _, name in self._gone)

    def _forget(self, slab: Slab) -> None:
        self._gone.append((time.monotonic(), slab.name))
        self._all.pop(slab.name, None)
        if slab.pooled:
            self._pooled_count -= 1
        slab.close()

    def close(self) -> None:
        """Close every segment (what held batches map stays valid); idempotent."""
        with self._lock:
            self._closed = True
            slabs = list(self._all.values())
            self._all.clear()
            self._free.clear()
            self._pooled_count = 0
        for slab in slabs:
            slab.close()
