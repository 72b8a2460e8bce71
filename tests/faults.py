"""Fault injection for the tests: picklable decoders that raise, hang, crash or segfault on
chosen samples, and read hooks (``Loader(read=...)``) that fail or stall on chosen files.

Numbered files (helpers.write_numbered_files) carry their number, so every fault is keyed
by the sample number. "Once" faults remember that they fired in a marker file, so they fire
in exactly one worker process even across pool rebuilds.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
from helpers import decode_number


class Fault:
    """Decode numbered files; on a number in ``on``, do ``action`` (see below).

    ``once``: fire only the first time (a marker file under ``marker_dir`` says it fired).
    Actions: ``raise`` (ValueError), ``hang`` (sleep ``seconds``), ``kill`` (SIGKILL
    itself), ``exit`` (``os._exit(3)``), ``segfault`` (read address 0).
    """

    def __init__(
        self, action: str, on: set[int], *, once: bool = False, marker_dir: str = "", seconds: float = 3600
    ) -> None:
        self.action = action
        self.on = on
        self.once = once
        self.marker_dir = marker_dir
        self.seconds = seconds

    def __call__(self, data: bytes) -> np.ndarray:
        value = decode_number(data)
        n = int(value[0])
        if n in self.on and self._fire(n):
            if self.action == "raise":
                raise ValueError(f"injected failure on sample {n}")
            if self.action == "hang":
                time.sleep(self.seconds)
            elif self.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.action == "exit":
                os._exit(3)
            elif self.action == "segfault":
                ctypes.string_at(0)
        return value

    def _fire(self, n: int) -> bool:
        if not self.once:
            return True
        try:
            fd = os.open(os.path.join(self.marker_dir, f"fired-{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True


class FlakyRead:
    """A read hook: the first ``failures`` reads of files whose number is in ``on`` raise
    ``OSError(err)``; later reads succeed. Counts every attempt per path."""

    def __init__(self, on: set[int], failures: int = 1, err: int = errno.EIO) -> None:
        self.on = on
        self.failures = failures
        self.err = err
        self.attempts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, path: str) -> bytes:
        data = Path(path).read_bytes()
        n = int(decode_number(data)[0])
        with self._lock:
            self.attempts[path] = self.attempts.get(path, 0) + 1
            attempt = self.attempts[path]
        if n in self.on and attempt <= self.failures:
            raise OSError(self.err, os.strerror(self.err), path)
        return data


class SlowRead:
    """A read hook that stalls ``seconds`` on the files whose number is in ``on``, or on
    every file when ``on`` is None (storage that answers slowly; any files then)."""

    def __init__(self, on: set[int] | None, seconds: float) -> None:
        self.on = on
        self.seconds = seconds

    def __call__(self, path: str) -> bytes:
        data = Path(path).read_bytes()
        if self.on is None or int(decode_number(data)[0]) in self.on:
            time.sleep(self.seconds)
        return data


__all__ = ["Fault", "FlakyRead", "SlowRead"]


class LoadsOnlyHere:
    """Decode numbered files; pickles fine, but unpickling it in any other process fails
    (as a decoder does whose module only the trainer can import)."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (_load_only_in, (self.pid,))

    def __call__(self, data: bytes) -> np.ndarray:
        return decode_number(data)


def _load_only_in(pid: int) -> LoadsOnlyHere:
    if os.getpid() != pid:
        raise ImportError(f"this decoder can only be loaded in process {pid}")
    return LoadsOnlyHere()


def loader_inside(data: bytes) -> np.ndarray:
    """A decode that makes a loader of its own (what a training script's top level run
    again inside a worker would do)."""
    import aioloader

    aioloader.Loader([os.devnull], decode=None).start()
    return decode_number(data)
