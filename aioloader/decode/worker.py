"""Code that runs inside the decode worker processes (and, for the built-in
``ImageDecoder`` while the workers start, on a thread of the loader's own process).

The pool initialiser installs the user's ``decode`` once per process, so a task ships only
offsets and a few integers. :func:`run_chunk` decodes a
:class:`~aioloader.decode.chunk.Chunk` (one round trip amortised over several samples): it
reads each sample's bytes from the slab's input arena and writes the decoded arrays into the
slab, in the sample's row when the sample has the slab's rows layout, else into the chunk's
share of the output area (see :mod:`aioloader.memory.layout` and
:mod:`aioloader.decode.chunk`). It never raises: each sample's failure comes back as data
with the worker's traceback, and an exception that cannot be pickled is replaced by
one that can. Imports NumPy only; torch only if the decoder itself did.

A worker maps each slab once, through the handle the chunk carries (the loader's
``/proc/<pid>/fd/<fd>`` for a memfd, see :mod:`aioloader.memory.segments`), and keeps the mapping under the
slab's unique name. A slab that cannot be mapped, or whose descriptor is now another file
(a chunk of an abandoned slab still queued after the loader closed it and reused the fd
number), is never written: every row of the chunk comes back as a failure, which the loader
ignores for an abandoned batch.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import sys
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np

from aioloader.base import heap, sendable
from aioloader.decode.chunk import Chunk
from aioloader.memory.results import Failed, Pickled, RowResult, Shrunk, StatusTable
from aioloader.memory.segments import SegmentHandle, attach
from aioloader.memory.writer import RowWriter
from aioloader.procs import roles
from aioloader.safety import lifeline

__all__ = ["decode_chunk", "run_chunk", "sample_rng", "warm_up", "worker_init"]

_decode: Callable[[bytes], Any] | None = None
# Per thread: ``context``, the (seed, epoch, index) of the sample being decoded, and ``rng``,
# its generator. Thread-local because the loader's own process also decodes on a thread
# while its workers start (hot start), beside the trainer's own sample_rng() calls.
_local = threading.local()
# Slabs and input arenas this worker has mapped, by name (unique, unlike a /proc/<pid>/fd/<n>
# path), most recent last. A slab the loader has closed is freed only once every process
# unmaps it: tasks name the ones closed lately (``Chunk.forget``), and the cache is bounded.
_maps: OrderedDict[str, mmap.mmap] = OrderedDict()
_MAX_MAPS = 32
_trim = heap.BurstTrim()


def sample_rng() -> np.random.Generator:
    """A NumPy generator for random augmentation of the sample being decoded.

    Seeded from ``(seed, epoch, dataset index)`` only, so a sample gets the same
    augmentation in an epoch whatever worker decodes it, in whatever order. Call it inside a
    ``decode`` function; outside one it returns a fresh, OS-seeded generator.
    """
    context = getattr(_local, "context", None)
    if context is None:
        return np.random.default_rng()
    rng: np.random.Generator | None = getattr(_local, "rng", None)
    if rng is None:
        rng = _local.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(context))))
    return rng


class NotLoaded(Exception):
    """The worker could not unpickle the loader's ``decode``; the message is its traceback."""


_not_loaded: str | None = None


def worker_init(decode: bytes) -> None:
    """Pool initialiser: install ``decode`` (pickled by value, :mod:`aioloader.base.sendable`);
    leave Ctrl-C to the parent; end with the trainer's process (see
    :mod:`aioloader.safety.lifeline`). A ``decode`` that does not unpickle here is reported by
    every task (:class:`NotLoaded`), not by an initialiser that kills the worker."""
    global _decode, _not_loaded
    roles.become("worker")
    lifeline.follow_parent()
    # The parent owns shutdown: a Ctrl-C in the terminal reaches the whole process group,
    # and workers that died of it would print tracebacks and break the pool mid-close.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch = sys.modules.get("torch")  # imported by the trainer (zygote) or the decoder
    if torch is not None:
        # One intra-op thread per worker, as DataLoader's workers do: the workers already
        # fill the cores, and a pool of spinning OpenMP threads in each would fight them.
        torch.set_num_threads(1)
    try:
        _decode = sendable.loads(decode, "decode")
    except Exception:  # noqa: BLE001 - the loader reports it, once, as a LoaderError
        _not_loaded = traceback.format_exc()
    pil = sys.modules.get("PIL.Image")
    if pil is not None:
        # Pillow registers its common formats (JPEG, PNG, BMP, GIF) on the first open: imports
        # that would delay the first batch. Done here, before any task arrives, while the
        # first files are still being read.
        pil.preinit()


def warm_up() -> int:
    """A no-op task that makes the pool start a process; returns its pid."""
    _check_loaded()
    return os.getpid()


def _check_loaded() -> None:
    if _not_loaded is not None:
        raise NotLoaded(_not_loaded)


