"""Fast groups: while whole local files read fast, a chunk's files are read one after
another in a few large steps instead of one executor hop each.

A page-cached file reads in microseconds, less than a hop costs the loader's process (a
thread wake-up, two futures, the event loop's callbacks, GIL hand-offs between the read
threads and every other thread of the process). So each step reads a group of files, by a
reader process, on the loop itself, or in one hop to a read thread, as
:func:`~aioloader.read.routing.route` says; it ends at the first slow read (storage that
needs reads in flight: the rest go one per hop, as :class:`~aioloader.read.reader.FileReader`
does for everything while reads are slow) or once the group's time budget is spent (the next
group follows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial

from aioloader.errors import SampleError
from aioloader.memory.results import Source
from aioloader.memory.slabs import Arena
from aioloader.memory.slots import OrderedSlots
from aioloader.observe.stages import StageMeter
from aioloader.read.blocking import GROUP_THREADS, HintedRead, ReadPace, read_group
from aioloader.read.outcomes import TRANSIENT, checked
from aioloader.read.routing import LOOP, SINGLES, WORKERS, Route, route
from aioloader.read.workers import ReadWorkers

__all__ = ["Groups"]


class Groups:
    """A reader's fast groups. ``plain``/``plain_into``: its blocking reads (``own``: the
    library's, which may run on the loop or in a worker); ``slots``: its ``io_concurrency``
    slots (a group on a thread holds one); ``pool``: its read threads."""

    def __init__(
        self,
        *,
        pace: ReadPace,
        meter: StageMeter,
        pool: Executor,
        slots: Callable[[], OrderedSlots],
        plain: Callable[[str], bytes],
        plain_into: Callable[..., Source],
        own: bool,
        loop_free: bool,
        workers: ReadWorkers | None,
    ) -> None:
        self.pace = pace
        self.meter = meter
        self.pool = pool
        self.slots = slots
        self.plain = plain
        self.plain_into = plain_into
        self.own = own
        #: Nothing else on the loop waits at short notice: groups may read on it.
        self.loop_free = loop_free
        #: Reader processes that groups go to once one has started.
        self.workers = workers
        self._hops: asyncio.Semaphore | None = None  # groups on threads at once

    async def fetch(
        self,
        items: list[tuple[int, str]],
        arena: Arena | None,
        timeout: float | None,
        whole_local: bool,
        io_concurrency: int,
    ) -> tuple[list[Source | SampleError | OSError], dict[int, OSError]]:
        """The first files of ``items`` (``(index, path)``), read in groups while reads are
        fast, each as the sample's bytes or its :class:`SampleError`, or as the transient
        ``OSError`` of its first try; and those transient errors by position, for the caller
        to retry (each one that try of the file's ``read_retries``). The groups go on past
        a transient error: the files after it are kept, not read again. The rest of ``items``
        are the caller's, one per hop. ``whole_local``: whole local files only."""
        done: list[Source | SampleError | OSError] = []
        failed: dict[int, OSError] = {}
        slow = False  # a group stopped at a slow read: the rest go one per hop
        while len(done) < len(items) and not slow:
            way = route(
                files=len(items) - len(done),
                fast=self.pace.fast,
                local=whole_local,
                whole=whole_local,
                timeout=timeout,
                own_read=self.own,
                loop_free=self.loop_free,
                workers=self.workers is not None and self.workers.ready,
            )
            if way == SINGLES:
                break
            start = len(done)
            got, slow = await self.read(way, [path for _, path in items[start:]], arena)
            for (index, path), res in zip(items[start:], got, strict=False):
                if (type(res) is bytes and res) or (type(res) is tuple and res[1]):
                    done.append(res)  # the common case first: a file read whole
                elif isinstance(res, OSError) and res.errno in TRANSIENT:
                    failed[len(done)] = res
                    done.append(res)
                else:
                    done.append(checked(res, path, index, io_concurrency))
        return done, failed

    async def read(
        self, way: Route, paths: list[str], arena: Arena | None
    ) -> tuple[list[Source | OSError], bool]:
        """``paths`` read one after another ``way`` until one is slow or the group's budget
        is spent (see :func:`~aioloader.read.blocking.read_group`): the results of those
        attempted, and whether the last was slow."""
        if way == WORKERS:
            assert self.workers is not None
            with self.meter.timed() as timed:
                answer = await self.workers.read(paths)
                timed.per = len(answer.files) if answer else 1
            if answer is not None:
                self.pace.observe_all(answer.times)
                return answer.files, answer.slow
            way = LOOP  # no worker could: read here
        one: Callable[[str], Source]
        if self.own:
            one = HintedRead(arena)
        elif arena is not None:
            one = partial(self.plain_into, arena=arena)
        else:
            one = self.plain
        if way == LOOP:
            with self.meter.timed() as timed:
                got = read_group(one, paths, self.pace)
                timed.per = len(got[0])
            await asyncio.sleep(0)  # what else waits on the loop runs between groups
            return got
        if self._hops is None:
            self._hops = asyncio.Semaphore(GROUP_THREADS)
        async with self._hops, self.slots().slot(()):
            loop = asyncio.get_running_loop()
            with self.meter.timed() as timed:  # one I/O slot, its files read one after another
                got = await loop.run_in_executor(self.pool, read_group, one, paths, self.pace)
                timed.per = len(got[0])
            return got
