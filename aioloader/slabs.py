"""Shared-memory batch slabs: where file bytes go in and decoded samples come out.

A slab is one shared-memory segment (a file in ``/dev/shm``) that holds a whole batch:

    [ input arena: the batch's file bytes, bump-allocated | output: batch_size samples ]

The reader threads read each file straight into the arena (``readinto``), a worker decodes
from there straight into its sample's row of the output, and the full output *is* the
collated batch, handed out as a tensor without a copy. Only offsets and small metadata
cross the process boundary (see ``benchmarks/ipc.py``: ~13 us of parent CPU per sample,
against ~160 us pickling chunks and ~1 ms pickling one task per sample).

Slabs are recycled through a free list (the way Caffe's prefetch_free_/prefetch_full_ queues
recycle buffers). A slab returns to it only when nobody can see it: when the last tensor
viewing it is garbage (``weakref.finalize`` on the array under the tensor), so a trainer
that keeps batches never sees them change. The free list is bounded (``pooled``); slabs made
beyond it while batches are held are one-shot and unlinked on release.

Every segment is registered with multiprocessing's resource tracker, so even a parent killed
by SIGKILL leaves nothing in ``/dev/shm``; ``close`` unlinks them all at once (memory that a
held tensor still maps stays valid until that tensor dies).
"""

from __future__ import annotations

import itertools
import mmap
import os
import secrets
import shutil
import threading
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

from .errors import LoaderError

__all__ = ["SHM_DIR", "Arena", "Slab", "SlabPool", "SlabSpec", "shm_available", "slab_spec_for"]

#: Where segments are made: a tmpfs, so "files" there are shared memory.
SHM_DIR = "/dev/shm"
PREFIX = "aioloader-"
STATUS_ROW_BYTES = 16  # (pid, start) as two float64
_ids = itertools.count()


def shm_available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


@dataclass(frozen=True)
class SlabSpec:
    """Layout of the slabs of one loader: ``batch_size`` samples of ``shape``/``dtype``
    (no output region when ``shape`` is None) after an input arena."""

    batch_size: int
    shape: tuple[int, ...] | None
    dtype: np.dtype[Any]

    @property
    def sample_bytes(self) -> int:
        return 0 if self.shape is None else int(np.prod(self.shape)) * self.dtype.itemsize


def slab_spec_for(decode: object, collate: object, batch_size: int) -> SlabSpec | None:
    """The slab layout for a loader, or None when slabs cannot be used (no ``/dev/shm``,
    or no decoding: raw bytes need no worker).

    Outputs go into the slab only when the decoder declares ``output_shape`` (and optionally
    ``output_dtype``, default uint8) and the default collate is used; otherwise the slab
    carries the input bytes alone and decoded samples come back pickled.
    """
    if decode is None or not shm_available():
        return None
    shape = getattr(decode, "output_shape", None)
    if collate is not None or shape is None:
        return SlabSpec(batch_size, None, np.dtype(np.uint8))
    return SlabSpec(
        batch_size, tuple(int(d) for d in shape), np.dtype(getattr(decode, "output_dtype", np.uint8))
    )


class Arena:
    """Bump allocator over a slab's input region, shared by the reader threads."""

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

    def reset(self) -> None:
        with self._lock:
            self._used = 0


class Slab:
    """One segment: a status table, ``arena`` (input bytes), then ``batch_size`` output rows.

    The status table has one ``(pid, start)`` pair of float64 per row: the worker decoding
    the row writes its pid and ``time.monotonic()`` before decoding and ``-pid`` after, so
    the parent knows which sample a hung or dead worker was on.
    """

    def __init__(self, spec: SlabSpec, in_capacity: int, pooled: bool) -> None:
        self.spec = spec
        self.in_capacity = in_capacity
        self.status_offset = 0
        status_bytes = spec.batch_size * STATUS_ROW_BYTES
        self.in_offset = status_bytes
        self.out_offset = status_bytes + in_capacity
        self.size = self.out_offset + spec.batch_size * spec.sample_bytes
        self.pooled = pooled
        #: Set when something may still write into the slab after its batch is abandoned (a
        #: read that timed out, a worker still decoding): such a slab is never reused.
        self.tainted = False
        self.name = f"{PREFIX}{os.getpid()}-{next(_ids)}-{secrets.token_hex(4)}"
        self.path = os.path.join(SHM_DIR, self.name)
        self._mmap = _create_segment(self.path, self.size)
        self.arena = Arena(memoryview(self._mmap)[self.in_offset : self.out_offset])
        self.status = np.frombuffer(self._mmap, dtype=np.float64, count=2 * spec.batch_size).reshape(-1, 2)
        self.unlinked = False

    @property
    def mmap(self) -> mmap.mmap:
        """The whole segment, mapped in this process."""
        return self._mmap

    def reset(self) -> None:
        """Ready for a new batch: empty arena, clear status."""
        self.arena.reset()
        self.status[:] = 0.0

    def output(self, rows: int) -> np.ndarray[Any, Any]:
        """A new array over the first ``rows`` output rows (zero-copy)."""
        spec = self.spec
        assert spec.shape is not None
        count = rows * spec.sample_bytes // spec.dtype.itemsize
        flat = np.frombuffer(self._mmap, dtype=spec.dtype, count=count, offset=self.out_offset)
        return flat.reshape(rows, *spec.shape)

    def unlink(self) -> None:
        """Remove the name (the memory lives on while something maps it)."""
        if self.unlinked:
            return
        self.unlinked = True
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        _untrack(self.path)


