"""Where the trainer's process spends CPU per batch, by thread and function: aioloader (and
DataLoader, for reference) feeding a trainer that does nothing with the batches.

Each loader is constructed and runs ``--warmup`` epochs unmeasured (start-up excluded: the
steady state is what RESULTS.md's main-process CPU per batch measures), then ``--epochs``
epochs with no profiler (per-thread CPU from ``/proc/self/task/*/schedstat``: the honest
absolute figures), then ``--epochs`` epochs under each ``--sampler``:

- ``yappi``: CPU clock, every thread, builtins included; exact call counts, but its
  per-call overhead inflates Python-heavy threads several times (the table shows by how
  much), so read its lists for call counts and relative cost;
- ``py-spy``: ``py-spy record --threads --nonblocking`` at ``--rate`` Hz on this process from
  outside (idle threads left out: a thread blocked on a lock, a pipe or the GIL is not
  sampled); little overhead; the share of each thread's non-idle samples whose leaf frame is a function (C
  code, uvloop's included, counts for the Python frame that called it). Its idle detection
  and effective rate make absolute times unreliable, so only shares are printed.

Threads are grouped by name without their number (``aioloader-io-0``, ``aioloader-io-1`` ->
``aioloader-io``); the executor's manager thread is ``Thread``. Writes the report to
``--out`` too (default ``benchmarks/profiles/main_cpu_<date>.txt``).

    python benchmarks/profile_main.py [--loader aioloader,aioloader-process,dataloader] [--decode function|declared|image]
                                      [--sampler yappi,py-spy] [--images 640] [--epochs 2]
                                      [--warmup 1] [--workers 2] [--top 15] [--rate 1000] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.metadata
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from userfns import DeclaredCrop, PeerDataset, batch_len, random_crop, read_file

from aioloader import FileDataset, ImageDecoder, Loader
from aioloader.synthetic import make_image_folder

HERE = Path(__file__).resolve().parent
Funcs = dict[str, dict[str, list[float]]]  # group -> function -> [own seconds, calls]


def group(name: str) -> str:
    return name.rstrip("0123456789").rstrip("_-") or name


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads by group (``/proc/self/task/*/schedstat``)."""
    names = {t.native_id: group(t.name) for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[names.get(int(tid), "other (non-Python)")] += int(f.read().split()[0]) / 1e9
        except OSError:
            pass
    return out


def with_yappi(run: Callable[[], int]) -> tuple[int, Funcs]:
    import yappi

    yappi.clear_stats()
    yappi.set_clock_type("cpu")
    yappi.set_context_name_callback(lambda: threading.current_thread().name)
    yappi.start(builtins=True, profile_threads=True)
    batches = run()
    yappi.stop()
    funcs: Funcs = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for t in yappi.get_thread_stats():
        for f in yappi.get_func_stats(filter={"ctx_id": t.id}):
            key = f"{f.name}  ({Path(f.module).name}:{f.lineno})" if f.lineno else f"{f.name}  (builtin)"
            funcs[group(t.name)][key][0] += f.tsub
            funcs[group(t.name)][key][1] += f.ncall
    yappi.clear_stats()
    return batches, funcs


_RAW = re.compile(r"^thread \((?:0x)?[0-9a-fA-F]+\)(?::\s*([^;]*))?;?(.*)\s(\d+)$")


def with_py_spy(run: Callable[[], int], rate: int) -> tuple[int, Funcs]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "raw.txt"
        spy = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(os.getpid()),
                "--threads",
                "--nonblocking",
                "--format",
                "raw",
                "--rate",
                str(rate),
                "-o",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # attach
        batches = run()
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        if not out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.strip()}")
        funcs: Funcs = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
        for line in out.read_text().splitlines():
            m = _RAW.match(line.strip())
            if not m:
                continue
            name, stack, count = m.group(1) or "?", m.group(2), int(m.group(3))
            leaf = stack.split(";")[-1] if stack else "(no Python frame)"
            funcs[group(name.strip())][leaf][0] += count / rate
            funcs[group(name.strip())][leaf][1] += count
    return batches, funcs


def make_loader(kind: str, args: argparse.Namespace, files: FileDataset) -> Any:
    decode: Any = {
        "function": random_crop,
        "declared": DeclaredCrop(),
        "image": ImageDecoder(224, crop="random", hflip=True),
    }[args.decode]
    if kind.startswith("aioloader"):
        return Loader(
            files,
            batch_size=args.batch_size,
            decode=decode,
            num_workers=args.workers,
            loader_process=kind == "aioloader-process",
        )
    return DataLoader(
        PeerDataset(files, decode, takes_rng=args.decode != "image"),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
    )


def ms(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e3:7.2f}"


