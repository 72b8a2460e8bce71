"""Data-parallel training fed by aioloader, one rank per GPU (NCCL) or on the CPU (gloo),
with checkpoint and resume.

    torchrun --nproc-per-node 8 examples/ddp_train.py --ckpt /tmp/ddp-ckpt [--epochs 2]  # 8 GPUs
    torchrun --nproc-per-node 2 examples/ddp_train.py --ckpt /tmp/ddp-ckpt --cpu  # gloo, CPU
    # preempted mid-epoch? run the same command again: it resumes from the checkpoint
    torchrun --nproc-per-node 2 examples/ddp_train.py --ckpt /tmp/ddp-ckpt --stop-after 5  # simulate it

With fewer GPUs than ranks on the node (or none, or ``--cpu``) it trains with gloo on the
CPU. The order of calls: the process group first; then the ``Loader``, which takes its rank and
world size from it (disjoint shards of every epoch, each with the same number of batches:
uneven counts would hang the gradient all-reduce) and, with ``device="cuda"``, delivers to
this rank's own GPU (``LOCAL_RANK``'s) whenever it is made; then the model on that GPU,
wrapped in ``DistributedDataParallel``; ``set_epoch`` before each epoch. Each rank's default
``num_workers`` is its part of the node's CPUs (usable CPUs // ranks on the node), which
``loader.stats`` reports.

Every ``--ckpt-every`` steps, rank 0 saves the model and the optimizer and every rank saves
its loader's ``state_dict()`` (a few hundred bytes of JSON). A restarted job loads them and
continues mid-epoch with exactly the batches it had not trained on yet. Without ``--data``,
rank 0 generates a small JPEG ImageFolder first.
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
from aioloader.config import usable_cpus
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
    parser.add_argument("--cpu", action="store_true", help="the CPU (gloo), even with GPUs")
    args = parser.parse_args()

    # NCCL where each rank of the node has a GPU of its own, else gloo on the CPU.
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    on_gpu = not args.cpu and torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here
    dist.init_process_group("nccl" if on_gpu else "gloo")  # first: the Loader reads rank and world size
    rank = dist.get_rank()
    args.ckpt.mkdir(parents=True, exist_ok=True)
    root = args.data or args.ckpt / "data"
    if args.data is None and rank == 0 and not root.exists():
        make_image_folder(root, num_images=240, num_classes=4, size=(96, 72))
    dist.barrier()

    dataset = aioloader.FileDataset.from_folder(root)
    # device="cuda": this rank's GPU (LOCAL_RANK's), also when made before set_device below.
    loader = aioloader.Loader(
        dataset, batch_size=16, decode=aioloader.ImageDecoder(64), device="cuda" if on_gpu else None
    )
    device = torch.device("cpu")
    if on_gpu:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)  # for NCCL and the model: the loader's GPU
    ids = [device.index] if on_gpu else None
    model = DistributedDataParallel(make_model(len(dataset.classes or [])).to(device), device_ids=ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start_epoch, step = 0, 0
    if (args.ckpt / "model.pt").exists():
        saved = torch.load(args.ckpt / "model.pt", map_location=device, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        loader.load_state_dict(json.loads((args.ckpt / f"loader-rank{rank}.json").read_text()))
        start_epoch = loader.epoch
        if rank == 0:
            done = loader.state_dict()["batches_done"]
            print(f"resumed at epoch {start_epoch}, batch {done} of {len(loader)}")

    stats = loader.stats
    print(
        f"rank {rank}: {stats.ranks_on_node} ranks on this node, {stats.cpus_per_rank} of its "
        f"{usable_cpus()} usable CPUs each: num_workers={loader.config.build.workers}",
        flush=True,
    )
    with loader:
        if rank == 0:
            print(f"batches on {loader.device}, training on {device}", flush=True)
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
