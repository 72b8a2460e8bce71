"""Train a small CNN on an ImageFolder with a synchronous loop fed by aioloader.

    python examples/train_folder.py [ROOT] [--epochs 2] [--device cuda] [--in-process]
                                           [--decode-on-device] [--cache memory|DIR [--max-side N]]

``--decode-on-device`` decodes the JPEGs on the loader's device: with ``--device cuda``, on
the GPU (``pip install 'aioloader[gpu]'``); without, on the CPU by the bridging thread (the
same path, for trying it anywhere).

``--cache memory`` (or a folder on local disk) keeps what the first epoch read; later epochs
read it from there, not from ROOT. With ``--max-side N`` images are kept as JPEGs at most N
pixels on their longer side, so later epochs decode small images (what the model sees
changes slightly: opt-in).

Without ROOT, a small synthetic JPEG dataset is generated into a temporary folder. The
``if __name__ == "__main__"`` guard is good practice; aioloader's workers and loader process
never run this script again (they are forked by its zygote, and its functions are sent by
value).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Literal

import torch
from torch import nn

import aioloader
from aioloader.synthetic import make_image_folder


def make_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=4),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def train(
    root: Path,
    epochs: int,
    device: str | None,
    loader_process: bool | Literal["auto"] = "auto",
    decode_on_device: bool = False,
    cache: aioloader.Cache | None = None,
) -> None:
    dataset = aioloader.FileDataset.from_folder(root)
    loader = aioloader.Loader(
        dataset,
        batch_size=32,
        # device=...: JPEGs decoded on the loader's device (the rest by the CPU workers).
        decode=aioloader.ImageDecoder(
            112, crop="random", hflip=True, device=(device or "cpu") if decode_on_device else None
        ),
        device=device,
        prefetch=2,
        # "auto" (the default): reads, decoding and batching run in a loader process of their
        # own where one can be made; this process keeps only the thread that copies batches to
        # the device. False keeps them here (to share state with read/collate, or to debug).
        loader_process=loader_process,
        # Later epochs read what the first one kept (in memory, or in a folder on local disk).
        cache=cache,
    )
    model = make_model(len(dataset.classes)).to(device or "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with loader:  # starts the loop, bridge thread and workers; everything stops on exit
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            start, total, n = time.perf_counter(), 0.0, 0
            for images, labels in loader:  # uint8 [B,3,112,112], int64 [B], on `device`
                x = images.float().div_(255)
                loss = nn.functional.cross_entropy(model(x), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.item() * len(labels)
                n += len(labels)
            stats = loader.stats
            print(
                f"epoch {epoch}: loss {total / n:.3f}, {n / (time.perf_counter() - start):.0f} samples/s, "
                f"waited {stats.epoch_wait_seconds:.2f} s for data"
            )
            if stats.cache is not None:
                c = stats.cache
                seen = c.epoch_hits + c.epoch_misses
                print(f"  cache: {c.epoch_hits} of {seen} samples, {c.bytes_held / 1e6:.1f} MB held")
        if stats.device_decode is not None:
            dd = stats.device_decode
            print(f"decoded on {device or 'cpu'}: {dd.gpu}, by the CPU workers: {dd.cpu} {dd.fallbacks}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, help="ImageFolder root (default: generated)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--device", default=None, help="e.g. cuda (default: cpu)")
    parser.add_argument(
        "--in-process",
        dest="loader_process",
        action="store_false",
        default="auto",
        help="load in this process (loader_process=False; default: a loader process where one can be made)",
    )
    parser.add_argument(
        "--decode-on-device", action="store_true", help="decode the JPEGs on the loader's device"
    )
    parser.add_argument("--cache", help="keep what epoch 1 read: 'memory' or a folder on local disk")
    parser.add_argument("--max-side", type=int, help="with --cache: keep images at most N px on a side")
    args = parser.parse_args()
    cache = None
    if args.cache is not None:
        folder = None if args.cache == "memory" else args.cache
        cache = aioloader.Cache(directory=folder, max_side=args.max_side)
    options = (args.epochs, args.device, args.loader_process, args.decode_on_device, cache)
    if args.root is not None:
        train(args.root, *options)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = make_image_folder(Path(tmp) / "train", num_images=256, num_classes=4, size=(160, 120))
        train(root, *options)


if __name__ == "__main__":
    main()
