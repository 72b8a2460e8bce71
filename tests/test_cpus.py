"""The CPUs a loader counts as usable (``usable_cpus()``: the affinity lowered to the CPU
quota of the process's own cgroup and its ancestors, rounded up), in real cgroups.

As a container presents it: a cgroup with a CPU quota (v2: a child with ``cpu.max``, the
``cpu`` controller enabled in the parent; v1: a child of the ``cpu`` hierarchy with
``cpu.cfs_quota_us``), joined by a script that enters a new cgroup namespace and mount
namespace where the cgroup filesystem is mounted again, as Docker and Kubernetes do: the
script sees its own cgroup as the root of the hierarchy.

As a host presents it (``systemd-run -p CPUQuota=``, Slurm): a parent cgroup with a child,
either or both with a quota, the script moved into the child without a namespace of its
own, so the root of the hierarchy it sees has no quota and only ``/proc/self/cgroup`` says
where its own is. v2 runs only where the unified hierarchy holds the ``cpu`` controller; the
v2 files are also read from a tree laid out in a temporary folder, and the parsing is tested
on ``/proc/self/cgroup`` and ``mountinfo`` texts from real systems.

Every cgroup made is removed afterwards. Where none can be made (not root, a read-only
cgroupfs, no ``unshare``), the tests skip and say why.
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
from fractions import Fraction
from pathlib import Path

import pytest
from helpers import finish_script, lay_out_proc, script_env

from aioloader import build as config
from aioloader.base import cpus

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
    print("default", default.config.build.workers)
    print("auto", auto.config.build.workers)
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


def run_in(group: Path, script: Path, namespace: bool = True) -> dict[str, int]:
    """Run ``script`` in ``group``: as a container would (``namespace``), with a cgroup
    namespace and a mount namespace where the cgroup filesystem shows ``group`` as its root;
    else as a host's service manager would, moved into ``group`` and nothing else. Returns
    the ``name value`` lines it printed."""
    exe = f"exec {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    if namespace:
        with open("/proc/self/mountinfo") as f:
            where = cpu_hierarchy(f.read())
        assert where is not None
        mp = shlex.quote(where.mountpoint)
        opts = f"-o {shlex.quote(where.options)} " if where.options else ""
        # In the new mount namespace (private: the host's mounts stay as they are) the old
        # mount goes and the hierarchy is mounted again: its root is now the namespace's, the
        # cgroup this shell joined. Exit codes 75/76: that set-up failed, not the script.
        inner = f"umount -l {mp} && mount -t {where.fstype} {opts}cgroup {mp} || exit 76; {exe}"
        exe = f"exec unshare -C -m sh -c {shlex.quote(inner)}"
    outer = f"echo $$ > {shlex.quote(str(group / 'cgroup.procs'))} || exit 75; {exe}"
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


# -- a host's nested cgroups, without a namespace of their own ---------------------------------

NESTED_SCRIPT = """
import time
from helpers import decode_number, descendants
from aioloader import Loader
from aioloader.base.cpus import cpu_quota
from aioloader.config import usable_cpus

if __name__ == "__main__":
    paths = {paths!r}
    quota = cpu_quota()
    print("millicpus", -1 if quota is None else round(quota * 1000))
    print("usable", usable_cpus())
    # In-process (loader_process=False): this script's descendants are then its decode
    # workers alone (the zygote they are forked from is a shared helper, left out), counted
    # as processes whatever they are named.
    default = Loader(paths, batch_size=4, decode=decode_number, shuffle=False, loader_process=False)
    auto = Loader(paths, batch_size=4, decode=decode_number, num_workers="auto")
    auto.close()
    print("default", default.config.build.workers)
    print("auto", auto.config.build.workers)
    if {load!r}:
        with default:
            assert [int(v) for b in default for v in b] == list(range(len(paths)))
            # Counted until the count has held for half a second: a worker forked late counts.
            workers, since, deadline = len(descendants()), time.monotonic(), time.monotonic() + 10
            while time.monotonic() - since < 0.5 and time.monotonic() < deadline:
                time.sleep(0.05)
                now = len(descendants())
                if now != workers:
                    workers, since = now, time.monotonic()
            print("workers", workers)
