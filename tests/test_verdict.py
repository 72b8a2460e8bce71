"""Pure: the verdict over tables of stage figures (``aioloader.observe.bottleneck``): it judges
only the stages that run, names the loop or the reads when they limit, says so honestly when
no stage was busy, and advises for the machine. Also the loop's meter and how its figure
reaches the trainer. The same verdicts on real runs: test_verdict_runs.py."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import FakeClock, make_config

from aioloader import StageStats
from aioloader.base.threads import thread_cpu_clock
from aioloader.observe.bottleneck import NEAR, VERDICTS, Setup, diagnose
from aioloader.observe.loopmeter import LoopMeter
from aioloader.observe.stats import Counters


def stage(
    name: str, use: float, capacity: int = 1, busy: float | None = None, p50: float = 2.0
) -> StageStats:
    """A stage seen for 10 s at ``use`` of its ``capacity`` on average, in flight ``busy`` of
    the time (default: ``use``, as for one thread), ``p50`` ms per item."""
    busy = use if busy is None else busy
    return StageStats(
        name, 100, 10 * busy, 10.0, 0, 10 * use * capacity, 2 * capacity, capacity, p50_ms=p50, p99_ms=3 * p50
    )


#: A loader on the CPU whose trainer waits, every stage quiet: each case makes one busy.
QUIET = {
    "read": stage("read", 2 / 64, capacity=64, busy=0.3),
    "decode": stage("decode", 0.1, capacity=2),
    "collate": stage("collate", 0.05),
    "transfer": stage("transfer", 0.02),
    "loop": stage("loop", 0.25),
}
CPU = Setup()
NO_DECODE = Setup(decode=False)
CUDA = Setup(device="cuda", pin_memory=True)


def verdict(changes: dict[str, StageStats], setup: Setup, wait: float = 0.9) -> tuple[str, str]:
    found = diagnose({**QUIET, **changes}, wait, num_workers=2, io_concurrency=64, setup=setup)
    assert found.stage in VERDICTS
    return found.stage, found.advice


@pytest.mark.parametrize(
    ("changes", "setup", "expected", "says"),
    [
        ({}, CPU, "loop", "no stage ran near its capacity"),
        ({"read": stage("read", 1.0, capacity=64)}, CPU, "read", "64 of 64 reads in flight"),
        ({"read": stage("read", 0.2, capacity=64, busy=0.95)}, CPU, "read", "storage answers slowly"),
        (
            {"read": stage("read", 0.02, capacity=64, busy=0.95, p50=0.02)},
            NO_DECODE,
            "read",
            "small and many",
        ),
        ({"decode": stage("decode", 1.0, capacity=2)}, CPU, "decode", "2.0 decode chunks in flight for 2"),
        ({"collate": stage("collate", 0.9)}, CPU, "collate", "the collate thread was busy 90%"),
        ({"loop": stage("loop", 0.85)}, NO_DECODE, "loop", "the event loop's thread ran on a CPU 85%"),
        ({"transfer": stage("transfer", 0.9)}, CUDA, "transfer", "the transfer thread was busy 90%"),
    ],
    ids=[
        "idle",
        "read-full",
        "read-slow-storage",
        "read-small-files",
        "decode",
        "collate",
        "loop",
        "transfer",
    ],
)
def test_each_verdict_over_a_table(
    changes: dict[str, StageStats], setup: Setup, expected: str, says: str
) -> None:
    stage_name, advice = verdict(changes, setup)
    assert stage_name == expected and says in advice, advice
    assert "trainer waited 90%" in advice


def test_a_trainer_that_hardly_waits_is_named_whatever_the_stages() -> None:
    assert verdict({"decode": stage("decode", 1.0, capacity=2)}, CPU, wait=0.05)[0] == "trainer"


def test_without_a_device_transfer_is_never_named_nor_gpu_advice_given() -> None:
    """The issue's case: decode=None on the CPU, the trainer waiting 96%, a transfer thread
    busy 2%: the loop (here the busiest, at 25%) is named, not the transfer; and even a
    transfer figure near capacity is not judged where no copy runs."""
    for transfer in (stage("transfer", 0.02), stage("transfer", 0.99)):
        stage_name, advice = verdict({"transfer": transfer}, NO_DECODE, wait=0.96)
        assert stage_name == "loop", advice
        assert "transfer" not in advice and "pin" not in advice and "GPU" not in advice
    # decode advice names the GPU only where the loader has one
    assert "GPU" not in verdict({"decode": stage("decode", 1.0, capacity=2)}, CPU)[1]
    assert "work moved to the GPU" in verdict({"decode": stage("decode", 1.0, capacity=2)}, CUDA)[1]


def test_with_decode_none_decode_is_never_named() -> None:
    stage_name, advice = verdict({"decode": stage("decode", 1.0, capacity=2)}, NO_DECODE)
    assert stage_name == "loop" and "decode" not in advice


def test_no_stage_busy_names_no_idle_stage_and_shows_what_was_seen() -> None:
    stage_name, advice = verdict({}, CPU)
    assert stage_name == "loop"
    for seen in ("reads 2.0 of 64 reads in flight", "(30% of the time)", "the event loop on a CPU 25%"):
        assert seen in advice, advice
    assert "collate thread busy 5%" in advice and "transfer" not in advice  # on the CPU: not judged
    # where the loop is not measured, the reads are named, with the same honest figures
    unmeasured = {**QUIET, "loop": StageStats("loop")}
    found = diagnose(unmeasured, 0.9, num_workers=2, io_concurrency=64, setup=CPU)
    assert found.stage == "read" and found.advice.startswith("no stage ran near its capacity")


def test_a_stage_just_under_the_bar_is_not_called_busy() -> None:
    assert verdict({"collate": stage("collate", NEAR - 0.05)}, CPU)[0] == "loop"
    assert verdict({"collate": stage("collate", NEAR + 0.05)}, CPU)[0] == "collate"


@pytest.mark.parametrize(
    ("setup", "says", "never"),
    [
        (Setup(device="cuda", pin_memory=False), "or pin_memory=True", "decodes on the device"),
        (CUDA, "copy fewer bytes (uint8 rather than float32)", "pin_memory"),
        (
            Setup(device="cuda", pin_memory=True, bridge_decodes=True),
            "decode on the CPU workers",
            "pin_memory",
        ),
    ],
)
def test_transfer_advice_fits_the_machine(setup: Setup, says: str, never: str) -> None:
    stage_name, advice = verdict({"transfer": stage("transfer", 0.9)}, setup)
    assert stage_name == "transfer" and says in advice and never not in advice


def test_the_setup_of_a_loader_says_which_stages_run() -> None:
    plain = make_config(decode=None, device=None).setup(remote=False)
    assert (plain.decode, plain.device, plain.transfer) == (False, "cpu", False)
    decoding = make_config(decode=len, device="cpu").setup(remote=True)
    assert decoding.decode and decoding.remote and not decoding.transfer and not decoding.pin_memory


def test_the_loop_meter_is_the_loop_threads_cpu_share() -> None:
    clock, cpu = FakeClock(), FakeClock()
    meter = LoopMeter(clock=clock)
    assert not meter.bound and meter.snapshot().elapsed_seconds == 0  # not measured: not judged
    meter.bind(None)  # no per-thread CPU clock on this platform
    assert not meter.bound
    meter.bind(cpu)
    clock.advance(4.0)
    cpu.advance(3.0)
    snap = meter.snapshot()
    assert (snap.name, snap.busy_share, snap.elapsed_seconds) == ("loop", 0.75, 4.0)
    assert snap.mean_in_flight == 0.75  # so its utilization is its CPU share

    def gone() -> float:
        raise OSError("the thread ended")

    meter._cpu = gone  # the loop's thread is gone: its CPU time stops where it was
    clock.advance(4.0)
    assert meter.snapshot().busy_seconds == 3.0


def test_a_loader_processs_loop_figure_reaches_the_trainers_verdict() -> None:
    clock, cpu = FakeClock(), FakeClock()
    loader_side = Counters(8, 2, NO_DECODE, clock=clock)
    trainer = Counters(8, 2, NO_DECODE, clock=clock)
    assert "loop" not in loader_side.loader_side().stages  # nothing measured: nothing sent
    loader_side.loop.bind(cpu)
    trainer.begin_epoch(0)
    for _ in range(30):  # a batch every second, 0.9 s of it waited for, the loop on a CPU 95%
        clock.advance(1.0)
        cpu.advance(0.95)
        trainer.absorb(loader_side.loader_side())
        trainer.delivered(4, waited=0.9)
    stats = trainer.snapshot()
    assert stats.stages["loop"].busy_share == pytest.approx(0.95)
    assert stats.bottleneck is not None and stats.bottleneck.stage == "loop", stats.bottleneck


def test_a_threads_cpu_clock_counts_that_threads_cpu_time_only() -> None:
    done = threading.Event()
    burned = threading.Thread(target=lambda: _burn(done), daemon=True)
    burned.start()
    cpu = thread_cpu_clock(burned)
    assert cpu is not None and thread_cpu_clock(threading.Thread()) is None  # not started
    before = cpu()
    time.sleep(0.2)
    used = cpu() - before
    done.set()
    burned.join()
    assert 0 < used <= 0.3  # it burned while this thread slept


def _burn(done: threading.Event) -> None:
    while not done.is_set():
        sum(range(1000))
