"""Where the samples were decoded, as ``loader.stats`` reports it: on a Ray cluster's tasks
(:class:`ClusterStats`) or, with ``ImageDecoder(device=...)``, on the device and the CPU
workers (:class:`DeviceDecodeStats`, with the pure functions that count it: the loader's
stage and the bridge each add their side)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "BRIDGE_FALLBACK",
    "UNDECODABLE",
    "ClusterStats",
    "DeviceDecodeStats",
    "DeviceSide",
    "add_bridge_side",
    "add_loader_side",
    "with_loader_side",
]

#: The reason counted for a sample the device failed to decode (decoded on the CPU instead).
BRIDGE_FALLBACK = "device decode failed"
#: The reason counted for a sample neither the device nor Pillow decoded (skipped).
UNDECODABLE = "undecodable, skipped"


@dataclass(frozen=True, slots=True)
class DeviceSide:
    """The device decode's loader side, over the loader's life (a loader process sends it
    to the trainer in :class:`~aioloader.observe.stats.LoaderSide`): ``cpu``, samples the
    CPU workers decoded; ``fallbacks``, the samples sent to them by reason (not a JPEG the
    GPU takes, ...); the workers' ``share`` of each batch now (0..1) and ``share_reason``."""

    cpu: int
    fallbacks: dict[str, int]
    share: float
    share_reason: str

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeviceSide, (self.cpu, self.fallbacks, self.share, self.share_reason))


@dataclass(frozen=True)
class DeviceDecodeStats:
    """``ImageDecoder(device=...)``: where the samples were decoded, over the loader's life.

    ``gpu``: samples decoded on the device; ``cpu``: by the CPU workers (their hybrid share,
    and the samples the device cannot take); ``fallbacks``: the samples the device could not
    decode, by reason (``"not a JPEG"``, ``"JPEG with 4 components"``, ``"device decode
    failed"``, ...); ``share``: the CPU workers' share of each batch now (0..1), steered by
    their utilization and the trainer's wait for batches (:mod:`aioloader.decode.hybrid`);
    ``share_reason``: the latest steering decision, what was seen and what was done (e.g.
    ``"trainer waited 31%, workers busy 99%: the GPU takes more, share 40%"``; empty before
    the first); ``gpu_seconds``: the bridging thread's time in the device decode."""

    gpu: int = 0
    cpu: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    share: float = 0.0
    gpu_seconds: float = 0.0
    share_reason: str = ""

    def loader_side(self) -> DeviceSide:
        """What the loader's stage counted, for :func:`with_loader_side` in another process."""
        return DeviceSide(self.cpu, dict(self.fallbacks), self.share, self.share_reason)

    @property
    def cpu_fraction(self) -> float:
        """The share of all samples the CPU decoded (0..1)."""
        total = self.gpu + self.cpu
        return self.cpu / total if total else 0.0


@dataclass(frozen=True)
class ClusterStats:
    """The decode tasks of ``decode_on="ray"`` over the loader's life (seconds, summed over
    tasks unless said). A task's round trip runs from its slot's grant to its answer; of
    it, the task spent ``decode_seconds`` decoding and ``read_seconds`` reading URLs on the
    cluster; the rest, :attr:`transfer_seconds`, is waiting for a CPU, Ray's scheduling and
    moving the bytes both ways. ``slots`` tasks decode at once; ``elapsed_seconds`` runs
    from the first task's start to the last answer (wall time)."""

    tasks: int = 0
    samples: int = 0
    round_trip_seconds: float = 0.0
    decode_seconds: float = 0.0
    read_seconds: float = 0.0
    slots: int = 1
    elapsed_seconds: float = 0.0

    @property
    def transfer_seconds(self) -> float:
        return max(0.0, self.round_trip_seconds - self.decode_seconds - self.read_seconds)

    @property
    def busy_share(self) -> float:
        """Share of the cluster's task slots' time spent decoding and reading (0..1): near 1,
        the cluster's CPUs are the limit; well below, the transfer or the loader is."""
        span = self.elapsed_seconds * self.slots
        return min(1.0, (self.decode_seconds + self.read_seconds) / span) if span > 0 else 0.0

    def add_task(
        self, slots: int, samples: int, round_trip: float, decode: float, read: float, elapsed: float
    ) -> ClusterStats:
        """These counts with one more task's (see :meth:`Counters.cluster_task
        <aioloader.observe.stats.Counters.cluster_task>`); ``elapsed``: the new wall time."""
        return ClusterStats(
            self.tasks + 1,
            self.samples + samples,
            self.round_trip_seconds + round_trip,
            self.decode_seconds + decode,
            self.read_seconds + read,
            slots,
            elapsed,
        )

    def __str__(self) -> str:
        per = 1e3 / self.samples if self.samples else 0.0
        return (
            f"ray: {self.tasks} tasks, {self.samples} samples, {self.slots} at once busy "
            f"{self.busy_share:.0%}; per sample {self.decode_seconds * per:.2f} ms decode, "
            f"{self.read_seconds * per:.2f} ms reading URLs, {self.transfer_seconds * per:.2f} ms "
            "waiting and in transfer"
        )


def add_loader_side(
    mine: DeviceDecodeStats | None, cpu: int, reasons: dict[str, int], share: float, why: str
) -> DeviceDecodeStats:
    """``mine`` with ``cpu`` more samples decoded by the workers, ``reasons`` more
    fallbacks, and the workers' ``share`` now and ``why`` (the loader's stage, in its own
    process)."""
    mine = mine or DeviceDecodeStats()
    merged = Counter({k: v for k, v in mine.fallbacks.items() if k not in _BRIDGE})
    merged.update(reasons)
    return with_loader_side(mine, DeviceSide(mine.cpu + cpu, dict(merged), share, why))


def with_loader_side(mine: DeviceDecodeStats | None, side: DeviceSide) -> DeviceDecodeStats:
    """``mine`` with its loader side replaced by ``side`` (a loader process's totals); the
    bridge's counts stay."""
    mine = mine or DeviceDecodeStats()
    bridge = {k: v for k, v in mine.fallbacks.items() if k in _BRIDGE}
    fallbacks = {**side.fallbacks, **bridge}
    return replace(mine, cpu=side.cpu, fallbacks=fallbacks, share=side.share, share_reason=side.share_reason)


def add_bridge_side(
    mine: DeviceDecodeStats | None, gpu: int, seconds: float, failed: int, undecodable: int
) -> DeviceDecodeStats:
    """``mine`` with the bridge's counts of one batch added (see
    :meth:`~aioloader.observe.stats.Counters.device_decoded`)."""
    mine = mine or DeviceDecodeStats()
    fallbacks = dict(mine.fallbacks)
    for reason, n in ((BRIDGE_FALLBACK, failed), (UNDECODABLE, undecodable)):
        if n:
            fallbacks[reason] = fallbacks.get(reason, 0) + n
    return replace(mine, gpu=mine.gpu + gpu, gpu_seconds=mine.gpu_seconds + seconds, fallbacks=fallbacks)


_BRIDGE = (BRIDGE_FALLBACK, UNDECODABLE)
