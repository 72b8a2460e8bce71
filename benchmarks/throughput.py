"""Throughput benchmark: aioloader.Loader vs torch.utils.data.DataLoader on the same files,
the same decode work and the same number of processes, measured in the same run. Asserts
nothing about time.

Workload: a generated ImageFolder of JPEGs (default 2,000 at 500x375, about 85 KB each),
decoded to 224x224 uint8 CHW, batch 64, shuffled, in the ways users write a decode
(``--decode``, several allowed, default ``function,declared,image``):

- ``function``: a plain module-level function (``userfns.random_crop``: Pillow decode, a
  RandomResizedCrop-like box resized to 224, flip), nothing declared;
- ``declared``: the same function in a picklable class declaring ``output_shape`` and
  ``output_dtype``;
- ``image``: ``ImageDecoder(224, crop="random", hflip=True)``;
- ``tensor``: the function returning a ``torch.Tensor``;
- ``dict``: the function returning ``{"image": array, "meta": {"h": int, "w": int}}``.

For each, in the same run: (i) the decode limit: the single-core rate of that decode in this
process on bytes in memory, times the usable cores, measured at the start; (ii)
``DataLoader`` over a Dataset that reads the file and calls the same decode (a per-worker
NumPy generator for the functions' randomness, ``aioloader.sample_rng()`` in aioloader);
``num_workers=N``, ``persistent_workers=True``; (iii) ``aioloader.Loader`` with
``num_workers=N``, in the trainer's process and (``--loader-process``, default both) with
``loader_process=True``.

A measurement constructs the loader and runs two epochs: start-up is included. The clock
starts before the loader is constructed, so the first batch's time includes starting the
workers. aioloader's workers come from its zygote, a fork of this process made once, when
the first loader starts (about 10 ms, paid by the first aioloader run only); multiprocessing's
fork server, used where no zygote can be made, is stopped after each run so that every run
would start it cold, as a fresh training process does. ``--rounds`` interleaved rounds (per decode: DataLoader,
aioloader; then the next decode; then the next round); the table shows medians. CPU: the
whole process tree's user+sys CPU per image (``/proc``: this process, its live descendants,
and those already reaped), and the trainer's process alone per batch
(``time.process_time()``). The trainer reads a byte of every page of each batch, as a
training step would (``--no-touch``: it reads nothing). Peak PSS of the whole tree comes from
``--memory-rounds`` more interleaved rounds that sample ``smaps_rollup`` every 250 ms; the
timed rounds sample nothing, as the sampling takes CPU from the loaders it measures.

``--small-files`` measures files/s instead: ``--files`` files of 4 KB, page cache warm,
``decode=None`` (aioloader delivers the bytes, read on its loop, then by its reader
processes once they are up; DataLoader's workers read them).
``--read-delay-ms L`` delays every read by L ms for both (aioloader through its ``read=``
hook). ``--train-ms T`` adds runs with a simulated train step (``time.sleep``) per batch and
compares the total with ``steps x max(T_load, T)``.

    python benchmarks/throughput.py [--images 2000] [--rounds 3] [--memory-rounds 3] [--no-touch] [--workers N]
                                    [--decode function,declared,image,tensor,dict|all]
                                    [--small-files [--files 20000]]
                                    [--read-delay-ms 0] [--train-ms 0] [--image-size 500x375]
                                    [--draft on|off] [--peer-draft on|off] [--loader-process off|on|both]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import multiprocessing.forkserver
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
from torch.utils.data import DataLoader
from userfns import (
    DeclaredCrop,
    PeerDataset,
    TimedRead,
    TreePss,
    batch_len,
    git_describe,
    make_small_files,
    random_crop,
    random_crop_dict,
    random_crop_tensor,
    read_file,
    touch,
    tree_cpu,
)

import aioloader
from aioloader import FileDataset, ImageDecoder, Loader
from aioloader.config import usable_cpus
from aioloader.synthetic import make_image_folder

DECODES = ("function", "declared", "image", "tensor", "dict")
DEFAULT_DECODES = ("function", "declared", "image")
AIO_DEFAULT = "aioloader, defaults"
AIO = "aioloader, in-process"
AIO_PROC = "aioloader, loader process"
#: --loader-process names: the row's name and the ``loader_process`` passed (None: not passed).
RUNTIMES = {"auto": (AIO_DEFAULT, None), "off": (AIO, False), "on": (AIO_PROC, True)}
#: The loaders of this run, in report order (set by main from --loader-process).
LOADERS: list[str] = ["DataLoader", AIO_DEFAULT]


@dataclass
class Workload:
    """One row pair of the table: the files and the decode both loaders run."""

    name: str
    files: FileDataset
    decode: Callable[..., Any] | None  # aioloader's
    peer_decode: Callable[..., Any] | None  # DataLoader's Dataset calls this
    takes_rng: bool  # peer_decode(data, rng) with a per-worker NumPy generator
    describe: str
    rate: float = float("nan")  # single-core samples/s, start of the run
    rate_end: float = float("nan")


@dataclass(frozen=True)
class Epoch:
    """One consumed epoch."""

    seconds: float
    samples: int
    batches: int
    wait: float  # seconds the consumer spent in next()
    first: float  # seconds from ``origin`` (or iter()) to the first batch


@dataclass
class Run:
    """One measurement: construct the loader, ``epochs`` epochs, close."""

    seconds: float  # construction to the end of the last epoch
    epochs: list[Epoch]
    main_cpu: float  # this process's CPU seconds (all threads), same span
    tree_cpu: float  # the process tree's CPU seconds, same span
    threads: dict[str, float] = field(default_factory=dict)
    peak_pss: int = 0  # bytes: the largest PSS sum of the whole process tree, same span

    @property
    def samples(self) -> int:
        return sum(e.samples for e in self.epochs)

    @property
    def batches(self) -> int:
        return sum(e.batches for e in self.epochs)


#: Read each batch as a training step would (one byte a page, ``userfns.touch``): a batch in
#: shared memory that is never read costs the trainer no page faults and no PSS.
TOUCH = True


def run_epoch(batches: Iterable[Any], train_s: float, origin: float | None = None) -> Epoch:
    """Consume one epoch like a training loop: read each batch (:data:`TOUCH`), then sleep
    ``train_s`` (the step). ``first`` counts from ``origin`` when given (before
    construction), else from ``iter()``."""
    start = time.perf_counter()
    wait, first, samples, count = 0.0, None, 0, 0
    before = start
    for batch in batches:  # the for loop's own next() is what we time
        got = time.perf_counter()
        wait += got - before
        first = got - (origin or start) if first is None else first
        samples += batch_len(batch)
        count += 1
        if TOUCH:
            touch(batch)
        if train_s > 0:
            time.sleep(train_s)
        before = time.perf_counter()
    return Epoch(time.perf_counter() - start, samples, count, wait, first or 0.0)


def stop_fork_server() -> None:
    """Stop multiprocessing's fork server (aioloader's workers come from it), so the next
    aioloader run pays its start-up like a fresh process. A no-op where there is none."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)
    if stop is not None:
        stop()


