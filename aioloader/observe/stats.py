"""``loader.stats``: counters kept while loading, read as an immutable snapshot, with the
per-stage figures of :mod:`aioloader.observe.stages` and the verdict of
:mod:`aioloader.observe.bottleneck`."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

from aioloader.observe.bottleneck import WAIT_SHARE, Bottleneck, Setup, counted, diagnose
from aioloader.observe.cachestats import CacheStats
from aioloader.observe.loaderstats import LoaderStats
from aioloader.observe.loopmeter import LOOP, LoopMeter
from aioloader.observe.stages import STAGES, StageMeter, StageStats, between
from aioloader.observe.trainerwait import TrainerWait
from aioloader.observe.wheredecoded import (
    ClusterStats,
    DeviceDecodeStats,
    DeviceSide,
    add_bridge_side,
    add_loader_side,
    with_loader_side,
)

__all__ = ["WINDOW", "ClusterStats", "Counters", "DeviceDecodeStats", "LoaderSide", "LoaderStats"]


log = logging.getLogger("aioloader")

_Stages: TypeAlias = dict[str, StageStats]


@dataclass(frozen=True, slots=True)
class LoaderSide:
    """What a loader process counts for the trainer's counters, over the loader's life
    (:meth:`Counters.loader_side`; it crosses with each batch, :mod:`aioloader.run.messages`):
    ``bytes_read``, samples ``attempted``, ``failures`` by reason, the last
    ``failed_paths``, ``read_retries``, ``worker_restarts``, the loading ``stages``'
    figures by name, the device decode's loader side (None without it) and the sample
    cache's counts (None without a cache)."""

    bytes_read: int
    attempted: int
    failures: dict[str, int]
    failed_paths: tuple[str, ...]
    read_retries: int
    worker_restarts: int
    stages: _Stages
    device: DeviceSide | None
    cache: CacheStats | None

    # Pickled with every batch: a constructor call, not a __setstate__ (see decode/chunk.py).
    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.bytes_read, self.attempted, self.failures, self.failed_paths, self.read_retries)
        return (LoaderSide, (*fields, self.worker_restarts, self.stages, self.device, self.cache))


#: Batches the bottleneck and its warning look back over.
WINDOW = 50
#: Fewest batches the warning judges (an epoch's last ones, after its last full window).
MIN_JUDGED = 20


