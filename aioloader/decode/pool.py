"""The decode worker processes: start, crash recovery and bounded shutdown.

Workers are forked by the zygote (:mod:`aioloader.procs.zygote`: a fork server forked from this process
before the loader had threads, so it already holds what the decoder needs). Where there is
none, they come from the stock ``forkserver`` context (``spawn`` where there is none): plain
``fork`` after the loader's threads exist can copy a held lock into the child and hang it.
The stock fork server preloads the worker side of aioloader and what the main script
imported, so each worker starts by a cheap fork of a warm process.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from types import ModuleType
from typing import Any

from aioloader.base.semnames import named_for_this_process
from aioloader.decode import worker as _worker
from aioloader.decode.chunk import Chunk
from aioloader.decode.faults import Breakage, describe_deaths
from aioloader.errors import LoaderError, WorkerCrashedError
from aioloader.memory.results import RowResult, Shrunk
from aioloader.procs import forking, zygote

__all__ = ["Breakage", "DecodePool", "describe_deaths", "mp_context"]

_context: BaseContext | None = None


def mp_context() -> BaseContext:
    """The multiprocessing context every loader's workers come from (created once)."""
    global _context
    if _context is None:
        if sys.platform != "win32" and "forkserver" in mp.get_all_start_methods():
            ctx = forking.StockContext()
            ctx.set_forkserver_preload(["aioloader.decode.worker", "aioloader.decode.image", *main_imports()])
            _context = ctx
        else:
            _context = mp.get_context("spawn")
    return _context


def main_imports() -> list[str]:
    """Modules the main script imported at its top level (``import torch``, ``from x import
    f``), for the fork server to preload.

    Workers never import the main module itself (:mod:`aioloader.procs.forking`), but the decode function
    sent to them refers to what it imported: with those modules already loaded in the fork
    server, each worker does not pay for, e.g., ``import torch`` (see benchmarks/RESULTS.md).
    """
    main = sys.modules.get("__main__")
    names: set[str] = set()
    for value in vars(main).values() if main is not None else ():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name not in ("__main__", "builtins") and not name.startswith("_"):
            names.add(name)
    return sorted(names)


