"""Freed heap memory given back to the system after a burst of pickled batches.

Until a decoder's sample layout is learned (:mod:`aioloader.memory.layout`), samples cross
between processes pickled. The first batch's probe sample usually teaches it alone
(:mod:`aioloader.engine.epoch`); where it does not (it failed, or its shape was not the
others'), the first batches' samples cross pickled: from a worker to the loop, and with a
loader process, from there to the trainer (where a ``collate`` leaves them separate arrays:
one large array crosses through a segment of its own, :func:`aioloader.run.wire.spill`).
Each batch is megabytes, allocated and freed by one thread. glibc's malloc keeps what a
thread freed in that thread's arena (and, having freed a large mmapped block, raises its
mmap threshold so that the next ones come from the arena too), so those few batches stay
resident for the life of the process (RESULTS §21 measured the trainer's, with a loader
process). Once the burst is over, one ``malloc_trim(0)`` returns it.

:class:`BurstTrim` is the decision (pure); :func:`trim` the call, a no-op where the C
library has no ``malloc_trim`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

__all__ = ["BurstTrim", "trim"]

_trim_fn: Callable[[int], int] | None = None
_loaded = False
_lock = threading.Lock()


class BurstTrim:
    """Says when to trim: at the first ordinary payload after one or more large ones.

    Feed it every payload (``large``: it crossed pickled, or its size reached the caller's
    threshold). A stream that stays large (samples that are never arrays) never trims:
    there is no burst to end, and a trim per batch would cost a walk of the heap each time.
    """

    def __init__(self) -> None:
        self._burst = False
        self.trims = 0

    def saw(self, large: bool) -> bool:
        """Record one payload; True when the caller should :func:`trim` now."""
        if large:
            self._burst = True
            return False
        if self._burst:
            self._burst = False
            self.trims += 1
            return True
        return False


def trim() -> bool:
    """Give the free memory of every malloc arena back to the system (glibc's
    ``malloc_trim(0)``: about a millisecond). False where there is no such call."""
    global _trim_fn, _loaded
    with _lock:
        if not _loaded:
            _loaded = True
            try:
                # The symbols already loaded in this process (libc's among them): no
                # ctypes.util.find_library, which runs ldconfig in a subprocess.
                _trim_fn = ctypes.CDLL(None).malloc_trim
            except (OSError, AttributeError):
                _trim_fn = None
    if _trim_fn is None:
        return False
    _trim_fn(0)
    return True
