"""Which decode stage a loader has, chosen once, where the loader is built
(:func:`aioloader.run.pipeline.build`): Ray tasks with ``decode_on="ray"``, this machine's
worker processes otherwise (with ``ImageDecoder(device=...)``, behind the device decode's
stage, which sends the JPEGs the device takes to the bridge), none with ``decode=None``.
The engine receives it as a :class:`~aioloader.decode.contract.DecodeStageLike` and never
asks which it is.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

from aioloader.cluster.session import RaySession
from aioloader.cluster.stage import RayDecodeStage, cluster_chunk
from aioloader.dataset import FileDataset
from aioloader.decode.contract import DecodeStageLike, declares_hot_start
from aioloader.decode.ondevice import decodes_on_device
from aioloader.decode.ondevice.loaderside import DeviceDecodeStage
from aioloader.decode.pool import DecodePool
from aioloader.decode.settings import Decoding
from aioloader.decode.stage import DecodeStage
from aioloader.engine import sizing
from aioloader.engine.settings import Failures
from aioloader.memory.slabs import SlabPool
from aioloader.observe.stats import Counters
from aioloader.plan.settings import Sampling
from aioloader.read.settings import Reading

__all__ = ["closed_slabs", "decode_stage"]


def decode_stage(
    parts: tuple[Sampling, Reading, Decoding, Failures],
    workers: int,
    io_concurrency: int,
    dataset: FileDataset,
    counters: Counters,
    pool: DecodePool | None,
    cluster: RaySession | None,
    local: Executor,
    slabs: tuple[SlabPool | None, ...] = (),
) -> DecodeStageLike | None:
    """The decode stage for a loader of these ``parts``, ``workers`` processes and
    ``io_concurrency`` reads in flight: on ``cluster``'s Ray tasks when there is one, else on
    ``pool``'s workers, else None (``decode=None``: the samples are the files' bytes).

    ``local``: the thread a decoder that declares ``hot_start`` may also run on while the
    workers boot; ``slabs``: the pools of the slabs and arenas the workers map (they are
    told which were closed lately, :func:`closed_slabs`)."""
    sampling, _, decoding, failures = parts
    if cluster is not None:
        return _ray_stage(parts, io_concurrency, dataset, counters, cluster)
    if pool is None:
        return None
    decode = decoding.decode
    assert decode is not None
    stage = DecodeStage(
        decode,
        pool,
        # One round trip to a worker is amortised over a chunk, and a batch still spreads
        # over every worker (a chunk each).
        chunk=sizing.chunk_size(sampling.batch_size, workers),
        seed=sampling.seed,
        sample_timeout=failures.sample_timeout,
        path_of=dataset.path,
        hot=declares_hot_start(decode),
        local=local,
        on_restart=counters.set_worker_restarts,
        meter=counters.meters["decode"],
        forget=closed_slabs(*slabs),
    )
    if decodes_on_device(decode):
        # ImageDecoder(device=...): the JPEGs the device takes travel encoded to the bridge.
        return DeviceDecodeStage(
            stage,
            decode,
            seed=sampling.seed,
            path_of=dataset.path,
            meter=counters.meters["decode"],
            report=counters.device_loader_side,
            # What the trainer waited for batches steers the workers' share: fed by the
            # trainer's cursor, or in a loader process by the trainer's back-pipe lines.
            wait=counters.trainer_wait,
        )
    return stage


def _ray_stage(
    parts: tuple[Sampling, Reading, Decoding, Failures],
    io_concurrency: int,
    dataset: FileDataset,
    counters: Counters,
    cluster: RaySession,
) -> RayDecodeStage:
    sampling, reading, _, failures = parts
    return RayDecodeStage(
        cluster,
        chunk=cluster_chunk(sampling.batch_size, cluster.tasks),
        # The tasks read the dataset's URLs themselves (not a custom read, nor byte
        # ranges of a file); local files cross as bytes, not through a slab's arena.
        reads_urls=reading.read is None and not dataset.has_spans,
        seed=sampling.seed,
        sample_timeout=failures.sample_timeout,
        read_retries=reading.read_retries,
        storage_options=reading.storage_options,
        io_concurrency=io_concurrency,
        path_of=dataset.path,
        counters=counters,
    )


def closed_slabs(*pools: SlabPool | None) -> Callable[[], tuple[str, ...]]:
    """What a decode stage's ``forget()`` says: the slabs and arenas of ``pools`` closed
    lately, that the workers still map (see ``Chunk.forget``)."""

    def forget() -> tuple[str, ...]:
        return tuple(name for pool in pools if pool is not None for name in pool.recently_closed())

    return forget
