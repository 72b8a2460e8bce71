"""How a batch crosses from the loader process to the trainer's (``loader_process="auto"``,
the default, or True).

A batch's arrays and tensors that view one of the loader's shared-memory slabs travel as
:class:`SlabRef` (which slab, where in it, shape, strides, dtype); so does an array of ordinary memory of
1 MiB or more (a custom ``collate``'s output), copied once into a one-shot segment of its own
(:func:`spill`); everything else (labels, strings, small arrays) travels pickled, and so do
the handles of the slabs used
(:class:`~aioloader.memory.segments.SegmentHandle`: name, path, inode). The trainer maps each slab
(once: the mapping is cached under the slab's unique name, :class:`SlabMaps`) and rebuilds
each leaf as a view of it, so a batch of any size costs the pipe a few hundred bytes and no
copy. A memfd slab is reached through the loader process's ``/proc/<pid>/fd/<fd>``, and
mapped only if that file has the handle's inode: a closed slab's fd number may be another
file's by then, and such a batch is a :class:`~aioloader.LoaderError`, never wrong data.

The slab stays the trainer's until every view of it is garbage: the views derive from one
owner array whose finalizer reports the slab's name, and the loader process keeps its own
copy of the batch alive until then (:mod:`aioloader.run.loaderproc`).

:func:`encode` and :func:`decode` are pure but for the memory they point into; a test gives
them an ``mmap`` of its own.
"""

from __future__ import annotations

import itertools
import mmap
import pickle
import sys
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from aioloader.base.tree import TreeDef, flatten, unflatten
from aioloader.errors import LoaderError
from aioloader.memory.segments import SegmentHandle, attach
from aioloader.run.pinning import HostPins

__all__ = [
    "SPILL_BYTES",
    "Located",
    "SlabMaps",
    "SlabRef",
    "decode",
    "encode",
    "pack_error",
    "spill",
    "unpack_error",
]

#: An array leaf of ordinary memory at least this large crosses through a one-shot segment
#: (:func:`spill`); smaller ones are cheaper pickled.
SPILL_BYTES = 1 << 20


@dataclass(frozen=True)
class SlabRef:
    """A leaf that views slab ``slab`` (an index into the message's slab handles): ``offset
    bytes from the segment's start, ``shape``, ``strides`` in bytes (never negative), and
    ``dtype`` (a NumPy dtype string, or a torch dtype name such as ``'bfloat16'`` when
    ``torch``)."""

    slab: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    torch: bool


@dataclass(frozen=True)
class Located:
    """A slab the loader knows: its ``handle``, the address its mapping starts at in this
    process, and its ``size`` in bytes."""

    handle: SegmentHandle
    address: int
    size: int


def _span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int | None:
    """Bytes from the first element to the end of the last one, or None when a stride is
    negative (such a view is pickled)."""
    if any(s < 0 for s in strides):
        return None
    return sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + itemsize


#: Leaves that are never arrays: :func:`encode` and :func:`spill` pass them by before any
#: isinstance (a batch of file bytes is thousands of them a second).
_PLAIN = frozenset({bytes, str, int, float, bool, type(None)})


def _describe(leaf: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], str, int, bool] | None:
    """``(address, shape, byte strides, dtype, itemsize, torch)`` of an array leaf."""
    if isinstance(leaf, np.ndarray):
        if leaf.dtype.hasobject or leaf.size == 0:
            return None
        return leaf.ctypes.data, leaf.shape, leaf.strides, leaf.dtype.str, leaf.itemsize, False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(leaf, torch.Tensor):
        if leaf.device.type != "cpu" or leaf.numel() == 0 or leaf.is_sparse or leaf.requires_grad:
            return None
        size = leaf.element_size()
        strides = tuple(s * size for s in leaf.stride())
        name = str(leaf.dtype).removeprefix("torch.")
        return leaf.data_ptr(), tuple(leaf.shape), strides, name, size, True
    return None


