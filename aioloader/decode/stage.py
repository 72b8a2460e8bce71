"""The decode stage the engine awaits: one chunk of a batch in, one outcome per sample out.

:meth:`DecodeStage.run` takes a chunk's samples (already read into the batch's slab) and
returns, for each, a :data:`~aioloader.memory.results.RowResult` or the :class:`~aioloader.SampleError`
that ends it. On the way it

- waits for a decode slot, granted in epoch order (:mod:`aioloader.memory.slots`);
- during hot start (the built-in ``ImageDecoder`` only, while the workers boot) decodes on
  a thread of this process instead;
- with ``sample_timeout``, kills the worker of a row decoding for longer than that (the
  slab's status table says which worker and since when);
- after a worker death, asks the pool what broke it and resubmits what is left exactly
  once per death, each row judged by :mod:`aioloader.decode.faults`: a row whose worker
  was killed for a timeout fails with :class:`LoaderTimeoutError`, a row that was on a
  crashing worker twice is a poison sample (:class:`DecodeError` naming pid and signal),
  every other row is decoded again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from aioloader.decode.chunk import Chunk
from aioloader.decode.contract import ChunkItem, DecodeRequest, Outcome
from aioloader.decode.faults import sort_out
from aioloader.decode.pool import DecodePool
from aioloader.decode.worker import NotLoaded, decode_chunk
from aioloader.errors import DecodeError, LoaderError
from aioloader.memory.results import Failed, RowResult, Shrunk
from aioloader.memory.slabs import Slab
from aioloader.memory.slots import OrderedSlots
from aioloader.observe.stages import StageMeter

__all__ = ["DecodeStage", "Outcome", "decode_error"]


class DecodeStage:
    """Decodes chunks on ``pool``, ``chunk`` samples a task; ``path_of(index)`` names a
    sample's file in errors. A :class:`~aioloader.decode.contract.DecodeStageLike`.

    ``hot``: the decoder is trusted code that declares ``hot_start``
    (:func:`~aioloader.decode.contract.declares_hot_start`, the built-in ``ImageDecoder``)
    and may run on ``local`` (a thread of this process) until every worker has started.
    ``on_restart`` is told the pool's restart count after each rebuild.
    """

    #: The reader's reads feed the workers: no samples in flight of the stage's own.
    samples_in_flight = 0
    #: URLs are read by the reader, on the loader's loop.
    reads_urls = False

    def __init__(
        self,
        decode: Callable[[bytes], Any],
        pool: DecodePool,
        *,
        chunk: int,
        seed: int,
        sample_timeout: float | None,
        path_of: Callable[[int], str],
        hot: bool,
        local: Executor,
        on_restart: Callable[[int], None],
        meter: StageMeter | None = None,
        forget: Callable[[], tuple[str, ...]] = tuple,
    ) -> None:
        self._decode = decode
        # Timed from a worker slot's grant to the result: the chunk's wait in the worker's
        # queue (at most one chunk) and its decode; not the wait for a slot.
        self._meter = meter if meter is not None else StageMeter("decode")
        self._pool = pool
        self.chunk = chunk
        # One probe per worker: the first to finish teaches the layout, a slow one holds up
        # no worker.
        self.probes = pool.num_workers
        self._seed = seed
        self._timeout = sample_timeout
        self._path_of = path_of
        # A thread cannot be killed: no hot start when a hung decode must be stopped.
        self._hot = hot and sample_timeout is None
        self._hot_lock: asyncio.Lock | None = None
        self._local = local
        self._on_restart = on_restart
        self._forget = forget
        # One running and one queued task per worker; granted in epoch order once the pool
        # has started (created lazily: it binds to the loader's loop).
        self._slots: OrderedSlots | None = None
        self._opener: asyncio.Future[None] | None = None
        self.active = pool.num_workers  # processes decoding at once (see set_workers)

    def set_workers(self, active: int) -> None:
        """Let ``active`` of the pool's processes decode at once (``num_workers="auto"``).
        While all of them do, each has one task running and one queued; while some rest,
        one task each and none queued, since a queued task would start on a resting
        process. Chunks already submitted finish. On the loader's loop."""
        self.active = max(1, min(self._pool.num_workers, active))
        self._meter.capacity = self.active
        self._meter.bound = self._slot_limit()
        if self._slots is not None:
            self._slots.set_limit(self._slot_limit())

    def _slot_limit(self) -> int:
        n = self._pool.num_workers
        return 2 * n if self.active >= n else self.active

    async def run(self, request: DecodeRequest) -> list[Outcome]:
        """Decode ``request``'s items (``(row, dataset index, source)``) into its slab, on the
        workers (or, in hot start, here). Raises only for the whole loader
        (:class:`~aioloader.WorkerCrashedError`) or on cancellation. The rows slab is taken
        (:meth:`~aioloader.decode.contract.DecodeRequest.with_rows`) once the chunk may
        decode: in hot start at once, on the workers when its slot is granted."""
        items = request.items
        results = None
        if self._hot and not self._pool.warm.is_set():
            request = request.with_rows()
            results = await self._here(self._task(request, items), request.slab, request.inputs)
        outcomes: dict[int, Outcome] = {}
        crashes: dict[int, int] = {}
        left = items
        while results is None and left:
            results, generation, request = await self._on_workers(request, left)
            if results is not None:
                break
            # The pool broke under the chunk: rebuilt, then each row judged by the worker
            # it was on (decode/faults.py); what is left is resubmitted, once per death.
            broke = await self._pool.recover(generation, [self._path_of(i) for _, i, _ in left])
            self._on_restart(self._pool.restarts)
            slab = request.slab
            pids = [slab.status.busy(row)[0] if slab is not None else 0 for row, _, _ in left]
            judged = sort_out(left, pids, broke, crashes, timeout=self._timeout, path_of=self._path_of)
            outcomes.update(judged.ended)
            crashes = judged.crashes
            left = judged.again
        for (row, index, _), res in zip(left, results or [], strict=True):
            outcomes[row] = decode_error(res, self._path_of(index), index) if isinstance(res, Failed) else res
        return [outcomes[row] for row, _, _ in items]

    def _task(self, request: DecodeRequest, items: list[ChunkItem]) -> Chunk:
        """The task that decodes ``items`` of ``request`` (its rows slab taken)."""
        slab, inputs = request.slab, request.inputs
        return Chunk(
            slab.handle if slab else None,
            slab.layout if slab else None,
            items,
            self._seed,
            request.epoch,
            request.out,
            inputs.handle if inputs else None,
            inputs.layout.input if inputs else 0,
            self._forget(),
            request.shrink,
        )

    async def _on_workers(
        self, request: DecodeRequest, items: list[ChunkItem]
    ) -> tuple[list[RowResult | Shrunk] | None, int, DecodeRequest]:
        """One try of ``items`` on the workers, once a slot is granted (in epoch order): its
        results, or None where the pool broke under it; the pool's generation it was
        submitted to; and ``request`` with its rows slab, taken at the grant."""
        async with self._open_slots().slot((request.k, items[0][0])):
            request = request.with_rows()
            chunk = self._task(request, items)
            fut, generation = self._pool.submit(chunk)
            try:
                with self._meter.timed(per=len(chunk.items)):
                    return await self._watch(fut, request.slab, chunk), generation, request
            except BrokenProcessPool:
                return None, generation, request
            except NotLoaded as exc:  # this loader's decode does not unpickle there
                raise self._pool.not_loaded(exc) from None

    def _open_slots(self) -> OrderedSlots:
        if self._slots is None:
            slots = self._slots = OrderedSlots(self._slot_limit(), opened=False)
            self._opener = asyncio.ensure_future(self._open_when_started(slots))
        return self._slots

    async def _open_when_started(self, slots: OrderedSlots) -> None:
        try:
            await self._pool.started()
        except LoaderError:
            pass  # a pool that failed to start raises at submit, in order
        finally:
            slots.open()

    async def _here(
        self, chunk: Chunk, slab: Slab | None, inputs: Slab | None
    ) -> list[RowResult | Shrunk] | None:
        """Hot start: until every worker process is up (the fork server takes a while to
        boot), decode one chunk at a time on a thread of this process, so the first batch
        does not wait for the workers. None: use the workers."""
        if not self._hot or self._pool.warm.is_set():
            return None
        if self._hot_lock is None:
            self._hot_lock = asyncio.Lock()
        async with self._hot_lock:  # one chunk at a time, first come (in batch order) first served
            if self._pool.warm.is_set():
                return None
            loop = asyncio.get_running_loop()
            m = slab.mmap if slab is not None else None
            im = inputs.mmap if inputs is not None else None
            with self._meter.timed(per=len(chunk.items)):
                return await loop.run_in_executor(self._local, decode_chunk, m, chunk, self._decode, im)

    async def _watch(
        self, fut: Future[list[RowResult | Shrunk]], slab: Slab | None, chunk: Chunk
    ) -> list[RowResult | Shrunk]:
        """Await a decode task; with ``sample_timeout``, kill the worker of a row that has
        been decoding longer than that (the status table says who and since when)."""
        waiting = asyncio.wrap_future(fut)
        timeout = self._timeout
        if timeout is None or slab is None:
            return await waiting
        while True:
            done, _ = await asyncio.wait([waiting], timeout=min(0.2, timeout / 4))
            if done:
                return waiting.result()
            now = time.monotonic()
            for row, _, _ in chunk.items:
                pid, since = slab.status.busy(row)
                if pid and now - since > timeout:
                    self._pool.kill_for_timeout(pid)


def decode_error(res: Failed, path: str, index: int, where: str = "worker") -> DecodeError:
    """The :class:`DecodeError` of a sample whose decode raised: the user's exception as its
    cause, the traceback of the ``where`` it ran in (a worker, a Ray worker) in its message
    and in ``worker_traceback``."""
    cause = res.error
    err = DecodeError(f"decode failed: {type(cause).__name__}: {cause}", path=path, index=index)
    err.worker_traceback = res.traceback
    err.where = where
    err.__cause__ = cause
    return err
