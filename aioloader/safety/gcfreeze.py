"""The cyclic garbage collector while a loader is open: what existed at start is frozen.

After ``import torch`` a process holds hundreds of thousands of objects tracked by the
cyclic garbage collector. A full collection walks all of them, with the GIL held: a stall
during which no other thread runs, neither the trainer's nor the caller's event loop
(``examples/async_train.py`` saw one, triggered by the loader's first burst of allocations:
RESULTS §9g). So, as a prefork server does, the first loader to start calls
:func:`gc.freeze`: the objects alive then (the imported modules, the model) move to the
permanent generation, later collections walk only what was made since, and the zygote and
workers forked from this process share those pages instead of copying them as the
collector writes to them. When the last open loader closes, :func:`gc.unfreeze` puts them
back. Cyclic garbage among objects that existed at start is collected only then.

A process that already froze objects itself is left alone (its freeze is its own).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["hold", "release"]

_lock = threading.Lock()
_holders = 0
_ours = False  # whether the freeze in force is ours to undo


def hold() -> None:
    """A loader starts: freeze, if it is the first and the process has not frozen itself."""
    global _holders, _ours
    with _lock:
        if _holders == 0:
            _ours = gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
        _holders += 1


def release() -> None:
    """A loader closed: unfreeze once the last one has, if the freeze was ours."""
    global _holders, _ours
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0 and _ours:
            gc.unfreeze()
            _ours = False
