"""aioloader under torch.distributed: two real ranks launched by ``torchrun`` on the CPU
(gloo), rank and world size taken from the process group (tests/ddp_script.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import script_env

HERE = os.path.dirname(__file__)


def torchrun(tmp_path: Path, phase: str, paths_file: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        os.path.join(HERE, "ddp_script.py"), str(paths_file), str(tmp_path), phase,
    ]  # fmt: skip
    env = script_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
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
