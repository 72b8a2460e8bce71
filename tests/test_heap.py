"""Memory that the first, pickled batches leave in malloc's arenas is given back once the
batches fit the slabs (aioloader/base/heap.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import numpy as np
import pytest

from aioloader import Loader
from aioloader.base.heap import BurstTrim

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def test_a_burst_is_trimmed_once_when_it_ends() -> None:
    t = BurstTrim()
    assert [t.saw(x) for x in (False, True, True, True, False, False)] == [False] * 4 + [True, False]
    assert t.trims == 1
    assert [t.saw(x) for x in (True, False)] == [False, True]  # a new layout, a new burst
    assert t.trims == 2


def test_a_stream_that_stays_large_never_trims() -> None:
    t = BurstTrim()
    assert not any(t.saw(True) for _ in range(100))
    assert t.trims == 0


#: Run in a fresh interpreter: what glibc keeps depends on the process's malloc history (its
#: mmap threshold, its arenas), which the tests run before would otherwise decide.
_CHURN = """
import threading
import numpy as np
from aioloader.base import heap

def private_dirty_kib():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))

pinned = []

def churn():
    # A large block first: freeing it raises glibc's mmap threshold to its size (a block
    # above 32 MiB would not), so the 150 KB blocks that follow come from this thread's
    # arena, as a batch's samples do.
    big = np.ones(16 << 20, dtype=np.uint8)
    del big
    blocks = [np.ones(150_528, dtype=np.uint8) for _ in range(256)]  # 37 MiB
    # A block made after them stays: the freed ones are below the arena's top, as with a
    # loader's live objects, so glibc does not give them back by itself.
    pinned.append(np.ones(65_536, dtype=np.uint8))
    del blocks

t = threading.Thread(target=churn)
t.start()
t.join()
before = private_dirty_kib()
trimmed = heap.trim()
print(before, private_dirty_kib(), trimmed)
"""


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_trim_gives_back_what_a_thread_freed() -> None:
    """What glibc keeps after a thread frees many mid-sized blocks (the shape of a pickled
    batch's samples) leaves the process's dirty memory with one trim."""
    out = subprocess.run(
        [sys.executable, "-c", _CHURN], capture_output=True, text=True, timeout=60, check=True
    )
    before, after, trimmed = out.stdout.split()
    assert trimmed == "True"
    assert int(before) - int(after) > 16 << 10, (before, after)


def _image(data: bytes) -> np.ndarray:
    """150 KB per sample: a batch of 8 crosses pickled as more than 1 MiB."""
    return np.full((3, 224, 224), data[0], dtype=np.uint8)


def _name(data: bytes) -> str:
    return data.decode()


_first_call = {"failed": False}


def _image_but_a_workers_first(data: bytes) -> np.ndarray:
    """:func:`_image`, except that each worker process's first call raises (the dictionary
    goes to each worker by value): the first batch's probe sample fails, so the rest of that
    batch decodes before the layout is known and crosses pickled, as the learning batches
    did before there was a probe (aioloader/engine/epoch.py)."""
    if not _first_call["failed"]:
        _first_call["failed"] = True
        raise ValueError("a worker's first sample")
    return _image(data)


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_the_learning_batches_are_trimmed_once(numbered: list[str], process: bool, runtimes) -> None:  # type: ignore[no-untyped-def]
    runtimes.expect(process)
    # collate=list: the first batch's samples (150 KB each, below the size that would cross
    # through a segment of its own, aioloader/run/wire.py) reach the trainer pickled.
    with Loader(
        numbered,
        batch_size=8,
        decode=_image_but_a_workers_first,
        collate=list,
        num_workers=1,
        on_error="skip",
        loader_process=process,
    ) as loader:
        assert sum(len(b) for b in loader) == len(numbered) - 1  # the probe's sample failed
        assert sum(len(b) for b in loader) == len(numbered)
        rt = loader._runtime
        if process:
            assert rt.channel._trim.trims == 1  # the trainer's side: pickled batches, then slab refs
        else:
            assert rt.engine._trim.trims == 1  # the loop's side: pickled samples, then rows


def test_a_probe_that_teaches_the_layout_leaves_no_burst_to_trim(numbered: list[str]) -> None:
    """The first batch's probe sample teaches the layout: the rest of the batch goes into
    rows, only that one sample crosses pickled, and there is nothing to give back."""
    with Loader(numbered, batch_size=8, decode=_image, num_workers=2, loader_process=False) as loader:
        assert sum(len(b) for b in loader) == len(numbered)
        assert loader._runtime.engine._trim.trims == 0


def test_samples_that_are_never_arrays_never_trim(numbered: list[str]) -> None:
    with Loader(numbered, batch_size=8, decode=_name, num_workers=1, loader_process=False) as loader:
        assert sorted(x for b in loader for x in b) == sorted(f"sample-{i:06d}" for i in range(len(numbered)))
        assert loader._runtime.engine._trim.trims == 0