def encode(value: Any, slabs: list[Located]) -> tuple[TreeDef, list[Any], list[SegmentHandle]]:
    """``(treedef, leaves, handles)``: ``value`` flattened, each array leaf that lies wholly
    inside one of ``slabs`` replaced by a :class:`SlabRef` into ``handles`` (the slabs used,
    in order of first use)."""
    treedef, leaves = flatten(value)
    handles: list[SegmentHandle] = []
    out: list[Any] = []
    for leaf in leaves:
        if type(leaf) in _PLAIN:
            out.append(leaf)
            continue
        d = _describe(leaf)
        ref = None
        if d is not None:
            address, shape, strides, dtype, itemsize, is_torch = d
            span = _span(shape, strides, itemsize)
            for slab in slabs:
                offset = address - slab.address
                if span is not None and offset >= 0 and offset + span <= slab.size and offset % itemsize == 0:
                    if slab.handle not in handles:
                        handles.append(slab.handle)
                    ref = SlabRef(handles.index(slab.handle), offset, shape, strides, dtype, is_torch)
                    break
        out.append(leaf if ref is None else ref)
    return treedef, out, handles


def spill(leaves: list[Any], handles: list[SegmentHandle], make: Callable[[int], Any]) -> list[Any]:
    """Copy each array leaf of ordinary memory of at least :data:`SPILL_BYTES` (what a
    custom ``collate`` built, say) into a new segment ``make(nbytes)`` (a
    :class:`~aioloader.memory.segments.Segment`), replacing it in ``leaves`` by a
    :class:`SlabRef` and adding the segment's handle to ``handles``; returns the segments made.

    Pickled, such a leaf would be copied three times (into the pickle, through the pipe,
    out of it) and the last copy would hold the GIL of the trainer's process; spilled, it
    is copied once, in the loader process, and mapped by the trainer, as DataLoader's
    workers hand batches over in shared memory."""
    made: list[Any] = []
    for i, leaf in enumerate(leaves):
        d = None if type(leaf) in _PLAIN or isinstance(leaf, SlabRef) else _describe(leaf)
        if d is None:
            continue
        _, shape, _, dtype, itemsize, is_torch = d
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        if nbytes < SPILL_BYTES:
            continue
        segment = make(nbytes)
        made.append(segment)
        dest = np.frombuffer(segment.mmap, dtype=np.uint8, count=nbytes)
        if is_torch:
            torch = sys.modules["torch"]
            torch.from_numpy(dest).view(leaf.dtype).view(leaf.shape).copy_(leaf)
        else:
            np.copyto(dest.view(leaf.dtype).reshape(shape), leaf, casting="no")
        del dest
        strides = tuple(int(x) * itemsize for x in _contiguous(shape))
        handles.append(segment.handle)
        leaves[i] = SlabRef(len(handles) - 1, 0, shape, strides, dtype, is_torch)
    return made


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides of ``shape``, in elements."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


class _Owner(np.ndarray):
    """A slab's bytes in the trainer: every leaf of a batch derives from one, and its
    finalizer gives the slab back (a subclass, so NumPy keeps it as the views' base)."""


def decode(
    treedef: TreeDef,
    leaves: list[Any],
    buffers: list[mmap.mmap],
    released: Callable[[int], None],
) -> Any:
    """The value :func:`encode` described, its :class:`SlabRef` leaves viewing
    ``buffers`` (the mappings of the message's slabs, in order). ``released(i)`` runs once
    every view of slab ``i`` is garbage (from whichever thread drops the last one)."""
    owners: list[np.ndarray[Any, Any]] = []
    for i, buf in enumerate(buffers):
        owner = np.frombuffer(buf, dtype=np.uint8).view(_Owner)
        weakref.finalize(owner, released, i)
        owners.append(owner)
    out = [_view(owners[x.slab], x) if isinstance(x, SlabRef) else x for x in leaves]
    del owners
    return unflatten(treedef, out)


