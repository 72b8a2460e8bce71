"""Pure: the stage meters (``aioloader.observe.stages``) and the bottleneck rule
(``aioloader.observe.bottleneck``), no event loop. The constructed cases with real loaders are in
test_bottleneck.py."""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import FakeClock

from aioloader import Bottleneck, StageStats
from aioloader.observe.bottleneck import WAIT_SHARE, Setup, diagnose
from aioloader.observe.stages import PERCENTILE_EVERY, StageMeter, between, utilization
from aioloader.observe.stats import WINDOW, Counters


def stage(name: str, mean: float, capacity: int = 1, busy: float = 0.5, p50: float = 2.0) -> StageStats:
    """A stage seen for 10 s with ``mean`` items in flight on average."""
    return StageStats(
        name=name,
        items=100,
        busy_seconds=10 * busy,
        elapsed_seconds=10.0,
        area_seconds=10 * mean,
        bound=2 * capacity,
        capacity=capacity,
        p50_ms=p50,
        p99_ms=p50 * 3,
    )


def test_a_meter_integrates_items_in_flight_over_time() -> None:
    clock = FakeClock()
    meter = StageMeter("read", bound=8, clock=clock)
    clock.advance(1.0)  # before the window
    before = meter.snapshot()
    first = meter.enter(4)
    assert first == 101.0  # the clock's reading, for leave()
    clock.advance(0.25)
    second = meter.enter(4)  # 8 in flight
    clock.advance(0.25)
    meter.leave(first, 4)  # in the stage 0.5 s
    meter.leave(second, 4)  # 0.25 s
    clock.advance(0.5)  # idle
    window = between(before, meter.snapshot())
    assert (window.items, window.in_flight, window.bound, window.capacity) == (8, 0, 8, 8)
    # 4 items for 0.25 s, 8 for 0.25 s, none for 0.5 s: 3 item-seconds over 1 s
    assert window.elapsed_seconds == 1.0
    assert window.area_seconds == 3.0
    assert window.busy_seconds == 0.5 and window.busy_share == 0.5
    assert window.mean_in_flight == 3.0
    assert utilization(window) == 3.0 / 8
    assert (window.p50_ms, window.p99_ms) == (250.0, 500.0)  # one latency per leave()
    assert str(window) == "read: 8 items, busy 50%, 3.0 of 8 in flight on average, p50 250.0 ms, p99 500.0 ms"


def test_percentiles_come_from_recorded_latencies_divided_per_sample() -> None:
    clock = FakeClock()
    meter = StageMeter("decode", bound=4, capacity=2, clock=clock)
    for k in range(1, 101):  # chunks of 4 samples that took k/64 s: k/256 s a sample
        entered = meter.enter()
        clock.advance(k / 64)
        meter.leave(entered, per=4)
    snap = meter.snapshot()
    assert (snap.p50_ms, snap.p99_ms) == (50 / 256 * 1e3, 99 / 256 * 1e3) == (195.3125, 386.71875)
    assert snap.items == 400 and snap.capacity == 2 and snap.bound == 4  # samples
    assert snap.busy_seconds == snap.area_seconds == snap.elapsed_seconds == 5050 / 64  # always one chunk
    assert str(snap).startswith("decode: 400 items, busy 100%, 1.0 of 4 in flight")


def test_timed_leaves_however_the_block_ends_with_the_samples_it_carried() -> None:
    """``with meter.timed() as t``: one item in flight for the block, left on an exception
    too, with ``t.per`` samples set inside it."""
    clock = FakeClock()
    meter = StageMeter("read", bound=2, clock=clock)
    with meter.timed() as timed:
        clock.advance(1.0)
        assert meter.snapshot().in_flight == 1
        timed.per = 4
    with pytest.raises(ValueError), meter.timed(per=2):
        clock.advance(1.0)
        raise ValueError("a read that failed")
    snap = meter.snapshot()
    assert (snap.items, snap.in_flight, snap.busy_seconds) == (6, 0, 2.0)
    assert (snap.p50_ms, snap.p99_ms) == (250.0, 500.0)  # 1 s over 4 samples, 1 s over 2


