"""What the trainer's process and its loader process say to each other
(:mod:`aioloader.run.procruntime` on the trainer's side, :mod:`aioloader.run.loaderproc` on
the loader process's): one type per message, read by attribute and told apart by type
(``match``, ``isinstance``), never by position.

On the control Connection, each message pickled (protocol 5) in one ``send_bytes``:

trainer -> loader process (:data:`Control`):

- :class:`StartRun` ``run_id, epoch, resume, restore``: cancel the current run, if any, and
  produce ``epoch`` from ``resume`` (its start when None); ``restore``, the trainer's
  failure counts when a resumed run's state restored them since the last run.
- :class:`CancelRun` ``run_id``: stop that run (ignored when another is current).
- :class:`Close`: stop the pipeline and exit (end of file on the Connection means the same).

loader process -> trainer (:data:`Report`):

- :class:`Ready` ``error``: once, when the pipeline is built; ``error`` is why it could not
  be (:func:`~aioloader.run.wire.pack_error`), None when it was.
- :class:`BatchMsg` ``run_id, index, size, done, treedef, leaves, handles, counts``: a batch
  (:mod:`aioloader.run.wire` says how its value crosses).
- :class:`EndMsg` ``run_id, counts``: the run's last batch was sent.
- :class:`FailMsg` ``run_id, error, counts``: the run stopped on ``error``.
- :class:`LogMsg` ``record``: an ``aioloader`` log record, for the trainer's handlers.
- :class:`Closed` ``cache``: the last message, once closed: the sample cache's last counts.

``counts`` is the loader process's :meth:`~aioloader.observe.stats.Counters.loader_side`,
sent with each item so the trainer's stats follow batch by batch.

On the back pipe, trainer -> loader process, text lines (:data:`BackLine`), written only by
:func:`back_lines` and read only by :func:`parse_back`. Text, not pickles, because a line is
written by a finalizer (a batch's views become garbage in any thread, at any allocation):
one ``os.write`` of a few bytes, no lock but the writer's own, nothing to import or pickle.

- :class:`Released` ``b"R <slab>"``: every view of slab ``<slab>`` (its unique name) is
  garbage: the loader process may reuse it.
- :class:`Taken` ``b"C <run_id>"``: the bridge took an item of that run: one more may be sent.
- :class:`Waited` ``b"W <seconds> <batches>"``: the trainer's totals of seconds waited for
  batches and batches delivered (written with a :class:`Taken`, when they grew).

Every class is a frozen, slotted dataclass; those that are pickled have a ``__reduce__`` of
their constructor: several cross per batch, each costs a constructor call, not a
``__setstate__`` (nor, on Python 3.10, a failure: a frozen slotted dataclass does not
unpickle there without one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from aioloader.base.tree import TreeDef
    from aioloader.memory.segments import SegmentHandle
    from aioloader.observe.cachestats import CacheStats
    from aioloader.observe.stats import LoaderSide
    from aioloader.plan.resume import ResumePoint

__all__ = [
    "BackLine",
    "BatchMsg",
    "CancelRun",
    "Close",
    "Closed",
    "Control",
    "EndMsg",
    "FailMsg",
    "LogMsg",
    "Ready",
    "Released",
    "Report",
    "Restore",
    "RunMsg",
    "StartRun",
    "Taken",
    "Waited",
    "back_lines",
    "parse_back",
]


# -- trainer -> loader process, on the control Connection ------------------------------------------


@dataclass(frozen=True, slots=True)
class Restore:
    """The trainer's failure counts, carried over from a resumed run's state: ``failures`` by
    reason and samples ``attempted``, over the loader's life."""

    failures: dict[str, int]
    attempted: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (Restore, (self.failures, self.attempted))


@dataclass(frozen=True, slots=True)
class StartRun:
    """Start run ``run_id`` (the trainer's count of runs, from 1) over ``epoch`` from
    ``resume``; ``restore``: counts to take over first (None: none changed)."""

    run_id: int
    epoch: int
    resume: ResumePoint | None
    restore: Restore | None

    def __reduce__(self) -> tuple[Any, ...]:
        return (StartRun, (self.run_id, self.epoch, self.resume, self.restore))


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Stop run ``run_id`` if it is the current one."""

    run_id: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (CancelRun, (self.run_id,))


@dataclass(frozen=True, slots=True)
class Close:
    """Stop the pipeline and exit."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (Close, ())


