"""Stages 1-5 for one epoch: sample order -> reads -> decodes -> collation -> ready queue.

Runs entirely on the loader's event loop. Everything in flight is bounded: reads by the
reader's semaphore (``io_concurrency``), decodes by ``2 * num_workers`` (one running and one
queued per worker), batches under construction by a window of ``W`` batches, and finished
batches by the ready queue (``prefetch``). A failure is put into the queue in its batch's
place, so the trainer receives every batch before it, then the error.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import numpy as np
import torch

from ._worker import Result, run_chunk_in
from .collate import default_collate
from .config import LoaderConfig
from .dataset import FileDataset
from .decode import ImageDecoder
from .errors import DecodeError, LoaderError, LoaderTimeoutError, ReadError, SampleError
from .items import END, Batch, Failure, Item
from .reader import FileReader, Source
from .repack import Repacker
from .sampler import EpochPlan
from .slabs import Slab, SlabPool
from .slots import OrderedSlots
from .stats import Counters
from .workers import DecodePool, describe_deaths

__all__ = ["Engine"]

logger = logging.getLogger("aioloader")
T = TypeVar("T")


class _Skipped:
    """A sample left out under ``on_error="skip"`` (or not decoded yet)."""


class _Wrote:
    """A sample a worker wrote into its row of the batch slab."""


SKIPPED = _Skipped()
WROTE = _Wrote()
#: ``(row in the batch, dataset index, source of the bytes)``
Item3 = tuple[int, int, Source]


class Engine:
    """Produces the batches of one epoch into a queue (see :meth:`produce`)."""

    def __init__(
        self,
        config: LoaderConfig,
        dataset: FileDataset,
        reader: FileReader,
        pool: DecodePool | None,
        slabs: SlabPool | None,
        collate_pool: ThreadPoolExecutor,
        counters: Counters,
    ) -> None:
        self._cfg = config
        self._ds = dataset
        self._reader = reader
        self._pool = pool
        self._slabs = slabs
        self._collate_pool = collate_pool
        self._collate: Callable[[list[Any]], Any] = config.collate or default_collate
        self._counters = counters
        self._slots: OrderedSlots | None = None  # decode tasks in flight, granted in epoch order
        self._opener: asyncio.Future[None] | None = None
        self._hot = isinstance(config.decode, ImageDecoder) and config.sample_timeout is None
        self._hot_lock: asyncio.Lock | None = None
        self._warned: set[str] = set()
        self._seen = 0  # samples attempted, for max_failures as a fraction
        self._sizes = _SizeTracker(config.batch_size)
        if slabs is not None:
            slabs.want_input_capacity(self._sizes.arena_bytes())
        # Batches under construction: enough to keep every read slot busy, at least two so
        # the next batch starts while the current one finishes.
        self.window = window_size(config.io_concurrency, config.batch_size)
        # Samples per decode task: one round trip to a worker is amortised over a chunk, and
        # a batch still spreads over every worker (two chunks each).
        self.chunk = chunk_size(config.batch_size, config.num_workers)

    async def produce(self, plan: EpochPlan, out: asyncio.Queue[Item]) -> None:
        """Put the batches of ``plan.pending()`` into ``out``, then ``END`` or a
        ``Failure``. Cancelling the task cancels every read and decode it started."""
        if self._slots is None and self._pool is not None:
            slots = self._slots = OrderedSlots(2 * self._cfg.num_workers, opened=False)
            self._opener = asyncio.ensure_future(self._open_when_started(slots))
        try:
            await self._run(plan, out)
        except LoaderError as exc:
            await out.put(Failure(exc))
        except Exception as exc:  # noqa: BLE001 - a bug of ours must still reach the trainer
            err = LoaderError(f"loading stopped: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            await out.put(Failure(err))
        else:
            await out.put(END)

    async def _run(self, plan: EpochPlan, out: asyncio.Queue[Item]) -> None:
        """Build up to ``window`` batches at once; deliver them in sampler order, or as they
        finish with ``ordered=False`` (a batch waiting on one slow file does not hold back
        the others)."""
        building: deque[asyncio.Task[Batch | None]] = deque()
        todo = deque(plan.pending())
        cfg = self._cfg
        # drop_last with skipping: batches that lost samples are topped up from the next ones.
        repack = (
            Repacker(cfg.batch_size)
            if cfg.drop_last and cfg.on_error == "skip" and cfg.ordered and cfg.collate is None
            else None
        )
        try:
            while todo or building:
                while todo and len(building) < self.window:
                    building.append(asyncio.ensure_future(self._batch(plan, todo.popleft())))
                if self._cfg.ordered:
                    task = building[0]
                    await task
                else:
                    done, _ = await asyncio.wait(building, return_when=asyncio.FIRST_COMPLETED)
                    task = min(done, key=building.index)
                building.remove(task)
                batch = task.result()
                if batch is not None:
                    for full in repack.push(batch) if repack is not None else [batch]:
                        await out.put(full)
        finally:
            await _cancel(building)

    async def _batch(self, plan: EpochPlan, k: int) -> Batch | None:
        """Read, decode and assemble batch ``k``."""
        indices: list[int] = plan.batch(k).tolist()
        slab = self._slabs.acquire() if self._slabs is not None else None
        try:
            results: list[Any] = [SKIPPED] * len(indices)
            rows = range(len(indices))
            await _gather_or_cancel(
                self._chunk(plan.epoch, k, slab, indices, rows[i : i + self.chunk], results)
                for i in range(0, len(indices), self.chunk)
            )
            if self._slabs is not None:
                self._slabs.want_input_capacity(self._sizes.arena_bytes())
            batch, slab = await self._assemble(k, indices, results, slab)
            return batch
        except BaseException:
            if slab is not None:  # a worker or a read may still write into it: never reuse it
                slab.tainted = True
            raise
        finally:
            if slab is not None:
                self._slabs.release(slab)  # type: ignore[union-attr]

    async def _chunk(
        self, epoch: int, k: int, slab: Slab | None, indices: list[int], rows: range, results: list[Any]
    ) -> None:
        """Read the files of ``rows`` concurrently, then decode them in one worker task."""
        sources = await _gather_or_cancel(self._read(indices[r], slab) for r in rows)
        items = [
            (r, indices[r], src)
            for r, src in zip(rows, sources, strict=True)
            if not isinstance(src, _Skipped)
        ]
        if not items:
            return
        if self._pool is None:  # decode=None: the sample is the file's bytes
            for r, _, src in items:
                results[r] = src
            return
        await self._decode(epoch, k, slab, items, results)

    async def _decode(
        self, epoch: int, k: int, slab: Slab | None, items: list[Item3], results: list[Any]
    ) -> None:
        """Decode ``items`` in one task; after a worker death, resubmit what is left.

        The slab's status table says which row each dead worker was on. A row whose worker
        was killed for a timeout fails with :class:`LoaderTimeoutError`; a row that was on a
        crashing worker twice fails as a :class:`DecodeError`; every other row is resubmitted
        (its result, if any, was lost with the task), so nothing is lost or delivered twice.
        """
        assert self._pool is not None and self._slots is not None
        pool = self._pool
        layout = (slab.status_offset, slab.in_offset, slab.out_offset) if slab is not None else (0, 0, 0)
        crashes: dict[int, int] = {}
        outcome = await self._decode_here(epoch, slab, layout, items)
        while outcome is None and items:
            generation = pool.generation
            async with self._slots.slot((k, items[0][0])):
                try:
                    fut = pool.submit(slab.path if slab else None, layout, items, self._cfg.seed, epoch)
                    outcome = await self._watch(fut, slab, items)
                    break
                except BrokenProcessPool:
                    pass
            paths = [self._ds.path(i) for _, i, _ in items]
            await pool.recover(generation, paths)
            self._counters.worker_restarts = pool.restarts
            left: list[Item3] = []
            for item in items:
                r, index = item[0], item[1]
                pid = int(slab.status[r, 0]) if slab is not None else 0
                path = self._ds.path(index)
                if pid > 0 and pid in pool.timed_out:
                    limit = self._cfg.sample_timeout
                    late = LoaderTimeoutError(
                        f"decode took longer than sample_timeout={limit}s", path=path, index=index
                    )
                    results[r] = self._failed(late, None)
                elif pid > 0 and pid in pool.culprits:
                    crashes[r] = crashes.get(r, 0) + 1
                    if crashes[r] >= 2:
                        why = describe_deaths({pid: pool.culprits[pid]})
                        results[r] = self._failed(
                            DecodeError(f"decode worker {why}, twice", path=path, index=index), None
                        )
                    else:
                        left.append(item)
                else:
                    left.append(item)
            items = left
        if outcome is None:
            return
        for (r, index, _), res in zip(items, outcome, strict=True):
            if res is None:
                results[r] = WROTE
            elif res[0] == "value":
                results[r] = res[1]
            else:
                _, cause, text = res
                path = self._ds.path(index)
                err = DecodeError(
                    f"decode failed: {type(cause).__name__}: {cause}\n--- worker traceback ---\n{text}",
                    path=path,
                    index=index,
                )
                err.worker_traceback = text
                results[r] = self._failed(err, cause)

    async def _open_when_started(self, slots: OrderedSlots) -> None:
        assert self._pool is not None
        try:
            await self._pool.started()
        finally:  # a pool that failed to start raises at submit, in order
            slots.open()

    async def _decode_here(
        self, epoch: int, slab: Slab | None, layout: tuple[int, int, int], items: list[Item3]
    ) -> list[Result] | None:
        """Hot start: until every worker process is up (the fork server takes about a second
        to boot), decode one chunk at a time on a thread of this process, so the first batch
        does not wait for the workers. Only for the built-in ImageDecoder, and not with
        ``sample_timeout`` (a thread cannot be killed): a user's decode may crash or hang,
        and that must never take the trainer's process with it. None: use the workers."""
        pool = self._pool
        if not self._hot or pool is None or pool.warm.is_set():
            return None
        if self._hot_lock is None:
            self._hot_lock = asyncio.Lock()
        async with self._hot_lock:  # one chunk at a time, first come (in batch order) first served
            if pool.warm.is_set():
                return None
            spec = self._slabs.spec if self._slabs is not None else None
            shape = spec.shape if spec is not None else None
            dtype = spec.dtype if spec is not None and shape is not None else None
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._collate_pool,
                run_chunk_in,
                slab.mmap if slab is not None else None,
                layout,
                items,
                self._cfg.seed,
                epoch,
                self._cfg.decode,
                shape,
                dtype,
            )

    async def _watch(self, fut: Future[list[Result]], slab: Slab | None, items: list[Item3]) -> list[Result]:
        """Await a decode task; with ``sample_timeout``, kill the worker of a row that has
        been decoding longer than that (the status table says who and since when)."""
        timeout = self._cfg.sample_timeout
        waiting = asyncio.wrap_future(fut)
        if timeout is None or slab is None:
            return await waiting
        assert self._pool is not None
        while True:
            done, _ = await asyncio.wait([waiting], timeout=min(0.2, timeout / 4))
            if done:
                return waiting.result()
            now = time.monotonic()
            for r, _, _ in items:
                pid, start = slab.status[r]
                if pid > 0 and now - start > timeout:
                    self._pool.kill_for_timeout(int(pid))

    async def _read(self, index: int, slab: Slab | None) -> Source | _Skipped:
        path = self._ds.path(index)
        self._seen += 1
        try:
            if slab is not None and self._pool is not None:
                reading: Awaitable[Source] = self._reader.read_into(path, slab.arena)
            else:
                reading = self._reader.read(path)
            src = await asyncio.wait_for(reading, self._cfg.sample_timeout)
        except asyncio.TimeoutError:
            if slab is not None:
                slab.tainted = True  # the abandoned read may still write into its arena
            limit = self._cfg.sample_timeout
            return self._failed(
                LoaderTimeoutError(f"read took longer than sample_timeout={limit}s", path=path, index=index),
                None,
            )
        except OSError as exc:
            hint = ""
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                io = self._cfg.io_concurrency
                hint = f"; raise the open-file limit (ulimit -n) or lower io_concurrency={io}"
            err = ReadError(f"cannot read file: {exc.strerror or exc}{hint}", path=path, index=index)
            return self._failed(err, exc)
        size = src[1] if isinstance(src, tuple) else len(src)
        if size == 0:
            return self._failed(ReadError("empty file", path=path, index=index), None)
        self._counters.add_bytes(size)
        self._sizes.add(size)
        return src

    async def _assemble(
        self, k: int, indices: list[int], results: list[Any], slab: Slab | None
    ) -> tuple[Batch | None, Slab | None]:
        """The batch from decoded rows; returns the slab too unless the batch now owns it."""
        kept = [r for r, res in enumerate(results) if res is not SKIPPED]
        if not kept:  # every sample skipped: an empty marker keeps the resume position exact
            return Batch(index=k, value=None, size=0), slab
        labels = self._ds.labels
        label_tensor = (
            None if labels is None else torch.from_numpy(labels[[indices[r] for r in kept]].astype(np.int64))
        )
        if slab is not None and all(results[r] is WROTE for r in kept) and self._cfg.collate is None:
            if len(kept) == len(results) and self._cfg.zero_copy:
                array = slab.output(len(kept))
                # The slab is free again once the last tensor viewing it is garbage.
                weakref.finalize(array, self._slabs.release, slab)  # type: ignore[union-attr]
                slab = None
            else:
                array = slab.output(len(results))[kept]  # a copy: the slab is free at once
            images = torch.from_numpy(array)
            value = images if label_tensor is None else (images, label_tensor)
            return Batch(index=k, value=value, size=len(kept)), slab
        rows = slab.output(len(results)) if slab is not None and slab.spec.shape is not None else None
        # Rows written into the slab are copied out: the slab goes back once collated.
        samples = [rows[r].copy() if rows is not None and results[r] is WROTE else results[r] for r in kept]
        if label_tensor is not None:
            samples = [(s, int(lbl)) for s, lbl in zip(samples, label_tensor.tolist(), strict=True)]
        return await self._collate_batch(k, samples), slab

    async def _collate_batch(self, k: int, samples: list[Any]) -> Batch:
        loop = asyncio.get_running_loop()
        try:
            value = await loop.run_in_executor(self._collate_pool, self._collate, samples)
        except Exception as exc:
            raise LoaderError(f"collate failed for batch {k}: {type(exc).__name__}: {exc}") from exc
        return Batch(index=k, value=value, size=len(samples))

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


def window_size(io_concurrency: int, batch_size: int) -> int:
    """Batches built at once: enough samples in flight to use every read slot, at least 2."""
    return max(2, math.ceil(io_concurrency / batch_size) + 1)


def chunk_size(batch_size: int, num_workers: int) -> int:
    """Samples per decode task: a batch split into about two tasks per worker, at most 32."""
    return max(1, min(32, math.ceil(batch_size / (2 * num_workers))))


class _SizeTracker:
    """Running mean of file sizes, to size the slabs' input arenas (+50% headroom)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.total = 0
        self.count = 0

    def add(self, size: int) -> None:
        self.total += size
        self.count += 1

    def arena_bytes(self) -> int:
        mean = self.total / self.count if self.count else 128 * 1024
        per_sample = int(mean * 1.5) + 4096
        return -(-self.batch_size * per_sample // 65536) * 65536  # whole 64 KiB


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
