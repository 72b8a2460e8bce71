"""GIL benchmark: how much a loader running in the trainer's process slows a trainer whose
step is pure Python. Asserts nothing about time.

The step is a fixed amount of Python bytecode (a busy loop, no sleep, no NumPy), calibrated
to take ``--step-ms`` (default 20) on this machine with nothing else running. Inside it a
ticker reads the clock every ~``--tick-us`` microseconds and keeps the largest gap between
consecutive ticks: a gap much longer than a tick is a stall of the trainer thread, while
another thread held the GIL (or the OS ran something else on its core). Per step, Linux's
``/proc/thread-self/schedstat`` splits the time the trainer thread was off-CPU into waiting
for a core (run queue: CPU contention) and blocked (mostly waiting for the GIL).

Feeds, each by ``aioloader.Loader`` (in the trainer's process, and with
``loader_process=True``) and by ``torch.utils.data.DataLoader`` (``num_workers=--workers``,
``persistent_workers=True``), batch 64:

(a) small files: 4 KB files, page cache warm, ``decode=None`` (``--small-decode trivial``:
    a function returning 16 bytes as an array, run in the workers);
(b) JPEGs (500x375) with the plain user function ``userfns.random_crop``.

Baseline: the same steps with no loader, before and after the loaded runs. Each loaded run
starts the loader, takes ``--warmup`` steps unrecorded, then records ``--steps`` steps,
iterating over as many epochs as that needs. Reported per run: step time (median, p95) and
its inflation over the baseline, the longest stall (largest tick gap minus the nominal tick),
GIL-blocked and run-queue time per step, and the trainer process's CPU per batch outside the
step (``time.process_time()`` minus the step's own thread CPU: the loader's threads and the
main thread's ``next()``).

    python benchmarks/gil.py [--step-ms 20] [--steps 60] [--warmup 5] [--workers 2]
                             [--files 5000] [--images 500] [--small-decode none|trivial]
                             [--feed small,jpeg] [--switch-interval S]
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from userfns import PeerDataset, make_small_files, random_crop, read_file, trivial_decode

from aioloader import FileDataset, Loader
from aioloader.synthetic import make_image_folder

CHUNK = 64  # loop iterations between two ticks, set by calibrate()


def busy(n_ticks: int, chunk: int) -> tuple[float, float]:
    """The step: ``n_ticks`` rounds of ``chunk`` iterations of pure-Python arithmetic, the
    clock read between rounds. Returns (wall seconds, largest gap between two ticks)."""
    clock = time.perf_counter
    start = last = clock()
    gap = 0.0
    acc = 0
    for _ in range(n_ticks):
        for i in range(chunk):
            acc = (acc + i * 7) % 1000003
        now = clock()
        if now - last > gap:
            gap = now - last
        last = now
    return last - start, gap


def calibrate(step_ms: float, tick_us: float) -> tuple[int, int]:
    """(ticks per step, iterations per tick) for a step of ``step_ms`` with a tick every
    ``tick_us``, from the fastest of several timings (nothing else should be running)."""
    probe = 20000
    per_iter = min(busy(1, probe)[0] for _ in range(15)) / probe
    chunk = max(1, round(tick_us * 1e-6 / per_iter))
    n = max(1, round(step_ms * 1e-3 / (per_iter * chunk)))
    for _ in range(3):  # correct for the tick's own cost
        took = min(busy(n, chunk)[0] for _ in range(7))
        n = max(1, round(n * step_ms * 1e-3 / took))
    return n, chunk


def sched() -> tuple[int, int]:
    """(ns on a CPU, ns runnable waiting for a CPU) of the calling thread; (0, 0) off Linux."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return 0, 0


@dataclass(frozen=True)
class Step:
    wall: float  # seconds
    gap: float  # largest tick gap, seconds
    cpu: float  # the trainer thread's CPU seconds in the step
    runq: float  # seconds runnable but not on a CPU


def step(n: int, chunk: int) -> Step:
    cpu0, (_, q0) = time.thread_time(), sched()
    wall, gap = busy(n, chunk)
    cpu1, (_, q1) = time.thread_time(), sched()
    return Step(wall, gap, cpu1 - cpu0, (q1 - q0) / 1e9)


