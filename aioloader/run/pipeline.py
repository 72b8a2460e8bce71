"""The parts that load batches, whichever process they run in: the reader's threads, the
decode pool, the pools of slabs and input arenas, the collate thread and the
:class:`~aioloader.engine.epoch.Engine`.

:func:`build` makes them for one loader; :meth:`Pipeline.close` stops them. The trainer's
process runs them on its ``aioloader-loop`` thread (:mod:`aioloader.run.runtime`), or a loader process
of their own does (:mod:`aioloader.run.loaderproc`, the default).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aioloader.base.cgmemory import available_memory
from aioloader.cache.samples import SampleCache
from aioloader.cache.settings import resolved_bound
from aioloader.cluster.session import RaySession
from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.decode.pool import DecodePool
from aioloader.engine.decoding import decode_stage
from aioloader.engine.epoch import Engine, pooled_arenas, pooled_slabs
from aioloader.errors import LoaderError
from aioloader.memory.layout import declared_layout
from aioloader.memory.segments import FDS_PER_SLAB, MEMFD, choose_kind
from aioloader.memory.slabs import SlabPool
from aioloader.observe.cachestats import CacheStats
from aioloader.observe.stats import Counters
from aioloader.read.backends import StorageBackend
from aioloader.read.reader import FileReader
from aioloader.read.routing import read_workers
from aioloader.read.workers import ReadWorkers
from aioloader.tune.tuner import MAX_AUTO_IO

__all__ = ["Pipeline", "build", "io_concurrency_for_fd_limit"]

logger = logging.getLogger("aioloader")


def io_concurrency_for_fd_limit(
    wanted: int, num_workers: int = 0, slab_rows: int = 0, prefetch: int = 0, slab_fds: int = 0
) -> int:
    """``wanted`` reads in flight, or fewer when the open-file limit (``ulimit -n``) would
    run out: each read holds one fd, each worker process about four in the parent (pipes and
    its sentinel), and half of what is left stays for everything else. With memfd slabs of
    ``slab_rows`` rows, each slab and each input arena holds ``slab_fds`` too, and there is
    one slab and one arena per ``slab_rows`` reads in flight, plus the slabs of the batches
    queued (``prefetch``) and a few more (see :mod:`aioloader.engine.sizing`)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        in_use = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError, ValueError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    spare = (soft - in_use - 16 - 4 * num_workers) // 2
    if slab_rows > 0 and slab_fds > 0:
        spare = (spare - slab_fds * (prefetch + 7)) * slab_rows // (slab_rows + 2 * slab_fds)
    return max(1, min(wanted, spare))


def _fd_soft_limit() -> int:
    import resource

    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def slabs_for(config: LoaderConfig, max_io: int | None = None) -> int:
    """Slabs the pipeline of a loader of ``config`` may hold with ``max_io`` reads in flight
    (:func:`~aioloader.engine.sizing.pooled_slabs` of its settings); ``max_io`` defaults to
    the most ``io_concurrency`` may reach."""
    if max_io is None:
        max_io = MAX_AUTO_IO if config.reading.io_auto else config.reading.io_start
    return pooled_slabs(max_io, config.sampling.batch_size, config.delivery.prefetch)


@dataclass(frozen=True)
class IoLimits:
    """The reads in flight a pipeline starts with (``start``) and the most ``"auto"`` may
    reach (``most``), both within what the open-file limit leaves."""

    start: int
    most: int


@dataclass
class Pipeline:
    """One loader's loading parts (see the module docstring)."""

    engine: Engine
    reader: FileReader
    pool: DecodePool | None
    slabs: SlabPool | None
    collate_pool: ThreadPoolExecutor
    cluster: RaySession | None = None
    inputs: SlabPool | None = None
    cache: SampleCache | None = None

    async def aclose(self) -> None:
        """On the loader's loop, before it stops: the cache's writes under way finish, the
        remote connections close."""
        try:
            if self.cache is not None:
                await self.cache.aclose(timeout=1.0)
        finally:
            await self.reader.aclose()

    def close(self, grace: float) -> None:
        """Stop the workers (``grace`` seconds for a decode in progress) or cancel the Ray
        tasks, stop the reader's and the collate thread, and close the slabs. Run it once
        the engine's tasks are done."""
        if self.pool is not None:
            self.pool.close(grace)
        if self.cluster is not None:
            self.cluster.close()
        self.reader.close()
        if self.cache is not None:
            self.cache.close(grace)
        self.collate_pool.shutdown(wait=True, cancel_futures=True)
        if self.slabs is not None:
            self.slabs.close()
        if self.inputs is not None:
            self.inputs.close()


