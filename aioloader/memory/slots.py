"""Decode slots handed out in sampler order.

At most ``limit`` decode tasks are in flight (one running and one queued per worker). When a
slot frees, it goes to the waiting chunk that comes first in the epoch, not to whichever
chunk's reads happened to finish first: otherwise, with ``ordered=True``, a slow or hung
sample further ahead can take every slot while the batch the trainer waits for cannot get
one (head-of-line blocking). Slots open only once the pool has started, so the first grants
are in order too.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from types import TracebackType

__all__ = ["OrderedSlots", "OrderedWaiters"]


class OrderedWaiters:
    """Futures that wait to be woken smallest ``key`` first (ties: first come), the one
    ordered-waiters structure of the package: decode and read slots (:class:`OrderedSlots`)
    and an epoch's opening (:class:`aioloader.engine.opening.Opening`) both keep theirs here.
    A waiter that was cancelled is passed over. Loop-bound."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, ...], int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def add(self, key: tuple[int, ...]) -> asyncio.Future[None]:
        """A future to await, woken in ``key`` order by :meth:`wake_one` or :meth:`wake_all`."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (key, next(self._seq), fut))
        return fut

    def wake_one(self) -> bool:
        """Wake the smallest waiter still waiting; False when there was none."""
        while self._heap:
            _, _, fut = heapq.heappop(self._heap)
            if not fut.done():  # a cancelled waiter's future is done: skip it
                fut.set_result(None)
                return True
        return False

    def wake_all(self) -> None:
        """Wake every waiter, smallest key first."""
        while self.wake_one():
            pass


class OrderedSlots:
    """An asyncio semaphore whose waiters are served smallest ``key`` first, with a limit
    that may change while slots are held (:meth:`set_limit`). Loop-bound."""

    def __init__(self, limit: int, *, opened: bool = True) -> None:
        self.limit = limit
        self._free = limit if opened else 0
        self._opened = opened
        self._waiters = OrderedWaiters()

    def open(self) -> None:
        """Make the ``limit`` slots available (a no-op once open)."""
        if self._opened:
            return
        self._opened = True
        for _ in range(self.limit):
            self.release()

    def set_limit(self, limit: int) -> None:
        """At most ``limit`` slots from now on. Raising it wakes waiters at once; lowering it
        takes no slot back: the next releases are kept until fewer than ``limit`` are held."""
        if limit < 1:
            raise ValueError(f"limit={limit} must be at least 1")
        delta, self.limit = limit - self.limit, limit
        if not self._opened:
            return  # open() hands out the new limit
        if delta > 0:
            for _ in range(delta):
                self.release()
        else:
            self._free += delta  # may go below 0: releases pay it back first

    @property
    def held(self) -> int:
        """Slots held now (more than ``limit`` just after it was lowered)."""
        return self.limit - self._free if self._opened else 0

    async def acquire(self, key: tuple[int, ...]) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        fut = self._waiters.add(key)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted, then cancelled: pass the slot on
            raise

    def release(self) -> None:
        if self._free < 0:  # the limit was lowered while this slot was held
            self._free += 1
            return
        if not self._waiters.wake_one():
            self._free += 1

    def slot(self, key: tuple[int, ...]) -> _Slot:
        """``async with slots.slot(key):`` holds one slot for the block."""
        return _Slot(self, key)


class _Slot:
    def __init__(self, slots: OrderedSlots, key: tuple[int, ...]) -> None:
        self._slots, self._key = slots, key

    async def __aenter__(self) -> None:
        await self._slots.acquire(self._key)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._slots.release()