def _unmap(name: str) -> None:
    m = _maps.pop(name, None)
    if m is not None:
        try:
            m.close()
        except BufferError:  # still viewed somewhere: garbage collection unmaps it
            pass


def _attach(handle: SegmentHandle) -> mmap.mmap:
    m = _maps.get(handle.name)
    if m is not None:
        _maps.move_to_end(handle.name)
        return m
    m = attach(handle)  # checks the file is that slab: fd numbers are reused
    _maps[handle.name] = m
    while len(_maps) > _MAX_MAPS:
        _unmap(next(iter(_maps)))
    return m


def run_chunk(chunk: Chunk) -> list[RowResult | Shrunk]:
    """Decode ``chunk`` with the installed ``decode`` (the task a worker runs)."""
    _check_loaded()
    for name in chunk.forget:  # closed by the loader: its memory goes once nobody maps it
        _unmap(name)
    try:
        m = _attach(chunk.slab) if chunk.slab is not None else None
        inputs = _attach(chunk.inputs) if chunk.inputs is not None else None
    except OSError as exc:  # nothing is written: the slab may be another one's fd by now
        error = OSError(exc.errno, f"cannot map the batch's shared memory in the worker: {exc}")
        return [Failed(error, "") for _ in chunk.items]
    results = decode_chunk(m, chunk, _decode, inputs)
    # Samples pickled back (before the layout is learned) leave megabytes in this worker's
    # heap: given back once they fit the slab (aioloader/base/heap.py).
    if _trim.saw(any(isinstance(r, Pickled) for r in results)):
        heap.trim()
    return results


def decode_chunk(
    m: mmap.mmap | None, chunk: Chunk, decode: Callable[[bytes], Any] | None, inputs: mmap.mmap | None = None
) -> list[RowResult | Shrunk]:
    """Decode ``chunk`` over the slab mapped at ``m`` (None: no slab) with ``decode``; the
    sources given as ``(offset, size)`` lie in the input arena mapped at ``inputs``."""
    layout = chunk.layout if m is not None else None
    status = StatusTable(m, layout.rows) if m is not None and layout is not None else None
    out = RowWriter(m, layout, chunk.out) if m is not None and layout is not None else None
    results: list[RowResult | Shrunk] = []
    for row, index, src in chunk.items:
        if status is not None:
            status.start(row)
        if isinstance(src, tuple):
            assert inputs is not None
            data = inputs[chunk.inputs_at + src[0] : chunk.inputs_at + src[0] + src[1]]
        else:
            data = src
        if chunk.shrink is not None and row in chunk.shrink.rows:
            results.append(_shrunk(decode, data, out, row, chunk, index))
        else:
            results.append(_decode_one(decode, data, out, row, chunk.seed, chunk.epoch, index))
        if status is not None:
            status.done(row)
    del status
    return results


def _shrunk(
    decode: Callable[[bytes], Any] | None,
    data: bytes,
    out: RowWriter | None,
    row: int,
    chunk: Chunk,
    index: int,
) -> RowResult | Shrunk:
    """The sample decoded from what the cache keeps for ``data`` (``Cache(max_side=...)``):
    the small image first, then ``decode`` of it, so the first epoch sees what every later
    one will, and a large photo is decoded once, at a reduced scale, not twice. The file as
    it is where it needs no downscale; the file, and nothing kept, where the downscale fails
    (the decode then says what is wrong with it, or decodes it its own way)."""
    from aioloader.decode.shrink import shrink  # Pillow: only in a cache's workers

    assert chunk.shrink is not None
    try:
        small = shrink(data, chunk.shrink.max_side, chunk.shrink.quality)
    except Exception:  # noqa: BLE001 - only the entry is lost: the decode has the file
        return _decode_one(decode, data, out, row, chunk.seed, chunk.epoch, index)
    res = _decode_one(decode, data if small is None else small, out, row, chunk.seed, chunk.epoch, index)
    return res if isinstance(res, Failed) else Shrunk(res, small)


def _decode_one(
    decode: Callable[[bytes], Any] | None,
    data: bytes,
    out: RowWriter | None,
    row: int,
    seed: int,
    epoch: int,
    index: int,
) -> RowResult:
    _local.context, _local.rng = (seed, epoch, index), None
    try:
        assert decode is not None, "worker_init did not run"
        value = decode(data)
        return out.put(row, value) if out is not None else Pickled(value)
    except Exception as exc:  # noqa: BLE001 - every failure goes back as data
        text = traceback.format_exc()
        try:
            # Both ways: the parent must rebuild it too. The copy is what goes back, also
            # from the loader's own thread (hot start): it carries no traceback whose
            # frames would keep this chunk's slab mapped.
            sent: BaseException = pickle.loads(cloudpickle.dumps(exc))
        except Exception:  # noqa: BLE001 - an exception that cannot cross the pipe
            sent = RuntimeError(f"{type(exc).__qualname__}: {exc}")
        del exc
        return Failed(sent, text)
    finally:
        _local.context, _local.rng = None, None
