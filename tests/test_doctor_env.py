"""``aioloader doctor``'s environment check: the pure advice (``aioloader.cli.envadvice``) on
facts built by hand, then the real command on this machine and in a mount namespace whose
``/dev/shm`` is a 64 MB tmpfs, as Docker gives a container."""

from __future__ import annotations

import shutil
import subprocess
import sys
from fractions import Fraction

import pytest
from helpers import script_env

from aioloader.cli.envadvice import GIB, Facts, Finding, findings, render

SECTIONS = [
    "Python and torch",
    "GPUs",
    "CPUs",
    "shared memory",
    "limits and processes",
    "memory",
    "distributed",
]


def _found(facts: Facts, label: str) -> Finding:
    (hit,) = [f for _, found in findings(facts) for f in found if f.label == label]
    return hit


def test_a_small_devshm_is_advice_with_memfd_and_a_warning_where_slabs_fall_back() -> None:
    small = Facts(shm_size=64 << 20, shm_free=60 << 20, slabs="memfd")
    shm = _found(small, "/dev/shm")
    assert shm.value == "64 MiB, 60 MiB free" and not shm.warn
    assert "memfd" in shm.advice and "--shm-size=8g" in shm.advice
    fallback = _found(Facts(shm_size=64 << 20, shm_free=60 << 20, slabs="devshm"), "/dev/shm")
    assert (
        fallback.warn and "fall back to /dev/shm" in fallback.advice and "remount,size=8G" in fallback.advice
    )
    roomy = _found(Facts(shm_size=8 * GIB, shm_free=8 * GIB, slabs="devshm"), "/dev/shm")
    assert roomy == Finding("/dev/shm", "8.0 GiB, 8.0 GiB free")
    assert _found(Facts(shm_size=None), "/dev/shm").value == "absent"


def test_a_low_open_file_limit_says_how_to_raise_it() -> None:
    raisable = _found(Facts(nofile=(1024, 524288)), "open files (ulimit -n)")
    assert raisable.warn and "`ulimit -n 65536`" in raisable.advice and "io_concurrency" in raisable.advice
    assert "`ulimit -n 2048`" in _found(Facts(nofile=(256, 2048)), "open files (ulimit -n)").advice
    capped = _found(Facts(nofile=(1024, 1024)), "open files (ulimit -n)")
    assert capped.warn and "hard limit" in capped.advice and "ulimit -n 1024" not in capped.advice
    for fine in ((65536, 65536), (-1, -1)):
        found = _found(Facts(nofile=fine), "open files (ulimit -n)")
        assert not found.warn and found.advice == ""
    assert (
        _found(Facts(nofile=(-1, -1)), "open files (ulimit -n)").value == "unlimited (hard limit unlimited)"
    )


def test_cpus_a_quota_and_a_single_cpu() -> None:
    quota = Facts(cpu_count=64, affinity=64, quota=Fraction(3, 2), loky_cpus=2, usable_cpus=2)
    assert _found(quota, "cgroup CPU quota").value == "1.5 CPUs"
    usable = _found(quota, "usable CPUs")
    assert usable.value == "2" and "starts 2 decode workers, not 64" in usable.advice and not usable.warn
    one = _found(Facts(cpu_count=8, affinity=1, loky_cpus=1, usable_cpus=1), "usable CPUs")
    assert one.warn and "decoding will be the limit" in one.advice
    assert _found(Facts(cpu_count=4, affinity=4, usable_cpus=4), "usable CPUs").advice == ""


