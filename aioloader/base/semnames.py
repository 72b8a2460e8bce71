"""The names of the POSIX semaphores a process makes, kept ``sem.mp-aioloader-<pid>-...``.

Two things rename them, and both change process-wide state that other threads read:

- a decode pool's queues are made under :func:`named_for_this_process`, which sets
  multiprocessing's ``semprefix`` so ``aioloader doctor`` (and a user) can tell whose a
  leftover ``/dev/shm/sem.mp-aioloader-<pid>-<random>`` is;
- importing loky (for its cgroup-aware ``cpu_count``) replaces ``SemLock._make_name`` with its
  own ``/loky-<pid>-...`` names, for every semaphore made from then on.

:func:`import_loky_cpu_count` undoes loky's change. Both hold one lock: the pool starts its
executor on a thread of its own while the pipeline asks ``usable_cpus()``, and a semaphore made
while loky's name maker was in place would have a name nothing looks for.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = ["import_loky_cpu_count", "named_for_this_process"]

_lock = threading.Lock()


@contextlib.contextmanager
def named_for_this_process() -> Iterator[None]:
    """Name the POSIX semaphores made meanwhile ``/dev/shm/sem.mp-aioloader-<pid>-<random>``
    instead of ``sem.mp-<random>``. Linux only: elsewhere names are short (31 bytes on macOS)
    and not files."""
    config = mp.current_process()._config  # type: ignore[attr-defined]
    if not sys.platform.startswith("linux") or "semprefix" not in config:
        yield
        return
    with _lock:
        saved = config["semprefix"]
        config["semprefix"] = f"{saved}-aioloader-{os.getpid()}"
        try:
            yield
        finally:
            config["semprefix"] = saved


def import_loky_cpu_count() -> Callable[[], int]:
    """loky's ``cpu_count``, imported with multiprocessing's semaphore names left as they were.

    Imported on first use: loky's import is slow (RESULTS, "Figures moved out of the code"),
    and ``import aioloader`` and the worker processes need not pay for it."""
    from multiprocessing import synchronize

    with _lock:
        make_name = vars(synchronize.SemLock)["_make_name"]  # the staticmethod itself
        try:
            from loky import cpu_count
        finally:
            synchronize.SemLock._make_name = make_name  # type: ignore[attr-defined]
    return cpu_count  # type: ignore[no-any-return]
