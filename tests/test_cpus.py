"""The CPUs a loader counts as usable (``usable_cpus()``: the affinity lowered to the cgroup's
CPU quota, rounded up), in a real cgroup the way a container presents it.

Each test makes a cgroup with a CPU quota (v2: a child with ``cpu.max``, the ``cpu``
controller enabled in the parent; v1: a child of the ``cpu`` hierarchy with
``cpu.cfs_quota_us``), then runs a script that joins it and enters a new cgroup namespace
and mount namespace where the cgroup filesystem is mounted again, as Docker and Kubernetes
do: the script sees its own cgroup as the root of the hierarchy. The cgroup is removed
afterwards. Where none can be made (not root, a read-only cgroupfs, no ``unshare``), the
tests skip and say why.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import finish_script, script_env

PERIOD_US = 100_000

SCRIPT = """
import os, time
from helpers import decode_number, descendants
from aioloader import Loader
from aioloader.config import usable_cpus

WORKER = "aioloader-work"  # /proc/<pid>/comm: a decode worker

def comm(pid):
    try:
        with open(f"/proc/{{pid}}/comm") as f:
            return f.read().strip()
    except OSError:  # gone meanwhile
        return None

if __name__ == "__main__":
    paths = {paths!r}
    default = Loader(paths, batch_size=4, decode=decode_number, shuffle=False)
    auto = Loader(paths, batch_size=4, decode=decode_number, num_workers="auto")
    auto.close()
    print("usable", usable_cpus())
    print("default", default.config.num_workers)
    print("auto", auto.config.num_workers)
    if {load!r}:
        with default:
            assert [int(v) for b in default for v in b] == list(range(len(paths)))
            # The decode workers: this process's helpers named so (the loader process is
            # among the helpers too); a worker forked a moment ago still bears its parent's
            # name until it has started.
            deadline = time.monotonic() + 10
            while True:
                names = [comm(p) for p in descendants()]
                workers = names.count(WORKER)
                if (workers and len(names) - workers <= 1) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            print("workers", workers)
