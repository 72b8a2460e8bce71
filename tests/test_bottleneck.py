"""``loader.stats.stages`` and ``loader.stats.bottleneck`` on real loaders, in four
constructed cases: slow reads, slow decode, slow collate, slow trainer; and the WARNING
when the trainer waits, once per epoch and stage. Each case runs in both runtimes (the
stages of a loader process reach the trainer's stats with every batch)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
from faults import SlowRead
from helpers import RuntimeWatch, SlowDecode, decode_number

from aioloader import Loader
from aioloader.observe.stats import WINDOW


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    """Both runtimes (the test fails when a loader ran in the other one: ``runtimes``)."""
    runtimes.expect(bool(request.param))
    return bool(request.param)


class SlowCollate:
    """Stacks the batch after sleeping ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, samples: list[Any]) -> Any:
        time.sleep(self.seconds)
        return np.stack(samples)


def epoch_stats(paths: list[str], step: float = 0.0, **kw: Any) -> Any:
    """One epoch with a train step of ``step`` seconds per batch; the stats after it."""
    opts: dict[str, Any] = {"batch_size": 2, "decode": decode_number, "num_workers": 1, "shuffle": False}
    with Loader(paths, **{**opts, **kw}) as loader:
        for _ in loader:
            time.sleep(step)
        return loader.stats


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ({"read": SlowRead(None, seconds=0.03), "io_concurrency": 2}, "read"),
        ({"decode": SlowDecode(0.03)}, "decode"),
        ({"collate": SlowCollate(0.05)}, "collate"),
        ({"step": 0.05}, "trainer"),
    ],
    ids=["slow-read", "slow-decode", "slow-collate", "slow-trainer"],
)
def test_the_bottleneck_names_the_slow_stage(
    numbered: list[str], process: bool, case: dict[str, Any], expected: str
) -> None:
    stats = epoch_stats(numbered * 2, loader_process=process, **case)
    verdict = stats.bottleneck
    assert verdict is not None, stats
    assert verdict.stage == expected, (str(verdict), stats.stages)
    assert str(verdict).startswith(f"{expected}: ") and verdict.advice
    # the share the stats report is the one the verdict judged (its thresholds: test_stages.py)
    assert stats.recent_wait_share is not None
    assert f"waited for data {stats.recent_wait_share:.0%} " in verdict.advice or (
        f"trainer waited {stats.recent_wait_share:.0%} " in verdict.advice
    )


def test_stages_report_items_bounds_and_latencies(numbered: list[str], process: bool) -> None:
    stats = epoch_stats(
        numbered, decode=SlowDecode(0.01), io_concurrency=8, num_workers=2, loader_process=process
    )
    stages = stats.stages
    assert set(stages) == {"read", "decode", "collate", "transfer", "loop"}
    read, decode = stages["read"], stages["decode"]
    assert read.bound == 8 and decode.bound == 4 and decode.capacity == 2
    assert read.items == decode.items == len(numbered)  # samples
    assert stages["collate"].items == stages["transfer"].items == 19  # one per batch of 2
    assert decode.p50_ms is not None and decode.p99_ms is not None
    assert decode.p50_ms <= decode.p99_ms  # per sample (exact figures: test_stages.py)
    assert read.mean_in_flight <= 8 and decode.mean_in_flight <= 4  # within their bounds
    assert all(s.in_flight == 0 for s in stages.values())  # the epoch is over
    assert 0 < decode.busy_share <= 1 and decode.busy_seconds > 0


def test_a_waiting_trainer_gets_one_warning_per_epoch_and_stage(
    numbered: list[str], process: bool, caplog: pytest.LogCaptureFixture
) -> None:
    paths = numbered * 6  # 222 samples: 111 batches of 2, judged at 50 and 100
    assert len(paths) // 2 >= 2 * WINDOW
    with (
        caplog.at_level(logging.WARNING, logger="aioloader"),
        Loader(paths, batch_size=2, decode=SlowDecode(0.01), num_workers=1, loader_process=process) as loader,
    ):
        for _ in range(2):
            for _ in loader:
                pass
    warnings = [r for r in caplog.records if "the trainer waited for data" in r.getMessage()]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]  # one per epoch
    assert all("bottleneck: decode: " in r.getMessage() for r in warnings)


def test_a_fast_loader_does_not_warn(numbered: list[str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="aioloader"):
        stats = epoch_stats(numbered * 3, step=0.02)
    assert stats.bottleneck is not None and stats.bottleneck.stage == "trainer"
    assert not [r for r in caplog.records if "the trainer waited" in r.getMessage()]
