"""The engine's asyncio helpers: tasks that fail together, tasks cancelled and awaited, and
the opening of an epoch (when its later batches may decode)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from aioloader.memory.slots import OrderedWaiters

__all__ = ["Opening", "cancel", "gather_or_cancel"]

T = TypeVar("T")


class Opening:
    """When an epoch's later batches may decode (see ``Engine._run``): once every chunk of
    its first batch is read and about to ask for its decode slot (:meth:`chunk_read`) and,
    if ``wait_for_layout``, no layout is still to learn from it; or once it is done (whoever
    runs it calls :meth:`open` then). Waiters go on in ``key`` order, smallest first, so the
    decode slots they ask for next are granted in epoch order too (see
    :mod:`aioloader.memory.slots`).

    ``wait_for_layout=False`` (``ordered=False``: completion order from the first sample on)
    lets the later batches in without the layout: a slow probe then holds back only its own
    batch, and the batches that decode before any probe taught the layout cross pickled.

    While the layout is unknown, the first batch's first samples may decode alone first, one
    per worker (probes, :meth:`probing`): the batch's other chunks wait until one of them
    taught the layout (:meth:`after_probe`) and resume before the later batches do, so they
    take the decode slots first. Loop-bound."""

    def __init__(self, need_layout: bool, wait_for_layout: bool = True) -> None:
        self.need_layout = need_layout
        self.wait_for_layout = wait_for_layout
        self.chunks = 0  # of the first batch still reading
        self.is_open = False
        self._waiters = OrderedWaiters()
        self._probes = 0
        self._followers: list[asyncio.Future[None]] = []

    async def wait(self, key: tuple[int, ...]) -> None:
        if self.is_open:
            return
        await self._waiters.add(key)

    def open(self) -> None:
        if self.is_open:
            return

        self.is_open = True
        self._waiters.wake_all()  # resumed in key order

    def probing(self, probes: int) -> None:
        """The first batch's first ``probes`` samples decode alone, each in a task of its own,
        to teach the layout; the batch's other chunks decode once one of them did, or all of
        them ended (:meth:`after_probe`)."""
        self._probes = probes

    async def probe_with(self, probe: Awaitable[None]) -> None:
        """Run a probe; once every probe has ended, however, the chunks waiting go on."""
        try:
            await probe
        finally:
            self._probes -= 1
            if self._probes <= 0:
                self._end_probe()

    async def after_probe(self) -> None:
        if self._probes <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._followers.append(fut)
        await fut

    def _end_probe(self) -> None:

        # The first batch's chunks resume before the later batches are let in (layout_learned
        # opens them next), so they ask for decode slots first and the workers take them first.
        self._probes = 0
        followers, self._followers = self._followers, []
        for fut in followers:
            if not fut.done():
                fut.set_result(None)

    def chunk_read(self) -> None:
        self.chunks -= 1
        self._check()

    def layout_learned(self) -> None:
        self.need_layout = False
        self._end_probe()
        self._check()

    def _check(self) -> None:
        if self.chunks == 0 and not (self.need_layout and self.wait_for_layout):
            self.open()


async def gather_or_cancel(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Like ``asyncio.gather``, but the first failure cancels the others (and is raised)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:  # the first failure in batch order, so the error is deterministic
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        await cancel(tasks)


async def cancel(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until they are done (their own cleanup included)."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)
    for t in tasks:  # mark results/exceptions as retrieved: no "never retrieved" warnings
        if t.done() and not t.cancelled():
            t.exception()