"""


def whole_mount(version: int) -> Path:
    """Where this mount namespace has the whole hierarchy holding the ``cpu`` controller
    mounted (mount root ``/``): v1's, or the unified one with ``cpu`` among its
    controllers; skips, saying why, where there is none."""
    with open("/proc/self/mountinfo") as f:
        lines = [line.split() for line in f]
    for fields in lines:
        sep = fields.index("-")
        root, mountpoint, fstype, superopts = fields[3], Path(fields[4]), fields[sep + 1], fields[sep + 3]
        if root != "/":
            continue
        if version == 1 and fstype == "cgroup" and "cpu" in superopts.split(","):
            return mountpoint
        if version == 2 and fstype == "cgroup2":
            controllers = (mountpoint / "cgroup.controllers").read_text().split()
            _skip_unless(
                "cpu" in controllers,
                f"the cgroup2 hierarchy at {mountpoint} has no cpu controller (it has {controllers}): "
                "no cpu.max can be made (the controller is bound to a v1 hierarchy, or not built in)",
            )
            return mountpoint
    pytest.skip(f"no cgroup v{version} hierarchy with the cpu controller is mounted whole here")


def _own_cgroup(version: int) -> str:
    """This process's cgroup in the hierarchy of ``version``, from /proc/self/cgroup."""
    with open("/proc/self/cgroup") as f:
        for hierarchy, controllers, path in (line.rstrip("\n").split(":", 2) for line in f):
            if (version == 2 and hierarchy == "0") or (version == 1 and "cpu" in controllers.split(",")):
                return path
    raise AssertionError(f"this process has no cgroup v{version} with the cpu controller")


def _set_quota(version: int, group: Path, quota_us: int | None) -> None:
    if quota_us is None:  # a new cgroup has none: "max", or -1
        return
    if version == 2:
        _write(group / "cpu.max", f"{quota_us} {PERIOD_US}")
    else:
        _write(group / "cpu.cfs_period_us", str(PERIOD_US))
        _write(group / "cpu.cfs_quota_us", str(quota_us))


@contextlib.contextmanager
def nested_quota(version: int, parent_us: int | None, child_us: int | None) -> Iterator[Path]:
    """``<hierarchy>/aioloader-test-<pid>-nested-<parent_us>-<child_us>/child``, the parent
    allowed ``parent_us`` of CPU time per 100 ms period and the child ``child_us`` (None: no
    quota), made in the hierarchy of ``version`` mounted whole; yields the child.
    On the way out the processes left in either go back to this process's cgroup and both
    are removed."""
    _skip_unless(sys.platform.startswith("linux"), "cgroups are Linux's")
    _skip_unless(os.geteuid() == 0, "making a cgroup needs root")
    root = whole_mount(version)
    home = root / _own_cgroup(version).lstrip("/")
    parent = root / f"aioloader-test-{os.getpid()}-nested-{parent_us}-{child_us}"
    child = parent / "child"
    try:
        if version == 2 and "cpu" not in (root / "cgroup.subtree_control").read_text().split():
            # Left enabled afterwards, as in cpu_quota: other cgroups may rely on it by then.
            _write(root / "cgroup.subtree_control", "+cpu")
        parent.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup in {root}: {exc}")
    try:
        if version == 2:
            _write(parent / "cgroup.subtree_control", "+cpu")
        _set_quota(version, parent, parent_us)
        child.mkdir()
        _set_quota(version, child, child_us)
        yield child
    finally:
        for group in (child, parent):
            _move_out_and_remove(group, home)


def _move_out_and_remove(group: Path, home: Path) -> None:
    """Move what is still in ``group`` (the script's zygote on its way out, say) to ``home``,
    then rmdir it; a process forked meanwhile lands in ``group``, so again until it goes."""
    deadline = time.monotonic() + 10
    while True:
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # gone meanwhile: ESRCH
                    _write(home / "cgroup.procs", pid)
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
    reason="needs an affinity of at least 2 CPUs: with one, a quota of 1 CPU changes nothing",
)