class Counters:
    """Mutable counters. Each field has one writer (the loop thread or the consumer), and a
    lock makes snapshots consistent.

    ``clock`` (``time.perf_counter`` unless passed in) times the epochs and the batches of
    the window, and is every meter's clock."""

    def __init__(
        self,
        io_concurrency: int = 1,
        num_workers: int = 1,
        setup: Setup | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._lock = threading.Lock()
        self.setup = setup if setup is not None else Setup()
        self.clock = clock
        #: This process's stage meters (a loader process has read, decode and collate; the
        #: trainer's the transfer, and the others' figures by :meth:`absorb`).
        self.meters = {
            "read": StageMeter("read", bound=io_concurrency, clock=clock),
            "decode": StageMeter("decode", bound=2 * num_workers, capacity=num_workers, clock=clock),
            "collate": StageMeter("collate", clock=clock),
            "transfer": StageMeter("transfer", clock=clock),
        }
        #: The event loop's CPU share, once the runtime whose loop runs in this process binds it.
        self.loop = LoopMeter(clock=clock)
        self._absorbed: dict[str, StageStats] = {}
        #: Per delivered batch of this epoch: (time, seconds waited, stage figures then).
        self._recent: deque[tuple[float, float, dict[str, StageStats]]] = deque(maxlen=WINDOW + 1)
        self._warned: set[tuple[int, str]] = set()
        self.samples = 0
        self.batches = 0
        self.attempted = 0  # samples whose read started, for a fractional max_failures
        self.bytes_read = 0
        #: Seconds waited, batches delivered: stats, and the device decode's steer (trainerwait.py).
        self.trainer_wait = TrainerWait()
        self.failures: Counter[str] = Counter()
        # A loader process's failures as last absorbed: added to this side's (the bridge's).
        self._absorbed_failures: Counter[str] = Counter()
        self.failed_paths: deque[str] = deque(maxlen=8)
        self.read_retries = 0
        self.worker_restarts = 0
        self.epoch = 0
        self.epoch_samples = 0
        self.epoch_batches = 0
        self.epoch_wait = 0.0
        self.epoch_start = clock()
        self.epoch_end: float | None = None
        self.first_batch: float | None = None
        #: Bumped by :meth:`restore`: a loader process must take the restored failures over.
        self.restores = 0
        self.cluster: ClusterStats | None = None
        self._cluster_since = 0.0
        #: The device decode's counts (None without one): the loader side's
        #: (:meth:`device_loader_side`) and the bridge's (:meth:`device_decoded`).
        self.device: DeviceDecodeStats | None = None
        #: The sample cache's counts, as its loop publishes them (None without one).
        self.cache: CacheStats | None = None
        #: How the node's CPUs were divided (the loader's settings: :meth:`for_loader`).
        self.ranks_on_node, self.cpus_per_rank = 1, 0

    @classmethod
    def for_loader(
        cls, io_concurrency: int, workers: int, setup: Setup, ranks_on_node: int, cpus_per_rank: int
    ) -> Counters:
        """The counters of a loader that starts with ``io_concurrency`` reads in flight and
        ``workers`` decode processes, runs ``setup`` (the verdict judges only that), and was
        given ``cpus_per_rank`` of the node's CPUs, shared by ``ranks_on_node`` processes."""
        counters = cls(io_concurrency, workers, setup)
        counters.ranks_on_node, counters.cpus_per_rank = ranks_on_node, cpus_per_rank
        return counters

    def begin_epoch(self, epoch: int) -> None:
        with self._lock:
            self.epoch = epoch
            self.epoch_samples = self.epoch_batches = 0
            self.epoch_wait = 0.0
            self.epoch_start = self.clock()
            self.epoch_end = None
            self.first_batch = None
            self._recent.clear()

    def end_epoch(self) -> None:
        with self._lock:
            self.epoch_end = self.clock()
            # The batches after the last judged window are judged at the epoch's end, when
            # there are enough of them to say more than how long the pipeline took to fill.
            unjudged = self.epoch_batches % WINDOW >= MIN_JUDGED
        if unjudged:
            self._warn_if_waiting()

    def set_io_concurrency(self, io: int) -> None:
        """Reads in flight as the pipeline runs them (the open-file limit may lower them)."""
        read = self.meters["read"]
        read.bound = read.capacity = io

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_read += n

    def delivered(self, samples: int, waited: float) -> None:
        now = self.clock()
        marks = self._stage_view(percentiles=False)
        with self._lock:
            if self.first_batch is None:
                self.first_batch = now - self.epoch_start
            self.samples += samples
            self.batches += 1
            self.epoch_samples += samples
            self.epoch_batches += 1
            self.trainer_wait.delivered(waited)
            self.epoch_wait += waited
            self._recent.append((now, waited, marks))
            check = self.epoch_batches % WINDOW == 0
        if check:
            self._warn_if_waiting()

    def _stage_view(self, percentiles: bool = True) -> dict[str, StageStats]:
        """Every stage's figures: this process's meters, or what a loader process sent."""
        view = {name: self.meters[name].snapshot(percentiles) for name in STAGES}
        view[LOOP] = self.loop.snapshot()
        with self._lock:
            view.update(self._absorbed)
        return view

    def _window(self, view: _Stages | None = None) -> tuple[float, _Stages, int] | None:
        """The trainer's wait share, the stages and the number of batches judged over the
        recent ones (see :data:`WINDOW`; the first batch of an epoch opens the window, its wait
        left out), or None before the second. ``view``: the stages now, if the caller has them."""
        with self._lock:
            if len(self._recent) < 2:
                return None
            (t0, _, before), (t1, _, after) = self._recent[0], self._recent[-1]
            judged = list(self._recent)[1:]
        waited = sum(w for _, w, _ in judged)
        # The stages over the same span as the waits (first to last batch of the window, not
        # up to now: stats read after an epoch or an evaluation would dilute them), with
        # the percentiles of now.
        now = view if view is not None else self._stage_view()
        stages = {
            name: replace(
                between(before[name], after[name]), p50_ms=now[name].p50_ms, p99_ms=now[name].p99_ms
            )
            for name in after
        }
        return (waited / (t1 - t0) if t1 > t0 else 0.0), stages, len(judged)

    def bottleneck(self, view: dict[str, StageStats] | None = None) -> tuple[Bottleneck, float] | None:
        """The verdict over the recent batches and the trainer's wait share in them."""
        found = self._judge(view)
        return None if found is None else found[:2]

    def _judge(self, view: _Stages | None = None) -> tuple[Bottleneck, float, int] | None:
        """:meth:`bottleneck`, and the number of batches it judged."""
        view = view if view is not None else self._stage_view()
        window = self._window(view)
        if window is None:
            return None
        share, stages, judged = window
        verdict = diagnose(
            stages,
            share,
            num_workers=view["decode"].capacity,  # as tuned now
            io_concurrency=view["read"].bound,
            setup=self.setup,
            cluster_busy=self.cluster.busy_share if self.cluster is not None else None,
        )
        return verdict, share, judged

    def _warn_if_waiting(self) -> None:
        """A WARNING, saying how many batches were judged (:meth:`_window`), when the trainer
        waited more than :data:`WAIT_SHARE` of their time; at most once per epoch and stage."""
        found = self._judge()
        if found is None or found[1] <= WAIT_SHARE:
            return
        verdict, share, judged = found
        key = (self.epoch, verdict.stage)
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning(
            "the trainer waited for data %.0f%% of the time over the last %s; bottleneck: %s",
            share * 100,
            counted(judged, "batch", "batches"),
            verdict,
        )

    def failed(self, reason: str, path: str) -> None:
        with self._lock:
            self.failures[reason] += 1
            self.failed_paths.append(path)

    def attempt(self, n: int) -> None:
        with self._lock:
            self.attempted += n

    def failure_counts(self) -> tuple[int, int]:
        """``(failures, samples attempted)`` over the loader's life."""
        with self._lock:
            return sum(self.failures.values()), self.attempted

    def failure_counts_by_reason(self) -> tuple[dict[str, int], int]:
        """``({reason: failures}, samples attempted)`` over the loader's life."""
        with self._lock:
            return dict(self.failures), self.attempted

    def set_worker_restarts(self, n: int) -> None:
        with self._lock:
            self.worker_restarts = n

    def cluster_task(self, slots: int, samples: int, round_trip: float, decode: float, read: float) -> None:
        """A Ray decode task of ``samples`` answered (``decode_on="ray"``; seconds), with
        ``slots`` tasks decoding at once."""
        now = self.clock()
        with self._lock:
            if self.cluster is None:
                self._cluster_since = now - round_trip
            c = self.cluster or ClusterStats()
            self.cluster = c.add_task(slots, samples, round_trip, decode, read, now - self._cluster_since)

    def retried(self) -> None:
        with self._lock:
            self.read_retries += 1

    def restore(self, samples: int, batches: int, failures: dict[str, int], attempted: int) -> None:
        """Carry totals over from a resumed run's state."""
        with self._lock:
            self.samples, self.batches, self.attempted = samples, batches, attempted
            self.failures, self._absorbed_failures = Counter(failures), Counter(failures)
            self.restores += 1

    def restore_failures(self, failures: dict[str, int], attempted: int) -> None:
        """In a loader process: the failures and attempts the trainer's counters hold."""
        with self._lock:
            self.failures, self.attempted = Counter(failures), attempted

    def loader_side(self) -> LoaderSide:
        """What the loading side counts (bytes, attempts, failures, retries, restarts), for
        :meth:`absorb` in the trainer's process (a loader process's counters)."""
        with self._lock:
            counts = (
                self.bytes_read,
                self.attempted,
                dict(self.failures),
                tuple(self.failed_paths),
                self.read_retries,
                self.worker_restarts,
            )
            device, cache = self.device, self.cache
        stages = {name: self.meters[name].snapshot() for name in ("read", "decode", "collate")}
        if self.loop.bound:  # this process runs the loop: its figure crosses with the others
            stages[LOOP] = self.loop.snapshot()
        side = None if device is None else device.loader_side()
        return LoaderSide(*counts, stages, side, cache)

    def absorb(self, counts: LoaderSide) -> None:
        """Take over what a loader process counted (:meth:`loader_side`), its new failures
        added to those counted on this side (the device decode's, on the bridge)."""
        theirs = Counter(counts.failures)
        with self._lock:
            self.cache = counts.cache
            self._absorbed = counts.stages
            self.bytes_read, self.attempted = counts.bytes_read, counts.attempted
            new = theirs.total() - self._absorbed_failures.total()
            self.failures = self.failures + theirs - self._absorbed_failures
            self._absorbed_failures = theirs
            self.failed_paths.extend(counts.failed_paths[-new:] if new > 0 else ())
            self.read_retries, self.worker_restarts = counts.read_retries, counts.worker_restarts
            if counts.device is not None:
                self.device = with_loader_side(self.device, counts.device)

    def device_loader_side(self, cpu: int, reasons: dict[str, int], share: float, why: str) -> None:
        """The device decode's stage (loader side): ``cpu`` more samples for the workers,
        ``reasons`` the counts of those the device could not take, the workers' ``share``, ``why``."""
        with self._lock:
            self.device = add_loader_side(self.device, cpu, reasons, share, why)

    def device_decoded(self, gpu: int, seconds: float, failed: int, undecodable: int = 0) -> None:
        """The bridge decoded ``gpu`` samples on the device in ``seconds``; ``failed`` more
        failed there and were decoded on the CPU, ``undecodable`` of them not even there
        (skipped)."""
        with self._lock:
            self.device = add_bridge_side(self.device, gpu, seconds, failed, undecodable)

    def snapshot(self) -> LoaderStats:
        stages = self._stage_view()
        found = self.bottleneck(stages)
        with self._lock:
            end = self.epoch_end if self.epoch_end is not None else self.clock()
            return LoaderStats(
                samples=self.samples,
                batches=self.batches,
                attempted=self.attempted,
                bytes_read=self.bytes_read,
                failures=sum(self.failures.values()),
                failures_by_reason=dict(self.failures),
                last_failed_paths=tuple(self.failed_paths),
                read_retries=self.read_retries,
                worker_restarts=self.worker_restarts,
                wait_seconds=self.trainer_wait.totals()[0],
                epoch=self.epoch,
                epoch_samples=self.epoch_samples,
                epoch_batches=self.epoch_batches,
                epoch_wait_seconds=self.epoch_wait,
                epoch_seconds=end - self.epoch_start,
                first_batch_seconds=self.first_batch,
                stages=stages,
                bottleneck=found[0] if found is not None else None,
                recent_wait_share=found[1] if found is not None else None,
                io_concurrency=stages["read"].bound,
                num_workers=stages["decode"].capacity,
                ranks_on_node=self.ranks_on_node,
                cpus_per_rank=self.cpus_per_rank,
                cluster=self.cluster,
                device_decode=self.device,
                cache=self.cache,
            )