"""


@dataclass(frozen=True)
class Hierarchy:
    """Where the cgroup filesystem with the ``cpu`` controller is, and how to mount it."""

    version: int
    mountpoint: str
    fstype: str
    options: str  # for ``mount -o`` ("" for v2)


def cpu_hierarchy(mountinfo: str) -> Hierarchy | None:
    """The hierarchy loky reads (pure, from ``/proc/self/mountinfo``'s text): v2 mounted at
    ``/sys/fs/cgroup``, else the v1 hierarchy holding the ``cpu`` controller mounted at (or
    linked from) ``/sys/fs/cgroup/cpu``; None when there is neither."""
    v1_at = os.path.realpath("/sys/fs/cgroup/cpu")
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        mountpoint, fstype, superopts = fields[4], fields[sep + 1], fields[sep + 3].split(",")
        if fstype == "cgroup2" and mountpoint == "/sys/fs/cgroup":
            return Hierarchy(2, mountpoint, fstype, "")
        if fstype == "cgroup" and mountpoint == v1_at and "cpu" in superopts:
            controllers = [o for o in superopts if o not in ("rw", "ro")]
            return Hierarchy(1, mountpoint, fstype, ",".join(controllers))
    return None


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _skip_unless(ok: bool, reason: str) -> None:
    if not ok:
        pytest.skip(reason)


@contextlib.contextmanager
def cpu_quota(quota_us: int) -> Iterator[Path]:
    """A new cgroup allowed ``quota_us`` of CPU time per 100 ms period; removed on the way
    out, once the processes in it have exited."""
    _skip_unless(sys.platform.startswith("linux"), "cgroups are Linux's")
    _skip_unless(os.geteuid() == 0, "making a cgroup and namespaces needs root")
    probe = subprocess.run(["unshare", "-C", "-m", "true"], capture_output=True, text=True, check=False)
    _skip_unless(probe.returncode == 0, f"no cgroup and mount namespaces here: {probe.stderr.strip()}")
    with open("/proc/self/mountinfo") as f:
        where = cpu_hierarchy(f.read())
    _skip_unless(where is not None, "no cgroup hierarchy with the cpu controller at /sys/fs/cgroup")
    assert where is not None
    root = Path(where.mountpoint)
    group = root / f"aioloader-test-{os.getpid()}-{quota_us}"
    try:
        if where.version == 2:
            enabled = (root / "cgroup.subtree_control").read_text().split()
            if "cpu" not in enabled:
                # Left enabled afterwards: disabling it would take cpu.max away from every
                # other child cgroup, some of which another process may have made meanwhile.
                _write(root / "cgroup.subtree_control", "+cpu")
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup with a CPU quota in {root}: {exc}")
    try:
        if where.version == 2:
            _write(group / "cpu.max", f"{quota_us} {PERIOD_US}")
        else:
            _write(group / "cpu.cfs_period_us", str(PERIOD_US))
            _write(group / "cpu.cfs_quota_us", str(quota_us))
        yield group
    finally:
        _remove(group)


def _remove(group: Path) -> None:
    """rmdir ``group`` once it is empty (its processes end a moment after the script: the
    zygote and workers follow their parent out); what is left after 5 s is killed."""
    deadline = time.monotonic() + 10
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline - 5:
            # Only this test's processes joined this cgroup.
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)


def run_in(group: Path, script: Path) -> dict[str, int]:
    """Run ``script`` as a container would: in ``group``, with a cgroup namespace and a
    mount namespace where the cgroup filesystem shows ``group`` as its root. Returns the
    ``name value`` lines it printed."""
    with open("/proc/self/mountinfo") as f:
        where = cpu_hierarchy(f.read())
    assert where is not None
    mp = shlex.quote(where.mountpoint)
    opts = f"-o {shlex.quote(where.options)} " if where.options else ""
    # In the new mount namespace (private: the host's mounts stay as they are) the old
    # mount goes and the hierarchy is mounted again: its root is now the namespace's, the
    # cgroup this shell joined. Exit codes 75/76: that set-up failed, not the script.
    inner = (
        f"umount -l {mp} && mount -t {where.fstype} {opts}cgroup {mp} || exit 76; "
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    )
    outer = (
        f"echo $$ > {shlex.quote(str(group / 'cgroup.procs'))} || exit 75; "
        f"exec unshare -C -m sh -c {shlex.quote(inner)}"
    )
    proc = subprocess.Popen(
        ["sh", "-c", outer],
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = finish_script(proc, timeout=120)
    if proc.returncode in (75, 76):
        pytest.skip(f"cannot run a process in a cgroup of its own with its cgroupfs mounted: {err.strip()}")
    assert proc.returncode == 0, err
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def test_a_container_limited_to_one_cpu_starts_one_worker(numbered: list[str], tmp_path: Path) -> None:
    """A quota of 1 CPU (100 ms per 100 ms) on a machine with more: one decode process, by
    default and with "auto", counted as processes while it loads."""
    script = tmp_path / "one_cpu.py"
    script.write_text(SCRIPT.format(paths=numbered, load=True))
    with cpu_quota(PERIOD_US) as group:
        got = run_in(group, script)
    assert got == {"usable": 1, "default": 1, "auto": 1, "workers": 1}


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
    reason="needs an affinity of at least 2 CPUs",
)
def test_a_quota_of_one_and_a_half_cpus_is_rounded_up(numbered: list[str], tmp_path: Path) -> None:
    script = tmp_path / "one_and_a_half.py"
    script.write_text(SCRIPT.format(paths=numbered, load=False))
    with cpu_quota(PERIOD_US * 3 // 2) as group:
        got = run_in(group, script)
    assert got == {"usable": 2, "default": 2, "auto": 2}


def test_cpu_hierarchy_from_mountinfo() -> None:
    """The parsing the tests above rely on, on both layouts (pure)."""
    v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert cpu_hierarchy(v2) == Hierarchy(2, "/sys/fs/cgroup", "cgroup2", "")
    v1 = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
        f"32 31 0:29 / {os.path.realpath('/sys/fs/cgroup/cpu')} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    )
    assert cpu_hierarchy(v1) == Hierarchy(1, os.path.realpath("/sys/fs/cgroup/cpu"), "cgroup", "cpu,cpuacct")
    assert cpu_hierarchy("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n") is None


def test_semaphore_names_stay_ours() -> None:
    """Importing loky (for its cpu_count) renames the process's multiprocessing semaphores
    (``/loky-<pid>-...``); usable_cpus() undoes that, so the decode pool's keep the
    ``mp-aioloader-<pid>-`` names ``aioloader doctor`` looks for. In a fresh interpreter:
    this one may have imported loky already."""
    code = (
        "import multiprocessing as mp\n"
        "from aioloader.config import usable_cpus\n"
        "assert usable_cpus() >= 1\n"
        "print(mp.get_context('forkserver').Lock()._semlock.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=script_env(), capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("/mp-"), out.stdout
