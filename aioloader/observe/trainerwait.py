"""The trainer's wait for batches, as a stage of the loader reads it to steer by it.

The trainer's cursor measures, for each batch it is handed, the seconds it waited for it
(:meth:`Counters.delivered <aioloader.observe.stats.Counters.delivered>`). The device
decode's hybrid share (:mod:`aioloader.decode.hybrid`) is steered by that wait over its own
interval: :class:`TrainerWait` keeps the running totals (seconds waited, batches delivered)
and :func:`wait_share` turns two readings of them into the share of wall time the trainer
spent waiting between them.

One meter, fed two ways, read the same way by the stage:

- ``loader_process=False``: the trainer's counters are the loader's, and
  ``Counters.delivered`` adds each batch's wait to the meter the stage reads;
- a loader process: the trainer's bridging thread sends the totals on the back pipe, on the
  line of the item it takes (``b"W <seconds> <batches>"``, see
  :mod:`aioloader.run.loaderproc`), and the loader process sets its meter to them
  (:meth:`TrainerWait.set_totals`). Totals, not increments, cross: a line lost while the pipe
  closes costs nothing, and none is counted twice. They arrive a batch or so late: the bridge
  sends them when it takes the next item, which is fine for a share steered every half second.
"""

from __future__ import annotations

import threading

__all__ = ["TrainerWait", "WaitReading", "wait_share"]

#: ``(seconds waited, batches delivered)``: the trainer's totals at a moment, both only growing.
WaitReading = tuple[float, int]


class TrainerWait:
    """The trainer's totals: seconds waited for batches and batches delivered, since the
    loader started (never reset: an epoch's start is one more wait like any other). Written by
    one thread (the trainer's, or the loader process's loop), read by the stage's; a lock
    keeps the pair consistent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waited = 0.0
        self._batches = 0

    def delivered(self, waited: float) -> None:
        """One more batch handed to the trainer, after ``waited`` seconds of waiting for it."""
        with self._lock:
            self._waited += waited
            self._batches += 1

    def set_totals(self, waited: float, batches: int) -> None:
        """The totals as the trainer's process counted them (a loader process's meter)."""
        with self._lock:
            self._waited, self._batches = waited, batches

    def totals(self) -> WaitReading:
        """``(seconds waited, batches delivered)`` now."""
        with self._lock:
            return self._waited, self._batches


def wait_share(before: WaitReading, after: WaitReading, seconds: float) -> float | None:
    """The share of ``seconds`` of wall time (0..1) the trainer waited between two readings;
    None when no batch was delivered between them (a trainer in a long step and one waiting
    for a batch that has not come look the same until it comes) or no time passed.

    A wait is counted when its batch arrives, so a wait begun before ``before`` may fall in
    this span: the share is clamped to 1."""
    if after[1] <= before[1] or seconds <= 0:
        return None
    return min(1.0, max(0.0, (after[0] - before[0]) / seconds))
