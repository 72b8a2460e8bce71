"""``aioloader doctor``: finds what a dead loader left in shared memory, removes it with
``--remove``, and never touches a running loader's names. Slabs are in ``/dev/shm`` only
with ``AIOLOADER_SLABS=devshm`` (the fallback where memfd is impossible); memfd slabs have
no name to leave behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from crashkit import semaphores
from helpers import decode_number, memfd_holders, script_env, session_survivors, shm_segments, start_script

from aioloader import Loader
from aioloader.memory.segments import ENV
from aioloader.safety import doctor

HOLDER = """
import time
import aioloader
from helpers import decode_number

if __name__ == "__main__":
    # In-process: the names in /dev/shm carry this script's pid.
    loader = aioloader.Loader({paths!r}, batch_size=4, decode=decode_number, num_workers=1,
                              loader_process=False)
    held = next(iter(loader))
    print("ready", flush=True)
    time.sleep(3600)
"""


def _doctor(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "aioloader", "doctor", *args],
        capture_output=True,
        text=True,
        env=script_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("slabs", ["devshm", "memfd"])
def test_doctor_removes_what_a_whole_killed_process_group_left(
    numbered: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slabs: str
) -> None:
    monkeypatch.setenv(ENV, slabs)  # the script's, and this process's in-process loader below
    proc = start_script(tmp_path / "holder.py", HOLDER.format(paths=numbered))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    # The whole group at once, resource tracker included (a cgroup's OOM kill): the one way
    # left to leave names behind, and what the doctor is for.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert session_survivors(proc.pid) == []
    segments = shm_segments(proc.pid)
    sems = {n for n in semaphores() if n.startswith(f"sem.mp-aioloader-{proc.pid}-")}
    # The pool's queues and locks: five once every one of them exists, but "ready" may come
    # before the last (seen once with two, on a loaded machine); what matters is what is left.
    assert sems
    if slabs == "memfd":  # gone with their holders: nothing named, nothing held
        assert not segments and not memfd_holders({proc.pid})
    else:
        assert segments
    try:
        with Loader(
            numbered, batch_size=4, decode=decode_number, num_workers=1, loader_process=False
        ) as loader:
            # A running loader's names, quiet after its epoch: listed as in use, and kept.
            batches = list(loader)
            mine = shm_segments()
            assert mine
            listed = _doctor()
            if slabs == "memfd":  # the doctor looks in /dev/shm: memfd slabs are never there
                assert not any(f"{name} " in listed for name in mine)
            for name in segments | sems:
                assert f"{name} " in listed and f"pid {proc.pid} is gone" in listed
            # (Other loaders running on this machine meanwhile may be listed beside this one.)
            in_use = rf"in use by running process(es)? (\d+, )*{os.getpid()}\b[\d, ]*: left alone"
            assert re.search(in_use, listed)
            assert "aioloader doctor --remove" in listed
            removed = _doctor("--remove")
            # (Leftovers of other dead processes, of scripts other tests killed whole, go too.)
            count = int(removed.rsplit("removed ", 1)[1].split()[0])
            assert count >= len(segments | sems)
            assert shm_segments(proc.pid) == set()
            assert not {n for n in semaphores() if n.startswith(f"sem.mp-aioloader-{proc.pid}-")}
            assert shm_segments() == mine
            assert sorted(int(v) for b in batches for v in b) == list(range(37))
    finally:
        for name in shm_segments(proc.pid) | sems:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except FileNotFoundError:
                pass


def test_the_report_lists_leftovers_and_counts_names_in_use() -> None:
    entries = [
        doctor.Entry("aioloader-41-0-aaaa", 41, "segment", 13_421_772, alive=False),
        doctor.Entry("sem.mp-aioloader-41-bbbb", 41, "semaphore", 32, alive=False),
        doctor.Entry("aioloader-7-0-cccc", 7, "segment", 1024, alive=True),
    ]
    text = doctor.report(entries)
    assert "aioloader-41-0-aaaa" in text and "12.8 MiB" in text and "pid 41 is gone" in text
    assert "aioloader-7-0-cccc" not in text and "1 in use by running process 7" in text
    assert "2 leftovers of 1 dead process (12.8 MiB)." in text
    assert "no leftovers" in doctor.report(entries[2:])


def test_only_names_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone, me = int(dead.stdout), os.getpid()
    (tmp_path / f"aioloader-{gone}-0-dead").write_bytes(b"x" * 10)
    (tmp_path / f"aioloader-{me}-0-live").write_bytes(b"x")
    (tmp_path / "not-ours").write_bytes(b"x")
    entries = doctor.scan(str(tmp_path))
    expected = [
        (f"aioloader-{os.getpid()}-0-live", os.getpid(), True),
        (f"aioloader-{gone}-0-dead", gone, False),
    ]
    assert [(e.name, e.pid, e.alive) for e in entries] == sorted(expected, key=lambda t: t[1])
    removed, errors = doctor.remove(entries, str(tmp_path))
    assert [e.name for e in removed] == [f"aioloader-{gone}-0-dead"] and errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"aioloader-{os.getpid()}-0-live", "not-ours"]
    )


LOKY_WHILE_A_POOL_STARTS = """
import multiprocessing as mp, sys, threading
from aioloader.base.semnames import named_for_this_process
from aioloader.config import usable_cpus

ctx = mp.get_context("forkserver")  # names kept until unlinked, as the decode pool's are
names, done = [], threading.Event()


def make() -> None:  # the decode pool starting its executor on a thread of its own
    while not done.is_set():
        with named_for_this_process():
            lock = ctx.Lock()
        names.append(lock._semlock.name)
        del lock


if __name__ == "__main__":
    maker = threading.Thread(target=make)
    maker.start()
    while len(names) < 10:
        pass
    usable_cpus()  # the pipeline asks, meanwhile; the first call imports loky
    assert "loky" in sys.modules
    before = len(names)
    while len(names) < before + 10:
        pass
    done.set()
    maker.join()
    print(len(names), *sorted({n.split("-")[0] + "-" + n.split("-")[1] for n in names}))
"""


def test_semaphores_keep_their_names_while_loky_is_imported(tmp_path: Path) -> None:
    """Importing loky (``usable_cpus()``) replaces multiprocessing's semaphore name maker for
    a moment, and the decode pool may be making its queues' semaphores on another thread just
    then: every one of them still gets its ``mp-aioloader-<pid>`` name, by which ``doctor``
    finds it after a crash (a CI run once found one missing)."""
    script = tmp_path / "loky_race.py"
    script.write_text(LOKY_WHILE_A_POOL_STARTS)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=script_env(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    count, *prefixes = out.stdout.split()
    assert int(count) >= 20 and prefixes == ["/mp-aioloader"], out.stdout