def _view(owner: np.ndarray[Any, Any], ref: SlabRef) -> Any:
    if not ref.torch:
        # From a slice of the owner, so the view's base chain holds the owner and its
        # finalizer waits for the view. (``np.ndarray(buffer=owner)`` would take the owner's
        # base instead: the slab was reported free, and reused, while the view lived.)
        dtype = np.dtype(ref.dtype)
        span = _span(ref.shape, ref.strides, dtype.itemsize)
        assert span is not None
        raw = owner[ref.offset : ref.offset + span].view(np.ndarray).view(dtype)
        return np.lib.stride_tricks.as_strided(raw, ref.shape, ref.strides, writeable=True)
    torch = sys.modules["torch"]
    dtype = getattr(torch, ref.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    span = _span(ref.shape, ref.strides, itemsize)
    assert span is not None
    raw = torch.from_numpy(owner[ref.offset : ref.offset + span].view(np.ndarray)).view(dtype)
    return raw.as_strided(ref.shape, tuple(s // itemsize for s in ref.strides))


class SlabMaps:
    """The trainer's mappings of the loader's slabs, by name (unique, unlike the
    ``/proc/<pid>/fd/<n>`` path); the ``limit`` most recently used are kept (a mapping still
    viewed by a batch lives on until the batch is garbage)."""

    def __init__(self, limit: int, pins: HostPins | None = None) -> None:
        self.limit = limit
        #: Where the mappings are page-locked for the device copy (the bridge's; None: not).
        #: A mapping is registered when it is made and released before it is unmapped.
        self.pins = pins
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()

    def get(self, handle: SegmentHandle) -> mmap.mmap:
        """The slab's mapping; OSError (:class:`~aioloader.memory.segments.SegmentGone` among them)
        when it cannot be mapped, or its path is another file now."""
        m = self._maps.get(handle.name)
        if m is not None:
            self._maps.move_to_end(handle.name)
            return m
        m = attach(handle)
        self._maps[handle.name] = m
        if self.pins is not None:
            self.pins.pin(m)
        while len(self._maps) > self.limit:
            self._unmap(self._maps.popitem(last=False)[1])
        return m

    def close(self) -> None:
        while self._maps:
            self._unmap(self._maps.popitem()[1])

    def _unmap(self, m: mmap.mmap) -> None:
        if self.pins is not None:
            self.pins.unpin(m)  # first: a registration must never outlive its mapping
        _close(m)


def _close(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a batch still views it: it is unmapped when that is garbage
        pass


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(cloudpickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to pickle
        return LoaderError(f"{type(exc).__name__}: {exc}")


def _frames_here(exc: BaseException) -> str:
    """``exc``'s traceback in this process without its own message, which the trainer prints
    anyway (a DecodeError's holds the worker's traceback: printing it again doubled it); its
    causes' tracebacks too where one was raised here (a user's ``read``)."""
    cause = exc.__cause__
    te = traceback.TracebackException.from_exception(exc)
    lines = list(te.format(chain=cause is not None and cause.__traceback__ is not None))
    own = len(list(te.format_exception_only()))
    return "".join(lines[:-own]).rstrip()


def pack_error(exc: BaseException) -> bytes:
    """``exc`` and its chain of causes, pickled (pickling an exception drops its
    ``__cause__``, so the chain is a list); the loader process's traceback becomes a note
    on ``exc``, unless it carries a worker's traceback. By value where it must be
    (cloudpickle): an exception class the user defined in ``__main__`` or a notebook reaches
    the trainer as that same class."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen and len(chain) < 8:
        seen.add(id(at))
        chain.append(_picklable(at))
        at = at.__cause__
    # A worker's DecodeError already shows where it failed; the loader process only relayed it.
    relayed = bool(getattr(exc, "worker_traceback", ""))
    if hasattr(chain[0], "add_note") and not relayed:
        chain[0].add_note(f"--- in the loader process ---\n{_frames_here(exc)}")
    blob: bytes = cloudpickle.dumps(chain)
    return blob


def unpack_error(blob: bytes) -> BaseException:
    """The exception :func:`pack_error` packed, its causes chained again."""
    chain: list[BaseException] = pickle.loads(blob)
    for exc, cause in itertools.pairwise(chain):
        exc.__cause__ = cause
    return chain[0]
