"""SIGTERM closes every open loader, then ends the process as SIGTERM would have.

Python's default action for SIGTERM ends the process at once: no ``finally`` block, no
``with`` exit, no ``close()``. While a loader is open (from the first start to the last
close) and SIGTERM still has that default, a handler of ours closes every open loader
(workers stopped, slabs closed; batches in flight are dropped, nothing is half-written)
and then chains to the default: it restores it and sends SIGTERM again, so the exit status
still reads "killed by SIGTERM" for whatever supervises the trainer (torchrun, a scheduler).

A handler of the user's own is never replaced. One in place when the first loader starts
(or ``SIG_IGN``) is left alone: the user decides what SIGTERM does, and a ``sys.exit`` from
it reaches the loaders' exit hook. One installed later replaces ours, as the user asked. When
the last loader closes, ours is removed if it is still in place. Handlers can only be set
from the main thread: ``async with`` installs it back on the caller's thread once its start
(run on a short-lived thread) is done; a loader started only on other threads leaves SIGTERM
as it is (its helpers still end with the process: :mod:`aioloader.safety.lifeline`).

Python runs a signal handler on the main thread, between two bytecodes. A main thread that
entered a blocking call (``time.sleep``, a lock, a C extension's wait) just after the signal
arrived, or while the kernel handed the signal to another thread, runs it only once that
call returns, which may be never (seen: 5 SIGTERMs in 200 left unhandled by a trainer
asleep). So the handler is also reached from a thread of ours, ``aioloader-signals``, woken
by the signal's byte on :func:`signal.set_wakeup_fd`'s pipe (written by the C-level
handler, on whichever thread got the signal); whichever comes first acts. That thread and
its pipe exist while the handler is installed, where no other wakeup fd is set (an asyncio
loop's own, say: then the main thread alone handles it). The closing itself runs on a
thread of its own (``aioloader-sigterm``), as the main thread may be inside the loader's
code holding one of its locks, for at most :data:`CLOSE_LIMIT` seconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

__all__ = ["CLOSE_LIMIT", "hold", "install", "release", "uninstall"]

#: Seconds the handler waits for the loaders to close before the process ends anyway.
CLOSE_LIMIT = 3.0

_lock = threading.Lock()
_holders = 0
_close_all: Callable[[], None] | None = None
_acting = threading.Lock()  # taken, never released, by the first path to handle SIGTERM
_acting_thread: int | None = None  # the thread that took it
_watcher: tuple[threading.Thread, int, int] | None = None  # the thread and its pipe's ends


def hold(close_all: Callable[[], None]) -> None:
    """A loader starts: install the handler (calling ``close_all``) if it is the first open
    loader, this is the main thread and SIGTERM has its default action."""
    global _holders, _close_all
    with _lock:
        _holders += 1
        _close_all = close_all
    install()


def install() -> None:
    """Install the handler now if a loader is open, this is the main thread and SIGTERM has
    its default action (for a loader started on another thread: ``async with`` starts it on
    a short-lived one, then calls this back on the caller's)."""
    with _lock:
        if _holders == 0 or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            _start_watcher()
            signal.signal(signal.SIGTERM, _on_sigterm)


def release() -> None:
    """A loader closed: see :func:`uninstall`."""
    global _holders
    with _lock:
        _holders = max(0, _holders - 1)
    uninstall()


def uninstall() -> None:
    """Once no loader is open, put the default back if our handler is still in place, and
    stop the watcher. Only possible on the main thread: ``aclose`` closes on a short-lived
    thread, then calls this back on the caller's, and an iterator whose loader another
    thread closed calls it as it reports the close. (A loader closed only elsewhere, by the
    garbage collector say, leaves them in place until then; with no loader open, the
    handler does just what the default does.)"""
    with _lock:
        if _holders or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _stop_watcher()


def _start_watcher() -> None:
    """The ``aioloader-signals`` thread and its wakeup pipe, where no wakeup fd is set yet
    (an asyncio loop's own, say: the main thread alone then handles SIGTERM)."""
    global _watcher
    if _watcher is not None or os.name != "posix":
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):  # pragma: no cover - not the main interpreter
        previous = None
    if previous != -1:  # someone else's (or none possible): theirs stays
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return
    thread = threading.Thread(target=_watch, args=(r,), name="aioloader-signals", daemon=True)
    thread.start()
    _watcher = (thread, r, w)


def _stop_watcher() -> None:
    global _watcher
    if _watcher is None:
        return
    thread, r, w = _watcher
    _watcher = None
    current = signal.set_wakeup_fd(-1)
    if current != w:  # replaced since: theirs stays (ours is no longer written to)
        signal.set_wakeup_fd(current)
    os.close(w)  # the watcher reads end of file and returns
    thread.join()
    os.close(r)


def _watch(fd: int) -> None:
    while data := os.read(fd, 512):
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            _terminate(on_main_thread=False)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _terminate(on_main_thread=True)


def _terminate(on_main_thread: bool) -> None:
    """Close every open loader (bounded), then end the process by SIGTERM. Runs once: a
    second caller (the other path, for the same signal) waits for the end, so the main
    thread never returns into the trainer's code with its loaders closed under it. A
    SIGTERM that comes again while the main thread is in here runs this handler again, on
    top of the first call: that call returns at once, and the first goes on."""
    global _acting_thread
    me = threading.get_ident()
    if _acting_thread == me:
        return
    _acting.acquire()
    _acting_thread = me
    close_all = _close_all
    if close_all is not None:
        closer = threading.Thread(target=close_all, name="aioloader-sigterm", daemon=True)
        closer.start()
        closer.join(CLOSE_LIMIT)
    if on_main_thread:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:  # Python sets dispositions from the main thread only; the C library from any
        ctypes.CDLL(None).signal(int(signal.SIGTERM), 0)  # 0: SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # the signal is on its way; should it not end us, end anyway
    os._exit(128 + signal.SIGTERM)
