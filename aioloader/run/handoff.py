"""The bridge -> trainer hand-off: a small bounded buffer for one producer thread and one
consumer that is either a thread (``get``) or a coroutine on any event loop (``aget``).

Why not ``run_coroutine_threadsafe`` per batch: it costs a round trip through the engine's
loop on the trainer's critical path (``benchmarks/handoff.py`` measures both). Here a ready
batch is a deque pop under a lock; an async consumer is woken with one ``call_soon_threadsafe``, so the
caller's event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Generic, TypeVar

__all__ = ["Closed", "Handoff"]

T = TypeVar("T")


class Closed(Exception):
    """The hand-off was closed: nothing more will arrive (raised by ``get``/``aget``)."""


class Handoff(Generic[T]):
    """A bounded FIFO: ``put`` blocks while ``capacity`` items wait; ``close`` wakes all."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._closed = False

    def put(self, item: T) -> bool:
        """Add ``item``, blocking while full. False (item dropped) if closed meanwhile."""
        with self._lock:
            while len(self._items) >= self._capacity and not self._closed:
                self._changed.wait()
            if self._closed:
                return False
            self._items.append(item)
            self._changed.notify_all()
            self._wake_async()
            return True

    def get(self) -> T:
        """The next item, blocking; raises :class:`Closed` once closed and drained."""
        with self._lock:
            while not self._items and not self._closed:
                self._changed.wait()
            return self._pop()

    async def aget(self) -> T:
        """Like :meth:`get`, awaited on the caller's loop without blocking it."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._items or self._closed:
                    return self._pop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            try:
                await fut
            finally:
                with self._lock:
                    if (loop, fut) in self._waiters:
                        self._waiters.remove((loop, fut))

    def close(self) -> None:
        """Wake every waiter; items already queued can still be taken."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
            self._wake_async()

    def _pop(self) -> T:
        if not self._items:
            raise Closed()
        item = self._items.popleft()
        self._changed.notify_all()  # a producer may wait for room
        return item

    def _wake_async(self) -> None:
        while self._waiters:
            loop, fut = self._waiters.popleft()
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed: its consumer is gone
                pass


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
