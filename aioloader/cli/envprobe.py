"""``aioloader doctor``'s measurements: the environment a loader will meet, read into a
:class:`~aioloader.cli.envadvice.Facts` (judged there, without I/O).

Each probe reads what the loader itself reads (``usable_cpus()``, the cgroup files, the
slab kind ``AIOLOADER_SLABS`` leads to, the open-file limit), so the doctor reports what a
loader started here would find. A probe that cannot read its source leaves None: the doctor
must run everywhere, a broken driver or a missing ``/proc`` included.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing as mp
import os
import platform
import re
import shutil
import sys

from aioloader.base.cgmemory import cgroup_limit, cgroup_room
from aioloader.base.cpus import cpu_quota
from aioloader.base.semnames import import_loky_cpu_count
from aioloader.cli.envadvice import Facts
from aioloader.config import usable_cpus
from aioloader.errors import LoaderError
from aioloader.memory.segments import SHM_DIR, choose_kind
from aioloader.plan.node import VARIABLES

__all__ = ["probe"]


def _torch() -> tuple[str | None, str | None, tuple[str, ...]]:
    """torch's version, its CUDA version (None: a CPU build) and the GPUs it sees."""
    try:
        import torch
    except ImportError:
        return None, None, ()
    gpus: list[str] = []
    try:
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            props = torch.cuda.get_device_properties(i)
            gpus.append(f"{props.name}, {props.total_memory / (1 << 30):.1f} GiB")
    except RuntimeError as exc:  # a driver torch cannot talk to: say so in place of a GPU
        gpus.append(f"unusable: {exc}")
    return str(torch.__version__), torch.version.cuda, tuple(gpus)


def _driver(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA kernel module's version, as its ``/proc`` file gives it (no nvidia-smi:
    a container may have the driver without the tools)."""
    try:
        with open(path) as f:
            match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", f.read())
    except OSError:
        return None
    return match.group(1) if match else "present"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on macOS
        return None


def _shm() -> tuple[int | None, int | None, str | None]:
    """``/dev/shm``'s size and free bytes, and where a loader's slabs would go."""
    try:
        kind = choose_kind()
    except LoaderError:  # AIOLOADER_SLABS misspelt: the loader would raise the same
        kind = None
    try:
        usage = shutil.disk_usage(SHM_DIR)
    except OSError:
        return None, None, kind
    return usage.total, usage.free, kind


def _nofile() -> tuple[int, int] | None:
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    return (-1 if soft == unlimited else soft, -1 if hard == unlimited else hard)


def _meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """``MemTotal`` and ``MemAvailable`` in bytes (absent where unreadable)."""
    found = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    found[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


def probe() -> Facts:
    """Measure this process's environment."""
    torch, torch_cuda, gpus = _torch()
    shm_size, shm_free, slabs = _shm()
    mem = _meminfo()
    return Facts(
        python=f"{platform.python_version()} ({sys.executable}) on {platform.platform()}",
        torch=torch,
        torch_cuda=torch_cuda,
        gpus=gpus,
        driver=_driver(),
        nvimgcodec=_version("nvidia-nvimgcodec-cu12") or _version("nvidia-nvimgcodec-cu13"),
        cpu_count=os.cpu_count(),
        affinity=_affinity(),
        quota=cpu_quota(),
        loky_cpus=int(import_loky_cpu_count()()),
        usable_cpus=usable_cpus(),
        shm_size=shm_size,
        shm_free=shm_free,
        slabs=slabs,
        nofile=_nofile(),
        start_method=mp.get_start_method(allow_none=True) or mp.get_context().get_start_method(),
        start_methods=tuple(mp.get_all_start_methods()),
        mem_total=mem.get("MemTotal"),
        mem_available=mem.get("MemAvailable"),
        cgroup_limit=cgroup_limit(),
        cgroup_room=cgroup_room(),
        ranks_env={n: os.environ[n] for n in VARIABLES if n in os.environ},  # what a loader reads
    )
