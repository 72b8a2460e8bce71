"""Stage 3's processes: the decode worker pool, its start and its bounded shutdown.

Workers come from a ``forkserver`` context (``spawn`` where there is none): plain ``fork``
after the loader's threads exist can copy a held lock into the child and hang it. The fork
server preloads the worker side of aioloader (NumPy and Pillow, not torch) once, so each worker
starts by a cheap fork of a warm process.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing.context import BaseContext
from types import ModuleType
from typing import Any

from . import _worker

__all__ = ["DecodePool", "mp_context"]

_context: BaseContext | None = None


def mp_context() -> BaseContext:
    """The multiprocessing context every loader's workers come from (created once)."""
    global _context
    if _context is None:
        if sys.platform != "win32" and "forkserver" in mp.get_all_start_methods():
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["aioloader._worker", "aioloader.decode", *main_imports()])
            _context = ctx
        else:
            _context = mp.get_context("spawn")
    return _context


def main_imports() -> list[str]:
    """Modules the main script imported at its top level (``import torch``, ``from x import
    f``), for the fork server to preload.

    Every worker re-imports the main module (that is how functions defined there unpickle).
    With what it imports already loaded in the fork server, that re-import costs nothing;
    otherwise each worker pays, e.g., ~1.3 s for ``import torch``. (Python 3.11's own
    ``"__main__"`` preload never receives the main path, so it cannot do this.)
    """
    main = sys.modules.get("__main__")
    names: set[str] = set()
    for value in vars(main).values() if main is not None else ():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name not in ("__main__", "builtins") and not name.startswith("_"):
            names.add(name)
    return sorted(names)


class DecodePool:
    """``num_workers`` persistent processes running ``decode``.

    ``close`` is bounded: it asks workers to exit, waits ``grace`` seconds, then terminates
    and finally kills what is left, because ``ProcessPoolExecutor.shutdown`` alone waits for
    a hung task forever.
    """

    def __init__(
        self,
        decode: Callable[[bytes], Any],
        num_workers: int,
        shape: tuple[int, ...] | None = None,
        dtype: str | None = None,
    ) -> None:
        self.num_workers = num_workers
        self._executor = ProcessPoolExecutor(
            num_workers,
            mp_context=mp_context(),
            initializer=_worker.worker_init,
            initargs=(decode, shape, dtype),
        )
        # The executor starts a process per submitted task while none is idle: one no-op per
        # worker starts them all now, in parallel with the first reads.
        self._warm = [self._executor.submit(_worker.warm_up) for _ in range(num_workers)]

    @property
    def executor(self) -> ProcessPoolExecutor:
        return self._executor

    def submit(
        self,
        slab: str | None,
        out_offset: int,
        items: list[tuple[int, int, _worker.Source]],
        seed: int,
        epoch: int,
    ) -> Future[list[_worker.Result]]:
        """Decode a chunk of samples in one task (see :func:`aioloader._worker.run_chunk`)."""
        return self._executor.submit(_worker.run_chunk, slab, out_offset, items, seed, epoch)

    def pids(self) -> list[int]:
        procs = getattr(self._executor, "_processes", None) or {}
        return [p.pid for p in procs.values() if p.pid is not None]

    def close(self, grace: float = 2.0) -> None:
        """Stop every worker within about ``2 * grace`` seconds, whatever they are doing."""
        procs = list((getattr(self._executor, "_processes", None) or {}).values())
        # shutdown(wait=False) forgets the manager thread, so a later shutdown(wait=True)
        # would not join it: keep it to join ourselves.
        manager = getattr(self._executor, "_executor_manager_thread", None)
        self._executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        stuck = [p for p in procs if p.is_alive()]
        for p in stuck:
            p.terminate()
        deadline = time.monotonic() + grace
        for p in stuck:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        if manager is not None:
            manager.join(grace)
        for p in procs:
            p.close()  # release the sentinel fds now rather than at garbage collection