@two_cpus
@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2"])
@pytest.mark.parametrize(
    ("parent_us", "child_us", "usable", "load"),
    [
        (None, PERIOD_US, 1, True),
        (PERIOD_US, None, 1, True),
        (PERIOD_US * 3 // 2, None, 2, False),
    ],
    ids=["own-1-cpu", "parent-1-cpu", "parent-1.5-cpus"],
)
def test_a_nested_cgroup_without_a_namespace_limits_the_workers(
    version: int,
    parent_us: int | None,
    child_us: int | None,
    usable: int,
    load: bool,
    numbered: list[str],
    tmp_path: Path,
) -> None:
    """A script moved into a nested cgroup, no namespace of its own: the root of the hierarchy
    it sees has no quota. Its own cgroup's quota, or else its parent's, sets the count
    (rounded up: 1.5 CPUs are 2), by default and with "auto"; with 1 CPU, one decode process
    runs. ``millicpus`` (the quota found, in thousandths of a CPU) tells 1.5 CPUs from none
    on a machine with only 2."""
    script = tmp_path / "nested.py"
    script.write_text(NESTED_SCRIPT.format(paths=numbered, load=load))
    quota_us = min(q for q in (parent_us, child_us) if q is not None)
    with nested_quota(version, parent_us, child_us) as group:
        got = run_in(group, script, namespace=False)
    want = {"millicpus": quota_us * 1000 // PERIOD_US, "usable": usable, "default": usable, "auto": usable}
    assert got == want | ({"workers": usable} if load else {})


def test_usable_cpus_is_lowered_to_the_quota_rounded_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """``usable_cpus()``: loky's count (affinity, ``LOKY_MAX_CPU_COUNT``, the root's quota)
    lowered to the nested quota rounded up, at least 1; no quota found leaves loky's."""
    for loky, quota, want in [
        (8, Fraction(3, 2), 2),
        (8, Fraction(1, 2), 1),
        (8, Fraction(4), 4),
        (2, Fraction(16), 2),
        (8, None, 8),
    ]:
        monkeypatch.setattr(config, "_loky_cpu_count", lambda n=loky: n)
        monkeypatch.setattr(config, "cpu_quota", lambda q=quota: q)
        assert config.usable_cpus() == want, (loky, quota)


# -- where the quota files are: mountinfo and /proc/self/cgroup from real systems (pure) ------

#: This machine's kind: cgroup v1 with each controller mounted alone, and a cgroup2 with none
#: of them beside it (systemd's hybrid layout); the process in a cgroup made by hand, as
#: ``cgcreate``/``cgexec`` or a batch scheduler would.
HYBRID_V1 = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
    "9:name=systemd:/\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/batch/job_42\n0::/\n",
    [
        (1, "/sys/fs/cgroup/cpu/batch/job_42"),
        (1, "/sys/fs/cgroup/cpu/batch"),
        (1, "/sys/fs/cgroup/cpu"),
        (2, "/sys/fs/cgroup/unified"),
    ],
)

#: Ubuntu 20.04: v1 with ``cpu,cpuacct`` co-mounted (optional fields ``shared:N``), a user's
#: session.
COMOUNTED_V1 = (
    "25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 "
    "rw,nsdelegate\n"
    "35 33 0:30 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup "
    "rw,xattr,name=systemd\n"
    "39 33 0:34 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "40 33 0:35 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup "
    "rw,cpuset\n",
    "12:cpuset:/\n5:cpu,cpuacct:/user.slice\n1:name=systemd:/user.slice/user-1000.slice/session-2.scope\n"
    "0::/user.slice/user-1000.slice/session-2.scope\n",
    [
        (1, "/sys/fs/cgroup/cpu,cpuacct/user.slice"),
        (1, "/sys/fs/cgroup/cpu,cpuacct"),
        (2, "/sys/fs/cgroup/unified/user.slice/user-1000.slice/session-2.scope"),
        (2, "/sys/fs/cgroup/unified/user.slice/user-1000.slice"),
        (2, "/sys/fs/cgroup/unified/user.slice"),
        (2, "/sys/fs/cgroup/unified"),
    ],
)

#: Fedora: cgroup v2 alone, ``systemd-run --user --scope -p CPUQuota=100%``.
PURE_V2 = (
    "22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/mapper/root rw\n"
    "24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw,seclabel\n"
    "26 24 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,seclabel,nsdelegate,memory_recursiveprot\n",
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r6b1c.scope\n",
    [
        (2, "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r6b1c.scope"),
        (2, "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice"),
        (2, "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service"),
        (2, "/sys/fs/cgroup/user.slice/user-1000.slice"),
        (2, "/sys/fs/cgroup/user.slice"),
        (2, "/sys/fs/cgroup"),
    ],
)

#: Docker on v2 (a cgroup namespace of its own): its cgroup is the root it sees.
NAMESPACED_V2 = (
    "1163 1162 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup "
    "rw,nsdelegate,memory_recursiveprot\n",
    "0::/\n",
    [(2, "/sys/fs/cgroup")],
)

#: Docker on v1 without a cgroup namespace (Kubernetes alike): the container's subtree
#: mounted, its path the same in /proc/self/cgroup.
SUBTREE_V1 = (
    "1510 1509 0:33 /docker/0123abcd /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime "
    "master:17 - cgroup cgroup rw,cpu,cpuacct\n",
    "5:cpu,cpuacct:/docker/0123abcd\n",
    [(1, "/sys/fs/cgroup/cpu,cpuacct")],
)

#: Taken on this machine: ``unshare -C`` from ``/probe``, the host's mount kept (its root is
#: ``/..`` from the namespace), then moved to the sibling ``/other``.
OUTSIDE_WITH_HOST_MOUNT = (
    "32 31 0:29 /.. /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n",
    "3:cpuset:/\n2:cpuacct:/\n1:cpu:/../other\n",
    [(1, "/sys/fs/cgroup/cpu/other"), (1, "/sys/fs/cgroup/cpu")],
)

#: The same, with the hierarchy mounted again in the namespace (root ``/``, as a container's
#: is): ``/other`` is outside what it shows, and so is every ancestor of it.
OUTSIDE_WITH_OWN_MOUNT = (
    "48 47 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n",
    "1:cpu:/../other\n",
    [],
)

#: Taken on this machine: ``unshare -C`` in ``/probe/child``, the host's mount kept: the mount
#: shows a cgroup two levels above the namespace's root, by no name this process can see.
ABOVE_THE_NAMESPACE = (
    "32 31 0:29 /../.. /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n",
    "1:cpu:/\n",
    [],
)

#: A mount point with a space (``\040`` in mountinfo), and the same hierarchy mounted twice:
#: read through the mount that shows the most of the chain.
ESCAPED_AND_TWICE = (
    "50 31 0:29 /jobs /mnt/job\\040cgroups rw - cgroup cgroup rw,cpu,cpuacct\n"
    "51 31 0:29 / /mnt/all\\040cgroups rw - cgroup cgroup rw,cpu,cpuacct\n",
    "4:cpu,cpuacct:/jobs/7\n",
    [(1, "/mnt/all cgroups/jobs/7"), (1, "/mnt/all cgroups/jobs"), (1, "/mnt/all cgroups")],
)


@pytest.mark.parametrize(
    ("mountinfo", "proc_cgroup", "dirs"),
    [
        HYBRID_V1,
        COMOUNTED_V1,
        PURE_V2,
        NAMESPACED_V2,
        SUBTREE_V1,
        OUTSIDE_WITH_HOST_MOUNT,
        OUTSIDE_WITH_OWN_MOUNT,
        ABOVE_THE_NAMESPACE,
        ESCAPED_AND_TWICE,
    ],
    ids=[
        "hybrid-v1",
        "comounted-v1",
        "pure-v2",
        "namespaced-v2",
        "subtree-v1",
        "outside-host-mount",
        "outside-own-mount",
        "above-namespace",
        "escaped-twice",
    ],
)
def test_quota_dirs_are_the_own_cgroup_and_its_ancestors(
    mountinfo: str, proc_cgroup: str, dirs: list[tuple[int, str]]
) -> None:
    assert cpus.quota_dirs(proc_cgroup, mountinfo) == dirs


# -- the quota files, in a tree laid out in a temporary folder --------------------------------


def test_v2_the_smallest_cpu_max_up_the_chain_binds(tmp_path: Path) -> None:
    """cgroup v2 ``cpu.max`` at several levels: the smallest of the process's own and its
    ancestors' binds, "max" is none, and a sibling's or a child's smaller quota is not
    this process's."""
    mountinfo, proc_cgroup, _ = PURE_V2
    scope = "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r6b1c.scope"
    proc = lay_out_proc(
        tmp_path,
        mountinfo,
        proc_cgroup,
        {
            f"{scope}/cpu.max": "400000 100000\n",  # 4 CPUs
            f"{scope}/inner/cpu.max": "10000 100000\n",  # a child: not this process's
            f"{scope}/../cpu.max": "max 100000\n",  # app.slice: none
            f"{scope}/../../../cpu.max": "250000 100000\n",  # user-1000.slice: 2.5 CPUs
            f"{scope}/../../../../cpu.max": "300000 100000\n",  # user.slice: 3
            "/sys/fs/cgroup/system.slice/cpu.max": "50000 100000\n",  # a sibling: not ours
        },
    )
    assert cpus.cpu_quota(proc, tmp_path) == Fraction(5, 2)


def test_v2_namespaced_reads_the_root_it_sees(tmp_path: Path) -> None:
    mountinfo, proc_cgroup, _ = NAMESPACED_V2
    proc = lay_out_proc(tmp_path, mountinfo, proc_cgroup, {"/sys/fs/cgroup/cpu.max": "150000 100000\n"})
    assert cpus.cpu_quota(proc, tmp_path) == Fraction(3, 2)


def test_v1_an_ancestors_quota_binds_and_minus_one_is_none(tmp_path: Path) -> None:
    mountinfo, proc_cgroup, _ = COMOUNTED_V1
    cpu = "/sys/fs/cgroup/cpu,cpuacct"
    files = {
        f"{cpu}/user.slice/cpu.cfs_quota_us": "-1\n",
        f"{cpu}/user.slice/cpu.cfs_period_us": "100000\n",
        f"{cpu}/cpu.cfs_quota_us": "25000\n",  # a quarter CPU, per 50 ms
        f"{cpu}/cpu.cfs_period_us": "50000\n",
    }
    proc = lay_out_proc(tmp_path, mountinfo, proc_cgroup, files)
    assert cpus.cpu_quota(proc, tmp_path) == Fraction(1, 2)


def test_no_quota_where_nothing_is_set_or_found(tmp_path: Path) -> None:
    """No /proc (not Linux), no quota files, or a cgroup no mount shows: None, never an
    error, and usable_cpus() is loky's count alone."""
    assert cpus.cpu_quota(tmp_path / "no-proc", tmp_path) is None
    mountinfo, proc_cgroup, _ = PURE_V2
    assert cpus.cpu_quota(lay_out_proc(tmp_path, mountinfo, proc_cgroup, {}), tmp_path) is None
    mountinfo, proc_cgroup, _ = OUTSIDE_WITH_OWN_MOUNT
    outside = tmp_path / "outside"
    outside.mkdir()
    files = {
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "50000\n",
        "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
    }
    assert cpus.cpu_quota(lay_out_proc(outside, mountinfo, proc_cgroup, files), outside) is None


@pytest.mark.parametrize(
    ("version", "files", "quota"),
    [
        (2, {"cpu.max": "max 100000\n"}, None),
        (2, {"cpu.max": "150000 100000\n"}, Fraction(3, 2)),
        (2, {"cpu.max": "0 100000\n"}, None),
        (2, {"cpu.max": "150000\n"}, None),
        (2, {"cpu.max": "150000 0\n"}, None),
        (2, {"cpu.max": "1 2 3\n"}, None),
        (2, {}, None),
        (1, {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}, None),
        (1, {"cpu.cfs_quota_us": "300000\n", "cpu.cfs_period_us": "100000\n"}, Fraction(3)),
        (1, {"cpu.cfs_quota_us": "300000\n"}, None),
        (1, {"cpu.cfs_quota_us": "lots\n", "cpu.cfs_period_us": "100000\n"}, None),
    ],
)
def test_read_quota(tmp_path: Path, version: int, files: dict[str, str], quota: Fraction | None) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert cpus.read_quota(version, tmp_path) == quota