def build(
    config: LoaderConfig,
    dataset: FileDataset,
    counters: Counters,
    trainer_pid: int | None = None,
    storage_backend: StorageBackend | None = None,
) -> Pipeline:
    """The parts for ``config`` (``io_concurrency`` lowered if the open-file limit needs
    it; with ``"auto"``, its range bounded by that limit); the decode pool's workers start
    lazily, on the first batch. ``trainer_pid``: in a loader process, the trainer's;
    ``storage_backend``: the client of remote reads where it is not the build's.
    With ``decode_on="ray"`` it connects first: nothing is made if that fails (nor if a
    disk cache's folder cannot be used: checked before)."""
    cache = _sample_cache(config, counters)
    try:
        return _assemble(
            config, dataset, counters, trainer_pid, cache, storage_backend or config.build.storage_backend
        )
    except BaseException:  # what it made it closed; the cache's threads go too
        if cache is not None:
            cache.close()
        raise


@dataclass
class _Decoders:
    """What decodes, and the shared memory it decodes into (none of them with ``decode=None``)."""

    pool: DecodePool | None = None
    cluster: RaySession | None = None
    slabs: SlabPool | None = None
    inputs: SlabPool | None = None


def _decoders(config: LoaderConfig, counters: Counters) -> tuple[_Decoders, IoLimits]:
    """The Ray session (connected) or the decode pool (its workers not yet started), the
    pools of slabs and arenas, and the reads in flight they are sized for."""
    decode, batch_size, made = config.decoding.decode, config.sampling.batch_size, _Decoders()
    if config.decoding.on_ray:
        made.cluster = RaySession(config.build.sent["decode"], config.build.cluster_tasks)
        made.cluster.start()
        counters.meters["decode"].capacity = made.cluster.tasks
        counters.meters["decode"].bound = made.cluster.bound
    kind = choose_kind() if decode is not None else None
    io = io_limits(config, counters, kind)
    if decode is None:
        return made, io
    if made.cluster is None:
        where = f"decode={decode!r}"
        workers, restarts = config.build.workers, config.decoding.max_worker_restarts
        made.pool = DecodePool(config.build.sent["decode"], workers, restarts, where)
    if kind is None:  # every sample crosses the pipe, pickled
        return made, io
    if made.cluster is not None:
        made.slabs = SlabPool(batch_size, 1, declared_layout(decode), kind)
    else:
        # Sized for the reads in flight now; the tuner moves it with them.
        pooled = pooled_slabs(io.start, batch_size, config.delivery.prefetch)
        # No pages given back where the trainer may page-lock the slabs for a device copy.
        give_back = config.delivery.target.type == "cpu"
        made.slabs = SlabPool(batch_size, pooled, declared_layout(decode), kind, give_back)
        made.inputs = SlabPool(batch_size, pooled_arenas(io.start, batch_size), None, kind, give_back)
    return made, io


