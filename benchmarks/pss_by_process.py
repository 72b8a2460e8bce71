"""Where the memory of the whole process tree is, process by process: PSS, private dirty
and clean pages, anonymous, file-backed and shared-memory PSS (``/proc/<pid>/smaps_rollup``)
of the trainer, aioloader's zygote, resource tracker, loader process and workers (or
DataLoader's workers), read at batch 15 of the last epoch (``--epochs``, default 2) of a
plain user decode (``userfns.random_crop``), batch 64. The trainer reads every batch (one
byte a page, :func:`userfns.touch`), as a training step would; ``--no-touch`` leaves them
unread. Then the whole tree with shared memory counted once and
whole (:func:`userfns.tree_memory`), which also counts the batches no page table maps yet.

    python benchmarks/pss_by_process.py [auto|off|on|dataloader] [--epochs 2] [--images 2000] [--no-touch]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from torch.utils.data import DataLoader  # noqa: E402
from userfns import PeerDataset, add_folder_args, descendants, image_folder, random_crop, touch, tree_memory  # noqa: E402

from aioloader import FileDataset, Loader  # noqa: E402


def rollup(pid: int) -> dict[str, int]:
    """MiB by field of ``/proc/<pid>/smaps_rollup``."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                out[parts[0][:-1]] = int(parts[1]) // 1024
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["auto", "off", "on", "dataloader"])
    p.add_argument("--no-touch", dest="touch", action="store_false", help="leave the batches unread")
    p.add_argument("--epochs", type=int, default=2, help="read at batch 15 of the last (default 2)")
    add_folder_args(p)
    args = p.parse_args()
    files = FileDataset.from_folder(image_folder(args))
    loader: Any
    if args.mode == "dataloader":
        loader = DataLoader(
            PeerDataset(files, random_crop),
            batch_size=64,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
        )
    else:
        extra = {} if args.mode == "auto" else {"loader_process": args.mode == "on"}
        loader = Loader(files, batch_size=64, decode=random_crop, shuffle=True, **extra)
    fields = ("Pss", "Private_Dirty", "Private_Clean", "Pss_Anon", "Pss_File", "Pss_Shmem")
    for epoch in range(args.epochs):
        for i, batch in enumerate(loader):
            if args.touch:
                touch(batch)
            if epoch == args.epochs - 1 and i == 15:
                print(f"## {args.mode}: MiB at batch 15 of epoch {args.epochs}\n")
                print("| process | pid | " + " | ".join(fields) + " |")
                print("|---|---:|" + "---:|" * len(fields))
                total = 0
                for pid in descendants(os.getpid()):
                    try:
                        with open(f"/proc/{pid}/comm") as f:
                            comm = f.read().strip()
                        r = rollup(pid)
                    except OSError:
                        continue
                    total += r["Pss"]
                    name = "trainer" if pid == os.getpid() else comm
                    print(f"| {name} | {pid} | " + " | ".join(str(r.get(k, 0)) for k in fields) + " |")
                print(f"| **whole tree** | | {total} | | | |\n")
                pss, whole = tree_memory(descendants(os.getpid()))
                print(
                    f"whole tree, shared memory counted once and whole (mapped or held, touched or not): "
                    f"{whole / 2**20:.0f} MiB (PSS {pss / 2**20:.0f} MiB)\n"
                )
    if isinstance(loader, Loader):
        loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
