"""Reader processes: groups of small page-cached files read on other cores (``decode=None``).

Without a decode, a loader's whole work is reading, and on the loop a page-cached file of a
few KB costs a few microseconds of system calls, all on the loop's core. Here a group of
files (:func:`~aioloader.read.routing.route` says when) goes to one of a few processes
forked by the zygote, which reads them one after another into a shared-memory buffer of its
own and answers with where each one is; the loop copies each file's bytes out (a ``bytes``
per file, as a read on the loop would give) and that part of the buffer is the worker's
again. The loop's thread does no system call per file, so it tends the batches meanwhile.

A worker is sent up to :data:`~aioloader.read.readproc.PARTS` groups at once, each into a
part of its buffer of its own, and answers them in order: while the loop copies one group
out and sends the next, the worker is already reading the one after. One group at a time
left the worker idle for a round trip after each (the answer's wake-up on the loop, the
copies, the next send; RESULTS §24).

A worker (:mod:`aioloader.read.readproc`) reads as a group on the loop would, with its
pace: it stops at a slow read or past the group's budget, and the reader goes on with what is
left. A file that failed comes back as its ``OSError``. A worker that dies (killed, say)
fails every group it was sent, which the reader then reads on the loop, and is not replaced;
a part of it handed to a group just before is passed over for another worker's. With none
left, groups read on the loop again. At close each is told to go (its pipe closed) and
joined, terminated past a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import threading
import time
from collections import deque
from multiprocessing.connection import Connection, Pipe
from typing import Any

from aioloader.memory.segments import Segment, choose_kind
from aioloader.procs import roles, zygote
from aioloader.read.readmsgs import GroupRead, frame_group, pickle_paths
from aioloader.read.readproc import PARTS, main

__all__ = ["BUFFER_BYTES", "ReadWorkers"]

logger = logging.getLogger("aioloader")

#: Each part of a worker's shared buffer: a group of files must fit (64 files of 100 KB do);
#: a file that does not comes back through the pipe. Pages are used only as files are read.
BUFFER_BYTES = 8 << 20

_ids = itertools.count()


class _Worker:
    def __init__(self, proc: Any, conn: Connection, segment: Segment) -> None:
        self.proc = proc
        self.conn = conn
        self.segment = segment
        self.view = memoryview(segment.mmap)
        #: The groups sent and not yet answered, in order: each one's answer (dropped when it
        #: comes if its wait was cancelled) and its part of the buffer.
        self.sent: deque[tuple[asyncio.Future[GroupRead | None], int]] = deque()
        self.lost = False

    def part(self, part: int) -> memoryview:
        return self.view[part * BUFFER_BYTES : (part + 1) * BUFFER_BYTES]


#: A worker and a part of its buffer: what a group needs to be sent.
_Slot = tuple[_Worker, int]


class ReadWorkers:
    """Up to ``n`` reader processes, started in the background by :meth:`start`; groups go
    to whichever is free (:meth:`read`, on the loader's loop)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._lock = threading.Lock()
        self._all: list[_Worker] = []  # every one started, for close
        self._started: list[_Worker] = []  # started, not yet known to the loop
        self._closed = False
        self._starter: threading.Thread | None = None
        # The loop's own (no lock): the parts free now, the groups waiting for one.
        self._idle: list[_Slot] = []
        self._waiting: deque[asyncio.Future[_Slot | None]] = deque()
        self._live = 0

    def start(self) -> None:
        """Start the processes on a thread of their own (the zygote forks them in
        milliseconds, but the loader's start does not wait for that)."""
        # The zygote is asked for now, before the starter thread exists: it is forked only
        # from a process without loader threads (a lock one of them held would be copied,
        # held for ever, into every process it forks).
        ctx, kind = zygote.context(), choose_kind()
        if ctx is None or kind is None:  # no zygote here, or no shared memory: reads stay on the loop
            return
        self._starter = threading.Thread(
            target=self._start_all, args=(ctx, kind), name="aioloader-start", daemon=True
        )
        self._starter.start()

    def _start_all(self, ctx: Any, kind: str) -> None:
        for _ in range(self.n):
            with self._lock:
                if self._closed:
                    return
            try:
                worker = _spawn(ctx, kind)
            except Exception:  # the reads go on without it
                logger.debug("a reader process could not be started", exc_info=True)
                return
            with self._lock:
                self._all.append(worker)
                self._started.append(worker)

    def pids(self) -> list[int]:
        """The workers' process ids (those started so far, dead or alive)."""
        with self._lock:
            return [w.proc.pid for w in self._all if w.proc.pid is not None]

    @property
    def ready(self) -> bool:
        """Whether a worker can take a group now or soon (one has started and lives)."""
        return self._live > 0 or bool(self._started)

    async def read(self, paths: list[str]) -> GroupRead | None:
        """``paths`` read by a worker: each as ``bytes`` (or its ``OSError``), up to the
        first slow read or the group's budget; None when no worker could (the caller reads
        them). Cancelled, the answer is dropped when it comes."""
        # Pickled before a part is taken: a path that cannot be pickled fails here, holding
        # nothing (a part taken and not sent would pair the next answer with the wrong part).
        blob = pickle_paths(paths)
        while True:
            slot = await self._take()
            if slot is None:
                return None
            worker, part = slot
            if not worker.lost:  # a part handed over just before its worker was found dead
                break
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[GroupRead | None] = loop.create_future()
        worker.sent.append((answer, part))
        try:
            if len(worker.sent) == 1:  # one reader callback answers every group in flight
                loop.add_reader(worker.conn.fileno(), self._answered, worker)
            worker.conn.send_bytes(frame_group(part, blob))
        except (OSError, ValueError):  # the worker is gone: its groups, this one too, fail
            self._lost(worker)
        return await answer

    async def _take(self) -> _Slot | None:
        with self._lock:
            fresh, self._started = self._started, []
        for worker in fresh:
            self._live += 1
            for part in range(PARTS):
                self._give_back((worker, part))
        if self._idle:
            # The least busy worker's part: groups spread over the workers first.
            best = min(range(len(self._idle)), key=lambda i: len(self._idle[i][0].sent))
            return self._idle.pop(best)
        if self._live == 0:
            return None
        waiter: asyncio.Future[_Slot | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and (got := waiter.result()) is not None:
                self._give_back(got)  # handed over as the wait was cancelled: not lost
            raise

    def _give_back(self, slot: _Slot) -> None:
        if slot[0].lost:
            return
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._idle.append(slot)

    def _answered(self, worker: _Worker) -> None:
        """The worker answered its oldest group (or died): the files are copied out of that
        part of its buffer now, before the part may take another group."""
        try:
            got: GroupRead = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            self._lost(worker)
            return
        answer, part = worker.sent.popleft()
        if not worker.sent:
            asyncio.get_running_loop().remove_reader(worker.conn.fileno())
        view = worker.part(part)
        out = [view[r[0] : r[0] + r[1]].tobytes() if type(r) is tuple else r for r in got.files]
        view.release()
        self._give_back((worker, part))
        if not answer.done():
            answer.set_result(GroupRead(out, got.slow, got.times))

    def _lost(self, worker: _Worker) -> None:
        if worker.lost:
            return
        worker.lost = True
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(worker.conn.fileno())
        sent, worker.sent = worker.sent, deque()
        for answer, _ in sent:
            if not answer.done():
                answer.set_result(None)
        self._idle = [slot for slot in self._idle if slot[0] is not worker]
        self._live -= 1
        logger.debug("reader process %s is gone; its groups are read on the loop", worker.proc.pid)
        if self._live == 0:
            while self._waiting:
                waiter = self._waiting.popleft()
                if not waiter.done():
                    waiter.set_result(None)

    def close(self, grace: float = 1.0) -> None:
        """Stop every worker: told to go (its pipe closed), then terminated and killed past
        ``grace`` seconds; their buffers closed."""
        with self._lock:
            self._closed = True
        if self._starter is not None:
            self._starter.join()
        with self._lock:
            workers, self._all, self._started = self._all, [], []
        self._idle.clear()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None  # the loader's loop has stopped: nothing waits on the pipes
        for worker in workers:
            if loop is not None and not worker.conn.closed:  # an answer still awaited there
                with contextlib.suppress(Exception):
                    loop.remove_reader(worker.conn.fileno())
            worker.conn.close()  # end of file: the worker returns
        deadline = time.monotonic() + grace
        for worker in workers:
            proc = worker.proc
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(grace)
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()
            worker.view.release()
            worker.segment.close()
            with contextlib.suppress(BufferError):
                worker.segment.mmap.close()


def _spawn(ctx: Any, kind: str) -> _Worker:
    segment = Segment(f"aioloader-{os.getpid()}-read{next(_ids)}", PARTS * BUFFER_BYTES, kind)
    ours, theirs = Pipe(duplex=True)
    proc = ctx.Process(target=main, args=(theirs, segment.handle), name=roles.NAMES["reader"], daemon=True)
    try:
        proc.start()
    except BaseException:
        ours.close()
        segment.close()
        raise
    finally:
        theirs.close()
    return _Worker(proc, ours, segment)
