"""Data-parallel training on the CPU, fed by aioloader, with checkpoint and resume.

    torchrun --nproc-per-node 2 examples/ddp_train.py --ckpt /tmp/ddp-ckpt [--epochs 2]
    # preempted mid-epoch? run the same command again: it resumes from the checkpoint
    torchrun --nproc-per-node 2 examples/ddp_train.py --ckpt /tmp/ddp-ckpt --stop-after 5  # simulate it

Each rank's ``Loader`` takes its rank and world size from torch.distributed, so the ranks see
disjoint shards of every epoch, each with the same number of batches (uneven counts would
hang the gradient all-reduce). Every ``--ckpt-every`` steps, rank 0 saves the model and the
optimizer and every rank saves its loader's ``state_dict()`` (a few hundred bytes of JSON).
A restarted job loads them and continues mid-epoch with exactly the batches it had not
trained on yet. Without ``--data``, rank 0 generates a small JPEG ImageFolder first.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import aioloader
from aioloader.synthetic import make_image_folder


def make_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, classes),
    )


def save(
    ckpt: Path, rank: int, model: nn.Module, opt: torch.optim.Optimizer, loader: aioloader.Loader
) -> None:
    """All ranks checkpoint at the same step (they run in lockstep); files appear atomically."""
    state = loader.state_dict()
    tmp = ckpt / f"loader-rank{rank}.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, ckpt / f"loader-rank{rank}.json")
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt / "model.pt.tmp")
        os.replace(ckpt / "model.pt.tmp", ckpt / "model.pt")
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="checkpoint folder (created)")
    parser.add_argument("--data", type=Path, help="ImageFolder root (default: generated in --ckpt)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ckpt-every", type=int, default=2, help="steps between checkpoints")
    parser.add_argument("--stop-after", type=int, help="exit after this many steps (simulated preemption)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args.ckpt.mkdir(parents=True, exist_ok=True)
    root = args.data or args.ckpt / "data"
    if args.data is None and rank == 0 and not root.exists():
        make_image_folder(root, num_images=240, num_classes=4, size=(96, 72))
    dist.barrier()

    dataset = aioloader.FileDataset.from_folder(root)
    loader = aioloader.Loader(dataset, batch_size=16, decode=aioloader.ImageDecoder(64), num_workers=1)
    model = DistributedDataParallel(make_model(len(dataset.classes or [])))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start_epoch, step = 0, 0
    if (args.ckpt / "model.pt").exists():
        saved = torch.load(args.ckpt / "model.pt", weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        loader.load_state_dict(json.loads((args.ckpt / f"loader-rank{rank}.json").read_text()))
        start_epoch = loader.epoch
        if rank == 0:
            done = loader.state_dict()["batches_done"]
            print(f"resumed at epoch {start_epoch}, batch {done} of {len(loader)}")

    with loader:
        for epoch in range(start_epoch, args.epochs):
            loader.set_epoch(epoch)  # the checkpoint's epoch keeps its position
            for images, labels in loader:
                loss = nn.functional.cross_entropy(model(images.float().div_(255)), labels)
                opt.zero_grad()
                loss.backward()  # all-reduces gradients across ranks
                opt.step()
                step += 1
                if step % args.ckpt_every == 0:
                    save(args.ckpt, rank, model, opt, loader)
                if args.stop_after is not None and step >= args.stop_after:
                    if rank == 0:
                        print(f"stopping after {step} steps (epoch {epoch}); run again to resume")
                    dist.destroy_process_group()
                    return
            if rank == 0:
                print(
                    f"epoch {epoch}: {loader.stats.epoch_batches} batches on rank 0, loss {loss.item():.3f}"
                )
    save(args.ckpt, rank, model, opt, loader)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