def measure(
    make: Callable[[], Any], epochs: int, train_s: float, set_epoch: bool, memory: bool = False
) -> Run:
    """Construct a loader with ``make`` and consume ``epochs`` epochs; the clock and CPU
    counters start before construction. Returns with the loader closed.

    ``memory``: also sample the whole tree's PSS (``peak_pss``). Reading ``smaps_rollup``
    costs 4-10 ms of CPU per process and sample (walking its page tables), 20-30 ms per
    sample of a tree on this machine: on 2 busy cores that is CPU taken from the decode, and
    more from a loader with more processes. Timing runs leave it out."""
    gc.collect()
    tree0, cpu0, threads0 = tree_cpu(), time.process_time(), thread_cpu()
    pss = TreePss(every=0.25)
    t0 = time.perf_counter()
    if memory:
        pss.start()
    loader = make()
    try:
        eps = []
        for e in range(epochs):
            if set_epoch:
                loader.set_epoch(e)
            eps.append(run_epoch(loader, train_s, origin=t0 if e == 0 else None))
        seconds = time.perf_counter() - t0
        if memory:
            pss.__exit__()
        # The sampler's own CPU is the benchmark's, not the loader's.
        main_cpu, tree = time.process_time() - cpu0 - pss.cpu, tree_cpu() - tree0 - pss.cpu
        threads = thread_cpu_since(threads0, skip=pss.native_id)
    finally:
        if isinstance(loader, Loader):
            loader.close()
            stop_fork_server()
        del loader  # DataLoader: the persistent workers stop with its iterator
        gc.collect()
    return Run(seconds, eps, main_cpu, tree, threads, pss.peak)