# -- loader process -> trainer, on the control Connection ------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The pipeline is built (``error`` None), or could not be: ``error`` is the exception,
    packed by :func:`~aioloader.run.wire.pack_error`."""

    error: bytes | None

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ready, (self.error,))


@dataclass(frozen=True, slots=True)
class BatchMsg:
    """Batch ``index`` (0-based in its epoch) of run ``run_id``: ``size`` samples; ``done``,
    the plan batches it completes (:class:`~aioloader.base.items.Batch`). Its value is
    ``treedef`` and ``leaves`` (each a :class:`~aioloader.run.wire.SlabRef` into ``handles``,
    the slabs it views, or a plain value); ``counts``, the loader side's counts now."""

    run_id: int
    index: int
    size: int
    done: tuple[int, ...]
    treedef: TreeDef
    leaves: list[Any]
    handles: list[SegmentHandle]
    counts: LoaderSide

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.run_id, self.index, self.size, self.done, self.treedef, self.leaves)
        return (BatchMsg, (*fields, self.handles, self.counts))


@dataclass(frozen=True, slots=True)
class EndMsg:
    """Run ``run_id`` sent its last batch; ``counts``, the loader side's counts now."""

    run_id: int
    counts: LoaderSide

    def __reduce__(self) -> tuple[Any, ...]:
        return (EndMsg, (self.run_id, self.counts))


@dataclass(frozen=True, slots=True)
class FailMsg:
    """Run ``run_id`` stopped on ``error`` (packed by :func:`~aioloader.run.wire.pack_error`);
    ``counts``, the loader side's counts now."""

    run_id: int
    error: bytes
    counts: LoaderSide

    def __reduce__(self) -> tuple[Any, ...]:
        return (FailMsg, (self.run_id, self.error, self.counts))


@dataclass(frozen=True, slots=True)
class LogMsg:
    """An ``aioloader`` log record of the loader process, its message already formatted and
    its traceback text (no frames: they do not pickle)."""

    record: logging.LogRecord

    def __reduce__(self) -> tuple[Any, ...]:
        return (LogMsg, (self.record,))


@dataclass(frozen=True, slots=True)
class Closed:
    """The loader process closed; ``cache``: the sample cache's counts as closing left them
    (None without a cache)."""

    cache: CacheStats | None

    def __reduce__(self) -> tuple[Any, ...]:
        return (Closed, (self.cache,))


# -- trainer -> loader process, on the back pipe -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Released:
    """Every view of slab ``slab`` (its unique name) is garbage in the trainer's process."""

    slab: str


@dataclass(frozen=True, slots=True)
class Taken:
    """The bridge took an item of run ``run_id``."""

    run_id: int


@dataclass(frozen=True, slots=True)
class Waited:
    """The trainer waited ``seconds`` in all for ``batches`` batches delivered in all."""

    seconds: float
    batches: int


#: What the trainer sends on the control Connection.
Control: TypeAlias = StartRun | CancelRun | Close
#: What the loader process sends on it.
Report: TypeAlias = Ready | BatchMsg | EndMsg | FailMsg | LogMsg | Closed
#: The reports that belong to a run (:attr:`run_id`): a bridge reading another run's drops them.
RunMsg: TypeAlias = BatchMsg | EndMsg | FailMsg
#: A line on the back pipe.
BackLine: TypeAlias = Released | Taken | Waited


def back_lines(*msgs: BackLine) -> bytes:
    """``msgs`` as back-pipe lines, each ended by a newline, for one ``os.write``."""
    out = b""
    for msg in msgs:
        if isinstance(msg, Released):
            out += b"R %s\n" % msg.slab.encode()
        elif isinstance(msg, Taken):
            out += b"C %d\n" % msg.run_id
        else:
            out += b"W %.6f %d\n" % (msg.seconds, msg.batches)
    return out


def parse_back(line: bytes) -> BackLine | None:
    """The message of one back-pipe line (without its newline); None for a line of no kind
    known here."""
    kind, _, arg = line.partition(b" ")
    if kind == b"R":
        return Released(arg.decode())
    if kind == b"C":
        return Taken(int(arg))
    if kind == b"W":
        seconds, _, batches = arg.partition(b" ")
        return Waited(float(seconds), int(batches))
    return None
