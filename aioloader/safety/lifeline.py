"""Lifelines: the loader's helper processes end when the trainer's process ends, however it
ends (SIGKILL, SIGTERM, a segfault, ``os._exit``), even while stuck in a decode.

Two mechanisms, and each helper uses both where it can:

- **The kernel's** (:func:`die_with_parent`): Linux's ``PR_SET_PDEATHSIG`` sends SIGKILL to
  a process the moment its parent dies, whatever the process is doing. The signal fires
  when the *thread* that forked the process exits, not the process, so it is only asked for
  when that thread lives as long as the parent: the parent is single-threaded (the zygote,
  a fork server) or the fork came from the main thread.
- **A pipe** (:func:`exit_when_closed`): the helper holds the read end of a pipe whose write
  end only the trainer's process holds; end of file means the trainer is gone. A daemon
  thread waits for it and ends the process. Portable, but it needs the GIL, so a decode
  that holds the GIL in C code for ever is ended by the kernel's signal instead.

The chain after a trainer dies: the zygote sees its pipe close (and on Linux gets SIGKILL),
each worker sees its own pipe close (and gets SIGKILL when the zygote dies), and
multiprocessing's resource tracker, once every holder of its pipe is gone, unlinks the
shared-memory slabs and semaphores still registered with it (see :mod:`aioloader.memory.slabs`).

What each helper is, and what it is called, is :mod:`aioloader.procs.roles`'.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading

__all__ = ["ORPHANED", "die_with_parent", "exit_when_closed", "follow_parent"]


_PR_SET_PDEATHSIG = 1
#: The exit status of a helper that ended because the trainer's process was gone.
ORPHANED = 70


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process when its parent exits (Linux; False elsewhere,
    or if the call failed). ``parent`` is the pid the parent must have: if it died before
    the request took effect, this process exits now, as it would have a moment later."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os._exit(ORPHANED)
    return True


def exit_when_closed(fd: int) -> threading.Thread:
    """Start a daemon thread, ``aioloader-lifeline``, that ends this process with
    :data:`ORPHANED` once ``fd`` (the read end of a pipe) reaches end of file. Bytes that
    arrive on it are read and ignored."""

    def watch() -> None:
        while True:
            try:
                select.select([fd], [], [])
                if os.read(fd, 4096):
                    continue
            except InterruptedError:
                continue
            except OSError:  # closed under us: nothing left to watch
                return
            os._exit(ORPHANED)

    thread = threading.Thread(target=watch, name="aioloader-lifeline", daemon=True)
    thread.start()
    return thread


def follow_parent() -> None:
    """In a multiprocessing child (a decode worker, the loader process): exit when the
    process that asked for it is gone, however that happened."""
    import multiprocessing as mp

    parent = mp.parent_process()  # the process that asked for this one
    if parent is None:  # pragma: no cover - a multiprocessing child always has one
        return
    if parent.pid != os.getppid():
        # Forked by a fork server (the zygote or the stock one): single-threaded, so the
        # kernel's parent-death signal fires exactly when it exits, which it does once the
        # trainer is gone. (A child spawned by one of the trainer's threads does not ask:
        # the signal would come when that thread ends.)
        die_with_parent(os.getppid())
    # The pipe only the parent process writes to (multiprocessing's "parent sentinel"): end
    # of file once it is gone, even while this process waits for work that never comes.
    exit_when_closed(parent.sentinel)
