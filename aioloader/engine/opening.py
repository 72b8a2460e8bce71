"""An epoch's opening: when its later batches may decode, and its first batch's probes.

Every batch of the window reads at once, but the later ones decode only once every chunk of
the epoch's first batch is read and has asked for its decode slot (its decodes then take the
workers first: the trainer waits for it) and, while the slabs' layout is unknown, a probe
has taught it (they then decode into rows), unless the order is completion order
(``ordered=False``): a slow probe then holds back only its own batch. While the layout is
unknown, the first batch's first samples decode alone, one per worker (probes); the batch's
other chunks (followers) wait until one of them taught the layout, or all of them ended,
and resume before the later batches do, so they take the decode slots first.

Two parts: :class:`OpeningState`, the decisions, pure (its events return whom they wake,
tested as plain functions), and :class:`Opening`, the waiting, on the loader's loop.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable
from dataclasses import dataclass

from aioloader.memory.slots import OrderedWaiters

__all__ = ["Opening", "OpeningState", "Phase", "Wake"]


class Phase(enum.Enum):
    """Where the first batch's slab layout stands."""

    #: Its probes decode alone, one per task; its other chunks (followers) wait for them.
    PROBING = "probing"
    #: Unknown, and no probe holds anyone back (there were none, or every one ended without
    #: teaching it): whichever chunk of the first batch decodes next may teach it.
    LEARNING = "learning"
    #: Known, or nothing to learn (no slabs, or a layout the decoder declares).
    LEARNED = "learned"


class Wake(enum.Flag):
    """Whom an event lets go on (followers first, then the later batches)."""

    NONE = 0
    #: The first batch's chunks held for its probes.
    FOLLOWERS = enum.auto()
    #: The later batches: the opening opens.
    LATER = enum.auto()


@dataclass
class OpeningState:
    """The opening's decisions, without a loop. The gate (:attr:`is_open`) opens once every
    chunk of the first batch is read and about to ask for its slot and, if
    ``wait_for_layout``, the layout is learned; or once the first batch is done, whatever it
    learned. Followers wait while :attr:`phase` is :attr:`Phase.PROBING`. Each event returns
    the :class:`Wake` it causes (``Wake.NONE``: nobody).
    ``is_open`` never goes back, and neither does ``LEARNED``."""

    phase: Phase
    #: False with ``ordered=False``: the later batches do not wait for the layout.
    wait_for_layout: bool = True
    #: Chunks of the first batch yet to be read and ask for their decode slot.
    chunks: int = 0
    #: Probes still decoding (counted down however they end).
    probes: int = 0
    is_open: bool = False

    @classmethod
    def start(cls, need_layout: bool, wait_for_layout: bool = True) -> OpeningState:
        return cls(Phase.LEARNING if need_layout else Phase.LEARNED, wait_for_layout)

    @property
    def need_layout(self) -> bool:
        return self.phase is not Phase.LEARNED

    @property
    def followers_wait(self) -> bool:
        return self.phase is Phase.PROBING

    def cut(self, chunks: int, probes: int = 0) -> None:
        """The first batch is cut into ``chunks`` decode tasks, its first ``probes`` of them
        one sample each, decoding alone (only while the layout is to learn). Wakes nobody."""
        self.chunks, self.probes = chunks, probes
        if probes > 0 and self.phase is Phase.LEARNING:
            self.phase = Phase.PROBING

    def chunk_read(self) -> Wake:
        """A chunk of the first batch is read and about to ask for its decode slot (a
        follower: once the probes let it go)."""
        self.chunks -= 1
        return self._check()

    def probe_ended(self) -> Wake:
        """A probe ended, however (taught, failed, cancelled); the last one lets the
        followers go even though nothing was learned."""
        self.probes -= 1
        if self.probes > 0 or self.phase is not Phase.PROBING:
            return Wake.NONE
        self.phase = Phase.LEARNING
        return Wake.FOLLOWERS

    def layout_learned(self) -> Wake:
        """A chunk of the first batch (a probe, or any chunk while learning) taught the
        layout: the followers go on, then, once its chunks are all read, the later batches."""
        wake = Wake.FOLLOWERS if self.phase is Phase.PROBING else Wake.NONE
        self.phase = Phase.LEARNED
        return wake | self._check()

    def batch_done(self) -> Wake:
        """The first batch is done (delivered, failed or cancelled): the later batches go on."""
        return self._open()

    def _check(self) -> Wake:
        if self.chunks == 0 and not (self.need_layout and self.wait_for_layout):
            return self._open()
        return Wake.NONE

    def _open(self) -> Wake:
        if self.is_open:
            return Wake.NONE
        self.is_open = True
        return Wake.LATER


class Opening:
    """The waiting side of an :class:`OpeningState` (see the module docstring), on the
    loader's loop. Waiters for the gate (:meth:`wait`) go on in ``key`` order, smallest
    first, so the decode slots they ask for next are granted in epoch order too (see
    :mod:`aioloader.memory.slots`); followers (:meth:`after_probe`) go on before them."""

    def __init__(self, need_layout: bool, wait_for_layout: bool = True) -> None:
        self.state = OpeningState.start(need_layout, wait_for_layout)
        self._waiters = OrderedWaiters()
        self._followers: list[asyncio.Future[None]] = []

    @property
    def is_open(self) -> bool:
        return self.state.is_open

    @property
    def need_layout(self) -> bool:
        return self.state.need_layout

    async def wait(self, key: tuple[int, ...]) -> None:
        """A later batch's chunk (``key``: batch, first row), read: on once the gate opens."""
        if self.state.is_open:
            return
        await self._waiters.add(key)

    async def after_probe(self) -> None:
        """A follower: on once a probe taught the layout, or every probe ended."""
        if not self.state.followers_wait:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._followers.append(fut)
        await fut

    async def probe_with(self, probe: Awaitable[None]) -> None:
        """Run a probe; however it ends, it is counted out (:meth:`OpeningState.probe_ended`)."""
        try:
            await probe
        finally:
            self._apply(self.state.probe_ended())

    def cut(self, chunks: int, probes: int = 0) -> None:
        self.state.cut(chunks, probes)

    def chunk_read(self) -> None:
        self._apply(self.state.chunk_read())

    def layout_learned(self) -> None:
        self._apply(self.state.layout_learned())

    def batch_done(self) -> None:
        self._apply(self.state.batch_done())

    def _apply(self, wake: Wake) -> None:
        # The followers resume first, so they ask for their decode slots before any later
        # batch, let in next, does.
        if Wake.FOLLOWERS in wake:
            followers, self._followers = self._followers, []
            for fut in followers:
                if not fut.done():
                    fut.set_result(None)
        if Wake.LATER in wake:
            self._waiters.wake_all()  # resumed in key order
