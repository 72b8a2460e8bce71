"""The verdict on real runs, one per limit (issue 41): decode-bound (a decode that burns CPU,
one worker), read-bound (storage that answers slowly), trainer-bound (a train step that
sleeps), and many small files with ``decode=None``, whose limit is the reads or the loop,
never the transfer: none runs on the CPU. Each in both runtimes; every case has a wide
margin (a stage at its capacity, or none near it), so a loaded machine moves the figures
but not the verdict. The pure rule over tables: test_verdict.py."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest
from faults import SlowRead
from helpers import RuntimeWatch, decode_number

from aioloader import Loader


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    """Both runtimes (the test fails when a loader ran in the other one: ``runtimes``)."""
    runtimes.expect(bool(request.param))
    return bool(request.param)


@pytest.fixture(scope="module")
def small_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """3,000 files of 4 KB: the small-file case, read far faster than any stage's capacity."""
    folder = tmp_path_factory.mktemp("small")
    paths = []
    for i in range(3000):
        p = folder / f"{i:05d}.bin"
        p.write_bytes(i.to_bytes(4, "little") * 1024)
        paths.append(os.fspath(p))
    return paths


def burn_decode(data: bytes) -> np.ndarray:
    """Decode a numbered file after about 20 ms of CPU work (a decoder that computes)."""
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        sum(range(200))
    return decode_number(data)


def verdict_of(paths: list[str], step: float = 0.0, **kw: Any) -> tuple[str, str, Any]:
    """``(stage, advice, stats)`` after one epoch with a train step of ``step`` seconds."""
    opts: dict[str, Any] = {"batch_size": 2, "decode": decode_number, "num_workers": 1, "shuffle": False}
    with Loader(paths, **{**opts, **kw}) as loader:
        for _ in loader:
            if step:  # not even sleep(0): it gives the GIL up, and the wait to get it back is not counted
                time.sleep(step)
        stats = loader.stats
    assert stats.bottleneck is not None, stats
    advice = stats.bottleneck.advice
    # On the CPU: no transfer stage, and no advice for a GPU the loader does not use.
    assert stats.bottleneck.stage != "transfer" and "pin_memory" not in advice and "GPU" not in advice
    return stats.bottleneck.stage, advice, stats


def test_a_decode_that_burns_cpu_is_named(numbered: list[str], process: bool) -> None:
    stage, advice, stats = verdict_of(numbered * 2, decode=burn_decode, loader_process=process)
    assert stage == "decode", (advice, stats.stages)
    assert "for 1 worker" in advice and "raise num_workers" in advice


def test_slow_storage_is_named(numbered: list[str], process: bool) -> None:
    """Every read takes 30 ms, 8 at once: 300 samples take over a second of reading, and
    the decode of a number next to nothing."""
    stage, advice, stats = verdict_of(
        numbered * 8, read=SlowRead(None, seconds=0.03), io_concurrency=8, loader_process=process
    )
    assert stage == "read", (advice, stats.stages)
    assert "of 8 reads in flight" in advice


def test_a_slow_train_step_is_named(numbered: list[str], process: bool) -> None:
    stage, advice, _ = verdict_of(numbered * 2, step=0.05, decode=None, loader_process=process)
    assert stage == "trainer" and "the loader keeps up" in advice


def test_small_files_without_decode_name_the_reads_or_the_loop(small_files: list[str], process: bool) -> None:
    """The issue's case: ``decode=None``, 4 KB files, a trainer that does nothing. Neither
    decode (there is none) nor transfer (no device) is named, and the advice shows the
    figure it judged: reads in flight, or the loop's CPU share, or that no stage was busy."""
    stage, advice, stats = verdict_of(small_files, batch_size=32, decode=None, loader_process=process)
    assert stats.recent_wait_share is not None and stats.recent_wait_share > 0.5
    assert stage in {"read", "loop"}, (advice, stats.stages)
    assert "decode" not in advice
    assert stats.stages["loop"].busy_seconds > 0  # the loop was measured, where it ran
    assert any(seen in advice for seen in ("in flight", "event loop", "no stage ran near")), advice


def test_the_loop_figure_is_reported_where_it_runs(numbered: list[str], process: bool) -> None:
    """``loader.stats.stages["loop"]``: the loop thread's CPU share, a loader process's too."""
    _, _, stats = verdict_of(numbered, decode=None, loader_process=process)
    loop = stats.stages["loop"]
    assert loop.name == "loop" and loop.elapsed_seconds > 0 and 0 < loop.busy_share <= 1
