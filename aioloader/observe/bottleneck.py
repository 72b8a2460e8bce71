"""Which stage limits throughput, and what to change: ``loader.stats.bottleneck``. Pure: it
reads :class:`~aioloader.observe.stages.StageStats` over a span of time, the trainer's share
of that time spent waiting and the loader's :class:`Setup`, and returns a :class:`Bottleneck`.

Only the stages that run are judged (:func:`judged`): no ``"decode"`` with ``decode=None``,
no ``"transfer"`` without a device copy (on the CPU the bridge's copy is a no-op), no
``"loop"`` where the loop's CPU time could not be measured. The rule, in order:

1. The trainer waited for data less than :data:`WAIT_SHARE` of the time: the loader keeps
   up, the stage is ``"trainer"``.
2. The judged stage that ran closest to its capacity
   (:func:`~aioloader.observe.stages.utilization`: reads in flight over ``io_concurrency``,
   decodes in flight over the workers, the busy share of the collate and the transfer
   thread, the loop thread's CPU share), if that is at least :data:`NEAR` of it. A stage
   upstream of the slow one starves, one downstream waits on its input, so the slow stage
   is the busiest relative to what it can do.
3. No stage near its capacity: nothing is named busy that was not. Reads in flight most of
   the time (``busy_share`` of at least :data:`NEAR`) with free slots: the pipeline waited
   on storage, ``"read"``. Otherwise the time went between the stages, on the loop that
   hands items from one to the next: ``"loop"`` (``"read"`` where the loop is not measured),
   its advice saying that no stage was busy and what each did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aioloader.observe.advice import Setup, cluster_advice, counted, idle_advice, stage_advice
from aioloader.observe.loopmeter import LOOP
from aioloader.observe.stages import STAGES, StageStats, utilization

__all__ = ["NEAR", "VERDICTS", "WAIT_SHARE", "Bottleneck", "Setup", "counted", "diagnose", "judged"]

#: The trainer's share of time waiting above which the loader is the limit (and a warning says so).
WAIT_SHARE = 0.10
#: The share of its capacity from which a stage counts as running near it (rule 2); below it
#: on every stage, the verdict says nothing was busy (rule 3). A loop short of the GIL shows
#: less CPU time than it takes, so the bar is well under 1.
NEAR = 0.6
#: Every ``Bottleneck.stage``, in pipeline order.
VERDICTS = (*STAGES, LOOP, "trainer")


@dataclass(frozen=True)
class Bottleneck:
    """``stage`` is exactly one of :data:`VERDICTS`: ``"read"``, ``"decode"``, ``"collate"``,
    ``"transfer"``, ``"loop"`` (the loader's event loop, or the time between the stages when
    no stage was busy), ``"trainer"``; ``advice`` is one sentence: what was seen and what to
    change."""

    stage: str
    advice: str

    def __str__(self) -> str:
        return f"{self.stage}: {self.advice}"


def judged(stages: Mapping[str, StageStats], setup: Setup) -> list[StageStats]:
    """The stages of ``stages`` that ran in a loader of ``setup`` and were measured, in
    pipeline order, the loop last."""
    runs = {"read": True, "decode": setup.decode, "collate": True, "transfer": setup.transfer, LOOP: True}
    return [
        stages[name]
        for name in (*STAGES, LOOP)
        if runs[name] and name in stages and stages[name].elapsed_seconds > 0
    ]


def diagnose(
    stages: Mapping[str, StageStats],
    wait_share: float,
    *,
    num_workers: int,
    io_concurrency: int,
    setup: Setup | None = None,
    cluster_busy: float | None = None,
) -> Bottleneck:
    """The bottleneck over the span ``stages`` cover, where the trainer waited
    ``wait_share`` (0..1) of the time (see the module docstring); ``setup``: what runs (None:
    a loader on the CPU with a decode). ``cluster_busy``: with ``decode_on="ray"``, the share
    of the cluster's task slots' time spent decoding
    (:attr:`~aioloader.observe.stats.ClusterStats.busy_share`)."""
    setup = setup if setup is not None else Setup()
    if wait_share < WAIT_SHARE:
        return Bottleneck(
            "trainer",
            f"the trainer waited for data {wait_share:.0%} of the time: the loader keeps up, "
            "so a faster train step (or a larger batch) is what raises throughput",
        )
    present = judged(stages, setup)
    if not present:
        return Bottleneck("read", "nothing measured yet")
    slow = max(present, key=utilization)
    if utilization(slow) >= NEAR:
        if slow.name == "decode" and cluster_busy is not None:
            return Bottleneck("decode", cluster_advice(slow, wait_share, num_workers, cluster_busy))
        return Bottleneck(slow.name, stage_advice(slow, wait_share, num_workers, io_concurrency, setup))
    by_name = {s.name: s for s in present}
    read = by_name.get("read")
    if read is not None and read.busy_share >= NEAR:  # waiting on storage, with slots free
        return Bottleneck("read", stage_advice(read, wait_share, num_workers, io_concurrency, setup))
    return Bottleneck(
        LOOP if LOOP in by_name else "read", idle_advice(present, wait_share, num_workers, io_concurrency)
    )
