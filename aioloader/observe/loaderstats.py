"""``loader.stats``: :class:`LoaderStats`, the immutable snapshot of a loader's counters
(:class:`~aioloader.observe.stats.Counters` makes it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aioloader.observe.bottleneck import Bottleneck
from aioloader.observe.cachestats import CacheStats
from aioloader.observe.stages import StageStats
from aioloader.observe.wheredecoded import ClusterStats, DeviceDecodeStats

__all__ = ["LoaderStats"]


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of the loader's counters.

    Totals are cumulative over the loader's life; ``epoch_*`` fields cover the current (or
    last) iteration. Times are seconds; ``wait_seconds`` is the time the consumer spent
    blocked waiting for a batch (the trainer's data stall).
    """

    samples: int = 0
    batches: int = 0
    attempted: int = 0
    bytes_read: int = 0
    failures: int = 0
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    last_failed_paths: tuple[str, ...] = ()
    read_retries: int = 0
    worker_restarts: int = 0
    wait_seconds: float = 0.0
    epoch: int = 0
    epoch_samples: int = 0
    epoch_batches: int = 0
    epoch_wait_seconds: float = 0.0
    epoch_seconds: float = 0.0
    first_batch_seconds: float | None = None
    #: ``{"read"|"decode"|"collate"|"transfer"|"loop": StageStats}`` over the loader's life.
    stages: dict[str, StageStats] = field(default_factory=dict)
    #: The stage limiting throughput over the last :data:`WINDOW` batches of this epoch (or
    #: since it began); None before its second batch.
    bottleneck: Bottleneck | None = None
    #: The trainer's share of that time spent waiting for a batch (0..1).
    recent_wait_share: float | None = None
    #: Reads in flight at most, now (``io_concurrency="auto"`` moves it while loading).
    io_concurrency: int = 0
    #: Decode processes decoding at once, now (``num_workers="auto"`` moves it); with
    #: ``decode_on="ray"``, Ray tasks decoding at once.
    num_workers: int = 0
    #: The processes on this node that share its CPUs: ``LOCAL_WORLD_SIZE`` under ``torchrun``,
    #: the local size MPI's ``mpirun`` sets, the step's tasks on the node under ``srun``; 1
    #: without a launcher.
    ranks_on_node: int = 1
    #: This rank's part of the node's usable CPUs (affinity and cgroup quota,
    #: :func:`~aioloader.config.usable_cpus`): divided by ``ranks_on_node``, rounded down, at
    #: least 1 (under ``srun``: ``SLURM_CPUS_PER_TASK`` where the job set it). The default
    #: ``num_workers``, the CPUs ``"auto"`` shares with the trainer, the reader processes' bound.
    cpus_per_rank: int = 0
    #: ``decode_on="ray"``: the cluster's tasks (None otherwise).
    cluster: ClusterStats | None = None
    #: ``ImageDecoder(device=...)``: where the samples were decoded (None otherwise).
    device_decode: DeviceDecodeStats | None = None
    #: ``Loader(cache=...)``: hits, misses, what the cache holds (None without one).
    cache: CacheStats | None = None
