"""``io_concurrency="auto"`` and ``num_workers="auto"`` on real loaders, in both runtimes: the
limits move while loading, and the batches, their order and resume points stay exactly
those of fixed settings."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import RuntimeWatch, decode_number, flatten, write_numbered_files

from aioloader import Loader
from aioloader.config import AUTO_IO_START, usable_cpus


@pytest.fixture(params=[False, True], ids=["thread", "process"])
def process(request: pytest.FixtureRequest, runtimes: RuntimeWatch) -> bool:
    """Both runtimes; a loader given ``loader_process=process`` that ran in the other one
    fails the test (``runtimes``, conftest.py). Fixed settings run in-process to compare."""
    runtimes.expect(bool(request.param), in_process_too=True)
    return bool(request.param)


class JitterRead:
    """Reads a file after 10-50 ms, the same for a path every time (storage far away)."""

    def __call__(self, path: str) -> bytes:
        time.sleep(0.010 + hashlib.md5(path.encode()).digest()[0] / 255 * 0.040)
        with open(path, "rb") as f:
            return f.read()


OPTS: dict[str, Any] = {"batch_size": 16, "decode": decode_number, "shuffle": True, "seed": 3}


def fixed_epochs(paths: list[str], epochs: list[int]) -> list[list[int]]:
    """The samples of ``epochs`` with small fixed settings and no delay."""
    with Loader(paths, io_concurrency=4, num_workers=1, loader_process=False, **OPTS) as loader:
        out = []
        for epoch in epochs:
            loader.set_epoch(epoch)
            out.append(flatten(list(loader)))
        return out


def test_auto_reads_grow_behind_slow_storage_and_batches_do_not_change(
    tmp_path: Path, process: bool, caplog: pytest.LogCaptureFixture
) -> None:
    paths = write_numbered_files(tmp_path / "files", 1500)
    caplog.set_level(logging.DEBUG, logger="aioloader")
    with Loader(paths, read=JitterRead(), loader_process=process, **OPTS) as loader:
        assert loader.config.reading.io_auto and loader.config.reading.io_start == AUTO_IO_START
        got = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            got.append(flatten(list(loader)))
        stats = loader.stats
    # 64 reads of 30 ms on average feed 2,100 samples/s, far less than decode_number takes
    moves = [r.getMessage() for r in caplog.records if "io_concurrency auto" in r.getMessage()]
    assert moves and moves[0].startswith(f"io_concurrency auto: {AUTO_IO_START} -> ")
    assert stats.io_concurrency > AUTO_IO_START
    assert stats.stages["read"].bound == stats.io_concurrency
    assert got == fixed_epochs(paths, [0, 1, 2])
    assert all(sorted(epoch) == list(range(1500)) for epoch in got)


def test_a_state_taken_after_the_limits_moved_resumes_exactly(tmp_path: Path, process: bool) -> None:
    paths = write_numbered_files(tmp_path / "files", 1500)
    auto: dict[str, Any] = {"read": JitterRead(), "num_workers": "auto", "loader_process": process, **OPTS}
    with Loader(paths, **auto) as loader:
        list(loader)  # epoch 0: the tuner moves the read limit
        loader.set_epoch(1)
        it = iter(loader)
        head = [next(it) for _ in range(40)]
        assert loader.stats.io_concurrency != AUTO_IO_START
        state = loader.state_dict()
    with Loader(paths, **auto) as resumed:
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        rest = list(resumed)
    assert flatten(head) + flatten(rest) == fixed_epochs(paths, [1])[0]


class Spin:
    """A train step of ``seconds`` of pure-Python CPU (the GIL held throughout)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self) -> None:
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass


@pytest.mark.skipif(usable_cpus() < 2, reason="one usable CPU: 'auto' keeps its one decoder")
def test_auto_workers_leave_a_cpu_to_a_trainer_that_uses_one(tmp_path: Path, process: bool) -> None:
    paths = write_numbered_files(tmp_path / "files", 4000)
    step = Spin(0.015)
    opts = {**OPTS, "batch_size": 8, "shuffle": False}
    with Loader(paths, num_workers="auto", io_concurrency=8, loader_process=process, **opts) as loader:
        assert loader.stats.num_workers == loader.config.build.workers == usable_cpus()
        seen: list[int] = []
        changed_at = None
        for batch in loader:
            seen.extend(batch.flatten().tolist())
            if changed_at is None:  # the trainer's process uses one CPU until the decoders move
                step()
                if loader.stats.num_workers < usable_cpus():
                    changed_at = len(seen)
        stats = loader.stats
    assert changed_at is not None, "the decoders never left the trainer a CPU"
    assert 1 <= stats.num_workers < usable_cpus()
    assert stats.stages["decode"].capacity == stats.num_workers
    assert seen == list(range(4000))  # in order, none lost or repeated across the change
