"""The GPU decode's batched crop-resize-flip and its plan, stage by stage; runs anywhere (the
resize on CUDA when there is a GPU, else on the CPU for the counts). Asserts nothing.

For a batch of ``--batch`` images of ``--size`` (WIDTHxHEIGHT, default 500x375, as the GPU
benchmarks' JPEGs) with random-resized-crop boxes and random flips, resized to 224x224:

- ``plan``: :func:`aioloader.decode.taps.plan_batch`, the loader side's work per batch (in
  the loader process's collate thread, in parallel with training), per filter: ms per batch;
- ``resize``: :func:`aioloader.decode.resize.resize_batch`: torch operations dispatched per
  batch (the bridge thread launches each one; ``TorchDispatchMode``), FLOPs per image
  (``torch.utils.flop_counter``), temporaries per image and the chunks a batch makes; with
  CUDA, the host's time to launch it and the GPU's time to run it (CUDA events), with TF32
  off and on (the pixels are the same either way: tests/test_resize.py).

    python benchmarks/gpu_resize.py [--batch 256] [--size 500x375] [--repeats 5]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from aioloader.decode.resize import MAX_BYTES, chunk_bytes, resize_batch
from aioloader.decode.taps import Plan, plan_batch

OUT = 224


def random_boxes(rng: np.random.Generator, n: int, w: int, h: int) -> np.ndarray:
    """Random-resized-crop boxes (8-100% of the area, aspect 3/4-4/3), fractional."""
    boxes = []
    for _ in range(n):
        side = np.sqrt(rng.uniform(0.08, 1.0) * w * h)
        aspect = rng.uniform(3 / 4, 4 / 3)
        bw, bh = min(side * np.sqrt(aspect), w), min(side / np.sqrt(aspect), h)
        x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        boxes.append((x0, y0, x0 + bw, y0 + bh))
    return np.array(boxes)


class _Dispatched(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def taps_on(plan: Plan, device: torch.device) -> tuple[Any, Any]:
    dx, nx, dy, ny = plan.digits
    x = (torch.from_numpy(plan.x.pos).to(device), torch.from_numpy(plan.x.coef).to(device), dx, nx)
    y = (torch.from_numpy(plan.y.pos).to(device), torch.from_numpy(plan.y.coef).to(device), dy, ny)
    return x, y


def time_cuda(buffer: torch.Tensor, plan: Plan, repeats: int) -> tuple[float, float]:
    """(host ms to launch, GPU ms to run) per batch, medians."""
    x, y = taps_on(plan, buffer.device)
    resize_batch(buffer, x, y, plan.across_first)  # warm-up: cuBLAS handles, the cache
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        resize_batch(buffer, x, y, plan.across_first)
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(host), statistics.median(gpu)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", default="500x375", help="WIDTHxHEIGHT (%(default)s)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        p.error(f"--size {args.size!r}: WIDTHxHEIGHT, e.g. 500x375")
    if args.batch < 1 or args.repeats < 1 or w < 1 or h < 1:
        p.error("--batch, --repeats and the size must be positive")
    rng = np.random.default_rng(args.seed)
    boxes = random_boxes(rng, args.batch, w, h)
    flips = rng.random(args.batch) < 0.5
    sizes = np.array([(h, w)] * args.batch)
    cuda = torch.cuda.is_available()
    print(f"## gpu_resize: {args.batch} images of {w}x{h} to {OUT}x{OUT}\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"- command: `python benchmarks/gpu_resize.py --batch {args.batch} --size {args.size}`")
    print(f"- machine: {platform.processor() or platform.machine()}, torch {torch.__version__}")
    print(f"- device: {torch.cuda.get_device_name() if cuda else 'no CUDA: counts only, on the CPU'}\n")
    print("| filter | plan ms/batch (loader side) | taps bytes/batch | digits (d, n) x, y |")
    print("| --- | ---: | ---: | --- |")
    plans = {}
    for resample in ("nearest", "bilinear", "bicubic", "lanczos"):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            plans[resample] = plan = plan_batch(boxes, flips, sizes, OUT, OUT, resample)
            times.append((time.perf_counter() - t0) * 1e3)
        taps = sum(a.nbytes for a in (*plan.x, *plan.y))
        print(f"| {resample} | {statistics.median(times):.1f} | {taps:,} | {plan.digits} |")
    plan = plans["bilinear"]
    per = chunk_bytes(h, w, OUT, OUT, max(plan.digits[1], plan.digits[3]))
    step = max(1, MAX_BYTES // per)
    small = torch.zeros((2, h, w, 3), dtype=torch.uint8)
    sub = plan_batch(boxes[:2], flips[:2], sizes[:2], OUT, OUT, "bilinear")
    with _Dispatched() as few:
        resize_batch(small, *taps_on(sub, small.device), sub.across_first)
    with FlopCounterMode(display=False) as flops:
        resize_batch(small, *taps_on(sub, small.device), sub.across_first)
    chunks = -(-args.batch // step)
    print("\nbilinear resize:\n")
    print(f"- operations dispatched per chunk: {few.count} (the same for any batch size)")
    print(
        f"- chunks for {args.batch} images: {chunks} of up to {step} ({MAX_BYTES >> 20} MiB of temporaries)"
    )
    print(
        f"- temporaries per image: {per / 2**20:.1f} MiB; FLOPs per image: {flops.get_total_flops() / 2 / 1e9:.3f} G"
    )
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
        buffer = torch.randint(0, 256, (args.batch, h, w, 3), dtype=torch.uint8, device=device)
        was = torch.backends.cuda.matmul.allow_tf32
        try:
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                host, gpu = time_cuda(buffer, plan, args.repeats)
                print(
                    f"- TF32 {'on' if tf32 else 'off'}: host {host:.1f} ms to launch, GPU {gpu:.1f} ms per batch"
                )
        finally:
            torch.backends.cuda.matmul.allow_tf32 = was
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