class DecodePool:
    """``num_workers`` persistent processes running ``decode``, rebuilt after a crash.

    A worker that dies (signal, ``os._exit``) breaks the whole ``ProcessPoolExecutor``: every
    task in flight fails with ``BrokenProcessPool``. :meth:`recover` then rebuilds the pool,
    once per breakage however many tasks report it (the generation :meth:`submit` returned
    tells them apart), and returns the :class:`Breakage`, so each task can tell whether the
    sample it was decoding killed its worker. A breakage caused by :meth:`kill_for_timeout`
    is not a crash; past ``max_restarts`` crashes, :class:`WorkerCrashedError` is final.

    ``close`` is bounded: it asks workers to exit, waits ``grace`` seconds, then terminates
    and finally kills what is left, because ``ProcessPoolExecutor.shutdown`` alone waits for
    a hung task forever.
    """

    def __init__(
        self,
        decode: bytes,
        num_workers: int,
        max_restarts: int = 3,
        name: str = "decode",
    ) -> None:
        """``decode``: the decode function pickled by value (:mod:`aioloader.base.sendable`),
        unpickled once by each worker; ``name`` says what it is in errors."""
        self.num_workers = num_workers
        self.max_restarts = max_restarts
        self.name = name
        self._initargs = (decode,)
        # Chosen now, before this pool's starter thread exists: the zygote forks only from
        # a process without loader threads.
        self._context: BaseContext = zygote.context() or mp_context()
        self._generation = 0
        self.restarts = 0
        self._breakages: dict[int, Breakage] = {}  # by the generation they ended
        self._timed_out: set[int] = set()
        self._killed_in: set[int] = set()  # generations broken by a timeout kill of ours
        self._failure: LoaderError | None = None  # final: every later submit raises it
        self._lock: asyncio.Lock | None = None
        self._executor: ProcessPoolExecutor | None = None
        #: Set once every worker has answered its first (no-op) task.
        self.warm = threading.Event()
        self._started = threading.Event()
        # Starting blocks for as long as the fork server takes to boot and preload (about a
        # second when the main script imports torch), so it happens on its own thread: the
        # loader's start() returns at once and the first reads (and, for ImageDecoder, the
        # first decodes: see engine.py) run meanwhile.
        self._starter = threading.Thread(target=self._first_start, name="aioloader-start", daemon=True)
        self._starter.start()

    def _first_start(self) -> None:
        try:
            self._executor = self._start()
        except BaseException as exc:  # noqa: BLE001 - never a traceback from this thread: started() raises it
            self._failure = WorkerCrashedError(
                f"the decode worker processes could not be started: {type(exc).__name__}: {exc}"
            )
            self._failure.__cause__ = exc
        finally:
            self._started.set()

    def _start(self) -> ProcessPoolExecutor:
        with named_for_this_process():
            executor = ProcessPoolExecutor(
                self.num_workers,
                mp_context=self._context,
                initializer=_worker.worker_init,
                initargs=self._initargs,
            )
        # The executor starts a process per submitted task while none is idle: one no-op per
        # worker starts them all now, in parallel with the first reads.
        try:
            pending = [executor.submit(_worker.warm_up) for _ in range(self.num_workers)]
        except BaseException:
            _close_executor(executor, grace=1.0)  # its queues' semaphores and any process
            raise
        left = [len(pending)]
        lock = threading.Lock()

        def one_done(fut: Future[int]) -> None:
            exc = None if fut.cancelled() else fut.exception()
            if isinstance(exc, _worker.NotLoaded):
                self.not_loaded(exc)
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    self.warm.set()

        for fut in pending:
            fut.add_done_callback(one_done)
        return executor

    async def started(self) -> None:
        """Wait, without blocking the loop, until the executor exists (it may still be
        starting its processes)."""
        while not self._started.is_set():
            await asyncio.sleep(0.005)
        if self._failure is not None:
            raise self._failure.with_traceback(None)  # raised again and again: keep no frames

    def not_loaded(self, exc: BaseException) -> LoaderError:
        """The error for a worker that could not unpickle ``decode`` (``exc``, a
        :class:`~aioloader.decode.worker.NotLoaded`); final: every later submit raises it."""
        if self._failure is None:
            self._failure = LoaderError(
                f"{self.name} could not be loaded in a decode worker process; its traceback there:\n{exc}"
            )
        return self._failure

    @property
    def executor(self) -> ProcessPoolExecutor:
        assert self._executor is not None, "DecodePool.started() was not awaited"
        return self._executor

    def submit(self, chunk: Chunk) -> tuple[Future[list[RowResult | Shrunk]], int]:
        """Decode ``chunk`` in one task (see :func:`aioloader.decode.worker.run_chunk`); returns the future
        and the pool's generation, for :meth:`recover`."""
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        assert self._executor is not None, "DecodePool.started() was not awaited"
        try:
            fut = self._executor.submit(_worker.run_chunk, chunk)
        except BrokenProcessPool as exc:  # broken before this task: the caller recovers it
            fut = Future()
            fut.set_exception(exc)
        return fut, self._generation

    def pids(self) -> list[int]:
        if self._executor is None:
            return []
        return [p.pid for p in _processes(self._executor) if p.pid is not None]

    def kill_for_timeout(self, pid: int) -> None:
        """SIGKILL a worker stuck on one sample; the pool breaks and is rebuilt."""
        if pid in self.pids():
            self._timed_out.add(pid)
            self._killed_in.add(self._generation)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def recover(self, generation: int, paths: list[str]) -> Breakage:
        """Rebuild the pool after the breakage seen by a task submitted at ``generation``
        and say what broke it; raises :class:`WorkerCrashedError` once crashes exceed
        ``max_restarts``."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._failure is not None:
                raise self._failure.with_traceback(None)
            if generation != self._generation:
                return self._breakages[generation]  # another task already rebuilt it
            old = self.executor
            procs = _processes(old)
            # The executor terminates the survivors itself and its manager thread joins them.
            # Wait (briefly) for that thread first: a fork-server child's exit code is read
            # once from a pipe, and polling it while that thread joins the same process races
            # with it (the loser reads end-of-file, and CPython then reports exit code 255).
            deadline = time.monotonic() + 1.0
            manager = getattr(old, "_executor_manager_thread", None)
            while manager is not None and manager.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            codes = {p.pid: p.exitcode for p in procs if p.pid is not None and p.exitcode is not None}
            dead = {pid: c for pid, c in codes.items() if c not in (0, -signal.SIGTERM)}
            crashed = {pid: c for pid, c in dead.items() if pid not in self._timed_out}
            breakage = self._breakages[generation] = Breakage(dead, frozenset(self._timed_out))
            # A breakage we caused (a worker killed for sample_timeout) is not a crash, even
            # when a busy machine has not reported that worker's exit code yet.
            ours = generation in self._killed_in
            _close_executor(old, grace=1.0)
            if crashed or not ours:
                self.restarts += 1
                if self.restarts > self.max_restarts:
                    self._failure = WorkerCrashedError(
                        f"decode worker {describe_deaths(crashed or codes)} while decoding "
                        f"{', '.join(repr(p) for p in paths)}; that is {self.restarts} crashes, more than "
                        f"max_worker_restarts={self.max_restarts}"
                    )
                    raise self._failure
            self._executor = self._start()
            self._generation += 1
            return breakage

    def close(self, grace: float = 2.0) -> None:
        """Stop every worker within about ``2 * grace`` seconds, whatever they are doing."""
        self._starter.join()  # bounded: the fork server answers or fails
        if self._executor is not None:
            _close_executor(self._executor, grace)


def _processes(executor: ProcessPoolExecutor) -> list[Any]:
    return list((getattr(executor, "_processes", None) or {}).values())


def _close_executor(executor: ProcessPoolExecutor, grace: float) -> None:
    procs = _processes(executor)
    # shutdown(wait=False) forgets the manager thread, so a later shutdown(wait=True) would
    # not join it: keep it to join ourselves.
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
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
