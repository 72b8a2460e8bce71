"""The hybrid share steered by what the trainer sees (issue 40, item 5): the pure rule
(aioloader/decode/hybrid.py), the trainer's wait meter (aioloader/observe/trainerwait.py), the
device decode's stage reading both, the reason in ``stats.device_decode``, and a real loader
on the CPU device path in both runtimes (the wait crosses the back pipe from the trainer to a
loader process)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import aioloader
from aioloader import FileDataset, Loader
from aioloader.decode.hybrid import HybridShare, steer
from aioloader.decode.ondevice.loaderside import DeviceDecodeStage
from aioloader.observe.stages import StageMeter
from aioloader.observe.stats import Counters
from aioloader.observe.trainerwait import TrainerWait, wait_share
from aioloader.synthetic import make_image_folder

RUNTIMES = pytest.mark.parametrize("loader_process", [False, True], ids=["thread", "process"])

# (share before, workers' utilization, trainer's wait share, share after, words in the reason)
RULE = [
    # Unknown wait: the workers' utilization alone, as before the trainer's wait was known.
    (0.2, 0.5, None, 0.25, "wait unknown, workers busy 50%: the workers take more"),
    (0.2, 0.9, None, 0.2, "the share holds at 20%"),
    (0.2, 0.99, None, 0.15, "the GPU takes more, share 15%"),
    # The trainer waits (loading is the limit): the share settles where the workers are busy.
    (0.4, 0.99, 0.31, 0.35, "trainer waited 31%, workers busy 99%: the GPU takes more, share 35%"),
    (0.4, 0.5, 0.31, 0.45, "trainer waited 31%, workers busy 50%: the workers take more"),
    (0.4, 0.9, 0.5, 0.4, "trainer waited 50%, workers busy 90%: the share holds"),
    (0.0, 1.0, 1.0, 0.0, "the GPU already takes all"),
    # The trainer does not wait (the GPU is the limit): work moves off it while cores are free.
    (0.4, 0.9, 0.02, 0.45, "trainer did not wait (2%), workers busy 90%: the workers take more"),
    (0.4, 0.5, 0.0, 0.45, "did not wait (0%)"),
    (0.4, 0.99, 0.05, 0.4, "workers busy 99%: the share holds at 40%"),
    (0.9, 0.1, 0.0, 0.9, "the share stays at its most, 90%"),
    (0.88, 0.1, 0.1, 0.9, "did not wait (10%)"),  # the threshold itself is not waiting
]


@pytest.mark.parametrize(("before", "u", "w", "after", "words"), RULE)
def test_the_rule(before: float, u: float, w: float | None, after: float, words: str) -> None:
    decision = steer(before, u, w)
    assert decision.share == pytest.approx(after)
    assert words in decision.reason
    assert 0.0 <= decision.share <= 0.9


def test_the_share_observes_the_wait() -> None:
    share = HybridShare(step=0.1, interval=1.0, share=0.5)
    assert share.reason == ""
    assert share.observe(1.0, 1.0, 0.4) == pytest.approx(0.4)
    assert share.reason.startswith("trainer waited 40%, workers busy 100%")
    assert share.observe(0.9, 2.0, 0.0) == pytest.approx(0.5)
    assert "did not wait" in share.reason


def test_the_wait_share_between_two_readings() -> None:
    meter = TrainerWait()
    before = meter.totals()
    assert before == (0.0, 0)
    assert wait_share(before, meter.totals(), 1.0) is None  # no batch: not known
    meter.delivered(0.25)
    meter.delivered(0.05)
    assert wait_share(before, meter.totals(), 2.0) == pytest.approx(0.15)
    assert wait_share(before, meter.totals(), 0.0) is None
    assert wait_share(before, meter.totals(), 0.1) == 1.0  # a wait begun before the span
    meter.set_totals(7.5, 40)  # a loader process's meter, from the back pipe
    assert meter.totals() == (7.5, 40)


def test_counters_feed_the_meter() -> None:
    counters = Counters()
    counters.delivered(8, 0.5)
    counters.delivered(8, 0.25)
    assert counters.trainer_wait.totals() == (0.75, 2)


class _Inner:
    """What DeviceDecodeStage reads of the pool's stage when nothing is decoded."""

    chunk = 4
    probes = 1
    samples_in_flight = 8
    active = 2


