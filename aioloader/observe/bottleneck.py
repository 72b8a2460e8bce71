"""Which stage limits throughput, and what to change: ``loader.stats.bottleneck``. Pure: it
reads :class:`~aioloader.observe.stages.StageStats` over a span of time and the trainer's share of
that time spent waiting, and returns a :class:`Bottleneck`.

The rule, in order:

1. The trainer waited for data less than :data:`WAIT_SHARE` of the time: the loader keeps
   up, the stage is ``"trainer"``.
2. Otherwise the loader stage that ran closest to its capacity
   (:func:`~aioloader.observe.stages.utilization`: reads in flight over ``io_concurrency``, decodes
   in flight over the workers, the busy share of the collate and the transfer thread).
   A stage upstream of the slow one starves, one downstream waits on its input, so the
   slow stage is the busiest relative to what it can do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aioloader.observe.stages import STAGES, StageStats, utilization

__all__ = ["WAIT_SHARE", "Bottleneck", "counted", "diagnose"]

#: The trainer's share of time waiting above which the loader is the limit (and a warning says so).
WAIT_SHARE = 0.10


def counted(n: int, one: str, many: str) -> str:
    """``n`` and the noun for that many: ``1 worker``, ``2 workers``."""
    return f"{n} {one if n == 1 else many}"


@dataclass(frozen=True)
class Bottleneck:
    """``stage`` is exactly one of ``"read"``, ``"decode"``, ``"collate"``, ``"transfer"``,
    ``"trainer"``; ``advice`` is one sentence: what was seen and what to change."""

    stage: str
    advice: str

    def __str__(self) -> str:
        return f"{self.stage}: {self.advice}"


def diagnose(
    stages: Mapping[str, StageStats],
    wait_share: float,
    *,
    num_workers: int,
    io_concurrency: int,
    remote: bool = False,
    cluster_busy: float | None = None,
) -> Bottleneck:
    """The bottleneck over the span ``stages`` cover, where the trainer waited
    ``wait_share`` (0..1) of the time (see the module docstring). ``cluster_busy``:
    with ``decode_on="ray"``, the share of the cluster's task slots' time spent decoding
    (:attr:`~aioloader.observe.stats.ClusterStats.busy_share`)."""
    if wait_share < WAIT_SHARE:
        return Bottleneck(
            "trainer",
            f"the trainer waited for data {wait_share:.0%} of the time: the loader keeps up, "
            "so a faster train step (or a larger batch) is what raises throughput",
        )
    present = [stages[name] for name in STAGES if name in stages and stages[name].elapsed_seconds > 0]
    if not present:
        return Bottleneck("read", "nothing measured yet")
    slow = max(present, key=utilization)
    if slow.name == "decode" and cluster_busy is not None:
        return Bottleneck("decode", _cluster_advice(slow, wait_share, num_workers, cluster_busy))
    return Bottleneck(slow.name, _advice(slow, wait_share, num_workers, io_concurrency, remote))


def _cluster_advice(stage: StageStats, wait_share: float, tasks: int, busy: float) -> str:
    held = (
        f"{stage.mean_in_flight:.1f} of {counted(stage.bound, 'Ray task', 'Ray tasks')} in flight for "
        f"{tasks} decoding at once{_latency(stage)} per sample; trainer waited {wait_share:.0%}"
    )
    if busy >= 0.7:
        return (
            f"{held}; the cluster's task slots were busy decoding {busy:.0%} of the time — add CPUs "
            "to the Ray cluster (and num_workers up to them), or make decode cheaper"
        )
    return (
        f"{held}; the cluster's task slots were busy decoding only {busy:.0%} of the time: the "
        "transfer from the cluster is the limit — a larger batch_size (more samples per task), a "
        "faster network, or URLs that the cluster reads itself"
    )


def _latency(stage: StageStats) -> str:
    if stage.p50_ms is None or stage.p99_ms is None:
        return ""
    return f", p50 {stage.p50_ms:.1f} ms, p99 {stage.p99_ms:.1f} ms"


def _advice(stage: StageStats, wait_share: float, workers: int, io: int, remote: bool) -> str:
    waited = f"trainer waited {wait_share:.0%}"
    if stage.name == "read":
        held = f"{stage.mean_in_flight:.0f} of {counted(io, 'read', 'reads')} in flight{_latency(stage)}"
        if utilization(stage) >= 0.8:
            more = " or give storage_options for a faster endpoint" if remote else ""
            return f"{held}; {waited} — raise io_concurrency{more}"
        return (
            f"{held}; {waited} — storage answers slowly; check the disk or network, or raise io_concurrency"
        )
    if stage.name == "decode":
        return (
            f"{stage.mean_in_flight:.1f} decode chunks in flight for {counted(workers, 'worker', 'workers')}"
            f"{_latency(stage)} "
            f"per sample; {waited} — raise num_workers if CPUs are free, or make decode cheaper "
            "(a smaller output, fewer augmentations, or work moved to the GPU)"
        )
    if stage.name == "collate":
        return (
            f"the collate thread was busy {stage.busy_share:.0%}{_latency(stage)} per batch; {waited} — "
            "move work from collate into decode, which runs in every worker"
        )
    return (
        f"the transfer thread was busy {stage.busy_share:.0%}{_latency(stage)} per batch; {waited} — "
        "copy fewer bytes (uint8 rather than float32) or use pinned memory (pin_memory=True)"
    )