@dataclass(frozen=True)
class Result:
    steps: list[Step]
    other_cpu: float  # this process's CPU outside the steps, seconds per batch (nan: no loader)


def train(make: Callable[[], Iterable[Any]] | None, steps: int, warmup: int, n: int, chunk: int) -> Result:
    """Run ``warmup + steps`` steps, one per batch of the loader ``make`` builds (or, with
    None, back to back); record the last ``steps``."""
    gc.collect()
    if make is None:
        return Result([step(n, chunk) for _ in range(warmup + steps)][warmup:], float("nan"))
    loader = make()
    out: list[Step] = []
    done, epoch, cpu0, step_cpu = 0, 0, 0.0, 0.0
    try:
        while len(out) < steps:
            if isinstance(loader, Loader):
                loader.set_epoch(epoch)
            epoch += 1
            for _batch in loader:
                done += 1
                if done == warmup + 1:
                    cpu0 = time.process_time()
                s = step(n, chunk)
                if done > warmup:
                    out.append(s)
                    step_cpu += s.cpu
                    if len(out) == steps:
                        break
        other = (time.process_time() - cpu0 - step_cpu) / steps
    finally:
        if isinstance(loader, Loader):
            loader.close()
        del loader
        gc.collect()
    return Result(out, other)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def default_data_dir() -> Path:
    env = os.environ.get("AIOLOADER_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "aioloader"
    return root / "bench"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=default_data_dir(), help="(%(default)s)")
    p.add_argument("--step-ms", type=float, default=20.0, help="pure-Python step per batch (%(default)s)")
    p.add_argument("--tick-us", type=float, default=20.0, help="ticker period inside the step (%(default)s)")
    p.add_argument("--steps", type=int, default=60, help="recorded steps per run (%(default)s)")
    p.add_argument("--warmup", type=int, default=5, help="unrecorded steps first (%(default)s)")
    p.add_argument("--workers", type=int, default=2, help="processes for both loaders (%(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(%(default)s)")
    p.add_argument("--files", type=int, default=5000, help="4 KB files for the small-file feed (%(default)s)")
    p.add_argument("--images", type=int, default=500, help="JPEGs for the JPEG feed (%(default)s)")
    p.add_argument("--small-decode", choices=["none", "trivial"], default="none", help="(%(default)s)")
    p.add_argument("--feed", default="small,jpeg", help="feeds to run: small, jpeg (%(default)s)")
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (s)")
    p.add_argument("--seed", type=int, default=0, help="(%(default)s)")
    args = p.parse_args()
    args.feed = [f.strip() for f in args.feed.split(",") if f.strip()]
    if not args.feed or any(f not in ("small", "jpeg") for f in args.feed):
        p.error("--feed: a comma list of small, jpeg")
    if min(args.steps, args.workers, args.batch_size, args.files, args.images) < 1 or args.step_ms <= 0:
        p.error("--steps, --workers, --batch-size, --files, --images and --step-ms must be positive")
    return args


