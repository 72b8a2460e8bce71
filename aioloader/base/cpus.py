"""The CPU quota of this process's own cgroup and its ancestors (Linux), found the way the JVM
and Go's automaxprocs find it: ``/proc/self/cgroup`` names the process's cgroup in each
hierarchy, ``/proc/self/mountinfo`` says where that hierarchy is mounted and which of its
cgroups the mount shows at its mount point.

loky's ``cpu_count`` reads the quota files at the mount point only (``/sys/fs/cgroup``). In
a container that is the container's own cgroup (a cgroup namespace, or its subtree mounted
there), but a process put into a nested cgroup on a host (``systemd-run -p CPUQuota=``,
Slurm, a hand-made v1 cgroup) finds no quota there: its quota is on its own cgroup or an
ancestor. The kernel enforces every quota on the way up, so the smallest one binds.

Quotas are in CPUs: quota time over period time, a :class:`~fractions.Fraction` (exact, so
rounding it up never turns 2 CPUs into 3). Parsing is pure (text in, paths out); what reads
files takes its roots as arguments, so tests can lay a tree out anywhere. Nothing here
raises: a file that is missing, unreadable or malformed sets no quota.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

__all__ = ["Mount", "cgroup_mounts", "cgroup_paths", "cpu_quota", "quota_dirs", "read_quota"]

V1, V2 = 1, 2


@dataclass(frozen=True)
class Mount:
    """A cgroup hierarchy as mounted: ``root`` is the cgroup shown at ``mountpoint``, a path
    in the hierarchy relative to this process's cgroup namespace (``/`` when the whole
    hierarchy, as this namespace sees it, is mounted; ``/docker/<id>`` when only a
    container's subtree is; ``/..`` when the mount shows a cgroup above the namespace's)."""

    version: int  # 1: a v1 hierarchy holding the controller asked for (``cpu``); 2: the unified one
    root: str
    mountpoint: str


def _unescape(field: str) -> str:
    # mountinfo writes a space, tab, newline and backslash in a path as \ooo (octal).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_mounts(mountinfo: str, controller: str = "cpu") -> list[Mount]:
    """The cgroup mounts where a CPU quota (``controller``: another controller's limit) may be
    read, from ``/proc/<pid>/mountinfo``'s text: every cgroup2 mount, and every v1 mount whose
    hierarchy holds the controller (alone or co-mounted, as ``cpu,cpuacct``), in the order
    listed."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        # 6 fixed fields, optional fields up to a lone "-", then fstype, source, super options.
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 4:
            continue
        fstype, superopts = fields[sep + 1], fields[sep + 3].split(",")
        root, mountpoint = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            mounts.append(Mount(V2, root, mountpoint))
        elif fstype == "cgroup" and controller in superopts:
            mounts.append(Mount(V1, root, mountpoint))
    return mounts


def cgroup_paths(proc_cgroup: str, controller: str = "cpu") -> dict[int, str]:
    """This process's cgroup in each hierarchy that may hold a quota, from
    ``/proc/<pid>/cgroup``'s text (``hierarchy-id:controllers:path`` lines): ``{1: path}`` for
    the v1 hierarchy with ``controller`` (``cpu``; ``memory``: its own hierarchy, on most v1
    hosts), ``{2: path}`` for the unified one (``0::``).
    Paths are relative to this process's cgroup namespace; outside it they start ``/..``."""
    paths: dict[int, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)  # a path may hold ":"
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            paths[V2] = path
        elif controller in controllers.split(","):
            paths[V1] = path
    return paths


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def quota_dirs(proc_cgroup: str, mountinfo: str, controller: str = "cpu") -> list[tuple[int, str]]:
    """``(version, directory)`` for each cgroup whose quota binds this process, as seen from
    this mount namespace: its own cgroup first, then each ancestor up to the root of the mount
    it is seen through, for v1 and v2 alike (pure). ``controller``: whose limits (``cpu``, or
    ``memory``: on v1, the hierarchy that holds it, not the ``cpu`` one).

    A hierarchy mounted more than once is read through the mount that shows most of the
    chain (the shallowest root above the cgroup). A cgroup no mount of its hierarchy shows (a
    path outside the mount's root, ``/../..`` when moved out of its namespace's root) adds
    nothing: none of its ancestors is visible either, and a mount point showing some other
    cgroup's quota would be wrong to read.
    """
    mounts = cgroup_mounts(mountinfo, controller)
    dirs: list[tuple[int, str]] = []
    for version, path in sorted(cgroup_paths(proc_cgroup, controller).items()):
        own = _parts(path)
        best: tuple[Mount, list[str]] | None = None
        for mount in mounts:
            root = _parts(mount.root)
            rel = own[len(root) :]
            # The kernel writes canonical paths, ".." only leading: a literal prefix is an
            # ancestor, and a ".." left below it means above the mount's root.
            if mount.version != version or own[: len(root)] != root or ".." in rel:
                continue
            if best is None or len(rel) > len(best[1]):
                best = (mount, rel)
        if best is not None:
            mount, rel = best
            dirs += [(version, posixpath.join(mount.mountpoint, *rel[:k])) for k in range(len(rel), -1, -1)]
    return dirs


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_quota(version: int, directory: str | Path) -> Fraction | None:
    """The CPU quota set on one cgroup, in CPUs (``Fraction(3, 2)`` for 150 ms per 100 ms
    period), or None where it sets none: v2 ``cpu.max`` reads ``max <period>`` or is absent
    (the root cgroup, or the ``cpu`` controller not enabled there), v1 ``cpu.cfs_quota_us``
    is -1. A quota or period that is not a positive integer counts as none."""
    directory = Path(directory)
    if version == V2:
        fields = (_read(directory / "cpu.max") or "").split()
    else:
        fields = [_read(directory / "cpu.cfs_quota_us") or "", _read(directory / "cpu.cfs_period_us") or ""]
    try:
        q, p = (int(f) for f in fields)  # "max", a missing file, a third field: no quota
    except ValueError:
        return None
    return Fraction(q, p) if q > 0 and p > 0 else None


def cpu_quota(proc: str | Path = "/proc/self", root: str | Path = "/") -> Fraction | None:
    """The smallest CPU quota over this process's cgroup and its ancestors, in CPUs, or None
    where none is set or none can be found (no ``/proc``: not Linux).

    ``proc``: the ``/proc/<pid>`` directory whose ``cgroup`` and ``mountinfo`` are read.
    ``root``: the directory the mount points in ``mountinfo`` lie under (``/``; a tree laid
    out elsewhere in tests)."""
    proc_cgroup, mountinfo = _read(Path(proc, "cgroup")), _read(Path(proc, "mountinfo"))
    if proc_cgroup is None or mountinfo is None:
        return None
    quotas = [
        quota
        for version, directory in quota_dirs(proc_cgroup, mountinfo)
        if (quota := read_quota(version, Path(root, directory.lstrip("/")))) is not None
    ]
    return min(quotas, default=None)