def decode_rate(files: FileDataset, decode: Callable[[bytes], Any], seconds: float) -> float:
    """Single-core samples/s of ``decode`` in this process, on bytes already in memory."""
    data = [read_file(files.path(i)) for i in range(min(len(files), 200))]
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
    commit = git_describe(Path(__file__).resolve().parent)
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


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of this process's live threads by thread id, with the thread's name
    without its number (Linux: ``/proc/self/task/*/schedstat``, nanosecond precision;
    empty elsewhere)."""
    names = {t.native_id: t.name.rstrip("0123456789").rstrip("_-") for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = (names.get(int(tid), "other (non-Python)"), int(f.read().split()[0]) / 1e9)
    except (OSError, ValueError):
        pass
    return out


def thread_cpu_since(before: dict[int, tuple[str, float]], skip: int | None) -> dict[str, float]:
    """CPU seconds by thread name since ``before`` (per thread id: a thread of an earlier
    run still exiting is not charged its whole life), leaving out thread id ``skip`` (by id:
    once joined, a thread still exiting has no Python name)."""
    out: dict[str, float] = defaultdict(float)
    for tid, (name, cpu) in thread_cpu().items():
        if tid != skip:
            out[name] += cpu - before.get(tid, (name, 0.0))[1]
    return out


def med(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def default_data_dir() -> Path:
    env = os.environ.get("AIOLOADER_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "aioloader"
    return root / "bench"


def parse_decodes(values: list[str] | None, p: argparse.ArgumentParser) -> list[str]:
    names: list[str] = []
    for value in values or [",".join(DEFAULT_DECODES)]:
        for name in value.split(","):
            name = name.strip()
            picked = DECODES if name == "all" else (name,)
            for n in picked:
                if n not in DECODES:
                    p.error(f"--decode {n!r}: choose from {', '.join(DECODES)} or all")
                if n not in names:
                    names.append(n)
    return names


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data-dir", type=Path, default=default_data_dir(), help="dataset cache folder (%(default)s)"
    )
    p.add_argument("--images", type=int, default=2000, help="JPEG files to generate (%(default)s)")
    p.add_argument("--classes", type=int, default=10, help="class folders (%(default)s)")
    p.add_argument("--image-size", default="500x375", help="WIDTHxHEIGHT of the JPEGs (%(default)s)")
    p.add_argument(
        "--decode",
        action="append",
        metavar="NAME[,NAME]",
        help=f"decodes to compare: {', '.join(DECODES)}, all (default: {','.join(DEFAULT_DECODES)})",
    )
    p.add_argument(
        "--small-files",
        action="store_true",
        help="measure files/s over --files 4 KB files with decode=None instead of JPEG decodes",
    )
    p.add_argument("--files", type=int, default=20000, help="files for --small-files (%(default)s)")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"processes for both (default: DataLoader {usable_cpus()}, the usable CPUs; aioloader its default)",
    )
    p.add_argument(
        "--peer-workers",
        type=int,
        default=None,
        help="DataLoader's num_workers when it should differ from --workers (e.g. 8 behind slow reads)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="(%(default)s)")
    p.add_argument(
        "--io-concurrency",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="aioloader reads in flight (%(default)s, the library's default)",
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved measured rounds (%(default)s)")
    p.add_argument(
        "--memory-rounds",
        type=int,
        default=None,
        help="interleaved rounds that also sample the whole tree's PSS, after the timed ones (default: min(rounds, 3))",
    )
    p.add_argument("--epochs", type=int, default=2, help="epochs per measurement (%(default)s)")
    p.add_argument("--read-delay-ms", type=float, default=0.0, help="delay every read by L ms (%(default)s)")
    p.add_argument("--train-ms", type=float, default=0.0, help="simulated train step per batch (%(default)s)")
    p.add_argument(
        "--no-touch",
        dest="touch",
        action="store_false",
        help="leave each batch unread (by default the trainer reads a byte of every page of it, as a step would)",
    )
    p.add_argument(
        "--decode-seconds", type=float, default=3.0, help="single-core decode timing (%(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="(%(default)s)")
    p.add_argument(
        "--loader-process",
        default="auto,off,on",
        help="aioloader runtimes, comma-separated: auto (the default, loader_process not passed), off "
        "(loader_process=False), on (True); 'both' = off,on (%(default)s)",
    )
    p.add_argument(
        "--draft", choices=["on", "off"], default="on", help="ImageDecoder's JPEG draft mode (%(default)s)"
    )
    p.add_argument(
        "--peer-draft",
        choices=["on", "off"],
        default=None,
        help="the DataLoader peer's ImageDecoder draft mode (default: as --draft)",
    )
    args = p.parse_args()
    args.decode = parse_decodes(args.decode, p)
    runtimes = "off,on" if args.loader_process == "both" else args.loader_process
    args.runtimes = [r.strip() for r in runtimes.split(",") if r.strip()]
    if not args.runtimes or any(r not in RUNTIMES for r in args.runtimes):
        p.error(f"--loader-process {args.loader_process!r}: a comma-separated list of auto, off, on")
    if (
        min(
            args.images,
            args.classes,
            args.workers or 1,
            args.batch_size,
            args.rounds,
            args.epochs,
            args.files,
        )
        < 1
    ):
        p.error(
            "--images, --classes, --files, --workers, --batch-size, --rounds and --epochs must be positive"
        )
    if args.read_delay_ms < 0 or args.train_ms < 0:
        p.error("--read-delay-ms and --train-ms must be >= 0")
    return args


def workloads(args: argparse.Namespace) -> tuple[list[Workload], str]:
    """The workloads to measure and a line describing the data."""
    t0 = time.perf_counter()
    if args.small_files:
        folder = args.data_dir / f"small_{args.files}x4k"
        files = make_small_files(folder, args.files)
        line = f"{len(files)} files of 4 KB in {folder}, page cache warm"
        wl = Workload("small files", files, None, None, False, "decode=None (the file's bytes)")
        print(f"# data: {line} (ready in {time.perf_counter() - t0:.1f} s)", flush=True)
        return [wl], line
    width, height = (int(v) for v in args.image_size.lower().split("x"))
    folder = args.data_dir / f"{args.images}img_{args.classes}cls_{width}x{height}"
    make_image_folder(folder, num_images=args.images, num_classes=args.classes, size=(width, height))
    files = FileDataset.from_folder(folder)
    for p in files.paths:  # page cache warm for every run alike
        read_file(p)
    mean_kb = sum(os.path.getsize(p) for p in files.paths) / len(files) / 1e3
    line = f"{len(files)} JPEGs, {width}x{height}, {mean_kb:.0f} KB mean, in {folder}"
    print(f"# data: {line} (ready in {time.perf_counter() - t0:.1f} s)", flush=True)
    draft, peer_draft = args.draft == "on", (args.peer_draft or args.draft) == "on"
    image = ImageDecoder(224, crop="random", hflip=True, draft=draft)
    peer_image = ImageDecoder(224, crop="random", hflip=True, draft=peer_draft)
    table = {
        "function": (random_crop, random_crop, True, "plain function userfns.random_crop, nothing declared"),
        "declared": (
            DeclaredCrop(),
            DeclaredCrop(),
            True,
            "the same in a class declaring output_shape/dtype",
        ),
        "image": (
            image,
            peer_image,
            False,
            f"ImageDecoder(224, crop='random', hflip=True), draft: aioloader {args.draft}, "
            f"DataLoader {args.peer_draft or args.draft}",
        ),
        "tensor": (random_crop_tensor, random_crop_tensor, True, "the function returning a torch.Tensor"),
        "dict": (
            random_crop_dict,
            random_crop_dict,
            True,
            'the function returning {"image": array, "meta": {"h": int, "w": int}}',
        ),
    }
    return [Workload(n, files, *table[n]) for n in args.decode], line


def plain_read_rate(files: Any, epochs: int, seed: int) -> float:
    """Files/s of one thread reading ``files`` plainly in a shuffled order, ``epochs`` times:
    what a loader of small files should at least keep up with."""
    paths = list(files.paths if hasattr(files, "paths") else files)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for i in rng.permutation(len(paths)):
            with open(paths[i], "rb") as f:
                f.read()
    return epochs * len(paths) / (time.perf_counter() - t0)


def main() -> int:
    global TOUCH
    args = parse_args()
    TOUCH = args.touch
    loads, data_line = workloads(args)
    read = TimedRead(args.read_delay_ms)
    train_s = args.train_ms / 1e3
    cores = usable_cpus()

    load_start = loadavg()
    for w in loads:
        if w.decode is not None:
            w.rate = decode_rate(w.files, w.decode, args.decode_seconds)
            print(
                f"# {w.name}: single-core decode {w.rate:.0f} samples/s, limit {cores} x {w.rate:.0f} "
                f"= {cores * w.rate:.0f} samples/s",
                flush=True,
            )

    peer_workers = args.peer_workers or args.workers or cores

    def make_peer(w: Workload, r: int) -> Callable[[], DataLoader[Any]]:
        return lambda: DataLoader(
            PeerDataset(w.files, w.peer_decode, read, w.takes_rng, args.seed + r),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=peer_workers,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(args.seed + r),
        )

    def make_aio(w: Workload, r: int, process: bool | None) -> Callable[[], Loader]:
        # Only what the user would pass: the library's defaults otherwise.
        extra: dict[str, Any] = {} if process is None else {"loader_process": process}
        if args.workers is not None:
            extra["num_workers"] = args.workers
        return lambda: Loader(
            w.files,
            batch_size=args.batch_size,
            decode=w.decode,
            shuffle=True,
            seed=args.seed + r,
            io_concurrency=args.io_concurrency,
            read=read if args.read_delay_ms > 0 else None,  # the library's own reads otherwise
            **extra,
        )

    aio = [RUNTIMES[r] for r in args.runtimes]
    LOADERS[:] = ["DataLoader", *(name for name, _ in aio)]

    runs: dict[tuple[str, str], list[Run]] = defaultdict(list)
    trained: dict[tuple[str, str], list[Run]] = defaultdict(list)
    memory: dict[tuple[str, str], list[Run]] = defaultdict(list)
    memory_rounds = min(args.rounds, 3) if args.memory_rounds is None else args.memory_rounds
    plain: list[float] = []  # --small-files: one thread reading the files plainly, files/s
    for r in range(args.rounds):
        if args.small_files:
            plain.append(plain_read_rate(loads[0].files, args.epochs, args.seed + r))
            print(f"# round {r + 1}/{args.rounds} plain one-thread read: {plain[-1]:.0f} files/s", flush=True)
        for w in loads:
            # DataLoader first: its workers fork before any aioloader thread exists.
            for step_s, into in [(0.0, runs)] + ([(train_s, trained)] if train_s > 0 else []):
                makers = [("DataLoader", make_peer(w, r))] + [(n, make_aio(w, r, p)) for n, p in aio]
                for name, make in makers:
                    run = measure(make, args.epochs, step_s, set_epoch=name != "DataLoader")
                    into[w.name, name].append(run)
                    print(
                        f"# round {r + 1}/{args.rounds} {w.name} {name}{' trained' if step_s else ''}: "
                        f"{run.seconds:.2f} s, first batch {run.epochs[0].first * 1e3:.0f} ms",
                        flush=True,
                    )
    for r in range(memory_rounds):
        for w in loads:
            makers = [("DataLoader", make_peer(w, r))] + [(n, make_aio(w, r, p)) for n, p in aio]
            for name, make in makers:
                run = measure(make, args.epochs, 0.0, set_epoch=name != "DataLoader", memory=True)
                memory[w.name, name].append(run)
                print(
                    f"# memory round {r + 1}/{memory_rounds} {w.name} {name}: peak PSS {run.peak_pss / 2**20:.0f} MiB",
                    flush=True,
                )
    for w in loads:
        if w.decode is not None:
            w.rate_end = decode_rate(w.files, w.decode, args.decode_seconds)
    load_end = loadavg()

    print()
    print(f"Command: `{shlex.join([os.path.basename(sys.executable), *sys.argv])}`")
    print()
    print("\n".join(machine()))
    print(
        f"- workload: {data_line}; batch {args.batch_size}, shuffled; aioloader "
        f"{args.workers or 'default (' + str(cores) + ')'} worker "
        f"processes, DataLoader {peer_workers} (persistent_workers=True); read delay {args.read_delay_ms:g} ms; "
        f"aioloader io_concurrency {args.io_concurrency}"
    )
    for w in loads:
        limit = (
            f"; decode limit {cores} usable cores x {w.rate:.0f} = {cores * w.rate:.0f} samples/s "
            f"(re-measured at the end: {w.rate_end:.0f} single-core)"
            if w.decode is not None
            else ""
        )
        print(f"- `{w.name}`: {w.describe}{limit}")
    if args.small_files:
        print(
            f"- one thread reading the same files plainly (open, read, close; shuffled; {args.epochs} epochs), "
            f"in the same rounds: median {med(plain):.0f} files/s ({', '.join(f'{x:.0f}' for x in plain)})"
        )
        print("- target (issue 41): >= the plain one-thread read rate with the defaults")
    print(f"- 1-min load average at start {load_start}, at end {load_end}")
    print(
        f"- each run: construct the loader, {args.epochs} epochs, close (start-up included; aioloader's "
        f"zygote made once per process); the trainer reads "
        f"{'a byte of every page of each batch, as a step would' if args.touch else 'nothing of the batches (--no-touch)'}; "
        f"medians of {args.rounds} interleaved rounds; peak PSS: medians of {memory_rounds} more "
        "interleaved rounds that sample it (the timed rounds do not: the sampling takes CPU from the loaders)"
    )
    print()
    print_throughput(loads, runs, cores, unit="files" if args.small_files else "samples")
    print()
    print_cost(loads, runs, memory, unit="files" if args.small_files else "samples")
    print()
    print("aioloader main-process CPU by thread, ms/batch (median over rounds, start-up included):")
    for w in loads:
        for name, _ in aio:
            per: dict[str, list[float]] = defaultdict(list)
            for run in runs[w.name, name]:
                for thread, cpu in run.threads.items():
                    per[thread].append(cpu / run.batches)
            parts = ", ".join(
                f"{k} {med(v) * 1e3:.1f}"
                for k, v in sorted(per.items(), key=lambda kv: -med(kv[1]))
                if med(v) >= 5e-5
            )
            print(f"- {w.name}, {name}: {parts or 'n/a'}")
    if train_s > 0:
        print()
        print_overlap(loads, runs, trained, args.train_ms)
    return 0


def print_throughput(
    loads: list[Workload], runs: dict[tuple[str, str], list[Run]], cores: int, unit: str
) -> None:
    print(
        f"| decode | loader | {unit}/s | vs DataLoader | share of decode limit | first batch ms, start-up "
        f"included | first batch ms, epoch 2 | {unit}/s, epoch 2 | trainer wait ms/batch | machine CPU ms/"
        + unit[:-1]
        + " "
        "| main-process CPU ms/batch |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w in loads:
        peer_rate = med(x.samples / x.seconds for x in runs[w.name, "DataLoader"])
        for name in LOADERS:
            rs = runs[w.name, name]
            rate = med(x.samples / x.seconds for x in rs)
            share = f"{rate / (cores * w.rate):.0%}" if w.decode is not None else "n/a"
            two = len(rs[0].epochs) > 1
            second = med(x.epochs[1].first for x in rs) * 1e3 if two else float("nan")
            steady = med(x.epochs[1].samples / x.epochs[1].seconds for x in rs) if two else float("nan")
            print(
                f"| {w.name} | {name} | {rate:.0f} | {rate / peer_rate:.2f}x | {share} "
                f"| {med(x.epochs[0].first for x in rs) * 1e3:.0f} | {second:.0f} | {steady:.0f} "
                f"| {med(sum(e.wait for e in x.epochs) / x.batches for x in rs) * 1e3:.1f} "
                f"| {med(x.tree_cpu / x.samples for x in rs) * 1e3:.2f} "
                f"| {med(x.main_cpu / x.batches for x in rs) * 1e3:.1f} |"
            )
    print(
        f"\n{unit}/s: all epochs' {unit} over the time from constructing the loader to the end of the last "
        "epoch; epoch 2: that epoch alone (warm). vs DataLoader: above 1 is better. Machine CPU: user+sys of the whole process tree "
        "(trainer, fork server, workers; 10 ms ticks). Main-process CPU: the trainer's process, all its "
        "threads. Both span start-up and every epoch."
    )


def print_cost(
    loads: list[Workload],
    runs: dict[tuple[str, str], list[Run]],
    memory: dict[tuple[str, str], list[Run]],
    unit: str,
) -> None:
    """What each loader costs beside the decode: machine CPU per sample minus the decode's
    one-core cost measured in this run (the loader's own overhead, start-up included), the
    trainer's process per batch (both from the timed ``runs``), and the peak PSS of the
    whole process tree (from the ``memory`` runs; n/a without any)."""
    print(
        f"| decode | loader | machine CPU ms/{unit[:-1]} | decode alone, one core, ms | overhead ms/{unit[:-1]} "
        "| overhead vs DataLoader | trainer-process CPU ms/batch | peak PSS, whole tree, MiB | PSS vs DataLoader |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for w in loads:
        decode_ms = 1e3 / w.rate if w.decode is not None else 0.0
        peer = runs[w.name, "DataLoader"]
        peer_over = med(x.tree_cpu / x.samples for x in peer) * 1e3 - decode_ms
        peer_pss = (
            med(x.peak_pss for x in memory[w.name, "DataLoader"]) if memory[w.name, "DataLoader"] else 0
        )
        for name in LOADERS:
            rs = runs[w.name, name]
            cpu = med(x.tree_cpu / x.samples for x in rs) * 1e3
            pss = med(x.peak_pss for x in memory[w.name, name]) if memory[w.name, name] else 0
            mem = f"{pss / 2**20:.0f} | {pss / peer_pss:.2f}x" if pss and peer_pss else "n/a | n/a"
            print(
                f"| {w.name} | {name} | {cpu:.3f} | {decode_ms:.3f} | {cpu - decode_ms:.3f} "
                f"| {(cpu - decode_ms) / peer_over:.2f}x | {med(x.main_cpu / x.batches for x in rs) * 1e3:.1f} "
                f"| {mem} |"
            )
    print(
        f"\nOverhead: the whole process tree's CPU per {unit[:-1]} (start-up included) minus what the decode "
        "alone costs on one core, measured at the start of this run (0 without a decode): what the loader "
        "itself costs. Two decodes running at once on this machine's two cores are each a few % slower than "
        "one alone, so part of every loader's overhead is that contention. Peak PSS: the largest sum over "
        "the trainer and all its descendants (/proc/<pid>/smaps_rollup, sampled every 250 ms in rounds of "
        "their own; shared pages split between their holders, so shared memory counts once). Below 1x is "
        "better for both."
    )


def print_overlap(
    loads: list[Workload],
    runs: dict[tuple[str, str], list[Run]],
    trained: dict[tuple[str, str], list[Run]],
    train_ms: float,
) -> None:
    """Total time with a simulated step of T ms vs ``steps x max(T_load, T)``; T_load per
    round is the same loader's per-batch time without a step, in the same round."""
    t = train_ms / 1e3
    print(
        f"Overlap with a simulated train step of T = {train_ms:g} ms (time.sleep) per batch, start-up included:"
    )
    print()
    print(
        "| decode | loader | steps | T_load ms/batch | total s | steps x max(T_load, T) s "
        "| steps x (T_load + T) s | total / ideal | trainer wait ms/batch |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for w in loads:
        for name in LOADERS:
            pairs = list(zip(runs[w.name, name], trained[w.name, name], strict=True))
            steps = pairs[0][1].batches
            t_load = med(a.seconds / a.batches for a, _ in pairs)
            total = med(b.seconds for _, b in pairs)
            eff = med(b.seconds / (b.batches * max(a.seconds / a.batches, t)) for a, b in pairs)
            wait = med(sum(e.wait for e in b.epochs) / b.batches for _, b in pairs) * 1e3
            print(
                f"| {w.name} | {name} | {steps} | {t_load * 1e3:.1f} | {total:.2f} | {steps * max(t_load, t):.2f} "
                f"| {steps * (t_load + t):.2f} | {eff:.2f} | {wait:.1f} |"
            )
    print("\ntotal / ideal: 1.00 means loading is completely hidden behind the step (median per round).")


if __name__ == "__main__":
    sys.exit(main())