def test_ranks_on_a_node_share_its_cpus() -> None:
    """The doctor says what a loader makes of the launcher's variables: each rank's part of
    the CPUs, taken by itself (no advice to set num_workers by hand); a warning only where
    this rank cannot tell which of the node's it is."""
    torchrun = _found(
        Facts(usable_cpus=64, ranks_env={"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "3"}), "ranks on this node"
    )
    assert torchrun.value == "LOCAL_WORLD_SIZE=8, LOCAL_RANK=3" and not torchrun.warn
    assert "8 ranks (torchrun): each rank's loader takes 8 of the 64 usable CPUs by itself" in torchrun.advice
    ompi = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    found = _found(Facts(usable_cpus=6, ranks_env=ompi), "ranks on this node")
    assert "4 ranks (mpirun): each rank's loader takes 1 of the 6 usable CPUs" in found.advice
    srun = {"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_LOCALID": "1", "SLURM_CPUS_PER_TASK": "5"}
    found = _found(Facts(usable_cpus=16, ranks_env=srun), "ranks on this node")
    assert "2 ranks (srun): each rank's loader takes 5 of the 16" in found.advice
    unknown = _found(Facts(usable_cpus=64, ranks_env={"LOCAL_WORLD_SIZE": "8"}), "ranks on this node")
    assert unknown.warn and "LOCAL_WORLD_SIZE=8 ranks, but not which one this is" in unknown.advice
    # a batch script's variables (no step): one process, as a loader sees it
    script = _found(Facts(usable_cpus=6, ranks_env={"SLURM_NTASKS_PER_NODE": "4"}), "ranks on this node")
    assert script == Finding("ranks on this node", "SLURM_NTASKS_PER_NODE=4")
    alone = _found(Facts(usable_cpus=6), "ranks on this node")
    assert alone == Finding("ranks on this node", "none set")


def test_memory_and_its_cgroup_limit() -> None:
    tight = Facts(mem_total=512 * GIB, mem_available=400 * GIB, cgroup_limit=8 * GIB, cgroup_room=GIB)
    assert _found(tight, "cgroup memory limit").value == "8.0 GiB, 1.0 GiB left"
    left = _found(tight, "memory left")
    assert left.warn and left.value == "1.0 GiB" and "prefetch" in left.advice
    roomy = Facts(mem_total=64 * GIB, mem_available=60 * GIB)
    assert _found(roomy, "cgroup memory limit").value == "none"
    assert not [f for _, found in findings(roomy) for f in found if f.label == "memory left"]


def test_torch_cuda_gpus_and_nvimagecodec() -> None:
    cpu_build = Facts(torch="2.5.0+cpu", torch_cuda=None, driver="550.54.15")
    assert _found(cpu_build, "torch").value == "2.5.0+cpu (a CPU build)"
    cuda = _found(cpu_build, "CUDA")
    assert cuda.warn and "CUDA build of torch" in cuda.advice and "550.54.15" in cuda.value
    assert _found(Facts(torch=None), "torch").warn
    gpus = Facts(torch="2.5.0", torch_cuda="12.4", gpus=("NVIDIA H100, 79.1 GiB",), driver="550.54.15")
    assert _found(gpus, "GPU 0").value == "NVIDIA H100, 79.1 GiB"
    assert 'pip install "aioloader[gpu]"' in _found(gpus, "nvImageCodec").advice
    none = Facts(torch="2.5.0", torch_cuda="12.4")
    assert _found(none, "GPUs").value == "none visible (no NVIDIA driver)"
    assert _found(none, "nvImageCodec").advice == ""  # no GPU: nothing to install it for


def test_the_report_marks_warnings_and_counts_them() -> None:
    facts = Facts(torch="2.5.0", nofile=(1024, 1024), usable_cpus=1, cpu_count=1, affinity=1)
    text = render(findings(facts))
    titles = [line[1:-1] for line in text.splitlines() if line.startswith("[")]
    assert titles == SECTIONS
    marked = [line for line in text.splitlines() if line.startswith(" ! ")]
    assert len(marked) == 2 and text.endswith("2 warnings (marked !).")
    assert render(findings(Facts(torch="2.5.0", nofile=(65536, 65536), usable_cpus=4))).endswith(
        "no warnings."
    )


def _doctor(prefix: list[str] | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [*(prefix or []), sys.executable, "-m", "aioloader", "doctor"],
        capture_output=True,
        text=True,
        env={**script_env(), **(env or {})},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_command_checks_this_machine() -> None:
    out = _doctor()
    positions = [out.index(f"[{title}]\n") for title in SECTIONS]
    assert positions == sorted(positions)
    leftovers = out.index("aioloader doctor: /dev/shm\n")
    assert leftovers > positions[-1]  # the leftovers come last, as before
    import torch

    assert f"torch                          {torch.__version__}" in out
    from aioloader.config import usable_cpus

    assert f"usable CPUs                    {usable_cpus()}" in out
    for label in (
        "open files (ulimit -n)",
        "multiprocessing start method",
        "/dev/shm",
        "cgroup memory limit",
    ):
        assert f" {label} " in out, label


DEVSHM_64MB = 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"'


def test_a_64mb_devshm_is_found(tmp_path: object) -> None:
    """A mount namespace of its own (``unshare -m``) with a 64 MB tmpfs on ``/dev/shm``: the
    doctor reports it, as advice while slabs are memfd and as a warning where they would be
    files there (``AIOLOADER_SLABS=devshm``). Root only (CI runs as root)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare command")
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", DEVSHM_64MB, "sh", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a new mount namespace: {probe.stderr.strip()}")
    prefix = [unshare, "-m", "sh", "-c", DEVSHM_64MB, "sh"]
    out = _doctor(prefix, {"AIOLOADER_SLABS": "auto"})
    (line,) = [line for line in out.splitlines() if line[3:].startswith("/dev/shm ")]
    assert line.startswith("   ") and "64 MiB, 64 MiB free" in line
    assert "aioloader's batches are memfd here" in out and "--shm-size=8g" in out
    out = _doctor(prefix, {"AIOLOADER_SLABS": "devshm"})
    (line,) = [line for line in out.splitlines() if line[3:].startswith("/dev/shm ")]
    assert line.startswith(" ! ") and "64 MiB" in line
    assert "the loader's slabs fall back to /dev/shm here" in out and "files in /dev/shm" in out
