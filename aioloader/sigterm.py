"""SIGTERM closes every open loader, then ends the process as SIGTERM would have.

Python's default action for SIGTERM ends the process at once: no ``finally`` block, no
``with`` exit, no ``close()``. While a loader is open (from the first start to the last
close) and SIGTERM still has that default, a handler of ours closes every open loader
(workers stopped, slabs unlinked; batches in flight are dropped, nothing is half-written)
and then chains to the default: it restores it and sends SIGTERM again, so the exit status
still reads "killed by SIGTERM" for whatever supervises the trainer (torchrun, a scheduler).

A handler of the user's own is never replaced. One in place when the first loader starts
(or ``SIG_IGN``) is left alone: the user decides what SIGTERM does, and a ``sys.exit`` from
it reaches the loaders' exit hook. One installed later replaces ours, as the user asked. When
the last loader closes, ours is removed if it is still in place. Handlers can only be set
from the main thread; a loader started from another thread leaves SIGTERM as it is (its
helpers still end with the process: :mod:`.lifeline`).

The handler runs on the main thread between two bytecodes, possibly inside the loader's own
code while it holds one of its locks, so the closing runs on a thread of its own
(``aioloader-sigterm``), for at most :data:`CLOSE_LIMIT` seconds.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

__all__ = ["CLOSE_LIMIT", "hold", "release"]

#: Seconds the handler waits for the loaders to close before the process ends anyway.
CLOSE_LIMIT = 3.0

_lock = threading.Lock()
_holders = 0
_close_all: Callable[[], None] | None = None


def hold(close_all: Callable[[], None]) -> None:
    """A loader starts: install the handler (calling ``close_all``) if it is the first open
    loader, this is the main thread and SIGTERM has its default action."""
    global _holders, _close_all
    with _lock:
        _holders += 1
        _close_all = close_all
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)


def release() -> None:
    """A loader closed: once none is open, put the default back if our handler is still in
    place (only possible from the main thread; elsewhere ours stays, and with no loader open
    it does just what the default does)."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    close_all = _close_all
    if close_all is not None:
        closer = threading.Thread(target=close_all, name="aioloader-sigterm", daemon=True)
        closer.start()
        closer.join(CLOSE_LIMIT)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # the signal is on its way; should it not end us, end anyway
    os._exit(128 + signal.SIGTERM)
