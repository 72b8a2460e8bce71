"""multiprocessing's resource tracker, forked beside the zygote (``aioloader/procs/tracker.py``):
named ``aioloader-track``, a child of the trainer, no second interpreter; still the safety
net that removes a killed trainer's named semaphores and says so on the terminal's stderr,
never writing the trainer's buffered output again; the stock one where the zygote starts
clean."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from crashkit import semaphores
from helpers import finish_script, process_name, session_survivors, start_script

TRACKER = "aioloader-track"
#: stdout block-buffered, as on a pipe by default: a copy of its buffer would show twice.
BUFFERED: dict[str, str | None] = {"PYTHONUNBUFFERED": None}

HOLDS_SEMAPHORES = """
import os, sys, time
from multiprocessing import resource_tracker
import torch
import aioloader
from helpers import decode_number

if __name__ == "__main__":
    torch.nn.Linear(4, 4)(torch.ones(2, 4))  # a forward pass first, as a trainer does
    sys.stdout.write("buffered ")  # in stdout's buffer (a pipe) while the helpers fork
    {thread}
    loader = aioloader.Loader({paths!r}, batch_size=4, decode=decode_number, num_workers=1,
                              loader_process=False)
    held = next(iter(loader))  # the decode pool's named semaphores exist now
    rt = resource_tracker._resource_tracker
    with open(f"/proc/{{rt._pid}}/comm") as f:
        print("tracker", rt._pid, f.read().strip(), flush=True)
    {end}
"""


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process_name(pid) == "":
            return True
        time.sleep(0.05)
    return False


def test_a_forked_tracker_cleans_up_after_a_killed_trainer(numbered: list[str], tmp_path: Path) -> None:
    """The trainer, killed by SIGKILL while its decode pool's named semaphores exist: the
    forked tracker (named ``aioloader-track``) removes them once every
    process of the tree is gone, and reports it on the stderr the script was started with.
    The trainer's buffered output is written once, by nobody but the trainer (here: never)."""
    proc = start_script(
        tmp_path / "killed.py",
        HOLDS_SEMAPHORES.format(paths=numbered, thread="", end="time.sleep(3600)"),
        env=BUFFERED,
    )
    assert proc.stdout is not None
    try:
        words = proc.stdout.readline().split()
        assert words[:2] == ["buffered", "tracker"], words
        tracker = int(words[2])
        assert words[3] == TRACKER and process_name(tracker) == TRACKER
        mine = {n for n in semaphores() if n.startswith(f"sem.mp-aioloader-{proc.pid}-")}
        assert mine  # the pool's queues' names, while it runs
        proc.send_signal(signal.SIGKILL)
    finally:
        rest, err = finish_script(proc)  # the whole session killed, whatever failed
    assert _wait_gone(tracker), "the tracker outlived the whole tree"
    assert session_survivors(proc.pid) == []
    assert not {n for n in semaphores() if n.startswith(f"sem.mp-aioloader-{proc.pid}-")}
    assert "leaked semaphore objects" in err, err
    assert "buffered" not in rest  # written once, by the trainer: no copy of its buffer wrote it again


def test_a_clean_exit_leaves_the_tracker_nothing(numbered: list[str], tmp_path: Path) -> None:
    """A script that closes its loader: the tracker finds nothing to remove, and the
    trainer's buffered output appears exactly once."""
    proc = start_script(
        tmp_path / "clean.py",
        HOLDS_SEMAPHORES.format(paths=numbered, thread="", end="loader.close()"),
        env=BUFFERED,
    )
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    assert out.count("buffered") == 1, out
    assert "leaked" not in err and "Traceback" not in err, err


def test_a_zygote_started_clean_has_the_stock_tracker(numbered: list[str], tmp_path: Path) -> None:
    """A Python thread of the script's own: the zygote starts in a fresh interpreter, and so
    does multiprocessing's own tracker (a fork is not safe there)."""
    thread = "import threading; threading.Thread(target=threading.Event().wait, daemon=True).start()"
    proc = start_script(
        tmp_path / "threaded.py",
        HOLDS_SEMAPHORES.format(paths=numbered, thread=thread, end="loader.close()"),
    )
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    assert out.split()[:2] == ["buffered", "tracker"] and out.split()[3] == "python", out
