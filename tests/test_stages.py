"""Pure: the stage meters (``aioloader.observe.stages``) and the bottleneck rule
(``aioloader.observe.bottleneck``), no event loop. The constructed cases with real loaders are in
test_bottleneck.py."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from aioloader import Bottleneck, StageStats
from aioloader.observe.bottleneck import WAIT_SHARE, diagnose
from aioloader.observe.stages import StageMeter, between, utilization
from aioloader.observe.stats import Counters


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
    meter = StageMeter("read", bound=8)
    before = meter.snapshot()
    first = meter.enter(4)
    time.sleep(0.2)
    second = meter.enter(4)  # 8 in flight
    time.sleep(0.2)
    meter.leave(first, 4)
    meter.leave(second, 4)
    time.sleep(0.2)  # idle
    window = between(before, meter.snapshot())
    assert window.items == 8 and window.in_flight == 0
    # 4 items for 0.2 s, 8 for 0.2 s, none for 0.2 s: 2.4 item-seconds over ~0.6 s
    assert window.area_seconds == pytest.approx(2.4, rel=0.25)
    assert window.busy_seconds == pytest.approx(0.4, rel=0.25)
    assert window.mean_in_flight == pytest.approx(4.0, rel=0.3)
    assert utilization(window) == pytest.approx(0.5, rel=0.3)
    assert window.p50_ms is not None and window.p99_ms is not None
    assert 180 < window.p50_ms <= window.p99_ms < 1000


def test_percentiles_come_from_recorded_latencies_divided_per_sample() -> None:
    meter = StageMeter("decode", bound=4, capacity=2)
    for ms in range(1, 101):  # chunks of 4 samples that took 4..400 ms: 1..100 ms a sample
        entered = meter.enter()
        meter.leave(entered - ms * 4 / 1e3, per=4)  # as if it had entered ms * 4 ms earlier
    snap = meter.snapshot()
    assert snap.p50_ms == pytest.approx(50, abs=1.5) and snap.p99_ms == pytest.approx(99, abs=1.5)
    assert snap.items == 400 and snap.capacity == 2 and snap.bound == 4  # samples
    assert str(snap).startswith("decode: 400 items")


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
    verdict = diagnose({**low, busiest: high[busiest]}, 0.4, num_workers=4, io_concurrency=64)
    assert verdict.stage == busiest
    assert expect in verdict.advice
    assert str(verdict) == f"{busiest}: {verdict.advice}"


def test_slow_storage_with_free_read_slots_says_so_and_remote_advice_names_the_options() -> None:
    slow = {"read": stage("read", 20, capacity=64), "decode": stage("decode", 0.1, capacity=4)}
    verdict = diagnose(slow, 0.5, num_workers=4, io_concurrency=64)
    assert verdict.stage == "read" and "storage answers slowly" in verdict.advice
    full = {"read": stage("read", 64, capacity=64)}
    remote = diagnose(full, 0.5, num_workers=4, io_concurrency=64, remote=True)
    assert "storage_options" in remote.advice
    assert isinstance(remote, Bottleneck)


@pytest.mark.parametrize(("batches", "warnings"), [(10, 0), (30, 1)])
def test_an_epoch_shorter_than_the_window_is_judged_at_its_end_when_long_enough(
    batches: int, warnings: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A trainer that waited 3 of every 4 ms: an epoch of 30 batches ends with one warning;
    one of 10 says nothing (its window would mostly be the pipeline filling up)."""
    counters = Counters(io_concurrency=8, num_workers=2)
    counters.begin_epoch(0)
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        for _ in range(batches):
            time.sleep(0.004)
            counters.delivered(4, waited=0.003)
        counters.end_epoch()
    said = [r.getMessage() for r in caplog.records if "the trainer waited for data" in r.getMessage()]
    assert len(said) == warnings, said
