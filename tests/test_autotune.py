"""The autotuner's decisions, pure (:mod:`aioloader.tune.rules`): reads in flight by Little's
law, bounded and judged by what growth bought; decoders leaving the trainer's CPUs."""

from __future__ import annotations

import os
import time

import pytest

from aioloader.tune.rules import (
    HOLD_TICKS,
    MIN_READS,
    IoTuner,
    IoWindow,
    WorkerTuner,
    memory_cap,
    process_cpu_seconds,
)
from aioloader.tune.tuner import io_floor, memory_budget, trainer_pids


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
    assert io_floor(batch_size=64, num_workers=2, chunk=16) == 64
    assert io_floor(batch_size=8, num_workers=12, chunk=1) == 24
    assert io_floor(batch_size=4, num_workers=1, chunk=2) == 16


def test_cpu_clock_of_a_process() -> None:
    before = process_cpu_seconds(os.getpid())
    assert before is not None
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    after = process_cpu_seconds(os.getpid())
    assert after is not None and after - before >= 0.1
    assert process_cpu_seconds(2**22 + 12345) is None  # above pid_max: no such process
    assert trainer_pids(None) == [os.getpid()]
    assert trainer_pids(1) == [os.getpid(), 1]
