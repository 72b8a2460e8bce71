"""Throughput benchmark: aioloader.Loader vs torch.utils.data.DataLoader on the same files,
the same decode work and the same number of processes, measured in the same run. Asserts
nothing about time.

Workload: a generated ImageFolder of JPEGs (default 2,000 at 500x375, about 100 KB each),
decoded by ``ImageDecoder(224)`` (centre crop, 224x224 uint8 CHW), batch 64, shuffled.

(i)   the machine's decode limit: the single-core rate of ``ImageDecoder(224)`` in this
      process on bytes already in memory, times the usable cores;
(ii)  ``DataLoader`` over a Dataset that reads the file and decodes it with the same
      ``ImageDecoder``; ``num_workers=N``, ``persistent_workers=True``;
(iii) ``aioloader.Loader`` with ``num_workers=N``.

Each loader runs one warm-up epoch (workers started, page cache warm), then ``--rounds``
interleaved rounds (DataLoader, aioloader, DataLoader, aioloader, ...) of one full epoch
each; the tables show medians over the rounds. ``--read-delay-ms L`` delays every file read
by L ms for both (network storage; aioloader through its ``read=`` hook, on its I/O
threads). ``--train-ms T`` adds rounds with a simulated train step (``time.sleep``) per
batch and compares the total with ``steps x max(T_load, T)``.

    python benchmarks/throughput.py [--images 2000] [--rounds 3] [--workers N]
                                    [--read-delay-ms 0] [--train-ms 0] [--image-size 500x375]
                                    [--draft on|off] [--peer-draft on|off]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
from torch.utils.data import DataLoader, Dataset

import aioloader
from aioloader import FileDataset, ImageDecoder, Loader
from aioloader.config import usable_cpus
from aioloader.synthetic import make_image_folder


class TimedRead:
    """Read a whole file after sleeping ``delay_ms`` (0: no sleep). Stateless, so it is
    thread-safe (aioloader's ``read=`` hook) and picklable (DataLoader workers)."""

    def __init__(self, delay_ms: float) -> None:
        self.delay_s = delay_ms / 1e3

    def __call__(self, path: str) -> bytes:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        with open(path, "rb", buffering=0) as f:
            return f.readall()


class JpegDataset(Dataset[tuple[np.ndarray, int]]):
    """The DataLoader peer's Dataset: read + decode in the worker, ``(CHW uint8, label)``."""

    def __init__(self, files: FileDataset, decode: ImageDecoder, read: TimedRead) -> None:
        self.files, self.decode, self.read = files, decode, read

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.files[index]
        return self.decode(self.read(path)), int(label or 0)


@dataclass(frozen=True)
class Epoch:
    """One measured epoch."""

    seconds: float
    samples: int
    batches: int
    wait: float  # seconds the consumer spent in next()
    first: float  # seconds from iter() to the first batch
    cpu: float  # this process's CPU seconds (all its threads)


def run_epoch(batches: Iterable[Any], train_s: float, origin: float | None = None) -> Epoch:
    """Consume one epoch like a training loop; ``train_s`` sleeps per batch (the step).
    ``first`` counts from ``origin`` when given (a cold start), else from ``iter()``."""
    cpu0, start = time.process_time(), time.perf_counter()
    wait, first, samples, count = 0.0, None, 0, 0
    before = start
    for _images, labels in batches:  # the for loop's own next() is what we time
        got = time.perf_counter()
        wait += got - before
        first = got - (origin or start) if first is None else first
        samples += len(labels)
        count += 1
        if train_s > 0:
            time.sleep(train_s)
        before = time.perf_counter()
    seconds = time.perf_counter() - (origin or start)
    return Epoch(seconds, samples, count, wait, first or 0.0, time.process_time() - cpu0)


def decode_rate(files: FileDataset, decode: ImageDecoder, seconds: float) -> float:
    """Single-core samples/s of ``decode`` in this process, on bytes already in memory."""
    data = [TimedRead(0)(files.path(i)) for i in range(min(len(files), 200))]
    for d in data[:10]:
        decode(d)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        decode(data[n % len(data)])
        n += 1
    return n / (time.perf_counter() - start)


def machine() -> list[str]:
    """Lines describing this machine and software, for the report."""
    cpu = "unknown"
    mem_gb = 0.0
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal"))
            mem_gb = kb / 2**20
    except (OSError, StopIteration, ValueError):
        pass
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    try:
        loop = f"uvloop {importlib.metadata.version('uvloop')}"
    except importlib.metadata.PackageNotFoundError:
        loop = "asyncio"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y")
    return [
        f"- date (UTC): {date}",
        f"- machine: {os.cpu_count()} CPUs ({usable_cpus()} usable), {cpu}, {mem_gb:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()}",
        f"- software: Python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
        f"Pillow {PIL.__version__}, {loop}, aioloader {aioloader.__version__} (git {commit})",
    ]


def loadavg() -> str:
    """The 1-minute load average (other processes competing for the cores), or '?'."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads, by name without its number (Linux:
    ``/proc/self/task/*/schedstat``, nanosecond precision; empty elsewhere)."""
    names = {t.native_id: t.name.rstrip("0123456789").rstrip("_-") for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[names.get(int(tid), "other (non-Python)")] += int(f.read().split()[0]) / 1e9
    except (OSError, ValueError):
        pass
    return out


def med(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def default_data_dir() -> Path:
    env = os.environ.get("AIOLOADER_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "aioloader"
    return root / "bench"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data-dir", type=Path, default=default_data_dir(), help="dataset cache folder (%(default)s)"
    )
    p.add_argument("--images", type=int, default=2000, help="JPEG files to generate (%(default)s)")
    p.add_argument("--classes", type=int, default=10, help="class folders (%(default)s)")
    p.add_argument("--image-size", default="500x375", help="WIDTHxHEIGHT of the JPEGs (%(default)s)")
    p.add_argument("--workers", type=int, default=usable_cpus(), help="processes for both (%(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(%(default)s)")
    p.add_argument("--io-concurrency", type=int, default=64, help="aioloader reads in flight (%(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved measured rounds (%(default)s)")
    p.add_argument("--read-delay-ms", type=float, default=0.0, help="delay every read by L ms (%(default)s)")
    p.add_argument("--train-ms", type=float, default=0.0, help="simulated train step per batch (%(default)s)")
    p.add_argument(
        "--decode-seconds", type=float, default=3.0, help="single-core decode timing (%(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="(%(default)s)")
    p.add_argument(
        "--draft", choices=["on", "off"], default="on", help="aioloader's JPEG draft mode (%(default)s)"
    )
    p.add_argument(
        "--peer-draft",
        choices=["on", "off"],
        default=None,
        help="DataLoader's JPEG draft mode (default: as --draft; off = a plain decode + resize)",
    )
    args = p.parse_args()
    if min(args.images, args.classes, args.workers, args.batch_size, args.rounds) < 1:
        p.error("--images, --classes, --workers, --batch-size and --rounds must be positive")
    if args.read_delay_ms < 0 or args.train_ms < 0:
        p.error("--read-delay-ms and --train-ms must be >= 0")
    return args


def main() -> int:
    args = parse_args()
    width, height = (int(v) for v in args.image_size.lower().split("x"))
    folder = args.data_dir / f"{args.images}img_{args.classes}cls_{width}x{height}"
    t0 = time.perf_counter()
    make_image_folder(folder, num_images=args.images, num_classes=args.classes, size=(width, height))
    files = FileDataset.from_folder(folder)
    mean_kb = sum(os.path.getsize(p) for p in files.paths) / len(files) / 1e3
    print(
        f"# data: {len(files)} JPEGs in {folder}, {mean_kb:.0f} KB mean (ready in {time.perf_counter() - t0:.1f} s)"
    )
    decode = ImageDecoder(224, draft=args.draft == "on")
    peer_decode = ImageDecoder(224, draft=(args.peer_draft or args.draft) == "on")
    read = TimedRead(args.read_delay_ms)
    train_s = args.train_ms / 1e3

    load_start = loadavg()
    rate = decode_rate(files, decode, args.decode_seconds)
    limit = usable_cpus() * rate
    print(
        f"# single-core decode: {rate:.0f} samples/s; decode limit {usable_cpus()} x {rate:.0f} = {limit:.0f} samples/s"
    )

    # DataLoader first: its workers fork before any aioloader thread exists, and persist.
    t0 = time.perf_counter()
    dl = DataLoader(
        JpegDataset(files, peer_decode, read),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    cold = {"DataLoader": run_epoch(dl, 0.0, origin=t0)}
    print(f"# warm-up epochs: DataLoader {cold['DataLoader'].seconds:.1f} s", end="", flush=True)
    runs: dict[str, list[Epoch]] = {"DataLoader": [], "aioloader": []}
    trained: dict[str, list[Epoch]] = {"DataLoader": [], "aioloader": []}
    stats_wait: list[float] = []  # aioloader's own loader.stats figure, to cross-check ours
    by_thread: dict[str, dict[str, float]] = {
        "DataLoader": defaultdict(float),
        "aioloader": defaultdict(float),
    }
    t0 = time.perf_counter()
    loader = Loader(
        files,
        batch_size=args.batch_size,
        decode=decode,
        shuffle=True,
        seed=args.seed,
        num_workers=args.workers,
        io_concurrency=args.io_concurrency,
        read=read if args.read_delay_ms > 0 else None,  # the library's own reads otherwise
    )
    epochs = iter(range(1, 10**6))
    with loader:
        cold["aioloader"] = run_epoch(loader, 0.0, origin=t0)
        print(f", aioloader {cold['aioloader'].seconds:.1f} s", flush=True)
        for r in range(args.rounds):
            for step_s, into in [(0.0, runs)] + ([(train_s, trained)] if train_s > 0 else []):
                for name, it in (("DataLoader", dl), ("aioloader", loader)):
                    if it is loader:
                        loader.set_epoch(next(epochs))
                    before = thread_cpu()
                    into[name].append(e := run_epoch(it, step_s))
                    if step_s == 0:
                        for thread, cpu in thread_cpu().items():
                            by_thread[name][thread] += cpu - before.get(thread, 0.0)
                        if it is loader:
                            stats_wait.append(loader.stats.epoch_wait_seconds / e.batches)
            print(f"# round {r + 1}/{args.rounds} done", flush=True)
    del dl  # stops its persistent workers
    rate_end = decode_rate(files, decode, args.decode_seconds)
    load_end = loadavg()

    print()
    print(f"Command: `{shlex.join([os.path.basename(sys.executable), *sys.argv])}`")
    print()
    print("\n".join(machine()))
    print(
        f"- workload: {len(files)} JPEGs, {width}x{height}, {mean_kb:.0f} KB mean -> ImageDecoder(224) "
        f"(draft: aioloader {args.draft}, DataLoader {args.peer_draft or args.draft}) "
        f"uint8 [3,224,224]; batch {args.batch_size}; {args.workers} worker processes each; "
        f"read delay {args.read_delay_ms:g} ms; aioloader io_concurrency {args.io_concurrency}"
    )
    print(
        f"- decode limit: {usable_cpus()} usable cores x {rate:.0f} samples/s single-core = {limit:.0f} samples/s"
    )
    print(
        f"- checks: single-core decode re-measured at the end: {rate_end:.0f} samples/s; "
        f"1-min load average at start {load_start}, at end {load_end}"
    )
    print(f"- medians of {args.rounds} interleaved rounds of one full epoch each, after one warm-up epoch")
    print()
    print_throughput(runs, cold, limit)
    print(
        f"\naioloader's own loader.stats.epoch_wait_seconds: {med(stats_wait) * 1e3:.1f} ms/batch "
        "(median; the table measures both loaders the same way, around the for loop's next())."
    )
    for name, per in by_thread.items():
        batches = sum(e.batches for e in runs[name])
        parts = ", ".join(
            f"{k} {v / batches * 1e3:.1f}"
            for k, v in sorted(per.items(), key=lambda kv: -kv[1])
            if v / batches >= 5e-5
        )
        print(f"{name} main-process CPU by thread, ms/batch (mean over rounds): {parts or 'n/a'}")
    if train_s > 0:
        print()
        print_overlap(runs, trained, args.train_ms)
    return 0


def print_throughput(runs: dict[str, list[Epoch]], cold: dict[str, Epoch], limit: float) -> None:
    rows: dict[str, list[float]] = {}
    for name, eps in runs.items():
        rows[name] = [
            med(e.samples / e.seconds for e in eps),
            med(e.samples / e.seconds for e in eps) / limit,
            med(e.wait / e.batches for e in eps) * 1e3,
            med(e.first for e in eps) * 1e3,
            cold[name].first * 1e3,
            med(e.cpu / e.batches for e in eps) * 1e3,
        ]
    print(
        "| loader | samples/s | share of decode limit | trainer wait ms/batch | first batch ms "
        "| first batch ms, cold start | main-process CPU ms/batch |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    fmt = ["{:.0f}", "{:.0%}", "{:.1f}", "{:.0f}", "{:.0f}", "{:.1f}"]
    for name, vals in rows.items():
        print(f"| {name} | " + " | ".join(f.format(v) for f, v in zip(fmt, vals, strict=True)) + " |")
    ratio = [a / b if b else float("nan") for a, b in zip(rows["aioloader"], rows["DataLoader"], strict=True)]
    print("| **aioloader / DataLoader** | " + " | ".join(f"{v:.2f}x" for v in ratio) + " |")
    print(
        "\nfirst batch ms: from iter() to the first batch in a warm epoch; cold start: from "
        "constructing the loader (workers not started) to its first batch. Ratios: above 1 is better "
        "for samples/s and share, below 1 is better for the times and CPU."
    )


def print_overlap(runs: dict[str, list[Epoch]], trained: dict[str, list[Epoch]], train_ms: float) -> None:
    """Total time with a simulated step of T ms vs ``steps x max(T_load, T)``; T_load per
    round is the same loader's per-batch time without a step, in the same round."""
    t = train_ms / 1e3
    print(f"Overlap with a simulated train step of T = {train_ms:g} ms (time.sleep) per batch:")
    print()
    print(
        "| loader | steps | T_load ms/batch | total s | steps x max(T_load, T) s "
        "| steps x (T_load + T) s | total / ideal | trainer wait ms/batch |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in runs:
        pairs = list(zip(runs[name], trained[name], strict=True))
        steps = trained[name][0].batches
        t_load = med(a.seconds / a.batches for a, _ in pairs)
        total = med(b.seconds for _, b in pairs)
        ideal = steps * max(t_load, t)
        serial = steps * (t_load + t)
        eff = med(b.seconds / (b.batches * max(a.seconds / a.batches, t)) for a, b in pairs)
        wait = med(b.wait / b.batches for _, b in pairs) * 1e3
        print(
            f"| {name} | {steps} | {t_load * 1e3:.1f} | {total:.2f} | {ideal:.2f} | {serial:.2f} "
            f"| {eff:.2f} | {wait:.1f} |"
        )
    print("\ntotal / ideal: 1.00 means loading is completely hidden behind the step (median per round).")


if __name__ == "__main__":
    sys.exit(main())
