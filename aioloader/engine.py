"""Stages 1-5 for one epoch: sample order -> reads -> decodes -> collation -> ready queue.

Runs entirely on the loader's event loop. Everything in flight is bounded: reads by the
reader's semaphore (``io_concurrency``), decodes by ``2 * num_workers`` (one running and one
queued per worker), batches under construction by a window of ``W`` batches, and finished
batches by the ready queue (``prefetch``). A failure is put into the queue in its batch's
place, so the trainer receives every batch before it, then the error.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from .collate import default_collate
from .config import LoaderConfig
from .dataset import FileDataset
from .errors import DecodeError, LoaderError, ReadError, SampleError, WorkerCrashedError
from .items import END, Batch, Failure, Item
from .reader import FileReader
from .sampler import EpochPlan
from .stats import Counters
from .workers import DecodePool

__all__ = ["Engine"]

logger = logging.getLogger("aioloader")
T = TypeVar("T")


class _Skipped:
    """A sample left out under ``on_error="skip"``."""


SKIPPED = _Skipped()


class Engine:
    """Produces the batches of one epoch into a queue (see :meth:`produce`)."""

    def __init__(
        self,
        config: LoaderConfig,
        dataset: FileDataset,
        reader: FileReader,
        pool: DecodePool | None,
        collate_pool: ThreadPoolExecutor,
        counters: Counters,
    ) -> None:
        self._cfg = config
        self._ds = dataset
        self._reader = reader
        self._pool = pool
        self._collate_pool = collate_pool
        self._collate: Callable[[list[Any]], Any] = config.collate or default_collate
        self._counters = counters
        self._decode_sem: asyncio.Semaphore | None = None
        self._warned: set[str] = set()
        self._seen = 0  # samples attempted, for max_failures as a fraction
        # Batches under construction: enough to keep every read slot busy, at least two so
        # the next batch starts while the current one finishes.
        self.window = max(2, math.ceil(config.io_concurrency / config.batch_size) + 1)

    async def produce(self, plan: EpochPlan, out: asyncio.Queue[Item]) -> None:
        """Put batches ``plan.start..len(plan)-1`` into ``out``, then ``END`` or a
        ``Failure``. Cancelling the task cancels every read and decode it started."""
        if self._decode_sem is None:
            self._decode_sem = asyncio.Semaphore(2 * self._cfg.num_workers)
        try:
            if self._cfg.ordered:
                await self._ordered(plan, out)
            else:
                await self._unordered(plan, out)
        except LoaderError as exc:
            await out.put(Failure(exc))
        except Exception as exc:  # noqa: BLE001 - a bug of ours must still reach the trainer
            err = LoaderError(f"loading stopped: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            await out.put(Failure(err))
        else:
            await out.put(END)

    async def _ordered(self, plan: EpochPlan, out: asyncio.Queue[Item]) -> None:
        building: deque[asyncio.Task[Batch | None]] = deque()
        next_k = plan.start
        try:
            while next_k < len(plan) or building:
                while next_k < len(plan) and len(building) < self.window:
                    building.append(asyncio.ensure_future(self._batch(plan, next_k)))
                    next_k += 1
                batch = await building[0]
                building.popleft()
                if batch is not None:
                    await out.put(batch)
        finally:
            await _cancel(building)

    async def _unordered(self, plan: EpochPlan, out: asyncio.Queue[Item]) -> None:
        """Samples join batches in the order they finish: a slow file delays only itself."""
        bs = plan.batch_size
        todo = iter(plan.indices[plan.start * bs :].tolist())
        running: set[asyncio.Task[Any]] = set()
        ready: list[Any] = []
        k = plan.start
        try:
            while True:
                for index in todo:
                    running.add(asyncio.ensure_future(self._sample(plan.epoch, index)))
                    if len(running) >= self.window * bs:
                        break
                if not running:
                    break
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    sample = task.result()
                    if sample is not SKIPPED:
                        ready.append(sample)
                    if len(ready) == bs:
                        await out.put(await self._collate_batch(k, ready))
                        k, ready = k + 1, []
            if ready:
                await out.put(await self._collate_batch(k, ready))
        finally:
            await _cancel(running)

    async def _batch(self, plan: EpochPlan, k: int) -> Batch | None:
        indices = plan.batch(k).tolist()
        samples = await _gather_or_cancel(self._sample(plan.epoch, i) for i in indices)
        kept = [s for s in samples if s is not SKIPPED]
        if not kept:
            return None
        return await self._collate_batch(k, kept)

    async def _collate_batch(self, k: int, samples: list[Any]) -> Batch:
        loop = asyncio.get_running_loop()
        try:
            value = await loop.run_in_executor(self._collate_pool, self._collate, samples)
        except Exception as exc:
            raise LoaderError(f"collate failed for batch {k}: {type(exc).__name__}: {exc}") from exc
        return Batch(index=k, value=value, size=len(samples))

    async def _sample(self, epoch: int, index: int) -> Any:
        """Read and decode one sample: ``decoded`` or ``(decoded, label)``, or SKIPPED."""
        path = self._ds.path(index)
        self._seen += 1
        try:
            data = await self._reader.read(path)
        except OSError as exc:
            return self._failed(
                ReadError(f"cannot read file: {exc.strerror or exc}", path=path, index=index), exc
            )
        if not data:
            return self._failed(ReadError("empty file", path=path, index=index), None)
        self._counters.add_bytes(len(data))
        decoded: Any = data
        if self._pool is not None:
            assert self._decode_sem is not None
            async with self._decode_sem:
                try:
                    ok, payload = await asyncio.wrap_future(
                        self._pool.submit(data, self._cfg.seed, epoch, index)
                    )
                except BrokenProcessPool as exc:
                    raise WorkerCrashedError(
                        f"a decode worker process died while sample {index} ({path!r}) was in flight"
                    ) from exc
            if not ok:
                cause, text = payload
                err = DecodeError(
                    f"decode failed: {type(cause).__name__}: {cause}\n--- worker traceback ---\n{text}",
                    path=path,
                    index=index,
                )
                err.worker_traceback = text
                return self._failed(err, cause)
            decoded = payload
        label = self._ds.label(index)
        return decoded if label is None else (decoded, label)

    def _failed(self, err: SampleError, cause: BaseException | None) -> _Skipped:
        """Raise ``err`` (``on_error="raise"``) or count and skip the sample."""
        err.__cause__ = cause
        if self._cfg.on_error == "raise":
            raise err
        reason = type(err).__name__
        self._counters.failed(reason, err.path)
        if err.path not in self._warned:
            self._warned.add(err.path)
            logger.warning("skipped %s", err)
        limit = self._cfg.max_failures
        failures = self._counters.snapshot().failures
        if limit is not None:
            over = failures > limit if isinstance(limit, int) else failures > limit * self._seen
            if over:
                raise LoaderError(
                    f"too many failed samples: {failures} of {self._seen} seen (max_failures={limit!r}); "
                    f"last: {err}"
                ) from err
        return SKIPPED


async def _gather_or_cancel(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Like ``asyncio.gather``, but the first failure cancels the others (and is raised)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:  # the first failure in batch order, so the error is deterministic
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        await _cancel(tasks)


async def _cancel(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until they are done (their own cleanup included)."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)
    for t in tasks:  # mark results/exceptions as retrieved: no "never retrieved" warnings
        if t.done() and not t.cancelled():
            t.exception()
