"""``aioloader doctor``'s judgement, pure: measured facts in (:class:`Facts`, filled by
:mod:`aioloader.cli.envprobe`), findings out, each with what to do about it.

No I/O here (an import-linter contract keeps it so): every threshold and every line of
advice is decided from the facts alone, so tests build facts by hand and check the advice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from aioloader.plan.node import cpus_per_rank, node_ranks

__all__ = ["Facts", "Finding", "findings", "gib", "render"]

GIB = 1 << 30
#: Below this, a ``/dev/shm`` holds few batches (Docker's default is 64 MB).
SMALL_SHM = GIB
#: Below this soft open-file limit the loader lowers ``io_concurrency`` to fit (each read in
#: flight holds a descriptor, so do the slabs and the workers' pipes).
LOW_NOFILE = 4096
#: Below this much memory left, a loader's prefetched batches and workers may not fit.
LOW_MEMORY = 2 * GIB


@dataclass(frozen=True)
class Facts:
    """What the probe measured; None where it could not be read (not Linux, no file)."""

    python: str = ""
    torch: str | None = None  # torch.__version__; None: not importable
    torch_cuda: str | None = None  # torch.version.cuda; None: a CPU build
    gpus: tuple[str, ...] = ()  # one description per visible GPU
    driver: str | None = None  # the NVIDIA kernel driver's version
    nvimgcodec: str | None = None  # nvidia-nvimgcodec's version; None: not installed
    cpu_count: int | None = None  # os.cpu_count(): the machine's
    affinity: int | None = None  # CPUs this process may be scheduled on
    quota: Fraction | None = None  # cgroup CPU quota, in CPUs
    loky_cpus: int | None = None  # loky's cpu_count()
    usable_cpus: int = 1  # aioloader.config.usable_cpus()
    shm_size: int | None = None  # /dev/shm bytes; None: no /dev/shm
    shm_free: int | None = None
    slabs: str | None = None  # where batch slabs go: "memfd", "devshm" or None (pickled)
    nofile: tuple[int, int] | None = None  # RLIMIT_NOFILE (soft, hard); -1: unlimited
    start_method: str | None = None  # multiprocessing's default
    start_methods: tuple[str, ...] = ()  # those this platform has
    mem_total: int | None = None
    mem_available: int | None = None
    cgroup_limit: int | None = None  # the tightest cgroup memory limit
    cgroup_room: int | None = None  # bytes left under it
    ranks_env: Mapping[str, str] = field(default_factory=dict)  # LOCAL_WORLD_SIZE, ...


@dataclass(frozen=True)
class Finding:
    """One line of the report: ``label: value``; ``advice`` what to do (empty when
    nothing); ``warn`` marks what may hold a loader back."""

    label: str
    value: str
    advice: str = ""
    warn: bool = False


def gib(n: float) -> str:
    """``n`` bytes for a reader, in MiB below 1 GiB: ``"64 MiB"``, ``"15.6 GiB"``."""
    return f"{n / (1 << 20):.0f} MiB" if n < GIB else f"{n / GIB:.1f} GiB"


def torch_findings(f: Facts) -> list[Finding]:
    if f.torch is None:
        return [Finding("torch", "not importable", "pip install torch (any torch >= 2.1)", warn=True)]
    build = f"CUDA {f.torch_cuda}" if f.torch_cuda else "a CPU build"
    out = [Finding("torch", f"{f.torch} ({build})")]
    if f.torch_cuda is None and f.driver is not None:
        out.append(
            Finding(
                "CUDA",
                f"driver {f.driver} present, torch cannot use it",
                "install a CUDA build of torch (pytorch.org's selector) to load with device='cuda'",
                warn=True,
            )
        )
    return out


def gpu_findings(f: Facts) -> list[Finding]:
    driver = f"driver {f.driver}" if f.driver else "no NVIDIA driver"
    if not f.gpus:
        out = [Finding("GPUs", f"none visible ({driver})", "device=None: batches stay on the CPU")]
    else:
        out = [Finding(f"GPU {i}", gpu) for i, gpu in enumerate(f.gpus)]
        out.append(Finding("driver", f.driver or "unknown"))
    if f.nvimgcodec is not None:
        out.append(Finding("nvImageCodec", f.nvimgcodec))
    else:
        advice = "ImageDecoder(device='cuda') needs it: pip install \"aioloader[gpu]\"" if f.gpus else ""
        out.append(Finding("nvImageCodec", "not installed", advice))
    return out


def cpu_findings(f: Facts) -> list[Finding]:
    quota = "none" if f.quota is None else f"{float(f.quota):g} CPUs"
    out = [
        Finding("CPUs", f"{f.cpu_count} on the machine, {f.affinity} in this process's affinity"),
        Finding("cgroup CPU quota", quota),
        Finding("loky cpu_count()", str(f.loky_cpus)),
    ]
    advice, warn = "", False
    if f.usable_cpus == 1:
        advice, warn = "one CPU for the trainer and the decode workers: decoding will be the limit", True
    elif f.cpu_count is not None and f.usable_cpus < f.cpu_count:
        advice = f"num_workers=None starts {f.usable_cpus} decode workers, not {f.cpu_count}"
    out.append(Finding("usable CPUs", str(f.usable_cpus), advice, warn))
    return out


def shm_findings(f: Facts) -> list[Finding]:
    slabs = {"memfd": "memfd (not /dev/shm)", "devshm": "files in /dev/shm", None: "none (pickled)"}
    out = [Finding("batch slabs", slabs.get(f.slabs, str(f.slabs)))]
    if f.shm_size is None:
        return [
            *out,
            Finding("/dev/shm", "absent", "multiprocessing's semaphores need it: mount a tmpfs there"),
        ]
    value = f"{gib(f.shm_size)}, {gib(f.shm_free or 0)} free"
    if f.shm_size >= SMALL_SHM:
        return [*out, Finding("/dev/shm", value)]
    enlarge = "docker run --shm-size=8g, or as root: mount -o remount,size=8G /dev/shm"
    if f.slabs == "memfd":
        advice = (
            "small, but aioloader's batches are memfd here and do not use it; "
            f"DataLoader workers (or AIOLOADER_SLABS=devshm) would: {enlarge}"
        )
        return [*out, Finding("/dev/shm", value, advice)]
    advice = f"the loader's slabs fall back to /dev/shm here; a batch that does not fit fails: {enlarge}"
    return [*out, Finding("/dev/shm", value, advice, warn=True)]


def limit_findings(f: Facts) -> list[Finding]:
    if f.nofile is None:
        nofile = Finding("open files (ulimit -n)", "unknown")
    else:
        soft, hard = f.nofile
        shown = "unlimited" if soft < 0 else str(soft)
        value = f"{shown} (hard limit {'unlimited' if hard < 0 else hard})"
        if 0 <= soft < LOW_NOFILE:
            target = 65536 if hard < 0 else min(hard, 65536)
            if target > soft:
                advice = f"`ulimit -n {target}` in the shell that starts the job"
            else:  # the soft limit is already the hard one: only an administrator raises it
                advice = "raise the hard limit (/etc/security/limits.conf, docker run --ulimit nofile=65536)"
            advice = f"reads in flight (io_concurrency) are lowered to fit: {advice}"
            nofile = Finding("open files (ulimit -n)", value, advice, warn=True)
        else:
            nofile = Finding("open files (ulimit -n)", value)
    method = Finding("multiprocessing start method", f.start_method or "unknown")
    if "forkserver" in f.start_methods:
        workers = Finding("decode workers", "forked by aioloader's zygote, else by a forkserver")
    else:
        workers = Finding(
            "decode workers",
            "spawned (no forkserver here)",
            "each worker imports your script's modules again: keep the script's work under "
            "if __name__ == '__main__'",
        )
    return [nofile, method, workers]


def memory_findings(f: Facts) -> list[Finding]:
    out = [
        Finding(
            "memory",
            f"{gib(f.mem_total)} total, {gib(f.mem_available)} available"
            if f.mem_total is not None and f.mem_available is not None
            else "unknown",
        )
    ]
    if f.cgroup_limit is not None:
        out.append(Finding("cgroup memory limit", f"{gib(f.cgroup_limit)}, {gib(f.cgroup_room or 0)} left"))
    else:
        out.append(Finding("cgroup memory limit", "none"))
    left = [n for n in (f.mem_available, f.cgroup_room) if n is not None]
    if left and min(left) < LOW_MEMORY:
        out.append(
            Finding(
                "memory left",
                gib(min(left)),
                "little room for prefetched batches and workers: lower prefetch or batch_size, "
                "or give the job more memory",
                warn=True,
            )
        )
    return out


def rank_findings(f: Facts) -> list[Finding]:
    """What a loader makes of the launcher's variables (:func:`aioloader.plan.node.node_ranks`):
    each rank's part of the CPUs, which it takes by itself; a warning only where the ranks of
    the node cannot be told apart."""
    shown = ", ".join(f"{n}={v}" for n, v in f.ranks_env.items()) or "none set"
    node = node_ranks(f.ranks_env)
    if node.ranks <= 1:
        return [Finding("ranks on this node", shown)]
    share = cpus_per_rank(f.usable_cpus, node)
    if node.local_rank is None:
        advice = (
            f"{node.source}={node.ranks} ranks, but not which one this is: device='cuda' would be "
            "cuda:0 for every rank; pass device='cuda:N' or call torch.cuda.set_device(...)"
        )
        return [Finding("ranks on this node", shown, advice, warn=True)]
    advice = (
        f"{node.ranks} ranks ({node.launcher}): each rank's loader takes {share} of the "
        f"{f.usable_cpus} usable CPUs by itself (num_workers=None), and device='cuda' is its own GPU"
    )
    return [Finding("ranks on this node", shown, advice)]


def findings(f: Facts) -> list[tuple[str, list[Finding]]]:
    """The report's sections, in order, each a title and its findings."""
    return [
        ("Python and torch", [Finding("python", f.python), *torch_findings(f)]),
        ("GPUs", gpu_findings(f)),
        ("CPUs", cpu_findings(f)),
        ("shared memory", shm_findings(f)),
        ("limits and processes", limit_findings(f)),
        ("memory", memory_findings(f)),
        ("distributed", rank_findings(f)),
    ]


def render(sections: list[tuple[str, list[Finding]]]) -> str:
    """The sections as the doctor prints them: ``[title]``, then one line per finding, its
    advice on the next line after ``->``, and a closing count of warnings."""
    lines = []
    for title, found in sections:
        lines.append(f"[{title}]")
        for item in found:
            mark = "!" if item.warn else " "
            lines.append(f" {mark} {item.label:<30} {item.value}")
            if item.advice:
                lines.append(f"   {'':<30} -> {item.advice}")
    warned = sum(item.warn for _, found in sections for item in found)
    lines.append(f"{warned} warning{'s' if warned != 1 else ''} (marked !)." if warned else "no warnings.")
    return "\n".join(lines)
