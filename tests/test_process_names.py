"""The loader's helper processes say what they are in ``/proc/<pid>/comm``, what ``ps``,
``top`` and ``htop`` show (DESIGN.md, "Processes say what they are"), each name whole within
the kernel's 15 bytes: the zygote ``aioloader-fork``, the loader process ``aioloader-loop``,
every decode worker ``aioloader-work``, every reader process ``aioloader-read``. Everything
is read from the outside, through /proc and ``ps``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import RuntimeWatch, decode_number, descendants, finish_script, flatten, start_script

from aioloader import Loader
from aioloader.procs import zygote

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process names are Linux's")

# What /proc/<pid>/comm holds: written out, not taken from the package, so a renamed or
# lengthened name fails here.
ZYGOTE, WORKER, LOADER, READER = "aioloader-fork", "aioloader-work", "aioloader-loop", "aioloader-read"


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().rstrip("\n")


def settled_names(expected: list[str], seconds: float = 10.0) -> dict[int, str]:
    """``{pid: comm}`` of this process's helpers, once they are the ``expected`` names (a
    worker forked a moment ago is still called what its parent was until it has started),
    or whatever they are after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        names = {}
        for pid in descendants():
            try:
                names[pid] = comm(pid)
            except OSError:  # gone meanwhile
                continue
        if sorted(names.values()) == sorted(expected) or time.monotonic() > deadline:
            return names
        time.sleep(0.05)


def test_the_zygote_is_named() -> None:
    pid = zygote.pid()
    assert pid is not None  # conftest starts it before the first test
    assert comm(pid) == ZYGOTE


@pytest.mark.skipif(shutil.which("ps") is None, reason="no ps on this machine")
def test_ps_shows_the_name() -> None:
    """What users look at: ``ps`` reads the same name."""
    out = subprocess.run(
        ["ps", "-o", "comm=", "-p", str(zygote.pid())], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ZYGOTE


@pytest.mark.parametrize("loader_process", [False, True], ids=["thread", "process"])
def test_workers_and_the_loader_process_are_named(
    numbered: list[str], loader_process: bool, runtimes: RuntimeWatch
) -> None:
    runtimes.expect(loader_process)
    expected = [WORKER] * 2 + ([LOADER] if loader_process else [])
    kw = {"decode": decode_number, "num_workers": 2, "shuffle": False, "loader_process": loader_process}
    with Loader(numbered, batch_size=5, **kw) as loader:
        assert flatten(list(loader)) == list(range(37))
        names = settled_names(expected)
    assert sorted(names.values()) == sorted(expected), names
    # The zygote forks every one of them (the loader process's workers too, at its request).
    assert comm(zygote.pid() or 0) == ZYGOTE


@pytest.mark.skipif(shutil.which("pgrep") is None, reason="no pgrep on this machine")
@pytest.mark.parametrize("loader_process", [False, True], ids=["thread", "process"])
def test_pgrep_aioloader_finds_them_all(numbered: list[str], loader_process: bool) -> None:
    """docs/guides/environments.md ("Processes say what they are"): ``pgrep aioloader``
    finds them all, the zygote, the workers and the loader process."""
    expected = [WORKER] * 2 + ([LOADER] if loader_process else [])
    kw = {"decode": decode_number, "num_workers": 2, "loader_process": loader_process}
    with Loader(numbered, batch_size=5, **kw) as loader:
        next(iter(loader))
        names = settled_names(expected)
        pgrep = subprocess.run(["pgrep", "aioloader"], capture_output=True, text=True, check=True)
    assert sorted(names.values()) == sorted(expected), names
    assert set(names) | {zygote.pid()} <= {int(p) for p in pgrep.stdout.split()}


STOCK = """
import os, threading, time
from multiprocessing import forkserver
from helpers import decode_number
from aioloader import Loader

# A loader thread before the first loader: no zygote, the stock fork server makes the workers.
threading.Thread(target=time.sleep, args=(30,), name="aioloader-other", daemon=True).start()

def comm(pid):
    with open(f"/proc/{{pid}}/comm") as f:
        return f.read().strip()

def ppid(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:  # gone meanwhile
        return -1

if __name__ == "__main__":
    with Loader({paths!r}, batch_size=5, decode=decode_number, num_workers=2, loader_process=False) as loader:
        assert sum(len(b) for b in loader) == {n}
        server = forkserver._forkserver._forkserver_pid
        deadline = time.monotonic() + 10
        while True:
            kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and ppid(p) == server]
            names = sorted(comm(p) for p in kids)
            if names == [{worker!r}] * 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        print(*names)
"""


def test_the_stock_fork_servers_workers_are_named(numbered: list[str], tmp_path: Path) -> None:
    proc = start_script(tmp_path / "stock.py", STOCK.format(paths=numbered, n=len(numbered), worker=WORKER))
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    assert out.split() == [WORKER, WORKER]


def test_every_name_reads_whole_and_says_aioloader() -> None:
    """The kernel keeps 15 bytes of a name: each of ours fits whole, each is another role's
    than the others, and each starts with ``aioloader`` (for ``pgrep aioloader``)."""
    from aioloader.procs import roles

    assert roles.NAMES == {"zygote": ZYGOTE, "loader": LOADER, "worker": WORKER, "reader": READER}
    assert all(len(name.encode()) <= 15 and name.startswith("aioloader") for name in roles.NAMES.values())


def test_reader_processes_are_named() -> None:
    """Reader processes (fast local reads for ``decode=None``) name themselves too."""
    from aioloader.read.workers import ReadWorkers

    workers = ReadWorkers(2)
    workers.start()
    try:
        deadline = time.monotonic() + 30
        while len(workers.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pids = workers.pids()
        assert len(pids) == 2
        names = settled_names([READER] * 2)
    finally:
        workers.close()
    assert sorted(names[p] for p in pids) == [READER] * 2
