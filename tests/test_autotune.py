"""The autotuner's decisions, pure (:mod:`aioloader.tune.rules`): reads in flight by Little's
law, bounded and judged by what growth bought; decoders leaving the trainer's CPUs; and the
tuner (:mod:`aioloader.tune.tuner`) driven tick by tick on a fake wall clock and CPU clock."""

from __future__ import annotations

import os

import pytest
from helpers import FakeClock

from aioloader.observe.stages import StageMeter
from aioloader.tune.rules import (
    HOLD_TICKS,
    MIN_READS,
    IoTuner,
    IoWindow,
    WorkerTuner,
    memory_cap,
    process_cpu_seconds,
)
from aioloader.tune.tuner import TICK, Tuner, Tuning, io_floor, memory_budget, trainer_pids


def reads_bound(limit: int, latency: float, seconds: float = 0.5, decode_busy: float = 0.25) -> IoWindow:
    """A tick where reads are the limit: every slot held, each read taking ``latency``
    seconds, two decoders busy ``decode_busy`` of the time on what arrives."""
    reads = round(limit * seconds / latency)
    return IoWindow(seconds, reads, limit * seconds, reads, decode_busy * seconds * 2, workers=2)


def test_starved_decoders_behind_slow_reads_get_what_littles_law_says() -> None:
    tuner = IoTuner(64, lo=16, hi=1024)
    w = reads_bound(64, latency=0.05)  # 1,280 reads/s, decoders 25% busy: they could take 5,120/s
    assert tuner.needed(w) == pytest.approx(2.0 * 5120 * 0.05)
    assert tuner.update(w) == 256  # at most four times a tick
    # It read faster, and the decoders are busy now: 2 x 5,120/s x 50 ms
    assert tuner.update(reads_bound(256, latency=0.05, decode_busy=1.0)) == 512


def test_page_cached_reads_behind_busy_decoders_shrink_to_the_floor_by_halves() -> None:
    tuner = IoTuner(128, lo=16, hi=1024)
    # 600 reads of 50 us each (a group hop holds one slot), decoders always busy.
    w = IoWindow(0.5, 600, 600 * 50e-6, 600, 0.5 * 2 * 2, workers=2)
    assert tuner.update(w) == 64
    assert tuner.update(w) == 32
    assert tuner.update(w) == 16
    assert tuner.update(w) == 16


def test_free_read_slots_mean_reads_are_not_the_limit() -> None:
    tuner = IoTuner(64, lo=16, hi=1024)
    # slow reads, but only 8 of 64 slots in use on average: something else holds them back
    w = IoWindow(0.5, 80, 8 * 0.5, 80, 0.05, workers=2)
    assert tuner.needed(w) > 64
    assert tuner.update(w) == 64


def test_growth_that_reads_no_faster_sets_a_ceiling_for_a_while() -> None:
    tuner = IoTuner(64, lo=16, hi=1024)
    assert tuner.update(reads_bound(64, latency=0.05)) == 256
    # Saturated storage: 4x the reads in flight, 4x the latency, the same read rate.
    saturated = reads_bound(256, latency=0.2)
    assert tuner.update(saturated) == 256  # kept, but no further
    for _ in range(HOLD_TICKS - 1):
        assert tuner.update(saturated) == 256
    assert tuner.update(saturated) == 1024  # the hold is over: it tries again


def test_the_limit_stays_within_its_bounds() -> None:
    tuner = IoTuner(64, lo=16, hi=100)
    assert tuner.update(reads_bound(64, latency=0.05)) == 100
    tuner.set_hi(40)  # the memory bound came down (larger files than assumed)
    assert tuner.limit == 40
    tuner.set_hi(4)  # never below the floor
    assert (tuner.hi, tuner.limit) == (16, 16)
    assert IoTuner(1, lo=16, hi=100).limit == 16
    with pytest.raises(ValueError, match="lo=8, hi=4"):
        IoTuner(8, lo=8, hi=4)


def test_a_tick_with_too_few_reads_changes_nothing() -> None:
    tuner = IoTuner(64, lo=16, hi=1024)
    w = IoWindow(0.5, MIN_READS - 1, 64 * 0.5, MIN_READS - 1, 0.01, workers=2)
    assert tuner.update(w) == 64


def test_without_a_decoder_saturated_reads_double() -> None:
    tuner = IoTuner(32, lo=16, hi=1024)
    w = IoWindow(0.5, 320, 32 * 0.5)  # every slot held, 50 ms a read
    assert tuner.update(w) == 128  # 2 x (2 x 640/s) x 50 ms
    idle = IoWindow(0.5, 320, 4 * 0.5)  # slots mostly free: the trainer is the limit
    assert tuner.update(idle) == 64


def test_decoders_leave_the_cpus_the_trainer_uses() -> None:
    tuner = WorkerTuner(processes=12, usable=12)
    assert tuner.target(0.1) == 12  # a trainer that waits on the GPU needs no core
    assert tuner.target(0.6) == 11
    assert tuner.target(2.4) == 10
    assert tuner.target(40.0) == 1  # always one decoder
    assert WorkerTuner(processes=4, usable=12).target(0.0) == 4  # never more than the pool


def test_a_decoder_change_needs_two_ticks_that_agree() -> None:
    tuner = WorkerTuner(processes=4, usable=4)
    assert tuner.update(1.0) == 4  # one tick says 3
    assert tuner.update(0.1) == 4  # the next says 4: no change
    assert tuner.update(1.0) == 4
    assert tuner.update(1.2) == 3  # two in a row say 3
    assert tuner.update(0.2) == 3
    assert tuner.update(0.0) == 4