def test_percentiles_are_sorted_again_at_most_every_quarter_second() -> None:
    clock = FakeClock()
    meter = StageMeter("collate", clock=clock)
    meter.leave(meter.enter() - 0.5)  # a batch that took 0.5 s
    assert meter.snapshot().p50_ms == 500.0
    meter.leave(meter.enter() - 0.25)
    meter.leave(meter.enter() - 0.25)
    clock.advance(PERCENTILE_EVERY / 2)
    assert meter.snapshot().p50_ms == 500.0  # sorted 0.125 s ago: reused
    assert meter.snapshot(percentiles=False).p50_ms is None  # a per-batch mark sorts nothing
    clock.advance(PERCENTILE_EVERY / 2)
    assert meter.snapshot().p50_ms == 250.0  # 0.25 s later: sorted again


def test_a_meter_counts_calls_from_many_threads() -> None:
    meter = StageMeter("read", bound=64)

    def work() -> None:
        for _ in range(500):
            meter.leave(meter.enter())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = meter.snapshot()
    assert snap.items == 2000 and snap.in_flight == 0


def test_a_trainer_that_hardly_waits_is_the_bottleneck() -> None:
    stages = {"read": stage("read", 60, capacity=64), "decode": stage("decode", 2, capacity=2)}
    verdict = diagnose(stages, WAIT_SHARE / 2, num_workers=2, io_concurrency=64)
    assert verdict.stage == "trainer" and "waited for data 5% of the time" in verdict.advice


@pytest.mark.parametrize(
    ("busiest", "expect"),
    [
        (
            "read",
            "64 of 64 reads in flight, p50 2.0 ms, p99 6.0 ms; trainer waited 40% — raise io_concurrency",
        ),
        ("decode", "decode chunks in flight for 4 workers, p50 2.0 ms, p99 6.0 ms per sample"),
        ("collate", "the collate thread was busy 95%, p50 2.0 ms, p99 6.0 ms per batch; trainer waited 40%"),
        ("transfer", "the transfer thread was busy 95%"),
    ],
)
def test_the_stage_closest_to_its_capacity_is_named_with_advice(busiest: str, expect: str) -> None:
    low = {
        "read": stage("read", 10, capacity=64),
        "decode": stage("decode", 1, capacity=4),
        "collate": stage("collate", 0.2, busy=0.2),
        "transfer": stage("transfer", 0.1, busy=0.1),
    }
    high = {
        "read": stage("read", 64, capacity=64),
        "decode": stage("decode", 4, capacity=4),
        "collate": stage("collate", 0.95, busy=0.95),
        "transfer": stage("transfer", 0.95, busy=0.95),
    }
    on_cuda = Setup(device="cuda", pin_memory=True)  # every stage runs
    verdict = diagnose({**low, busiest: high[busiest]}, 0.4, num_workers=4, io_concurrency=64, setup=on_cuda)
    assert verdict.stage == busiest
    assert expect in verdict.advice
    assert str(verdict) == f"{busiest}: {verdict.advice}"


def test_slow_storage_with_free_read_slots_says_so_and_remote_advice_names_the_options() -> None:
    slow = {"read": stage("read", 20, capacity=64, busy=0.9), "decode": stage("decode", 0.1, capacity=4)}
    verdict = diagnose(slow, 0.5, num_workers=4, io_concurrency=64)
    assert verdict.stage == "read" and "storage answers slowly" in verdict.advice
    full = {"read": stage("read", 64, capacity=64)}
    remote = diagnose(full, 0.5, num_workers=4, io_concurrency=64, setup=Setup(remote=True))
    assert "storage_options" in remote.advice
    assert isinstance(remote, Bottleneck)


