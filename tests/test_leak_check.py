"""The checks other tests rely on, shown failing where they must: the leak check's view of
the process tree and of /dev/shm (conftest.py's ``no_leaks``, with helpers.py's
``slab_holdings`` and ``new_shm_entries``), and the runtime watch behind the ``where``
fixtures (helpers.py's ``RuntimeWatch``). Real processes, real memfds, real /dev/shm files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import (
    RuntimeWatch,
    decode_number,
    is_gone,
    new_shm_entries,
    process_tree,
    script_env,
    shm_entries,
    slab_holdings,
)

from aioloader import Loader

HOLDER = """
import mmap, os, sys, time
fd = os.memfd_create(f"aioloader-{os.getpid()}-0-leakcheck", os.MFD_CLOEXEC)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_a_slab_held_by_a_descendant_is_seen() -> None:
    """A grandchild (as a worker is of the trainer, through the zygote) holding and mapping
    a memfd slab shows in ``slab_holdings`` of the tree, and not once it is gone."""
    outer = "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); p.wait()"
    with subprocess.Popen([sys.executable, "-c", outer, HOLDER], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        try:
            assert pid in process_tree() and pid != proc.pid
            name = f"aioloader-{pid}-0-leakcheck"
            with open(f"/proc/{pid}/comm") as f:
                who = f"{pid} ({f.read().strip()})"
            held = {s for s in slab_holdings(process_tree()) if s.startswith(f"{pid} ")}
            assert held == {f"{who} fd {name}", f"{who} maps {name}"}
        finally:
            os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert is_gone(pid)  # its parent waited for it
    assert not any(s.startswith(f"{pid} ") for s in slab_holdings(process_tree()))


def test_dev_shm_entries_count_for_us_by_their_makers_pid(tmp_path: Path) -> None:
    """A new entry counts when its maker is this process, one of ``makers``, or gone (a
    loader process that exited); never when a running process outside them made it."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert is_gone(gone.pid)
    before = set(shm_entries())
    names = {
        "mine": f"aioloader-{os.getpid()}-0-leakcheck",
        "gone": f"sem.mp-aioloader-{gone.pid}-leakcheck",
        "theirs": "aioloader-1-0-leakcheck",  # pid 1 runs, and is no descendant of ours
        "not aioloader's": f"mp-{os.getpid()}-leakcheck",
    }
    made = []
    try:
        for name in names.values():
            path = os.path.join("/dev/shm", name)
            if os.path.exists(path):
                pytest.skip(f"{path} exists already")
            with open(path, "xb"):
                made.append(path)
        found = new_shm_entries(before, {os.getpid()})
        assert found & set(names.values()) == {names["mine"], names["gone"]}
        assert new_shm_entries(set(shm_entries()), {os.getpid()}) & set(names.values()) == set()
    finally:
        for path in made:
            os.unlink(path)


def test_the_runtime_watch_tells_thread_from_process(
    numbered: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = RuntimeWatch()
    watch.install(monkeypatch)
    try:
        for process in (False, True, "auto"):
            with Loader(
                numbered, batch_size=37, decode=decode_number, num_workers=1, loader_process=process
            ) as ld:
                assert len(next(iter(ld))) == 37
    finally:
        watch.uninstall()
    assert watch.started == [(False, "Runtime"), (True, "ProcessRuntime"), (True, "ProcessRuntime")]
    kinds = "['Runtime', 'ProcessRuntime', 'ProcessRuntime']"
    watch.expect(True)
    assert watch.problems() == [f"[process] started in-process runtimes: {kinds}"]
    watch.expect(True, in_process_too=True)
    assert watch.problems() == []
    watch.expect(False)
    assert watch.problems() == [f"[thread] started loader processes: {kinds}"]


FALLBACK = """
import logging, threading, time
import pytest
from helpers import RuntimeWatch, decode_number
from aioloader import Loader

# An aioloader thread before the first loader: no zygote can be made, loader_process=True
# warns and loads in-process, "auto" (the default) does so silently (aioloader.run.start).
threading.Thread(target=time.sleep, args=(30,), name="aioloader-other", daemon=True).start()
if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    watch = RuntimeWatch()
    with pytest.MonkeyPatch.context() as mp:
        watch.install(mp)
        for process in (True, "auto"):
            with Loader({paths!r}, batch_size=37, decode=decode_number, num_workers=1,
                        loader_process=process) as ld:
                assert len(next(iter(ld))) == 37
        watch.uninstall()
    watch.expect(True)
    for line in watch.problems():
        print(line.split(":")[0])
"""


def test_the_runtime_watch_catches_the_no_zygote_fallback(tmp_path: Path, numbered: list[str]) -> None:
    script = tmp_path / "fallback.py"
    script.write_text(textwrap.dedent(FALLBACK).format(paths=numbered))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=script_env(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "2 loader(s) asked for a loader process and ran in-process",
        "[process] started in-process runtimes",
        "[process] logged",
    ]
