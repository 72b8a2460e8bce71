"""``loader.stats``: counters kept while loading, read as an immutable snapshot."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

__all__ = ["Counters", "LoaderSide", "LoaderStats"]

#: bytes read, samples attempted, failures by reason, last failed paths, read retries,
#: worker restarts: what a loader process counts for the trainer's counters.
LoaderSide = tuple[int, int, dict[str, int], tuple[str, ...], int, int]


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


class Counters:
    """Mutable counters. Each field has one writer (the loop thread or the consumer), and a
    lock makes snapshots consistent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.samples = 0
        self.batches = 0
        self.attempted = 0  # samples whose read started, for a fractional max_failures
        self.bytes_read = 0
        self.wait_seconds = 0.0
        self.failures: Counter[str] = Counter()
        self.failed_paths: deque[str] = deque(maxlen=8)
        self.read_retries = 0
        self.worker_restarts = 0
        self.epoch = 0
        self.epoch_samples = 0
        self.epoch_batches = 0
        self.epoch_wait = 0.0
        self.epoch_start = time.perf_counter()
        self.epoch_end: float | None = None
        self.first_batch: float | None = None
        #: Bumped by :meth:`restore`: a loader process must take the restored failures over.
        self.restores = 0

    def begin_epoch(self, epoch: int) -> None:
        with self._lock:
            self.epoch = epoch
            self.epoch_samples = self.epoch_batches = 0
            self.epoch_wait = 0.0
            self.epoch_start = time.perf_counter()
            self.epoch_end = None
            self.first_batch = None

    def end_epoch(self) -> None:
        with self._lock:
            self.epoch_end = time.perf_counter()

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_read += n

    def delivered(self, samples: int, waited: float) -> None:
        with self._lock:
            if self.first_batch is None:
                self.first_batch = time.perf_counter() - self.epoch_start
            self.samples += samples
            self.batches += 1
            self.epoch_samples += samples
            self.epoch_batches += 1
            self.wait_seconds += waited
            self.epoch_wait += waited

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

    def retried(self) -> None:
        with self._lock:
            self.read_retries += 1

    def restore(self, samples: int, batches: int, failures: dict[str, int], attempted: int) -> None:
        """Carry totals over from a resumed run's state."""
        with self._lock:
            self.samples, self.batches, self.attempted = samples, batches, attempted
            self.failures = Counter(failures)
            self.restores += 1

    def restore_failures(self, failures: dict[str, int], attempted: int) -> None:
        """In a loader process: the failures and attempts the trainer's counters hold."""
        with self._lock:
            self.failures, self.attempted = Counter(failures), attempted

    def loader_side(self) -> LoaderSide:
        """What the loading side counts (bytes, attempts, failures, retries, restarts), for
        :meth:`absorb` in the trainer's process (``loader_process=True``)."""
        with self._lock:
            return (
                self.bytes_read,
                self.attempted,
                dict(self.failures),
                tuple(self.failed_paths),
                self.read_retries,
                self.worker_restarts,
            )

    def absorb(self, counts: LoaderSide) -> None:
        """Take over what a loader process counted (:meth:`loader_side`)."""
        bytes_read, attempted, failures, paths, retries, restarts = counts
        with self._lock:
            self.bytes_read, self.attempted = bytes_read, attempted
            self.failures = Counter(failures)
            self.failed_paths = deque(paths, maxlen=8)
            self.read_retries, self.worker_restarts = retries, restarts

    def snapshot(self) -> LoaderStats:
        with self._lock:
            end = self.epoch_end if self.epoch_end is not None else time.perf_counter()
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
                wait_seconds=self.wait_seconds,
                epoch=self.epoch,
                epoch_samples=self.epoch_samples,
                epoch_batches=self.epoch_batches,
                epoch_wait_seconds=self.epoch_wait,
                epoch_seconds=end - self.epoch_start,
                first_batch_seconds=self.first_batch,
            )
