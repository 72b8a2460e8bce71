"""The bottleneck's sentences (:mod:`aioloader.observe.bottleneck`): what was seen in the
named stage, and a change that applies to this loader's :class:`Setup` (no pinned-memory
advice without a CUDA copy, none to move work to a GPU the loader does not use). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aioloader.observe.stages import StageStats, utilization

__all__ = ["Setup", "cluster_advice", "counted", "idle_advice", "stage_advice"]

#: Reads in flight over ``io_concurrency`` from which more read slots are the advice.
FULL = 0.8
#: Milliseconds per read (p50) below which a file came from the page cache or a fast disk:
#: reads that keep the stage busy then are many, not slow.
FAST_READ_MS = 1.0


@dataclass(frozen=True)
class Setup:
    """What runs in a loader, so the verdict judges only that and advises for it.

    ``decode``: a decode stage runs (``decode`` is not None); ``device``: the type of the
    loader's device (``"cpu"``, ``"cuda"``); ``pin_memory``: as settled (only ever True for
    CUDA); ``bridge_decodes``: ``ImageDecoder(device=...)`` decodes on the bridging thread;
    ``remote``: the dataset is read from URLs."""

    decode: bool = True
    device: str = "cpu"
    pin_memory: bool = False
    bridge_decodes: bool = False
    remote: bool = False

    @property
    def transfer(self) -> bool:
        """The bridge does per-batch work: a CUDA copy, or a device decode. Without either
        its copy is a no-op, and its stage is not judged."""
        return self.device == "cuda" or self.bridge_decodes


def counted(n: int, one: str, many: str) -> str:
    """``n`` and the noun for that many: ``1 worker``, ``2 workers``."""
    return f"{n} {one if n == 1 else many}"


def _latency(stage: StageStats) -> str:
    if stage.p50_ms is None or stage.p99_ms is None:
        return ""
    return f", p50 {stage.p50_ms:.1f} ms, p99 {stage.p99_ms:.1f} ms"


def _reads(stage: StageStats, io: int) -> str:
    return f"{stage.mean_in_flight:.1f} of {counted(io, 'read', 'reads')} in flight{_latency(stage)}"


def stage_advice(stage: StageStats, wait_share: float, workers: int, io: int, setup: Setup) -> str:
    """The sentence for ``stage``, named the bottleneck by rule 2 or 3."""
    waited = f"trainer waited {wait_share:.0%}"
    if stage.name == "read":
        if utilization(stage) >= FULL:
            more = " or give storage_options for a faster endpoint" if setup.remote else ""
            held = f"{stage.mean_in_flight:.0f} of {counted(io, 'read', 'reads')} in flight{_latency(stage)}"
            return f"{held}; {waited} — raise io_concurrency{more}"
        seen = f"{_reads(stage, io)}, reads in flight {stage.busy_share:.0%} of the time; {waited} — "
        if stage.p50_ms is not None and stage.p50_ms < FAST_READ_MS:
            # Each file answers at once, yet reading never stops: the files' number is the
            # limit (a round of system calls and hand-offs each), not the storage.
            return seen + (
                "each file reads fast, but the files are small and many: fewer, larger files (small "
                "ones packed into tar shards, FileDataset.from_tars) or a larger batch_size"
            )
        # A read's time includes its wait for a thread (and the GIL): slow storage and many
        # small files read by the loader's threads look alike here, so both are named.
        return seen + (
            "storage answers slowly, or the threads reading many small local files do: check the "
            "disk or the network, or use fewer, larger files; more reads in flight (io_concurrency, "
            "prefetch) hide storage latency"
        )
    if stage.name == "decode":
        cheaper = "a smaller output or fewer augmentations"
        if setup.device == "cuda":
            cheaper += ", or work moved to the GPU"
        return (
            f"{stage.mean_in_flight:.1f} decode chunks in flight for {counted(workers, 'worker', 'workers')}"
            f"{_latency(stage)} per sample; {waited} — raise num_workers if CPUs are free, or make "
            f"decode cheaper ({cheaper})"
        )
    if stage.name == "collate":
        return (
            f"the collate thread was busy {stage.busy_share:.0%}{_latency(stage)} per batch; {waited} — "
            "move work from collate into decode, which runs in every worker"
        )
    if stage.name == "loop":
        return (
            f"the event loop's thread ran on a CPU {stage.busy_share:.0%} of the time; {waited} — its "
            "work per file and per batch is the limit: fewer, larger files (small ones packed into tar "
            "shards, FileDataset.from_tars) or a larger batch_size"
        )
    return _transfer_advice(stage, waited, setup)


def _transfer_advice(stage: StageStats, waited: str, setup: Setup) -> str:
    seen = f"the transfer thread was busy {stage.busy_share:.0%}{_latency(stage)} per batch; {waited} — "
    if setup.bridge_decodes:
        return seen + "it also decodes on the device: decode on the CPU workers (no ImageDecoder device=)"
    pin = "" if setup.pin_memory else ", or pin_memory=True"
    return seen + f"copy fewer bytes (uint8 rather than float32){pin}"


def idle_advice(present: Sequence[StageStats], wait_share: float, workers: int, io: int) -> str:
    """Rule 3's sentence when no stage was busy: each stage's figure, honestly small."""
    seen = []
    for s in present:
        if s.name == "read":
            seen.append(f"reads {_reads(s, io)} ({s.busy_share:.0%} of the time)")
        elif s.name == "decode":
            seen.append(
                f"{s.mean_in_flight:.1f} decode chunks in flight for {counted(workers, 'worker', 'workers')}"
            )
        elif s.name == "loop":
            seen.append(f"the event loop on a CPU {s.busy_share:.0%} of the time")
        else:
            seen.append(f"the {s.name} thread busy {s.busy_share:.0%}")
    return (
        f"no stage ran near its capacity ({'; '.join(seen)}); trainer waited {wait_share:.0%} — the "
        "time goes between the stages (the loop's hand-offs, the way to the trainer): a larger "
        "prefetch or batch_size overlaps more of it, and aioloader bench --trace shows where it goes"
    )


def cluster_advice(stage: StageStats, wait_share: float, tasks: int, busy: float) -> str:
    """The decode stage's sentence with ``decode_on="ray"``: ``busy``, the cluster's task
    slots' share of time spent decoding, says CPUs or transfer."""
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
