"""``io_concurrency="auto"`` and ``num_workers="auto"``: the decisions, pure. The tuner
(:mod:`aioloader.tune.tuner`) feeds them what the stage meters and the CPU clocks measured over
each tick and applies what they return.

**Reads in flight** (:class:`IoTuner`), by Little's law: a stage that must pass ``λ``
samples a second, each holding a read slot for ``W`` seconds on average, needs ``L = λ·W``
slots. ``W`` is measured (read slot-seconds over files read: a group of page-cached files
read in one hop holds one slot for all of them). ``λ`` is what the decoders could take: the
samples they decoded over the share of time they were busy (a decoder starved by slow reads
at 25% busy could take four times what it got). The limit is ``HEADROOM·λ·W`` (reads come
in bursts: a decode chunk waits for its last file), between ``lo`` and ``hi``:

- it grows only while reads hold most of their slots (free slots mean reads are not what
  limits), to at most four times itself a tick;
- a growth that did not raise the read rate by 10% means the storage is saturated (its
  latency grew with the load): the limit does not grow past it for :data:`HOLD_TICKS`,
  then may try again;
- it shrinks, by at most half a tick, when it is over twice what is needed.

``hi`` comes from the open-file limit and a memory bound (:func:`memory_cap`): every read
in flight holds its file, and its batch's slab holds the decoded sample.

**Decode processes** (:class:`WorkerTuner`): the pool keeps one process per usable CPU (this
rank's part of the node's, ``LoaderConfig.cpus_per_rank``); of those, ``usable - reserve``
decode at once, where ``reserve`` is the CPUs the trainer's
process measurably uses (its CPU time over wall time, the loader's own threads included,
rounded), so decoding does not take the cores the training step runs on. A change needs
two ticks in a row that agree.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = [
    "HEADROOM",
    "HOLD_TICKS",
    "IoTuner",
    "IoWindow",
    "WorkerTuner",
    "memory_cap",
    "process_cpu_seconds",
]

#: Reads in flight per read the decoders need at once (bursts, latency spread).
HEADROOM = 2.0
#: Fewest reads a tick judges; a tick with fewer waits for the next.
MIN_READS = 32
#: Ticks a limit found useless to exceed stays a ceiling.
HOLD_TICKS = 20
#: Least read-slot occupancy (mean reads in flight over the limit) for growth to help.
SATURATED = 0.5


@dataclass(frozen=True)
class IoWindow:
    """What the meters measured over one tick (seconds of wall time)."""

    seconds: float
    reads: int  #: files read
    read_area: float  #: read slot-seconds (time integral of reads in flight)
    decoded: int = 0  #: samples decoded
    decode_area: float = 0.0  #: decode chunk-seconds (time integral of chunks in flight)
    workers: int = 0  #: decoding processes (0: no decode stage)


class IoTuner:
    """The reads-in-flight limit, between ``lo`` and ``hi`` (see the module docstring)."""

    def __init__(self, start: int, lo: int, hi: int) -> None:
        if not 1 <= lo <= hi:
            raise ValueError(f"bounds lo={lo}, hi={hi} must satisfy 1 <= lo <= hi")
        self.lo, self.hi = lo, hi
        self.limit = min(hi, max(lo, start))
        self._grew_from: float | None = None  # the read rate before a growth, to judge it
        self._ceiling: int | None = None
        self._hold = 0

    def set_hi(self, hi: int) -> None:
        """A new upper bound (the memory bound moves as file sizes become known)."""
        self.hi = max(self.lo, hi)
        self.limit = min(self.limit, self.hi)

    def needed(self, w: IoWindow) -> float:
        """Reads in flight the decoders need, by Little's law (not yet bounded)."""
        rate = w.reads / w.seconds
        per_read = w.read_area / w.reads  # slot-seconds per file
        if w.workers > 0 and w.decoded > 0:
            busy = min(1.0, w.decode_area / (w.seconds * w.workers))
            capacity = (w.decoded / w.seconds) / max(busy, 0.05)
        else:  # no decoder: reads feed collate and the trainer; what they take shows as saturation
            occupancy = w.read_area / (w.seconds * self.limit)
            capacity = rate * (2.0 if occupancy >= SATURATED else 1.0)
        return HEADROOM * capacity * per_read

    def update(self, w: IoWindow) -> int:
        """The limit for the next tick, given the last one's figures."""
        if w.reads < MIN_READS or w.seconds <= 0:
            return self.limit
        rate = w.reads / w.seconds
        if self._hold > 0:
            self._hold -= 1
            if self._hold == 0:
                self._ceiling = None
        if self._grew_from is not None:
            before_rate, self._grew_from = self._grew_from, None
            if rate < 1.1 * before_rate:  # more in flight did not read faster: saturated
                # Kept (more in flight costs memory, not speed), but not exceeded for a while.
                self._ceiling, self._hold = self.limit, HOLD_TICKS
        want = math.ceil(self.needed(w))
        cap = self.hi if self._ceiling is None else min(self.hi, self._ceiling)
        occupancy = w.read_area / (w.seconds * self.limit)
        if want > self.limit and occupancy >= SATURATED and self.limit < cap:
            new = min(want, 4 * self.limit, cap)
            if new >= 1.5 * self.limit:  # big enough to judge by the read rate next tick
                self._grew_from = rate
            self.limit = new
        elif want < self.limit / 2:
            self.limit = max(want, self.limit // 2, self.lo)
        return self.limit


class WorkerTuner:
    """How many of ``processes`` decode at once (see the module docstring)."""

    def __init__(self, processes: int, usable: int) -> None:
        self.processes, self.usable = processes, usable
        self.active = processes
        self._pending: int | None = None

    def target(self, trainer_cpus: float) -> int:
        """Decoders for a trainer's process using ``trainer_cpus`` CPUs (0.6 = 60% of one)."""
        reserve = math.floor(max(0.0, trainer_cpus) + 0.5)
        return max(1, min(self.processes, self.usable - reserve))

    def update(self, trainer_cpus: float) -> int:
        """The decoders for the next tick; changes when two ticks in a row agree."""
        want = self.target(trainer_cpus)
        if want == self.active:
            self._pending = None
        elif want == self._pending:
            self.active, self._pending = want, None
        else:
            self._pending = want
        return self.active


def memory_cap(budget: int, bytes_per_sample: int, batch_size: int) -> int:
    """Most reads in flight whose files and batch slabs fit in ``budget`` bytes: batches
    under construction are ``reads / batch_size + 2``, and each sample of them holds its
    file and its decoded output (``bytes_per_sample``)."""
    per = max(1, bytes_per_sample)
    return max(1, budget // per - 2 * batch_size)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, every thread, not its children) used so far by ``pid``;
    None where it cannot be read (not Linux, or gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None