def test_the_stage_steers_by_the_trainers_wait() -> None:
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    meter = StageMeter("decode", bound=4, capacity=2, clock=clock)
    wait = TrainerWait()
    seen: list[tuple[float, str]] = []
    stage = DeviceDecodeStage(
        _Inner(),  # type: ignore[arg-type]
        aioloader.ImageDecoder(40, device="cpu"),
        seed=0,
        path_of=str,
        meter=meter,
        report=lambda cpu, reasons, share, why: seen.append((share, why)),
        share=HybridShare(step=0.1, interval=1.0, share=0.5),
        wait=wait,
        clock=clock,
    )
    stage._adjust()  # starts both clocks
    entered = meter.enter(2)  # both workers busy from now on
    now[0] = 1.0
    wait.delivered(0.5)
    stage._adjust()  # data-bound, workers saturated: the GPU takes more
    assert stage.share.share == pytest.approx(0.4)
    assert stage.share.reason.startswith("trainer waited 50%, workers busy 100%: the GPU takes more")
    now[0] = 2.0
    meter.leave(entered, 2)  # idle from now on
    wait.delivered(0.0)
    stage._adjust()  # the GPU is the limit, the workers saturated: hold
    assert stage.share.share == pytest.approx(0.4)
    assert "did not wait (0%), workers busy 100%: the share holds" in stage.share.reason
    now[0] = 3.0
    wait.delivered(0.01)
    stage._adjust()  # the workers idle: they take more off the GPU
    assert stage.share.share == pytest.approx(0.5)
    assert stage.share.reason.startswith("trainer did not wait (1%), workers busy 0%: the workers take more")
    now[0] = 4.0
    stage._adjust()  # no batch since (a long train step): the latest wait measured stands
    assert stage.share.share == pytest.approx(0.6)
    assert "did not wait (1%)" in stage.share.reason


def test_the_reason_crosses_to_the_trainers_stats() -> None:
    loader_side, trainer = Counters(), Counters()
    loader_side.device_loader_side(3, {"not a JPEG": 1}, 0.25, "trainer did not wait (2%)")
    trainer.device_decoded(gpu=5, seconds=0.1, failed=1)
    trainer.absorb(loader_side.loader_side())
    dd = trainer.snapshot().device_decode
    assert dd is not None
    assert (dd.cpu, dd.gpu, dd.share, dd.share_reason) == (3, 5, 0.25, "trainer did not wait (2%)")
    assert dd.fallbacks == {"not a JPEG": 1, "device decode failed": 1}


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small JPEGs, enough for 48 batches of 2 per epoch: the wait at an epoch's start is a
    small part of it."""
    return make_image_folder(tmp_path_factory.mktemp("hybrid"), num_images=96, num_classes=2, size=(40, 30))


@RUNTIMES
def test_a_trainer_bound_loader_moves_decode_to_the_workers(many: Path, loader_process: bool) -> None:
    """A trainer whose step takes longer than loading a batch waits for none (only the
    first batches of an epoch may): the share grows off the device, and says why. Epochs go
    on until a decision judged by the trainer's wait shows (at most 20)."""
    decoder = aioloader.ImageDecoder(24, device="cpu")
    ds = FileDataset.from_folder(many)
    kw: dict[str, Any] = {"num_workers": 2, "device": "cpu", "loader_process": loader_process}
    with Loader(ds, batch_size=2, decode=decoder, **kw) as loader:
        for epoch in range(20):
            loader.set_epoch(epoch)
            _train(loader, step=0.02)
            dd = loader.stats.device_decode
            assert dd is not None
            if dd.share > 0 and "did not wait" in dd.share_reason:
                break
    assert dd is not None and dd.share > 0
    assert "trainer did not wait" in dd.share_reason and "the workers take more" in dd.share_reason


def _train(loader: Loader, step: float) -> None:
    """One epoch of a train step of ``step`` seconds (no batch outlives the call)."""
    for _ in loader:
        time.sleep(step)
