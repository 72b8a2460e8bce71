"""``decode_on="ray"`` when tasks fail without an answer (aioloader/cluster/faults.py): a
worker that dies mid-task, a sample that kills every worker it meets, a decode past
``sample_timeout`` in Python (SIGALRM in the task) and stuck where SIGALRM cannot reach it
(the task cancelled with ``force=True``). Real Ray workers die here (``os._exit``); the
faults are keyed by sample number (faults.Fault), and "once" faults leave a marker file so
only the first attempt dies. A node removed mid-epoch is test_ray_nodes.py."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults import Fault
from frontends import Driver
from helpers import decode_number, flatten

from aioloader import DecodeError, LoaderTimeoutError

pytest.importorskip("ray")

from raykit import (  # after the skip: it imports ray
    cluster_cpus_free,  # noqa: F401 - autouse fixture
    local_loader,
    ray_instance,  # noqa: F401 - autouse fixture
    ray_loader,
)


def batches(frontend: Driver, loader: Any) -> list[list[int]]:
    with frontend.opened(loader):
        return [flatten([b]) for b in frontend.epoch(loader)]


@pytest.mark.slow
def test_a_worker_that_dies_mid_task_loses_and_duplicates_nothing(
    frontend: Driver, numbered: list[str], tmp_path: Path
) -> None:
    """Sample 13's first decode ends its worker process (``os._exit``): its chunk is split
    and sent again sample by sample; the epoch is the local one, batch for batch."""
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 1}
    dies = Fault("exit", {13}, once=True, marker_dir=str(tmp_path))
    got = batches(frontend, ray_loader(numbered, decode=dies, **kw))
    assert (tmp_path / "fired-13").exists()  # it did die
    assert got == batches(frontend, local_loader(numbered, decode=decode_number, **kw))


@pytest.mark.slow
def test_a_poison_sample_is_a_decode_error_and_skip_delivers_the_rest(
    frontend: Driver, numbered: list[str]
) -> None:
    """Sample 5 ends every worker that decodes it: charged twice alone, it is a DecodeError
    naming its file ("died, twice"); with on_error="skip" every other sample comes."""
    poison = Fault("exit", {5})
    loader = ray_loader(numbered, batch_size=4, decode=poison, shuffle=False)
    with frontend.opened(loader), pytest.raises(DecodeError, match="died, twice") as info:
        frontend.epoch(loader)
    assert info.value.path == numbered[5] and info.value.index == 5
    assert numbered[5] in str(info.value)
    loader = ray_loader(numbered, batch_size=4, decode=poison, shuffle=False, on_error="skip")
    with frontend.opened(loader):
        got = flatten(frontend.epoch(loader))
        stats = loader.stats
    assert got == [i for i in range(37) if i != 5]
    assert stats.failures_by_reason == {"DecodeError": 1}
    assert stats.last_failed_paths == (numbered[5],)


def test_a_decode_past_sample_timeout_is_a_timeout_naming_its_file(
    frontend: Driver, numbered: list[str]
) -> None:
    """Sample 6 sleeps for an hour: SIGALRM in the task stops it after sample_timeout; a
    LoaderTimeoutError names its file, and the worker lives on (skip delivers the rest)."""
    hangs = Fault("hang", {6}, seconds=3600)
    loader = ray_loader(numbered[:12], batch_size=4, decode=hangs, shuffle=False, sample_timeout=1)
    with frontend.opened(loader):
        it = frontend.iter(loader)
        assert flatten([frontend.next(it)]) == [0, 1, 2, 3]
        with pytest.raises(LoaderTimeoutError, match="sample_timeout") as info:
            frontend.next(it)
    assert info.value.path == numbered[6] and info.value.index == 6
    loader = ray_loader(
        numbered[:12], batch_size=4, decode=hangs, shuffle=False, sample_timeout=1, on_error="skip"
    )
    with frontend.opened(loader):
        assert flatten(frontend.epoch(loader)) == [i for i in range(12) if i != 6]
        assert loader.stats.failures_by_reason == {"LoaderTimeoutError": 1}


class StuckInC:
    """Decode numbered files; on ``n``, block SIGALRM and sleep: a decode stuck where the
    task's alarm cannot reach it, as C code holding the GIL would be. Only the loader's
    ``ray.cancel(force=True)`` (which kills the worker) ends it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, data: bytes) -> np.ndarray:
        value = decode_number(data)
        if int(value[0]) == self.n:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        return value


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_decode_stuck_past_sample_timeout_is_cancelled_and_a_timeout(
    frontend: Driver, numbered: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The task holding sample 2 cannot be interrupted: past sample_timeout x its samples +
    STUCK_GRACE the loader cancels it with force=True (a chunk of several would be split and
    sent again); sample 2 stuck alone is a LoaderTimeoutError naming its file, and the other
    samples come (skip)."""
    loader = ray_loader(
        numbered[:6], batch_size=2, decode=StuckInC(2), shuffle=False, sample_timeout=0.5, on_error="skip"
    )
    with frontend.opened(loader):
        assert flatten(frontend.epoch(loader)) == [0, 1, 3, 4, 5]
        stats = loader.stats
    assert stats.failures_by_reason == {"LoaderTimeoutError": 1}
    assert stats.last_failed_paths == (numbered[2],)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped ")]
    assert said == [
        "skipped decode took longer than sample_timeout=0.5s and its Ray task was cancelled "
        f"(sample 2: {numbered[2]!r})"
    ]