def profile(kind: str, args: argparse.Namespace, files: FileDataset) -> list[str]:
    """The report's lines for one loader."""
    loader = make_loader(kind, args, files)
    counter = iter(range(10**6))

    def epochs(loader: Any, n: int) -> int:
        batches = 0
        for _ in range(n):
            if isinstance(loader, Loader):
                loader.set_epoch(next(counter))
            batches += sum(1 for b in loader if batch_len(b))
        return batches

    columns: list[tuple[str, int, dict[str, float]]] = []  # (label, batches, CPU s by group)
    profiles: list[tuple[str, int, Funcs]] = []
    try:
        epochs(loader, args.warmup)
        for sampler in ["none", *args.sampler]:
            gc.collect()
            before, cpu0 = thread_cpu(), time.process_time()
            run = functools.partial(epochs, loader, args.epochs)
            if sampler == "none":
                batches, funcs = run(), {}
            elif sampler == "yappi":
                batches, funcs = with_yappi(run)
            else:
                batches, funcs = with_py_spy(run, args.rate)
            cpu = time.process_time() - cpu0
            per = {k: v - before.get(k, 0.0) for k, v in thread_cpu().items()}
            per["(process total)"] = cpu
            columns.append((f"under {sampler}" if sampler != "none" else "no profiler", batches, per))
            if funcs:
                profiles.append((sampler, batches, funcs))
    finally:
        if isinstance(loader, Loader):
            loader.close()
        del loader
        gc.collect()

    lines = [
        f"## {kind}, decode={args.decode}: {len(files)} JPEGs 500x375, batch {args.batch_size}, {args.workers} "
        f"workers; {args.warmup} warm-up epoch(s), then {args.epochs} epochs per column",
        "",
        "main-process CPU ms/batch by thread group (schedstat), "
        + " | ".join(f"{label} ({n} batches)" for label, n, _ in columns),
    ]
    groups = sorted({g for _, _, per in columns for g in per}, key=lambda g: -columns[0][2].get(g, 0.0))
    for g in groups:
        lines.append(f"  {g:24s} " + " | ".join(ms(per.get(g, 0.0), n) for _, n, per in columns))
    for sampler, batches, funcs in profiles:
        own = {g: sum(v[0] for v in fs.values()) for g, fs in funcs.items()}
        for g in sorted(funcs, key=lambda k: -own[k]):
            if own[g] / batches < 5e-5:
                continue
            top = sorted(funcs[g].items(), key=lambda kv: -kv[1][0])[: args.top]
            if sampler == "yappi":
                lines += [
                    "",
                    f"== yappi: {g}: {ms(own[g], batches).strip()} ms/batch own CPU under the profiler",
                ]
                lines.append("   own ms/batch  calls/batch  function")
                lines += [f"   {t / batches * 1e3:12.3f}  {n / batches:11.1f}  {key}" for key, (t, n) in top]
            else:  # sample counts: shares are meaningful, absolute time is not (idle detection, rate)
                total = sum(v[1] for v in funcs[g].values())
                lines += [
                    "",
                    f"== py-spy: {g}: {int(total)} non-idle samples",
                    "   share  samples  leaf frame",
                ]
                lines += [f"   {n / total:5.0%}  {int(n):7d}  {key}" for key, (_, n) in top]
    return [*lines, ""]


def parse_args() -> argparse.Namespace:
    date = datetime.date.today().isoformat()
    env = os.environ.get("AIOLOADER_CACHE")
    root = (Path(env).expanduser() if env else Path.home() / ".cache" / "aioloader") / "bench"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=root, help="(%(default)s)")
    p.add_argument(
        "--loader",
        default="aioloader,aioloader-process,dataloader",
        help="aioloader (in-process), aioloader-process (loader_process=True), dataloader (%(default)s)",
    )
    p.add_argument("--decode", choices=["function", "declared", "image"], default="function")
    p.add_argument("--sampler", default="yappi,py-spy", help="yappi, py-spy or both (%(default)s)")
    p.add_argument("--rate", type=int, default=1000, help="py-spy samples per second (%(default)s)")
    p.add_argument("--images", type=int, default=640, help="(%(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per column (%(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured epochs first (%(default)s)")
    p.add_argument("--workers", type=int, default=2, help="(%(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(%(default)s)")
    p.add_argument("--top", type=int, default=15, help="functions per thread group (%(default)s)")
    p.add_argument(
        "--out", type=Path, default=HERE / "profiles" / f"main_cpu_{date}.txt", help="(%(default)s)"
    )
    args = p.parse_args()
    args.loader = [k.strip() for k in args.loader.split(",") if k.strip()]
    args.sampler = [k.strip() for k in args.sampler.split(",") if k.strip()]
    if not args.loader or any(k not in ("aioloader", "aioloader-process", "dataloader") for k in args.loader):
        p.error("--loader: aioloader, dataloader or a comma list of both")
    if any(k not in ("yappi", "py-spy") for k in args.sampler):
        p.error("--sampler: yappi, py-spy or a comma list of both")
    return args


def main() -> int:
    args = parse_args()
    folder = args.data_dir / f"{args.images}img_10cls_500x375"
    make_image_folder(folder, num_images=args.images, num_classes=10, size=(500, 375))
    files = FileDataset.from_folder(folder)
    for path in files.paths:
        read_file(path)
    versions = ", ".join(
        f"{m} {importlib.metadata.version(m)}" for m in ("yappi", "py-spy") if m in args.sampler
    )
    lines = [
        f"# profile_main: main-process CPU per batch by thread and function; {', '.join(args.loader)}",
        f"# command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}",
        f"# date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}; {os.cpu_count()} CPUs, "
        f"1-min load {os.getloadavg()[0]:.2f} at start; Python {sys.version.split()[0]}, torch {torch.__version__}"
        f"{', ' + versions if versions else ''}",
        "# absolute cost: the 'no profiler' column (schedstat). Where it goes: yappi's lists (exact call counts,",
        "# own CPU inflated by the profiler in Python-heavy threads) and py-spy's shares of non-idle samples.",
        "",
    ]
    for kind in args.loader:
        lines += profile(kind, args, files)
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"# written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
