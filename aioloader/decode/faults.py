"""Pure: what a worker's death makes of each row of a chunk that was in flight on the local
decode pool (its Ray counterpart is :mod:`aioloader.cluster.faults`).

When the pool breaks (a worker crashed, or the loader killed one for ``sample_timeout``),
every chunk in flight comes back without an answer. Each of its rows is judged by the
worker it was on when the pool broke (the slab's status table says which; none: it was
queued, or not yet started):

- on a worker the loader killed for ``sample_timeout``: it timed out
  (:class:`~aioloader.LoaderTimeoutError`);
- on a worker that crashed: decoded again the first time; the second time, it is a poison
  sample (:class:`~aioloader.DecodeError` naming the pid and how it died);
- otherwise (another worker's death broke the pool): decoded again, not counted.

The stage resubmits what is to decode again exactly once per death.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aioloader.decode.contract import ChunkItem
from aioloader.errors import DecodeError, LoaderTimeoutError, SampleError

__all__ = ["POISON_CRASHES", "Breakage", "Fate", "Sorted", "describe_deaths", "fate", "sort_out"]

#: Crashed workers a row may be on before it is judged a poison sample.
POISON_CRASHES = 2


@dataclass(frozen=True)
class Breakage:
    """What broke the pool once: ``dead``, ``{pid: exit code}`` of the workers that died
    (killed for a timeout included), and ``timed_out``, every pid the loader killed for
    ``sample_timeout``."""

    dead: dict[int, int]
    timed_out: frozenset[int]


class Fate(enum.Enum):
    """What becomes of one row in flight when the pool broke."""

    #: Its worker was killed for ``sample_timeout``: it fails with a timeout.
    TIMED_OUT = "timed out"
    #: Its worker crashed, and a worker under it had crashed before: a poison sample.
    POISON = "poison"
    #: Its worker crashed, the first time for this row: decoded again, the crash counted.
    CRASHED_ONCE = "crashed once"
    #: Another worker's death broke the pool (or it was on none): decoded again.
    AGAIN = "again"


def fate(pid: int, broke: Breakage, crashes: int) -> Fate:
    """The fate of a row that was on worker ``pid`` (0: on none) when the pool broke as
    ``broke`` says, having been on ``crashes`` crashed workers before."""
    if pid and pid in broke.timed_out:
        return Fate.TIMED_OUT
    if pid and pid in broke.dead:
        return Fate.POISON if crashes + 1 >= POISON_CRASHES else Fate.CRASHED_ONCE
    return Fate.AGAIN


@dataclass(frozen=True)
class Sorted:
    """A broken chunk's rows sorted out: ``again``, the items to decode again (in order);
    ``ended``, each other row's error; ``crashes``, each row's crashed workers so far."""

    again: list[ChunkItem]
    ended: dict[int, SampleError]
    crashes: dict[int, int]


def sort_out(
    items: Sequence[ChunkItem],
    pids: Sequence[int],
    broke: Breakage,
    crashes: Mapping[int, int],
    *,
    timeout: float | None,
    path_of: Callable[[int], str],
) -> Sorted:
    """Sort out the ``items`` of a chunk the pool broke under: ``pids[i]``, the worker item
    ``i`` was on (0: none); ``crashes``, its rows' counts from the breakages before."""
    again: list[ChunkItem] = []
    ended: dict[int, SampleError] = {}
    counts = dict(crashes)
    for item, pid in zip(items, pids, strict=True):
        row, index = item[0], item[1]
        what = fate(pid, broke, counts.get(row, 0))
        if what is Fate.TIMED_OUT:
            ended[row] = LoaderTimeoutError(
                f"decode took longer than sample_timeout={timeout}s", path=path_of(index), index=index
            )
            continue
        if what in (Fate.CRASHED_ONCE, Fate.POISON):
            counts[row] = counts.get(row, 0) + 1
        if what is Fate.POISON:
            why = describe_deaths({pid: broke.dead[pid]})
            ended[row] = DecodeError(f"decode worker {why}, twice", path=path_of(index), index=index)
        else:
            again.append(item)
    return Sorted(again, ended, counts)


def describe_deaths(codes: Mapping[int, int | None]) -> str:
    """``"pid 12 died of SIGKILL"``, ``"pid 12 exited with code 3"``, joined."""
    parts = []
    for pid, code in sorted(codes.items()):
        if code is not None and code < 0:
            parts.append(f"pid {pid} died of {signal.Signals(-code).name}")
        else:
            parts.append(f"pid {pid} exited with code {code}")
    return ", ".join(parts) or "(unknown pid) died"
