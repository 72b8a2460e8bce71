"""The zygote at the trainer's exit, and what a fork copies (``aioloader/procs/zygote.py``):
a clean exit ends the zygote before the interpreter tears down (its pages then stay the
trainer's alone, not copied as the teardown writes them), after the loaders' own exit hook
closed them, whether the script closed its loader or not; and a script's buffered output is
written once, never again by a helper that flushed its copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import finish_script, start_script

from aioloader.procs import zygote

#: stdout block-buffered, as on a pipe by default: a copy of its buffer would show twice.
BUFFERED: dict[str, str | None] = {"PYTHONUNBUFFERED": None}

SCRIPT = """
import atexit, os, sys
import torch
import aioloader
from helpers import decode_number

def after_ours():  # registered before the zygote's own hook: runs after it
    pid = aioloader.procs.zygote.pid()
    print("zygote at exit", "gone" if not os.path.exists(f"/proc/{{pid}}") else "alive", flush=True)

if __name__ == "__main__":
    atexit.register(after_ours)
    sys.stdout.write("buffered ")  # in stdout's buffer (a pipe) while the helpers fork
    loader = aioloader.Loader({paths!r}, batch_size=4, decode=decode_number, num_workers=1,
                              loader_process={runtime!r})
    got = sum(len(b) for b in loader)
    print("loaded", got, flush=True)
    {end}
"""


def _run(tmp_path: Path, numbered: list[str], runtime: object, end: str) -> str:
    proc = start_script(
        tmp_path / "train.py", SCRIPT.format(paths=numbered, runtime=runtime, end=end), env=BUFFERED
    )
    out, err = finish_script(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "leaked" not in err, err
    return out


def test_a_clean_exit_ends_the_zygote_before_the_teardown(numbered: list[str], tmp_path: Path) -> None:
    """Closed by the script (in-process or in a loader process), or left open for the
    loaders' exit hook: by the time a hook registered before the loader runs, the zygote is
    gone. The line printed before the fork appears once."""
    for runtime, end in [(False, "loader.close()"), (True, "loader.close()"), ("auto", "pass")]:
        out = _run(tmp_path, numbered, runtime, end)
        assert out.splitlines() == ["buffered loaded 37", "zygote at exit gone"], (runtime, out)


def test_the_zygote_is_not_ended_while_a_helper_of_its_lives() -> None:
    """The rule's check, on this process's zygote: with a child of its alive (a worker), it
    has children; a process without any has none."""
    from aioloader import Loader

    pid = zygote.pid()
    assert pid is not None
    with Loader([__file__] * 4, batch_size=2, decode=len, num_workers=1, loader_process=False) as loader:
        next(iter(loader))
        assert zygote._has_children(pid)
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not zygote._has_children(lone.pid)
    finally:
        lone.kill()
        lone.wait()
    assert os.getpid() != pid
