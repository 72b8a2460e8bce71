"""Stages 1-5 for one epoch: sample order -> reads -> decodes -> collation -> ready queue.

Runs entirely on the loader's event loop. Everything in flight is bounded: reads by the
reader's semaphore (``io_concurrency``), decodes by ``2 * num_workers`` (one running and one
queued per worker), batches under construction by a window of ``W`` batches, and finished
batches by the ready queue (``prefetch``). A failure is put into the queue in its batch's
place, so the trainer receives every batch before it, then the error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from aioloader.base import heap
from aioloader.base.items import END, Batch, Failure, Item
from aioloader.cache.samples import SampleCache
from aioloader.dataset import FileDataset
from aioloader.decode.contract import ChunkItem, DecodeRequest, DecodeStageLike
from aioloader.engine import sizing
from aioloader.engine.assemble import Assembler
from aioloader.engine.batch import BatchSlabs, BatchWork
from aioloader.engine.caching import keep_decoded, keep_read, read_through, shrink_for
from aioloader.engine.failures import FailurePolicy
from aioloader.engine.opening import Opening
from aioloader.engine.settings import Delivery, Failures
from aioloader.engine.sizing import SizeTracker, pooled_arenas, pooled_slabs
from aioloader.engine.tasks import cancel, gather_or_cancel
from aioloader.errors import LoaderError, LoaderTimeoutError, SampleError
from aioloader.memory.layout import LayoutTracker, declared_layout
from aioloader.memory.results import Pickled, RowResult, Source, layout_evidence
from aioloader.memory.slabs import Slab, SlabPool
from aioloader.observe.stats import Counters
from aioloader.plan.repack import Repacker
from aioloader.plan.sampler import EpochPlan
from aioloader.plan.settings import Sampling
from aioloader.read.reader import FileReader
from aioloader.read.urls import is_remote
from aioloader.tune.tuner import Tuner, Tuning, memory_budget, trainer_pids

__all__ = ["Engine", "pooled_arenas", "pooled_slabs"]


class Engine:
    """Produces the batches of one epoch into a queue (see :meth:`produce`).

    The stages each have one small interface: ``reader.fetch`` (read one sample, or a
    :class:`SampleError`), ``stage.run`` (decode a chunk: a result or an error per sample;
    any :class:`~aioloader.decode.contract.DecodeStageLike`, chosen where the loader is
    built, or None with ``decode=None``) and ``assembler.assemble`` (rows to a batch);
    ``policy`` decides what a failed sample does. The engine keeps the batch window, the
    order of delivery, the chunking of a batch over the workers, and what the slabs of the
    next batches look like.
    """

    def __init__(
        self,
        sampling: Sampling,
        delivery: Delivery,
        failures: Failures,
        decode: object,
        tuning: Tuning | None,
        dataset: FileDataset,
        reader: FileReader,
        stage: DecodeStageLike | None,
        slabs: SlabPool | None,
        collate_pool: ThreadPoolExecutor,
        counters: Counters,
        trainer_pid: int | None = None,
        inputs: SlabPool | None = None,
        cache: SampleCache | None = None,
    ) -> None:
        self._sampling, self._delivery, self._failures = sampling, delivery, failures
        self._batch_size = sampling.batch_size
        #: The sample cache (``Loader(cache=...)``), or None.
        self.cache = cache
        self._ds = dataset
        self._reader = reader
        self._slabs = slabs
        # Input arenas (slabs without rows): a batch's file bytes, from its reads until its
        # samples are decoded, in a pool of their own sized to the window, so the slabs
        # queued and held by the trainer do not each keep a batch of file bytes.
        self._inputs = inputs
        self._counters = counters
        self.policy = FailurePolicy(failures.on_error, failures.max_failures, counters, dataset.member)
        #: The decode stage (chosen where the loader is built); None with ``decode=None``.
        self._stage = stage
        self._assembler = Assembler(
            dataset.labels,
            slabs,
            delivery.collate,
            delivery.zero_copy,
            collate_pool,
            counters.meters["collate"],
            path_of=dataset.path,
        )
        self._layout = LayoutTracker(declared_layout(decode))
        self._trim = heap.BurstTrim()
        self._sizes = SizeTracker(sampling.batch_size)
        self._plan_slabs()
        # Samples per decode task: the stage's. Without decoding, a batch is one chunk: its
        # reads are all there is to it.
        self.chunk = stage.chunk if stage is not None else sampling.batch_size
        #: Moves the reader's limit and the decoders at work (``"auto"`` settings).
        self.tuner = self._tuner(tuning, trainer_pid) if tuning is not None else None

    def _tuner(self, tuning: Tuning, trainer_pid: int | None) -> Tuner:
        return Tuner(
            tuning,
            self._reader,
            self._stage,
            self._counters.meters,
            bytes_per_sample=self._bytes_per_sample,
            memory_budget=memory_budget(),
            trainer_pids=trainer_pids(trainer_pid),
            on_io=self._io_moved,
        )

    @property
    def _stage_in_flight(self) -> int:
        """Samples the decode stage keeps in flight beyond the reader's limit (Ray tasks)."""
        return self._stage.samples_in_flight if self._stage is not None else 0

    @property
    def window(self) -> int:
        """Batches under construction: enough to keep every read slot busy (the reader's
        limit now), at least two so the next batch starts while the current one finishes."""
        io = max(self._reader.io_concurrency, self._stage_in_flight)
        return sizing.window_size(io, self._batch_size)

    def _io_moved(self, io: int) -> None:
        """The read limit moved: so do the window and the slabs and arenas kept for it."""
        io = max(io, self._stage_in_flight)
        if self._slabs is not None:
            self._slabs.set_pooled(pooled_slabs(io, self._batch_size, self._delivery.prefetch))
        if self._inputs is not None:
            self._inputs.set_pooled(pooled_arenas(io, self._batch_size))

    def _bytes_per_sample(self) -> int:
        """What a sample in flight holds: its file's share of the input arena and its
        decoded output."""
        return self._sizes.arena_bytes() // self._batch_size + self._layout.out_bytes_per_sample()

    def _plan_slabs(self) -> None:
        """What the next slabs look like: rows blocks for the learned layout and an output
        area when shapes vary; the next input arenas: room for the file sizes seen."""
        if self._slabs is not None:
            out = self._batch_size * self._layout.out_bytes_per_sample()
            self._slabs.want(self._layout.sample, 0, out)
        if self._inputs is not None:
            self._inputs.want(None, self._sizes.arena_bytes(), 0)

    async def produce(self, plan: EpochPlan, out: asyncio.Queue[Item]) -> None:
        """Put the batches of ``plan.pending()`` into ``out``, then ``END`` or a
        ``Failure``. Cancelling the task cancels every read and decode it started."""
        tuning = asyncio.ensure_future(self.tuner.run()) if self.tuner is not None else None
        try:
            if self.cache is not None:
                await self.cache.begin(plan.epoch)
            await self._run(plan, out)
        except LoaderError as exc:
            await out.put(Failure(exc))
        except Exception as exc:  # noqa: BLE001 - a bug of ours must still reach the trainer
            err = LoaderError(f"loading stopped: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            await out.put(Failure(err))
        else:
            await out.put(END)
        finally:
            if tuning is not None:
                await cancel([tuning])

    async def _run(self, plan: EpochPlan, out: asyncio.Queue[Item]) -> None:
        """Build up to ``window`` batches at once; deliver them in sampler order, or as they
        finish with ``ordered=False`` (a batch waiting on one slow file does not hold back
        the others)."""
        building: deque[asyncio.Task[Batch]] = deque()
        todo = deque(plan.pending())
        sampling, delivery = self._sampling, self._delivery
        # drop_last with skipping: batches that lost samples are topped up from the next ones.
        repack = (
            Repacker(sampling.batch_size)
            if sampling.drop_last
            and self.policy.on_error == "skip"
            and delivery.ordered
            and delivery.collate is None
            else None
        )
        try:
            # Every batch of the window reads at once, but the later ones decode only once
            # every chunk of the epoch's first batch is read and has asked for its decode slot
            # (its decodes then take the workers first: the trainer waits for it) and, while
            # the slabs' layout is unknown, a probe has taught it (they decode into rows),
            # unless the order is completion order: a slow probe holds back only its batch.
            opening = Opening(
                self._slabs is not None and not self._layout.known, wait_for_layout=delivery.ordered
            )
            first = True
            while todo or building:
                while todo and len(building) < self.window:
                    task = asyncio.ensure_future(self._batch(plan, todo.popleft(), opening, first))
                    if first:
                        task.add_done_callback(lambda _: opening.batch_done())
                        first = False
                    building.append(task)
                if delivery.ordered:
                    task = building[0]
                    await task
                else:
                    done, _ = await asyncio.wait(building, return_when=asyncio.FIRST_COMPLETED)
                    task = min(done, key=building.index)
                building.remove(task)
                batch = task.result()
                for full in repack.push(batch) if repack is not None else [batch]:
                    await out.put(full)
            # Failures that all came early, with none after them, are judged here too: the
            # LoaderError takes END's place, after every batch.
            self.policy.epoch_ended()
        finally:
            await cancel(building)

    async def _batch(self, plan: EpochPlan, k: int, opening: Opening, first: bool) -> Batch:
        """Read, decode and assemble batch ``k``, the epoch's ``first`` or a later one."""
        indices: list[int] = plan.batch(k).tolist()
        # The rows slab: taken now by the first batch; by a later one when its first chunk
        # is to be decoded, once the epoch's opening is open (see _run: the layout it gets).
        slabs = BatchSlabs(self._slabs, self._inputs, take_rows=first)
        work = BatchWork(plan.epoch, k, indices, first, slabs)
        try:
            await self._decode_batch(work, opening)
            self._assembler.settle_probes(work.results, work.probes, slabs.rows)
            slabs.decoded()
            self._learn(work.results, slabs.rows)
            batch, slabs.rows = await self._assembler.assemble(k, indices, work.results, slabs.rows)
            return batch
        except BaseException:
            slabs.taint()
            raise
        finally:
            slabs.release()

    async def _decode_batch(self, work: BatchWork, opening: Opening) -> None:
        """Every chunk of the batch read and decoded, the probes first (the first batch's,
        while the layout is to learn: one sample each, the first to finish teaches it; the
        batch's other chunks then decode into rows, not back pickled. A slow probe holds up
        no worker)."""
        probes = 0
        if self._stage is not None and work.first and opening.need_layout:
            probes = self._stage.probes
        # Without a decode stage a batch is its reads: one chunk, ranges coalesced across it.
        chunk = sizing.opening_chunk(self.chunk) if work.first and self._stage is not None else self.chunk
        cuts = sizing.chunk_cuts(len(work.indices), chunk, probes)
        work.probes = min(probes, len(cuts))
        if work.first:
            opening.cut(len(cuts), work.probes)
        rows = range(len(work.indices))
        tasks = [self._chunk(work, rows[a:b], opening) for a, b in cuts]
        for i in range(work.probes):  # however a probe ends, the chunks waiting for it go on
            tasks[i] = opening.probe_with(tasks[i])
        await gather_or_cancel(tasks)

    async def _chunk(self, work: BatchWork, rows: range, opening: Opening) -> None:
        """Read the files of ``rows`` concurrently, take the chunk's turn in the epoch's
        opening, then decode them in one task."""
        items = await self._items(work, rows)
        # A chunk of the first batch counts as ready for the later batches once it is about
        # to ask for a decode slot: a probe's follower only after the probes, so that the
        # later batches, let in by the last of them, ask after every chunk of the first.
        follower = work.first and rows[0] >= work.probes > 0
        if work.first and (not follower or not items):
            opening.chunk_read()
        if not items:
            return
        if self._stage is None:  # decode=None: the sample is the file's bytes
            for r, _, src in items:
                work.results[r] = Pickled(src)
                if self.cache is not None:
                    keep_read(self.cache, work.fills, r, src, None)
            return
        await self._turn(work, rows[0], follower, opening)
        await self._decode(self._stage, work, items, opening)

    async def _items(self, work: BatchWork, rows: range) -> list[ChunkItem]:
        """The chunk's samples to decode, ``(row, index, source)`` in row order: the files
        read here, and the URLs as they are where the stage reads them itself. A sample whose
        read failed is left out (the failure policy has it)."""
        indices = work.indices
        here: range | list[int] = rows
        urls: list[ChunkItem] = []
        if self._stage is not None and self._stage.reads_urls and self.cache is None:
            paths = self._ds.paths_of([indices[r] for r in rows])
            urls = [(r, indices[r], p) for r, p in zip(rows, paths, strict=True) if is_remote(p)]
            if urls:
                here = [r for r, p in zip(rows, paths, strict=True) if not is_remote(p)]
                self.policy.attempted(len(urls))
        sources = await self._read(work, here) if here else []
        items: list[ChunkItem] = [
            (r, indices[r], src) for r, src in zip(here, sources, strict=True) if src is not None
        ]
        return sorted(items + urls) if urls else items

    async def _turn(self, work: BatchWork, row: int, follower: bool, opening: Opening) -> None:
        """Wait for the chunk's turn to decode: a later batch's until the epoch's opening
        lets it in; a follower of the first batch's probes until they taught the layout (or
        all ended), then, with a slab of the layout learned, straight to its slot, before
        any later batch resumes."""
        if not work.first:
            await opening.wait((work.k, row))
        elif follower:
            await opening.after_probe()
            work.slabs.relayout()  # a probe may still run with the old one
            opening.chunk_read()

    async def _decode(
        self, stage: DecodeStageLike, work: BatchWork, items: list[ChunkItem], opening: Opening
    ) -> None:
        """Decode ``items`` into the batch's rows slab; while the first batch still has the
        layout to learn, learn it from this chunk alone."""
        take = work.slabs.taker(len(items), self._layout.out_bytes_per_sample())  # at the slot's grant
        inputs = work.slabs.inputs
        shrink = shrink_for(self.cache, work.fills, items)
        request = DecodeRequest(work.epoch, work.k, items, inputs=inputs, shrink=shrink, take_rows=take)
        answered = await stage.run(request)
        # The slab this chunk decoded into; taken now where the stage took none (every
        # sample went to the device), as the batch is assembled from one all the same.
        slab = take.slab if take.slab is not None else work.slabs.rows_for_decode()
        arena = inputs.input if inputs is not None else None
        outcomes = keep_decoded(self.cache, work.fills, items, answered, arena)
        for (r, _, _), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, SampleError):
                self.policy.failed(outcome)
            else:
                work.results[r] = outcome
        if work.first and opening.need_layout:
            assert slab is not None  # a layout is only to learn where there are slabs
            self._observe([o for o in outcomes if not isinstance(o, SampleError)], slab)
            self._plan_slabs()
            if self._layout.known:
                opening.layout_learned()

    async def _read(self, work: BatchWork, rows: range | list[int]) -> list[Source | None]:
        """The bytes of the samples in ``rows`` (into the batch's input arena when decoding
        locally; from the cache where it has them); None for a sample that failed and is
        skipped. The misses the cache wants are noted in ``work.fills``."""
        indices, inputs = work.indices, work.slabs.inputs
        self.policy.attempted(len(rows))
        arena = inputs.input if inputs is not None and self._stage is not None else None
        chosen = [indices[r] for r in rows]
        items = list(zip(chosen, self._ds.paths_of(chosen), strict=True))
        spans = [self._ds.span(index) for index in chosen] if self._ds.has_spans else None
        sources: list[Source | None] = []
        total = 0
        got, fills, served = await read_through(
            self.cache, self._reader, items, spans, arena, self._failures.sample_timeout
        )
        for row, res, fill in zip(rows, got, fills, strict=True):
            if isinstance(res, SampleError):
                if isinstance(res, LoaderTimeoutError) and inputs is not None:
                    inputs.tainted = True  # the abandoned read may still write into its arena
                self.policy.failed(res)
                sources.append(None)
                continue
            size = res[1] if isinstance(res, tuple) else len(res)
            total += size
            sources.append(res)
            if fill is not None:
                work.fills[row] = (fill, size)
        read = len(sources) - sources.count(None)
        if read:  # counted once per chunk: a chunk may be a whole batch of tiny files
            # Bytes read from the source; the cache's hits (their bytes in stats.cache) too
            # fill the arenas the sizes plan.
            self._counters.add_bytes(total - served)
            self._sizes.add(total, read)
        return sources

    def _learn(self, results: list[RowResult | None], slab: Slab | None) -> None:
        """Feed the layout tracker with this batch's samples; plan the next slabs."""
        if slab is None:
            return
        self._observe(results, slab)
        self._plan_slabs()
        # Samples that crossed from the workers pickled leave megabytes in this process's
        # malloc arenas (aioloader/base/heap.py): given back once the batches fit the slabs.
        if self._trim.saw(any(isinstance(r, Pickled) for r in results)):
            heap.trim()

    def _observe(self, results: list[RowResult | None] | list[RowResult], slab: Slab) -> None:
        misses, fitted = layout_evidence(results)
        if misses or not self._layout.known:
            self._layout.observe(misses, fitted, slab.layout.sample)