def _create_segment(path: str, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    _track(path)
    try:
        # Reserve the pages now: a tmpfs that is too small then fails here with ENOSPC,
        # instead of a SIGBUS in whichever process first touches a missing page.
        os.posix_fallocate(fd, 0, max(size, 1))
        return mmap.mmap(fd, max(size, 1))
    except OSError as exc:
        os.unlink(path)
        _untrack(path)
        free = shutil.disk_usage(SHM_DIR).free
        raise LoaderError(
            f"cannot allocate a {size / 2**20:.1f} MiB shared-memory batch slab in {SHM_DIR} "
            f"({free / 2**20:.1f} MiB free there): {exc.strerror or exc}. Enlarge {SHM_DIR} "
            "(e.g. docker run --shm-size=8g) or lower batch_size or prefetch."
        ) from exc
    finally:
        os.close(fd)


def _track(path: str) -> None:
    if os.path.dirname(path) == "/dev/shm":  # the tracker only knows POSIX shm names
        resource_tracker.register("/" + os.path.basename(path), "shared_memory")


def _untrack(path: str) -> None:
    if os.path.dirname(path) == "/dev/shm":
        resource_tracker.unregister("/" + os.path.basename(path), "shared_memory")


class SlabPool:
    """Hands out slabs; thread-safe; never blocks.

    ``pooled`` slabs are kept for reuse: enough for every batch the pipeline itself can hold
    (under construction, queued, in the bridge and the hand-off). Past that, while the
    trainer holds batches, one-shot slabs are made and unlinked when released.
    """

    def __init__(self, spec: SlabSpec, pooled: int, in_capacity: int) -> None:
        self.spec = spec
        self.pooled = pooled
        self._in_capacity = in_capacity
        self._lock = threading.Lock()
        self._free: list[Slab] = []
        self._all: dict[str, Slab] = {}
        self._pooled_count = 0
        self._closed = False
        self.created = 0

    @property
    def live(self) -> int:
        """Segments that exist now (free, in the pipeline, or held by the trainer)."""
        with self._lock:
            return len(self._all)

    def want_input_capacity(self, in_capacity: int) -> None:
        """Future slabs get an input arena of ``in_capacity`` bytes (file sizes seen so far)."""
        with self._lock:
            self._in_capacity = in_capacity

    def acquire(self) -> Slab:
        with self._lock:
            if self._closed:
                raise LoaderError("the slab pool is closed")
            while self._free:
                slab = self._free.pop()
                if slab.in_capacity >= self._in_capacity:
                    slab.reset()
                    return slab
                self._forget(slab)  # arena too small for the files seen: make a bigger one
            pooled = self._pooled_count < self.pooled
            if pooled:
                self._pooled_count += 1
            capacity = self._in_capacity
        try:
            slab = Slab(self.spec, capacity, pooled)
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
        """Give ``slab`` back (from any thread, e.g. a finalizer)."""
        with self._lock:
            if slab.name not in self._all:
                return
            if slab.pooled and not slab.tainted and not self._closed:
                self._free.append(slab)
            else:
                self._forget(slab)

    def _forget(self, slab: Slab) -> None:
        self._all.pop(slab.name, None)
        if slab.pooled:
            self._pooled_count -= 1
        slab.unlink()

    def close(self) -> None:
        """Unlink every segment; idempotent."""
        with self._lock:
            self._closed = True
            slabs = list(self._all.values())
            self._all.clear()
            self._free.clear()
            self._pooled_count = 0
        for slab in slabs:
            slab.unlink()
