"""Memory this process may still take: the system's ``MemAvailable`` lowered to the room left
under the memory limit of its own cgroup and of each ancestor (v2 ``memory.max`` minus
``memory.current``, v1 ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes``), found
through the same chain of cgroups as the CPU quota (:func:`aioloader.base.cpus.quota_dirs`), in
the v1 hierarchy of the ``memory`` controller (mounted apart from the ``cpu`` one).
A container limited to 8 GiB on a 512 GiB host has at most 8 GiB, less what it uses.
Nothing here raises: what cannot be read limits nothing."""

from __future__ import annotations

from pathlib import Path

from aioloader.base.cpus import V2, quota_dirs

__all__ = ["available_memory", "cgroup_limit", "cgroup_room", "mem_available"]


def _int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # "max", missing, unreadable: no limit here
        return None


def _limits(proc: str | Path, root: str | Path) -> list[tuple[int, int]]:
    """``(limit, used)`` bytes of each memory limit set over this process's cgroup and its
    ancestors."""
    try:
        proc_cgroup = Path(proc, "cgroup").read_text()
        mountinfo = Path(proc, "mountinfo").read_text()
    except OSError:
        return []
    found = []
    for version, directory in quota_dirs(proc_cgroup, mountinfo, "memory"):
        d = Path(root, directory.lstrip("/"))
        limit, used = (
            (_int(d / "memory.max"), _int(d / "memory.current"))
            if version == V2
            else (_int(d / "memory.limit_in_bytes"), _int(d / "memory.usage_in_bytes"))
        )
        # v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages): beyond any machine.
        if limit is not None and used is not None and limit < 1 << 60:
            found.append((limit, used))
    return found


def cgroup_room(proc: str | Path = "/proc/self", root: str | Path = "/") -> int | None:
    """Bytes left under the tightest memory limit over this process's cgroup and its
    ancestors (never below 0), or None where none is set. ``proc``, ``root``: as for
    :func:`~aioloader.base.cpus.cpu_quota`."""
    return min((max(0, limit - used) for limit, used in _limits(proc, root)), default=None)


def cgroup_limit(proc: str | Path = "/proc/self", root: str | Path = "/") -> int | None:
    """The smallest memory limit, in bytes, over this process's cgroup and its ancestors, or
    None where none is set (what ``aioloader doctor`` reports beside the room left)."""
    return min((limit for limit, _ in _limits(proc, root)), default=None)


def mem_available(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """Linux's ``MemAvailable`` in bytes, or None."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory() -> int | None:
    """Bytes this process may still allocate: the smaller of :func:`mem_available` and
    :func:`cgroup_room`, None where neither is known."""
    known = [n for n in (mem_available(), cgroup_room()) if n is not None]
    return min(known, default=None)
