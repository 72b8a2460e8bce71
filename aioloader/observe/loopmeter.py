"""The event loop's own stage, ``"loop"``: how busy the thread running the loader's event loop
is, as the share of wall time it spent on a CPU.

The engine's loop (the ``aioloader-loop`` thread, or the main thread of a loader process)
starts every read, tends every batch and copies small files out of the reader processes'
buffers. With many small files and ``decode=None`` no other stage is near its capacity
while the trainer waits: the loop itself is the limit, and only its CPU time shows it. A
thread's CPU time is the measure because it needs no hook in the loop (uvloop has none)
and costs one clock read per snapshot; it undercounts a loop that waits for the GIL (that
wait is not CPU time), so a loop near its limit may read somewhat below 100%.

Pure: the loop's runtime passes the thread's CPU clock in (:meth:`LoopMeter.bind`);
until then the snapshot is all zeros, which the verdict reads as "not measured".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from aioloader.observe.stages import StageStats

__all__ = ["LOOP", "LoopMeter"]

#: The loop's stage name in ``loader.stats.stages`` and ``bottleneck.stage``.
LOOP = "loop"


class LoopMeter:
    """The loop thread's CPU seconds against the wall seconds of ``clock`` since
    :meth:`bind`, as a :class:`~aioloader.observe.stages.StageStats` named ``"loop"`` whose
    ``busy_seconds`` (and ``area_seconds``: one item, the loop, while it runs) are CPU
    seconds, so its ``busy_share`` and utilization are the loop's CPU share (0..1)."""

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._cpu: Callable[[], float] | None = None
        self._wall0 = 0.0
        self._cpu0 = 0.0
        self._last_cpu = 0.0  # the last reading: kept once the thread is gone

    def bind(self, cpu: Callable[[], float] | None) -> None:
        """Measure from now on with ``cpu``: the loop thread's CPU seconds (increasing), or
        None where the platform cannot read another thread's CPU time (then nothing is
        measured)."""
        if cpu is None:
            return
        with self._lock:
            self._cpu = cpu
            self._wall0 = self.clock()
            self._cpu0 = self._last_cpu = cpu()

    @property
    def bound(self) -> bool:
        """Whether a loop of this process is measured."""
        return self._cpu is not None

    def snapshot(self, percentiles: bool = True) -> StageStats:
        """The loop's figures since :meth:`bind` (``percentiles`` is for the stage meters'
        signature: the loop has no items, so no latencies)."""
        with self._lock:
            if self._cpu is None:
                return StageStats(name=LOOP)
            try:
                self._last_cpu = self._cpu()
            except OSError:  # the thread ended (the loader closed): its time stops there
                pass
            elapsed = self.clock() - self._wall0
            # A CPU clock ticks in its own steps: never more busy than the wall time.
            busy = min(max(0.0, self._last_cpu - self._cpu0), elapsed)
        return StageStats(
            name=LOOP, busy_seconds=busy, elapsed_seconds=elapsed, area_seconds=busy, bound=1, capacity=1
        )
