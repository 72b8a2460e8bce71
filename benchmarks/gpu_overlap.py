"""GPU benchmark: host-to-device bandwidth of the bridge, and copy time hidden behind a real
on-GPU train step. Skips cleanly (exit 0) without CUDA; asserts nothing about time.

(a) Bandwidth for a 64x3x224x224 and a 256x3x224x224 uint8 batch: the card's pinned
    ``copy_`` peak (measured here, same run) vs aioloader's DeviceCopier (pinned staging
    pool + side stream + event), per batch and pipelined.
(b) Overlap: a train step of about ``--train-ms`` ms (a matmul loop that also reads the
    batch) fed by ``Loader(device="cuda")`` vs the same loop fed by ``Loader(device=None)``
    plus a synchronous ``.to(device)`` per batch. Batches are built by a collate function
    from tiny files, so the data side is fast and only the copy is under test.

    python benchmarks/gpu_overlap.py [--steps 60] [--train-ms 20] [--matrix 4096 2048]
                                     [--loader-process auto,off,on]

(b) runs each aioloader runtime asked for (``--loader-process``) in the same interleaved
rounds: the default, in the trainer's process (``False``: the loop, reads and collate share
the trainer's GIL) and in a loader process (``True``: the trainer's process keeps only the
bridging thread).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from typing import Any

import torch

from aioloader import Loader
from aioloader.run.device import DeviceCopier

SHAPE = (3, 224, 224)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def pinned_peak(batch: int, dev: torch.device, reps: int = 20) -> float:
    """GB/s of a pinned -> device copy_ of one batch (the card's practical peak)."""
    src = torch.empty((batch, *SHAPE), dtype=torch.uint8, pin_memory=True).random_(0, 255)
    dst = torch.empty_like(src, device=dev)
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()  # type: ignore[no-untyped-call]
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    end.record()  # type: ignore[no-untyped-call]
    end.synchronize()  # type: ignore[no-untyped-call]
    return src.numel() * reps / (start.elapsed_time(end) / 1e3) / 1e9  # type: ignore[no-untyped-call]


def bridge_bandwidth(batch: int, dev: torch.device, reps: int = 40) -> tuple[float, float, float]:
    """GB/s through DeviceCopier, medians over ``reps`` batches: (staging memcpy into pinned
    memory alone, one batch at a time end to end, pipelined two ahead as in the loader)."""
    copier = DeviceCopier(dev, pin_memory=True)
    copier.start()
    src = torch.empty((batch, *SHAPE), dtype=torch.uint8).random_(0, 255)  # pageable, as collated
    staging = torch.empty_like(src, pin_memory=True)
    for _ in range(3):
        copier.to_device(src)[1].synchronize()
        staging.copy_(src)
    nbytes = src.numel()

    def median_rate(fn: Any) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return nbytes / sorted(times)[len(times) // 2] / 1e9

    memcpy = median_rate(lambda: staging.copy_(src))
    single = median_rate(lambda: copier.to_device(src)[1].synchronize())
    in_flight: list[Any] = []

    def piped() -> None:
        in_flight.append(copier.to_device(src)[1])
        if len(in_flight) > 2:
            in_flight.pop(0).synchronize()

    pipelined = median_rate(piped)
    for ev in in_flight:
        ev.synchronize()
    copier.close()
    return memcpy, single, pipelined


class MakeBatch:
    """collate: a fresh pageable uint8 batch of ``batch`` images, whatever the number of
    samples, so that reading files costs little and the copy is what is measured."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def __call__(self, samples: list[bytes]) -> torch.Tensor:
        out = torch.empty((self.batch, *SHAPE), dtype=torch.uint8)
        out.fill_(len(samples[0]) % 251)
        return out


def make_train_step(dev: torch.device, train_ms: float, matrix: int) -> Any:
    """A step of ``k`` ``tanh(y @ a)`` rounds on ``matrix`` x ``matrix`` bf16, ``k`` calibrated
    to ``train_ms``. Small matrices make a launch-bound step (many tiny kernels, the trainer's
    Python thread busy the whole step); large ones a compute-bound step, like a real net's."""
    a = torch.randn(matrix, matrix, device=dev, dtype=torch.bfloat16)

    def step(images: torch.Tensor, k: int) -> torch.Tensor:
        x = images.float().mean()  # reads the whole batch
        y = a
        for _ in range(k):
            y = torch.tanh(y @ a)
        return y.float().mean() + x

    images = torch.zeros((64, *SHAPE), dtype=torch.uint8, device=dev)
    k = 1
    while True:  # calibrate k to about train_ms per step
        step(images, k)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            step(images, k)
        torch.cuda.synchronize()
        per = (time.perf_counter() - t0) / 5
        if per * 1e3 >= train_ms or k > 100000:
            return step, k, per
        k = max(k + 1, int(k * train_ms / 1e3 / max(per, 1e-6)))


#: --loader-process names: the ``loader_process`` passed (None: not passed, the default).
RUNTIMES: dict[str, bool | None] = {"auto": None, "off": False, "on": True}


def overlap(
    batch: int,
    steps: int,
    train_ms: float,
    matrix: int,
    dev: torch.device,
    folder: str,
    runtimes: list[str],
) -> dict[str, Any]:
    paths = []
    files_per_batch = 4
    for i in range(files_per_batch * (steps + 2)):
        p = os.path.join(folder, f"{i}.bin")
        if not os.path.exists(p):
            with open(p, "wb") as f:
                f.write(b"x" * (1 + i % 7))
        paths.append(p)
    step, k, _ = make_train_step(dev, train_ms, matrix)
    # Synchronous copy cost alone (pageable -> device, as a plain `.to(device)` does).
    host = MakeBatch(batch)([b"x"] * batch)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        host.to(dev)
    torch.cuda.synchronize()
    t_copy = (time.perf_counter() - t0) / 10

    def run(device: str | None, runtime: str = "auto") -> float:
        process = RUNTIMES[runtime]
        extra: dict[str, Any] = {} if process is None else {"loader_process": process}
        with Loader(
            paths,
            batch_size=files_per_batch,
            decode=None,
            collate=MakeBatch(batch),
            device=device,
            prefetch=3,
            **extra,
        ) as loader:
            it = iter(loader)
            for _ in range(2):  # warm-up
                b = next(it)
                step(b.to(dev), k)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                b = next(it)
                if device is None:
                    b = b.to(dev)  # the synchronous way
                step(b, k)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / steps

    resident = torch.zeros((batch, *SHAPE), dtype=torch.uint8, device=dev)

    def train_alone() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(resident, k)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    rounds = [
        (train_alone(), run(None), *(run(str(dev), r) for r in runtimes)) for _ in range(3)
    ]  # interleaved
    t_train, sync, *aio = (sorted(r[i] for r in rounds)[1] for i in range(2 + len(runtimes)))  # medians
    # The trainer's data stall is (step time - train alone); the synchronous way's stall is
    # the copy plus the launch gap it opens. "Hidden" is the share of that stall removed.
    hidden = [1 - max(0.0, a - t_train) / max(sync - t_train, 1e-9) for a in aio]
    launches = 2 * k / (t_train * 1e3)  # a matmul and a tanh per round
    return {
        "t_train": t_train,
        "t_copy": t_copy,
        "sync": sync,
        "aio": dict(zip(runtimes, aio, strict=True)),
        "hidden": dict(zip(runtimes, hidden, strict=True)),
        "launches": launches,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--train-ms", type=float, default=20.0)
    parser.add_argument(
        "--matrix", type=int, nargs="+", default=[4096, 2048], help="matmul sizes of the train step"
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval seconds (default: Python's 0.005), to see GIL hand-off effects",
    )
    parser.add_argument(
        "--loader-process",
        default="auto,off,on",
        help="aioloader runtimes to compare, comma-separated: auto (the default, loader_process not "
        "passed), off (False: in the trainer's process), on (True) (%(default)s)",
    )
    args = parser.parse_args()
    runtimes = [r.strip() for r in args.loader_process.split(",") if r.strip()]
    if not runtimes or any(r not in RUNTIMES for r in runtimes):
        parser.error(f"--loader-process {args.loader_process!r}: a comma-separated list of auto, off, on")
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if not torch.cuda.is_available():
        print("gpu_overlap: no CUDA device here; skipped.")
        return 0
    dev = torch.device("cuda", 0)
    print(
        f"# gpu_overlap: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(
        f"# command: python {' '.join(sys.argv)} (GIL switch interval {sys.getswitchinterval() * 1e3:g} ms)\n"
    )
    print("## (a) host-to-device bandwidth, GB/s")
    print(
        "| batch | pinned copy_ peak | staging memcpy (host) | bridge, one at a time | bridge, pipelined | pipelined / peak |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for batch in (64, 256):
        peak = pinned_peak(batch, dev)
        memcpy, single, piped = bridge_bandwidth(batch, dev)
        print(
            f"| {batch}x3x224x224 uint8 | {peak:.1f} | {memcpy:.1f} | {single:.1f} | {piped:.1f} | {piped / peak:.0%} |"
        )
    print(f"\n## (b) train step of ~{args.train_ms:g} ms fed by the loader, ms per step ({args.steps} steps)")
    print(
        "| step matmul | kernels/ms | batch | train alone | sync .to() copy alone | DataLoader-style: .to() then train "
        "| aioloader device=cuda | loader_process | speedup | stall hidden |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    names = {"auto": "default", "off": "False", "on": "True"}
    with tempfile.TemporaryDirectory() as folder:
        for matrix in args.matrix:
            for batch in (64, 256):
                r = overlap(batch, args.steps, args.train_ms, matrix, dev, folder, runtimes)
                for rt in runtimes:
                    print(
                        f"| {matrix}x{matrix} | {r['launches']:.0f} | {batch} | {ms(r['t_train'])} | {ms(r['t_copy'])} | "
                        f"{ms(r['sync'])} | {ms(r['aio'][rt])} | {names[rt]} | {r['sync'] / r['aio'][rt]:.2f}x "
                        f"| {r['hidden'][rt]:.0%} |"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
