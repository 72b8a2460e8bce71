"""Batches load whatever the size of /dev/shm: a script runs in a private mount namespace with
an 8 MB tmpfs on /dev/shm (smaller than Docker's 64 MB default, and than one batch here: 64
images of 224x224x3 uint8 are 9.2 MiB), in both runtimes.

Slabs are memfd segments, so the batches load, zero-copy (each batch tensor lies in a
``/memfd:aioloader-...`` mapping), every sample exactly once, and nothing is left in that
/dev/shm; forced onto /dev/shm (``AIOLOADER_SLABS=devshm``) the same loader fails at once
with the clear error. Needs ``unshare -m`` and ``mount`` (root, or CAP_SYS_ADMIN); skips,
saying why, where they are not permitted.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_session, script_env

from aioloader.memory.segments import ENV

FILES = 192  # three batches of 64
MOUNT = "mount -t tmpfs -o size=8m tmpfs /dev/shm"

SCRIPT = """
import gc, os, sys
import numpy as np
import aioloader
from helpers import memfd_slabs, slab_mappings


def decode(data):
    # A plain user function: the file's number, as a 224x224x3 image.
    n = int(data)
    out = np.full((224, 224, 3), n % 251, dtype=np.uint8)
    out[0, 0, :2] = (n % 256, n // 256)
    return out


def in_memfd(t):
    ptr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/memfd:aioloader-"):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                if start <= ptr < end:
                    return True
    return False


if __name__ == "__main__":
    folder = sys.argv[1]
    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    print("shm", os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize, flush=True)
    for loader_process in (False, True):
        try:
            with aioloader.Loader(
                paths, batch_size=64, decode=decode, num_workers=2, loader_process=loader_process
            ) as loader:
                for epoch in range(2):
                    seen, zero_copy = [], []
                    for b in loader:
                        assert b.shape == (64, 224, 224, 3), b.shape
                        seen += [int(s[0, 0, 0]) + 256 * int(s[0, 0, 1]) for s in b]
                        zero_copy.append(in_memfd(b))
                    print("epoch", loader_process, epoch, sorted(seen) == list(range(len(paths))), zero_copy)
                    del b
        except aioloader.LoaderError as exc:
            print("error", loader_process, str(exc).splitlines()[0], flush=True)
        gc.collect()
        left = sorted(os.listdir("/dev/shm")), sorted(memfd_slabs(maker=0)), slab_mappings()
        print("left", loader_process, left, flush=True)
"""


@functools.cache
def _cannot_unshare() -> str | None:
    """Why a private mount namespace with a tmpfs on /dev/shm cannot be made here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) here"
    try:
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", MOUNT], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare -m failed: {exc}"
    if proc.returncode != 0:
        return f"unshare -m / mount not permitted here: {proc.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def numbers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("numbers")
    for i in range(FILES):
        (folder / f"{i:04d}.txt").write_text(str(i))
    return folder


def _run(tmp_path: Path, folder: Path, env: dict[str, str]) -> list[str]:
    """Run SCRIPT under ``unshare -m`` with an 8 MB tmpfs on /dev/shm; its output lines."""
    why = _cannot_unshare()
    if why is not None:
        pytest.skip(why)
    script = tmp_path / "small_shm.py"
    script.write_text(SCRIPT)
    shell = f'{MOUNT} && exec "$0" "$@"'  # then the interpreter under test runs the script
    cmd = ["unshare", "-m", "sh", "-c", shell, sys.executable, str(script), str(folder)]
    out, _ = run_session(cmd, env)
    print(out)  # shown when a test fails
    lines = out.splitlines()
    assert lines[0] == f"shm {8 * 2**20}", out  # really the small tmpfs
    return lines[1:]


def test_batches_larger_than_dev_shm_load_zero_copy_in_both_runtimes(numbers: Path, tmp_path: Path) -> None:
    env = script_env()
    env.pop(ENV, None)
    lines = _run(tmp_path, numbers, env)
    for lp in (False, True):
        epochs = [line.split(maxsplit=4)[2:] for line in lines if line.startswith(f"epoch {lp} ")]
        # Every sample exactly once, each epoch; the first batches teach the layout (they
        # come through the pipe), and from then on every batch is a memfd slab's memory.
        assert [(e, once) for e, once, _ in epochs] == [("0", "True"), ("1", "True")], lines
        assert ast.literal_eval(epochs[1][2]) == [True, True, True], lines
        # Nothing in /dev/shm, no slab descriptor or mapping left once the loader is closed.
        assert f"left {lp} ([], [], [])" in lines
    assert not any(line.startswith("error") for line in lines), lines


def test_forced_dev_shm_fallback_is_the_clear_error(numbers: Path, tmp_path: Path) -> None:
    lines = _run(tmp_path, numbers, {**script_env(), ENV: "devshm"})
    for lp in (False, True):
        errors = [line for line in lines if line.startswith(f"error {lp} ")]
        assert len(errors) == 1, lines
        assert re.search(r"cannot allocate a [\d.]+ MiB shared-memory batch slab in /dev/shm \(", errors[0])
        assert "MiB free there): No space left on device" in errors[0], errors
        assert f"left {lp} ([], [], [])" in lines
