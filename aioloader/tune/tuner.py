"""The autotuner's running side (``io_concurrency="auto"``, ``num_workers="auto"``).

While an epoch is produced, :meth:`Tuner.run` wakes every :data:`TICK` seconds on the
loader's loop, reads the read and decode meters (and, every :data:`CPU_TICKS` ticks, the CPU
clock of the trainer's process), asks :mod:`aioloader.tune.rules` and applies the answers: the
reader's limit (the engine's window of batches follows it) and the decoders at work.

Changes move bounds only. Which samples make up each batch, their order, and what
``state_dict`` records do not depend on how many reads or decodes are in flight, so a
change mid-epoch never reorders batches or moves a resume point.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aioloader.base.cgmemory import available_memory
from aioloader.decode.contract import DecodeStageLike
from aioloader.observe.stages import StageMeter, StageStats
from aioloader.read.reader import FileReader
from aioloader.tune.rules import (
    MIN_READS,
    IoTuner,
    IoWindow,
    WorkerTuner,
    memory_cap,
    process_cpu_seconds,
)

__all__ = ["CPU_TICKS", "MAX_AUTO_IO", "TICK", "Tuner", "Tuning", "io_floor", "memory_budget", "trainer_pids"]

log = logging.getLogger("aioloader")

#: Seconds between two looks at the meters.
TICK = 0.5
#: Ticks between two looks at the trainer's CPU clock (it counts in 10 ms steps).
CPU_TICKS = 4
#: Most reads in flight ``io_concurrency="auto"`` goes to (before the fd and memory bounds).
MAX_AUTO_IO = 1024
#: Longest a tick waits for :data:`~aioloader.tune.rules.MIN_READS` reads before it is judged anyway.
LONGEST_WINDOW = 5.0


@dataclass(frozen=True)
class Tuning:
    """What the tuner moves, for a loader with ``"auto"`` settings: the reads in flight
    (``io``), the decoders at work (``decoders``, of ``workers`` processes started, leaving the
    trainer its share of this rank's ``cpus``), for batches of ``batch_size`` samples."""

    batch_size: int
    workers: int
    cpus: int
    io: bool
    decoders: bool


def memory_budget() -> int:
    """Bytes the samples in flight may hold under ``"auto"``: an eighth of the memory
    available now (cgroup limits included), at most 8 GiB (1 GiB where it cannot be read)."""
    available = available_memory()
    return 1 << 30 if available is None else max(64 << 20, min(8 << 30, available // 8))


def io_floor(batch_size: int, num_workers: int) -> int:
    """Fewest reads in flight ``"auto"`` goes to: a batch's samples, rounded up to an even
    share for each of the two decode slots of every worker, at most 32 a slot (so at most
    64 per worker), at least 16 (a page-cached group read holds one slot).

    Not the decode tasks' own size: a task is a batch's share for one worker
    (:func:`aioloader.engine.sizing.chunk_size`), and reads for two of them per worker
    would deepen the batch window by a batch, a rows slab and an input arena more, with
    no read faster for it (RESULTS §38)."""
    return max(16, 2 * num_workers * min(32, math.ceil(batch_size / (2 * num_workers))))


class Tuner:
    """Tunes one loader's reader and decode stage (see the module docstring).

    ``bytes_per_sample()`` is what a sample in flight holds (its file and its decoded
    output); ``memory_budget`` bounds that times the reads in flight; ``trainer_pids`` are
    the processes whose CPU the decoders leave alone (the trainer's, and a loader
    process's own); ``on_io(limit)`` is told each new read limit. ``clock`` is the wall
    clock a tick's window is measured on and ``cpu_seconds(pid)`` a process's CPU clock
    (:func:`~aioloader.tune.rules.process_cpu_seconds`, None where unreadable): a test
    passes fakes and drives :meth:`tick` itself."""

    def __init__(
        self,
        tuning: Tuning,
        reader: FileReader,
        decoder: DecodeStageLike | None,
        meters: dict[str, StageMeter],
        *,
        bytes_per_sample: Callable[[], int],
        memory_budget: int,
        trainer_pids: Sequence[int],
        on_io: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_seconds: Callable[[int], float | None] = process_cpu_seconds,
    ) -> None:
        self._clock, self._cpu_seconds = clock, cpu_seconds
        self._reader, self._decoder = reader, decoder
        self._read, self._decode = meters["read"], meters["decode"]
        self._batch_size = tuning.batch_size
        self._bytes_per_sample, self._budget = bytes_per_sample, memory_budget
        self._pids = tuple(trainer_pids)
        self._on_io = on_io
        self.io: IoTuner | None = None
        if tuning.io:
            lo = min(reader.max_io, io_floor(tuning.batch_size, tuning.workers))
            self.io = IoTuner(reader.io_concurrency, lo, reader.max_io)
            reader.set_limit(self.io.limit)
            if on_io is not None:
                on_io(self.io.limit)
        self.workers: WorkerTuner | None = None
        if tuning.decoders and decoder is not None:
            self.workers = WorkerTuner(tuning.workers, tuning.cpus)

    async def run(self) -> None:
        """Tune until cancelled (at the end of the epoch's production)."""
        self.begin()
        while True:
            await asyncio.sleep(TICK)
            self.tick()

    def begin(self) -> None:
        """Take the first marks: the next :meth:`tick` judges what happened since."""
        self._mark = self._marks()
        self._cpu_mark = self._cpu()
        self._ticks = 0

    def tick(self) -> None:
        """One look at the meters (and every :data:`CPU_TICKS` ticks at the CPU clocks) since
        the last marks; :meth:`run` calls it every :data:`TICK` seconds."""
        self._ticks += 1
        mark, now = self._mark, self._marks()
        # A tick with too few reads to judge widens the next one, up to LONGEST_WINDOW.
        judged = self.io is None or self._tune_io(mark, now)
        if judged or now[0] - mark[0] > LONGEST_WINDOW:
            self._mark = now
        if self.workers is not None and self._ticks % CPU_TICKS == 0:
            cpu, cpu_mark = self._cpu(), self._cpu_mark
            if cpu is not None and cpu_mark is not None and cpu[0] > cpu_mark[0]:
                self._tune_workers((cpu[1] - cpu_mark[1]) / (cpu[0] - cpu_mark[0]))
            self._cpu_mark = cpu

    def _marks(self) -> tuple[float, StageStats, StageStats]:
        return self._clock(), self._read.snapshot(False), self._decode.snapshot(False)

    def _tune_io(
        self, mark: tuple[float, StageStats, StageStats], now: tuple[float, StageStats, StageStats]
    ) -> bool:
        """Judge the reads since ``mark``; False while there are too few of them."""
        assert self.io is not None
        (t0, r0, d0), (t1, r1, d1) = mark, now
        window = IoWindow(
            seconds=t1 - t0,
            reads=r1.items - r0.items,
            read_area=r1.area_seconds - r0.area_seconds,
            decoded=d1.items - d0.items,
            decode_area=d1.area_seconds - d0.area_seconds,
            workers=self._decoder.active if self._decoder is not None else 0,
        )
        if window.reads < MIN_READS:
            return False
        fits = memory_cap(self._budget, self._bytes_per_sample(), self._batch_size)
        self.io.set_hi(min(self._reader.max_io, fits))
        before = self.io.limit
        after = self.io.update(window)
        if after != before:
            self._reader.set_limit(after)
            if self._on_io is not None:
                self._on_io(after)
            log.debug("io_concurrency auto: %d -> %d reads in flight", before, after)
        return True

    def _tune_workers(self, trainer_cpus: float) -> None:
        assert self.workers is not None and self._decoder is not None
        before = self.workers.active
        after = self.workers.update(trainer_cpus)
        if after != before:
            self._decoder.set_workers(after)
            log.debug(
                "num_workers auto: %d -> %d decoding (trainer's process uses %.2f CPUs)",
                before,
                after,
                trainer_cpus,
            )

    def _cpu(self) -> tuple[float, float] | None:
        """(wall time, CPU seconds of the trainer's processes), or None where unreadable."""
        total = 0.0
        for pid in self._pids:
            got = self._cpu_seconds(pid)
            if got is None:
                return None
            total += got
        return self._clock(), total


def trainer_pids(trainer_pid: int | None) -> list[int]:
    """The processes the decoders leave CPU for: this one, and the trainer's when this is a
    loader process."""
    pids = [os.getpid()]
    if trainer_pid is not None and trainer_pid != pids[0]:
        pids.append(trainer_pid)
    return pids
