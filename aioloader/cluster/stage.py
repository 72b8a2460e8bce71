"""The decode stage of ``decode_on="ray"``: one chunk of a batch in, one outcome per sample
out, as :class:`~aioloader.decode.stage.DecodeStage` is for local workers.

:meth:`RayDecodeStage.run` waits for a task slot (granted in epoch order, at most
``2xtasks`` in flight: memory bounded on both sides), sends the chunk
(:meth:`~aioloader.cluster.session.RaySession.submit`: local files as their bytes, URLs as
URLs), awaits its answer without blocking the loop, and writes each decoded sample into
the batch's slab: its row when it has the slab's layout, else the chunk's share of the
output area (the one copy from Ray's object store, where the answer's arrays are mapped
without a copy). A task that fails without an answer is dealt with as
:mod:`aioloader.cluster.faults` says.

Stats: the decode meter counts each task from its slot's grant to its answer (so its
latency is the round trip, per sample); :class:`~aioloader.observe.stats.Counters` also
learns how much of that round trip the task spent decoding and reading URLs, and so how
much was Ray's: scheduling and moving the bytes.
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
from collections.abc import Callable
from typing import Any

from aioloader.cluster.faults import Kind, Recovery, kind_of
from aioloader.cluster.session import RaySession
from aioloader.cluster.task import Answer, Fatal, Reading, TimedOut
from aioloader.decode.contract import ChunkItem, DecodeRequest, Outcome
from aioloader.decode.stage import decode_error
from aioloader.errors import DecodeError, LoaderError, LoaderTimeoutError, SampleError
from aioloader.memory.results import Failed, Pickled
from aioloader.memory.slots import OrderedSlots
from aioloader.memory.writer import RowWriter
from aioloader.observe.stages import StageMeter
from aioloader.observe.stats import Counters
from aioloader.read.outcomes import checked

__all__ = ["STUCK_GRACE", "RayDecodeStage", "cluster_chunk"]

#: Seconds a task may run past ``sample_timeoutxits samples`` before the loader cancels
#: it with ``force=True`` (its worker is killed): Ray's own start of a worker takes a while.
STUCK_GRACE = 5.0


def cluster_chunk(batch_size: int, tasks: int) -> int:
    """Samples per Ray task (``decode_on="ray"``): about two tasks per slot of a batch, but at
    least 32 (or the batch) and at most 128. A Ray task costs the trainer's process a fixed
    time to submit and unpack whatever its size (benchmarks/RESULTS.md section 22), which a
    chunk of 32 spreads thin per sample; a large cluster gets enough tasks in flight from a
    wider window of batches (the engine's ``window``), not smaller chunks."""
    return min(batch_size, max(32, min(128, math.ceil(batch_size / (2 * max(1, tasks))))))


class RayDecodeStage:
    """Decodes chunks of ``chunk`` samples (:func:`cluster_chunk`) as Ray tasks of
    ``session``; ``path_of(index)`` names a sample's file. ``reads_urls``: the tasks read
    the dataset's URLs themselves (no custom ``read``, no byte ranges). A
    :class:`~aioloader.decode.contract.DecodeStageLike`."""

    #: No probes: the answers are written into rows on the loader's side, whatever the layout.
    probes = 0

    def __init__(
        self,
        session: RaySession,
        *,
        chunk: int,
        reads_urls: bool,
        seed: int,
        sample_timeout: float | None,
        read_retries: int,
        storage_options: Any,
        io_concurrency: int,
        path_of: Callable[[int], str],
        counters: Counters,
    ) -> None:
        self._session = session
        self.chunk = chunk
        self.reads_urls = reads_urls
        # Every task slot's chunk in flight: the window of batches keeps them fed, beyond
        # the reader's limit (the tasks may read their URLs themselves).
        self.samples_in_flight = session.bound * chunk
        self._seed = seed
        self._timeout = sample_timeout
        self._reading = Reading(storage_options, read_retries)
        self._io = io_concurrency
        self._path_of = path_of
        self._counters = counters
        self._meter: StageMeter = counters.meters["decode"]
        self._slots: OrderedSlots | None = None
        self.active = session.tasks
        self._meter.capacity, self._meter.bound = session.tasks, session.bound

    def set_workers(self, active: int) -> None:
        """The cluster's tasks are not tuned (``num_workers="auto"`` is refused)."""

    async def run(self, request: DecodeRequest) -> list[Outcome]:
        """Decode ``request``'s items (``(row, dataset index, bytes or URL)``) on the
        cluster. Raises only for the whole loader (:class:`LoaderError`) or on cancellation.
        It reads neither ``request.inputs`` (local files reach it as bytes) nor
        ``request.shrink`` (``max_side`` is refused with Ray). Its rows slab is taken at
        once: the results are written into it here, on the loader's side."""
        request = request.with_rows()
        epoch, k, slab, items, out = request.epoch, request.k, request.slab, request.items, request.out
        if self._slots is None:
            self._slots = OrderedSlots(self._session.bound)
        writer = None
        if slab is not None and slab.layout is not None:
            writer = RowWriter(slab.mmap, slab.layout, out)
        by_row = {item[0]: item for item in items}
        outcomes: dict[int, Outcome] = {}
        recovery = Recovery()

        async def attempt(rows: list[int]) -> None:
            chunk = [by_row[r] for r in rows]
            answer, kind = await self._task(epoch, k, chunk)
            if answer is not None:
                recovery.answered()
                self._take(chunk, answer, writer, outcomes)
                return
            assert kind is not None
            nxt = recovery.failed(rows, kind)
            if nxt.give_up:
                raise LoaderError(
                    f"decode_on='ray': the answers of a decode task were lost more than {recovery.lost - 1} "
                    f"times in a row (batch {k}): the Ray cluster is losing objects or nodes"
                )
            for row in nxt.poison:
                index = by_row[row][1]
                outcomes[row] = DecodeError(
                    "the Ray worker decoding it died, twice", path=self._path_of(index), index=index
                )
            for row in nxt.timed_out:
                index = by_row[row][1]
                outcomes[row] = LoaderTimeoutError(
                    f"decode took longer than sample_timeout={self._timeout}s and its Ray task was cancelled",
                    path=self._path_of(index),
                    index=index,
                )
            await _all(attempt(group) for group in nxt.again)

        await attempt([item[0] for item in items])
        return [outcomes[item[0]] for item in items]

    async def _task(self, epoch: int, k: int, chunk: list[ChunkItem]) -> tuple[Answer | None, Kind | None]:
        """Run one task: its answer, or why there is none."""
        assert self._slots is not None
        async with self._slots.slot((k, chunk[0][0])):
            session = self._session
            ref = session.submit(chunk, self._seed, epoch, self._timeout, self._reading)
            started = time.perf_counter()
            try:
                with self._meter.timed(per=len(chunk)):
                    answer = await self._answer(ref, len(chunk))
            except asyncio.CancelledError:
                session.abandon(ref)  # left to end; close() kills it if it runs on
                raise
            except Exception as exc:
                kind = kind_of(exc)
                if kind is Kind.FATAL:
                    err = LoaderError(f"decode_on='ray': a decode task failed: {type(exc).__name__}: {exc}")
                    raise err from exc
                return None, kind
            finally:
                session.done(ref)
            self._counters.cluster_task(
                session.tasks,
                len(chunk),
                time.perf_counter() - started,
                answer.decode_seconds,
                answer.read_seconds,
            )
            if answer.bytes_read:  # URLs the task read (local files are counted as read here)
                self._counters.add_bytes(answer.bytes_read)
            for _ in range(answer.retries):
                self._counters.retried()
            return answer, None

    async def _answer(self, ref: Any, samples: int) -> Answer:
        """``ref``'s answer; with ``sample_timeout``, the task is cancelled (``force=True``)
        once it has run past ``sample_timeout`` per sample and :data:`STUCK_GRACE`."""
        waiting = asyncio.wrap_future(ref.future())
        if self._timeout is None:
            answer: Answer = await waiting
            return answer
        done, _ = await asyncio.wait([waiting], timeout=self._timeout * samples + STUCK_GRACE)
        if not done:
            self._session.cancel(ref, force=True)
        answer = await waiting  # TaskCancelledError once cancelled: "stuck"
        return answer

    def _take(
        self,
        chunk: list[ChunkItem],
        answer: Answer,
        writer: RowWriter | None,
        outcomes: dict[int, Outcome],
    ) -> None:
        """Each sample of an answered task: written into the slab, or its error."""
        for (row, index, _), got in zip(chunk, answer.outcomes, strict=True):
            path = self._path_of(index)
            if isinstance(got, Pickled):
                res = writer.put(row, got.value) if writer is not None else got
                # Not in the slab (no room, no slab): a copy of its own, since the answer's
                # arrays are read-only views of Ray's object store, held while they live.
                outcomes[row] = Pickled(copy.deepcopy(res.value)) if isinstance(res, Pickled) else res
            elif isinstance(got, Failed):
                outcomes[row] = decode_error(got, path, index, "Ray worker")
            elif isinstance(got, TimedOut):
                outcomes[row] = LoaderTimeoutError(
                    f"decode took longer than sample_timeout={self._timeout}s", path=path, index=index
                )
            elif isinstance(got, Fatal):
                raise LoaderError(f"decode_on='ray': {got.message}")
            elif isinstance(got, OSError):
                failed = checked(got, path, index, self._io)
                assert isinstance(failed, SampleError)
                outcomes[row] = failed
            else:
                outcomes[row] = got


async def _all(aws: Any) -> None:
    """Await ``aws`` together; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
