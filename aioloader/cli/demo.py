"""``aioloader demo``: the same short training run fed two ways, timed side by side.

(a) **sequential**: each step reads its files, decodes them (the same
    :class:`~aioloader.ImageDecoder`) and collates them in the training process, then trains,
    so a step costs ``T_load + T_train``;
(b) **aioloader**: a :class:`~aioloader.Loader` reads, decodes and collates the next batches
    in the background while the trainer works, so a step costs about ``max(T_load, T_train)``.

The trainer's wait is the time it spent getting a batch: for (a) the whole load, for (b)
``loader.stats.epoch_wait_seconds``. Only the main process runs this module: the command
line imports it when the demo starts, never at import time.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from aioloader.cli.narrate import Ticker, say
from aioloader.config import usable_cpus
from aioloader.dataset import FileDataset
from aioloader.decode.image import ImageDecoder
from aioloader.loader import Loader
from aioloader.observe.progressbar import terminal_bar
from aioloader.synthetic import make_image_folder

__all__ = ["DemoOptions", "EpochResult", "make_model", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    """The demo's settings (see ``aioloader demo --help``)."""

    data_dir: Path
    images: int = 1500
    classes: int = 10
    image_size: tuple[int, int] = (500, 375)
    crop: int = 224
    batch_size: int = 64
    workers: int | None = None
    loader_process: bool | Literal["auto"] = "auto"
    epochs: int = 3
    steps: int | None = None
    device: str | None = None
    seed: int = 0


@dataclass(frozen=True)
class EpochResult:
    """One timed epoch: wall seconds, samples trained on, seconds the trainer waited for
    data, and the mean training loss."""

    seconds: float
    samples: int
    wait_seconds: float
    loss: float


def make_model(num_classes: int) -> nn.Module:
    """A small CNN for uint8 ``[B, 3, H, W]`` input scaled to floats by the caller."""
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=5, stride=4, padding=2),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


TrainStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_trainer(num_classes: int, device: torch.device, seed: int) -> TrainStep:
    """A fresh model and optimiser (same initial weights every call); returns the train step,
    which gives back the loss without synchronising with the device."""
    torch.manual_seed(seed)
    model = make_model(num_classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = images.to(device, non_blocking=True).float().div_(255.0).sub_(0.5)
        loss: torch.Tensor = loss_fn(model(x), labels.to(device, non_blocking=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        return loss.detach()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sequential_epoch(
    dataset: FileDataset,
    decode: ImageDecoder,
    step: TrainStep,
    opts: DemoOptions,
    epoch: int,
    say: Callable[[str], None] = say,
) -> EpochResult:
    """Read + decode + collate a batch, then train on it, one after the other."""
    device = torch.device(opts.device or "cpu")
    order = np.random.default_rng((opts.seed, epoch)).permutation(len(dataset))
    batches = [order[i : i + opts.batch_size] for i in range(0, len(order), opts.batch_size)]
    # Both ways tick once a batch (a clock read), so neither pays for its progress lines more.
    tick = Ticker(f"sequential, epoch {epoch}: batches", len(batches), say)
    losses: list[torch.Tensor] = []
    samples, load = 0, 0.0
    start = time.perf_counter()
    for indices in terminal_bar(batches, True, desc=f"sequential, epoch {epoch}", unit="batch", leave=False):
        t0 = time.perf_counter()
        arrays, labels = [], []
        for i in indices.tolist():
            path, label = dataset[i]
            with open(path, "rb") as f:
                arrays.append(decode(f.read()))
            labels.append(label)
        images, targets = torch.from_numpy(np.stack(arrays)), torch.tensor(labels, dtype=torch.int64)
        load += time.perf_counter() - t0
        losses.append(step(images, targets))
        samples += len(indices)
        tick(len(losses))
    _sync(device)
    seconds = time.perf_counter() - start
    return EpochResult(seconds, samples, load, float(torch.stack(losses).mean()))


def loader_epoch(
    loader: Loader, step: TrainStep, opts: DemoOptions, epoch: int, say: Callable[[str], None] = say
) -> EpochResult:
    """Train on the batches ``loader`` delivers for ``epoch``."""
    device = torch.device(opts.device or "cpu")
    loader.set_epoch(epoch)
    tick = Ticker(f"aioloader, epoch {epoch}: batches", len(loader), say)
    losses: list[torch.Tensor] = []
    samples = 0
    start = time.perf_counter()
    for images, labels in loader:
        losses.append(step(images, labels))
        samples += len(labels)
        tick(len(losses))
    _sync(device)
    seconds = time.perf_counter() - start
    wait = loader.stats.epoch_wait_seconds
    return EpochResult(seconds, samples, wait, float(torch.stack(losses).mean()))


def prepare_data(opts: DemoOptions, say: Callable[[str], None]) -> Path:
    """The dataset folder for these options, generated on the first run only."""
    w, h = opts.image_size
    folder = Path(opts.data_dir).expanduser() / f"{opts.images}img_{opts.classes}cls_{w}x{h}_s{opts.seed}"
    if (folder / ".complete").is_file():
        say(f"dataset: {opts.images:,} JPEGs of {w}x{h} in {folder} (generated by an earlier run)")
    else:
        say(f"generating {opts.images:,} JPEGs of {w}x{h} in {folder} (once; later runs reuse them) ...")
    t0 = time.perf_counter()
    make_image_folder(
        folder,
        num_images=opts.images,
        num_classes=opts.classes,
        size=(w, h),
        seed=opts.seed,
        progress=True,
        on_image=Ticker("generating JPEGs", opts.images, say),
    )
    if time.perf_counter() - t0 > 1.0:
        say(f"  done in {time.perf_counter() - t0:.1f} s")
    return folder


def limit(dataset: FileDataset, opts: DemoOptions) -> FileDataset:
    """With ``--steps N``, a fixed random subset of ``N x batch_size`` files, so that every
    epoch of both ways is complete (no batches prefetched for nothing)."""
    keep = opts.steps * opts.batch_size if opts.steps is not None else len(dataset)
    if keep >= len(dataset):
        return dataset
    chosen = np.sort(np.random.default_rng(opts.seed).choice(len(dataset), keep, replace=False))
    labels = dataset.labels[chosen] if dataset.labels is not None else None
    return FileDataset([dataset.path(int(i)) for i in chosen], labels, classes=dataset.classes)


def _summary(results: list[EpochResult]) -> tuple[float, float, float]:
    """Median s/epoch, samples/s and wait share over the timed epochs (all but the first
    when there are several)."""
    timed = results[1:] if len(results) > 1 else results
    seconds = statistics.median(r.seconds for r in timed)
    rate = statistics.median(r.samples / r.seconds for r in timed)
    wait = statistics.median(r.wait_seconds / r.seconds for r in timed)
    return seconds, rate, wait


def run_demo(opts: DemoOptions, say: Callable[[str], None] = say) -> int:
    """Run the demo and print its table; returns 0."""
    if opts.device is None:
        opts = replace(opts, device="cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(opts.device or "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("aioloader demo: --device cuda, but torch.cuda.is_available() is False")
    workers = opts.workers or usable_cpus()
    folder = prepare_data(opts, say)
    dataset = limit(FileDataset.from_folder(folder), opts)
    mean_kb = sum(os.path.getsize(dataset.path(i)) for i in range(len(dataset))) / len(dataset) / 1e3
    decode = ImageDecoder(opts.crop)
    say(
        f"{len(dataset)} images ({opts.classes} classes, {opts.image_size[0]}x{opts.image_size[1]} JPEG, "
        f"{mean_kb:.0f} KB mean) -> {opts.crop}x{opts.crop} uint8; batch {opts.batch_size}; "
        f"device {device}; {usable_cpus()} usable CPUs; aioloader with {workers} decode workers"
    )
    wall: dict[str, float] = {}
    seq: list[EpochResult] = []
    say("(a) sequential: read + decode + collate in the training loop, then train ...")
    t0 = time.perf_counter()
    step = make_trainer(opts.classes, device, opts.seed)
    for e in range(opts.epochs):
        seq.append(_told(say, "sequential", e, sequential_epoch(dataset, decode, step, opts, e, say)))
    wall["sequential"] = time.perf_counter() - t0
    say("(b) aioloader.Loader: loading overlaps training ...")
    t0 = time.perf_counter()
    step = make_trainer(opts.classes, device, opts.seed)
    loader = Loader(
        dataset,
        batch_size=opts.batch_size,
        decode=decode,
        shuffle=True,
        seed=opts.seed,
        num_workers=workers,
        device=device if device.type == "cuda" else None,
        progress=True,  # a bar per epoch when stderr is a terminal
        loader_process=opts.loader_process,
    )
    with loader:
        say(f"    (loading {'in a loader process' if loader.runtime == 'process' else 'in this process'})")
        aio = [
            _told(say, "aioloader", e, loader_epoch(loader, step, opts, e, say)) for e in range(opts.epochs)
        ]
    wall["aioloader"] = time.perf_counter() - t0
    _print_table(say, opts, {"sequential": seq, "aioloader": aio}, wall)
    return 0


def _told(say: Callable[[str], None], way: str, epoch: int, result: EpochResult) -> EpochResult:
    """Say that an epoch ended (after its clock stopped), and pass its result on."""
    say(f"  {way}, epoch {epoch}: {result.samples:,} samples in {result.seconds:.1f} s")
    return result


def _print_table(
    say: Callable[[str], None], opts: DemoOptions, runs: dict[str, list[EpochResult]], wall: dict[str, float]
) -> None:
    if opts.epochs == 1:
        timed = "the only epoch (warm-up included)"
    else:
        timed = "epoch 2" if opts.epochs == 2 else f"median of epochs 2-{opts.epochs}"
    say("")
    say("| way        | s/epoch | samples/s | trainer waiting for data | total s |")
    say("|------------|--------:|----------:|-------------------------:|--------:|")
    summaries = {}
    for name, results in runs.items():
        seconds, rate, wait = summaries[name] = _summary(results)
        say(f"| {name:<10} | {seconds:7.2f} | {rate:9.0f} | {wait:24.0%} | {wall[name]:7.1f} |")
    speedup = summaries["sequential"][0] / summaries["aioloader"][0]
    say("")
    say(f"speedup: {speedup:.2f}x (sequential s/epoch / aioloader s/epoch)")
    say(f"s/epoch, samples/s, waiting: {timed}; total s: all {opts.epochs} epochs with start-up.")
    say(
        "waiting for data: sequential = read + decode + collate time / epoch time; "
        "aioloader = loader.stats.epoch_wait_seconds / epoch time."
    )
    if opts.device == "cpu":
        say(
            f"note: on the CPU the train step and the decode workers share the same {usable_cpus()} "
            "cores, so overlapping them saves at most the idle time of those cores; with a GPU, "
            "s/epoch approaches max(T_load, T_train)."
        )
