"""aioloader under torch.distributed: two real ranks launched by ``torchrun`` on the CPU
(gloo), rank and world size taken from the process group (tests/ddp_script.py); the node's
CPUs divided between them, and each rank's GPU (tests/ranks_script.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import script_env

HERE = os.path.dirname(__file__)


def torchrun(tmp_path: Path, phase: str, paths_file: Path, script: str = "ddp_script.py") -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        os.path.join(HERE, script), str(paths_file), str(tmp_path), phase,
    ]  # fmt: skip
    env = script_env()
    if phase != "cuda":
        env.pop("CUDA_VISIBLE_DEVICES", None)
    launchers = (
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    )
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_LOCALID", *launchers):
        env.pop(name, None)  # the launcher's own, not this process's
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]


def load(tmp_path: Path, rank: int, phase: str) -> dict[str, list[list[int]]]:
    with open(tmp_path / f"rank{rank}-{phase}.json") as f:
        return json.load(f)  # type: ignore[no-any-return]


@pytest.mark.timeout(300)
def test_two_ranks_shard_and_resume_under_torchrun(numbered: list[str], tmp_path: Path) -> None:
    paths_file = tmp_path / "paths.json"
    paths_file.write_text(json.dumps(numbered))
    for phase in ("full", "stop", "resume"):
        torchrun(tmp_path, phase, paths_file)

    full = [load(tmp_path, r, "full") for r in range(2)]
    shards = [[i for b in rec["batches"] for i in b] for rec in full]
    # 37 files over 2 ranks: 19 each (one repeated to pad, like DistributedSampler), 7 batches of 3
    assert [len(rec["batches"]) for rec in full] == [rec["len"] for rec in full] == [7, 7]
    assert set(shards[0]) | set(shards[1]) == set(range(37))
    assert len(set(shards[0]) & set(shards[1])) <= 1 and sum(map(len, shards)) == 38

    for r in range(2):  # stopped after 2 batches, resumed in a new job: the same batches
        stopped, resumed = load(tmp_path, r, "stop"), load(tmp_path, r, "resume")
        assert stopped["batches"] + resumed["batches"] == full[r]["batches"]


def ranks(tmp_path: Path, numbered: list[str], mode: str) -> list[dict[str, Any]]:
    paths_file = tmp_path / "paths.json"
    paths_file.write_text(json.dumps(numbered))
    torchrun(tmp_path, mode, paths_file, "ranks_script.py")
    return [json.loads((tmp_path / f"ranks-{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(300)
def test_two_ranks_on_one_node_divide_its_cpus_and_each_has_its_gpu(
    numbered: list[str], tmp_path: Path
) -> None:
    """``torchrun --nproc-per-node 2`` on the CPU: each rank's default ``num_workers`` is the
    node's usable CPUs halved (at least 1), as ``stats`` says, and each loads its shard with
    them. Which GPU ``device="cuda"`` would be, by the pure rule over each rank's real
    environment: its local rank's of two GPUs; of one GPU, cuda:0 for both, with a warning."""
    records = ranks(tmp_path, numbered, "cpu")
    assert sorted(rec["local_rank"] for rec in records) == [0, 1]
    for rec in records:
        share = max(1, rec["usable"] // 2)
        assert rec["num_workers"] == rec["decoding"] == rec["cpus_per_rank"] == share, rec
        assert rec["ranks_on_node"] == 2, rec
        assert rec["batches"] == 5 and rec["devices"] == ["cpu"], rec  # 19 of the 37 files
        assert rec["gpu_of_two"] == rec["local_rank"], rec
        index, warning = rec["gpu_of_one"]
        assert index == 0 and "LOCAL_WORLD_SIZE=2 ranks on this node and 1 visible CUDA device" in warning
        assert rec["warnings"] == [], rec


@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_device_cuda_is_each_ranks_own_gpu_under_torchrun(numbered: list[str], tmp_path: Path) -> None:
    """``device="cuda"`` in a loader made before any ``torch.cuda.set_device``: with two GPUs
    or more each rank's batches arrive on its local rank's GPU, silently; with one, both
    ranks deliver to cuda:0 and each says so in a WARNING."""
    import torch

    records = ranks(tmp_path, numbered, "cuda")
    for rec in records:
        if torch.cuda.device_count() >= 2:
            want = f"cuda:{rec['local_rank']}"
            assert rec["devices"] == [want] and rec["config_device"] == want and rec["warnings"] == [], rec
        else:
            assert rec["devices"] == ["cuda:0"] and rec["config_device"] == "cuda:0", rec
            assert len(rec["warnings"]) == 1 and "2 ranks on this node and 1 visible" in rec["warnings"][0]
