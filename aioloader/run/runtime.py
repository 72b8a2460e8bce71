"""Everything a started loader owns: the ``aioloader-loop`` thread with its event loop, the
reader's threads, the decode processes, the collate thread and the bridging thread.

:class:`Runtime` starts them together and :meth:`Runtime.shutdown` stops them all, in an
order that cannot hang: cancel the run, stop the bridge, cancel every task on the loop, stop
the loop, then stop the workers with a bounded grace period. Shutdown is idempotent and is
also reached from ``weakref.finalize`` (garbage collection), at interpreter exit and on
SIGTERM (:mod:`aioloader.safety.sigterm`).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures.process  # noqa: F401 - its exit hook must be registered before ours
import os
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

import torch

from aioloader.base.threads import thread_cpu_clock
from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.errors import LoaderError
from aioloader.observe.stats import Counters
from aioloader.plan.resume import ResumePoint, plan_for
from aioloader.procs import roles
from aioloader.run import pipeline
from aioloader.run.bridge import Bridge, Run, device_decode_for
from aioloader.run.device import DeviceCopier
from aioloader.safety import gcfreeze, sigterm

__all__ = ["EventLoopThread", "Runtime", "RuntimeBase"]

T = TypeVar("T")

try:  # uvloop's loop is faster at the many small callbacks of thousands of reads
    import uvloop

    def _new_loop() -> asyncio.AbstractEventLoop:
        return uvloop.new_event_loop()

except ImportError:  # pragma: no cover - uvloop is optional (no Windows wheels)

    def _new_loop() -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()


class EventLoopThread:
    """An event loop running forever on a daemon thread named ``aioloader-loop``.

    The portal into the engine: other threads schedule coroutines on it with
    :meth:`submit`/:meth:`call`.
    """

    def __init__(self) -> None:
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._main, name="aioloader-loop", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (never from the loop's thread)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("EventLoopThread.call from its own thread would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float) -> None:
        """Stop the loop, join the thread, close the loop."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.loop.close()


async def _cancel_everything() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


# Live runtimes, stopped before concurrent.futures joins its threads at interpreter exit
# (threading's exit hooks run last-registered first): an open loader with reads or decodes
# in flight would otherwise make that join wait for them.
_live: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_exit_hook_installed = False


class Stoppable(Protocol):
    def shutdown(self, grace: float = 2.0) -> None: ...


def register(rt: Stoppable) -> None:
    """Stop ``rt`` at interpreter exit and on SIGTERM, unless it stopped before."""
    global _exit_hook_installed
    _live.add(rt)
    if not _exit_hook_installed:
        hook = getattr(threading, "_register_atexit", None)
        if hook is not None:
            hook(_shutdown_all)
        _exit_hook_installed = True


def unregister(rt: Stoppable) -> None:
    _live.discard(rt)


def _shutdown_all(grace: float = 2.0) -> None:
    for rt in list(_live):
        rt.shutdown(grace)


def _shutdown_all_now() -> None:
    """SIGTERM's way out (:mod:`aioloader.safety.sigterm`): hung workers get a short grace period."""
    _shutdown_all(grace=0.3)


