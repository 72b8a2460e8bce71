"""Run by test_distributed.py under ``torchrun --nproc-per-node 2``: each rank loads its
shard of numbered files with rank and world size taken from torch.distributed, and writes
what it received to ``OUT/rank<r>-<phase>.json``.

    phase "full":  one whole epoch.
    phase "stop":  two batches, then save the loader's state (a preempted job).
    phase "resume": load that state and finish the epoch.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from helpers import decode_number, flatten

import aioloader


def main(paths_file: str, out: str, phase: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(paths_file) as f:
        paths = json.load(f)
    with aioloader.Loader(paths, batch_size=3, decode=decode_number, num_workers=1, seed=5) as loader:
        assert (loader.config.sampling.rank, loader.config.sampling.world_size) == (rank, 2)
        loader.set_epoch(1)
        state_file = os.path.join(out, f"state-rank{rank}.json")
        if phase == "resume":
            with open(state_file) as f:
                loader.load_state_dict(json.load(f))
        got: list[list[int]] = []
        for batch in loader:
            got.append(flatten([batch]))
            dist.barrier()  # ranks step in lockstep, as a collective op in training would make them
            if phase == "stop" and len(got) == 2:
                break
        if phase == "stop":
            with open(state_file, "w") as f:
                json.dump(loader.state_dict(), f)
        record = {"batches": got, "len": len(loader)}
    with open(os.path.join(out, f"rank{rank}-{phase}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
