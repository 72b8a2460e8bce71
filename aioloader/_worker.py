"""Code that runs inside the decode worker processes.

Kept apart from the engine so the worker's side of the protocol is one small file. The pool
initialiser installs the user's ``decode`` (and the slab layout) once per process, so a task
ships only offsets and a few integers. :func:`run_chunk` decodes several samples per task
(one round trip amortised over the chunk), reads their bytes from the batch slab's input
arena and writes each decoded sample into its row of the slab's output. It never raises:
each sample's failure comes back as data with the worker's traceback, and an exception that
cannot be pickled is replaced by one that can.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["run_chunk", "run_chunk_in", "sample_rng", "worker_init"]

_decode: Callable[[bytes], Any] | None = None
_shape: tuple[int, ...] | None = None
_dtype: np.dtype[Any] | None = None
# Per thread: ``context``, the (seed, epoch, index) of the sample being decoded, and ``rng``,
# its generator. Thread-local because the loader's own process also decodes on a thread
# while its workers start (see engine.py), beside the trainer's own sample_rng() calls.
_local = threading.local()
# Slabs this worker has mapped, most recent last. Bounded: a one-shot slab the parent has
# unlinked is freed only once every process unmaps it.
_maps: OrderedDict[str, mmap.mmap] = OrderedDict()
_MAX_MAPS = 24

#: A sample source: ``(offset, length)`` in the slab's input arena, or the bytes themselves.
Source = tuple[int, int] | bytes
#: Per-sample result: None (written into the slab), ``("value", sample)`` or
#: ``("error", exception, traceback_text)``.
Result = tuple[Any, ...] | None


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


def worker_init(decode: Callable[[bytes], Any], shape: tuple[int, ...] | None, dtype: str | None) -> None:
    """Pool initialiser: install ``decode`` and the slab's sample layout; leave Ctrl-C to
    the parent."""
    global _decode, _shape, _dtype
    # The parent owns shutdown: a Ctrl-C in the terminal reaches the whole process group,
    # and workers that died of it would print tracebacks and break the pool mid-close.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _decode, _shape = decode, shape
    _dtype = np.dtype(dtype) if dtype is not None else None


def warm_up() -> int:
    """A no-op task that makes the pool start a process; returns its pid."""
    return os.getpid()


def _attach(path: str) -> mmap.mmap:
    m = _maps.get(path)
    if m is not None:
        _maps.move_to_end(path)
        return m
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    _maps[path] = m
    while len(_maps) > _MAX_MAPS:
        _, old = _maps.popitem(last=False)
        try:
            old.close()
        except BufferError:  # still viewed somewhere: garbage collection unmaps it
            pass
    return m


def run_chunk(
    slab: str | None,
    layout: tuple[int, int, int],
    items: list[tuple[int, int, Source]],
    seed: int,
    epoch: int,
) -> list[Result]:
    """Decode ``items`` (``(row, dataset index, source)``). ``layout`` is the slab's
    ``(status, input, output)`` offsets: sources are ``(offset, length)`` in the input
    arena, fitting samples are written into row ``row`` of the output, and the row's status
    says who is decoding it since when."""
    m = _attach(slab) if slab is not None else None
    return run_chunk_in(m, layout, items, seed, epoch, _decode, _shape, _dtype)


def run_chunk_in(
    m: mmap.mmap | None,
    layout: tuple[int, int, int],
    items: list[tuple[int, int, Source]],
    seed: int,
    epoch: int,
    decode: Callable[[bytes], Any] | None,
    shape: tuple[int, ...] | None,
    dtype: np.dtype[Any] | None,
) -> list[Result]:
    """:func:`run_chunk` over an already mapped slab ``m``, with ``decode`` given: what a
    worker runs, and what the loader's own process runs while its workers start."""
    status_off, in_off, out_off = layout
    status = (
        np.frombuffer(m, dtype=np.float64, count=2 * (max(r for r, _, _ in items) + 1), offset=status_off)
        if m is not None
        else None
    )
    pid = float(os.getpid())
    results: list[Result] = []
    for row, index, src in items:
        if status is not None:
            status[2 * row : 2 * row + 2] = (pid, time.monotonic())
        data = (
            m[in_off + src[0] : in_off + src[0] + src[1]] if isinstance(src, tuple) and m is not None else src
        )
        assert isinstance(data, bytes)
        results.append(_decode_one(decode, shape, dtype, data, m, out_off, row, seed, epoch, index))
        if status is not None:
            status[2 * row] = -pid
    del status
    return results


def _decode_one(
    decode: Callable[[bytes], Any] | None,
    shape: tuple[int, ...] | None,
    dtype: np.dtype[Any] | None,
    data: bytes,
    m: mmap.mmap | None,
    out_offset: int,
    row: int,
    seed: int,
    epoch: int,
    index: int,
) -> Result:
    _local.context, _local.rng = (seed, epoch, index), None
    try:
        assert decode is not None, "worker_init did not run"
        value = decode(data)
        if (
            m is not None
            and shape is not None
            and isinstance(value, np.ndarray)
            and value.shape == shape
            and value.dtype == dtype
        ):
            size = value.nbytes
            dest = np.frombuffer(m, dtype=np.uint8, count=size, offset=out_offset + row * size)
            dest[:] = value.reshape(-1).view(np.uint8)
            del dest
            return None
        return ("value", value)  # does not fit the slab: pickled back instead
    except Exception as exc:  # noqa: BLE001 - every failure goes back as data
        text = traceback.format_exc()
        try:
            # Both ways: the parent must rebuild it too. The copy is what goes back, also
            # from the loader's own thread (hot start): it carries no traceback whose
            # frames would keep this chunk's slab mapped.
            sent: BaseException = pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - an exception that cannot cross the pipe
            sent = RuntimeError(f"{type(exc).__qualname__}: {exc}")
        del exc
        return ("error", sent, text)
    finally:
        _local.context, _local.rng = None, None