def main() -> int:
    args = parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    feeds: dict[str, tuple[FileDataset, Callable[..., Any] | None, bool, str]] = {}
    if "small" in args.feed:
        files = make_small_files(args.data_dir / f"small_{args.files}x4k", args.files)
        small = trivial_decode if args.small_decode == "trivial" else None
        feeds["small"] = (files, small, False, f"{len(files)} files of 4 KB, decode={args.small_decode}")
    if "jpeg" in args.feed:
        folder = args.data_dir / f"{args.images}img_10cls_500x375"
        make_image_folder(folder, num_images=args.images, num_classes=10, size=(500, 375))
        files = FileDataset.from_folder(folder)
        for path in files.paths:
            read_file(path)
        feeds["jpeg"] = (files, random_crop, True, f"{len(files)} JPEGs 500x375, plain function random_crop")

    n, chunk = calibrate(args.step_ms, args.tick_us)
    tick_s = args.step_ms * 1e-3 / n
    print(
        f"# step: {n} ticks x {chunk} iterations, {tick_s * 1e6:.1f} us per tick; "
        f"GIL switch interval {sys.getswitchinterval() * 1e3:g} ms",
        flush=True,
    )

    def peer(files: FileDataset, decode: Callable[..., Any] | None, takes_rng: bool) -> Callable[[], Any]:
        return lambda: DataLoader(
            PeerDataset(files, decode, takes_rng=takes_rng, seed=args.seed),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(args.seed),
        )

    def aio(files: FileDataset, decode: Callable[..., Any] | None, process: bool) -> Callable[[], Any]:
        return lambda: Loader(
            files,
            batch_size=args.batch_size,
            decode=decode,
            shuffle=True,
            seed=args.seed,
            num_workers=args.workers,
            loader_process=process,
        )

    results: list[tuple[str, str, Result]] = []
    results.append(("none", "no loader (before)", train(None, args.steps, args.warmup, n, chunk)))
    for feed, (files, decode, takes_rng, _) in feeds.items():
        runs = (
            ("DataLoader", peer(files, decode, takes_rng)),
            ("aioloader", aio(files, decode, False)),
            ("aioloader, loader_process=True", aio(files, decode, True)),
        )
        for name, make in runs:
            t0 = time.perf_counter()
            results.append((feed, name, train(make, args.steps, args.warmup, n, chunk)))
            print(f"# {feed} {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    results.append(("none", "no loader (after)", train(None, args.steps, args.warmup, n, chunk)))

    print()
    print(f"Command: `{shlex.join([os.path.basename(sys.executable), *sys.argv])}`")
    print()
    print(
        f"- {os.cpu_count()} CPUs; Python {sys.version.split()[0]}, torch {torch.__version__}; GIL switch interval "
        f"{sys.getswitchinterval() * 1e3:g} ms; 1-min load average {os.getloadavg()[0]:.2f} at the end"
    )
    print(
        f"- step: {args.step_ms:g} ms of pure-Python bytecode ({n} ticks of {chunk} iterations, nominal tick "
        f"{tick_s * 1e6:.0f} us); {args.steps} recorded steps per run after {args.warmup} unrecorded; "
        f"batch {args.batch_size}; {args.workers} worker processes (DataLoader persistent)"
    )
    for feed, (_, _, _, describe) in feeds.items():
        print(f"- feed `{feed}`: {describe}")
    print()
    base = statistics.median(s.wall for s in results[0][2].steps)
    base95 = pct([s.wall for s in results[0][2].steps], 95)
    print(
        "| feed | loader | step ms, median | step ms, p95 | inflation, median | inflation, p95 "
        "| longest stall ms | per-step longest stall ms, median | GIL-blocked ms/step | run-queue ms/step "
        "| main-process CPU ms/batch outside the step |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for feed, name, res in results:
        walls = [s.wall for s in res.steps]
        stalls = [max(0.0, s.gap - tick_s) for s in res.steps]
        blocked = [max(0.0, s.wall - s.cpu - s.runq) for s in res.steps]
        other = "-" if res.other_cpu != res.other_cpu else f"{res.other_cpu * 1e3:.1f}"
        print(
            f"| {feed} | {name} | {statistics.median(walls) * 1e3:.1f} | {pct(walls, 95) * 1e3:.1f} "
            f"| {statistics.median(walls) / base:.2f}x | {pct(walls, 95) / base95:.2f}x "
            f"| {max(stalls) * 1e3:.2f} | {statistics.median(stalls) * 1e3:.2f} "
            f"| {statistics.mean(blocked) * 1e3:.2f} | {statistics.mean(s.runq for s in res.steps) * 1e3:.2f} "
            f"| {other} |"
        )
    print(
        "\ninflation: against the first no-loader run (p95 against its p95). Longest stall: the largest gap "
        "between two ticks inside a step minus the nominal tick. GIL-blocked: step wall time minus the "
        "thread's CPU minus its run-queue wait (mean per step): time the trainer thread slept, which in a "
        "busy loop is waiting for the GIL. Run-queue: runnable, waiting for a core (CPU contention)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
