"""The consumer's side of one epoch's run: what ``for`` and ``async for`` over a
:class:`~aioloader.Loader` do with each item the bridging thread hands over.

Both iterators share one :class:`Cursor`: it makes a batch usable on the consumer's stream
(:meth:`~aioloader.run.device.DeviceCopier.receive`), records the resume position and the
stats, and turns the end of the epoch or a failure into ``StopIteration`` or the error.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from aioloader.base.items import Batch, End, Failure, Item
from aioloader.errors import LoaderClosedError, LoaderError
from aioloader.observe.progressbar import EpochBar
from aioloader.observe.stats import Counters
from aioloader.plan.resume import Progress
from aioloader.run.bridge import Source
from aioloader.run.handoff import Closed
from aioloader.run.procruntime import ProcessRuntime
from aioloader.run.runtime import Runtime
from aioloader.safety import sigterm

__all__ = ["CLOSED_MESSAGE", "SUPERSEDED_MESSAGE", "AsyncIter", "Cursor", "SyncIter"]

CLOSED_MESSAGE = "the loader is closed; create a new Loader to load again"
SUPERSEDED_MESSAGE = "this iterator was superseded: a newer iteration of the same loader started"

_EMPTY: Any = object()


class Cursor:
    """The consumer's side of one run, shared by both iterators. ``is_closed`` says whether
    the loader was closed; ``counters`` are the loader's."""

    def __init__(
        self,
        runtime: Runtime | ProcessRuntime,
        run: Source,
        progress: Progress,
        counters: Counters,
        is_closed: Callable[[], bool],
        bar: EpochBar | None = None,
    ) -> None:
        self.counters = counters
        self.bar = bar
        self.is_closed = is_closed
        self.runtime = runtime
        self.run = run
        self.progress = progress
        self.done = False
        # An iterator dropped mid-epoch (``break``) cancels its run's reads and decodes.
        self._finalizer = weakref.finalize(self, _stop, run, bar)

    def check(self) -> None:
        """Refuse use from a forked child, after close, or once a newer iteration started
        (even with a batch still queued in the hand-off)."""
        self.runtime.check_owner()
        if self.is_closed():
            self.done = True
            sigterm.uninstall()  # the loader was closed on another thread: tidy up here
            raise LoaderClosedError(CLOSED_MESSAGE)
        if self.run.cancelled and not self.done:
            self.done = True
            raise LoaderError(SUPERSEDED_MESSAGE)

    def deliver(self, item: Item, waited: float) -> Any:
        """The batch to hand to the trainer; ``_EMPTY`` for a batch whose samples were all
        skipped (the iterator then takes the next item)."""
        if isinstance(item, Batch):
            # A regrouped batch (repack.py) can complete several plan batches at once.
            *earlier, last = item.done or (item.index,)
            for k in earlier:
                self.progress.mark(k, 0)
            self.progress.mark(last, item.size)
            if self.bar is not None:
                self.bar.update(len(earlier) + 1)  # plan batches done, skipped ones included
            if item.size == 0:
                return _EMPTY
            value = self.runtime.copier.receive(item)
            self.counters.delivered(item.size, waited)
            return value
        self.done = True
        self._finalizer()
        if isinstance(item, End):
            self.progress.finish()
            self.counters.end_epoch()
            raise StopIteration
        assert isinstance(item, Failure)
        raise item.error

    def closed(self) -> LoaderError:
        """The error for a hand-off that closed under the consumer."""
        self.done = True
        if self.is_closed():
            sigterm.uninstall()  # the loader was closed on another thread: tidy up here
            return LoaderClosedError(CLOSED_MESSAGE)
        return LoaderError(SUPERSEDED_MESSAGE)


def _stop(run: Source, bar: EpochBar | None) -> None:
    run.cancel()
    if bar is not None:
        bar.close()


class SyncIter(Iterator[Any]):
    def __init__(self, cursor: Cursor) -> None:
        self._cursor = cursor

    def __next__(self) -> Any:
        c = self._cursor
        c.check()
        if c.done:
            raise StopIteration
        start = time.perf_counter()
        while True:
            try:
                item = c.run.handoff.get()
            except Closed:
                raise c.closed() from None
            value = c.deliver(item, time.perf_counter() - start)
            if value is not _EMPTY:
                return value


class AsyncIter(AsyncIterator[Any]):
    def __init__(self, cursor: Cursor) -> None:
        self._cursor = cursor

    async def __anext__(self) -> Any:
        c = self._cursor
        c.check()
        if c.done:
            raise StopAsyncIteration
        start = time.perf_counter()
        while True:
            try:
                item = await c.run.handoff.aget()
            except Closed:
                raise c.closed() from None
            try:
                value = c.deliver(item, time.perf_counter() - start)
            except StopIteration:
                raise StopAsyncIteration from None
            if value is not _EMPTY:
                return value
