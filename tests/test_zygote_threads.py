"""The zygote and a multi-threaded trainer (a CUDA context, PyTorch's intra-op pool,
OpenBLAS's): it is forked only where the trainer forks as a process of one OS thread
(OpenBLAS stops its own threads before a fork), and otherwise started as a fresh interpreter
that preloads what the helpers import, so a trainer never forks while another of its threads
could hold a lock. Scripts run in their own session; what they leave behind is found with
pgrep."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import finish_script, process_name, session_survivors, start_script

from aioloader.procs import cleanstart, zygote

TRAIN = """
import os
import torch

def tasks():
    return len(os.listdir("/proc/self/task"))

if {make_threads}:
    before = tasks()
    torch.set_num_threads(2)
    torch.ones(4_000_000).add_(1)  # a parallel op: PyTorch's intra-op (OpenMP) threads now exist
    assert tasks() > before > 0, (before, tasks())
threads = tasks()

# The trainer must never fork while it has another thread (a lock held by that thread would
# be copied held): here that is an error, whoever forks. As Python 3.12 does for its
# warning, the threads are counted as the fork left them (OpenBLAS stops its own for it).
_fork = os.fork
def checked_fork():
    pid = _fork()
    if pid != 0:
        assert tasks() == 1, f"os.fork() in a process with {{tasks()}} OS threads"
    return pid
os.fork = checked_fork

import aioloader
from aioloader.procs import zygote

if __name__ == "__main__":
    ds = aioloader.FileDataset.from_folder({folder!r})
    with aioloader.Loader(ds, batch_size=8, decode=aioloader.ImageDecoder(32), shuffle=False) as loader:
        labels = []
        for images, y in loader:
            assert tuple(images.shape) == (len(y), 3, 32, 32) and images.dtype == torch.uint8, images.shape
            labels += y.tolist()
        assert labels == ds.labels.tolist(), labels
        assert loader.runtime == "process", loader.runtime
        zpid = zygote.pid()
        with open(f"/proc/{{zpid}}/comm") as f:
            comm = f.read().strip()
        zygote_tasks = len(os.listdir(f"/proc/{{zpid}}/task"))
        print("OK", zygote.started_by(), threads, comm, zygote_tasks, flush=True)
"""


def test_how_to_start_forks_only_a_process_with_one_os_thread() -> None:
    assert cleanstart.how_to_start(1, 1, False) == "fork"
    assert cleanstart.how_to_start(2, 1, False) == "spawn"  # a C library's thread (OpenMP, OpenBLAS)
    assert cleanstart.how_to_start(5, 3, True) == "spawn"
    assert cleanstart.how_to_start(1, 1, True) == "fork"  # counted: the context made no thread
    # Where OS threads cannot be counted: Python's own threads and torch's CUDA context.
    # OpenBLAS's server threads are stopped by OpenBLAS before the fork: one thread is left.
    assert cleanstart.how_to_start(3, 1, False, stopped_at_fork=2) == "fork"
    assert cleanstart.how_to_start(4, 1, False, stopped_at_fork=2) == "spawn"  # and one more
    assert cleanstart.how_to_start(3, 2, False, stopped_at_fork=2) == "spawn"  # a Python thread
    assert cleanstart.how_to_start(None, 1, False) == "fork"
    assert cleanstart.how_to_start(None, 2, False) == "spawn"
    assert cleanstart.how_to_start(None, 1, True) == "spawn"


def test_the_clean_zygote_preloads_the_helpers_imports_and_torch_when_imported() -> None:
    modules = cleanstart.preloads()
    for name in ("aioloader.run.loaderproc", "aioloader.decode.worker", "numpy", "PIL.Image", "torch"):
        assert name in modules
    assert "torch" in sys.modules  # conftest imports it: the trainer has it, so the zygote does


def _uses_numpy(data: bytes) -> object:
    return np.frombuffer(data, dtype=np.uint8).sum()


class _Callable:
    def __call__(self, data: bytes) -> object:
        return data


def test_a_clean_zygote_also_imports_what_the_loaders_callables_need() -> None:
    """Their own module (a callable object's class's), and the modules their code names,
    never ``__main__`` (sent by value): imported once in the zygote, not in every worker."""
    found = cleanstart.modules_of(_uses_numpy, _Callable(), None, len)
    assert found[0] == __name__ and "numpy" in found
    assert found.count(__name__) == 1 and "builtins" not in found
    assert cleanstart.preloads(["numpy", "json"])[-1] == "json"  # once each, helpers' first


def test_this_process_started_its_zygote_as_the_rule_says() -> None:
    """pytest's process has imported torch and numpy (OpenBLAS's threads) before conftest
    started the zygote: forked where OpenBLAS's were its only other threads."""
    zpid = zygote.pid()
    assert zpid is not None and zygote.started_by() in ("fork", "spawn")
    deadline = time.monotonic() + 60  # a hang guard: it names itself once its interpreter runs
    while process_name(zpid) != "aioloader-fork":
        assert time.monotonic() < deadline, process_name(zpid)
        time.sleep(0.01)
    assert len(list(Path(f"/proc/{zpid}/task").iterdir())) == 1


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("make_threads", "env", "started"),
    [
        (True, {}, "spawn"),
        # One OpenBLAS thread: numpy starts no pool, and torch, imported, makes no thread.
        (False, {"OPENBLAS_NUM_THREADS": "1"}, "fork"),
        # OpenBLAS's pool of 2: its threads stop for the fork, which copies one thread.
        (False, {"OPENBLAS_NUM_THREADS": "2"}, "fork"),
    ],
    ids=["multi-threaded", "single-threaded", "openblas-threads"],
)
def test_a_trainer_never_forks_while_multi_threaded(
    image_folder: Path, tmp_path: Path, make_threads: bool, env: dict[str, str], started: str
) -> None:
    """A trainer whose intra-op threads exist (run with ``-W error::DeprecationWarning``,
    Python 3.12's fork warning an error, and any ``os.fork()`` with another thread an error)
    loads an epoch of JPEGs in a loader process whose zygote started clean, named
    ``aioloader-fork`` and single-threaded; a single-threaded trainer still forks it."""
    script = TRAIN.format(make_threads=make_threads, folder=str(image_folder))
    args = ["-W", "error::DeprecationWarning", "train.py"]
    proc = start_script(tmp_path / "train.py", script, args=args, cwd=tmp_path, env=env)
    out, err = finish_script(proc, timeout=150)
    assert proc.returncode == 0, err
    ok, how, threads, comm, zygote_tasks = out.split()
    assert (ok, how, comm, zygote_tasks) == ("OK", started, "aioloader-fork", "1"), out
    assert (int(threads) > 1) == (make_threads or env.get("OPENBLAS_NUM_THREADS") == "2")
    assert session_survivors(proc.pid) == []