def _assemble(
    config: LoaderConfig,
    dataset: FileDataset,
    counters: Counters,
    trainer_pid: int | None,
    cache: SampleCache | None,
    storage_backend: StorageBackend,
) -> Pipeline:
    made, io = _decoders(config, counters)
    reader = _reader(config, counters, io, storage_backend, loop_free=made.cluster is None)
    if cache is not None:
        cache.remote = reader.remote
    collate_pool = ThreadPoolExecutor(1, thread_name_prefix="aioloader-collate")
    # The decode stage, chosen here once: the engine never asks which it is.
    parts = (config.sampling, config.reading, config.decoding, config.failures)
    stage = decode_stage(
        parts,
        config.build.workers,
        io.start,
        dataset,
        counters,
        made.pool,
        made.cluster,
        collate_pool,
        (made.slabs, made.inputs),
    )
    engine = Engine(
        config.sampling,
        config.delivery,
        config.failures,
        config.decoding.decode,
        config.tuning(),
        dataset,
        reader,
        stage,
        made.slabs,
        collate_pool,
        counters,
        trainer_pid,
        inputs=made.inputs,
        cache=cache,
    )
    if made.slabs is not None and made.cluster is not None:
        batch_size = config.sampling.batch_size
        made.slabs.set_pooled(pooled_slabs(engine.window * batch_size, batch_size, config.delivery.prefetch))
    if reader.groups.workers is not None:  # last: nothing after it can fail and leave them running
        reader.groups.workers.start()
    return Pipeline(engine, reader, made.pool, made.slabs, collate_pool, made.cluster, made.inputs, cache)


def _reader(
    config: LoaderConfig, counters: Counters, io: IoLimits, storage_backend: StorageBackend, loop_free: bool
) -> FileReader:
    """The reader, with the reader processes ``decode=None`` may use (not started yet)."""
    reading, decode = config.reading, config.decoding.decode
    n = read_workers(
        config.build.workers,
        config.build.cpus_per_rank,  # this rank's part of the node's CPUs
        decoding=decode is not None,
        own_read=reading.read is None,
        timeout=config.failures.sample_timeout,
    )
    return FileReader(
        io.start,
        reading.read,
        reading.read_retries,
        on_retry=lambda path, exc: counters.retried(),
        storage_options=reading.storage_options,
        storage_backend=storage_backend,
        meter=counters.meters["read"],
        max_io=io.most,
        # Fast groups may read on the loop unless Ray tasks wait on it: a local decode pool
        # holds a chunk queued for each worker, so a group (4 ms at most) leaves none idle,
        # and a read thread's GIL hand-offs with the loop cost more than the read (the loader
        # process's CPU per image, RESULTS §24).
        loop_free=loop_free,
        workers=ReadWorkers(n) if n else None,
    )


def io_limits(config: LoaderConfig, counters: Counters, kind: str | None) -> IoLimits:
    """The reads in flight to start with, lowered to what the open-file limit leaves (a
    WARNING when it is), and the most ``"auto"`` may reach."""
    # memfd slabs hold a descriptor each: they share the open-file limit with the reads.
    batch_size, prefetch, workers = config.sampling.batch_size, config.delivery.prefetch, config.build.workers
    fds = (batch_size, prefetch, FDS_PER_SLAB) if kind == MEMFD else (0, 0, 0)
    start = most = config.reading.io_start
    if config.reading.io_auto:
        most = io_concurrency_for_fd_limit(MAX_AUTO_IO, workers, *fds)
        start = min(start, most)
        counters.set_io_concurrency(start)
    io = io_concurrency_for_fd_limit(start, workers, *fds)
    if io < start:
        logger.warning(
            "io_concurrency=%d lowered to %d: the open-file limit (ulimit -n) is %d; raise it "
            "with `ulimit -n` for more reads in flight",
            start,
            io,
            _fd_soft_limit(),
        )
        start = io
        counters.set_io_concurrency(io)
    return IoLimits(start, most)


def _sample_cache(config: LoaderConfig, counters: Counters) -> SampleCache | None:
    """The loader's sample cache, its bound settled now (the memory or the disk there is);
    a :class:`LoaderError` naming the folder of a disk cache that cannot be used."""
    if config.cache is None:
        return None
    timeout = config.failures.sample_timeout

    def publish(stats: CacheStats) -> None:
        counters.cache = stats

    try:
        bound = resolved_bound(config.cache, available_memory())
        return SampleCache(config.cache, bound, timeout, publish)
    except OSError as exc:
        raise LoaderError(f"cache directory {str(config.cache.folder)!r} cannot be used: {exc}") from None
