"""A minimal executor of *daemon* threads for file reads.

``ThreadPoolExecutor``'s threads are joined at interpreter exit and by ``shutdown(wait=True)``,
so one read hung on dead network storage would hang ``close()`` and the exit of the whole
program. A read cannot be interrupted; it can only be abandoned. These threads are daemons
that ``shutdown`` does not wait for beyond a grace period: an abandoned read ends with the
process.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["DaemonThreadPool", "in_thread", "run_apart", "thread_cpu_clock"]

T = TypeVar("T")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreadPool(Executor):
    """Up to ``max_workers`` daemon threads named ``<prefix>_<n>``, started on demand."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new reads after shutdown")
            self._work.put((fut, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self._max:
                t = threading.Thread(
                    target=self._run, name=f"{self._prefix}_{len(self._threads)}", daemon=True
                )
                self._threads.append(t)
                t.start()
            else:
                self._idle = max(0, self._idle - 1)
        return fut

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                    fut.set_exception(exc)
            del item, fut, fn, args, kwargs
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False, grace: float = 2.0) -> None:
        """Stop the threads; with ``wait``, join them for at most ``grace`` seconds (a thread
        stuck in a read is abandoned: it is a daemon)."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            deadline = time.monotonic() + grace
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))

    @property
    def stuck(self) -> list[str]:
        """Names of threads still running after shutdown (abandoned reads)."""
        return [t.name for t in self._threads if t.is_alive()]


async def in_thread(fn: Callable[[], object]) -> None:
    """Run a blocking lifecycle call (start, close) on a short-lived thread and await it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the awaiting task
            loop.call_soon_threadsafe(settle, done, exc)
        else:
            loop.call_soon_threadsafe(settle, done, None)

    thread = threading.Thread(target=target, name="aioloader-lifecycle", daemon=True)
    thread.start()
    # Shielded: if the awaiting task is cancelled, the call still runs to its end.
    await asyncio.shield(done)
    thread.join()  # it has settled ``done``: only its last instructions are left


def settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


def thread_cpu_clock(thread: threading.Thread) -> Callable[[], float] | None:
    """A clock of ``thread``'s CPU seconds that any thread of this process may read (the
    loop meter's, :mod:`aioloader.observe.loopmeter`), or None where the platform has no
    per-thread CPU clock (``pthread_getcpuclockid``: Unix) or ``thread`` has not started.
    Reading it after ``thread`` ended raises ``OSError``."""
    getid = getattr(time, "pthread_getcpuclockid", None)
    if getid is None or thread.ident is None:
        return None
    try:
        clock_id = getid(thread.ident)
        time.clock_gettime(clock_id)
    except OSError:
        return None
    return lambda: time.clock_gettime(clock_id)


def run_apart(main: Callable[[], Coroutine[Any, Any, T]], name: str) -> T:
    """``main()`` run to its end on an event loop of its own, on a thread named ``name`` (so
    it works where the caller's thread already runs a loop); its result returned, or its
    exception raised, here."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(main()))
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]
