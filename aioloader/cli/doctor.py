"""``aioloader doctor``: the environment a loader will meet, checked as ``python -m
torch.utils.collect_env`` reports it (torch and CUDA, GPUs, CPUs and quotas, ``/dev/shm``,
limits, memory, ranks), each finding with what to do; then the shared memory dead loaders
left (:mod:`aioloader.safety.doctor`), removed with ``--remove``.

Measuring is :mod:`aioloader.cli.envprobe`'s, judging :mod:`aioloader.cli.envadvice`'s;
this module prints them in order.
"""

from __future__ import annotations

from aioloader.cli.envadvice import findings, render
from aioloader.cli.envprobe import probe
from aioloader.safety import doctor

__all__ = ["run_doctor"]


def run_doctor(remove: bool) -> int:
    """Print the environment's findings and the leftovers; with ``remove``, remove these.
    Returns the exit status: 1 when a leftover could not be removed, else 0 (findings are
    advice, never a failure)."""
    print("aioloader doctor: the environment", flush=True)
    print(render(findings(probe())), flush=True)
    print(flush=True)
    entries = doctor.scan()
    print(doctor.report(entries, hint=not remove), flush=True)
    if not remove:
        return 0
    removed, errors = doctor.remove(entries)
    freed = doctor.size_text(sum(e.size for e in removed))
    print(f"removed {len(removed)} leftover{'s' if len(removed) != 1 else ''} ({freed}).")
    for message in errors:
        print(f"could not remove {message}")
    return 1 if errors else 0
