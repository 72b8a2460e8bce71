"""The docs' example commands, run as written: ``examples/train_from_s3.py`` against a
local moto server (the ``moto_s3`` session fixture) with ``--upload-demo``
(docs/guides/object-storage.md), and ``examples/ddp_train.py`` under ``torchrun
--nproc-per-node 2``, stopped mid-epoch by ``--stop-after`` and run again to resume
(docs/guides/resume-distributed.md). One epoch each, to stay small."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import script_env

from aioloader.config import usable_cpus

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(args: list[str], cwd: Path, gpus: bool = False) -> str:
    env = script_env()
    if not gpus:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_train_from_s3_against_a_local_moto_server(moto_s3: dict[str, object], tmp_path: Path) -> None:
    """docs/guides/object-storage.md ("Train from a bucket"): the command shown, against
    this session's moto."""
    out = run(
        [
            str(EXAMPLES / "train_from_s3.py"),
            "s3://demo/train/",
            "--endpoint-url",
            str(moto_s3["endpoint_url"]),
            "--key",
            "test",
            "--secret",
            "test",
            "--upload-demo",
            "--epochs",
            "1",
        ],
        tmp_path,
    )
    lines = out.splitlines()
    assert lines[0].startswith("listed 256 objects in 4 classes"), out
    assert lines[1].startswith("epoch 0: ") and ", 0 retries," in lines[1], out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_train_stops_and_resumes_under_torchrun(tmp_path: Path) -> None:
    """docs/guides/resume-distributed.md ("The complete example: examples/ddp_train.py"):
    ``torchrun --nproc-per-node 2 examples/ddp_train.py --ckpt DIR``, preempted after 3
    steps (checkpoints every 2), then the same command again: it resumes at the checkpoint's
    batch and trains the rest of the epoch, 2 + 6 of the 8 batches each rank gets of 240
    images. On the CPU (gloo; no GPU is shown to it), each rank with half the node's usable
    CPUs as decode workers, by default."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    example = [os.fspath(EXAMPLES / "ddp_train.py"), "--ckpt", os.fspath(tmp_path / "ckpt"), "--epochs", "1"]
    stopped = run([*torchrun, *example, "--stop-after", "3"], tmp_path)
    assert "stopping after 3 steps (epoch 0); run again to resume" in stopped, stopped
    usable = usable_cpus()
    share = max(1, usable // 2)
    for rank in (0, 1):
        line = f"rank {rank}: 2 ranks on this node, {share} of its {usable} usable CPUs each"
        assert f"{line}: num_workers={share}" in stopped, stopped
    assert "batches on cpu, training on cpu" in stopped, stopped
    resumed = run([*torchrun, *example], tmp_path)
    assert "resumed at epoch 0, batch 2 of 8" in resumed, resumed
    assert "epoch 0: 6 batches on rank 0" in resumed, resumed


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_ddp_train_on_two_gpus_with_nccl(tmp_path: Path) -> None:
    """``examples/ddp_train.py`` with a GPU per rank: NCCL, the model and each rank's batches
    on its own GPU (rank 0's: cuda:0). Skipped on a machine with one GPU."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    example = [os.fspath(EXAMPLES / "ddp_train.py"), "--ckpt", os.fspath(tmp_path / "ckpt"), "--epochs", "1"]
    out = run([*torchrun, *example], tmp_path, gpus=True)
    assert "batches on cuda:0, training on cuda:0" in out, out
    assert "epoch 0: 8 batches on rank 0" in out, out


@pytest.mark.slow
def test_train_folder_decodes_on_the_loaders_device(tmp_path: Path) -> None:
    """``examples/train_folder.py --decode-on-device``, started by a relative path from its
    folder: without a GPU the device path runs on the CPU, and the script says where the
    samples were decoded."""
    out = run(["train_folder.py", "--epochs", "1", "--decode-on-device"], EXAMPLES)
    lines = out.splitlines()
    assert lines[0].startswith("epoch 0: loss "), out
    assert lines[1].startswith("decoded on cpu: ") and "by the CPU workers" in lines[1], out


def test_train_folder_reads_later_epochs_from_its_cache(tmp_path: Path) -> None:
    """``examples/train_folder.py --cache memory --max-side 64``, started by a relative path
    from its folder: the first epoch reads every file, the second is served by the cache."""
    out = run(["train_folder.py", "--epochs", "2", "--cache", "memory", "--max-side", "64"], EXAMPLES)
    lines = out.splitlines()
    assert lines[1].startswith("  cache: 0 of 256 samples"), out
    assert lines[3].startswith("  cache: 256 of 256 samples"), out
