"""The zygote: decode workers are forked by a single-threaded fork of the trainer, made
before the loader had any thread, so a decode function defined in the training script
(which imports torch) starts without importing anything. Scripts run in their own session;
what they leave behind is found with pgrep."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import decode_number, descendants, finish_script, script_env, session_survivors, start_script

from aioloader import Loader
from aioloader.decode import zygote

SCRIPT = """
import os, sys
import numpy as np
import torch  # what a training script imports: the workers must not import it again
import aioloader

def decode(data):  # defined in __main__, as most users' functions are
    return np.full((2, 2), int(data.decode()[7:]), dtype=np.uint8)

if __name__ == "__main__":
    paths = {paths!r}
    with aioloader.Loader(paths, batch_size=4, decode=decode, num_workers=2, shuffle=False) as loader:
        it = iter(loader)
        first = next(it)
        rest = [int(v) for b in [first, *it] for v in b[:, 0, 0]]
        assert rest == list(range(len(paths))), rest
        zpid = str(aioloader.decode.zygote.pid())
        print("zygote", zpid, flush=True)
        ppid = lambda p: open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1]
        kids = [p for p in os.listdir("/proc") if p.isdigit() and ppid(p) == zpid]
        print("pids", *sorted(kids), flush=True)
"""


def test_workers_come_from_the_zygote(numbered: list[str]) -> None:
    assert zygote.pid() is not None  # conftest starts it before the first test
    with Loader(numbered, batch_size=5, decode=decode_number, num_workers=2, shuffle=False) as loader:
        assert [int(v) for b in loader for v in b] == list(range(37))
        workers = descendants()
        parents = set()
        for pid in workers:
            with open(f"/proc/{pid}/stat") as f:
                parents.add(int(f.read().rsplit(")", 1)[1].split()[1]))
    assert len(workers) == 2 and parents == {zygote.pid()}


def test_a_script_that_imports_torch_decodes_in_workers_of_the_zygote_and_leaves_nothing(
    numbered: list[str], tmp_path: Path
) -> None:
    """How fast its first batch comes is measured by benchmarks/throughput.py (first batch,
    start-up included), not here: tests do not time."""
    proc = start_script(tmp_path / "train.py", SCRIPT.format(paths=numbered))
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    zygote_pid = int(lines["zygote"])
    assert zygote_pid and len(lines["pids"].split()) == 2  # both workers are its children
    assert session_survivors(proc.pid) == []


def test_no_zygote_once_loader_threads_exist(tmp_path: Path) -> None:
    """A process whose loader threads already run gets no zygote (a fork then could copy a
    held lock): its workers come from the stock fork server."""
    code = textwrap.dedent(
        """
        import threading, time
        from aioloader.decode import zygote
        t = threading.Thread(target=time.sleep, args=(1,), name="aioloader-loop", daemon=True)
        t.start()
        print(zygote.context(), zygote.pid())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=script_env(), capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.split() == ["None", "None"]