def test_memory_bound() -> None:
    # 1 GiB for samples of 256 KiB (file and decoded output): 4,096, less two batches of 64
    assert memory_cap(1 << 30, 256 << 10, 64) == 4096 - 128
    assert memory_cap(1 << 20, 1 << 30, 64) == 1
    assert 64 << 20 <= memory_budget() <= 8 << 30


def test_the_floor_covers_every_decode_slot() -> None:
    assert io_floor(batch_size=64, num_workers=2) == 64  # tasks of 32: one running, one queued a worker
    assert io_floor(batch_size=256, num_workers=2) == 128  # two slots of 32 a worker
    assert io_floor(batch_size=8, num_workers=12) == 24  # tasks of 1: a slot each
    assert io_floor(batch_size=4, num_workers=1) == 16


def test_cpu_clock_of_a_process() -> None:
    """/proc's CPU clock of this process reads between two readings of the kernel's
    ``times()`` (the same user and system ticks), compared in whole ticks."""
    ticks = os.sysconf("SC_CLK_TCK")

    def times() -> int:
        t = os.times()
        return round((t.user + t.system) * ticks)

    start = times()
    while times() < start + 2:  # spin until the clock has moved: the bracket is not all zeros
        pass
    before = times()
    got = process_cpu_seconds(os.getpid())
    after = times()
    assert got is not None and before <= round(got * ticks) <= after
    assert process_cpu_seconds(2**22 + 12345) is None  # above pid_max: no such process
    assert trainer_pids(None) == [os.getpid()]
    assert trainer_pids(1) == [os.getpid(), 1]


class FakeReader:
    """What the tuner moves on a :class:`~aioloader.read.reader.FileReader`."""

    def __init__(self, io_concurrency: int, max_io: int) -> None:
        self.io_concurrency, self.max_io = io_concurrency, max_io
        self.limits: list[int] = []

    def set_limit(self, limit: int) -> None:
        self.io_concurrency = limit
        self.limits.append(limit)


class FakeDecoder:
    """What the tuner moves on a :class:`~aioloader.decode.stage.DecodeStage`."""

    def __init__(self, active: int) -> None:
        self.active = active

    def set_workers(self, active: int) -> None:
        self.active = active


def test_the_tuner_judges_each_tick_on_its_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner driven tick by tick on a fake wall clock and a fake CPU clock: the windows
    it hands the rules, a tick with too few reads widening the next, and the trainer's CPU
    use read every CPU_TICKS ticks."""
    clock = FakeClock()
    cpu = {7: 10.0}  # the trainer's CPU seconds
    meters = {
        "read": StageMeter("read", bound=64, clock=clock),
        "decode": StageMeter("decode", bound=8, capacity=4, clock=clock),
    }
    reader, decoder = FakeReader(64, max_io=1024), FakeDecoder(4)
    tuner = Tuner(
        Tuning(batch_size=16, workers=4, cpus=4, io=True, decoders=True),
        reader,  # type: ignore[arg-type]
        decoder,  # type: ignore[arg-type]
        meters,
        bytes_per_sample=lambda: 1024,
        memory_budget=1 << 30,
        trainer_pids=[7],
        clock=clock,
        cpu_seconds=cpu.get,
    )
    assert tuner.io is not None and reader.limits == [64]
    windows: list[IoWindow] = []
    update = tuner.io.update

    def recorded(w: IoWindow) -> int:
        windows.append(w)
        return update(w)

    monkeypatch.setattr(tuner.io, "update", recorded)

    def tick(reads: int = 0, slots: int = 1, decoded: int = 0, cpu_seconds: float = 0.0) -> None:
        """Half a second: ``reads`` reads holding ``slots`` slots throughout, ``decoded``
        samples with one chunk in flight throughout; then the tuner's tick."""
        read = meters["read"].enter(slots) if reads else None
        chunk = meters["decode"].enter() if decoded else None
        clock.advance(TICK)
        if read is not None:
            meters["read"].leave(read, slots, per=reads)
        if chunk is not None:
            meters["decode"].leave(chunk, per=decoded)
        cpu[7] += cpu_seconds
        tuner.tick()

    tuner.begin()
    # Every slot held, 50 ms a read; one of four decoders busy: they could take 4x.
    tick(reads=640, slots=64, decoded=640, cpu_seconds=0.5)
    assert windows == [IoWindow(0.5, 640, 32.0, 640, 0.5, workers=4)]
    assert reader.limits == [64, 256]  # Little's law wants 512: at most 4x a tick
    tick(reads=20, cpu_seconds=0.5)  # too few reads to judge: the window widens
    assert len(windows) == 1
    tick(reads=20, cpu_seconds=0.5)
    assert windows[1] == IoWindow(1.0, 40, 1.0, 0, 0.0, workers=4)
    assert reader.limits == [64, 256, 128]  # far over what 40 reads/s need: halved
    tick(cpu_seconds=0.5)  # tick 4: the trainer used 2 CPU seconds in 2 s, one CPU
    assert decoder.active == 4  # one tick says 3: not yet
    for _ in range(4):
        tick(cpu_seconds=0.5)
    assert decoder.active == 3  # tick 8 agrees: one CPU left to the trainer
    assert len(windows) == 2  # no reads since tick 3
