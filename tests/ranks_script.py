"""Run by test_distributed.py under ``torchrun --nproc-per-node 2``: each rank makes a loader
with the defaults for ``num_workers`` (and, with ``cuda``, ``device="cuda"``), before it
calls ``torch.cuda.set_device`` or touches a GPU, loads one epoch of numbered files, and
writes to ``OUT/ranks-<rank>.json`` how the node was divided, where its batches arrived, the
GPU the pure rule gives its environment for one and for two GPUs, and the ``aioloader``
WARNINGs it logged.

    python -m torch.distributed.run --standalone --nproc-per-node 2 ranks_script.py PATHS OUT cpu|cuda
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch.distributed as dist
from helpers import decode_number

import aioloader
from aioloader.config import usable_cpus
from aioloader.plan.node import node_ranks, rank_gpu


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(paths_file: str, out: str, mode: str) -> None:
    warnings = Warnings()
    logging.getLogger("aioloader").addHandler(warnings)
    dist.init_process_group("gloo")  # no collective on a GPU: two ranks may share one here
    rank = dist.get_rank()
    with open(paths_file) as f:
        paths = json.load(f)
    device = "cuda" if mode == "cuda" else None
    loader = aioloader.Loader(paths, batch_size=4, decode=decode_number, device=device)
    with loader:
        devices = sorted({str(batch.device) for batch in loader})
        dist.barrier()
        stats = loader.stats
    node = node_ranks(os.environ)
    record = {
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "usable": usable_cpus(),
        "num_workers": loader.config.build.workers,
        "decoding": stats.num_workers,
        "ranks_on_node": stats.ranks_on_node,
        "cpus_per_rank": stats.cpus_per_rank,
        "batches": stats.batches,
        "devices": devices,
        "config_device": str(loader.device),
        "gpu_of_two": rank_gpu(node, 2, 0, False)[0],
        "gpu_of_one": rank_gpu(node, 1, 0, False),
        "warnings": warnings.messages,
    }
    with open(os.path.join(out, f"ranks-{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
