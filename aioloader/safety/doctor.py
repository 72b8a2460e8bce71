"""``aioloader doctor``: find, and with ``--remove`` remove, what dead loaders left in
shared memory.

A loader's semaphores are ``/dev/shm/sem.mp-aioloader-<pid>-<random>`` and, where its slabs
cannot be memfd segments (or ``AIOLOADER_SLABS=devshm``), its segments are
``/dev/shm/aioloader-<pid>-<n>-<random>``, named for the process that made them (memfd
slabs have no name: they end with the last process holding them, and never show here). A
trainer that dies leaves none (:mod:`aioloader.safety.lifeline`), except when its whole process group died
at once, resource tracker included (``kill -9 -PGID``, a cgroup's OOM kill), or with an
aioloader older than that guarantee. A name whose pid no longer runs is a leftover: its
memory is held by the name alone, and removing it frees the memory once no process maps it.

Pids are judged in this process's pid namespace: where containers share ``/dev/shm`` but not
pids, run the doctor inside the container whose trainers made the names.

The scanning and judging are plain functions (:func:`scan`, :func:`remove`,
:func:`report`); the CLI in :mod:`aioloader.cli` only prints them.
"""

from __future__ import annotations

import dataclasses
import os
import re

__all__ = ["Entry", "is_running", "remove", "report", "scan", "size_text"]

SHM_DIR = "/dev/shm"
_NAME = re.compile(r"^(?:aioloader|sem\.mp-aioloader)-(\d+)-")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One aioloader name in the shared-memory folder: ``kind`` is ``"segment"`` or
    ``"semaphore"``; ``size`` in bytes; ``alive`` whether its maker's ``pid`` runs."""

    name: str
    pid: int
    kind: str
    size: int
    alive: bool


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a running process here (a zombie has ended; another user's
    process is running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def scan(folder: str = SHM_DIR) -> list[Entry]:
    """Every aioloader segment and semaphore in ``folder``, sorted by pid then name."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    entries = []
    running: dict[int, bool] = {}
    for name in names:
        match = _NAME.match(name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            size = os.stat(os.path.join(folder, name)).st_size
        except FileNotFoundError:  # removed meanwhile
            continue
        if pid not in running:
            running[pid] = is_running(pid)
        kind = "semaphore" if name.startswith("sem.") else "segment"
        entries.append(Entry(name, pid, kind, size, running[pid]))
    return sorted(entries, key=lambda e: (e.pid, e.name))


def remove(entries: list[Entry], folder: str = SHM_DIR) -> tuple[list[Entry], list[str]]:
    """Unlink the leftovers among ``entries`` (never a name whose maker runs; re-checked
    now). Returns what was removed and one message per name that could not be."""
    removed, errors = [], []
    for entry in entries:
        if entry.alive or is_running(entry.pid):
            continue
        try:
            os.unlink(os.path.join(folder, entry.name))
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{entry.name}: {exc.strerror or exc}")
            continue
        removed.append(entry)
    return removed, errors


def size_text(n: float) -> str:
    """``n`` bytes for a reader: ``"12.8 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def report(entries: list[Entry], folder: str = SHM_DIR, hint: bool = True) -> str:
    """What :func:`scan` found, as the doctor prints it: leftovers one per line, the names of
    running loaders as one count; ``hint`` says how to remove the leftovers."""
    left = [e for e in entries if not e.alive]
    live = [e for e in entries if e.alive]
    lines = [f"aioloader doctor: {folder}"]
    for e in left:
        lines.append(f"  {e.name:<44} {size_text(e.size):>10}  {e.kind:<9}  pid {e.pid} is gone")
    if live:
        pids = sorted({e.pid for e in live})
        lines.append(
            f"  ({len(live)} in use by running process{'es' if len(pids) > 1 else ''} "
            f"{', '.join(map(str, pids))}: left alone)"
        )
    if left:
        dead = len({e.pid for e in left})
        total = sum(e.size for e in left)
        lines.append(
            f"{len(left)} leftover{'s' if len(left) > 1 else ''} of {dead} dead "
            f"process{'es' if dead > 1 else ''} ({size_text(total)})."
            + (" Run `aioloader doctor --remove` to remove them." if hint else "")
        )
    else:
        lines.append("no leftovers: nothing of a dead loader is in shared memory.")
    return "\n".join(lines)
