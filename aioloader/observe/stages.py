"""Per-stage figures for ``loader.stats.stages``: how busy each stage of the pipeline is, how
many items it holds against its bound, and how long one item takes.

A :class:`StageMeter` is told when items enter and leave its stage (:meth:`~StageMeter.enter`,
:meth:`~StageMeter.leave`). From that it keeps, in seconds of its ``clock`` (``time.perf_counter``
unless one is passed in: a test advances a fake one by hand):

- ``busy``: the time with at least one item in the stage;
- the time integral of the items in it, so ``mean_in_flight = area / elapsed``;
- the last :data:`KEPT` per-item latencies, for p50 and p99.

Each call costs two clock reads and a lock held for a few additions, once per read, decode
chunk, batch and copy: a small share of a sample's cost (RESULTS §14a). :class:`StageStats` is the
immutable snapshot; :func:`utilization` says how close a stage runs to its capacity.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aioloader.observe.trace import Tracer

__all__ = ["KEPT", "STAGES", "StageMeter", "StageStats", "Timed", "between", "utilization"]

#: The loader's metered stages, in pipeline order (``loader.stats.stages`` also has the loop's,
#: :mod:`aioloader.observe.loopmeter`; ``bottleneck.stage`` may also be ``"loop"`` or ``"trainer"``).
STAGES = ("read", "decode", "collate", "transfer")
#: Latencies kept per stage for the percentiles.
KEPT = 2048
#: Seconds a computed p50/p99 is reused before the latencies are sorted again.
PERCENTILE_EVERY = 0.25


@dataclass(frozen=True)
class StageStats:
    """One stage over the loader's life (times in seconds, latencies in milliseconds).

    ``items`` counts samples for reads (each try of a retried read) and decodes, batches
    for collate and transfer; the latencies are per read, per decoded sample (its chunk's
    time in a worker over its samples, the wait behind the worker's previous chunk
    included), per batch.

    ``capacity`` is how many items the stage can work on at once (I/O slots for reads,
    worker processes for decode, one thread for collate and for transfer); ``bound`` is
    how many it may hold (decodes: one running and one queued per worker).
    """

    name: str
    items: int = 0
    busy_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    in_flight: int = 0
    area_seconds: float = 0.0  #: the time integral of the items in flight (item-seconds)
    bound: int = 1
    capacity: int = 1
    p50_ms: float | None = None
    p99_ms: float | None = None

    @property
    def mean_in_flight(self) -> float:
        """Items in the stage on average over the elapsed time."""
        return self.area_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    @property
    def busy_share(self) -> float:
        """Share of the elapsed time with at least one item in the stage (0..1)."""
        return self.busy_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    def __str__(self) -> str:
        lat = "" if self.p50_ms is None else f", p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms"
        return (
            f"{self.name}: {self.items} items, busy {self.busy_share:.0%}, "
            f"{self.mean_in_flight:.1f} of {self.bound} in flight on average{lat}"
        )


def utilization(stage: StageStats) -> float:
    """How close ``stage`` ran to its capacity, 0..1: its mean items in flight over its
    capacity (a stage of one thread: the share of time it was busy)."""
    if stage.elapsed_seconds <= 0:
        return 0.0
    return min(1.0, stage.mean_in_flight / max(1, stage.capacity))


class StageMeter:
    """The counters of one stage (see the module docstring); any thread may call it.

    ``clock`` is read for every time the meter keeps (seconds, increasing): the times
    :meth:`enter` returns and :meth:`leave` takes are its readings."""

    def __init__(
        self,
        name: str,
        bound: int = 1,
        capacity: int | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.name = name
        self.bound = bound
        self.capacity = capacity if capacity is not None else bound
        self.clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._last = self._start  # when the in-flight count last changed
        self._n = 0
        self._area = 0.0
        self._busy = 0.0
        self._items = 0
        self._latencies: deque[float] = deque(maxlen=KEPT)
        #: p50, p99 and when they were sorted out: at most every PERCENTILE_EVERY seconds,
        #: as a loader process snapshots its stages with every batch it sends.
        self._pct: tuple[float | None, float | None] = (None, None)
        self._pct_at = -math.inf
        #: Set by ``aioloader bench --trace``: told of every item that leaves.
        self.tracer: Tracer | None = None

    def _advance(self, now: float) -> None:
        dt = now - self._last
        if self._n:
            self._area += self._n * dt
            self._busy += dt
        self._last = now

    def enter(self, n: int = 1) -> float:
        """``n`` items enter; returns the time, for :meth:`leave`."""
        now = self.clock()
        with self._lock:
            self._advance(now)
            self._n += n
        return now

    def leave(self, entered: float, n: int = 1, per: int = 1) -> None:
        """``n`` items that entered at ``entered`` leave, having carried ``per`` samples
        (a decode chunk: one item in flight, several samples done one after another in one
        worker). One latency is recorded: the time in the stage divided by ``per``."""
        now = self.clock()
        took = now - entered
        with self._lock:
            self._advance(now)
            self._n -= n
            self._items += max(n, per)
            self._latencies.append(took / max(1, per))
        if self.tracer is not None:
            self.tracer.add(self.name, entered, took, max(n, per))

    def timed(self, per: int = 1) -> Timed:
        """``with meter.timed() as t:``: one item in the stage for the block, however it ends
        (:meth:`enter`, then :meth:`leave`); ``t.per``, set inside, is the samples it carried."""
        return Timed(self, per)

    def snapshot(self, percentiles: bool = True) -> StageStats:
        """The figures so far; without ``percentiles`` (no sort), for a per-batch mark."""
        now = self.clock()
        with self._lock:
            self._advance(now)
            if percentiles and now - self._pct_at >= PERCENTILE_EVERY:
                ordered = sorted(self._latencies)
                self._pct = (_percentile(ordered, 0.50), _percentile(ordered, 0.99))
                self._pct_at = now
            p50, p99 = self._pct if percentiles else (None, None)
            elapsed = now - self._start
            n, busy, area, items = self._n, self._busy, self._area, self._items
        return StageStats(
            name=self.name,
            items=items,
            busy_seconds=busy,
            elapsed_seconds=elapsed,
            in_flight=n,
            area_seconds=area,
            bound=self.bound,
            capacity=self.capacity,
            p50_ms=p50,
            p99_ms=p99,
        )


def between(before: StageStats, after: StageStats) -> StageStats:
    """``after``'s stage over the time since ``before`` (both of one meter); percentiles are
    ``after``'s (over its last :data:`KEPT` items)."""
    return replace(
        after,
        items=after.items - before.items,
        busy_seconds=after.busy_seconds - before.busy_seconds,
        elapsed_seconds=after.elapsed_seconds - before.elapsed_seconds,
        area_seconds=after.area_seconds - before.area_seconds,
    )


def _percentile(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``ordered`` seconds, in milliseconds (nearest rank)."""
    if not ordered:
        return None
    i = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[i] * 1e3


class Timed:
    """One item's stay in a stage (:meth:`StageMeter.timed`); ``per``: the samples it
    carried, settable until the block ends."""

    __slots__ = ("_entered", "_meter", "per")

    def __init__(self, meter: StageMeter, per: int) -> None:
        self._meter, self.per, self._entered = meter, per, 0.0

    def __enter__(self) -> Timed:
        self._entered = self._meter.enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._meter.leave(self._entered, per=self.per)
