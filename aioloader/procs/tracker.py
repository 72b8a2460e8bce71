"""multiprocessing's resource tracker, forked beside the zygote rather than started as a
fresh interpreter.

The tracker is the safety net for named resources: the decode pool's queues use named
POSIX semaphores (a worker forked by the zygote opens them by name), and slabs in
``/dev/shm`` (``AIOLOADER_SLABS=devshm``) are named files. Every process of the tree writes
what it makes and removes to the tracker's pipe; when the last writer is gone, however it
ended (a SIGKILL of the trainer included), the tracker removes what is left and says so.

multiprocessing starts it by exec'ing a new interpreter: about 6 MiB of private memory for a
process that reads one pipe, and the interpreter's start on the CPUs while the first batch
loads. Where the zygote is forked (:func:`aioloader.procs.forksafe.how_to_start`), the
tracker is forked at the same moment, by the same rule, and runs multiprocessing's own
tracker loop (:func:`multiprocessing.resource_tracker.main`): its memory is the trainer's,
shared, except the pages it writes. It is registered as multiprocessing's tracker of this
process (``resource_tracker._resource_tracker``), so everything that registers a name, ours
or the standard library's, writes to it, and the zygote and its helpers inherit its pipe as
they would the stock one.

What the copy does first: it closes every descriptor but its pipe's read end and stderr (a
copy of a write end would keep it from ever seeing end of file; the trainer's stdin and
stdout are closed by the stock tracker too); it drops the trainer's Python objects' claims
on it (no garbage collection, the trainer's signal handlers, warning filters and captured
``sys.stderr`` replaced by the defaults), so that what it reports reaches the terminal as
the stock tracker's would. It does *not* die with the trainer: it must outlive it, to clean
up after it.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import warnings
from multiprocessing import resource_tracker
from typing import Any

from aioloader.procs import forksafe, roles

__all__ = ["fork_tracker"]


def fork_tracker() -> int | None:
    """Fork this process's resource tracker, unless one runs already (started by
    multiprocessing, or inherited); its pid, or None when one was running. Call it only where
    a fork is safe (where the zygote is forked)."""
    rt: Any = resource_tracker._resource_tracker  # its state is private: typeshed omits it
    with rt._lock:
        if rt._fd is not None:
            return None
        r, w = os.pipe()
        try:
            pid = forksafe.fork()
        except BaseException:
            os.close(r)
            os.close(w)
            raise
        if pid == 0:  # pragma: no cover - runs in the tracker (tests see its effects)
            _become_tracker(r)
        os.close(r)
        rt._fd, rt._pid = w, pid
        return pid


def _become_tracker(r: int) -> None:  # pragma: no cover - runs in the tracker
    """The forked tracker: leave the trainer's state behind, then track (never returns)."""
    code = 0
    try:
        gc.disable()  # the trainer's garbage: its finalizers must not run here (and no walk over its objects)
        roles.become("tracker")
        faulthandler.disable()
        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.closerange(0, 2)
        os.closerange(3, r)
        os.closerange(r + 1, _max_fd())
        # The trainer's buffered output must not be written again from here; a captured
        # stderr (pytest's, a notebook's) is not where the tracker's reports belong.
        sys.stdin = sys.stdout = None
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        warnings.resetwarnings()
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        resource_tracker.main(r)
    except BaseException:  # noqa: BLE001 - whatever happens, never return into the trainer's code
        code = 1
    finally:
        os._exit(code)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 4096