@pytest.mark.parametrize(("batches", "warnings"), [(10, 0), (30, 1)])
def test_an_epoch_shorter_than_the_window_is_judged_at_its_end_when_long_enough(
    batches: int, warnings: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A trainer that waited 3 of every 4 s: an epoch of 30 batches ends with one warning,
    which says it judged the 29 after the first (the first opens the window); one of 10 says
    nothing (its window would mostly be the pipeline filling up)."""
    clock = FakeClock()
    counters = Counters(io_concurrency=8, num_workers=2, clock=clock)
    counters.begin_epoch(0)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        for _ in range(batches):
            clock.advance(4.0)
            counters.delivered(4, waited=3.0)
        counters.end_epoch()
    said = [r.getMessage() for r in caplog.records if "the trainer waited for data" in r.getMessage()]
    prefix = f"the trainer waited for data 75% of the time over the last {batches - 1} batches; bottleneck: "
    assert len(said) == warnings and all(m.startswith(prefix) for m in said), said


def test_the_warning_says_how_many_batches_it_judged_and_counts_its_nouns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A whole window judged says :data:`WINDOW` batches: a trainer that kept up for the
    first window and then waited 3 of every 4 s is warned at the second check, over the last
    WINDOW batches; with one worker, the advice says "1 worker"."""
    clock = FakeClock()
    counters = Counters(io_concurrency=1, num_workers=1, clock=clock)
    counters.begin_epoch(0)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        for waited in [0.0] * WINDOW + [3.0] * WINDOW:
            clock.advance(4.0)
            counters.delivered(4, waited=waited)
    said = [r.getMessage() for r in caplog.records if "the trainer waited for data" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"the trainer waited for data 75% of the time over the last {WINDOW} batches;")
    decode = {"read": stage("read", 0.1, capacity=1), "decode": stage("decode", 1, capacity=1)}
    advice = diagnose(decode, 0.5, num_workers=1, io_concurrency=1).advice
    assert advice.startswith("1.0 decode chunks in flight for 1 worker, p50 2.0 ms"), advice
    read = {"read": stage("read", 1, capacity=1), "decode": stage("decode", 0.1, capacity=1)}
    advice = diagnose(read, 0.5, num_workers=1, io_concurrency=1).advice
    assert advice.startswith("1 of 1 read in flight, p50 2.0 ms"), advice


def test_the_verdict_looks_back_over_the_last_window_of_batches() -> None:
    """The trainer's wait share and the stages over the last :data:`WINDOW` batches, on one
    clock: what came before the window is left out."""
    clock = FakeClock()
    counters = Counters(io_concurrency=8, num_workers=2, clock=clock)
    counters.begin_epoch(0)
    for _ in range(30):  # waited 3 of every 4 s, nothing decoding
        clock.advance(4.0)
        counters.delivered(4, waited=3.0)
    decode = counters.meters["decode"]
    chunks = decode.enter(2)  # from now on both workers decode all the time
    for _ in range(WINDOW):  # a batch a second, half of it waited for
        clock.advance(1.0)
        counters.delivered(4, waited=0.5)
    stats = counters.snapshot()
    assert (stats.epoch_batches, stats.epoch_samples) == (30 + WINDOW, 4 * (30 + WINDOW))
    assert stats.epoch_seconds == 120.0 + WINDOW and stats.first_batch_seconds == 4.0
    assert stats.epoch_wait_seconds == stats.wait_seconds == 90.0 + WINDOW * 0.5
    assert stats.recent_wait_share == 0.5  # the last WINDOW batches only
    window = counters.bottleneck()
    assert window is not None
    verdict, share = window
    assert share == 0.5 and verdict == stats.bottleneck
    assert verdict.stage == "decode"  # 2 of 2 workers busy over the window: utilization 1
    assert verdict.advice.startswith("2.0 decode chunks in flight for 2 workers")
    assert "trainer waited 50%" in verdict.advice
    decode.leave(chunks, 2)
    counters.begin_epoch(1)  # a new epoch opens a new window
    assert counters.bottleneck() is None and counters.snapshot().recent_wait_share is None
