"""What a failed Ray task becomes, per sample (pure: no Ray, no loop).

A task can fail without an answer in three ways (:func:`kind_of` sorts Ray's exceptions):

- ``CRASH``: its worker process died (a signal, ``os._exit``, the OOM killer), or its node
  did. Ray does not say which sample was being decoded, so a chunk of several samples is
  split and each sample sent again alone, none of them blamed; a sample alone whose task
  crashes is charged, and charged twice it is a poison sample (``DecodeError``), as with
  local workers. A node that dies mid-epoch thus costs its chunks one more try each.
- ``STUCK``: the loader cancelled the task (``force=True``, which kills its worker) because
  it ran past ``sample_timeout`` for each of its samples without answering: a decode
  stuck where ``SIGALRM`` cannot reach it. Split in the same way; a sample alone that is
  stuck is a ``LoaderTimeoutError``.
- ``LOST``: the answer was lost (its object's node died after the task ended, the
  object store failed to fetch it): the same chunk is sent again, unblamed, at most
  :data:`MAX_LOST` times in a row before the whole loader stops with a ``LoaderError``.

Anything else (a bug in the task, a decode function that does not unpickle on the
cluster) stops the loader (``FATAL``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["MAX_LOST", "Kind", "Next", "Recovery", "kind_of"]

#: Tries of one chunk whose answers were lost, in a row, before the loader gives up.
MAX_LOST = 5


class Kind(enum.Enum):
    CRASH = "crash"
    STUCK = "stuck"
    LOST = "lost"
    FATAL = "fatal"


#: Ray's exception class names, by what they mean for a task's samples.
_CRASH = frozenset({"WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "TaskUnschedulableError"})
_LOST = frozenset(
    {
        "ObjectLostError",
        "ObjectFetchTimedOutError",
        "ReferenceCountingAssertionError",
        "OwnerDiedError",
        "ObjectReconstructionFailedError",
        "ObjectReconstructionFailedMaxAttemptsExceededError",
        "ObjectReconstructionFailedLineageEvictedError",
        "RaySystemError",
        "GetTimeoutError",
        "ObjectStoreFullError",
        "OutOfDiskError",
    }
)


def kind_of(exc: BaseException) -> Kind:
    """What ``exc``, raised for a task's answer, means (by Ray's class names, so this module
    needs no Ray)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _CRASH:
        return Kind.CRASH
    if "TaskCancelledError" in names:
        return Kind.STUCK  # the loader cancels a task only for that (close() ends the wait first)
    if names & _LOST:
        return Kind.LOST
    return Kind.FATAL


@dataclass(frozen=True)
class Next:
    """What to do after a failed task: ``again``, groups of rows to send (each one task);
    ``poison``, rows that crashed their worker twice; ``timed_out``, rows stuck alone;
    ``give_up``: too many answers lost in a row."""

    again: list[list[int]] = field(default_factory=list)
    poison: list[int] = field(default_factory=list)
    timed_out: list[int] = field(default_factory=list)
    give_up: bool = False


class Recovery:
    """One chunk's failures so far (crashes charged per row, answers lost in a row)."""

    def __init__(self) -> None:
        self.crashes: dict[int, int] = {}
        self.lost = 0

    def failed(self, rows: list[int], kind: Kind) -> Next:
        """The task of ``rows`` failed with ``kind`` (not ``FATAL``): what comes next."""
        if kind is Kind.LOST:
            self.lost += 1
            return Next(give_up=True) if self.lost > MAX_LOST else Next(again=[rows])
        if len(rows) > 1:  # who was decoding is unknown: each sample alone, none blamed
            return Next(again=[[r] for r in rows])
        (row,) = rows
        if kind is Kind.STUCK:
            return Next(timed_out=[row])
        self.crashes[row] = self.crashes.get(row, 0) + 1
        return Next(poison=[row]) if self.crashes[row] >= 2 else Next(again=[[row]])

    def answered(self) -> None:
        """A task of this chunk answered: answers lost count again from zero."""
        self.lost = 0
