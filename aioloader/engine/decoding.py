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
from aioloader.config import LoaderConfig
from aioloader.dataset import FileDataset
from aioloader.decode.contract import DecodeStageLike, declares_hot_start
from aioloader.decode.ondevice import decodes_on_device
from aioloader.decode.ondevice.loaderside import DeviceDecodeStage
from aioloader.decode.pool import DecodePool
from aioloader.decode.stage import DecodeStage
from aioloader.engine import sizing
from aioloader.memory.slabs import SlabPool
from aioloader.observe.stats import Counters

__all__ = ["closed_slabs", "decode_stage"]


def decode_stage(
    config: LoaderConfig,
    dataset: FileDataset,
    counters: Counters,
    pool: DecodePool | None,
    cluster: RaySession | None,
    local: Executor,
    slabs: tuple[SlabPool | None, ...] = (),
) -> DecodeStageLike | None:
    """The decode stage for ``config``: on ``cluster``'s Ray tasks when there is one, else on
    ``pool``'s workers, else None (``decode=None``: the samples are the files' bytes).

    ``local``: the thread a decoder that declares ``hot_start`` may also run on while the
    workers boot; ``slabs``: the pools of the slabs and arenas the workers map (they are
    told which were closed lately, :func:`closed_slabs`)."""
    if cluster is not None:
        return RayDecodeStage(
            cluster,
            chunk=cluster_chunk(config.batch_size, cluster.tasks),
            # The tasks read the dataset's URLs themselves (not a custom read, nor byte
            # ranges of a file); local files cross as bytes, not through a slab's arena.
            reads_urls=config.read is None and not dataset.has_spans,
            seed=config.seed,
            sample_timeout=config.sample_timeout,
            read_retries=config.read_retries,
            storage_options=config.storage_options,
            io_concurrency=config.io_concurrency,
            path_of=dataset.path,
            counters=counters,
        )
    if pool is None:
        return None
    assert config.decode is not None
    stage = DecodeStage(
        config.decode,
        pool,
        # One round trip to a worker is amortised over a chunk, and a batch still spreads
        # over every worker (two chunks each).
        chunk=sizing.chunk_size(config.batch_size, config.num_workers),
        seed=config.seed,
        sample_timeout=config.sample_timeout,
        path_of=dataset.path,
        hot=declares_hot_start(config.decode),
        local=local,
        on_restart=counters.set_worker_restarts,
        meter=counters.meters["decode"],
        forget=closed_slabs(*slabs),
    )
    if decodes_on_device(config.decode):
        # ImageDecoder(device=...): the JPEGs the device takes travel encoded to the bridge.
        return DeviceDecodeStage(
            stage,
            config.decode,
            seed=config.seed,
            path_of=dataset.path,
            meter=counters.meters["decode"],
            report=counters.device_loader_side,
            # What the trainer waited for batches steers the workers' share: fed by the
            # trainer's cursor, or in a loader process by the trainer's back-pipe lines.
            wait=counters.trainer_wait,
        )
    return stage


def closed_slabs(*pools: SlabPool | None) -> Callable[[], tuple[str, ...]]:
    """What a decode stage's ``forget()`` says: the slabs and arenas of ``pools`` closed
    lately, that the workers still map (see ``Chunk.forget``)."""

    def forget() -> tuple[str, ...]:
        return tuple(name for pool in pools if pool is not None for name in pool.recently_closed())

    return forget
