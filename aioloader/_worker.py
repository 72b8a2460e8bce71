"""Code that runs inside the decode worker processes.

Kept apart from the engine so the worker's side of the protocol is one small file: the pool
initialiser installs the user's ``decode`` once per process (so each task ships only the
file's bytes and three integers), and :func:`run_decode` returns ``(True, sample)`` or
``(False, (exception, traceback_text))`` instead of raising, so the parent always gets the
worker's traceback and never an unpicklable exception.
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["sample_rng", "worker_init", "run_decode"]

_decode: Callable[[bytes], Any] | None = None
# (seed, epoch, index) of the sample being decoded in this process.
_context: tuple[int, int, int] | None = None
_rng: np.random.Generator | None = None


def sample_rng() -> np.random.Generator:
    """A NumPy generator for random augmentation of the sample being decoded.

    Seeded from ``(seed, epoch, dataset index)`` only, so a sample gets the same
    augmentation in an epoch whatever worker decodes it, in whatever order. Call it inside a
    ``decode`` function; outside one it returns a fresh, OS-seeded generator.
    """
    global _rng
    if _context is None:
        return np.random.default_rng()
    if _rng is None:
        _rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(_context))))
    return _rng


def worker_init(decode: Callable[[bytes], Any]) -> None:
    """Pool initialiser: install ``decode``; leave Ctrl-C to the parent."""
    global _decode
    # The parent owns shutdown: a Ctrl-C in the terminal reaches the whole process group,
    # and workers that died of it would print tracebacks and break the pool mid-close.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One decode per process at a time: intra-op threads would fight the other workers.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _decode = decode


def warm_up() -> int:
    """A no-op task that makes the pool start a process; returns its pid."""
    return os.getpid()


def run_decode(data: bytes, seed: int, epoch: int, index: int) -> tuple[bool, Any]:
    """Decode one sample with the installed function; never raises."""
    global _context, _rng
    _context, _rng = (seed, epoch, index), None
    try:
        assert _decode is not None, "worker_init did not run"
        return True, _decode(data)
    except Exception as exc:  # noqa: BLE001 - every failure goes back as data
        text = traceback.format_exc()
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an exception that cannot cross the pipe
            exc = RuntimeError(f"{type(exc).__qualname__}: {exc}")
        return False, (exc, text)
    finally:
        _context, _rng = None, None
