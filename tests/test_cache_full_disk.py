"""A disk cache on a disk that fills: a real full filesystem, a 256 KiB tmpfs mounted in a
private mount namespace (``unshare -m``) for a script, under a cache whose ``max_bytes``
(1e9) is far from reached. Every sample is delivered, in both runtimes; the first write the
disk refuses logs one WARNING naming the cause (ENOSPC), none after it; the misses not kept
are counted in ``stats.cache.write_errors``, never in ``over_bound``. Needs ``unshare -m``
and ``mount`` (root, or CAP_SYS_ADMIN); skips, saying why, where they are not permitted."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_session, script_env

FILES = 48
#: Bytes of each file: about 15 of them fill the tmpfs.
SIZE = 16 * 1024
TMPFS = "mount -t tmpfs -o size=256k tmpfs"

SCRIPT = """
import json, logging, os, sys
import numpy as np
import aioloader


def decode(data):
    return np.array([int(bytes(data[7:13]))], dtype=np.int64)  # b"sample-000123..." -> 123


class Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        if "sample cache" in record.getMessage():
            self.records.append(record.getMessage())


if __name__ == "__main__":
    data, mounts = sys.argv[1], sys.argv[2:]
    paths = sorted(os.path.join(data, n) for n in os.listdir(data))
    logging.getLogger("aioloader").addHandler(keep := Keep())
    for loader_process, mount in zip((False, True), mounts):
        st = os.statvfs(mount)
        keep.records.clear()
        cache = aioloader.Cache(directory=os.path.join(mount, "cache"), max_bytes=10**9)
        epochs = []
        with aioloader.Loader(
            paths, batch_size=8, decode=decode, num_workers=1, cache=cache, loader_process=loader_process
        ) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                epochs.append(sorted(int(v) for b in loader for v in b.reshape(-1).tolist()))
        s = loader.stats.cache
        print(json.dumps({
            "loader_process": loader_process,
            "disk": st.f_blocks * st.f_frsize,
            "runtime": loader.runtime,
            "epochs": epochs,
            "warnings": keep.records,
            "stats": {k: getattr(s, k) for k in ("hits", "misses", "stored", "over_bound", "write_errors")},
        }), flush=True)
"""


@functools.cache
def _cannot_mount(where: str) -> str | None:
    """Why a private mount namespace with a tmpfs cannot be made here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) here"
    try:
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", f"{TMPFS} {where}"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare -m failed: {exc}"
    if proc.returncode != 0:
        return f"unshare -m / mount not permitted here: {proc.stderr.strip()}"
    return None


def test_a_full_disk_logs_one_warning_and_counts_write_errors_not_over_bound(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(FILES):
        (data / f"f{i:05d}.bin").write_bytes(f"sample-{i:06d}".encode().ljust(SIZE, b"."))
    mounts = [tmp_path / "thread", tmp_path / "process"]
    for m in mounts:
        m.mkdir()
    why = _cannot_mount(str(mounts[0]))
    if why is not None:
        pytest.skip(why)
    script = tmp_path / "full_disk.py"
    script.write_text(SCRIPT)
    # Both tmpfs mounted, then the interpreter under test runs the script.
    shell = " && ".join(f'{TMPFS} "${i}"' for i in (1, 2)) + ' && exec "$0" "$3" "$4" "$1" "$2"'
    cmd = ["unshare", "-m", "sh", "-c", shell, sys.executable, *map(str, mounts), str(script), str(data)]
    out, _ = run_session(cmd, script_env())
    print(out)  # shown when the test fails
    runs = [json.loads(line) for line in out.splitlines()]
    assert [r["runtime"] for r in runs] == ["thread", "process"], out
    for run in runs:
        assert run["disk"] == 256 * 1024, run  # really the small tmpfs
        assert run["epochs"] == [list(range(FILES))] * 2, run  # every sample, both epochs
        s = run["stats"]
        # Some entries fit before the disk filled, and the second epoch served them.
        assert 0 < s["stored"] < FILES and s["hits"] == s["stored"], run
        assert s["misses"] == 2 * FILES - s["stored"], run
        # Every miss not kept is a write error (a write refused, or a miss once the disk
        # said it is full): none is taken for the bound, which is far away.
        assert s["over_bound"] == 0, run
        assert s["write_errors"] == s["misses"] - s["stored"], run
        warned = run["warnings"]
        assert len(warned) == 1, run
        assert "ENOSPC" in warned[0] and "No space left on device" in warned[0], run
        assert str(tmp_path) in warned[0] and "the disk is full" in warned[0], run