class RuntimeBase(abc.ABC):
    """What every started loader shares, wherever its pipeline runs: start-up in the order
    the zygote needs, the owner check, and an idempotent, bounded :meth:`shutdown`.
    Subclasses provide ``_start``, ``_stop_all`` and ``_threads``."""

    owner_pid: int
    run: Any

    def __init__(
        self, config: LoaderConfig, device: torch.device, dataset: FileDataset, counters: Counters
    ) -> None:
        roles.refuse_loader_here()  # a decode or collate making a loader: say so, never hang
        self.owner_pid = os.getpid()
        self._closed = False
        self._lock = threading.Lock()
        gcfreeze.hold()  # before the zygote's fork, which then shares the frozen pages
        try:
            self._start(config, device, dataset, counters)
        except BaseException:
            gcfreeze.release()
            raise
        register(self)
        # After the zygote's fork: the first hold may start the aioloader-signals thread,
        # and the zygote is only forked from a process without loader threads.
        sigterm.hold(_shutdown_all_now)

    @abc.abstractmethod
    def _start(
        self, config: LoaderConfig, device: torch.device, dataset: FileDataset, counters: Counters
    ) -> None:
        """Start the threads and processes, delivering on ``device`` (settled); sets
        ``config``, ``copier`` and ``run``."""

    @abc.abstractmethod
    def _stop_all(self, run: Any, grace: float) -> None:
        """Stop everything (``run`` first); ends with ``gcfreeze.release()``."""

    @abc.abstractmethod
    def _threads(self) -> tuple[threading.Thread, ...]:
        """This runtime's own threads (a finalizer on one of them cannot join it)."""

    def check_owner(self) -> None:
        """Refuse use from a forked child: its copies of the threads do not exist and the
        helper processes are its parent's."""
        if os.getpid() != self.owner_pid:
            raise LoaderError(
                f"this loader was started in process {self.owner_pid} and cannot be used in a forked "
                f"child (pid {os.getpid()}); create a new Loader in the child"
            )

    def shutdown(self, grace: float = 2.0) -> None:
        """Stop and join everything, within a few ``grace`` periods; idempotent. A no-op in
        a forked child, which must not stop (or unlink) what belongs to its parent."""
        if os.getpid() != self.owner_pid:
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            run, self.run = self.run, None
        unregister(self)
        # Before anything stops: an iterator woken by this close, on the main thread, then
        # finds no loader open and puts SIGTERM's default back (this may be another thread).
        sigterm.release()
        if threading.current_thread() in self._threads():
            # Reached from a finalizer on one of our own threads: it cannot join itself.
            threading.Thread(target=self._stop_all, args=(run, grace), name="aioloader-reaper").start()
            return
        self._stop_all(run, grace)


class Runtime(RuntimeBase):
    """The started loader: threads, processes and the engine, for one loader's lifetime."""

    def _start(
        self, config: LoaderConfig, device: torch.device, dataset: FileDataset, counters: Counters
    ) -> None:
        # Meant for a loader process but run here (no zygote): fsspec reads, since obstore's
        # runtime would outlive close() in this process (aioloader/read/backends.py).
        backend = config.build.storage_backend if config.build.start_in == "thread" else "fsspec"
        self.parts = pipeline.build(config, dataset, counters, storage_backend=backend)
        self.config = config
        self.dataset_len = len(dataset)
        self.runs = dataset.runs() if config.sampling.locality is not None else None
        self.engine = self.parts.engine
        self.loop_thread = EventLoopThread()
        counters.loop.bind(thread_cpu_clock(self.loop_thread.thread))  # the verdict's "loop" stage
        self.copier = DeviceCopier(device, bool(config.delivery.pin_memory))
        finish = device_decode_for(config, device, counters, self.engine.policy)  # one policy for both
        self.bridge = Bridge(self.copier, counters.meters["transfer"], finish)
        self.run: Run | None = None

    def _threads(self) -> tuple[threading.Thread, ...]:
        return (self.loop_thread.thread, self.bridge.thread)

    def start_run(self, epoch: int, resume: ResumePoint | None = None) -> Run:
        """Cancel the current run, if any, and start producing ``epoch`` from ``resume`` (its
        start when None; does not block). The epoch's plan is made here, once: this process
        produces its batches."""
        plan = plan_for(self.config.sampling, self.dataset_len, epoch, resume, self.runs)
        with self._lock:
            if self.run is not None:
                self.run.cancel()
            loop = self.loop_thread.loop
            run = Run(loop, self.config.delivery.prefetch)

            def begin() -> None:
                if not run.cancelled:
                    run.task = loop.create_task(self.engine.produce(plan, run.queue))

            loop.call_soon_threadsafe(begin)
            self.bridge.serve(run)
            self.run = run
            return run

    def _stop_all(self, run: Run | None, grace: float) -> None:
        try:
            if run is not None:
                run.cancel()
            self.bridge.stop(timeout=grace)
            if not self.loop_thread.loop.is_closed() and self.loop_thread.thread.is_alive():
                try:
                    self.loop_thread.call(_cancel_everything(), timeout=grace + 5)
                    # Remote connections belong to this loop: closed on it, before it stops.
                    self.loop_thread.call(self.parts.aclose(), timeout=grace)
                except Exception:  # noqa: BLE001 - stopping the loop below is what matters
                    pass
            self.loop_thread.stop(timeout=grace)
            self.parts.close(grace)
        finally:
            gcfreeze.release()
